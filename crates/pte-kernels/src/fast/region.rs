//! Chains of convolutions run in NHWC (channels last) as one fused call.
//!
//! A program's tensors are NCHW. A convolutional network runs faster channels last:
//! pointwise convolutions read their input as it is, depthwise ones vectorize over
//! channels, pooling and activations stream over whole pixels. The fuser (`propose`)
//! looks for a run of consecutive calls it can take over — convolutions with their
//! batch normalization, residual addition and activation, transposed convolutions
//! with their batch normalization and activation (a UNet's or a generator's
//! upsampling: a UNet-like network 0.70x of the time at one thread and 0.66x at two,
//! its encoder's values read after the transposed convolutions having kept every
//! convolution NCHW; a DCGAN generator 0.72x and 0.68x), max pooling whose indices
//! nothing reads, the mean over height and width, activations, `add` / `mul` of
//! equal shapes or by a per-channel vector (squeeze-and-excitation), bilinear
//! upsampling (segmentation heads), the concatenation of up to eight values along
//! channels (squeezenet, inception, DeepLab's atrous pyramid), and a
//! channel shuffle and split along channels (shufflenet), alone or after the
//! concatenation, as one step writing the pieces straight from the parts — with at
//! least two convolutions, or one whose result leaves through the mean over height
//! and width (a network's last convolution and its pooling). Inside the run every 4-d
//! value (and 3-d one, a 1-d convolution's `[n, c, length]` taken as a height of 1:
//! wav2letter 0.71x of the time, where each of its convolutions ran NCHW with its
//! 51 output steps as the product's 16-wide columns) is kept NHWC *in its own planned memory* (the program's memory plan already
//! gives each value room for its lifetime, and the steps run in program order), so
//! the run costs no memory beyond the conversions at its ends: inputs from before the
//! run are converted into scratch memory, and a 4-d value that leaves the run (its
//! last) is converted back. A value also read after the run (a method output, a
//! later call's input: a UNet's or a detector's feature maps) and through no view
//! leaves it late: once the run no longer reads it, it is converted back in its own
//! memory (`Plan::late`), which nothing else takes until its last reader, after the
//! run. A value with height and width 1 is the same in both layouts and may leave it
//! freely. A step's output that the plan put over the step's
//! own input (an activation placed over the convolution input it follows) moves to
//! the planned bytes of a value the fused calls no longer compute, when they are free
//! (`Region::relocate`): else each execution would copy the input away first.
//!
//! A depthwise convolution with the pointwise convolution before it, after it or both
//! (an inverted residual block), each output read by the next alone, runs as one
//! [`nhwc::DepthwiseChain`], band by band of rows: the expanded values in between are
//! never written to their planned memory.
//!
//! The fuser checks that every value kept NHWC and read outside the run (or a method
//! output) leaves it late, and that none is aliased by an elided view; the runtime
//! checks the values the run drops (batch normalization statistics, pooling indices,
//! the sigmoid of a SiLU).

use std::sync::Arc;

use pte_compute::elementwise::{self, BinaryOp};
use pte_compute::nhwc::{self, ConvNhwc, DeconvNhwc, Geometry, PoolKind};
use pte_compute::pooling::Pool2dParams;
use pte_compute::resample::Bilinear;
use pte_compute::{layout, Activation, Gemm, Isa};
use pte_runtime::{
    Arg, Args, Call, CallId, Charge, Fusion, Graph, Kernel, KernelError, KernelResult, PartProfile,
    PreparedKernel, StepTimes,
};
use smallvec::SmallVec;

use super::conv::{self, Act, Layout};
use super::fuse::{activation, arg, is_f32, match_conv, single_output};
use super::{at, charge, compute, scratch, settle};

/// Where a step reads a tensor.
#[derive(Clone, Copy, Debug)]
enum Src {
    /// The value at this argument position, in its planned memory (NHWC when produced
    /// inside the run and 4-d; else layout-free).
    Arg(usize),
    /// An NCHW input from before the run, converted into scratch entry `k`.
    Entry(usize),
    /// An NCHW input from before the run that a convolution reads as it is.
    Nchw(usize),
    /// A value moved out of the program's memory into scratch slot `slot`
    /// ([`Region::relocate`]); `pos` still gives its shape.
    Slot { slot: usize, pos: usize },
}

/// Where a step writes its result.
#[derive(Clone, Copy, Debug)]
enum Dst {
    /// The value at this argument position (NHWC if 4-d).
    Arg(usize),
    /// The run's last value, leaving it: computed in scratch, written NCHW here.
    Exit(usize),
    /// Scratch slot `slot` ([`Src::Slot`]).
    Slot { slot: usize, pos: usize },
}

impl Dst {
    fn pos(self) -> usize {
        match self {
            Dst::Arg(p) | Dst::Exit(p) | Dst::Slot { pos: p, .. } => p,
        }
    }
}

// A concatenation's parts and pieces are inline (about 400 bytes): a region holds a
// few hundred steps, copied when it is planned, never per execution.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
enum Step {
    Conv {
        layout: Layout,
        x: Src,
        residual: Option<Src>,
        out: Dst,
    },
    /// Max pooling (window lists at `window..window + 5`: kernel, stride, padding,
    /// dilation, ceil_mode) or, with `average`, average pooling (at `window..window +
    /// 6`: kernel, stride, padding, ceil_mode, count_include_pad, divisor_override).
    Pool {
        x: Src,
        window: usize,
        average: bool,
        out: Dst,
    },
    /// Bilinear upsampling (`output_size`, `align_corners`, `scale_factors` at
    /// `at..at + 3`).
    Resample {
        x: Src,
        at: usize,
        out: Dst,
    },
    /// Mean over height and width into a layout-free value.
    Mean {
        x: Src,
        out: usize,
    },
    Unary {
        x: Src,
        act: Act,
        out: Dst,
    },
    /// Concatenation along channels of up to `MAX_PARTS` values, its channels
    /// shuffled in `groups` groups (1: none), split along channels into `outs`: a
    /// channel shuffle and the split after it write their pieces straight from the
    /// parts (see [`nhwc::ChannelMix`]), all in one call (the program's memory plan
    /// may put a piece over a part, dead after the concatenation).
    Cat {
        parts: [Option<Src>; MAX_PARTS],
        groups: usize,
        outs: [Option<Dst>; MAX_PARTS],
    },
    /// `op(a, b)`; with `channel`, `b` holds one value per channel of each image.
    Binary {
        op: BinaryOp,
        a: Src,
        b: Src,
        channel: bool,
        out: Dst,
    },
}

/// Most values one step reads: a concatenation's parts (inception's four branches,
/// DeepLab's five).
const MAX_PARTS: usize = 8;

/// What the fuser proposes: the steps, the positions of the inputs to convert, and
/// the values each step's calls computed on the way that nothing else reads.
#[derive(Clone, Debug)]
struct Plan {
    steps: Vec<Step>,
    entries: Vec<usize>,
    /// (step, argument position) of those values, whose planned bytes a step's
    /// output may move to (`Region::relocate`).
    spares: Vec<(usize, usize)>,
    /// The value at each argument position (a value read by several steps has a
    /// position for each).
    values: Vec<u32>,
    /// Values that also leave the run before its last step: (step, argument
    /// position) of each, converted back to NCHW in its own planned memory after that
    /// step (its producer, or the last step of the run that reads it).
    late: Vec<(usize, usize)>,
}

/// True for a 4-d shape with more than one pixel, or a 3-d one (a 1-d convolution's
/// `[n, c, length]`, a height of 1) longer than one: its layout matters.
fn spatial(sizes: &[usize]) -> bool {
    matches!(sizes, [_, _, h, w] if h * w > 1) || matches!(sizes, [_, _, l] if *l > 1)
}

/// Whether a value of this rank may be kept channels last: 4-d, or 3-d as a height
/// of 1.
fn image_rank(rank: usize) -> bool {
    rank == 4 || rank == 3
}

