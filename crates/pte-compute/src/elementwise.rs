//! Vectorized f32 loops: activations, binary operations with a broadcast per-channel
//! vector, softmax and layer normalization of rows.
//!
//! Every loop is compiled once per instruction set (`arch::multiversion!`) and
//! chosen at run time from the [`Isa`] argument; the math functions are those of
//! `math` (accuracy stated there).

#[cfg(target_arch = "x86_64")]
use crate::arch::Lanes;
use crate::arch::{madd, multiversion, Isa, Scalar};
use crate::error::{need, Error, Result};
use crate::math;
use crate::pool::{FirstError, ThreadPool};
use std::sync::Mutex;

/// An activation applied elementwise, fused into the producing kernel's epilogue.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Activation {
    /// No activation.
    #[default]
    Identity,
    /// `min(max(x, min), max)`: ReLU is `Clamp { min: 0, max: inf }`, ReLU6 and
    /// hardtanh are clamps too. NaN passes through.
    Clamp { min: f32, max: f32 },
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// `x · Φ(x)` (erf form, PyTorch's default `gelu`).
    Gelu,
    /// GELU with the tanh approximation (PyTorch's `approximate="tanh"`).
    GeluTanh,
    /// `x · sigmoid(x)` (SiLU, swish).
    Silu,
    /// `x · relu6(x + 3) / 6`, divided last as eager PyTorch does.
    HardSwish,
    /// Hardswish as XNNPACK computes it, `x · clamp(x · ⅙ + ½, 0, 1)` with one fused
    /// multiply-add: [`Activation::HardSwish`]'s function rounded otherwise, without
    /// the division (which made XNNPACK hardswish nodes three times upstream's time).
    HardSwishFused,
    /// `relu6(x + 3) / 6`.
    HardSigmoid,
    /// `x` if `x > 0`, else `slope · x` (NaN stays NaN).
    LeakyRelu { slope: f32 },
}

impl Activation {
    /// ReLU.
    pub const RELU: Activation = Activation::Clamp {
        min: 0.0,
        max: f32::INFINITY,
    };
    /// ReLU6.
    pub const RELU6: Activation = Activation::Clamp { min: 0.0, max: 6.0 };

    /// The activation of one value (the portable path; the reference for tests).
    pub fn apply_scalar(self, x: f32) -> f32 {
        act::<false>(self, x)
    }
}

/// The activation of one value, vectorizable inside a loop.
#[inline(always)]
pub(crate) fn act<const FMA: bool>(a: Activation, x: f32) -> f32 {
    match a {
        Activation::Identity => x,
        Activation::Clamp { min, max } => clamp(x, min, max),
        Activation::Sigmoid => math::sigmoid(Scalar::<FMA>, x),
        Activation::Tanh => math::tanh::<FMA>(x),
        Activation::Gelu => math::gelu::<FMA>(x),
        Activation::GeluTanh => math::gelu_tanh::<FMA>(x),
        Activation::Silu => math::silu(Scalar::<FMA>, x),
        Activation::HardSwish => x * clamp(x + 3.0, 0.0, 6.0) / 6.0,
        Activation::HardSwishFused => {
            x * clamp(crate::arch::madd::<FMA>(x, 1.0 / 6.0, 0.5), 0.0, 1.0)
        }
        Activation::HardSigmoid => clamp(x + 3.0, 0.0, 6.0) / 6.0,
        Activation::LeakyRelu { slope } => leaky(x, slope),
    }
}

/// `x` if `x > 0`, else `slope · x`: a select that vectorizes to a blend.
#[inline(always)]
pub(crate) fn leaky(x: f32, slope: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        x * slope
    }
}

/// Clamp that lets NaN through (as PyTorch's clamp) and vectorizes to min/max.
#[inline(always)]
pub(crate) fn clamp(x: f32, min: f32, max: f32) -> f32 {
    let y = if x < min { min } else { x };
    if y > max {
        max
    } else {
        y
    }
}

