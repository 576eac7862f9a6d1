//! Operator schemas: argument names, types, defaults and out variants.
//!
//! The table (`schemas.txt`) is PyTorch's own schema strings for the operators the compiler
//! reads or writes, with the `.out` variant upstream ExecuTorch picks for each functional
//! operator; `tools/gen_op_schemas.py` writes it from the reference environment. This
//! module parses the strings once, on first use.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::dtype::DType;
use crate::error::{CompileError, Result};
use crate::ir::{Arg, Op};

/// The type of a schema argument or return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ty {
    /// `Tensor`.
    Tensor,
    /// `int`.
    Int,
    /// `SymInt`.
    SymInt,
    /// `float`.
    Float,
    /// `bool`.
    Bool,
    /// `Scalar` (a number of any kind).
    Scalar,
    /// `ScalarType`.
    ScalarType,
    /// `Layout`.
    Layout,
    /// `Device`.
    Device,
    /// `MemoryFormat`.
    MemoryFormat,
    /// `str`.
    Str,
    /// Anything else (`Generator`, `Dimname`, ...).
    Other(String),
    /// `T[]` or `T[N]`.
    List(Box<Ty>, Option<usize>),
    /// `T?`.
    Optional(Box<Ty>),
}

impl Ty {
    /// The type without an `Optional` wrapper.
    pub fn inner(&self) -> &Ty {
        match self {
            Ty::Optional(t) => t,
            t => t,
        }
    }

    /// True for `Tensor` and `Tensor?`.
    pub fn is_tensor(&self) -> bool {
        matches!(self.inner(), Ty::Tensor)
    }

    /// True for lists of `int` or `SymInt`.
    pub fn is_int_list(&self) -> bool {
        matches!(self.inner(), Ty::List(t, _) if matches!(**t, Ty::Int | Ty::SymInt))
    }
}

/// One argument of a schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Argument {
    /// Name.
    pub name: String,
    /// Type.
    pub ty: Ty,
    /// Default, when it has one.
    pub default: Option<Arg>,
    /// Keyword-only (after `*`).
    pub kwarg_only: bool,
    /// Written by the operator (`Tensor(a!)`).
    pub is_write: bool,
    /// Aliased by the operator's result (`Tensor(a)`).
    pub is_alias: bool,
}

/// A parsed operator schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    /// The operator.
    pub op: Op,
    /// Arguments in order.
    pub args: Vec<Argument>,
    /// Return types.
    pub returns: Vec<Ty>,
    /// The operator's `.out` variant, for functional operators that have one.
    pub out: Option<Box<Schema>>,
}

impl Schema {
    /// Position of an argument by name.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.args.iter().position(|a| a.name == name)
    }

    /// True when the operator writes one of its arguments in place (and is not an out
    /// variant: out variants write only keyword-only `out` arguments).
    pub fn is_inplace(&self) -> bool {
        self.args
            .first()
            .is_some_and(|a| a.is_write && !a.kwarg_only)
    }

    /// True for view operators: the result aliases the first argument (`Tensor(a) self`).
    pub fn is_view(&self) -> bool {
        self.args.first().is_some_and(|a| a.is_alias && !a.is_write)
    }

    /// Number of arguments before the out arguments of an out variant.
    pub fn num_inputs(&self) -> usize {
        self.args
            .iter()
            .position(|a| a.is_write && a.kwarg_only)
            .unwrap_or(self.args.len())
    }
}

static TABLE: OnceLock<HashMap<String, Schema>> = OnceLock::new();

