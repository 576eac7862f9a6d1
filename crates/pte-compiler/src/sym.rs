//! Symbolic sizes: integer expressions over the program's dimension symbols.
//!
//! Archives write them in SymPy's `srepr` form (`Mul(Integer(8), Symbol('s77',
//! positive=True, integer=True))`); [`Expr::parse`] reads that form (and bare names and
//! integers), with a bound on nesting. Expressions are evaluated with checked arithmetic, at
//! the symbols' upper bounds to size memory for `DYNAMIC_BOUND` tensors.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{CompileError, Result};

/// Deepest nesting [`Expr::parse`] accepts.
const MAX_DEPTH: usize = 64;

/// An integer expression.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expr {
    /// A number.
    Const(i64),
    /// A dimension symbol (`s0`).
    Sym(String),
    /// Sum of terms.
    Add(Vec<Expr>),
    /// Product of factors.
    Mul(Vec<Expr>),
    /// Floor division.
    FloorDiv(Box<Expr>, Box<Expr>),
    /// Python modulo (sign of the divisor).
    Mod(Box<Expr>, Box<Expr>),
    /// Maximum.
    Max(Vec<Expr>),
    /// Minimum.
    Min(Vec<Expr>),
}

/// Value ranges of the symbols: `(min, max)`, `None` where unbounded.
pub type Ranges = BTreeMap<String, (Option<i64>, Option<i64>)>;

impl Expr {
    /// The number, when the expression has no symbols.
    pub fn as_const(&self) -> Option<i64> {
        self.eval(&|_| None)
    }

    /// Evaluates with checked arithmetic; `None` when a symbol has no value or arithmetic
    /// overflows or divides by zero.
    pub fn eval(&self, env: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        match self {
            Expr::Const(v) => Some(*v),
            Expr::Sym(s) => env(s),
            Expr::Add(t) => t
                .iter()
                .try_fold(0i64, |acc, e| acc.checked_add(e.eval(env)?)),
            Expr::Mul(t) => t
                .iter()
                .try_fold(1i64, |acc, e| acc.checked_mul(e.eval(env)?)),
            Expr::FloorDiv(a, b) => {
                let (a, b) = (a.eval(env)?, b.eval(env)?);
                if b == 0 {
                    return None;
                }
                let q = a.checked_div(b)?;
                Some(if (a % b != 0) && ((a < 0) != (b < 0)) {
                    q - 1
                } else {
                    q
                })
            }
            Expr::Mod(a, b) => {
                let (a, b) = (a.eval(env)?, b.eval(env)?);
                if b == 0 {
                    return None;
                }
                let r = a.checked_rem(b)?;
                Some(if r != 0 && ((r < 0) != (b < 0)) {
                    r + b
                } else {
                    r
                })
            }
            Expr::Max(t) => t
                .iter()
                .map(|e| e.eval(env))
                .collect::<Option<Vec<_>>>()?
                .into_iter()
                .max(),
            Expr::Min(t) => t
                .iter()
                .map(|e| e.eval(env))
                .collect::<Option<Vec<_>>>()?
                .into_iter()
                .min(),
        }
    }

    /// The largest value over the symbols' ranges, evaluating at every symbol's maximum
    /// (size expressions grow with their symbols). `None` if a symbol is unbounded.
    pub fn upper_bound(&self, ranges: &Ranges) -> Option<i64> {
        self.eval(&|s| ranges.get(s).and_then(|r| r.1))
    }

    /// The smallest value, at every symbol's minimum (0 when unknown).
    pub fn lower_bound(&self, ranges: &Ranges) -> Option<i64> {
        self.eval(&|s| Some(ranges.get(s).and_then(|r| r.0).unwrap_or(0)))
    }

    /// Every symbol the expression mentions.
    pub fn symbols(&self, out: &mut Vec<String>) {
        match self {
            Expr::Const(_) => {}
            Expr::Sym(s) => {
                if !out.contains(s) {
                    out.push(s.clone());
                }
            }
            Expr::Add(t) | Expr::Mul(t) | Expr::Max(t) | Expr::Min(t) => {
                t.iter().for_each(|e| e.symbols(out))
            }
            Expr::FloorDiv(a, b) | Expr::Mod(a, b) => {
                a.symbols(out);
                b.symbols(out);
            }
        }
    }

