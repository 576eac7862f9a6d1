//! Padding: `constant_pad_nd` (negative pads crop) and the reflection and replication pads
//! over the last 1, 2 or 3 dims, batched or not.
//!
//! A reflection or replication pad maps each output position of a padded dim to the input
//! position it copies (mirrored without repeating the edge, or clamped to the edge); the
//! output is then gathered by those maps, one row at a time.

use pte_runtime::{Args, Dims, KernelError, KernelResult};

use crate::layout::{by_elem_size, copy, row_major, typed, typed_mut, Dense, Layout, Strides};
use crate::util::{numel_of, oob, same_dtype, Checked, Scratch};

/// `constant_pad_nd.out(self, pad, value, out)`: `pad` holds (before, after) pairs from
/// the last dim backwards; negative amounts crop.
pub fn constant_pad_nd(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let pad = args.int_list(1)?;
    let value = args.scalar(2)?;
    let rank = x.rank();
    if pad.len() % 2 != 0 || pad.len() / 2 > rank {
        return Err(KernelError::invalid(format!(
            "padding {pad:?} does not fit a rank-{rank} tensor"
        )));
    }
    let mut sizes = x.sizes.clone();
    // The part of the input that survives (negative pads crop), where it starts in the
    // input and where it lands in the output.
    let mut region = x.sizes.clone();
    let (mut from, mut to): (Dims, Dims) =
        (smallvec::smallvec![0; rank], smallvec::smallvec![0; rank]);
    for (k, p) in pad.chunks_exact(2).enumerate() {
        let d = rank - 1 - k;
        let &[lo, hi] = p else { return Err(oob()) };
        let (lo, hi) = (i128::from(lo), i128::from(hi));
        let n = *x.sizes.at(d)? as i128;
        let new = n + lo + hi;
        if new < 0 {
            return Err(KernelError::invalid(format!(
                "padding {pad:?} makes dim {d} of size {n} negative"
            )));
        }
        *sizes.as_mut_slice().at_mut(d)? =
            usize::try_from(new).map_err(|_| KernelError::invalid("padded size overflows"))?;
        *from.as_mut_slice().at_mut(d)? = (-lo).clamp(0, n) as usize;
        *to.as_mut_slice().at_mut(d)? = lo.clamp(0, new) as usize;
        *region.as_mut_slice().at_mut(d)? = (n - (-lo).max(0) - (-hi).max(0)).max(0) as usize;
    }
    numel_of(&sizes)?;
    args.resize(3, &sizes)?;
    same_dtype(x.dtype, args.tensor(3)?.dtype)?;
    let mut io = Dense::io(args, &[0.into()], &[3.into()], &[])?;
    crate::layout::fill(x.dtype, io.bytes_mut(0)?, value)?;
    let (sst, dst) = (row_major(&x.sizes), row_major(&sizes));
    let offset = |at: &Dims, st: &Strides| {
        at.iter()
            .zip(st)
            .map(|(&i, &s)| i * s as usize)
            .sum::<usize>()
    };
    let src = Layout::new(offset(&from, &sst), sst.iter().copied());
    let dstl = Layout::new(offset(&to, &dst), dst.iter().copied());
    let input = io.bytes(0)?;
    copy(
        x.dtype.size(),
        &region,
        input,
        &src,
        io.bytes_mut(0)?,
        &dstl,
    )?;
    io.finish()
}

/// How a pad fills positions outside the input.
#[derive(Clone, Copy, PartialEq)]
pub enum Mode {
    /// Mirrored at the edge, the edge itself not repeated (`[c b | a b c | b a]`).
    Reflect,
    /// The edge repeated (`[a a | a b c | c c]`).
    Replicate,
}

/// The input position output position `o` copies in a dim of `n` padded by `before`.
fn source(o: usize, n: usize, before: usize, mode: Mode) -> usize {
    let i = o as i128 - before as i128;
    let last = n as i128 - 1;
    let i = match mode {
        Mode::Replicate => i.clamp(0, last.max(0)),
        Mode::Reflect if i < 0 => -i,
        Mode::Reflect if i > last => 2 * last - i,
        Mode::Reflect => i,
    };
    i.clamp(0, last.max(0)) as usize
}

