//! The Edge dialect's rules (upstream `to_edge` after decomposition):
//!
//! - views become their `_copy` forms (`view` -> `view_copy`, ...);
//! - a Python number passed where the schema wants a tensor becomes a 0-dim constant tensor
//!   of the operation's computation type (upstream's `ScalarToTensorPass` followed by its
//!   mixed-type cast, folded into one constant);
//! - `_to_copy` becomes `dim_order_ops::_to_dim_order_copy`;
//! - views and permutations of constants are computed now (their results become
//!   constants), so weights are not transposed at every execution.

use std::collections::HashMap;

use crate::archive::TensorData;
use crate::dtype::{self, DType, ScalarKind};
use crate::error::{CompileError, Result};
use crate::import::Program;
use crate::ir::{Arg, Node, Op, ValueId};
use crate::passes::decompose::VIEWS;
use crate::passes::{Action, Rewriter};
use crate::schema::{self, Ty};

/// Runs the pass.
pub fn run(p: &mut Program) -> Result<()> {
    let mut scalars: HashMap<(i32, u64), ValueId> = HashMap::new();
    Rewriter::run(p, &mut |rw, mut node| {
        if let Some((_, copy)) = VIEWS.iter().find(|(v, _)| *v == node.op.key()) {
            node.op = Op::parse(copy);
        }
        if node.op.key() == "aten::_to_copy" {
            // (self, dtype, layout, device, pin_memory, non_blocking, memory_format)
            let rank = rw
                .meta(node.args.first().and_then(Arg::tensor).unwrap_or_default())?
                .rank();
            let take = |i: usize| node.args.get(i).cloned().unwrap_or(Arg::None);
            node.args = vec![
                take(0),
                take(1),
                take(2),
                take(3),
                take(4),
                Arg::Bool(take(5).bool().unwrap_or(false)),
                Arg::Ints((0..rank as i64).map(crate::ir::IntArg::Const).collect()),
            ];
            node.op = Op::new("dim_order_ops::_to_dim_order_copy", "");
        }
        if let Some(folded) = fold(rw, &node)? {
            return Ok(Action::Replaced(vec![folded]));
        }
        scalars_to_tensors(rw, &mut node, &mut scalars)?;
        Ok(Action::Keep(node))
    })
}

/// Replaces numbers given for tensor arguments by 0-dim constants.
fn scalars_to_tensors(
    rw: &mut Rewriter<'_>,
    node: &mut Node,
    cache: &mut HashMap<(i32, u64), ValueId>,
) -> Result<()> {
    let Some(s) = schema::lookup(&node.op) else {
        return Ok(());
    };
    let numeric = |a: &Arg| matches!(a, Arg::Int(_) | Arg::Float(_) | Arg::Bool(_));
    if !node
        .args
        .iter()
        .zip(&s.args)
        .any(|(a, sa)| numeric(a) && matches!(sa.ty, Ty::Tensor))
    {
        return Ok(());
    }
    // The computation type: the output's, or for comparisons the other operands' promoted
    // with the number.
    let out_dtype = node
        .outputs
        .first()
        .and_then(|&o| rw.p.graph.meta(o))
        .map(|m| m.dtype);
    let tensor_dtype = node
        .args
        .iter()
        .filter_map(Arg::tensor)
        .filter_map(|v| rw.p.graph.meta(v).map(|m| m.dtype))
        .reduce(dtype::promote);
    for (a, sa) in node.args.iter_mut().zip(&s.args) {
        if !(numeric(a) && matches!(sa.ty, Ty::Tensor)) {
            continue;
        }
        let kind = match a {
            Arg::Float(_) => ScalarKind::Float,
            Arg::Bool(_) => ScalarKind::Bool,
            _ => ScalarKind::Int,
        };
        let d = match (out_dtype, tensor_dtype) {
            (Some(o), _) if o != DType::Bool => o,
            (_, Some(t)) => dtype::promote_with_scalar(t, kind),
            _ => match kind {
                ScalarKind::Float => DType::Float,
                ScalarKind::Int => DType::Long,
                ScalarKind::Bool => DType::Bool,
            },
        };
        let v = a.number().unwrap_or(0.0);
        let key = (d as i32, v.to_bits());
        let id = match cache.get(&key) {
            Some(&id) => id,
            None => {
                let data = scalar_bytes(d, v).ok_or_else(|| {
                    CompileError::unsupported(node.op.key(), format!("a number as a {d:?} tensor"))
                })?;
                let id = rw.constant(
                    "_lifted_tensor_constant",
                    TensorData {
                        dtype: d,
                        sizes: vec![],
                        bytes: data,
                    },
                );
                cache.insert(key, id);
                id
            }
        };
        *a = Arg::Tensor(id);
    }
    Ok(())
}