    /// `a + b`, with nested sums flattened and numbers added up.
    pub fn sum(a: Expr, b: Expr) -> Expr {
        let mut terms = Vec::new();
        let mut constant = 0i64;
        for e in [a, b] {
            let parts = match e {
                Expr::Add(t) => t,
                other => vec![other],
            };
            for p in parts {
                match p.as_const().and_then(|c| constant.checked_add(c)) {
                    Some(c) => constant = c,
                    None => terms.push(p),
                }
            }
        }
        if constant != 0 || terms.is_empty() {
            terms.push(Expr::Const(constant));
        }
        if terms.len() == 1 {
            terms.pop().unwrap_or(Expr::Const(0))
        } else {
            Expr::Add(terms)
        }
    }

    /// `a * b`, with nested products flattened and numbers multiplied.
    pub fn product(a: Expr, b: Expr) -> Expr {
        let mut factors = Vec::new();
        let mut constant = 1i64;
        for e in [a, b] {
            let parts = match e {
                Expr::Mul(t) => t,
                other => vec![other],
            };
            for p in parts {
                match p.as_const().and_then(|c| constant.checked_mul(c)) {
                    Some(c) => constant = c,
                    None => factors.push(p),
                }
            }
        }
        if constant == 0 {
            return Expr::Const(0);
        }
        if constant != 1 || factors.is_empty() {
            factors.insert(0, Expr::Const(constant));
        }
        if factors.len() == 1 {
            factors.pop().unwrap_or(Expr::Const(1))
        } else {
            Expr::Mul(factors)
        }
    }

    /// `a // b`, folded when both are numbers.
    pub fn floordiv(a: Expr, b: Expr) -> Expr {
        if b.as_const() == Some(1) {
            return a;
        }
        let e = Expr::FloorDiv(Box::new(a), Box::new(b));
        match e.as_const() {
            Some(v) => Expr::Const(v),
            None => e,
        }
    }

    /// Parses SymPy's `srepr` form, a bare symbol name, or an integer.
    pub fn parse(text: &str) -> Result<Expr> {
        let mut p = Parser {
            s: text.as_bytes(),
            pos: 0,
        };
        let e = p.expr(0)?;
        p.skip_ws();
        if p.pos != p.s.len() {
            return Err(p.error("trailing characters"));
        }
        Ok(e)
    }
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> CompileError {
        CompileError::invalid(
            "symbolic expression",
            format!(
                "{what} at byte {} of {:?}",
                self.pos,
                String::from_utf8_lossy(self.s)
            ),
        )
    }

