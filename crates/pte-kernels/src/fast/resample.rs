//! `aten::upsample_bilinear2d.vec_out` on `pte_compute::resample` for float32 NCHW
//! inputs: the positions and weights of every output row and column computed when the
//! call's sizes are first seen (again only when they change), planes split over the
//! method's threads, nothing allocated per execution.

use pte_compute::resample::Bilinear;
use pte_runtime::{Args, KernelResult, PreparedKernel};

use super::{at, compute, f32_tensor, scratch, views};
use crate::nn::sample::out_size;

/// A call's input sizes, output size, `align_corners` and scale factors.
type Key = ([usize; 4], [usize; 2], bool, [Option<f64>; 2]);

/// A resampling prepared for the sizes last seen, if any.
pub(super) type Plan = Option<(Key, Bilinear)>;

/// The resampling of an input of sizes `x` (NCHW) that the call's `output_size`,
/// `align_corners` and `scale_factors` (arguments `at..at + 3`) ask for, kept in `plan`
/// until they change.
pub(super) fn bilinear<'p>(
    plan: &'p mut Plan,
    args: &Args<'_>,
    at: usize,
    [n, c, h, w]: [usize; 4],
) -> KernelResult<&'p Bilinear> {
    let align_corners = args.bool(at + 1)?;
    let (size, scales) = out_size(args, at, at + 2, [h, w], "upsample_bilinear2d")?;
    let key = ([n, c, h, w], size, align_corners, scales);
    let kept = match plan.take() {
        Some((seen, bilinear)) if seen == key => bilinear,
        _ => Bilinear::new([h, w], size, align_corners, scales).map_err(compute)?,
    };
    Ok(&plan.insert((key, kept)).1)
}

/// A bilinear upsampling call site: `[x, output_size?, align_corners, scale_factors?,
/// out]`.
pub(super) struct Upsample {
    plan: Plan,
}

/// Prepares `upsample_bilinear2d.vec` when its input (4-d) and output are float32.
pub(super) fn prepare_bilinear(args: &Args<'_>, _: &dyn pte_runtime::Kernel) -> super::Prepared {
    let (Some(x), Some(_)) = (f32_tensor(args, 0)?, f32_tensor(args, 4)?) else {
        return Ok(None);
    };
    Ok((x.rank() == 4).then(|| Box::new(Upsample { plan: None }) as Box<dyn PreparedKernel>))
}

impl PreparedKernel for Upsample {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let x = args.info(0)?;
        let &[n, c, h, w] = x.sizes.as_slice() else {
            return Err(pte_runtime::KernelError::invalid(format!(
                "{}: expects a 4-D input, got {:?}",
                args.op(),
                x.sizes
            )));
        };
        let bilinear = bilinear(&mut self.plan, args, 1, [n, c, h, w])?;
        let [oh, ow] = bilinear.output();
        args.resize(4, &[n, c, oh, ow])?;
        let pool = args.pool();
        let mut io = args.io(&[at(0)], &[at(4)])?;
        let len = bilinear.scratch_len(pool.threads()).map_err(compute)?;
        let (x, y) = views(&io.inputs, &mut io.outputs)?;
        let s = scratch(io.scratch, len)?;
        bilinear.run_nchw(pool, x, n * c, y, s).map_err(compute)
    }
}