/// Builds the plan for the calls at the start of `calls`, if it holds two convolutions
/// (or one whose result leaves the run through a mean over height and width).
pub(super) fn propose(g: &Graph<'_>, calls: &[Call<'_>]) -> Option<Fusion> {
    let mut b = Builder {
        g,
        args: Vec::new(),
        steps: Vec::new(),
        entries: Vec::new(),
        produced: Vec::new(),
        ids: Vec::new(),
        step_calls: Vec::new(),
        shuffled: Vec::new(),
    };
    let mut i = 0;
    while let Some(rest) = calls.get(i..).filter(|r| !r.is_empty()) {
        let before = b.ids.len();
        if !b.step(rest) {
            break;
        }
        b.step_calls.push(b.ids.len() - before);
        i += b.ids.len() - before;
    }
    // Cut after the first step whose NHWC output is read outside the run and cannot
    // leave it late (that output then leaves it in NCHW), until no earlier one is.
    let calls_of = |k: usize| b.step_calls.iter().take(k).sum::<usize>();
    // Read outside the first `n` calls, or through a view other than a shuffle's.
    let escapes = |v: u32, n: usize| {
        let outside = |v: u32| {
            let inside = calls.iter().take(n).filter(|c| refers(g, c, v)).count() as u32;
            g.uses(v) != inside
        };
        let views = g
            .views_of(v)
            .any(|w| !b.shuffled.contains(&w) || outside(w));
        g.tensor(v).is_some_and(|t| spatial(&t.sizes)) && (outside(v) || views)
    };
    // A value read outside the run but through no view may also leave it late:
    // converted back in its own memory once the run no longer reads it.
    let late_ok = |v: u32| g.views_of(v).next().is_none() && !g.is_aliased(v);
    let mut cut = b.steps.len();
    loop {
        let n = calls_of(cut);
        let first = (0..cut).find(|&k| {
            b.steps.get(k).is_some_and(|s| {
                let own = b.output_values(s);
                let last = k + 1 == cut && own.len() == 1;
                own.into_iter()
                    .any(|v| escapes(v, n) && !(last || late_ok(v)))
            })
        });
        match first {
            Some(k) if k + 1 < cut => cut = k + 1,
            // One value leaves the run last: a step writing several cannot end it.
            // Nor does a resampling: the NCHW kernel writes its (larger) output
            // directly, where the run would convert it.
            _ if cut > 0
                && b.steps.get(cut - 1).is_some_and(|s| {
                    dsts_of(s).len() > 1 || matches!(s, Step::Resample { .. })
                }) =>
            {
                cut -= 1
            }
            _ => break,
        }
    }
    let n_calls = calls_of(cut);
    let mut steps: Vec<Step> = b.steps.get(..cut)?.to_vec();
    let convs = steps
        .iter()
        .filter(|s| matches!(s, Step::Conv { .. }))
        .count();
    let last = steps.last_mut()?;
    let out = b.output_values(last).first().copied()?;
    let exits_spatial = g.tensor(out).is_some_and(|t| spatial(&t.sizes));
    // One convolution is worth its conversion only when its result leaves through a
    // mean over the image: a network's last convolution and the pooling after it
    // (shufflenet_v2's 1×1 at 7×7, its 49 pixels the columns of the NCHW product:
    // 0.67 ms against 0.42 in NHWC).
    let head = convs == 1 && matches!(last, Step::Mean { .. });
    if convs < 2 && !head {
        return None;
    }
    if exits_spatial {
        set_exit(last);
    }
    // The values leaving before the last step, each converted after its last read
    // in the run.
    let n = calls_of(cut);
    let mut late = Vec::new();
    for (k, step) in steps.iter().enumerate().take(cut.saturating_sub(1)) {
        for d in dsts_of(step) {
            let Some(&v) = b.args.get(d.pos()) else {
                continue;
            };
            if !escapes(v, n) {
                continue;
            }
            let reads = |s: &Step| {
                srcs_of(s)
                    .into_iter()
                    .any(|r| matches!(r, Src::Arg(p) if b.args.get(p) == Some(&v)))
            };
            let after = steps.iter().rposition(reads).unwrap_or(k).max(k);
            late.push((after, d.pos()));
        }
    }
    // The values each step's calls computed on the way (a convolution's output before
    // its batch normalization, ...): dropped, and read by nothing but those calls.
    let mut spares = Vec::new();
    for (k, step) in steps.iter().enumerate() {
        let own = calls.get(calls_of(k)..calls_of(k + 1)).unwrap_or_default();
        let out = b.output_values(step);
        for c in own {
            for &v in c.outputs() {
                let inside = own.iter().filter(|c| refers(g, c, v)).count() as u32;
                let dropped = !out.contains(&v)
                    && is_f32(g, v)
                    && g.tensor(v).is_some_and(|t| spatial(&t.sizes))
                    && g.uses(v) == inside
                    && !g.is_aliased(v);
                if dropped && !b.args.contains(&v) {
                    b.args.push(v);
                    spares.push((k, b.args.len() - 1));
                }
            }
        }
    }
    let ids: Vec<CallId> = b.ids.get(..n_calls)?.to_vec();
    Some(Fusion {
        name: format!(
            "fused NHWC region ({convs} convolution{}, {} calls)",
            if convs == 1 { "" } else { "s" },
            ids.len()
        ),
        calls: ids,
        kernel: Arc::new(RegionKernel(Plan {
            steps,
            entries: b.entries,
            spares,
            values: b.args.clone(),
            late,
        })),
        args: b.args,
    })
}

/// True when call `c` reads or writes `v`, directly or in a list of tensors.
fn refers(g: &Graph<'_>, c: &Call<'_>, v: u32) -> bool {
    c.args
        .iter()
        .any(|&a| a == v || g.tensor_list(a).is_some_and(|l| l.contains(&v)))
}

/// Makes the step's (first) output leave the run.
fn set_exit(step: &mut Step) {
    let out = match step {
        Step::Conv { out, .. }
        | Step::Pool { out, .. }
        | Step::Resample { out, .. }
        | Step::Unary { out, .. }
        | Step::Binary { out, .. } => out,
        Step::Cat { outs, .. } => match outs.first_mut() {
            Some(Some(out)) => out,
            _ => return,
        },
        Step::Mean { .. } => return,
    };
    *out = Dst::Exit(out.pos());
}

struct Builder<'g, 'a> {
    g: &'g Graph<'a>,
    args: Vec<u32>,
    steps: Vec<Step>,
    /// Argument positions of converted inputs, and their values.
    entries: Vec<usize>,
    /// Values computed in the run.
    produced: Vec<u32>,
    ids: Vec<CallId>,
    /// Calls taken by each step.
    step_calls: Vec<usize>,
    /// The elided views that channel shuffles read (as `[n, groups, c / groups, h,
    /// w]`): the shuffle step reads their values in NHWC.
    shuffled: Vec<u32>,
}

impl Builder<'_, '_> {
    fn output_values(&self, s: &Step) -> SmallVec<[u32; MAX_PARTS]> {
        dsts_of(s)
            .iter()
            .filter_map(|d| self.args.get(d.pos()).copied())
            .collect()
    }

    /// A source for value `v`: produced here, layout-free, or an NCHW input to convert.
    fn src(&mut self, v: u32) -> Option<Src> {
        let t = self.g.tensor(v)?;
        if !is_f32(self.g, v) {
            return None;
        }
        if self.produced.contains(&v) || !spatial(&t.sizes) {
            self.args.push(v);
            return Some(Src::Arg(self.args.len() - 1));
        }
        if !image_rank(t.rank()) {
            return None;
        }
        let known = self
            .entries
            .iter()
            .position(|&p| self.args.get(p) == Some(&v));
        Some(Src::Entry(match known {
            Some(k) => k,
            None => {
                self.args.push(v);
                self.entries.push(self.args.len() - 1);
                self.entries.len() - 1
            }
        }))
    }

    /// A source for `v` only if the run computed it.
    fn inner(&mut self, v: u32) -> Option<Src> {
        if self.produced.contains(&v) {
            self.src(v)
        } else {
            None
        }
    }

    fn output(&mut self, v: u32) -> Option<Dst> {
        let t = self.g.tensor(v)?;
        if !is_f32(self.g, v) || t.rank() > 4 {
            return None;
        }
        self.produced.push(v);
        self.args.push(v);
        Some(Dst::Arg(self.args.len() - 1))
    }

