//! Where tensor bytes live, and handing kernels disjoint views of them without copies.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::budget::{Buffer, MemoryBudget, MemoryError};
use crate::error::{KernelError, KernelResult};

/// Bytes a program or data file was loaded from: a file read or mapped, or an aligned
/// copy of bytes given by the caller.
pub enum SourceBytes {
    /// A file read into memory or memory-mapped.
    File(pte_format::FileBytes),
    /// An aligned copy (programs given as bytes, or embedded in a bundle).
    Aligned(pte_format::AlignedBuf),
}

impl SourceBytes {
    /// See [`pte_format::FileBytes::release_pages`]; copies of bytes stay resident.
    fn release_pages(&self, range: std::ops::Range<usize>) {
        if let SourceBytes::File(f) = self {
            f.release_pages(range);
        }
    }
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

/// Where `part`, a view into `outer`, lies in it; `None` when it is not one.
pub fn range_within(outer: &[u8], part: &[u8]) -> Option<std::ops::Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= outer.len()).then_some(start..end)
}

/// Bytes inside a loaded program or data file, shared instead of copied: whoever holds
/// them keeps the file's bytes alive (a delegate keeping its weights, say).
#[derive(Clone)]
pub struct SharedBytes {
    source: Arc<SourceBytes>,
    start: usize,
    len: usize,
}

impl SharedBytes {
    /// `part`, a view into `source`'s bytes, as shared bytes; `None` if it is not one.
    pub(crate) fn within(source: &Arc<SourceBytes>, part: &[u8]) -> Option<Self> {
        let range = range_within(source, part)?;
        Some(SharedBytes {
            source: source.clone(),
            start: range.start,
            len: range.len(),
        })
    }

    /// Gives the whole pages of `range` (of these bytes) back to the system when they
    /// lie in a mapped file, for a delegate that has copied them into a layout of its
    /// own (see [`pte_format::FileBytes::release_pages`]): a later read maps them
    /// again, unchanged.
    pub fn release_pages(&self, range: std::ops::Range<usize>) {
        let end = range.end.min(self.len);
        if range.start < end {
            self.source.release_pages(
                self.start.saturating_add(range.start)..self.start.saturating_add(end),
            );
        }
    }
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.source
            .get(self.start..self.start.saturating_add(self.len))
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes at {})", self.len, self.start)
    }
}

/// Where one tensor's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Storage {
    /// Not bound: an input not set yet, or an output not produced yet.
    Null,
    /// Inside planned buffer `buffer` (memory id - 1) at `offset`.
    Planned { buffer: u32, offset: usize },
    /// The runtime-owned buffer of value `owner`, for tensors that are not memory-planned.
    /// Each value owns at most one such buffer, reused (and grown) at every write, so
    /// that no sequence of instructions can make the number of buffers grow.
    Heap { owner: u32 },
    /// The runtime-owned buffer of value `owner`, computed once at load from constants
    /// (see `fold.rs`): read-only from then on.
    Folded { owner: u32 },
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

/// All memory of one loaded method, charged to its budget.
pub(crate) struct Memory {
    pub budget: MemoryBudget,
    planned: Vec<Buffer>,
    /// One (initially empty) buffer per value of the method.
    heap: Vec<Buffer>,
    program: Arc<SourceBytes>,
    external: Vec<Arc<SourceBytes>>,
    /// Copies of inputs that overlap an output of the same call, reused across calls.
    scratch: Vec<Buffer>,
    /// Working memory any kernel of the method may use during its call (calls run one at
    /// a time), so that steady-state execution allocates nothing.
    workspace: Buffer,
}

type Reads<'m, const R: usize> = SmallVec<[&'m [u8]; R]>;
type Writes<'m, const W: usize> = SmallVec<[&'m mut [u8]; W]>;

/// What one kernel call gets: its inputs, its outputs and the method's workspace (the
/// views of up to `R` inputs and `W` outputs held inline).
pub(crate) struct Borrowed<'m, const R: usize, const W: usize> {
    pub reads: Reads<'m, R>,
    pub writes: Writes<'m, W>,
    pub workspace: &'m mut Buffer,
}