/// Runs `$body` (an expression of `$v`) for each of `$items` in a plain `for` loop
/// (closures passed to iterator adapters may stay out of line, compiled without the
/// caller's target features), one loop per activation so that each vectorizes.
macro_rules! per_activation {
    ($a:expr, $fma:ident, for $pat:pat in $items:expr => ($v:ident, $out:expr) $body:block) => {
        match $a {
            Activation::Identity => {
                for $pat in $items {
                    let $v = $body;
                    *$out = $v;
                }
            }
            Activation::Clamp { min, max } => {
                for $pat in $items {
                    let $v = $body;
                    *$out = clamp($v, min, max);
                }
            }
            Activation::Sigmoid => {
                for $pat in $items {
                    let $v = $body;
                    *$out = math::sigmoid(Scalar::<$fma>, $v);
                }
            }
            Activation::Tanh => {
                for $pat in $items {
                    let $v = $body;
                    *$out = math::tanh::<$fma>($v);
                }
            }
            Activation::Gelu => {
                for $pat in $items {
                    let $v = $body;
                    *$out = math::gelu::<$fma>($v);
                }
            }
            Activation::GeluTanh => {
                for $pat in $items {
                    let $v = $body;
                    *$out = math::gelu_tanh::<$fma>($v);
                }
            }
            Activation::Silu => {
                for $pat in $items {
                    let $v = $body;
                    *$out = math::silu(Scalar::<$fma>, $v);
                }
            }
            Activation::HardSwish => {
                for $pat in $items {
                    let $v = $body;
                    *$out = $v * clamp($v + 3.0, 0.0, 6.0) / 6.0;
                }
            }
            Activation::HardSwishFused => {
                for $pat in $items {
                    let $v = $body;
                    *$out = act::<$fma>(Activation::HardSwishFused, $v);
                }
            }
            Activation::HardSigmoid => {
                for $pat in $items {
                    let $v = $body;
                    *$out = clamp($v + 3.0, 0.0, 6.0) / 6.0;
                }
            }
            Activation::LeakyRelu { slope } => {
                for $pat in $items {
                    let $v = $body;
                    *$out = leaky($v, slope);
                }
            }
        }
    };
}

/// `x = act(x + bias)`.
#[inline(always)]
pub(crate) fn bias_act<const FMA: bool>(x: &mut [f32], bias: f32, a: Activation) {
    per_activation!(a, FMA, for o in x.iter_mut() => (v, o) { *o + bias });
}

multiversion! {
    /// `x = act(x + bias)` over a slice (`bias` added to every element).
    fn bias_act_scalar<const FMA: bool>(x: &mut [f32], bias: f32, a: Activation) {
        bias_act::<FMA>(x, bias, a);
    }
}

/// `x[i] = act(x[i] + bias[i])`.
#[inline(always)]
fn bias_vec_act<const FMA: bool>(x: &mut [f32], bias: &[f32], a: Activation) {
    per_activation!(a, FMA, for (o, b) in x.iter_mut().zip(bias) => (v, o) { *o + b });
}

multiversion! {
    /// `x[i] = act(x[i] + bias[i])`.
    fn bias_act_vector<const FMA: bool>(x: &mut [f32], bias: &[f32], a: Activation) {
        bias_vec_act::<FMA>(x, bias, a);
    }
}

/// `x = act(x + bias)` for every element, the same `bias` for all (0 for none).
pub fn add_scalar_activate(isa: Isa, x: &mut [f32], bias: f32, a: Activation) {
    if (bias != 0.0 || a != Activation::Identity) && !bias_act_wide(isa, x, bias, a) {
        bias_act_scalar(isa, x, bias, a);
    }
}

/// `x = act(x + bias)` for sigmoid and SiLU on AVX2, four vectors at a time
/// ([`crate::arch::Wide`]: their chains of dependent steps are long), with the same
/// operations as the plain loop, so the same bits; false (nothing done) for other
/// activations and instruction sets.
fn bias_act_wide(isa: Isa, x: &mut [f32], bias: f32, a: Activation) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(avx2) = crate::arch::Avx2::new().filter(|_| isa == Isa::Avx2) {
        /// `f` over the whole chunks of `x`; returns the rest.
        #[inline(always)]
        fn chunks<L: Lanes>(
            l: L,
            x: &mut [f32],
            bias: f32,
            f: impl Fn(L, L::V) -> L::V,
        ) -> &mut [f32] {
            let mut chunks = x.chunks_exact_mut(L::LANES);
            for c in &mut chunks {
                let v = l.add(l.load(c), l.splat(bias));
                l.store(f(l, v), c);
            }
            chunks.into_remainder()
        }
        let l = crate::arch::Wide::<_, 4>(avx2);
        let rest = match a {
            Activation::Sigmoid => avx2.vectorize(
                #[inline(always)]
                || chunks(l, x, bias, math::sigmoid),
            ),
            Activation::Silu => avx2.vectorize(
                #[inline(always)]
                || chunks(l, x, bias, math::silu),
            ),
            _ => return false,
        };
        bias_act_scalar(isa, rest, bias, a);
        return true;
    }
    let _ = (isa, x, bias, a);
    false
}

/// `x[i] = act(x[i] + bias[i])`; `bias` must be as long as `x`.
pub fn add_vector_activate(isa: Isa, x: &mut [f32], bias: &[f32], a: Activation) -> Result {
    need("bias", bias.len(), x.len())?;
    bias_act_vector(isa, x, bias, a);
    Ok(())
}

multiversion! {
    fn map_slices<const FMA: bool>(out: &mut [f32], x: &[f32], a: Activation) {
        per_activation!(a, FMA, for (o, &v) in out.iter_mut().zip(x) => (y, o) { v });
    }
}

