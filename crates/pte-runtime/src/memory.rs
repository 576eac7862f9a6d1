//! Where tensor bytes live, and handing kernels disjoint views of them without copies.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::error::{KernelError, KernelResult};
use crate::tensor::AlignedBuf;

/// Bytes a program or data file was loaded from: a memory map, or an aligned copy.
pub enum SourceBytes {
    /// A memory-mapped (or read) file.
    File(pte_format::FileBytes),
    /// An aligned copy (programs given as bytes, or embedded in a bundle).
    Aligned(AlignedBuf),
}

impl std::ops::Deref for SourceBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            SourceBytes::File(f) => f,
            SourceBytes::Aligned(a) => a.as_bytes(),
        }
    }
}

/// Where one tensor's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Storage {
    /// Not bound: an input not set yet, a freed tensor, or an output not yet produced.
    Null,
    /// Inside planned buffer `buffer` (memory id - 1) at `offset`.
    Planned { buffer: u32, offset: usize },
    /// A runtime-owned buffer, for tensors that are not memory-planned.
    Heap { index: u32 },
    /// Read-only, inside the program file.
    Program { offset: usize },
    /// Read-only, inside external data file `file`.
    External { file: u32, offset: usize },
}

/// A byte range of one storage place that a kernel reads or writes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Access {
    pub storage: Storage,
    pub nbytes: usize,
}

/// All memory of one loaded method.
pub(crate) struct Memory {
    pub planned: Vec<AlignedBuf>,
    pub heap: Vec<AlignedBuf>,
    pub program: Arc<SourceBytes>,
    pub external: Vec<Arc<SourceBytes>>,
    /// Copies of inputs that overlap an output of the same call, reused across calls.
    scratch: Vec<AlignedBuf>,
    /// Working memory any kernel of the method may use during its call (calls run one at
    /// a time), so that steady-state execution allocates nothing.
    workspace: AlignedBuf,
}

type Reads<'m> = SmallVec<[&'m [u8]; 8]>;
type Writes<'m> = SmallVec<[&'m mut [u8]; 4]>;

/// What one kernel call gets: its inputs, its outputs and the method's workspace.
pub(crate) struct Borrowed<'m> {
    pub reads: Reads<'m>,
    pub writes: Writes<'m>,
    pub workspace: &'m mut AlignedBuf,
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1 && a.1 > 0 && b.1 > 0
}

/// The buffer and byte range an access covers, for overlap tests between writable places.
fn place(a: &Access) -> Option<(bool, u32, (usize, usize))> {
    match a.storage {
        Storage::Planned { buffer, offset } => Some((true, buffer, (offset, a.nbytes))),
        Storage::Heap { index } => Some((false, index, (0, a.nbytes))),
        _ => None,
    }
}

impl Memory {
    pub(crate) fn new(
        planned: Vec<AlignedBuf>,
        program: Arc<SourceBytes>,
        external: Vec<Arc<SourceBytes>>,
    ) -> Self {
        Memory {
            planned,
            heap: Vec::new(),
            program,
            external,
            scratch: Vec::new(),
            workspace: AlignedBuf::default(),
        }
    }

    /// Read-only bytes of one storage place.
    pub(crate) fn read(&self, a: Access) -> KernelResult<&[u8]> {
        let (bytes, offset): (&[u8], usize) = match a.storage {
            Storage::Null => {
                return if a.nbytes == 0 {
                    Ok(&[])
                } else {
                    Err(KernelError::invalid(
                        "tensor has no data (unset input or freed tensor)",
                    ))
                }
            }
            Storage::Planned { buffer, offset } => (
                self.planned
                    .get(buffer as usize)
                    .map(AlignedBuf::as_bytes)
                    .unwrap_or(&[]),
                offset,
            ),
            Storage::Heap { index } => (
                self.heap
                    .get(index as usize)
                    .map(AlignedBuf::as_bytes)
                    .unwrap_or(&[]),
                0,
            ),
            Storage::Program { offset } => (&self.program, offset),
            Storage::External { file, offset } => (
                self.external
                    .get(file as usize)
                    .map(|f| &***f)
                    .unwrap_or(&[]),
                offset,
            ),
        };
        offset
            .checked_add(a.nbytes)
            .and_then(|end| bytes.get(offset..end))
            .ok_or_else(|| {
                KernelError::Failed(format!(
                    "tensor bytes {offset}..+{} lie outside their memory ({} bytes)",
                    a.nbytes,
                    bytes.len()
                ))
            })
    }