    /// The steps for `whole`, the concatenation of `parts` by the first `used` calls
    /// (or, with `used` 0, the one part itself), and for the channel shuffle and split
    /// that may follow it: a concatenation step, or one step per piece of the split.
    fn mix(
        &mut self,
        calls: &[Call<'_>],
        used: usize,
        parts: [Option<Src>; MAX_PARTS],
        whole: u32,
    ) -> Option<()> {
        let g = self.g;
        let rest = calls.get(used..).unwrap_or_default();
        match shuffle_split(g, rest, whole, used == 1) {
            Some(Mixed {
                groups,
                pieces,
                base,
                shuffled,
                calls: n,
            }) => {
                self.shuffled.extend(shuffled);
                let mut outs = [None; MAX_PARTS];
                for (out, v) in outs.iter_mut().zip(pieces) {
                    *out = Some(self.output(v)?);
                }
                self.steps.push(Step::Cat {
                    parts,
                    groups,
                    outs,
                });
                // Written through its view: listed so the runtime knows it is kept.
                self.args.extend(base);
                self.ids.extend(calls.iter().take(used + n).map(|c| c.id));
            }
            None if used == 1 => {
                let out = self.output(whole)?;
                self.steps.push(Step::Cat {
                    parts,
                    groups: 1,
                    outs: std::array::from_fn(|k| (k == 0).then_some(out)),
                });
                self.ids.extend(calls.first().map(|c| c.id));
            }
            None => return None,
        }
        Some(())
    }

    /// Takes the step at the start of `calls`; false when it cannot.
    fn step(&mut self, calls: &[Call<'_>]) -> bool {
        let mark = (
            self.args.len(),
            self.entries.len(),
            self.produced.len(),
            self.steps.len(),
            self.ids.len(),
            self.shuffled.len(),
        );
        let taken = self.try_step(calls);
        if taken.is_none() {
            self.args.truncate(mark.0);
            self.entries.truncate(mark.1);
            self.produced.truncate(mark.2);
            self.steps.truncate(mark.3);
            self.ids.truncate(mark.4);
            self.shuffled.truncate(mark.5);
        }
        taken.is_some()
    }

    /// A pooling step of call `c` from `x` into `out`, its window lists (see
    /// [`Step::Pool`]) the call's arguments `window`.
    fn pool(
        &mut self,
        c: &Call<'_>,
        x: u32,
        window: std::ops::Range<usize>,
        out: u32,
        average: bool,
    ) -> Option<()> {
        let x = self.inner(x)?;
        let at = self.args.len();
        self.args.extend_from_slice(c.args.get(window)?);
        let out = self.output(out)?;
        self.steps.push(Step::Pool {
            x,
            window: at,
            average,
            out,
        });
        self.ids.push(c.id);
        Some(())
    }

    fn try_step(&mut self, calls: &[Call<'_>]) -> Option<()> {
        let g = self.g;
        let c = calls.first()?;
        match c.op {
            "aten::convolution.out" | "aten::constant_pad_nd.out" => {
                // A zero padding the convolution after it reads alone (`match_conv`).
                let conv = if c.op == "aten::convolution.out" {
                    c
                } else {
                    calls.get(1)?
                };
                let transposed = g.bool(arg(conv, 6)?)?;
                let mut args = std::mem::take(&mut self.args);
                let m = match_conv(g, calls, &mut args, transposed);
                self.args = args;
                let m = m?;
                if !image_rank(g.tensor(m.x)?.rank()) {
                    return None;
                }
                // match_conv pushed the output last; re-register it as this run's.
                self.args.pop();
                let x = if self.produced.contains(&m.x)
                    || !spatial(&g.tensor(m.x)?.sizes)
                    || transposed
                {
                    self.src(m.x)?
                } else {
                    // An input from before the run: the convolution reads it in NCHW.
                    self.args.push(m.x);
                    Src::Nchw(self.args.len() - 1)
                };
                let residual = match m.residual {
                    Some(r) => Some(self.src(r)?),
                    None => None,
                };
                let out = self.output(m.out)?;
                let layout = Layout {
                    out: out.pos(),
                    ..m.layout
                };
                self.steps.push(Step::Conv {
                    layout,
                    x,
                    residual,
                    out,
                });
                self.ids.extend(m.ids);
            }
            "aten::max_pool2d_with_indices.out" => {
                let (x, values, indices) = (arg(c, 0)?, arg(c, 6)?, arg(c, 7)?);
                // The indices are dropped: nothing else may read them.
                if g.uses(indices) != 1 || g.is_aliased(indices) || g.tensor(x)?.rank() != 4 {
                    return None;
                }
                self.pool(c, x, 1..6, values, false)?;
            }
            "aten::avg_pool2d.out" => {
                let (x, divisor, out) = (arg(c, 0)?, arg(c, 6)?, arg(c, 7)?);
                // A divisor that is not positive is the kernel's error to report.
                if g.tensor(x)?.rank() != 4 || !(g.is_none(divisor) || g.int(divisor)? > 0) {
                    return None;
                }
                self.pool(c, x, 1..7, out, true)?;
            }
            "aten::upsample_bilinear2d.vec_out" => {
                let (x, out) = (arg(c, 0)?, arg(c, 4)?);
                if g.tensor(x)?.rank() != 4 || !is_f32(g, out) {
                    return None;
                }
                let x = self.inner(x)?;
                let at = self.args.len();
                self.args.extend_from_slice(c.args.get(1..4)?);
                let out = self.output(out)?;
                self.steps.push(Step::Resample { x, at, out });
                self.ids.push(c.id);
            }
            "aten::mean.out" => {
                let (x, dims, keep, dtype) = (arg(c, 0)?, arg(c, 1)?, arg(c, 2)?, arg(c, 3)?);
                // Over height and width, or a 3-d value's length.
                let rank = g.tensor(x)?.rank();
                let mut d: SmallVec<[i64; 8]> = g.int_list(dims)?;
                d.iter_mut()
                    .for_each(|v| *v = v.rem_euclid(rank.max(1) as i64));
                d.sort_unstable();
                let spatial_dims: &[i64] = if rank == 3 { &[2] } else { &[2, 3] };
                if !image_rank(rank) || d.as_slice() != spatial_dims || !g.is_none(dtype) {
                    return None;
                }
                g.bool(keep)?;
                let x = self.inner(x)?;
                let out = single_output(c)?;
                if spatial(&g.tensor(out)?.sizes) {
                    return None;
                }
                let Dst::Arg(out) = self.output(out)? else {
                    return None;
                };
                self.steps.push(Step::Mean { x, out });
                self.ids.push(c.id);
            }
            "aten::cat.out" => {
                let (list, dim, out) = (arg(c, 0)?, arg(c, 1)?, single_output(c)?);
                let values = g.tensor_list(list)?;
                let [n, channels, h, w] = g.tensor(out)?.sizes[..] else {
                    return None;
                };
                let mut sum = 0;
                for &v in values {
                    let [pn, pc, ph, pw] = g.tensor(v)?.sizes[..] else {
                        return None;
                    };
                    sum += pc;
                    if (pn, ph, pw) != (n, h, w) {
                        return None;
                    }
                }
                let fits = (1..=MAX_PARTS).contains(&values.len()) && sum == channels;
                if !fits
                    || g.int(dim)?.rem_euclid(4) != 1
                    || !values.iter().any(|v| self.produced.contains(v))
                {
                    return None;
                }
                let mut parts = [None; MAX_PARTS];
                for (part, &v) in parts.iter_mut().zip(values) {
                    *part = Some(self.src(v)?);
                }
                self.mix(calls, 1, parts, out)?;
            }
            "aten::permute_copy.out" | "aten::split_with_sizes_copy.out" => {
                // A shuffle or split of a value the run computed (read through a view).
                let v = arg(c, 0)?;
                let x = self
                    .produced
                    .iter()
                    .rev()
                    .copied()
                    .find(|&p| p == v || g.is_view_of(v, p))?;
                let part = self.src(x)?;
                let parts = std::array::from_fn(|k| (k == 0).then_some(part));
                self.mix(calls, 0, parts, x)?;
            }
            "aten::add.out" | "aten::mul.out" => {
                let (a, b) = (arg(c, 0)?, arg(c, 1)?);
                let out = single_output(c)?;
                let op = if c.op == "aten::add.out" {
                    if arg(c, 2).and_then(|v| g.double(v)) != Some(1.0) {
                        return None;
                    }
                    BinaryOp::Add
                } else {
                    BinaryOp::Mul
                };
                let (ta, tb, to) = (g.tensor(a)?, g.tensor(b)?, g.tensor(out)?);
                if !(self.produced.contains(&a) || self.produced.contains(&b)) {
                    return None;
                }
                let (first, second, channel) = if ta.sizes == tb.sizes && ta.sizes == to.sizes {
                    (a, b, false)
                } else if op == BinaryOp::Mul && per_channel(&ta.sizes, &tb.sizes) {
                    (a, b, true)
                } else if op == BinaryOp::Mul && per_channel(&tb.sizes, &ta.sizes) {
                    (b, a, true)
                } else {
                    return None;
                };
                if g.tensor(first)?.sizes != to.sizes {
                    return None;
                }
                let (a, b) = (self.src(first)?, self.src(second)?);
                let out = self.output(out)?;
                self.steps.push(Step::Binary {
                    op,
                    a,
                    b,
                    channel,
                    out,
                });
                self.ids.push(c.id);
            }
            _ => {
                let v = arg(c, 0)?;
                if !self.produced.contains(&v) {
                    return None;
                }
                let (act, scalars, out, n) = activation(g, calls, v, 0)?;
                let x = self.src(v)?;
                let first = self.args.len();
                self.args.extend(scalars);
                let act = shift(act, first);
                let out = self.output(out)?;
                self.steps.push(Step::Unary { x, act, out });
                self.ids.extend(calls.iter().take(n).map(|c| c.id));
            }
        }
        Some(())
    }
}

/// What a channel shuffle and split make of a value.
struct Mixed {
    /// Of the shuffle (1: none).
    groups: usize,
    /// The values written, channels one after another.
    pieces: SmallVec<[u32; MAX_PARTS]>,
    /// The shuffled tensor when its one piece is a view of it.
    base: Option<u32>,
    /// The view of the shuffle's input that it reads.
    shuffled: Option<u32>,
    /// Calls taken.
    calls: usize,
}

/// The channel shuffle and split of `x` at the start of `calls`: `permute_copy`
/// swapping the two middle dimensions of a view of `x` as `[n, groups, c / groups, h,
/// w]`, a copy of it into the default dim order (optional), and
/// `split_with_sizes_copy` along channels of a view of that as `[n, c, h, w]`; the
/// shuffle alone, read on through such a view; or the split of `x` alone. Every value
/// in between must be read by these calls alone, and with `dropped` (`x` a
/// concatenation that is not kept) `x` too.
fn shuffle_split(g: &Graph<'_>, calls: &[Call<'_>], x: u32, dropped: bool) -> Option<Mixed> {
    let sizes = g.tensor(x)?.sizes;
    let &[n, c, h, w] = sizes.as_slice() else {
        return None;
    };
    // Read by `uses` instructions and through the views `views` alone.
    let only = |v: u32, uses: u32, views: &[u32]| {
        g.uses(v) == uses && g.views_of(v).eq(views.iter().copied())
    };
    let (mut taken, mut groups, mut whole, mut shuffled) = (0, 1, x, None);
    let first = calls.first()?;
    if first.op == "aten::permute_copy.out" {
        let v = arg(first, 0)?;
        let &[vn, gs, per, vh, vw] = g.tensor(v)?.sizes.as_slice() else {
            return None;
        };
        let mut dims = g.int_list(arg(first, 1)?)?;
        dims.iter_mut().for_each(|d| *d = d.rem_euclid(5));
        let mut y = single_output(first)?;
        let swapped = [n, per, gs, h, w];
        let fits = (vn, vh, vw) == (n, h, w)
            && gs.checked_mul(per) == Some(c)
            && dims.as_slice() == [0, 2, 1, 3, 4]
            && g.is_view_of(v, x)
            && only(v, 1, &[])
            && is_f32(g, y)
            && g.tensor(y)?.sizes.as_slice() == swapped;
        if !fits || (dropped && !only(x, 1, &[v])) {
            return None;
        }
        taken = 1;
        if let Some(copy) = calls.get(1).filter(|k| {
            matches!(
                k.op,
                "dim_order_ops::_clone_dim_order.out" | "aten::clone.out"
            ) && arg(k, 0) == Some(y)
                && only(y, 2, &[])
        }) {
            let z = single_output(copy)?;
            if is_f32(g, z) && g.tensor(z)?.sizes.as_slice() == swapped {
                (y, taken) = (z, 2);
            }
        }
        (groups, whole, shuffled) = (gs, y, Some(v));
    }
    let Some(split) = calls
        .get(taken)
        .filter(|k| k.op == "aten::split_with_sizes_copy.out")
    else {
        // A shuffle whose result is read on through one view as `[n, c, h, w]`.
        let mut views = g.views_of(whole);
        let (view, None) = (views.next()?, views.next()) else {
            return None;
        };
        let fits = groups > 1
            && is_f32(g, view)
            && g.tensor(view)?.sizes == sizes
            && only(whole, 1, &[view]);
        return fits.then(|| Mixed {
            groups,
            pieces: SmallVec::from_slice(&[view]),
            base: Some(whole),
            shuffled,
            calls: taken,
        });
    };
    let (src, dim, list) = (arg(split, 0)?, arg(split, 2)?, arg(split, 3)?);
    let reads = if groups == 1 && taken == 0 {
        src == x && (!dropped || only(x, 2, &[]))
    } else {
        g.is_view_of(src, whole)
            && g.tensor(src)?.sizes == sizes
            && only(src, 1, &[])
            && only(whole, 1, &[src])
    };
    let pieces = g.tensor_list(list)?;
    let mut sum = 0usize;
    for &p in pieces {
        let &[pn, pc, ph, pw] = g.tensor(p)?.sizes.as_slice() else {
            return None;
        };
        if (pn, ph, pw) != (n, h, w) {
            return None;
        }
        sum += pc;
    }
    let fits = reads
        && g.int(dim)?.rem_euclid(4) == 1
        && sum == c
        && (1..=MAX_PARTS).contains(&pieces.len())
        && only(list, 1, &[]);
    fits.then(|| Mixed {
        groups,
        pieces: SmallVec::from_slice(pieces),
        base: None,
        shuffled,
        calls: taken + 1,
    })
}

/// True when `b` is one value per channel of `a`: `a` is `[n, c, h, w]`, `b` is
/// `[n, c, 1, 1]` (or `[1, c, 1, 1]`).
fn per_channel(a: &[usize], b: &[usize]) -> bool {
    matches!((a, b), ([n, c, _, _], [bn, bc, 1, 1]) if c == bc && (bn == n || *bn == 1) && spatial(a))
}

/// `act` with its scalar positions moved by `by`.
fn shift(act: Act, by: usize) -> Act {
    match act {
        Act::Clamp { min, max } => Act::Clamp {
            min: min + by,
            max: max + by,
        },
        Act::ClampOptional { min, max } => Act::ClampOptional {
            min: min + by,
            max: max + by,
        },
        Act::Gelu { approximate } => Act::Gelu {
            approximate: approximate + by,
        },
        Act::LeakyRelu { slope } => Act::LeakyRelu { slope: slope + by },
        other => other,
    }
}

struct RegionKernel(Plan);

impl Kernel for RegionKernel {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        let mut r = Region {
            plan: self.0.clone(),
            steps: self.0.steps.clone(),
            moved: Vec::new(),
            slots: Vec::new(),
            placed: false,
            layers: Vec::new(),
            layer_of: Vec::new(),
            resamplings: Vec::new(),
            chains: Vec::new(),
            profile: StepTimes::default(),
            scratch: ScratchPlan::default(),
            _charge: charge(args, 0, "NHWC region")?,
        };
        for s in &r.plan.steps {
            r.layer_of.push(None);
            r.resamplings.push(None);
            if let Step::Conv { layout, .. } = s {
                let layer = build_layer(args, layout, &mut r._charge)?;
                if let Some(l) = r.layer_of.last_mut() {
                    *l = Some(r.layers.len());
                }
                r.layers.push(layer);
            }
        }
        r.chains = chains(&r.plan, &r.layers, &r.layer_of);
        Ok(Box::new(r))
    }
}

/// A convolution of the run, and the arguments it was built for.
struct Layer {
    op: LayerOp,
    key: conv::Key,
    bytes: usize,
}

enum LayerOp {
    Conv(ConvNhwc),
    Transposed(DeconvNhwc),
}

impl LayerOp {
    /// The convolution, unless it is transposed.
    fn conv(&self) -> Option<&ConvNhwc> {
        match self {
            LayerOp::Conv(c) => Some(c),
            LayerOp::Transposed(_) => None,
        }
    }
}

fn build_layer(args: &Args<'_>, layout: &Layout, held: &mut Charge) -> KernelResult<Layer> {
    let unfit = || {
        KernelError::invalid(format!(
            "{}: a convolution does not qualify for the NHWC region",
            args.op()
        ))
    };
    let before = held.bytes() as usize;
    if args.bool(layout.conv + 6)? {
        // The rearranged weights while they are packed, then the packed ones.
        let weights = args.info(layout.conv + 1)?.numel();
        settle(args, held, before + weights * 12)?;
        let deconv = conv::deconv_spec(args, layout)?.ok_or_else(unfit)?;
        let bytes = deconv.bytes();
        settle(args, held, before + bytes)?;
        layout.release_copied(args);
        return Ok(Layer {
            op: LayerOp::Transposed(deconv),
            key: conv::key(args, layout)?,
            bytes,
        });
    }
    let spec = conv::spec(args, layout)?.ok_or_else(unfit)?;
    settle(
        args,
        held,
        before + (spec.weights.len() + spec.p.out_channels) * 8,
    )?;
    let conv = ConvNhwc::new(
        args.pool(),
        args.staging(),
        Gemm::new(),
        spec.p,
        spec.weights(),
        spec.bias.as_deref(),
        spec.activation,
        &mut |part| args.release_part(layout.conv + 1, bytemuck::cast_slice(part)),
    )
    .map_err(compute)?;
    let bytes = conv.bytes();
    settle(args, held, before + bytes)?;
    layout.release_copied(args);
    Ok(Layer {
        op: LayerOp::Conv(conv),
        key: conv::key(args, layout)?,
        bytes,
    })
}

/// The runs of steps that go as one depthwise chain: a depthwise convolution with the
/// pointwise convolution before it, after it, or both, when each output in the chain
/// is read by the next convolution alone (so it need not be written) and only the
/// last has a residual.
fn chains(plan: &Plan, layers: &[Layer], layer_of: &[Option<usize>]) -> Vec<(usize, usize)> {
    let value = |p: usize| plan.values.get(p).copied();
    let reads = |v: Option<u32>| {
        let srcs = plan.steps.iter().flat_map(srcs_of);
        srcs.filter(|&s| matches!(s, Src::Arg(p) if value(p) == v))
            .count()
    };
    // Step i as a convolution: its layer, input, residual and output.
    let conv = |i: usize| match plan.steps.get(i) {
        Some(&Step::Conv {
            x, residual, out, ..
        }) => {
            let layer = layers.get(layer_of.get(i).copied().flatten()?)?;
            Some((layer.op.conv()?, x, residual, out))
        }
        _ => None,
    };
    // Step i's output is step i + 1's input and nothing else's (nor leaves the run).
    let leaves = |o: usize| plan.late.iter().any(|&(_, p)| value(p) == value(o));
    let feeds = |i: usize| match (conv(i), conv(i + 1)) {
        (Some((_, _, None, Dst::Arg(o))), Some((_, Src::Arg(x), _, _))) => {
            value(o) == value(x) && reads(value(o)) == 1 && !leaves(o)
        }
        _ => false,
    };
    let mut found = Vec::new();
    let mut i = 0;
    while i < plan.steps.len() {
        let Some((layer, ..)) = conv(i).filter(|c| !matches!(c.1, Src::Nchw(_))) else {
            i += 1;
            continue;
        };
        let expand = layer.is_pointwise() && feeds(i);
        let dw = i + usize::from(expand);
        let depthwise = conv(dw).is_some_and(|c| c.0.is_depthwise() && c.2.is_none());
        let project = conv(dw + 1).is_some_and(|c| c.0.is_pointwise()) && feeds(dw);
        let len = usize::from(expand) + 1 + usize::from(project);
        if depthwise && len >= 2 {
            found.push((i, len));
            i += len;
        } else {
            i += 1;
        }
    }
    found
}

/// The prepared run: a layer per convolution, rebuilt when its arguments change
/// (dynamic shapes).
struct Region {
    plan: Plan,
    /// The plan's steps as they run: with the moves of `relocate`.
    steps: Vec<Step>,
    /// (output, spare) argument positions: the output is written into the spare's
    /// bytes and read from there.
    moved: Vec<(usize, usize)>,
    /// The outputs (argument positions, for their sizes) each scratch slot holds in
    /// turn ([`Src::Slot`]).
    slots: Vec<SmallVec<[usize; 4]>>,
    /// False until `relocate` has run for the current shapes.
    placed: bool,
    layers: Vec<Layer>,
    /// The layer of each convolution step.
    layer_of: Vec<Option<usize>>,
    /// The resampling of each upsampling step.
    resamplings: Vec<super::resample::Plan>,
    /// `(first step, steps)` of each run of steps that goes as one
    /// [`nhwc::DepthwiseChain`].
    chains: Vec<(usize, usize)>,
    /// With profiling on, per step: the step alone, then as the first of a chain
    /// (`steps.len()` on), then the conversions of the inputs (last).
    profile: StepTimes,
    /// The last execution's scratch layout, its lists' memory reused.
    scratch: ScratchPlan,
    _charge: Charge,
}

/// 4-d NCHW sizes as a value of `rank` holds them: a 3-d value drops the height of
/// 1 (another height stays, for the resize to refuse).
fn in_rank(rank: usize, sizes: SmallVec<[usize; 4]>) -> SmallVec<[usize; 4]> {
    match sizes.as_slice() {
        &[n, c, 1, w] if rank == 3 => SmallVec::from_slice(&[n, c, w]),
        _ => sizes,
    }
}

/// Sizes of argument `i` as a 4-d NCHW shape (a 3-d one has a height of 1).
fn nchw(args: &Args<'_>, i: usize) -> KernelResult<[usize; 4]> {
    match args.info(i)?.sizes.as_slice() {
        &[n, c, h, w] => Ok([n, c, h, w]),
        &[n, c, l] => Ok([n, c, 1, l]),
        &[n, c] => Ok([n, c, 1, 1]),
        s => Err(KernelError::invalid(format!(
            "NHWC region: argument {i} has shape {s:?}, not (N, C, H, W)"
        ))),
    }
}

/// A pooling step's window for input shape `x`, its lists from argument `at` (see
/// [`Step::Pool`]), and what it computes.
fn window(
    args: &Args<'_>,
    x: [usize; 4],
    at: usize,
    average: bool,
) -> KernelResult<(Pool2dParams, PoolKind)> {
    let list = |i: usize| -> KernelResult<[usize; 2]> {
        let l = args.int_list(at + i)?;
        let v = |j: usize| l.get(j).and_then(|&x| usize::try_from(x).ok());
        match l.len() {
            1 => v(0).map(|a| [a, a]),
            2 => v(0).zip(v(1)).map(|(a, b)| [a, b]),
            _ => None,
        }
        .ok_or_else(|| KernelError::invalid(format!("pooling window list {l:?}")))
    };
    let kernel = list(0)?;
    let stride = if args.int_list(at + 1)?.is_empty() {
        kernel
    } else {
        list(1)?
    };
    if !average {
        let p = Pool2dParams {
            input: [x[2], x[3]],
            kernel,
            stride,
            padding: list(2)?,
            dilation: list(3)?,
            ceil_mode: args.bool(at + 4)?,
        };
        return Ok((p, PoolKind::Max));
    }
    let kind = match args.opt_int(at + 5)? {
        Some(d) => PoolKind::AverageOver(
            usize::try_from(d)
                .ok()
                .filter(|&d| d > 0)
                .ok_or_else(|| KernelError::invalid(format!("divisor_override {d}")))?,
        ),
        None if args.bool(at + 4)? => PoolKind::AverageCountingPadding,
        None => PoolKind::Average,
    };
    let p = Pool2dParams {
        input: [x[2], x[3]],
        kernel,
        stride,
        padding: list(2)?,
        dilation: [1, 1],
        ceil_mode: args.bool(at + 3)?,
    };
    Ok((p, kind))
}

/// Where a step writes (the pieces of a split, one place for any other step).
fn dsts_of(s: &Step) -> SmallVec<[Dst; MAX_PARTS]> {
    match *s {
        Step::Conv { out, .. }
        | Step::Pool { out, .. }
        | Step::Resample { out, .. }
        | Step::Unary { out, .. }
        | Step::Binary { out, .. } => SmallVec::from_slice(&[out]),
        Step::Cat { outs, .. } => outs.into_iter().flatten().collect(),
        Step::Mean { out, .. } => SmallVec::from_slice(&[Dst::Arg(out)]),
    }
}

/// Where a step writes its (first) output.
fn dst_of(s: &Step) -> Dst {
    dsts_of(s).first().copied().unwrap_or(Dst::Arg(usize::MAX))
}

/// The argument position holding the value a source reads (for its shape).
fn src_pos(plan: &Plan, s: Src) -> usize {
    match s {
        Src::Arg(p) | Src::Nchw(p) | Src::Slot { pos: p, .. } => p,
        Src::Entry(k) => plan.entries.get(k).copied().unwrap_or(usize::MAX),
    }
}

fn srcs_of(step: &Step) -> SmallVec<[Src; MAX_PARTS]> {
    match *step {
        Step::Conv { x, residual, .. } => {
            let mut v = SmallVec::from_slice(&[x]);
            v.extend(residual);
            v
        }
        Step::Pool { x, .. }
        | Step::Resample { x, .. }
        | Step::Mean { x, .. }
        | Step::Unary { x, .. } => SmallVec::from_slice(&[x]),
        Step::Binary { a, b, .. } => SmallVec::from_slice(&[a, b]),
        Step::Cat { parts, .. } => parts.into_iter().flatten().collect(),
    }
}

/// Scratch offsets (f32) of the converted entries, the exit buffer and the working
/// memory of one execution, and the lengths of the slots after them. Kept by the
/// region and refilled at every execution: its lists keep their memory (a DenseNet
/// block's region has dozens of entries).
#[derive(Default)]
struct ScratchPlan {
    entries: Vec<(usize, usize)>,
    exit: (usize, usize),
    work: (usize, usize),
    /// The length of each slot, the slots one after another past the working memory.
    slots: Vec<usize>,
}

impl ScratchPlan {
    fn total(&self) -> usize {
        self.work.0 + self.work.1 + self.slots.iter().sum::<usize>()
    }
}

/// Scratch memory cut as a [`ScratchPlan`] lays it out, for a step writing `out`.
struct ScratchViews<'s> {
    entries: &'s mut [f32],
    exit: &'s mut [f32],
    work: &'s mut [f32],
    /// The slot the step writes, if it writes one.
    slot_out: Option<&'s mut [f32]>,
    /// Every slot, for the step's inputs; the one it writes is empty there (never
    /// read: `relocate` gives a step's output a slot none of its inputs holds).
    slot_in: SmallVec<[&'s [f32]; 8]>,
}

impl ScratchPlan {
    fn cut<'s>(&self, s: &'s mut [f32], out: Dst) -> ScratchViews<'s> {
        let (entries, rest) = s.split_at_mut(self.exit.0.min(s.len()));
        let (exit, rest) = rest.split_at_mut(self.exit.1.min(rest.len()));
        let (work, mut rest) = rest.split_at_mut(self.work.1.min(rest.len()));
        let (mut slot_out, mut slot_in) = (None, SmallVec::new());
        for (k, &len) in self.slots.iter().enumerate() {
            let n = len.min(rest.len());
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            if matches!(out, Dst::Slot { slot, .. } if slot == k) {
                slot_out = Some(piece);
                slot_in.push(&[][..]);
            } else {
                slot_in.push(&*piece);
            }
        }
        ScratchViews {
            entries,
            exit,
            work,
            slot_out,
            slot_in,
        }
    }
}