/// `reflection_padNd.out` / `replication_padNd.out(self, padding, out)` over the last
/// `nd` dims of an input with `nd + 1` (no batch) or `nd + 2` dims; `padding` holds
/// (before, after) pairs from the last dim backwards.
pub fn pad(args: &mut Args<'_>, nd: usize, mode: Mode) -> KernelResult {
    let x = args.tensor(0)?;
    let pad = args.int_list(1)?;
    if pad.len() != 2 * nd || !(nd + 1..=nd + 2).contains(&x.rank()) {
        return Err(KernelError::invalid(format!(
            "a {nd}-d pad takes {} pad amounts and a {}-d or {}-d input, got {pad:?} and shape {:?}",
            2 * nd,
            nd + 1,
            nd + 2,
            x.sizes.as_slice()
        )));
    }
    let rank = x.rank();
    let mut sizes = x.sizes.clone();
    // (before, input size) of each dim, (0, n) for the dims not padded.
    let mut spans: Dims = Dims::new();
    let mut befores: Dims = smallvec::smallvec![0; rank];
    for (k, p) in pad.chunks_exact(2).enumerate() {
        let d = rank - 1 - k;
        let &[lo, hi] = p else { return Err(oob()) };
        let n = *x.sizes.at(d)?;
        let (before, after) = (usize::try_from(lo).ok(), usize::try_from(hi).ok());
        let (Some(before), Some(after)) = (before, after) else {
            return Err(KernelError::invalid(format!(
                "pad amounts must not be negative, got {pad:?}"
            )));
        };
        let fits = match mode {
            Mode::Reflect => before < n && after < n,
            Mode::Replicate => n > 0 || (before == 0 && after == 0),
        };
        if !fits {
            return Err(KernelError::invalid(format!(
                "padding {pad:?} does not fit dim {d} of size {n} (reflection pads must be smaller than the dim, replication needs a non-empty one)"
            )));
        }
        *sizes.as_mut_slice().at_mut(d)? = n
            .checked_add(before)
            .and_then(|v| v.checked_add(after))
            .ok_or_else(|| KernelError::invalid("padded size overflows"))?;
        *befores.as_mut_slice().at_mut(d)? = before;
    }
    let total = numel_of(&sizes)?;
    args.resize(2, &sizes)?;
    same_dtype(x.dtype, args.tensor(2)?.dtype)?;
    spans.extend(sizes.iter().copied());
    // One map (input offsets, by output position) per dim, one after another.
    let maps_len: usize = sizes.iter().sum();
    let mut io = Dense::io(
        args,
        &[0.into()],
        &[2.into()],
        &[Scratch::piece::<usize>(maps_len)],
    )?;
    let maps = io.scratch.take::<usize>(maps_len)?;
    let st = row_major(&x.sizes);
    let mut rest = &mut maps[..];
    let mut starts = Dims::new();
    let mut at = 0;
    for ((&out_n, &n), (&before, &stride)) in
        sizes.iter().zip(&x.sizes).zip(befores.iter().zip(&st))
    {
        let (map, tail) = std::mem::take(&mut rest).split_at_mut(out_n);
        for (o, m) in map.iter_mut().enumerate() {
            *m = source(o, n, before, mode) * stride as usize;
        }
        rest = tail;
        starts.push(at);
        at += out_n;
    }
    let maps: &[usize] = maps;
    let src = io.bytes(0)?;
    let dst = io.bytes_mut(0)?;
    if total == 0 {
        return io.finish();
    }
    by_elem_size!(x.dtype.size(), E => {
        let (src, dst) = (typed::<E>(src)?, typed_mut::<E>(dst)?);
        let map = |d: usize, o: usize| -> KernelResult<usize> {
            maps.at(starts.at(d)? + o).copied()
        };
        // Walk the output in row-major order with an odometer over the outer dims.
        let (&last_n, outer) = sizes.split_last().ok_or_else(oob)?;
        let last = rank - 1;
        let row_map = maps.span(*starts.at(last)?, last_n)?;
        let mut index: Dims = smallvec::smallvec![0; outer.len()];
        for row in dst.chunks_exact_mut(last_n.max(1)) {
            let mut base = 0;
            for (d, &i) in index.iter().enumerate() {
                base += map(d, i)?;
            }
            for (o, &m) in row.iter_mut().zip(row_map) {
                *o = *src.at(base + m)?;
            }
            for (i, &n) in index.iter_mut().zip(outer).rev() {
                *i += 1;
                if *i < n {
                    break;
                }
                *i = 0;
            }
        }
        Ok(())
    })?;
    io.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_mirror_or_clamp() {
        let reflect: Vec<usize> = (0..7).map(|o| source(o, 3, 2, Mode::Reflect)).collect();
        assert_eq!(reflect, [2, 1, 0, 1, 2, 1, 0]);
        let replicate: Vec<usize> = (0..6).map(|o| source(o, 3, 2, Mode::Replicate)).collect();
        assert_eq!(replicate, [0, 0, 0, 1, 2, 2]);
    }
}