fn table() -> &'static HashMap<String, Schema> {
    TABLE.get_or_init(|| {
        let mut map = HashMap::new();
        for line in include_str!("schemas.txt").lines() {
            let (functional, out) = match line.split_once(" => ") {
                Some((f, o)) => (f, Some(o)),
                None => (line, None),
            };
            // The table is generated from PyTorch's schemas and parsed by a unit test; a
            // line that does not parse is skipped rather than failing every compilation.
            let Ok(mut schema) = parse(functional) else {
                continue;
            };
            schema.out = out.and_then(|o| parse(o).ok()).map(Box::new);
            map.insert(schema.op.key(), schema);
        }
        // Some functional operators have an out variant `to_out_variant` does not find
        // (e.g. `pow.Tensor_Scalar` -> `pow.Tensor_Scalar_out`): take the overload named
        // `<overload>_out` (or `out`) whose inputs are the functional operator's.
        let missing: Vec<String> = map
            .iter()
            .filter(|(_, s)| {
                s.out.is_none()
                    && !s.is_inplace()
                    && !s.is_view()
                    && s.returns.iter().all(|r| *r == Ty::Tensor)
                    && !s.returns.is_empty()
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in missing {
            let Some(s) = map.get(&key) else { continue };
            let name = s.op.name.clone();
            let candidates = if s.op.overload.is_empty() {
                vec![format!("{name}.out")]
            } else {
                vec![format!("{name}.{}_out", s.op.overload)]
            };
            let found = candidates.iter().find_map(|c| {
                let o = map.get(c)?;
                let ins = o.num_inputs();
                let same = ins == s.args.len()
                    && o.args
                        .iter()
                        .zip(&s.args)
                        .all(|(a, b)| a.name == b.name && a.ty == b.ty);
                same.then(|| Box::new(o.clone()))
            });
            if let (Some(found), Some(s)) = (found, map.get_mut(&key)) {
                s.out = Some(found);
            }
        }
        map
    })
}

/// The schema of an operator, if the table has it.
pub fn lookup(op: &Op) -> Option<&'static Schema> {
    table().get(&op.key())
}

/// The schema of an operator, or an error naming it.
pub fn require(op: &Op) -> Result<&'static Schema> {
    lookup(op).ok_or_else(|| CompileError::NoDecomposition {
        ops: vec![op.key()],
    })
}

/// Parses one schema string, e.g. `aten::add.Tensor(Tensor self, Tensor other, *, Scalar
/// alpha=1) -> Tensor`.
pub fn parse(text: &str) -> Result<Schema> {
    let bad = |why: &str| CompileError::invalid("operator schema", format!("{why}: {text}"));
    let open = text.find('(').ok_or_else(|| bad("no '('"))?;
    let name = text.get(..open).unwrap_or_default();
    let close = matching_paren(text, open).ok_or_else(|| bad("unbalanced parentheses"))?;
    let args_text = text.get(open + 1..close).unwrap_or_default();
    let ret_text = text
        .get(close + 1..)
        .unwrap_or_default()
        .trim()
        .strip_prefix("->")
        .ok_or_else(|| bad("no '->'"))?
        .trim();
    let mut args = Vec::new();
    let mut kwarg_only = false;
    for part in split_top(args_text) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        if part == "*" {
            kwarg_only = true;
            continue;
        }
        if part == "..." {
            // Variadic (e.g. `einsum.sublist`): the listed arguments are all we read.
            continue;
        }
        let (decl, default) = match part.split_once('=') {
            Some((d, v)) => (d.trim(), Some(v.trim())),
            None => (part, None),
        };
        let (ty_text, arg_name) = decl.rsplit_once(' ').ok_or_else(|| bad("argument"))?;
        let is_write = ty_text.contains('!');
        let is_alias = ty_text.contains("(a");
        let ty = parse_type(ty_text);
        let default = default.map(|d| parse_default(d, &ty)).transpose()?;
        args.push(Argument {
            name: arg_name.to_owned(),
            ty,
            default,
            kwarg_only,
            is_write,
            is_alias,
        });
    }
    let returns = if ret_text.starts_with('(') {
        let inner = ret_text
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_default();
        split_top(inner)
            .into_iter()
            .filter(|r| !r.trim().is_empty())
            .map(|r| parse_type(r.trim().split(' ').next().unwrap_or_default()))
            .collect()
    } else {
        vec![parse_type(ret_text.split(' ').next().unwrap_or_default())]
    };
    Ok(Schema {
        op: Op::parse(name),
        args,
        returns,
        out: None,
    })
}