impl Region {
    /// The layer of step `i`.
    fn layer_op(&self, i: usize) -> Option<&LayerOp> {
        let l = self.layer_of.get(i).copied().flatten()?;
        self.layers.get(l).map(|l| &l.op)
    }

    /// The (not transposed) convolution of step `i`.
    fn layer(&self, i: usize) -> Option<&ConvNhwc> {
        self.layer_op(i)?.conv()
    }

    /// Steps `first..first + len` as a depthwise chain, if their layers still meet.
    fn chain(&self, first: usize, len: usize) -> Option<nhwc::DepthwiseChain<'_>> {
        let convs: SmallVec<[&ConvNhwc; 3]> = (first..first + len)
            .map(|i| self.layer(i))
            .collect::<Option<_>>()?;
        let (expand, rest) = match convs.as_slice() {
            [head, rest @ ..] if head.is_pointwise() => (Some(*head), rest),
            all => (None, all),
        };
        let (&depthwise, project) = rest.split_first()?;
        nhwc::DepthwiseChain::new(expand, depthwise, project.first().copied())
    }

    /// Runs steps `first..first + len` as one depthwise chain; false (nothing run) when
    /// an output in it would leave the run (a 1×1 value may) or the image is too small
    /// to split over the threads.
    fn run_chain(
        &self,
        args: &mut Args<'_>,
        sp: &ScratchPlan,
        first: usize,
        len: usize,
    ) -> KernelResult<bool> {
        let steps = self.steps.get(first..first + len).unwrap_or_default();
        let Some(chain) = self.chain(first, len) else {
            return Ok(false);
        };
        for s in steps.iter().take(len.saturating_sub(1)) {
            if !spatial(&args.info(dst_of(s).pos())?.sizes) {
                return Ok(false);
            }
        }
        let (Some(Step::Conv { x, .. }), Some(&Step::Conv { residual, out, .. })) =
            (steps.first(), steps.last())
        else {
            return Ok(false);
        };
        let srcs = [Some(*x), residual];
        let mut reads: SmallVec<[Arg; 2]> = SmallVec::new();
        for s in srcs.iter().flatten() {
            match s {
                Src::Arg(p) => reads.push(at(*p)),
                Src::Entry(_) | Src::Slot { .. } => {}
                Src::Nchw(_) => return Ok(false),
            }
        }
        let batch = nchw(args, src_pos(&self.plan, *x))?[0];
        if !chain.splits_well(batch, args.pool().threads()) {
            return Ok(false);
        }
        let [n, c, h, w] = nchw(args, out.pos())?;
        let x_len = nchw(args, src_pos(&self.plan, *x))?.iter().product();
        let pool = args.pool();
        let writes: SmallVec<[Arg; 1]> = match out {
            Dst::Slot { .. } => SmallVec::new(),
            _ => SmallVec::from_slice(&[at(out.pos())]),
        };
        let mut io = args.io(&reads, &writes)?;
        let missing = || KernelError::Failed("missing view".into());
        let s = scratch(io.scratch, sp.total())?;
        let ScratchViews {
            entries,
            exit,
            work,
            slot_out,
            slot_in,
        } = sp.cut(s, out);
        let mut views = io.inputs.iter();
        // The chain's input and residual; both hold `len` values.
        let mut view = |s: Src, len: usize| -> KernelResult<&[f32]> {
            match s {
                Src::Entry(k) => {
                    let (off, len) = sp.entries.get(k).copied().unwrap_or_default();
                    Ok(entries.get(off..off + len).unwrap_or_default())
                }
                Src::Slot { slot, .. } => {
                    let v = slot_in.get(slot).copied().unwrap_or_default();
                    Ok(v.get(..len).unwrap_or_default())
                }
                _ => views.next().ok_or_else(missing)?.as_slice::<f32>(),
            }
        };
        let x = view(*x, x_len)?;
        let residual = residual.map(|r| view(r, n * c * h * w)).transpose()?;
        let y = match out {
            Dst::Slot { .. } => {
                let v = slot_out.ok_or_else(missing)?;
                v.get_mut(..n * c * h * w).ok_or_else(missing)?
            }
            _ => io
                .outputs
                .first_mut()
                .ok_or_else(missing)?
                .as_mut_slice::<f32>()?,
        };
        match out {
            Dst::Arg(_) | Dst::Slot { .. } => chain.run(pool, x, batch, residual, y, work),
            Dst::Exit(_) => {
                let exit = exit.get_mut(..y.len()).unwrap_or_default();
                chain
                    .run(pool, x, batch, residual, exit, work)
                    .map_err(compute)?;
                layout::transpose(pool, exit, n, h * w, c, y)
            }
        }
        .map_err(compute)?;
        Ok(true)
    }

    /// Converts back to NCHW, in place, the values that leave the run once steps
    /// `done` have run (see [`Plan::late`]), through the exit buffer.
    fn leave_late(
        &self,
        args: &mut Args<'_>,
        sp: &ScratchPlan,
        done: std::ops::Range<usize>,
    ) -> KernelResult {
        for &(_, p) in self.plan.late.iter().filter(|(k, _)| done.contains(k)) {
            let [n, c, h, w] = nchw(args, p)?;
            let pool = args.pool();
            let mut io = args.io(&[], &[at(p)])?;
            let s = scratch(io.scratch, sp.total())?;
            let (at_exit, len) = (sp.exit.0, n * c * h * w);
            let exit = s
                .get_mut(at_exit..at_exit + len)
                .ok_or_else(missing_state)?;
            let y = io
                .outputs
                .first_mut()
                .ok_or_else(missing_state)?
                .as_mut_slice::<f32>()?;
            exit.copy_from_slice(y.get(..len).ok_or_else(missing_state)?);
            layout::transpose(pool, exit, n, h * w, c, y).map_err(compute)?;
        }
        Ok(())
    }

    /// Gives every step's output its sizes for the current inputs (rebuilding a
    /// convolution whose arguments changed) and plans the scratch memory into `sp`.
    fn shape(&mut self, args: &mut Args<'_>, sp: &mut ScratchPlan) -> KernelResult {
        let mut layers = self.layers.iter_mut();
        let threads = args.pool().threads();
        let (mut work, mut exit) = (0usize, 0usize);
        for (i, step) in self.plan.steps.iter().enumerate() {
            let x = nchw(
                args,
                src_pos(
                    &self.plan,
                    srcs_of(step)
                        .first()
                        .copied()
                        .unwrap_or(Src::Arg(usize::MAX)),
                ),
            )?;
            let sizes: SmallVec<[usize; 4]> = match step {
                Step::Conv { layout, .. } => {
                    let layer = layers.next().ok_or_else(missing_state)?;
                    if conv::key(args, layout)? != layer.key {
                        let freed = layer.bytes;
                        self._charge
                            .shrink(self._charge.bytes().saturating_sub(freed as u64));
                        *layer = build_layer(args, layout, &mut self._charge)?;
                        self.placed = false;
                    }
                    let (need, [oh, ow], channels) = match (&layer.op, step) {
                        (LayerOp::Transposed(d), _) => {
                            (d.scratch_len(threads), d.output_size(), d.out_channels())
                        }
                        (
                            LayerOp::Conv(conv),
                            Step::Conv {
                                x: Src::Nchw(_), ..
                            },
                        ) => (
                            conv.nchw_scratch_len(x[0], threads),
                            conv.output_size(),
                            conv.params().out_channels,
                        ),
                        (LayerOp::Conv(conv), _) => (
                            conv.scratch_len(threads),
                            conv.output_size(),
                            conv.params().out_channels,
                        ),
                    };
                    work = work.max(need.map_err(compute)?);
                    SmallVec::from_slice(&[x[0], channels, oh, ow])
                }
                Step::Pool {
                    window: w, average, ..
                } => {
                    let (p, _) = window(args, x, *w, *average)?;
                    let [oh, ow] = p
                        .output()
                        .map_err(|e| KernelError::invalid(format!("{}: {e}", args.op())))?;
                    SmallVec::from_slice(&[x[0], x[1], oh, ow])
                }
                Step::Resample { at, .. } => {
                    let plan = self.resamplings.get_mut(i).ok_or_else(missing_state)?;
                    let [oh, ow] = super::resample::bilinear(plan, args, *at, x)?.output();
                    SmallVec::from_slice(&[x[0], x[1], oh, ow])
                }
                Step::Mean { out, .. } => {
                    let rank = args.info(*out)?.rank();
                    let mut s: SmallVec<[usize; 4]> = SmallVec::from_slice(&[x[0], x[1]]);
                    s.extend(std::iter::repeat_n(1, rank.saturating_sub(2)));
                    s
                }
                Step::Unary { .. } | Step::Binary { .. } => SmallVec::from_slice(&x),
                Step::Cat { parts, outs, .. } => {
                    let mut channels = 0;
                    for &part in parts.iter().flatten() {
                        channels += nchw(args, src_pos(&self.plan, part))?[1];
                    }
                    // The pieces of a split keep their channels (the split's sizes
                    // are constants); `run_step` checks they add up.
                    for out in outs.iter().flatten().skip(1) {
                        let c = nchw(args, out.pos())?[1];
                        args.resize(out.pos(), &[x[0], c, x[2], x[3]])?;
                    }
                    if outs.iter().flatten().count() > 1 {
                        channels = nchw(args, dst_of(step).pos())?[1];
                    }
                    SmallVec::from_slice(&[x[0], channels, x[2], x[3]])
                }
            };
            let out = dst_of(step);
            let sizes = in_rank(args.info(out.pos())?.rank(), sizes);
            args.resize(out.pos(), &sizes)?;
            if let Dst::Exit(_) = out {
                exit = sizes.iter().product();
            }
        }
        for &(first, len) in &self.chains {
            if let Some(chain) = self.chain(first, len) {
                work = work.max(chain.scratch_len(threads).map_err(compute)?);
            }
        }
        for &(o, d) in &self.moved {
            let sizes = args.tensor(o)?.sizes;
            args.resize(d, &sizes)?;
        }
        for &(_, p) in &self.plan.late {
            exit = exit.max(args.info(p)?.numel());
        }
        sp.entries.clear();
        let mut at = 0usize;
        for &e in &self.plan.entries {
            let n = args.info(e)?.numel();
            sp.entries.push((at, n));
            at += n;
        }
        sp.slots.clear();
        for held in &self.slots {
            let mut len = 0;
            for &p in held {
                len = len.max(args.info(p)?.numel());
            }
            sp.slots.push(len);
        }
        (sp.exit, sp.work) = ((at, exit), (at + exit, work));
        Ok(())
    }

    /// Moves each step output that the program's memory plan put over one of the
    /// step's own inputs onto the bytes of a value the step's calls computed on the way
    /// (a spare), when nothing needs those bytes until the output's last read.
    ///
    /// The exporter may place an activation's output over the convolution's input,
    /// dead by then; fused, the convolution writes that output while it reads the
    /// input, and `Args::io` would copy the input away first, at every execution. The
    /// spare was live at that very step in the exporter's plan, so its bytes are
    /// apart from every value live then; what is checked here is that no later step
    /// of the run writes or still reads them before the output's last read.
    ///
    /// An output no spare can take goes to a scratch slot of the region's own, shared
    /// with outputs whose lives do not meet its own (most of them: regnet_y_400mf's
    /// steps copied 4.7 MB of inputs away per execution, the spares' bytes being
    /// taken by the next steps).
    fn relocate(&mut self, args: &mut Args<'_>) -> KernelResult {
        self.steps.clone_from(&self.plan.steps);
        self.moved.clear();
        self.slots.clear();
        // The last step that reads each slot's latest value.
        let mut busy: Vec<usize> = Vec::new();
        let values = &self.plan.values;
        let value = |p: usize| values.get(p).copied();
        // A value whose bytes cannot be read (not planned, say) never takes an output.
        let span = |args: &Args<'_>, p: usize| -> KernelResult<(usize, usize)> {
            let b = args.read(at(p))?.bytes();
            Ok((b.as_ptr() as usize, b.len()))
        };
        let meet = |a: (usize, usize), b: (usize, usize)| a.0 < b.0 + b.1 && b.0 < a.0 + a.1;
        for i in 0..self.steps.len() {
            let Some(&step) = self.steps.get(i) else {
                break;
            };
            let &[Dst::Arg(o)] = dsts_of(&step).as_slice() else {
                continue;
            };
            // A value leaving the run late is read from its own memory afterwards.
            let leaves = self.plan.late.iter().any(|&(_, p)| value(p) == value(o));
            if leaves || !spatial(&args.info(o)?.sizes) {
                continue;
            }
            let Ok(out) = span(args, o) else {
                continue;
            };
            // The last step of a chain writes while the chain's first reads.
            let start = self
                .chains
                .iter()
                .find(|c| c.0 < i && c.0 + c.1 == i + 1)
                .map_or(i, |c| c.0);
            let mut reads = arg_reads(&step);
            if start < i {
                reads.extend(self.steps.get(start).map(arg_reads).unwrap_or_default());
            }
            let clash = reads
                .iter()
                .any(|&r| span(args, r).is_ok_and(|r| meet(r, out)));
            if !clash {
                continue;
            }
            let is_o = |p: usize| value(p) == value(o);
            let later = self.steps.get(i + 1..).unwrap_or_default();
            let last = later
                .iter()
                .rposition(|s| arg_reads(s).into_iter().any(is_o))
                .map_or(i, |k| i + 1 + k);
            let sizes = args.tensor(o)?.sizes;
            let mut home = None;
            for &(_, d) in self.plan.spares.iter().filter(|&&(k, _)| k == i) {
                if args.resize(d, &sizes).is_err() {
                    continue;
                }
                let Ok(to) = span(args, d) else {
                    continue;
                };
                let mut free = true;
                for &r in &reads {
                    free &= span(args, r).is_ok_and(|r| !meet(r, to));
                }
                for (j, s) in later.iter().enumerate() {
                    // Written before the output's last read, or read later though
                    // computed before this step (live across it).
                    if i + 1 + j <= last {
                        for d in dsts_of(s) {
                            if !matches!(d, Dst::Slot { .. }) {
                                free &= span(args, d.pos()).is_ok_and(|w| !meet(w, to));
                            }
                        }
                    }
                    let before = later.get(..j).unwrap_or_default();
                    for r in arg_reads(s) {
                        let fresh = before
                            .iter()
                            .any(|p| dsts_of(p).iter().any(|d| value(d.pos()) == value(r)));
                        if !is_o(r) && !fresh {
                            free &= span(args, r).is_ok_and(|r| !meet(r, to));
                        }
                    }
                }
                if free {
                    home = Some(Home::Arg(d));
                    self.moved.push((o, d));
                    break;
                }
            }
            let home = home.unwrap_or_else(|| {
                let slot = busy.iter().position(|&b| b < start).unwrap_or_else(|| {
                    busy.push(0);
                    self.slots.push(SmallVec::new());
                    busy.len() - 1
                });
                if let (Some(b), Some(held)) = (busy.get_mut(slot), self.slots.get_mut(slot)) {
                    *b = last;
                    held.push(o);
                }
                Home::Slot(slot)
            });
            for s in self.steps.get_mut(i..).unwrap_or_default() {
                move_value(s, |p| value(p) == value(o), home);
            }
        }
        Ok(())
    }
}