    /// Makes sure a heap buffer holds at least `nbytes`.
    pub(crate) fn grow_heap(&mut self, index: u32, nbytes: usize) {
        let buf = &mut self.heap[index as usize];
        if buf.len() < nbytes {
            buf.resize(nbytes);
        }
    }

    /// A new heap buffer of `nbytes`.
    pub(crate) fn new_heap(&mut self, nbytes: usize) -> u32 {
        self.heap.push(AlignedBuf::zeroed(nbytes));
        (self.heap.len() - 1) as u32
    }

    /// Views for one kernel call: shared views of `reads`, exclusive views of `writes`.
    ///
    /// Writes must be writable and must not overlap each other. A read that overlaps a
    /// write (an in-place operation, or a plan that reuses memory) is copied first, so
    /// that no byte is ever both shared and exclusive.
    pub(crate) fn borrow(
        &mut self,
        reads: &[Access],
        writes: &[Access],
    ) -> KernelResult<Borrowed<'_>> {
        let write_places: SmallVec<[_; 4]> = writes
            .iter()
            .map(|w| {
                place(w)
                    .ok_or_else(|| KernelError::invalid("output tensor is read-only or unbound"))
            })
            .collect::<KernelResult<_>>()?;
        for (i, a) in write_places.iter().enumerate() {
            for b in &write_places[..i] {
                if a.0 == b.0 && a.1 == b.1 && overlaps(a.2, b.2) {
                    return Err(KernelError::invalid("output tensors overlap in memory"));
                }
            }
        }
        for w in writes {
            self.read(*w)?; // bounds check
        }
        // Inputs that overlap an output are copied to scratch.
        let mut copied: SmallVec<[Option<usize>; 8]> = SmallVec::new();
        let mut used = 0;
        let mut scratch_bufs = std::mem::take(&mut self.scratch);
        for r in reads {
            let clash = place(r).is_some_and(|(p, i, range)| {
                write_places
                    .iter()
                    .any(|&(wp, wi, wr)| wp == p && wi == i && overlaps(range, wr))
            });
            if clash {
                let src = self.read(*r)?;
                if scratch_bufs.len() <= used {
                    scratch_bufs.push(AlignedBuf::default());
                }
                let buf = &mut scratch_bufs[used];
                buf.resize(src.len());
                buf.as_mut_bytes().copy_from_slice(src);
                copied.push(Some(used));
                used += 1;
            } else {
                self.read(*r)?;
                copied.push(None);
            }
        }
        self.scratch = scratch_bufs;