/// A writable place: a planned buffer or a heap buffer, with a byte range inside it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Planned(u32),
    Heap(u32),
}

fn place(a: &Access) -> Option<(Place, usize, usize)> {
    match a.storage {
        Storage::Planned { buffer, offset } => Some((Place::Planned(buffer), offset, a.nbytes)),
        Storage::Heap { owner } => Some((Place::Heap(owner), 0, a.nbytes)),
        _ => None,
    }
}

/// True when two non-empty byte ranges of the same place overlap.
fn clash(a: (Place, usize, usize), b: (Place, usize, usize)) -> bool {
    let end = |start: usize, len: usize| start.saturating_add(len);
    a.0 == b.0 && a.2 > 0 && b.2 > 0 && a.1 < end(b.1, b.2) && b.1 < end(a.1, a.2)
}

fn outside(what: &str, offset: usize, nbytes: usize, len: usize) -> KernelError {
    KernelError::Failed(format!(
        "tensor bytes {offset}..+{nbytes} lie outside {what} ({len} bytes)"
    ))
}

fn range<'b>(bytes: &'b [u8], offset: usize, nbytes: usize, what: &str) -> KernelResult<&'b [u8]> {
    offset
        .checked_add(nbytes)
        .and_then(|end| bytes.get(offset..end))
        .ok_or_else(|| outside(what, offset, nbytes, bytes.len()))
}