/// The argument positions a step reads (converted entries are in scratch).
fn arg_reads(step: &Step) -> SmallVec<[usize; MAX_PARTS]> {
    srcs_of(step)
        .into_iter()
        .filter_map(|s| match s {
            Src::Arg(p) | Src::Nchw(p) => Some(p),
            Src::Entry(_) | Src::Slot { .. } => None,
        })
        .collect()
}

/// Where [`Region::relocate`] moves a value: the bytes of another argument position,
/// or a scratch slot.
#[derive(Clone, Copy, Debug)]
enum Home {
    Arg(usize),
    Slot(usize),
}

/// `step` with the value at the positions `from` picks read from or written to `to`.
fn move_value(step: &mut Step, from: impl Fn(usize) -> bool, to: Home) {
    let src = |s: &mut Src| {
        *s = match (*s, to) {
            (Src::Arg(p), Home::Arg(t)) if from(p) => Src::Arg(t),
            (Src::Nchw(p), Home::Arg(t)) if from(p) => Src::Nchw(t),
            (Src::Arg(p), Home::Slot(slot)) if from(p) => Src::Slot { slot, pos: p },
            (other, _) => other,
        }
    };
    let dst = |d: &mut Dst| {
        *d = match (*d, to) {
            (Dst::Arg(p), Home::Arg(t)) if from(p) => Dst::Arg(t),
            (Dst::Exit(p), Home::Arg(t)) if from(p) => Dst::Exit(t),
            (Dst::Arg(p), Home::Slot(slot)) if from(p) => Dst::Slot { slot, pos: p },
            (other, _) => other,
        }
    };
    match step {
        Step::Conv {
            x, residual, out, ..
        } => {
            src(x);
            residual.as_mut().map(src);
            dst(out);
        }
        Step::Pool { x, out, .. } | Step::Resample { x, out, .. } | Step::Unary { x, out, .. } => {
            src(x);
            dst(out);
        }
        Step::Mean { x, .. } => src(x),
        Step::Binary { a, b, out, .. } => {
            src(a);
            src(b);
            dst(out);
        }
        Step::Cat { parts, outs, .. } => {
            parts.iter_mut().flatten().for_each(src);
            outs.iter_mut().flatten().for_each(dst);
        }
    }
}

