//! `cat` along channels [→] `_native_batch_norm_legit_no_training` [→ activation] in
//! NCHW as one pass: every output plane is its source plane scaled, shifted and
//! activated, read straight from the part that holds it.
//!
//! Pre-activation networks normalize a concatenation before each convolution (each
//! layer of a DenseNet block reads `relu(batch_norm(cat(all earlier features)))`); the
//! normalization cannot fold into the convolution's weights across the activation. Run
//! call by call, the concatenation, the normalization and the activation each pass over
//! the whole tensor, on one thread for the concatenation.

use std::sync::Arc;

use pte_compute::elementwise::{self, Activation};
use pte_compute::Isa;
use pte_runtime::{Arg, Args, Call, Fusion, Graph, Kernel, KernelError, KernelResult};
use pte_runtime::{PreparedKernel, TensorInfo};
use smallvec::SmallVec;

use super::compute;
use super::conv::{batch_norm_coefficients, Act};
use super::fuse::{activation, arg, is_f32, single_output};

/// Argument positions of the fused call: the parts at `0..parts`, the normalization's
/// weight, bias, running mean, running variance and eps from `parts` on, the
/// activation's scalars, the output at `out`.
#[derive(Clone, Copy)]
struct Layout {
    parts: usize,
    act: Act,
    out: usize,
}

/// The fusion at the start of `calls`: a concatenation along dim 1 read by a batch
/// normalization, or a batch normalization alone, with the activation after it; at
/// least two calls.
pub(super) fn propose(g: &Graph<'_>, calls: &[Call<'_>]) -> Option<Fusion> {
    let first = calls.first()?;
    let (parts, at): (Vec<u32>, usize) = match first.op {
        "aten::cat.out" => {
            let (list, dim, out) = (arg(first, 0)?, arg(first, 1)?, single_output(first)?);
            let values = g.tensor_list(list)?;
            let whole = g.tensor(out)?;
            let rank = whole.rank();
            if rank < 2 || g.int(dim)?.rem_euclid(i64::try_from(rank).ok()?) != 1 {
                return None;
            }
            let mut channels = 0usize;
            for &v in values {
                let t = g.tensor(v)?;
                let same = t.rank() == rank
                    && t.sizes
                        .iter()
                        .zip(&whole.sizes)
                        .enumerate()
                        .all(|(d, (a, b))| d == 1 || a == b);
                if !same || !is_f32(g, v) {
                    return None;
                }
                channels = channels.checked_add(*t.sizes.get(1)?)?;
            }
            let bn = calls.get(1)?;
            let fits = !values.is_empty()
                && channels == *whole.sizes.get(1)?
                && is_f32(g, out)
                && bn.op == "aten::_native_batch_norm_legit_no_training.out"
                && arg(bn, 0) == Some(out);
            fits.then(|| (values.to_vec(), 1))?
        }
        "aten::_native_batch_norm_legit_no_training.out" => {
            let x = arg(first, 0)?;
            let rank = g.tensor(x)?.rank();
            (is_f32(g, x) && rank >= 2).then(|| (vec![x], 0))?
        }
        _ => return None,
    };
    let bn = calls.get(at)?;
    let params = bn.args.get(1..5)?;
    let (eps, normalized) = (arg(bn, 6)?, arg(bn, 7)?);
    let constant = |i: usize, p: u32| (i < 2 && g.is_none(p)) || (is_f32(g, p) && g.is_constant(p));
    let ok = params.iter().enumerate().all(|(i, &p)| constant(i, p))
        && g.double(eps).is_some()
        && is_f32(g, normalized);
    if !ok {
        return None;
    }
    let mut ids: Vec<_> = calls.iter().take(at + 1).map(|c| c.id).collect();
    let mut names = vec!["batch_norm"];
    if at == 1 {
        names.insert(0, "cat");
    }
    let mut args = parts.clone();
    args.extend_from_slice(params);
    args.push(eps);
    let rest = calls.get(at + 1..).unwrap_or_default();
    let (act, out) = match activation(g, rest, normalized, args.len()) {
        Some((act, scalars, out, n)) => {
            args.extend(scalars);
            ids.extend(rest.iter().take(n).map(|c| c.id));
            names.push("activation");
            (act, out)
        }
        None => (Act::None, normalized),
    };
    if ids.len() < 2 {
        return None;
    }
    let layout = Layout {
        parts: parts.len(),
        act,
        out: args.len(),
    };
    args.extend([out, out]);
    Some(Fusion {
        calls: ids,
        name: format!("fused {}", names.join("+")),
        kernel: Arc::new(CatNorm(layout)),
        args,
    })
}