/// `out[i] = act(x[i])`; both of the same length.
pub fn map(isa: Isa, out: &mut [f32], x: &[f32], a: Activation) -> Result {
    need("activation output", out.len(), x.len())?;
    need("activation input", x.len(), out.len())?;
    map_slices(isa, out, x, a);
    Ok(())
}

multiversion! {
    fn affine_slices<const FMA: bool>(out: &mut [f32], x: &[f32], scale: f32, shift: f32, a: Activation) {
        // A product and a sum, each rounded (no fused multiply-add): the same bits as
        // a normalization and an activation run one after the other.
        per_activation!(a, FMA, for (o, &v) in out.iter_mut().zip(x) => (y, o) { v * scale + shift });
    }
}

/// Values below which [`affine_planes`] stays on the calling thread.
const PARALLEL_AFFINE: usize = 1 << 14;

/// Planes of `plane` values (the last may be shorter): `out` plane `c` =
/// `act(source(c) · scale_c + shift_c)`, `(scale_c, shift_c) = coefficients[c]` (an
/// inference batch normalization and the activation after it, each plane read from
/// wherever it lies), on the pool's threads when large.
pub fn affine_planes<'x>(
    pool: &ThreadPool,
    isa: Isa,
    out: &mut [f32],
    plane: usize,
    coefficients: &[(f32, f32)],
    a: Activation,
    source: impl Fn(usize) -> &'x [f32] + Sync,
) -> Result {
    need(
        "normalization coefficients",
        coefficients.len(),
        out.len().div_ceil(plane.max(1)),
    )?;
    let failed = FirstError::default();
    let run = |c: usize, o: &mut [f32]| {
        let from = source(c);
        if from.len() != o.len() {
            failed.keep(Err(Error::ShapeMismatch {
                what: format!(
                    "plane {c} of {} values normalized into {}",
                    from.len(),
                    o.len()
                ),
            }));
        }
        let (scale, shift) = coefficients.get(c).copied().unwrap_or_default();
        affine_slices(isa, o, from, scale, shift, a);
    };
    if out.len() < PARALLEL_AFFINE || pool.threads() == 1 {
        out.chunks_mut(plane.max(1))
            .enumerate()
            .for_each(|(c, o)| run(c, o));
    } else {
        pool.parallel_chunks(out, plane, &mut [0u8; 0], 0, |c, o, _| run(c, o))?;
    }
    failed.into_result()
}

/// Applies an activation in place.
pub fn activate(isa: Isa, x: &mut [f32], a: Activation) {
    add_scalar_activate(isa, x, 0.0, a);
}

/// A function of two operands, for the loops of this module and of
/// [`crate::broadcast`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `x + y`.
    Add,
    /// `x - y`.
    Sub,
    /// `x * y`.
    Mul,
    /// `x / y`.
    Div,
    /// `max(x, y)`, NaN if either is NaN (XNNPACK's and PyTorch's maximum).
    Max,
    /// `min(x, y)`, NaN if either is NaN.
    Min,
    /// `x` if `x >= 0`, else `x * y` (parametric ReLU with slope `y`).
    Prelu,
}

impl BinaryOp {
    /// The operation on one pair (the portable reference; inlined into the loops).
    #[inline(always)]
    pub fn apply_scalar(self, x: f32, y: f32) -> f32 {
        bin(self, x, y)
    }
}

#[inline(always)]
fn bin(op: BinaryOp, x: f32, y: f32) -> f32 {
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Max => {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else if x > y {
                x
            } else {
                y
            }
        }
        BinaryOp::Min => {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else if x < y {
                x
            } else {
                y
            }
        }
        BinaryOp::Prelu => {
            if x >= 0.0 {
                x
            } else {
                x * y
            }
        }
    }
}

/// Expands `$body!(f)` once per operation, `f` a closure of that operation alone: the
/// match on the operation stays outside the loop that `$body` writes (a match per
/// element compiles to a jump per element, which does not vectorize).
macro_rules! per_binary_op {
    ($op:expr, $body:ident) => {
        match $op {
            $crate::elementwise::BinaryOp::Add => $body!(|p: f32, q: f32| p + q),
            $crate::elementwise::BinaryOp::Sub => $body!(|p: f32, q: f32| p - q),
            $crate::elementwise::BinaryOp::Mul => $body!(|p: f32, q: f32| p * q),
            $crate::elementwise::BinaryOp::Div => $body!(|p: f32, q: f32| p / q),
            $crate::elementwise::BinaryOp::Max => {
                $body!(|p: f32, q: f32| $crate::elementwise::BinaryOp::Max.apply_scalar(p, q))
            }
            $crate::elementwise::BinaryOp::Min => {
                $body!(|p: f32, q: f32| $crate::elementwise::BinaryOp::Min.apply_scalar(p, q))
            }
            $crate::elementwise::BinaryOp::Prelu => {
                $body!(|p: f32, q: f32| $crate::elementwise::BinaryOp::Prelu.apply_scalar(p, q))
            }
        }
    };
}
pub(crate) use per_binary_op;