/// The views one step works on.
struct Views<'a> {
    inputs: SmallVec<[&'a [f32]; MAX_PARTS]>,
    out: &'a mut [f32],
    /// The other pieces of a split.
    more: SmallVec<[&'a mut [f32]; MAX_PARTS]>,
    work: &'a mut [f32],
}

impl PreparedKernel for Region {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        // Taken for the execution and put back after it (lost on an error: the next
        // execution allocates it again).
        let mut sp = std::mem::take(&mut self.scratch);
        self.shape(args, &mut sp)?;
        if !self.placed {
            self.relocate(args)?;
            self.placed = true;
            // With the slots' sizes.
            self.shape(args, &mut sp)?;
        }
        let pool = args.pool();
        let isa = Isa::best();
        let total = sp.total();
        let steps = self.steps.len();
        // Inputs from before the run, converted.
        let started = self.profile.start();
        for (k, &e) in self.plan.entries.iter().enumerate() {
            let [n, c, h, w] = nchw(args, e)?;
            let (off, len) = sp.entries.get(k).copied().unwrap_or_default();
            let io = args.io(&[at(e)], &[])?;
            let x = io
                .inputs
                .first()
                .ok_or_else(|| KernelError::Failed("missing view".into()))?
                .as_slice::<f32>()?;
            let s = scratch(io.scratch, total)?;
            let piece = s.get_mut(off..off + len).unwrap_or_default();
            layout::transpose(pool, x, n, c, h * w, piece).map_err(compute)?;
        }
        self.profile.record(2 * steps, started);
        let mut i = 0;
        while let Some(step) = self.steps.get(i) {
            let started = self.profile.start();
            if let Some(&(_, len)) = self.chains.iter().find(|c| c.0 == i) {
                if self.run_chain(args, &sp, i, len)? {
                    self.leave_late(args, &sp, i..i + len)?;
                    self.profile.record(steps + i, started);
                    i += len;
                    continue;
                }
            }
            let layer = self.layer_op(i);
            i += 1;
            let out = dst_of(step);
            let srcs = srcs_of(step);
            let reads: SmallVec<[Arg; MAX_PARTS]> = srcs
                .iter()
                .filter_map(|s| match s {
                    Src::Arg(p) | Src::Nchw(p) => Some(at(*p)),
                    Src::Entry(_) | Src::Slot { .. } => None,
                })
                .collect();
            let shapes: SmallVec<[[usize; 4]; MAX_PARTS]> = srcs
                .iter()
                .map(|&s| nchw(args, src_pos(&self.plan, s)))
                .collect::<KernelResult<_>>()?;
            let (activation, prepared) = match step {
                Step::Unary { act, .. } => (act.resolve(args)?, Prepared::Nothing),
                Step::Pool {
                    window: w, average, ..
                } => {
                    let x = shapes.first().copied().unwrap_or_default();
                    let (p, kind) = window(args, x, *w, *average)?;
                    let g = p.nhwc_geometry().map_err(compute)?;
                    (Activation::Identity, Prepared::Window(g, kind))
                }
                Step::Conv { .. } => (
                    Activation::Identity,
                    match layer.ok_or_else(missing_state)? {
                        LayerOp::Conv(c) => Prepared::Layer(c),
                        LayerOp::Transposed(d) => Prepared::Transposed(d),
                    },
                ),
                Step::Resample { .. } => {
                    let plan = self.resamplings.get(i - 1).and_then(|p| p.as_ref());
                    let (_, bilinear) = plan.ok_or_else(missing_state)?;
                    (Activation::Identity, Prepared::Resampling(bilinear))
                }
                _ => (Activation::Identity, Prepared::Nothing),
            };
            let y_shape = nchw(args, out.pos())?;
            let writes: SmallVec<[Arg; MAX_PARTS]> = dsts_of(step)
                .iter()
                .filter(|d| !matches!(d, Dst::Slot { .. }))
                .map(|d| at(d.pos()))
                .collect();
            {
                let mut io = args.io(&reads, &writes)?;
                let missing = || KernelError::Failed("missing view".into());
                let s = scratch(io.scratch, total)?;
                let ScratchViews {
                    entries,
                    exit,
                    work,
                    slot_out,
                    slot_in,
                } = sp.cut(s, out);
                let arg_views: SmallVec<[&[f32]; MAX_PARTS]> = io
                    .inputs
                    .iter()
                    .map(|t| t.as_slice::<f32>())
                    .collect::<KernelResult<_>>()?;
                let mut next_arg = arg_views.iter();
                let mut inputs: SmallVec<[&[f32]; MAX_PARTS]> = SmallVec::new();
                for (s, shape) in srcs.iter().zip(&shapes) {
                    inputs.push(match s {
                        Src::Arg(_) | Src::Nchw(_) => {
                            next_arg.next().copied().ok_or_else(missing)?
                        }
                        Src::Entry(k) => {
                            let (off, len) = sp.entries.get(*k).copied().unwrap_or_default();
                            entries.get(off..off + len).unwrap_or_default()
                        }
                        Src::Slot { slot, .. } => {
                            let v = slot_in.get(*slot).copied().unwrap_or_default();
                            v.get(..shape.iter().product()).unwrap_or_default()
                        }
                    });
                }
                let mut outputs = io.outputs.iter_mut();
                let (target, exit_to): (&mut [f32], Option<&mut [f32]>) = match out {
                    Dst::Arg(_) => (outputs.next().ok_or_else(missing)?.as_mut_slice()?, None),
                    Dst::Exit(_) => {
                        let y = outputs.next().ok_or_else(missing)?.as_mut_slice()?;
                        (exit, Some(y))
                    }
                    Dst::Slot { .. } => {
                        let len = y_shape.iter().product::<usize>();
                        let v = slot_out.ok_or_else(missing)?;
                        (v.get_mut(..len).ok_or_else(missing)?, None)
                    }
                };
                let more = outputs
                    .map(|t| t.as_mut_slice::<f32>())
                    .collect::<KernelResult<_>>()?;
                let v = Views {
                    inputs,
                    out: target,
                    more,
                    work,
                };
                run_step(step, prepared, pool, isa, &shapes, activation, v)?;
                if let Some(y) = exit_to {
                    let [n, c, h, w] = y_shape;
                    let exit = exit.get(..y.len()).unwrap_or_default();
                    layout::transpose(pool, exit, n, h * w, c, y).map_err(compute)?;
                }
            }
            self.leave_late(args, &sp, i - 1..i)?;
            self.profile.record(i - 1, started);
        }
        self.scratch = sp;
        Ok(())
    }

    fn set_profiling(&mut self, on: bool) {
        self.profile.set(on, 2 * self.steps.len() + 1);
    }

    /// Parts by kind: a convolution under its algorithm, a chain of convolutions run
    /// band by band as one part. A step whose result leaves the region includes its
    /// conversion back to NCHW.
    fn profile(&self) -> Vec<PartProfile> {
        let steps = self.steps.len();
        self.profile.parts(|k| {
            if k == 2 * steps {
                return "conversion to channels-last".into();
            }
            if k >= steps {
                let len = self
                    .chains
                    .iter()
                    .find(|c| c.0 == k - steps)
                    .map_or(0, |c| c.1);
                return format!("depthwise chain ({len} steps)");
            }
            match self.steps.get(k) {
                Some(Step::Conv { .. }) => match self.layer_op(k) {
                    Some(LayerOp::Conv(c)) => format!("convolution ({})", c.algorithm()),
                    Some(LayerOp::Transposed(_)) => "transposed convolution".into(),
                    None => "convolution".into(),
                },
                Some(Step::Pool { average: false, .. }) => "max pooling".into(),
                Some(Step::Pool { average: true, .. }) => "average pooling".into(),
                Some(Step::Resample { .. }) => "bilinear upsampling".into(),
                Some(Step::Mean { .. }) => "mean".into(),
                Some(Step::Unary { .. }) => "activation".into(),
                Some(Step::Cat { groups, outs, .. }) => {
                    let pieces = outs.iter().flatten().count();
                    match (*groups > 1, pieces > 1) {
                        (true, _) => "channel shuffle".into(),
                        (false, true) => "split".into(),
                        (false, false) => "concatenation".into(),
                    }
                }
                Some(Step::Binary { .. }) => "elementwise".into(),
                None => String::new(),
            }
        })
    }
}