/// Exclusive references to the elements at `sorted` (ascending, distinct) indices.
fn pick_mut<'a>(
    mut rest: &'a mut [Buffer],
    sorted: &[u32],
) -> SmallVec<[(u32, &'a mut Buffer); 8]> {
    let mut out = SmallVec::new();
    let mut base = 0usize;
    for &i in sorted {
        let skip = (i as usize).saturating_sub(base);
        let Some((_, tail)) = std::mem::take(&mut rest).split_at_mut_checked(skip) else {
            break;
        };
        let Some((first, tail)) = tail.split_first_mut() else {
            break;
        };
        out.push((i, first));
        rest = tail;
        base = i as usize + 1;
    }
    out
}

impl Memory {
    /// Memory with the planned buffers allocated (lazily zeroed) and charged to `budget`;
    /// an error names the planned buffer (memory id) that does not fit.
    pub(crate) fn new(
        budget: MemoryBudget,
        planned_sizes: &[usize],
        program: Arc<SourceBytes>,
        external: Vec<Arc<SourceBytes>>,
        values: usize,
    ) -> Result<Self, (usize, MemoryError)> {
        let planned = planned_sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| budget.sparse_buffer(size).map_err(|e| (i + 1, e)))
            .collect::<Result<_, _>>()?;
        Ok(Memory {
            heap: (0..values).map(|_| Buffer::new(&budget)).collect(),
            scratch: Vec::new(),
            workspace: Buffer::new(&budget),
            budget,
            planned,
            program,
            external,
        })
    }

    /// Size of planned buffer `buffer` (memory id - 1), if it exists.
    pub(crate) fn planned_len(&self, buffer: u32) -> Option<usize> {
        self.planned.get(buffer as usize).map(Buffer::len)
    }

    /// Bytes of all planned buffers.
    pub(crate) fn planned_total(&self) -> usize {
        self.planned.iter().map(Buffer::len).sum()
    }

    /// Number of planned buffers.
    pub(crate) fn planned_count(&self) -> usize {
        self.planned.len()
    }

    /// A new planned buffer of `len` (zeroed) bytes, charged to the budget: its index.
    pub(crate) fn add_planned(&mut self, len: usize) -> Result<u32, MemoryError> {
        let index = u32::try_from(self.planned.len()).map_err(|_| MemoryError::AllocFailed {
            requested: len as u64,
        })?;
        self.planned.push(self.budget.sparse_buffer(len)?);
        Ok(index)
    }

    /// The bytes of a tensor stored in the program or one of its data files, shared
    /// rather than copied; `None` for any other storage.
    pub(crate) fn shared(&self, a: Access) -> KernelResult<Option<SharedBytes>> {
        let source = match a.storage {
            Storage::Program { .. } => &self.program,
            Storage::External { file, .. } => match self.external.get(file as usize) {
                Some(f) => f,
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        Ok(SharedBytes::within(source, self.read(a)?))
    }

    /// Gives the pages of bytes `within` a tensor stored in a mapped program or data
    /// file back to the system (see [`pte_format::FileBytes::release_pages`]); a later
    /// read maps them again. Any other storage is left as it is.
    pub(crate) fn release_pages(&self, a: Access, within: std::ops::Range<usize>) {
        let end = within.end.min(a.nbytes);
        if within.start >= end {
            return;
        }
        let (source, offset) = match a.storage {
            Storage::Program { offset } => (&self.program, offset),
            Storage::External { file, offset } => match self.external.get(file as usize) {
                Some(f) => (f, offset),
                None => return,
            },
            _ => return,
        };
        source.release_pages(offset.saturating_add(within.start)..offset.saturating_add(end));
    }

    /// Read-only bytes of one storage place.
    pub(crate) fn read(&self, a: Access) -> KernelResult<&[u8]> {
        match a.storage {
            Storage::Null if a.nbytes == 0 => Ok(&[]),
            Storage::Null => Err(KernelError::invalid(
                "tensor has no data (an input that was not set, or a freed tensor)",
            )),
            Storage::Planned { buffer, offset } => {
                let bytes = self
                    .planned
                    .get(buffer as usize)
                    .map_or(&[][..], Buffer::as_bytes);
                range(bytes, offset, a.nbytes, "its planned buffer")
            }
            Storage::Heap { owner } | Storage::Folded { owner } => {
                let bytes = self
                    .heap
                    .get(owner as usize)
                    .map_or(&[][..], Buffer::as_bytes);
                range(bytes, 0, a.nbytes, "its buffer")
            }
            Storage::Program { offset } => range(&self.program, offset, a.nbytes, "the program"),
            Storage::External { file, offset } => {
                let bytes = self.external.get(file as usize).map_or(&[][..], |f| &***f);
                range(bytes, offset, a.nbytes, "its data file")
            }
        }
    }

    /// Writable bytes of a planned tensor, or of a heap tensor (grown to `nbytes` first).
    pub(crate) fn write(&mut self, a: Access) -> KernelResult<&mut [u8]> {
        let (bytes, offset): (&mut [u8], usize) = match a.storage {
            Storage::Planned { buffer, offset } => (
                self.planned
                    .get_mut(buffer as usize)
                    .map_or(&mut [][..], Buffer::as_mut_bytes),
                offset,
            ),
            Storage::Heap { owner } => {
                self.grow_heap(owner, a.nbytes)?;
                (
                    self.heap
                        .get_mut(owner as usize)
                        .map_or(&mut [][..], Buffer::as_mut_bytes),
                    0,
                )
            }
            _ => return Err(KernelError::invalid("the tensor is read-only or unbound")),
        };
        let len = bytes.len();
        offset
            .checked_add(a.nbytes)
            .and_then(|end| bytes.get_mut(offset..end))
            .ok_or_else(|| outside("its memory", offset, a.nbytes, len))
    }

    /// Makes sure the heap buffer of value `owner` holds at least `nbytes`.
    pub(crate) fn grow_heap(&mut self, owner: u32, nbytes: usize) -> KernelResult {
        let buf = self
            .heap
            .get_mut(owner as usize)
            .ok_or_else(|| KernelError::Failed(format!("value {owner} has no buffer slot")))?;
        if buf.len() < nbytes {
            buf.resize(nbytes).map_err(|source| KernelError::Memory {
                what: format!("value {owner}"),
                source,
            })?;
        }
        Ok(())
    }

    /// Gives the heap buffer of value `owner` back (a `FreeCall`).
    pub(crate) fn release_heap(&mut self, owner: u32) {
        if let Some(buf) = self.heap.get_mut(owner as usize) {
            buf.release();
        }
    }

    /// Views for one kernel call: shared views of `reads`, exclusive views of `writes`.
    ///
    /// Writes must be writable, already sized (see [`Memory::grow_heap`]) and must not
    /// overlap each other. A read that overlaps a write (an in-place operation, or a plan
    /// that reuses memory) is copied first, so that no byte is ever both shared and
    /// exclusive.
    pub(crate) fn borrow<const R: usize, const W: usize>(
        &mut self,
        reads: &[Access],
        writes: &[Access],
    ) -> KernelResult<Borrowed<'_, R, W>> {
        // Where each write goes; writes are checked against each other here and against
        // their buffers' ends when the buffers are cut below.
        let mut spans: SmallVec<[(Place, usize, usize); W]> = SmallVec::new();
        let mut heap_used = false;
        for w in writes {
            let p = place(w)
                .ok_or_else(|| KernelError::invalid("output tensor is read-only or unbound"))?;
            if spans.iter().any(|&q| clash(p, q)) {
                return Err(KernelError::invalid("output tensors overlap in memory"));
            }
            if p.2 == 0 {
                self.read(*w)?; // not cut below: bounds-checked here
            }
            heap_used |= matches!(p.0, Place::Heap(_));
            spans.push(p);
        }
        // Inputs that overlap an output are copied to scratch buffers first (an in-place
        // call, or a plan that reuses memory): rare, so looked for before anything is
        // set up for them.
        let overlaps = |r: &Access| place(r).is_some_and(|p| spans.iter().any(|&w| clash(p, w)));
        let mut copied: SmallVec<[Option<usize>; R]> = SmallVec::new();
        if reads.iter().any(overlaps) {
            let mut scratch = std::mem::take(&mut self.scratch);
            let mut used = 0;
            for r in reads {
                if !overlaps(r) {
                    copied.push(None);
                    continue;
                }
                let src = match self.read(*r) {
                    Ok(src) => src,
                    Err(e) => {
                        self.scratch = scratch;
                        return Err(e);
                    }
                };
                if scratch.len() <= used {
                    scratch.push(Buffer::new(&self.budget));
                }
                let Some(buf) = scratch.get_mut(used) else {
                    continue;
                };
                if let Err(source) = buf.resize(src.len()) {
                    self.scratch = scratch;
                    return Err(KernelError::Memory {
                        what: "a copy of an input that overlaps an output".into(),
                        source,
                    });
                }
                buf.as_mut_bytes().copy_from_slice(src);
                copied.push(Some(used));
                used += 1;
            }
            self.scratch = scratch;
        }

        let Memory {
            planned,
            heap,
            program,
            external,
            scratch,
            workspace,
            ..
        } = self;
        let mut outs: Writes<'_, W> = writes.iter().map(|_| Default::default()).collect();
        // Non-empty writes given their bytes below; any left over names a buffer that
        // does not exist.
        let mut placed = 0;
        // Each planned buffer cut around the outputs in it; the pieces between them
        // (buffer, start offset, bytes) are what inputs read.
        let mut gaps: SmallVec<[(u32, usize, &[u8]); 8]> = SmallVec::new();
        for (b, buf) in planned.iter_mut().enumerate() {
            let b = b as u32;
            let mut cuts: SmallVec<[(usize, usize, usize); W]> = SmallVec::new();
            for (k, p) in spans.iter().enumerate() {
                if p.0 == Place::Planned(b) && p.2 > 0 {
                    cuts.push((p.1, p.2, k));
                }
            }
            cuts.sort_unstable();
            let mut rest: &mut [u8] = buf.as_mut_bytes();
            let whole = rest.len();
            let mut at = 0;
            for (offset, len, k) in cuts {
                // The cuts do not overlap, so sorted they come in order.
                let (gap, tail) = std::mem::take(&mut rest)
                    .split_at_mut_checked(offset.saturating_sub(at))
                    .ok_or_else(|| outside("its planned buffer", offset, len, whole))?;
                let (out, tail) = tail
                    .split_at_mut_checked(len)
                    .ok_or_else(|| outside("its planned buffer", offset, len, whole))?;
                gaps.push((b, at, gap));
                if let Some(o) = outs.get_mut(k) {
                    *o = out;
                    placed += 1;
                }
                rest = tail;
                at = offset + len;
            }
            gaps.push((b, at, rest));
        }
        // Heap buffers: an output takes its whole buffer, inputs share the others.
        let mut heap_shared: SmallVec<[(u32, &[u8]); 4]> = SmallVec::new();
        if heap_used || reads.iter().any(|r| heap_owner(r).is_some()) {
            let mut owners: SmallVec<[u32; R]> =
                reads.iter().chain(writes).filter_map(heap_owner).collect();
            owners.sort_unstable();
            owners.dedup();
            for (h, buf) in pick_mut(heap, &owners) {
                let taker = spans.iter().position(|p| p.0 == Place::Heap(h) && p.2 > 0);
                match taker {
                    Some(k) => {
                        let n = writes.get(k).map_or(0, |w| w.nbytes);
                        let bytes = buf.as_mut_bytes();
                        let len = bytes.len();
                        let out = bytes
                            .get_mut(..n)
                            .ok_or_else(|| outside("its buffer", 0, n, len))?;
                        if let Some(o) = outs.get_mut(k) {
                            *o = out;
                            placed += 1;
                        }
                    }
                    None => heap_shared.push((h, buf.as_bytes())),
                }
            }
        }
        if placed < spans.iter().filter(|p| p.2 > 0).count() {
            return Err(KernelError::invalid(
                "an output tensor's buffer does not exist",
            ));
        }
        let mut ins: Reads<'_, R> = SmallVec::with_capacity(reads.len());
        for (i, r) in reads.iter().enumerate() {
            let n = r.nbytes;
            let view: Option<&[u8]> = match (copied.get(i).copied().flatten(), r.storage) {
                (Some(s), _) => scratch.get(s).map(Buffer::as_bytes),
                // No bytes to read, wherever the plan put them (inside an output too).
                (None, _) if n == 0 => Some(&[]),
                (None, Storage::Null) => {
                    return Err(KernelError::invalid(
                        "tensor has no data (an input that was not set, or a freed tensor)",
                    ))
                }
                (None, Storage::Planned { buffer, offset }) => gaps
                    .iter()
                    .find(|(b, start, g)| {
                        *b == buffer && *start <= offset && offset <= start + g.len()
                    })
                    .and_then(|(_, start, g)| {
                        g.get(offset - start..(offset - start).checked_add(n)?)
                    }),
                (None, Storage::Heap { owner } | Storage::Folded { owner }) => heap_shared
                    .iter()
                    .find(|(h, _)| *h == owner)
                    .and_then(|(_, b)| b.get(..n)),
                (None, Storage::Program { offset }) => {
                    program.get(offset..offset.saturating_add(n))
                }
                (None, Storage::External { file, offset }) => external
                    .get(file as usize)
                    .and_then(|f| f.get(offset..offset.saturating_add(n))),
            };
            // A read that overlaps no write lies in one gap, unless it is out of bounds.
            ins.push(view.ok_or_else(|| {
                KernelError::Failed(format!(
                    "tensor bytes {}..+{n} lie outside its memory",
                    offset_of(r)
                ))
            })?);
        }
        Ok(Borrowed {
            reads: ins,
            writes: outs,
            workspace,
        })
    }
}

/// The value owning the heap buffer an access reads or writes, if it is one.
fn heap_owner(a: &Access) -> Option<u32> {
    match a.storage {
        Storage::Heap { owner } | Storage::Folded { owner } => Some(owner),
        _ => None,
    }
}

/// Where an access starts in its storage, for messages.
fn offset_of(a: &Access) -> usize {
    match a.storage {
        Storage::Planned { offset, .. }
        | Storage::Program { offset }
        | Storage::External { offset, .. } => offset,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_within_are_found_and_other_slices_refused() {
        let outer = [0u8; 32];
        assert_eq!(range_within(&outer, &outer[5..9]), Some(5..9));
        assert_eq!(range_within(&outer, &outer[32..]), Some(32..32));
        assert_eq!(range_within(&outer[..16], &outer[10..20]), None);
        assert_eq!(range_within(&outer[8..], &outer[..4]), None);
        let other = [0u8; 4];
        assert_eq!(range_within(&outer, &other), None);
    }

    fn memory() -> Memory {
        let program = Arc::new(SourceBytes::Aligned(
            pte_format::AlignedBuf::try_from_bytes(&[9; 16]).unwrap(),
        ));
        let mut m = Memory::new(MemoryBudget::new(1 << 20), &[64], program, Vec::new(), 4)
            .ok()
            .unwrap();
        for (i, b) in m.planned[0].as_mut_bytes().iter_mut().enumerate() {
            *b = i as u8;
        }
        m
    }

    fn planned(offset: usize, nbytes: usize) -> Access {
        Access {
            storage: Storage::Planned { buffer: 0, offset },
            nbytes,
        }
    }

    fn heap(owner: u32, nbytes: usize) -> Access {
        Access {
            storage: Storage::Heap { owner },
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
            .borrow::<8, 4>(
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
        } = m
            .borrow::<8, 4>(&[planned(8, 8)], &[planned(12, 8)])
            .unwrap();
        assert_eq!(ins[0], &[8, 9, 10, 11, 12, 13, 14, 15]);
        for o in outs {
            o.fill(0);
        }
        drop(ins);
        // The copy still holds the old bytes.
        let b = m.borrow::<8, 4>(&[planned(8, 8)], &[]).unwrap();
        assert_eq!(b.reads[0], &[8, 9, 10, 11, 0, 0, 0, 0]);
    }

    #[test]
    fn overlapping_outputs_and_out_of_bounds_are_errors() {
        let mut m = memory();
        assert!(m
            .borrow::<8, 4>(&[], &[planned(0, 8), planned(4, 8)])
            .is_err());
        assert!(m.borrow::<8, 4>(&[], &[planned(60, 8)]).is_err());
        assert!(m
            .borrow::<8, 4>(&[planned(usize::MAX - 2, 8)], &[])
            .is_err());
        let constant = Access {
            storage: Storage::Program { offset: 0 },
            nbytes: 4,
        };
        assert!(m.borrow::<8, 4>(&[], &[constant]).is_err());
        assert_eq!(
            m.borrow::<8, 4>(&[constant], &[]).unwrap().reads[0],
            &[9; 4]
        );
        // Outputs in buffers that do not exist.
        let nowhere = Access {
            storage: Storage::Planned {
                buffer: 3,
                offset: 0,
            },
            nbytes: 4,
        };
        assert!(m.borrow::<8, 4>(&[], &[nowhere]).is_err());
        assert!(m.borrow::<8, 4>(&[], &[heap(99, 4)]).is_err());
        // A zero-byte read inside an output's bytes reads nothing from them.
        let b = m
            .borrow::<8, 4>(&[planned(20, 0)], &[planned(16, 8)])
            .unwrap();
        assert!(b.reads[0].is_empty());
        drop(b);
        // Zero-byte writes inside another write are harmless.
        assert!(m
            .borrow::<8, 4>(&[], &[planned(0, 8), planned(4, 0)])
            .is_ok());
    }

    #[test]
    fn a_zero_byte_write_to_a_shared_heap_buffer_leaves_it_readable() {
        // Two values bound to one heap buffer (through a Move): one is read, the other
        // gets a zero-byte write in the same call.
        let mut m = memory();
        m.grow_heap(1, 8).unwrap();
        let b = m.borrow::<8, 4>(&[heap(1, 8)], &[heap(1, 0)]).unwrap();
        assert_eq!(b.reads[0], &[0; 8]);
        assert!(b.writes[0].is_empty());
        drop(b);
        let b = m.borrow::<8, 4>(&[heap(1, 8)], &[heap(1, 8)]).unwrap();
        assert_eq!(b.reads[0].len(), 8);
    }

    #[test]
    fn released_heap_buffers_give_their_memory_back() {
        let mut m = memory();
        let base = m.budget.used();
        m.grow_heap(2, 1000).unwrap();
        assert_eq!(m.budget.used(), base + 1008);
        m.release_heap(2);
        assert_eq!(m.budget.used(), base);
        assert!(m.read(heap(2, 4)).is_err());
        assert!(m.grow_heap(3, 1 << 30).is_err(), "past the budget");
    }
}