        let Memory {
            planned,
            heap,
            program,
            external,
            scratch,
            workspace,
        } = self;
        let mut outs: SmallVec<[Option<&mut [u8]>; 4]> = writes.iter().map(|_| None).collect();
        // Pieces of planned buffers between outputs: (buffer, start offset, bytes).
        let mut gaps: SmallVec<[(u32, usize, &[u8]); 8]> = SmallVec::new();
        for (b, buf) in planned.iter_mut().enumerate() {
            let mut cuts: SmallVec<[(usize, usize, usize); 4]> = write_places
                .iter()
                .enumerate()
                .filter(|(_, p)| p.0 && p.1 as usize == b && p.2 .1 > 0)
                .map(|(k, p)| (p.2 .0, p.2 .1, k))
                .collect();
            cuts.sort_unstable();
            let mut rest: &mut [u8] = buf.as_mut_bytes();
            let mut at = 0;
            for (offset, len, k) in cuts {
                let (gap, tail) = rest.split_at_mut(offset - at);
                let (out, tail) = tail.split_at_mut(len);
                gaps.push((b as u32, at, gap));
                outs[k] = Some(out);
                rest = tail;
                at = offset + len;
            }
            gaps.push((b as u32, at, rest));
        }
        let mut heap_shared: SmallVec<[(u32, &[u8]); 8]> = SmallVec::new();
        for (h, buf) in heap.iter_mut().enumerate() {
            match write_places.iter().position(|p| !p.0 && p.1 as usize == h) {
                Some(k) => outs[k] = Some(&mut buf.as_mut_bytes()[..writes[k].nbytes]),
                None => heap_shared.push((h as u32, buf.as_bytes())),
            }
        }
        let mut ins: Reads<'_> = SmallVec::with_capacity(reads.len());
        for (r, copy) in reads.iter().zip(&copied) {
            let n = r.nbytes;
            let view: &[u8] = if let Some(s) = copy {
                scratch[*s].as_bytes()
            } else if n == 0 {
                &[]
            } else {
                match r.storage {
                    Storage::Planned { buffer, offset } => gaps
                        .iter()
                        .find(|(b, start, g)| {
                            *b == buffer && *start <= offset && offset + n <= start + g.len()
                        })
                        .map(|(_, start, g)| &g[offset - start..offset - start + n])
                        .expect("a read that overlaps no write lies inside one gap"),
                    Storage::Heap { index } => heap_shared
                        .iter()
                        .find(|(h, _)| *h == index)
                        .map(|(_, b)| &b[..n])
                        .expect("a read that overlaps no write is in an unwritten heap buffer"),
                    Storage::Program { offset } => &program[offset..offset + n],
                    Storage::External { file, offset } => {
                        &external[file as usize][offset..offset + n]
                    }
                    Storage::Null => &[],
                }
            };
            ins.push(view);
        }
        let outs = outs.into_iter().map(|o| o.unwrap_or_default()).collect();
        Ok(Borrowed {
            reads: ins,
            writes: outs,
            workspace,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> Memory {
        let mut planned = AlignedBuf::zeroed(64);
        for (i, b) in planned.as_mut_bytes().iter_mut().enumerate() {
            *b = i as u8;
        }
        let program = Arc::new(SourceBytes::Aligned(AlignedBuf::from_bytes(&[9; 16])));
        Memory::new(vec![planned], program, Vec::new())
    }

    fn planned(offset: usize, nbytes: usize) -> Access {
        Access {
            storage: Storage::Planned { buffer: 0, offset },
            nbytes,
        }
    }

    #[test]
    fn disjoint_reads_and_writes_share_the_buffer() {
        let mut m = memory();
        let Borrowed {
            reads: ins,
            writes: mut outs,
            ..
        } = m
            .borrow(
                &[planned(0, 8), planned(4, 8)],
                &[planned(16, 8), planned(32, 4)],
            )
            .unwrap();
        assert_eq!(ins[0], &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(ins[1], &[4, 5, 6, 7, 8, 9, 10, 11]);
        outs[0].copy_from_slice(&[1; 8]);
        outs[1].copy_from_slice(&[2; 4]);
        drop((ins, outs));
        assert_eq!(&m.planned[0].as_bytes()[16..24], &[1; 8]);
    }

    #[test]
    fn an_input_overlapping_an_output_is_copied_first() {
        let mut m = memory();
        let Borrowed {
            reads: ins,
            writes: outs,
            ..
        } = m.borrow(&[planned(8, 8)], &[planned(12, 8)]).unwrap();
        assert_eq!(ins[0], &[8, 9, 10, 11, 12, 13, 14, 15]);
        for o in outs {
            o.fill(0);
        }
        drop(ins);
        // The copy still holds the old bytes.
        let b = m.borrow(&[planned(8, 8)], &[]).unwrap();
        assert_eq!(b.reads[0], &[8, 9, 10, 11, 0, 0, 0, 0]);
    }

    #[test]
    fn overlapping_outputs_and_out_of_bounds_are_errors() {
        let mut m = memory();
        assert!(m.borrow(&[], &[planned(0, 8), planned(4, 8)]).is_err());
        assert!(m.borrow(&[], &[planned(60, 8)]).is_err());
        assert!(m.borrow(&[planned(usize::MAX - 2, 8)], &[]).is_err());
        let constant = Access {
            storage: Storage::Program { offset: 0 },
            nbytes: 4,
        };
        assert!(m.borrow(&[], &[constant]).is_err());
        assert_eq!(m.borrow(&[constant], &[]).unwrap().reads[0], &[9; 4]);
        // Zero-byte writes inside another write are harmless.
        assert!(m.borrow(&[], &[planned(0, 8), planned(4, 0)]).is_ok());
    }
}