multiversion! {
    fn binary_slices<const FMA: bool>(out: &mut [f32], x: &[f32], y: &[f32], op: BinaryOp, a: Activation) {
        macro_rules! body {
            ($f:expr) => {{
                let f = $f;
                per_activation!(a, FMA, for ((o, &p), &q) in out.iter_mut().zip(x).zip(y) => (v, o) { f(p, q) })
            }};
        }
        per_binary_op!(op, body)
    }
}

multiversion! {
    fn binary_scalar<const FMA: bool>(out: &mut [f32], x: &[f32], y: f32, op: BinaryOp, a: Activation) {
        macro_rules! body {
            ($f:expr) => {{
                let f = $f;
                per_activation!(a, FMA, for (o, &p) in out.iter_mut().zip(x) => (v, o) { f(p, y) })
            }};
        }
        per_binary_op!(op, body)
    }
}

/// `out[i] = act(op(x[i], y[i]))`; all three of the same length.
pub fn binary(
    isa: Isa,
    out: &mut [f32],
    x: &[f32],
    y: &[f32],
    op: BinaryOp,
    a: Activation,
) -> Result {
    if x.len() != out.len() || y.len() != out.len() {
        return Err(Error::ShapeMismatch {
            what: format!(
                "binary operands of {} and {} elements into {}",
                x.len(),
                y.len(),
                out.len()
            ),
        });
    }
    binary_slices(isa, out, x, y, op, a);
    Ok(())
}

/// `out = act(op(x, y[c]))` for `x` of shape `[outer, channels, inner]` and a vector
/// `y` of `channels` values (a per-channel bias or scale in NCHW); `out` and `x` have
/// `outer * channels * inner` elements.
pub fn binary_channels(
    isa: Isa,
    out: &mut [f32],
    x: &[f32],
    y: &[f32],
    inner: usize,
    op: BinaryOp,
    a: Activation,
) -> Result {
    let plane = inner.max(1) * y.len().max(1);
    if x.len() != out.len() || !out.len().is_multiple_of(plane) || (y.is_empty() && !out.is_empty())
    {
        return Err(Error::ShapeMismatch {
            what: format!(
                "{} elements of x into {} cannot be split into [outer, {}, {inner}]",
                x.len(),
                out.len(),
                y.len()
            ),
        });
    }
    if inner == 0 {
        return Ok(());
    }
    for (i, (o_row, x_row)) in out.chunks_mut(inner).zip(x.chunks(inner)).enumerate() {
        let c = y.get(i % y.len()).copied().unwrap_or(0.0);
        binary_scalar(isa, o_row, x_row, c, op, a);
    }
    Ok(())
}

/// `out = act(op(x, y))` with `y` repeated along every row of `y.len()` values of `x`
/// (a per-channel vector in NHWC, or a bias per feature).
pub fn binary_rows(
    isa: Isa,
    out: &mut [f32],
    x: &[f32],
    y: &[f32],
    op: BinaryOp,
    a: Activation,
) -> Result {
    if x.len() != out.len()
        || (y.is_empty() && !out.is_empty())
        || !out.len().is_multiple_of(y.len().max(1))
    {
        return Err(Error::ShapeMismatch {
            what: format!(
                "{} values into {} cannot be rows of {}",
                x.len(),
                out.len(),
                y.len()
            ),
        });
    }
    for (o, r) in out
        .chunks_exact_mut(y.len().max(1))
        .zip(x.chunks_exact(y.len().max(1)))
    {
        binary_slices(isa, o, r, y, op, a);
    }
    Ok(())
}

/// Max of a row, in lanes so that the reduction vectorizes.
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &v) in m.iter_mut().zip(c) {
            *l = if v > *l { v } else { *l };
        }
    }
    let mut best = f32::NEG_INFINITY;
    for &v in tail.iter().chain(m.iter()) {
        best = if v > best { v } else { best };
    }
    best
}

/// Sum of a row, in lanes.
#[inline(always)]
fn row_sum(x: &[f32]) -> f32 {
    let mut s = [0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (l, &v) in s.iter_mut().zip(c) {
            *l += v;
        }
    }
    s.iter().sum::<f32>() + tail
}

/// Which normalization of a row [`softmax_all`] computes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RowSoftmax {
    Plain,
    /// A row of -inf only gives zeros instead of NaN.
    Safe,
    Log,
}

