//! Channel concatenation, shuffle and split of channels-last images in one pass.
//!
//! ShuffleNet's blocks end in `cat` along channels, a channel shuffle (view as
//! `[n, g, c / g, h, w]`, transpose the two middle dimensions, view back) and a split
//! of the result in halves. In NHWC each is a per-pixel rearrangement of channels, so
//! the three make one: every output pixel gathers its channels straight from the
//! parts, and the concatenated and shuffled tensors are never written.

use crate::error::{Error, Result};
use crate::layout::interleave_lines;

/// Most parts of a mix, and most groups a shuffle interleaves through the vectorized
/// path (fixed arrays: a mix is planned at every execution and allocates nothing).
const MAX: usize = 8;

/// How the output channels of one pixel come from the parts.
#[derive(Clone, Debug)]
enum Pieces {
    /// Runs copied one after another: `(part, first channel, channels)`, the first
    /// `n` of the array.
    Runs([(usize, usize, usize); MAX], usize),
    /// `out[q · groups + r] = part_r[first_r + q]` for `q < count`, each `(part_r,
    /// first_r)` one run of the concatenation inside one part.
    Interleave([(usize, usize); MAX], usize),
    /// Channel by channel (shuffles whose runs cross parts, or of many groups).
    Gather,
}

/// Channels `from..from + len` of the per-pixel concatenation of up to eight parts
/// along channels, shuffled in `groups` groups: output channel `j · groups + i` of the
/// shuffle is channel `i · (c / groups) + j` of the concatenation of `c` channels.
#[derive(Clone, Debug)]
pub struct ChannelMix {
    /// Channels of each part, the first `parts` entries.
    channels: [usize; MAX],
    parts: usize,
    groups: usize,
    from: usize,
    len: usize,
    pieces: Pieces,
}

impl ChannelMix {
    /// The mix of parts of `channels` channels each; `groups` 1 is no shuffle.
    pub fn new(channels: &[usize], groups: usize, from: usize, len: usize) -> Result<Self> {
        let total = channels
            .iter()
            .try_fold(0usize, |a, &c| a.checked_add(c))
            .ok_or_else(|| invalid("channel count overflows".into()))?;
        let fits = from.checked_add(len).is_some_and(|end| end <= total);
        if channels.len() > MAX || groups == 0 || !total.is_multiple_of(groups) || !fits {
            return Err(invalid(format!(
                "channels {from}..{from}+{len} of {} parts of {channels:?} channels in {groups} groups",
                channels.len()
            )));
        }
        let parts = channels.len();
        let mut counts = [0; MAX];
        counts.iter_mut().zip(channels).for_each(|(a, &c)| *a = c);
        let per_group = total / groups;
        // The part holding concatenated channel `t`, and `t`'s channel in it.
        let locate = |t: usize| {
            let mut start = 0;
            for (p, &c) in channels.iter().enumerate() {
                if t < start + c {
                    return Some((p, t - start));
                }
                start += c;
            }
            None
        };
        let pieces = if groups == 1 || per_group == 1 {
            // Without a shuffle (or a shuffle that keeps the order): runs of parts.
            // At most one run per part.
            let mut runs = [(0, 0, 0); MAX];
            let (mut t, mut n) = (from, 0);
            while t < from + len {
                let (p, at) = locate(t).ok_or_else(|| invalid("channel out of range".into()))?;
                let take = (channels.get(p).copied().unwrap_or(0) - at).min(from + len - t);
                if let Some(r) = runs.get_mut(n) {
                    *r = (p, at, take);
                }
                (t, n) = (t + take, n + 1);
            }
            Pieces::Runs(runs, n)
        } else if from.is_multiple_of(groups) && len.is_multiple_of(groups) && groups <= MAX {
            // Output channel q · groups + r (from `from` on) is concatenated channel
            // r · per_group + from / groups + q: one run per residue, if each run lies
            // in one part.
            let count = len / groups;
            let q0 = from / groups;
            let mut runs = [(0, 0); MAX];
            let mut found = 0;
            for (r, run) in runs.iter_mut().take(groups).enumerate() {
                let start = r * per_group + q0;
                match (
                    locate(start),
                    count.checked_sub(1).map(|k| locate(start + k)),
                ) {
                    (Some((p, at)), Some(Some((pe, _)))) if p == pe => *run = (p, at),
                    (Some((p, at)), None) => *run = (p, at),
                    _ => break,
                }
                found += 1;
            }
            if found == groups {
                Pieces::Interleave(runs, count)
            } else {
                Pieces::Gather
            }
        } else {
            Pieces::Gather
        };
        Ok(ChannelMix {
            channels: counts,
            parts,
            groups,
            from,
            len,
            pieces,
        })
    }

