//! Kernel rows and columns that read only padding.
//!
//! A dilated convolution on a small input (DeepLab's atrous pyramid: 3×3 taps 24 or
//! 36 pixels apart on a 14×14 map) reads zero padding at every output pixel through
//! most of its taps; multiplying those zeros was most of the network's time. The taps
//! of a kernel row that no output pixel reads inside the input are dropped, with the
//! padding they skipped, so that the convolution computes exactly the same sums over
//! fewer taps (a 3×3 layer whose outer taps all fall outside becomes a 1×1 one and
//! takes the pointwise path). A row is kept where dropping it would need negative
//! padding, and where one of its weights is not finite (zero times infinity is NaN in
//! PyTorch, which multiplies the padding too).

use super::{Conv2dParams, ConvWeights, WeightLayout};
use crate::error::{Error, Result};

/// The kept taps along one axis: the first and the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    first: usize,
    len: usize,
}

/// `p` without the kernel rows and columns that read only padding, and the weights
/// of the kept taps in the layout of `w` (unscaled); `None` when every tap is kept.
pub(crate) fn trim_padding_taps(
    p: &Conv2dParams,
    w: &ConvWeights<'_>,
) -> Result<Option<(Conv2dParams, Vec<f32>)>> {
    let [oh, ow] = p.output()?;
    let (taps, _) = w.check(p)?;
    let [pt, pl, pb, pr] = p.padding;
    let [[ih, iw], [kh, kw], [sh, sw], [dh, dw]] = [p.input, p.kernel, p.stride, p.dilation];
    let axis = |input, kernel, stride, dilation, out, (before, after)| {
        let k = kept(input, kernel, stride, dilation, before, out)?;
        Some((k, trimmed_pads(k, kernel, dilation, before, after)?))
    };
    let rows = axis(ih, kh, sh, dh, oh, (pt, pb));
    let cols = axis(iw, kw, sw, dw, ow, (pl, pr));
    if rows.is_none() && cols.is_none() {
        return Ok(None);
    }
    let all = |len| Kept { first: 0, len };
    let (ky, (pt, pb)) = rows.unwrap_or((all(kh), (pt, pb)));
    let (kx, (pl, pr)) = cols.unwrap_or((all(kw), (pl, pr)));
    let (outer, inner) = match w.layout() {
        WeightLayout::Oihw => (p.out_channels * p.channels_per_group().0, 1),
        WeightLayout::Ohwi => (p.out_channels, p.channels_per_group().0),
        WeightLayout::Hwo => (1, p.out_channels),
    };
    let is_kept = |t: usize| {
        let (y, x) = (t / kw, t % kw);
        (ky.first..ky.first + ky.len).contains(&y) && (kx.first..kx.first + kx.len).contains(&x)
    };
    let data = w.data();
    let runs = || (0..outer).flat_map(move |o| (0..taps).map(move |t| (t, (o * taps + t) * inner)));
    if runs().filter(|&(t, _)| !is_kept(t)).any(|(_, at)| {
        data.get(at..at + inner)
            .is_none_or(|r| !super::all_finite(r))
    }) {
        return Ok(None);
    }
    let len = outer * ky.len * kx.len * inner;
    let mut kept_data = Vec::new();
    kept_data
        .try_reserve_exact(len)
        .map_err(|_| Error::OutOfMemory {
            what: "convolution weights without padding taps",
            len,
        })?;
    for (_, at) in runs().filter(|&(t, _)| is_kept(t)) {
        kept_data.extend_from_slice(data.get(at..at + inner).unwrap_or_default());
    }
    let q = Conv2dParams {
        kernel: [ky.len, kx.len],
        padding: [pt, pl, pb, pr],
        ..*p
    };
    debug_assert_eq!(q.output(), p.output());
    Ok(Some((q, kept_data)))
}

/// The taps of one axis that some output position reads inside the input, when that
/// is not all of them and not none.
fn kept(
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    before: usize,
    out: usize,
) -> Option<Kept> {
    // Tap `k` reads positions o·stride + k·dilation - before, o < out: inside the
    // input for some o iff the first o at or past the padding is in range and lands
    // before the input's end.
    let reads_inside = |k: usize| {
        let at = k.checked_mul(dilation)?;
        let o = before.saturating_sub(at).div_ceil(stride);
        let pos = o
            .checked_mul(stride)?
            .checked_add(at)?
            .checked_sub(before)?;
        Some(o < out && pos < input)
    };
    let useful = |k: usize| reads_inside(k) == Some(true);
    let first = (0..kernel).position(useful)?;
    let last = (0..kernel).rposition(useful)?;
    let len = last - first + 1;
    (len < kernel).then_some(Kept { first, len })
}

/// The padding before and after once the taps outside `k` are dropped (the output
/// size stays the same), or `None` where it would have to be negative.
fn trimmed_pads(
    k: Kept,
    kernel: usize,
    dilation: usize,
    before: usize,
    after: usize,
) -> Option<(usize, usize)> {
    let dropped_after = kernel - k.first - k.len;
    Some((
        before.checked_sub(k.first.checked_mul(dilation)?)?,
        after.checked_sub(dropped_after.checked_mul(dilation)?)?,
    ))
}