multiversion! {
    /// Softmax (safe, or log-softmax) of every row.
    fn softmax_all<const FMA: bool>(out: &mut [f32], x: &[f32], row_len: usize, kind: RowSoftmax) {
        for (o, r) in out.chunks_exact_mut(row_len).zip(x.chunks_exact(row_len)) {
            let m = row_max(r);
            // The maximum ignores NaN: a row with it and -inf only is not all -inf.
            if kind == RowSoftmax::Safe
                && m == f32::NEG_INFINITY
                && r.iter().all(|&v| v == f32::NEG_INFINITY)
            {
                o.fill(0.0);
                continue;
            }
            // v - m <= 0, or NaN (a row holding NaN or ±inf), which propagates.
            for (d, &v) in o.iter_mut().zip(r) {
                *d = math::exp_nonpositive::<FMA>(v - m);
            }
            let sum = row_sum(o);
            if kind == RowSoftmax::Log {
                let shift = m + sum.ln();
                for (d, &v) in o.iter_mut().zip(r) {
                    *d = v - shift;
                }
            } else {
                let inv = 1.0 / sum;
                for d in o.iter_mut() {
                    *d *= inv;
                }
            }
        }
    }
}

/// Softmax of each row of `x` (rows of `row_len` contiguous values) into `out`:
/// `exp(x - max) / Σ exp(x - max)`. A row of -inf only gives NaN, as PyTorch.
pub fn softmax_rows(isa: Isa, out: &mut [f32], x: &[f32], row_len: usize) -> Result {
    check_rows(out.len(), x.len(), row_len)?;
    if row_len > 0 {
        softmax_all(isa, out, x, row_len, RowSoftmax::Plain);
    }
    Ok(())
}

/// Softmax of each row as [`softmax_rows`], except that a row of -inf only gives zeros:
/// PyTorch's `_safe_softmax`, with which attention makes a fully masked query attend
/// to nothing instead of producing NaN.
pub fn safe_softmax_rows(isa: Isa, out: &mut [f32], x: &[f32], row_len: usize) -> Result {
    check_rows(out.len(), x.len(), row_len)?;
    if row_len > 0 {
        softmax_all(isa, out, x, row_len, RowSoftmax::Safe);
    }
    Ok(())
}

/// Log-softmax of each row: `x - max - ln Σ exp(x - max)`.
pub fn log_softmax_rows(isa: Isa, out: &mut [f32], x: &[f32], row_len: usize) -> Result {
    check_rows(out.len(), x.len(), row_len)?;
    if row_len > 0 {
        softmax_all(isa, out, x, row_len, RowSoftmax::Log);
    }
    Ok(())
}

fn check_rows(out: usize, x: usize, row_len: usize) -> Result {
    if out != x || (row_len == 0 && x != 0) || (row_len != 0 && !x.is_multiple_of(row_len)) {
        return Err(Error::ShapeMismatch {
            what: format!("{x} values into {out} cannot be rows of {row_len}"),
        });
    }
    Ok(())
}

multiversion! {
    /// (Σx, Σx²) around `shift` in f32 lanes, folded in f64.
    fn sums<const FMA: bool>(x: &[f32], shift: f32) -> (f64, f64) {
        let (mut s, mut q) = ([0f32; 8], [0f32; 8]);
        let chunks = x.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            for ((s, q), &v) in s.iter_mut().zip(q.iter_mut()).zip(c) {
                let d = v - shift;
                *s += d;
                *q = madd::<FMA>(d, d, *q);
            }
        }
        let mut st: f64 = s.iter().map(|&v| f64::from(v)).sum();
        let mut qt: f64 = q.iter().map(|&v| f64::from(v)).sum();
        for &v in tail {
            let d = f64::from(v - shift);
            st += d;
            qt += d * d;
        }
        (st, qt)
    }
}

multiversion! {
    fn normalize<const FMA: bool>(out: &mut [f32], x: &[f32], mean: f32, rstd: f32, gamma: Option<&[f32]>, beta: Option<&[f32]>) {
        match (gamma, beta) {
            (Some(g), Some(b)) => {
                for (((o, &v), &g), &b) in out.iter_mut().zip(x).zip(g).zip(b) {
                    *o = madd::<FMA>((v - mean) * rstd, g, b);
                }
            }
            (Some(g), None) => {
                for ((o, &v), &g) in out.iter_mut().zip(x).zip(g) {
                    *o = (v - mean) * rstd * g;
                }
            }
            (None, Some(b)) => {
                for ((o, &v), &b) in out.iter_mut().zip(x).zip(b) {
                    *o = madd::<FMA>(v - mean, rstd, b);
                }
            }
            (None, None) => {
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = (v - mean) * rstd;
                }
            }
        }
    }
}