/// The bytes of one element of type `d` holding `v` (as PyTorch converts it).
pub fn scalar_bytes(d: DType, v: f64) -> Option<Vec<u8>> {
    Some(match d {
        DType::Float => (v as f32).to_le_bytes().to_vec(),
        DType::Double => v.to_le_bytes().to_vec(),
        DType::Long => (v as i64).to_le_bytes().to_vec(),
        DType::Int => (v as i32).to_le_bytes().to_vec(),
        DType::Short => (v as i16).to_le_bytes().to_vec(),
        DType::Char => (v as i8).to_le_bytes().to_vec(),
        DType::Byte => (v as u8).to_le_bytes().to_vec(),
        DType::Bool => vec![u8::from(v != 0.0)],
        DType::Half => f16_bits(v as f32).to_le_bytes().to_vec(),
        DType::Bfloat16 => bf16_bits(v as f32).to_le_bytes().to_vec(),
        _ => return None,
    })
}

fn bf16_bits(f: f32) -> u16 {
    let b = f.to_bits();
    if f.is_nan() {
        return 0x7fc0;
    }
    // Round to nearest even.
    let round = ((b >> 16) & 1) + 0x7fff;
    ((b + round) >> 16) as u16
}

fn f16_bits(f: f32) -> u16 {
    let b = f.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = (man | 0x80_0000) >> (1 - e);
        let r = if (m & 0x1fff) > 0x1000 || ((m & 0x1fff) == 0x1000 && (m & 0x2000) != 0) {
            1
        } else {
            0
        };
        return sign | ((m >> 13) as u16 + r);
    }
    let m = man >> 13;
    let rest = man & 0x1fff;
    let mut h = sign as u32 | ((e as u32) << 10) | m;
    if rest > 0x1000 || (rest == 0x1000 && (m & 1) != 0) {
        h += 1;
    }
    h as u16
}

/// Computes `permute_copy` and static `view_copy` of constants at compile time.
fn fold(rw: &mut Rewriter<'_>, node: &Node) -> Result<Option<ValueId>> {
    let key = node.op.key();
    if key != "aten::permute_copy" && key != "aten::view_copy" {
        return Ok(None);
    }
    let Some(input) = node.args.first().and_then(Arg::tensor) else {
        return Ok(None);
    };
    let Some(&out) = node.outputs.first() else {
        return Ok(None);
    };
    let Some(out_sizes) = rw.meta(out)?.static_sizes() else {
        return Ok(None);
    };
    let Some(data) = rw.p.constants.get(&input) else {
        return Ok(None);
    };
    let dtype = data.dtype;
    let bytes = if key == "aten::view_copy" {
        data.bytes.clone()
    } else {
        let dims = node.args.get(1).and_then(Arg::ints).unwrap_or_default();
        permute_bytes(data, &dims)
            .ok_or_else(|| CompileError::invalid(key.clone(), "bad permutation"))?
    };
    let name = format!(
        "{}_{}",
        rw.p.graph.name(input),
        node.op.short().trim_end_matches("_copy")
    );
    Ok(Some(rw.constant(
        &name,
        TensorData {
            dtype,
            sizes: out_sizes,
            bytes,
        },
    )))
}

/// `rows x cols` elements of `es` bytes, transposed in cache-sized tiles.
fn transpose_2d(src: &[u8], rows: usize, cols: usize, es: usize) -> Option<Vec<u8>> {
    const TILE: usize = 32;
    if src.len() != rows.checked_mul(cols)?.checked_mul(es)? {
        return None;
    }
    let mut out = vec![0u8; src.len()];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    let (s, d) = ((r * cols + c) * es, (c * rows + r) * es);
                    out.get_mut(d..d + es)?.copy_from_slice(src.get(s..s + es)?);
                }
            }
        }
    }
    Some(out)
}

// Indices stay below `rank` and the sizes, which the loop bounds.
#[allow(clippy::indexing_slicing)]
fn permute_bytes(t: &TensorData, dims: &[i64]) -> Option<Vec<u8>> {
    let rank = t.sizes.len();
    if dims.len() != rank {
        return None;
    }
    let es = dtype::size_of(t.dtype);
    if rank == 2 && dims.iter().map(|&d| d.rem_euclid(2)).eq([1, 0]) {
        return transpose_2d(&t.bytes, t.sizes[0] as usize, t.sizes[1] as usize, es);
    }
    let perm: Vec<usize> = dims
        .iter()
        .map(|&d| {
            if d < 0 {
                (d + rank as i64) as usize
            } else {
                d as usize
            }
        })
        .collect();
    let mut strides = vec![1usize; rank];
    for i in (0..rank.saturating_sub(1)).rev() {
        strides[i] = strides.get(i + 1)? * (*t.sizes.get(i + 1)? as usize);
    }
    let out_sizes: Vec<usize> = perm
        .iter()
        .map(|&p| t.sizes.get(p).map(|&s| s as usize))
        .collect::<Option<_>>()?;
    let out_strides: Vec<usize> = perm
        .iter()
        .map(|&p| strides.get(p).copied())
        .collect::<Option<_>>()?;
    let numel: usize = out_sizes.iter().product();
    let mut out = Vec::with_capacity(numel * es);
    let mut idx = vec![0usize; rank];
    for _ in 0..numel {
        let src: usize = idx.iter().zip(&out_strides).map(|(i, s)| i * s).sum();
        out.extend_from_slice(t.bytes.get(src * es..src * es + es)?);
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < out_sizes[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Some(out)
}