    /// The output pixels of `out` (`[pixels, len]`) from the same pixels of the parts
    /// (`[pixels, channels_p]` each).
    pub fn run(&self, parts: &[&[f32]], out: &mut [f32]) -> Result {
        if self.len == 0 {
            return Ok(());
        }
        let pixels = out.len() / self.len;
        let channels = self.channels.get(..self.parts).unwrap_or_default();
        let short = parts.len() != self.parts
            || !out.len().is_multiple_of(self.len.max(1))
            || parts
                .iter()
                .zip(channels)
                .any(|(p, &c)| p.len() != pixels * c);
        if short {
            return Err(invalid(format!(
                "{} parts for {} values of {} channels",
                parts.len(),
                out.len(),
                self.len
            )));
        }
        let part = |p: usize, pixel: usize| {
            let c = self.channels.get(p).copied().unwrap_or(0);
            parts
                .get(p)
                .and_then(|x| x.get(pixel * c..(pixel + 1) * c))
                .unwrap_or_default()
        };
        for (pixel, o) in out.chunks_exact_mut(self.len.max(1)).enumerate() {
            match &self.pieces {
                Pieces::Runs(runs, count) => {
                    let mut at = 0;
                    for &(p, first, n) in runs.iter().take(*count) {
                        let src = part(p, pixel).get(first..first + n).unwrap_or_default();
                        if let Some(dst) = o.get_mut(at..at + n) {
                            dst.copy_from_slice(src);
                        }
                        at += n;
                    }
                }
                Pieces::Interleave(runs, count) => {
                    let line = |r: usize| {
                        let (p, first) = runs.get(r).copied().unwrap_or_default();
                        part(p, pixel).get(first..first + count).unwrap_or_default()
                    };
                    match self.groups {
                        2 => interleave_lines::<f32, 2>(std::array::from_fn(line), o),
                        3 => interleave_lines::<f32, 3>(std::array::from_fn(line), o),
                        4 => interleave_lines::<f32, 4>(std::array::from_fn(line), o),
                        g => {
                            let lines: [&[f32]; MAX] =
                                std::array::from_fn(|r| if r < g { line(r) } else { &[] });
                            for (q, chunk) in o.chunks_exact_mut(g).enumerate() {
                                for (v, l) in chunk.iter_mut().zip(&lines) {
                                    *v = l.get(q).copied().unwrap_or_default();
                                }
                            }
                        }
                    }
                }
                Pieces::Gather => {
                    let per_group = channels.iter().sum::<usize>() / self.groups;
                    for (k, v) in o.iter_mut().enumerate() {
                        let s = self.from + k;
                        let mut t = (s % self.groups) * per_group + s / self.groups;
                        for (p, &c) in channels.iter().enumerate() {
                            if t < c {
                                *v = part(p, pixel).get(t).copied().unwrap_or_default();
                                break;
                            }
                            t -= c;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn invalid(what: String) -> Error {
    Error::InvalidParameter {
        what: format!("channel mix: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::ChannelMix;

    /// The mix the long way: concatenate, shuffle, cut, pixel by pixel.
    fn reference(
        parts: &[Vec<f32>],
        channels: &[usize],
        groups: usize,
        from: usize,
        len: usize,
    ) -> Vec<f32> {
        let total: usize = channels.iter().sum();
        let pixels = parts[0].len() / channels[0];
        let mut out = Vec::new();
        for p in 0..pixels {
            let cat: Vec<f32> = parts
                .iter()
                .zip(channels)
                .flat_map(|(x, &c)| x[p * c..(p + 1) * c].to_vec())
                .collect();
            let per = total / groups;
            let shuffled: Vec<f32> = (0..total)
                .map(|s| cat[(s % groups) * per + s / groups])
                .collect();
            out.extend_from_slice(&shuffled[from..from + len]);
        }
        out
    }

    #[test]
    fn mixes_match_concatenating_shuffling_and_cutting() {
        let cases: &[(&[usize], usize, usize, usize)] = &[
            (&[58, 58], 2, 0, 58),  // shufflenet's first half
            (&[58, 58], 2, 58, 58), // and second
            (&[58, 58], 2, 0, 116), // a shuffle read whole
            (&[24], 4, 8, 16),      // one part in four groups
            (&[24], 3, 5, 19),      // a cut off the groups: channel by channel
            (&[7, 5], 3, 0, 12),    // runs crossing parts
            (&[3, 5, 8], 1, 2, 12), // no shuffle: runs of parts
            (&[16], 16, 0, 16),     // as many groups as channels
            (&[9, 9, 9], 3, 3, 6),  // three parts, three groups
            (&[12, 12], 6, 6, 18),  // six groups: the loop past the unrolled ones
            (&[4, 4, 4, 4], 4, 0, 16),
            (&[10], 1, 0, 0), // nothing
        ];
        for &(channels, groups, from, len) in cases {
            for pixels in [1, 3, 8] {
                let parts: Vec<Vec<f32>> = channels
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| (0..pixels * c).map(|k| (i * 1000 + k) as f32).collect())
                    .collect();
                let views: Vec<&[f32]> = parts.iter().map(Vec::as_slice).collect();
                let mix = ChannelMix::new(channels, groups, from, len).unwrap();
                let mut out = vec![f32::NAN; pixels * len];
                mix.run(&views, &mut out).unwrap();
                let want = reference(&parts, channels, groups, from, len);
                assert_eq!(
                    out, want,
                    "{channels:?} in {groups} groups, {from}+{len}, {pixels} pixels"
                );
            }
        }
    }

    #[test]
    fn impossible_mixes_are_errors() {
        assert!(
            ChannelMix::new(&[6], 4, 0, 6).is_err(),
            "groups must divide the channels"
        );
        assert!(ChannelMix::new(&[6], 0, 0, 6).is_err(), "zero groups");
        assert!(ChannelMix::new(&[6], 2, 4, 4).is_err(), "past the channels");
        assert!(
            ChannelMix::new(&[usize::MAX, 2], 1, 0, 1).is_err(),
            "overflow"
        );
        assert!(ChannelMix::new(&[1; 9], 1, 0, 9).is_err(), "too many parts");
        let mix = ChannelMix::new(&[4, 4], 2, 0, 4).unwrap();
        let (a, b) = (vec![0.0; 8], vec![0.0; 4]);
        assert!(
            mix.run(&[&a, &b], &mut [0.0; 8]).is_err(),
            "parts of different pixel counts"
        );
        assert!(mix.run(&[&a], &mut [0.0; 8]).is_err(), "a part missing");
    }
}