fn matching_paren(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in text.char_indices().skip(open) {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Splits at commas outside brackets and quotes.
fn split_top(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start, mut quote) = (0i32, 0usize, None);
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[') => depth += 1,
            (None, ')' | ']') => depth -= 1,
            (None, ',') if depth == 0 => {
                out.push(text.get(start..i).unwrap_or_default());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(text.get(start..).unwrap_or_default());
    out
}

fn parse_type(text: &str) -> Ty {
    let mut t = text.trim();
    if let Some(inner) = t.strip_suffix('?') {
        return Ty::Optional(Box::new(parse_type(inner)));
    }
    if t.ends_with(']') {
        if let Some(open) = t.rfind('[') {
            let n = t.get(open + 1..t.len() - 1).and_then(|n| n.parse().ok());
            return Ty::List(Box::new(parse_type(t.get(..open).unwrap_or_default())), n);
        }
    }
    // Drop an alias annotation: `Tensor(a!)`.
    if let Some(open) = t.find('(') {
        t = t.get(..open).unwrap_or_default();
    }
    match t {
        "Tensor" => Ty::Tensor,
        "int" => Ty::Int,
        "SymInt" => Ty::SymInt,
        "float" => Ty::Float,
        "bool" => Ty::Bool,
        "Scalar" => Ty::Scalar,
        "ScalarType" => Ty::ScalarType,
        "Layout" => Ty::Layout,
        "Device" => Ty::Device,
        "MemoryFormat" => Ty::MemoryFormat,
        "str" => Ty::Str,
        other => Ty::Other(other.to_owned()),
    }
}

fn parse_default(text: &str, ty: &Ty) -> Result<Arg> {
    let bad = || CompileError::invalid("operator schema default", text.to_owned());
    if text == "None" {
        return Ok(Arg::None);
    }
    let scalar = |t: &str, ty: &Ty| -> Result<Arg> {
        Ok(match (t, ty) {
            ("True", _) => Arg::Bool(true),
            ("False", _) => Arg::Bool(false),
            (_, Ty::Str) => Arg::Str(t.trim_matches(|c| c == '"' || c == '\'').to_owned()),
            (_, Ty::Float) => Arg::Float(t.parse().map_err(|_| bad())?),
            (_, Ty::MemoryFormat) => Arg::MemoryFormat(match t {
                "contiguous_format" => 0,
                "preserve_format" => 1,
                "channels_last" => 2,
                _ => 3,
            }),
            (_, Ty::ScalarType) => Arg::ScalarType(match t {
                "long" => DType::Long,
                "int" => DType::Int,
                "bool" => DType::Bool,
                _ => DType::Float,
            }),
            (_, Ty::Layout) => Arg::Layout(0),
            _ => match t.parse::<i64>() {
                Ok(v) => Arg::Int(v),
                Err(_) => Arg::Float(t.parse().map_err(|_| bad())?),
            },
        })
    };
    match ty.inner() {
        Ty::List(elem, n) => {
            let items: Vec<&str> = match text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
                Some(inner) => inner
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect(),
                // `int[2] stride=1` repeats the number.
                None => vec![text; n.unwrap_or(1)],
            };
            Ok(match **elem {
                Ty::Int | Ty::SymInt => Arg::Ints(
                    items
                        .iter()
                        .map(|s| s.parse().map(crate::ir::IntArg::Const).map_err(|_| bad()))
                        .collect::<Result<_>>()?,
                ),
                Ty::Float => Arg::Floats(
                    items
                        .iter()
                        .map(|s| s.parse().map_err(|_| bad()))
                        .collect::<Result<_>>()?,
                ),
                Ty::Bool => Arg::Bools(items.iter().map(|s| *s == "True").collect()),
                _ => Arg::None,
            })
        }
        inner => scalar(text, inner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::IntArg;

    #[test]
    fn every_table_line_parses() {
        for line in include_str!("schemas.txt").lines() {
            for part in line.split(" => ") {
                parse(part).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }

    #[test]
    fn reads_defaults_kwargs_and_out_variants() {
        let s = lookup(&Op::parse("aten::add.Tensor")).unwrap();
        assert_eq!(s.args.len(), 3);
        assert!(s.args[2].kwarg_only);
        assert_eq!(s.args[2].default, Some(Arg::Int(1)));
        let out = s.out.as_ref().unwrap();
        assert_eq!(out.op.key(), "aten::add.out");
        assert_eq!(out.num_inputs(), 3);
        let c = lookup(&Op::parse("aten::conv2d")).unwrap();
        assert_eq!(
            c.args[c.index_of("dilation").unwrap()].default,
            Some(Arg::Ints(vec![IntArg::Const(1), IntArg::Const(1)]))
        );
        let m = lookup(&Op::parse("aten::max.dim")).unwrap();
        assert_eq!(m.returns.len(), 2);
        assert!(lookup(&Op::parse("aten::relu_")).unwrap().is_inplace());
    }
}