/// Layer normalization of each row of `row_len` values: `(x - mean) / sqrt(var + eps)
/// · gamma + beta` with the biased variance (as PyTorch), `gamma`/`beta` of `row_len`
/// values when given. Writes each row's mean and 1/std to `stats` (pairs) when given.
#[allow(clippy::too_many_arguments)] // the operator's own parameters, all distinct
pub fn layer_norm_rows(
    isa: Isa,
    out: &mut [f32],
    x: &[f32],
    row_len: usize,
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    eps: f32,
    mut stats: Option<&mut [f32]>,
) -> Result {
    check_rows(out.len(), x.len(), row_len)?;
    if row_len == 0 {
        return Ok(());
    }
    for p in [gamma, beta].into_iter().flatten() {
        need("layer norm weight", p.len(), row_len)?;
    }
    if let Some(s) = stats.as_deref() {
        need("layer norm statistics", s.len(), 2 * (x.len() / row_len))?;
    }
    for (i, (o, r)) in out
        .chunks_exact_mut(row_len)
        .zip(x.chunks_exact(row_len))
        .enumerate()
    {
        // Shifting by the first value keeps the one-pass variance accurate.
        let shift = r.first().copied().unwrap_or(0.0);
        let (s, q) = sums(isa, r, shift);
        let n = row_len as f64;
        let mean_d = s / n;
        let var = (q / n - mean_d * mean_d).max(0.0);
        let mean = (f64::from(shift) + mean_d) as f32;
        let rstd = (1.0 / (var + f64::from(eps)).sqrt()) as f32;
        normalize(isa, o, r, mean, rstd, gamma, beta);
        if let Some(st) = stats.as_deref_mut() {
            if let Some(pair) = st.get_mut(2 * i..2 * i + 2) {
                pair.copy_from_slice(&[mean, rstd]);
            }
        }
    }
    Ok(())
}

/// Values below which [`layer_norm_rows_on`] stays on the calling thread.
const PARALLEL_NORM: usize = 1 << 14;
/// Tasks [`layer_norm_rows_on`] splits its rows into at most.
const NORM_TASKS: usize = 16;