    fn skip_ws(&mut self) {
        while self.s.get(self.pos).is_some_and(u8::is_ascii_whitespace) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.s.get(self.pos) == Some(&c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> &str {
        self.skip_ws();
        let start = self.pos;
        while self
            .s
            .get(self.pos)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
        {
            self.pos += 1;
        }
        std::str::from_utf8(self.s.get(start..self.pos).unwrap_or_default()).unwrap_or_default()
    }

    fn integer(&mut self) -> Result<i64> {
        self.skip_ws();
        let start = self.pos;
        if self.s.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        while self.s.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        std::str::from_utf8(self.s.get(start..self.pos).unwrap_or_default())
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| self.error("expected an integer"))
    }

    fn quoted(&mut self) -> Result<String> {
        self.skip_ws();
        let q = *self
            .s
            .get(self.pos)
            .ok_or_else(|| self.error("expected a name"))?;
        if q != b'\'' && q != b'"' {
            return Err(self.error("expected a quoted name"));
        }
        self.pos += 1;
        let start = self.pos;
        while self.s.get(self.pos).is_some_and(|c| *c != q) {
            self.pos += 1;
        }
        let name = String::from_utf8_lossy(self.s.get(start..self.pos).unwrap_or_default());
        if !self.eat(q) {
            return Err(self.error("unterminated name"));
        }
        Ok(name.into_owned())
    }

    /// Skips `key=value` keyword arguments up to the closing parenthesis.
    fn skip_keywords(&mut self) -> Result<()> {
        while self.eat(b',') {
            self.ident();
            if !self.eat(b'=') {
                return Err(self.error("expected a keyword argument"));
            }
            self.ident();
        }
        if !self.eat(b')') {
            return Err(self.error("expected ')'"));
        }
        Ok(())
    }

    fn args(&mut self, depth: usize) -> Result<Vec<Expr>> {
        let mut out = vec![self.expr(depth + 1)?];
        while self.eat(b',') {
            out.push(self.expr(depth + 1)?);
        }
        if !self.eat(b')') {
            return Err(self.error("expected ')'"));
        }
        Ok(out)
    }

    fn expr(&mut self, depth: usize) -> Result<Expr> {
        if depth > MAX_DEPTH {
            return Err(self.error("expression nested too deeply"));
        }
        self.skip_ws();
        if self
            .s
            .get(self.pos)
            .is_some_and(|c| c.is_ascii_digit() || *c == b'-')
        {
            return Ok(Expr::Const(self.integer()?));
        }
        let name = self.ident().to_owned();
        if name.is_empty() {
            return Err(self.error("expected an expression"));
        }
        if !self.eat(b'(') {
            return Ok(Expr::Sym(name));
        }
        let two = |p: &mut Self, args: Vec<Expr>| -> Result<(Box<Expr>, Box<Expr>)> {
            let mut it = args.into_iter();
            match (it.next(), it.next(), it.next()) {
                (Some(a), Some(b), None) => Ok((Box::new(a), Box::new(b))),
                _ => Err(p.error("expected two arguments")),
            }
        };
        Ok(match name.as_str() {
            "Symbol" => {
                let n = self.quoted()?;
                self.skip_keywords()?;
                Expr::Sym(n)
            }
            "Integer" => {
                let v = self.integer()?;
                self.skip_keywords()?;
                Expr::Const(v)
            }
            "Add" => Expr::Add(self.args(depth)?),
            "Mul" => Expr::Mul(self.args(depth)?),
            "Max" => Expr::Max(self.args(depth)?),
            "Min" => Expr::Min(self.args(depth)?),
            "FloorDiv" => {
                let a = self.args(depth)?;
                let (a, b) = two(self, a)?;
                Expr::FloorDiv(a, b)
            }
            "Mod" | "PythonMod" => {
                let a = self.args(depth)?;
                let (a, b) = two(self, a)?;
                Expr::Mod(a, b)
            }
            other => {
                return Err(self.error(&format!(
                    "unsupported function {other} (supported: Symbol, Integer, Add, Mul, \
                     FloorDiv, Mod, Max, Min)"
                )))
            }
        })
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |f: &mut fmt::Formatter<'_>, t: &[Expr], sep: &str| -> fmt::Result {
            for (i, e) in t.iter().enumerate() {
                if i > 0 {
                    f.write_str(sep)?;
                }
                match e {
                    Expr::Add(_) => write!(f, "({e})")?,
                    _ => write!(f, "{e}")?,
                }
            }
            Ok(())
        };
        match self {
            Expr::Const(v) => write!(f, "{v}"),
            Expr::Sym(s) => f.write_str(s),
            Expr::Add(t) => join(f, t, " + "),
            Expr::Mul(t) => join(f, t, "*"),
            Expr::FloorDiv(a, b) => write!(f, "(({a})//({b}))"),
            Expr::Mod(a, b) => write!(f, "(({a}) % ({b}))"),
            Expr::Max(t) => {
                f.write_str("max(")?;
                join(f, t, ", ")?;
                f.write_str(")")
            }
            Expr::Min(t) => {
                f.write_str("min(")?;
                join(f, t, ", ")?;
                f.write_str(")")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_srepr_and_evaluates_at_bounds() {
        let e = Expr::parse("Mul(Integer(8), Symbol('s77', positive=True, integer=True))").unwrap();
        let mut r = Ranges::new();
        r.insert("s77".into(), (Some(1), Some(8)));
        assert_eq!(e.upper_bound(&r), Some(64));
        assert_eq!(e.to_string(), "8*s77");
        let f = Expr::parse("FloorDiv(Add(Symbol('s0'), Integer(-1)), Integer(2))").unwrap();
        r.insert("s0".into(), (Some(2), Some(11)));
        assert_eq!(f.upper_bound(&r), Some(5));
        assert_eq!(Expr::parse("s3").unwrap(), Expr::Sym("s3".into()));
        let s = Expr::Sym("s0".into());
        let e = Expr::sum(Expr::sum(s.clone(), Expr::Const(-1)), Expr::Const(1));
        assert_eq!(e, s);
        let m = Expr::product(Expr::Const(2), Expr::product(Expr::Const(4), s.clone()));
        assert_eq!(m.to_string(), "8*s0");
    }

    #[test]
    fn rejects_deep_and_unknown() {
        let deep = "Add(".repeat(200) + "1" + &")".repeat(200);
        assert!(Expr::parse(&deep).is_err());
        assert!(Expr::parse("Pow(s0, 2)").is_err());
        assert!(Expr::parse("Symbol('s0'").is_err());
    }

    #[test]
    fn arithmetic_is_checked() {
        let e = Expr::Mul(vec![Expr::Const(i64::MAX), Expr::Const(2)]);
        assert_eq!(e.as_const(), None);
        let d = Expr::FloorDiv(Box::new(Expr::Const(-7)), Box::new(Expr::Const(2)));
        assert_eq!(d.as_const(), Some(-4));
        let m = Expr::Mod(Box::new(Expr::Const(-7)), Box::new(Expr::Const(2)));
        assert_eq!(m.as_const(), Some(1));
    }
}