/// What a step runs with beyond its views.
enum Prepared<'a> {
    Nothing,
    Layer(&'a ConvNhwc),
    Transposed(&'a DeconvNhwc),
    Window(Geometry, PoolKind),
    Resampling(&'a Bilinear),
}

fn missing_state() -> KernelError {
    KernelError::Failed("NHWC region: missing input or state".into())
}

fn run_step(
    step: &Step,
    prepared: Prepared<'_>,
    pool: &pte_compute::ThreadPool,
    isa: Isa,
    shapes: &[[usize; 4]],
    activation: Activation,
    v: Views<'_>,
) -> KernelResult {
    let missing = missing_state;
    let x = v.inputs.first().copied().ok_or_else(missing)?;
    let [n, c, h, w] = shapes.first().copied().ok_or_else(missing)?;
    match (step, prepared) {
        (Step::Conv { x: src, .. }, Prepared::Layer(layer)) => {
            let residual = v.inputs.get(1).copied();
            match src {
                Src::Nchw(_) => layer.run_nchw(pool, x, n, residual, v.out, v.work),
                _ => layer.run(pool, x, n, residual, v.out, v.work),
            }
            .map_err(compute)
        }
        (Step::Pool { .. }, Prepared::Window(g, kind)) => {
            let (lo, hi) = (f32::NEG_INFINITY, f32::INFINITY);
            nhwc::pool2d(isa, pool, kind, &g, c, n, x, v.out, lo, hi).map_err(compute)
        }
        (Step::Resample { .. }, Prepared::Resampling(bilinear)) => {
            bilinear.run_nhwc(pool, x, n, c, v.out).map_err(compute)
        }
        (Step::Conv { .. }, Prepared::Transposed(d)) => {
            d.run(pool, x, n, v.out, v.work).map_err(compute)
        }
        (Step::Conv { .. } | Step::Pool { .. } | Step::Resample { .. }, _) => Err(missing()),
        (Step::Mean { .. }, _) => {
            let (lo, hi) = (f32::NEG_INFINITY, f32::INFINITY);
            nhwc::global_avg_pool(isa, n, h * w, c, x, v.out, lo, hi).map_err(compute)
        }
        (Step::Unary { .. }, _) => super::rows::split(pool, v.out, 1, |o, chunk| {
            let x = x.get(o..o + chunk.len()).unwrap_or_default();
            elementwise::map(isa, chunk, x, activation)
        }),
        (Step::Cat { groups, .. }, _) => {
            let channels: SmallVec<[usize; MAX_PARTS]> = shapes.iter().map(|s| s[1]).collect();
            let pixels = n * h * w;
            let mut from = 0;
            let total: usize = channels.iter().sum();
            for out in std::iter::once(v.out).chain(v.more) {
                let len = out.len().checked_div(pixels).unwrap_or(0);
                let mix = nhwc::ChannelMix::new(&channels, *groups, from, len).map_err(compute)?;
                super::rows::split(pool, out, len, |o, chunk| {
                    let (first, count) = (o / len.max(1), chunk.len() / len.max(1));
                    let parts: SmallVec<[&[f32]; MAX_PARTS]> = v
                        .inputs
                        .iter()
                        .zip(&channels)
                        .map(|(x, &c)| x.get(first * c..(first + count) * c).unwrap_or_default())
                        .collect();
                    mix.run(&parts, chunk)
                })?;
                from += len;
            }
            if from != total {
                return Err(KernelError::invalid(format!(
                    "NHWC region: pieces of {from} channels split {total}"
                )));
            }
            Ok(())
        }
        (Step::Binary { op, channel, .. }, _) => {
            let b = v.inputs.get(1).copied().ok_or_else(missing)?;
            let op = *op;
            if *channel {
                // `b` holds a row of c values per image (or one for all images); chunks
                // of whole images when they differ.
                let image = h * w * c;
                let per_image = shapes.get(1).is_some_and(|s| s[0] == n && n > 1);
                let unit = if per_image { image } else { c };
                super::rows::split(pool, v.out, unit, |o, chunk| {
                    let a = x.get(o..o + chunk.len()).unwrap_or_default();
                    for (i, (co, ca)) in chunk
                        .chunks_mut(image.max(1))
                        .zip(a.chunks(image.max(1)))
                        .enumerate()
                    {
                        let img = o / image.max(1) + i;
                        let row = if per_image { img * c } else { 0 };
                        let bv = b.get(row..row + c).unwrap_or_default();
                        elementwise::binary_rows(isa, co, ca, bv, op, Activation::Identity)?;
                    }
                    Ok(())
                })
            } else {
                super::rows::split(pool, v.out, 1, |o, chunk| {
                    let n = chunk.len();
                    let (a, b) = (x.get(o..o + n), b.get(o..o + n));
                    elementwise::binary(
                        isa,
                        chunk,
                        a.unwrap_or_default(),
                        b.unwrap_or_default(),
                        op,
                        Activation::Identity,
                    )
                })
            }
        }
    }
}