/// [`layer_norm_rows`] with the rows split over the pool's threads. On one thread at
/// two, convnext_tiny's 23 layer norms took 2.6 ms against 0.96 at one: their input
/// comes from products that both threads wrote, half of it from the other core.
#[allow(clippy::too_many_arguments)] // the operator's own parameters, all distinct
pub fn layer_norm_rows_on(
    pool: &ThreadPool,
    isa: Isa,
    out: &mut [f32],
    x: &[f32],
    row_len: usize,
    (gamma, beta): (Option<&[f32]>, Option<&[f32]>),
    eps: f32,
    stats: Option<&mut [f32]>,
) -> Result {
    check_rows(out.len(), x.len(), row_len)?;
    let rows = x.len().checked_div(row_len).unwrap_or(0);
    let tasks = (pool.threads() * 4).min(rows).min(NORM_TASKS);
    if out.len() < PARALLEL_NORM || pool.threads() == 1 || tasks < 2 {
        return layer_norm_rows(isa, out, x, row_len, gamma, beta, eps, stats);
    }
    if let Some(s) = stats.as_deref() {
        need("layer norm statistics", s.len(), 2 * rows)?;
    }
    let per = rows.div_ceil(tasks);
    let mut outs = out.chunks_mut(per * row_len);
    let mut stats = stats.map(|s| s.chunks_mut(2 * per));
    // Each task's rows of the output and of the statistics, taken once.
    type Part<'a> = Mutex<Option<(&'a mut [f32], Option<&'a mut [f32]>)>>;
    let parts: [Part<'_>; NORM_TASKS] = std::array::from_fn(|_| {
        let s = stats.as_mut().and_then(Iterator::next);
        Mutex::new(outs.next().map(|o| (o, s)))
    });
    let failed = FirstError::default();
    pool.parallel_for(rows.div_ceil(per), |t, _| {
        let part = parts.get(t).and_then(|p| p.lock().ok()?.take());
        if let Some((o, s)) = part {
            let x = x.get(t * per * row_len..).unwrap_or_default();
            let x = x.get(..o.len()).unwrap_or_default();
            failed.keep(layer_norm_rows(isa, o, x, row_len, gamma, beta, eps, s));
        }
    });
    failed.into_result()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect()
    }

    #[test]
    fn activations_match_the_portable_path() {
        let x = data(1003);
        let acts = [
            Activation::Identity,
            Activation::RELU,
            Activation::RELU6,
            Activation::Clamp {
                min: -1.0,
                max: 1.0,
            },
            Activation::Sigmoid,
            Activation::Tanh,
            Activation::Gelu,
            Activation::GeluTanh,
            Activation::Silu,
            Activation::HardSwish,
            Activation::HardSwishFused,
            Activation::HardSigmoid,
            Activation::LeakyRelu { slope: 0.1 },
        ];
        for isa in Isa::available() {
            for a in acts {
                let mut y = x.clone();
                add_scalar_activate(isa, &mut y, 0.5, a);
                for (&v, &w) in x.iter().zip(&y) {
                    let want = a.apply_scalar(v + 0.5);
                    assert!(
                        (w - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "{isa:?} {a:?} {v}: {w} vs {want}"
                    );
                }
            }
        }
        let mut nan = [f32::NAN];
        activate(Isa::best(), &mut nan, Activation::RELU);
        assert!(nan[0].is_nan());
        assert_eq!(Activation::HardSwish.apply_scalar(1.0), 4.0 / 6.0);
        assert_eq!(Activation::HardSigmoid.apply_scalar(-1.0), 2.0 / 6.0);
        let leaky = Activation::LeakyRelu { slope: 0.25 };
        assert_eq!(leaky.apply_scalar(-2.0), -0.5);
        assert_eq!(leaky.apply_scalar(3.0), 3.0);
        assert!(leaky.apply_scalar(f32::NAN).is_nan());
        assert!(leaky.apply_scalar(-0.0).is_sign_negative());
    }

    #[test]
    fn wide_sigmoid_and_silu_give_the_bits_of_the_plain_loop() {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -88.5,
            88.5,
            -200.0,
            200.0,
        ];
        let mut x = data(1000);
        x.extend(specials.iter().cycle().take(75));
        for isa in Isa::available() {
            for a in [Activation::Sigmoid, Activation::Silu] {
                for bias in [0.0, 0.25] {
                    let (mut wide, mut plain) = (x.clone(), x.clone());
                    add_scalar_activate(isa, &mut wide, bias, a);
                    bias_act_scalar(isa, &mut plain, bias, a);
                    for (i, (w, p)) in wide.iter().zip(&plain).enumerate() {
                        assert_eq!(w.to_bits(), p.to_bits(), "{isa:?} {a:?} x[{i}] = {}", x[i]);
                    }
                }
            }
        }
    }

    #[test]
    fn every_binary_operation_and_activation_matches_the_portable_path() {
        let ops = [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Max,
            BinaryOp::Min,
            BinaryOp::Prelu,
        ];
        let acts = [Activation::Identity, Activation::RELU6, Activation::Silu];
        let mut x = data(37);
        x[3] = f32::NAN;
        let y: Vec<f32> = data(37 + 5).split_off(5);
        let close = |got: f32, want: f32| {
            (got - want).abs() <= 1e-6 * want.abs().max(1.0) || (got.is_nan() && want.is_nan())
        };
        for isa in Isa::available() {
            for op in ops {
                for a in acts {
                    let mut out = vec![0.0; x.len()];
                    binary(isa, &mut out, &x, &y, op, a).unwrap();
                    for ((&o, &p), &q) in out.iter().zip(&x).zip(&y) {
                        let want = a.apply_scalar(op.apply_scalar(p, q));
                        assert!(close(o, want), "{isa:?} {op:?} {a:?} ({p}, {q}): {o}");
                    }
                    let mut out = vec![0.0; x.len()];
                    binary_channels(isa, &mut out, &x, &y[..1], 37, op, a).unwrap();
                    for (&o, &p) in out.iter().zip(&x) {
                        let want = a.apply_scalar(op.apply_scalar(p, y[0]));
                        assert!(close(o, want), "{isa:?} {op:?} {a:?} ({p}, {}): {o}", y[0]);
                    }
                }
            }
        }
        assert!(BinaryOp::Max.apply_scalar(1.0, f32::NAN).is_nan());
        assert!(BinaryOp::Min.apply_scalar(f32::NAN, 1.0).is_nan());
        assert_eq!(BinaryOp::Prelu.apply_scalar(-2.0, 0.25), -0.5);
        assert_eq!(BinaryOp::Prelu.apply_scalar(2.0, 0.25), 2.0);
    }

    #[test]
    fn binary_with_channels() {
        let (outer, ch, inner) = (2, 3, 5);
        let x = data(outer * ch * inner);
        let y = [1.0, -2.0, 0.5];
        for isa in Isa::available() {
            let mut out = vec![0.0; x.len()];
            binary_channels(
                isa,
                &mut out,
                &x,
                &y,
                inner,
                BinaryOp::Mul,
                Activation::RELU,
            )
            .unwrap();
            for (i, (&o, &v)) in out.iter().zip(&x).enumerate() {
                assert_eq!(o, (v * y[i / inner % ch]).max(0.0));
            }
            let mut out2 = vec![0.0; x.len()];
            binary(
                isa,
                &mut out2,
                &x,
                &out,
                BinaryOp::Max,
                Activation::Identity,
            )
            .unwrap();
            assert!(out2.iter().zip(&x).all(|(&a, &b)| a >= b));
        }
        let mut out = vec![0.0; 7];
        assert!(binary_channels(
            Isa::Generic,
            &mut out,
            &data(7),
            &y,
            2,
            BinaryOp::Add,
            Activation::Identity
        )
        .is_err());
    }

    #[test]
    fn safe_softmax_zeroes_rows_of_negative_infinity_only() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        for isa in Isa::available() {
            for row in [2, 3, 17] {
                let mut x = data(row * 4);
                x[..row].fill(-inf); // row 0: masked out entirely
                x[row] = -inf; // row 1: partly masked
                x[2 * row..3 * row].fill(-inf); // row 2: -inf and a NaN
                x[3 * row - 1] = nan;
                let (mut safe, mut plain) = (vec![1.0; x.len()], vec![0.0; x.len()]);
                safe_softmax_rows(isa, &mut safe, &x, row).unwrap();
                softmax_rows(isa, &mut plain, &x, row).unwrap();
                assert!(safe[..row].iter().all(|&v| v == 0.0));
                assert!(plain[..row].iter().all(|v| v.is_nan()));
                // Every other row is the plain softmax, NaN included.
                for (s, p) in safe[row..].iter().zip(&plain[row..]) {
                    assert!(s.to_bits() == p.to_bits(), "{s} vs {p}");
                }
                assert!(safe[2 * row..3 * row].iter().all(|v| v.is_nan()));
            }
        }
    }

    #[test]
    fn softmax_and_layer_norm_rows() {
        for isa in Isa::available() {
            for row in [1, 7, 8, 33] {
                let x = data(row * 3);
                let mut out = vec![0.0; x.len()];
                softmax_rows(isa, &mut out, &x, row).unwrap();
                let mut logs = vec![0.0; x.len()];
                log_softmax_rows(isa, &mut logs, &x, row).unwrap();
                for ((r, o), l) in x.chunks(row).zip(out.chunks(row)).zip(logs.chunks(row)) {
                    let m = r
                        .iter()
                        .fold(f64::NEG_INFINITY, |a, &v| a.max(f64::from(v)));
                    let s: f64 = r.iter().map(|&v| (f64::from(v) - m).exp()).sum();
                    for ((&v, &p), &lp) in r.iter().zip(o).zip(l) {
                        let want = (f64::from(v) - m).exp() / s;
                        assert!((f64::from(p) - want).abs() <= 1e-6 * want + 1e-30);
                        assert!((f64::from(lp) - want.ln()).abs() <= 1e-5);
                    }
                }
                let gamma: Vec<f32> = (0..row).map(|i| 1.0 + i as f32 * 0.1).collect();
                let beta: Vec<f32> = (0..row).map(|i| i as f32 * -0.2).collect();
                let mut stats = vec![0.0; 6];
                layer_norm_rows(
                    isa,
                    &mut out,
                    &x,
                    row,
                    Some(&gamma),
                    Some(&beta),
                    1e-5,
                    Some(&mut stats),
                )
                .unwrap();
                for (r, o) in x.chunks(row).zip(out.chunks(row)) {
                    let n = row as f64;
                    let mean = r.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
                    let var = r
                        .iter()
                        .map(|&v| (f64::from(v) - mean).powi(2))
                        .sum::<f64>()
                        / n;
                    for (j, (&v, &y)) in r.iter().zip(o).enumerate() {
                        let want = (f64::from(v) - mean) / (var + 1e-5).sqrt()
                            * f64::from(gamma[j])
                            + f64::from(beta[j]);
                        assert!((f64::from(y) - want).abs() < 1e-4, "{y} vs {want}");
                    }
                }
            }
        }
        let mut out = vec![0.0; 5];
        assert!(softmax_rows(Isa::Generic, &mut out, &data(5), 2).is_err());
    }

    /// Rows split over threads (row counts that do not divide into the tasks, rows
    /// above and below the size that goes parallel) give each row's values and
    /// statistics as one thread does.
    #[test]
    fn layer_norms_on_threads_match_one_thread() {
        let isa = Isa::best();
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads).unwrap();
            for (rows, row) in [(3137, 96), (61, 768), (5, 7), (1, 20000)] {
                let x = data(rows * row);
                let gamma: Vec<f32> = (0..row).map(|i| 1.0 + i as f32 * 0.01).collect();
                let (mut want, mut got) = (vec![0.0; x.len()], vec![f32::NAN; x.len()]);
                let (mut want_stats, mut stats) = (vec![0.0; 2 * rows], vec![f32::NAN; 2 * rows]);
                let g = Some(&gamma[..]);
                layer_norm_rows(
                    isa,
                    &mut want,
                    &x,
                    row,
                    g,
                    None,
                    1e-5,
                    Some(&mut want_stats),
                )
                .unwrap();
                layer_norm_rows_on(
                    &pool,
                    isa,
                    &mut got,
                    &x,
                    row,
                    (g, None),
                    1e-5,
                    Some(&mut stats),
                )
                .unwrap();
                assert_eq!(got, want, "{threads} threads, {rows} rows of {row}");
                assert_eq!(stats, want_stats);
            }
            let mut short = vec![0.0; 2];
            let mut out = vec![0.0; 96 * 400];
            let x = data(96 * 400);
            let too_few = layer_norm_rows_on(
                &pool,
                isa,
                &mut out,
                &x,
                96,
                (None, None),
                1e-5,
                Some(&mut short),
            );
            assert!(too_few.is_err());
        }
    }
}