/// Parts read by one call of the runtime's (`Args::io`).
const READS: usize = 8;

struct CatNorm(Layout);

impl Kernel for CatNorm {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        let l = self.0;
        let channels = args.info(l.out)?.sizes.get(1).copied().unwrap_or(0);
        let (scale, shift) = batch_norm_coefficients(args, l.parts, channels, None)?;
        let coefficients = scale
            .iter()
            .zip(shift)
            .map(|(&s, b)| (s as f32, b))
            .collect();
        Ok(Box::new(Prepared { l, coefficients }))
    }
}

struct Prepared {
    l: Layout,
    /// Factor and shift of each channel.
    coefficients: Vec<(f32, f32)>,
}

impl Prepared {
    /// Part `k`'s shape, checked against the first part's outside dim 1.
    fn part(&self, args: &Args<'_>, k: usize, first: &TensorInfo) -> KernelResult<TensorInfo> {
        let t = args.tensor(k)?;
        let same = t.rank() == first.rank()
            && t.rank() >= 2
            && t.sizes
                .iter()
                .zip(&first.sizes)
                .enumerate()
                .all(|(d, (a, b))| d == 1 || a == b);
        if !same {
            return Err(KernelError::invalid(format!(
                "cat: shapes {:?} and {:?} differ outside dim 1",
                first.sizes.as_slice(),
                t.sizes.as_slice()
            )));
        }
        Ok(t)
    }
}

impl PreparedKernel for Prepared {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let l = self.l;
        let activation: Activation = l.act.resolve(args)?;
        let first = args.info(0)?;
        let mut channels = 0usize;
        for k in 0..l.parts {
            let c = self
                .part(args, k, first)?
                .sizes
                .get(1)
                .copied()
                .unwrap_or(0);
            channels = channels
                .checked_add(c)
                .ok_or_else(|| KernelError::invalid("cat: channel count overflows"))?;
        }
        if channels != self.coefficients.len() {
            return Err(KernelError::invalid(format!(
                "batch_norm: {channels} channels, normalized with {} values each",
                self.coefficients.len()
            )));
        }
        let mut sizes = first.sizes.clone();
        if let Some(c) = sizes.get_mut(1) {
            *c = channels;
        }
        args.resize(l.out, &sizes)?;
        let batch = sizes.first().copied().unwrap_or(0);
        let inner: usize = sizes.iter().skip(2).product();
        let (pool, isa) = (args.pool(), Isa::best());
        // Up to READS parts at a time (the reads of one call are kept on the stack),
        // batch entry by batch entry: each writes one run of whole output planes.
        let mut c0 = 0;
        for group in (0..l.parts).step_by(READS) {
            let reads: SmallVec<[Arg; READS]> =
                (group..l.parts.min(group + READS)).map(Arg::At).collect();
            let mut io = args.io(&reads, &[Arg::At(l.out)])?;
            let mut xs: SmallVec<[(&[f32], usize); READS]> = SmallVec::new();
            for t in &io.inputs {
                xs.push((
                    t.as_slice::<f32>()?,
                    t.info.sizes.get(1).copied().unwrap_or(0),
                ));
            }
            let y = io
                .outputs
                .first_mut()
                .ok_or_else(|| KernelError::Failed("missing tensor view".into()))?
                .as_mut_slice::<f32>()?;
            let width: usize = xs.iter().map(|&(_, c)| c).sum();
            let coefficients = self.coefficients.get(c0..c0 + width).unwrap_or_default();
            for b in 0..batch {
                let start = (b * channels + c0) * inner;
                let dst = y.get_mut(start..start + width * inner).unwrap_or_default();
                // Output plane `j` of the group: the part holding it, and its plane there.
                let source = |mut j: usize| {
                    for &(x, c) in &xs {
                        if j < c {
                            let at = (b * c + j) * inner;
                            return x.get(at..at + inner).unwrap_or_default();
                        }
                        j -= c;
                    }
                    &[]
                };
                elementwise::affine_planes(pool, isa, dst, inner, coefficients, activation, source)
                    .map_err(compute)?;
            }
            c0 += width;
        }
        Ok(())
    }
}
