//! `aten::max_pool2d_with_indices.out` and `aten::avg_pool2d.out` on
//! `pte_compute::pooling` for float32 NCHW (or CHW) inputs, planes split over the
//! method's threads; when nothing reads the indices (the usual case in a network) the
//! fuser swaps max pooling for a call without them, which runs the vectorized window
//! engine.

use pte_compute::pooling::{self, AvgOptions, Pool2dParams};
use pte_compute::Isa;
use pte_runtime::{Args, KernelError, KernelResult, PreparedKernel};
use smallvec::SmallVec;

use super::{at, compute, f32_tensor, scratch, views};

/// A max pooling call site: the input at 0, its window lists at 1 to 5, the values at
/// `out`, the indices (if wanted) at `indices`.
pub(super) struct MaxPool {
    out: usize,
    indices: Option<usize>,
}

/// Prepares `max_pool2d_with_indices` when its input and output are float32.
pub(super) fn prepare_max(args: &Args<'_>, _: &dyn pte_runtime::Kernel) -> super::Prepared {
    let indices = args.info(7)?.dtype == pte_runtime::DType::I64;
    Ok((indices && qualifies(args, 6)?).then(|| {
        Box::new(MaxPool {
            out: 6,
            indices: Some(7),
        }) as Box<dyn PreparedKernel>
    }))
}

/// Prepares the fused call without indices: `[x, kernel, stride, padding, dilation,
/// ceil_mode, out, out]`.
pub(super) fn prepare_max_values(args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
    if !qualifies(args, 6)? {
        return Err(KernelError::invalid(format!(
            "{}: max pooling of this input is not supported",
            args.op()
        )));
    }
    Ok(Box::new(MaxPool {
        out: 6,
        indices: None,
    }))
}

fn qualifies(args: &Args<'_>, out: usize) -> KernelResult<bool> {
    let (Some(x), Some(_)) = (f32_tensor(args, 0)?, f32_tensor(args, out)?) else {
        return Ok(false);
    };
    Ok(matches!(x.rank(), 3 | 4))
}

/// An average pooling call site: `[x, kernel, stride, padding, ceil_mode,
/// count_include_pad, divisor_override, out]`.
pub(super) struct AvgPool;

/// Prepares `avg_pool2d` when its input and output are float32 and any divisor
/// override is positive.
pub(super) fn prepare_avg(args: &Args<'_>, _: &dyn pte_runtime::Kernel) -> super::Prepared {
    let divisor_ok = args.opt_int(6)?.is_none_or(|d| d > 0);
    Ok((divisor_ok && qualifies(args, 7)?).then(|| Box::new(AvgPool) as Box<dyn PreparedKernel>))
}

impl PreparedKernel for AvgPool {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let (p, sizes) = params(args, 1, None, 4)?;
        let divisor_override = match args.opt_int(6)? {
            Some(d) => Some(usize::try_from(d).map_err(|_| {
                KernelError::invalid(format!(
                    "{}: divisor_override {d} must be positive",
                    args.op()
                ))
            })?),
            None => None,
        };
        let opts = AvgOptions {
            count_include_pad: args.bool(5)?,
            divisor_override,
        };
        args.resize(7, &sizes)?;
        let pool = args.pool();
        let mut io = args.io(&[at(0)], &[at(7)])?;
        let (x, y) = views(&io.inputs, &mut io.outputs)?;
        pooling::avg_pool2d(pool, &p, opts, x, y).map_err(compute)
    }
}

/// A window list as two values (one value stands for both).
fn pair(list: &[i64]) -> Option<[usize; 2]> {
    let v = |i: usize| list.get(i).and_then(|&x| usize::try_from(x).ok());
    match list.len() {
        1 => Some([v(0)?, v(0)?]),
        2 => Some([v(0)?, v(1)?]),
        _ => None,
    }
}

/// The window of the call, and the output sizes: the kernel, stride and padding lists
/// at `k`, `k + 1` and `k + 2`, the dilation list at `dilation` (none: 1) and
/// `ceil_mode` at `ceil`.
fn params(
    args: &Args<'_>,
    k: usize,
    dilation: Option<usize>,
    ceil: usize,
) -> KernelResult<(Pool2dParams, SmallVec<[usize; 4]>)> {
    let x = args.info(0)?;
    let bad = || {
        KernelError::invalid(format!(
            "{}: window lists must hold one or two non-negative values",
            args.op()
        ))
    };
    let dilation = match dilation {
        Some(i) => args.int_list(i)?,
        None => smallvec::smallvec![1],
    };
    let (kernel, stride, padding) = (
        args.int_list(k)?,
        args.int_list(k + 1)?,
        args.int_list(k + 2)?,
    );
    let kernel = pair(&kernel).ok_or_else(bad)?;
    let stride = if stride.is_empty() {
        kernel
    } else {
        pair(&stride).ok_or_else(bad)?
    };
    let (Some(padding), Some(dilation)) = (pair(&padding), pair(&dilation)) else {
        return Err(bad());
    };
    let (lead, hw) = x.sizes.split_at(x.rank().saturating_sub(2));
    let &[h, w] = hw else {
        return Err(KernelError::invalid(format!(
            "{}: input of shape {:?} is not (N, C, H, W) or (C, H, W)",
            args.op(),
            x.sizes.as_slice()
        )));
    };
    let p = Pool2dParams {
        input: [h, w],
        kernel,
        stride,
        padding,
        dilation,
        ceil_mode: args.bool(ceil)?,
    };
    let out = p
        .output()
        .map_err(|e| KernelError::invalid(format!("{}: {e}", args.op())))?;
    let mut sizes: SmallVec<[usize; 4]> = lead.iter().copied().collect();
    sizes.extend_from_slice(&out);
    Ok((p, sizes))
}

impl PreparedKernel for MaxPool {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let (p, sizes) = params(args, 1, Some(4), 5)?;
        args.resize(self.out, &sizes)?;
        if let Some(i) = self.indices {
            args.resize(i, &sizes)?;
        }
        let pool = args.pool();
        let writes = [at(self.out), at(self.indices.unwrap_or(self.out))];
        let n_writes = 1 + usize::from(self.indices.is_some());
        let mut io = args.io(&[at(0)], writes.get(..n_writes).unwrap_or_default())?;
        let missing = || KernelError::Failed("missing tensor view".into());
        let x = io.inputs.first().ok_or_else(missing)?.as_slice::<f32>()?;
        let (values, rest) = io.outputs.split_at_mut(1);
        let y = values
            .first_mut()
            .ok_or_else(missing)?
            .as_mut_slice::<f32>()?;
        let indices = match rest.first_mut() {
            Some(t) => Some(t.as_mut_slice::<i64>()?),
            None => None,
        };
        let len = p.scratch_len(pool.threads()).map_err(compute)?;
        let s = scratch(io.scratch, len)?;
        pooling::max_pool2d(Isa::best(), pool, &p, x, y, indices, s).map_err(compute)
    }
}
