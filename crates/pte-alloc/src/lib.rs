//! Zeroed, cache-line-aligned buffers whose memory comes in 2 MiB pages where Linux
//! offers them (transparent huge pages in `madvise` mode, a common default).
//!
//! The first touch of each 4 KiB page of fresh memory is a page fault. On a virtual
//! machine that accounts memory per control group one costs 2-3 µs: regnet_y_400mf's
//! 17 MB file read into memory and its 17 MB of packed weights took 11,000 of them, a
//! third of the time from opening the program to its first output.
//!
//! - [`Zeroed::try_new`] gives a buffer of its own. From [`MAP_FROM`] bytes on it is a
//!   fresh mapping, zeroed once, by the kernel, that asks for huge pages before
//!   anything touches it (one fault per 2 MiB); smaller ones come from the global
//!   allocator.
//! - [`Zeroed::try_shared`] is for buffers that live as long as a loaded program, such
//!   as packed weights: most layers' weights are far below 2 MiB, so they are cut one
//!   after another from shared mappings of [`CHUNK`] bytes, and together fill huge
//!   pages. A mapping is returned to the system when its last buffer is dropped.
//!
//! - [`Staging`] lends temporaries to a pass that builds many layers one after
//!   another (a method's load): a buffer given back is lent again, so the pass faults
//!   its temporaries in once rather than once per layer.
//!
//! Each huge page is first touched here, timed: one that the host of a virtual machine
//! had to back anew (see [`SLOW_HUGE_PAGE`]) turns huge pages off for the rest of the
//! process.
//!
//! Measured from `Program::open` to the first output, one thread, against one small
//! allocation per layer cleared by the allocator, each run right after another
//! process freed a gigabyte: regnet_y_400mf 38 → 28 ms, mobilenet_v3_large 31 → 21
//! ms, convnext_tiny 254 → 205 ms, resnet18 unchanged (95 ms).

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::indexing_slicing))]

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use memmap2::MmapMut;

mod counting;
pub use counting::{allocations, CountingAllocator};

/// Buffers of their own from this size on are mappings that ask for huge pages.
pub const MAP_FROM: usize = HUGE_PAGE;

/// Sparse buffers (see [`Zeroed::try_sparse`]) from this size on are mappings of their
/// own: fresh pages, zero until touched and resident only once touched. Below
/// [`MAP_FROM`] the C heap would hand back reused memory that `calloc` clears, page
/// by page: the transformer encoder's 1.6 MiB plan cost 2 ms of its load that way,
/// and was resident whole.
pub const SPARSE_MAP_FROM: usize = 64 * 1024;

/// Bytes in each mapping that shared buffers are cut from. Larger shared buffers are
/// mappings of their own.
pub const CHUNK: usize = 8 * HUGE_PAGE;

/// Every buffer starts on a cache line, so 512-bit vectors at 64-byte offsets never
/// straddle two lines.
pub const ALIGN: usize = 64;

const HUGE_PAGE: usize = 2 << 20;

/// `len` zeroed values of `T`, 64-byte aligned.
pub struct Zeroed<T> {
    store: Store,
    len: usize,
    elem: PhantomData<T>,
}

enum Store {
    Empty,
    Heap(Vec<Line>),
    /// A mapping of its own.
    Mapped(Mapping),
    /// Bytes of a shared mapping that belong to this buffer alone.
    Piece {
        ptr: NonNull<u8>,
        /// Held so that the mapping outlives the piece.
        chunk: Arc<Mapping>,
    },
}

/// The unit of heap allocation: one cache line.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; ALIGN]);

// SAFETY: a `Piece`'s bytes are reachable only through the one buffer it was cut for
// (`Chunks::cut` hands each range out once); the shared mapping is only kept alive
// by the `Arc`. Every other store is owned memory.
unsafe impl<T: Send> Send for Zeroed<T> {}
// SAFETY: as above; `&Zeroed` gives shared access only.
unsafe impl<T: Sync> Sync for Zeroed<T> {}

impl<T: bytemuck::Pod> Default for Zeroed<T> {
    fn default() -> Self {
        Zeroed {
            store: Store::Empty,
            len: 0,
            elem: PhantomData,
        }
    }
}

impl<T: bytemuck::Pod> Zeroed<T> {
    /// A buffer of its own, or `None` when the system refuses the memory.
    pub fn try_new(len: usize) -> Option<Self> {
        Self::own(len, true)
    }

    /// A buffer of its own whose pages the system backs only as they are first
    /// touched, in ordinary 4 KiB pages (below [`SPARSE_MAP_FROM`] bytes it comes from
    /// the heap, cleared); `None` when the system refuses the memory.
    /// For memory of which a run may touch only a part, such as a program's memory
    /// plan, which gives room to values that the fused kernels of a method never
    /// write: a 2 MiB page would make all of its neighbourhood resident (mobilenet_v2's
    /// 9.5 MiB plan: 8 MiB resident in huge pages, 2.6 MiB in ordinary ones).
    pub fn try_sparse(len: usize) -> Option<Self> {
        Self::own(len, false)
    }

    /// A buffer of its own: a mapping from [`MAP_FROM`] bytes on, faulted in now in
    /// huge pages, when `huge` asks for them; otherwise a mapping from
    /// [`SPARSE_MAP_FROM`] bytes on, which nothing touches.
    fn own(len: usize, huge: bool) -> Option<Self> {
        let bytes = Self::bytes_for(len)?;
        let map_from = if huge { MAP_FROM } else { SPARSE_MAP_FROM };
        let store = if bytes == 0 {
            Store::Empty
        } else if bytes >= map_from {
            match map(bytes, huge) {
                Some(m) => {
                    // Touches nothing in a mapping that asked for no huge pages.
                    m.fault_in(0..bytes);
                    Store::Mapped(m)
                }
                None => heap(bytes)?,
            }
        } else {
            heap(bytes)?
        };
        Some(Self::with(store, len))
    }

    /// A buffer that lives about as long as the program it belongs to, cut from a
    /// shared mapping when it is small; `None` when the system refuses the memory.
    pub fn try_shared(len: usize) -> Option<Self> {
        let bytes = Self::bytes_for(len)?;
        if bytes == 0 || bytes > CHUNK / 4 {
            return Self::try_new(len);
        }
        let store = match CHUNKS.cut(bytes) {
            Some((chunk, ptr)) => Store::Piece { ptr, chunk },
            None => heap(bytes)?,
        };
        Some(Self::with(store, len))
    }

    fn bytes_for(len: usize) -> Option<usize> {
        let bytes = len.checked_mul(size_of::<T>())?;
        // Beyond this, neither a `Vec` nor a slice can describe the buffer.
        (bytes <= isize::MAX as usize - HUGE_PAGE).then_some(bytes)
    }

    fn with(store: Store, len: usize) -> Self {
        Zeroed {
            store,
            len,
            elem: PhantomData,
        }
    }

    fn bytes(&self) -> &[u8] {
        let n = self.len * size_of::<T>();
        match &self.store {
            // Empty, but aligned like every other store: views of other types keep
            // working (a 1-aligned empty slice cannot be viewed as `f32`s).
            Store::Empty => bytemuck::cast_slice::<Line, u8>(&[]),
            Store::Heap(lines) => bytemuck::cast_slice::<Line, u8>(lines)
                .get(..n)
                .unwrap_or(&[]),
            Store::Mapped(m) => m.map.get(m.start..m.start + n).unwrap_or(&[]),
            // SAFETY: `ptr` starts `n` bytes of the live mapping `chunk` that belong to
            // this buffer alone (see `Chunks::cut`).
            Store::Piece { ptr, .. } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), n) },
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.len * size_of::<T>();
        match &mut self.store {
            Store::Empty => bytemuck::cast_slice_mut::<Line, u8>(&mut []),
            Store::Heap(lines) => bytemuck::cast_slice_mut::<Line, u8>(lines)
                .get_mut(..n)
                .unwrap_or_default(),
            Store::Mapped(m) => m.map.get_mut(m.start..m.start + n).unwrap_or_default(),
            // SAFETY: as in `bytes`; `&mut self` makes the access unique.
            Store::Piece { ptr, .. } => unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), n) },
        }
    }
}

impl<T: bytemuck::Pod> std::ops::Deref for Zeroed<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // Every store starts on a 64-byte boundary and holds `len` values.
        bytemuck::try_cast_slice(self.bytes()).unwrap_or_default()
    }
}

impl<T: bytemuck::Pod> std::ops::DerefMut for Zeroed<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        bytemuck::try_cast_slice_mut(self.bytes_mut()).unwrap_or_default()
    }
}

/// A dropped piece of a shared mapping gives its pages back at once: the mapping
/// lives on while other pieces do, and a layer packed again for new input shapes must
/// not leave its old weights resident.
impl<T> Drop for Zeroed<T> {
    fn drop(&mut self) {
        if let Store::Piece { ptr, chunk } = &self.store {
            give_back(chunk, *ptr, self.len.saturating_mul(size_of::<T>()));
        }
    }
}

/// Returns the whole pages of `bytes` from `ptr` inside `chunk` to the system.
#[cfg(unix)]
fn give_back(chunk: &Mapping, ptr: NonNull<u8>, bytes: usize) {
    // The pages at either end may hold neighbouring pieces; they stay.
    const PAGE: usize = 4096;
    let base = chunk.map.as_ptr() as usize;
    let first = (ptr.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (ptr.as_ptr() as usize).saturating_add(bytes) / PAGE * PAGE;
    if end > first {
        // SAFETY: the range lies inside this piece, which is being dropped: nothing
        // borrows it, and no piece is ever cut from it again (cuts only move forward
        // through a mapping). A refusal (a larger page size) leaves the pages resident.
        let _ = unsafe {
            chunk.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                first - base,
                end - first,
            )
        };
    }
}

#[cfg(not(unix))]
fn give_back(_chunk: &Mapping, _ptr: NonNull<u8>, _bytes: usize) {}

/// A copy of its own ([`Zeroed::try_new`]); like `Vec::clone`, it aborts when the
/// system refuses the memory.
impl<T: bytemuck::Pod> Clone for Zeroed<T> {
    fn clone(&self) -> Self {
        let Some(mut copy) = Self::try_new(self.len) else {
            let size = self.len.saturating_mul(size_of::<T>());
            let layout = std::alloc::Layout::from_size_align(size, ALIGN)
                .unwrap_or(std::alloc::Layout::new::<Line>());
            std::alloc::handle_alloc_error(layout)
        };
        copy.copy_from_slice(self);
        copy
    }
}

impl<T> std::fmt::Debug for Zeroed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.store {
            Store::Empty => "empty",
            Store::Heap(_) => "heap",
            Store::Mapped(_) => "mapped",
            Store::Piece { .. } => "shared",
        };
        write!(f, "Zeroed({} values, {kind})", self.len)
    }
}

fn heap(bytes: usize) -> Option<Store> {
    bytemuck::allocation::try_zeroed_vec(bytes.div_ceil(ALIGN))
        .ok()
        .map(Store::Heap)
}

/// A fresh mapping whose buffer starts `start` bytes in, on a 2 MiB boundary.
struct Mapping {
    map: MmapMut,
    start: usize,
    /// Bytes of the buffer.
    len: usize,
    /// Whether the rest of the buffer still asks for huge pages.
    huge: AtomicBool,
}

/// Whether huge pages are still asked for. A huge page is a gamble on a virtual
/// machine that hands free memory back to its host (virtio-balloon free page
/// reporting, in 2 MiB blocks): a block the host still backs is cleared in about 0.17
/// ms, one it has to fault in again took 4.4-5.5 ms, where the same 2 MiB in 4 KiB
/// pages (mostly recently freed, still backed) cost about 1.1 ms, faulted one by one
/// as they were written. Which kind the
/// kernel hands out is not known beforehand; right after another process exited, the
/// first 0 to 12 blocks of a fresh process were backed and the next was not.
///
/// Load plus first output, one thread, each run 0.5 s after an upstream worker exited
/// (medians of 6; a fixed 32 MiB budget of huge pages / none / this probe):
/// mobilenet_v2 42.7 / 21.9 / 25.0 ms, regnet_y_400mf 38.0 / 31.9 / 25.6,
/// efficientnet_b0 38.6 / 33.2 / 36.7, decoder_lm 35.1 / 34.3 / 26.5, resnet18 82.7 /
/// 105.1 / 87.5.
static HUGE_PAGES: AtomicBool = AtomicBool::new(true);

/// A first touch of a huge page that takes longer than this was backed anew by the
/// host (see [`HUGE_PAGES`]); after it the process asks for ordinary pages. Between
/// the two measured kinds, well above a backed block's clearing on a loaded host.
pub const SLOW_HUGE_PAGE: Duration = Duration::from_millis(1);

/// A fresh mapping holding `len` bytes from a 2 MiB boundary on, advised to use huge
/// pages before anything touches it when `huge` asks for them, unless they were found
/// slow.
fn map(len: usize, huge: bool) -> Option<Mapping> {
    // Room to move the start to the next 2 MiB boundary; the unused head is never
    // touched and costs address space only.
    let map = MmapMut::map_anon(len.checked_add(HUGE_PAGE)?).ok()?;
    let start = map.as_ptr().align_offset(HUGE_PAGE).min(HUGE_PAGE);
    let huge =
        huge && HUGE_PAGES.load(Ordering::Relaxed) && advise(&map, start, len, Advice::HugePage);
    Some(Mapping {
        map,
        start,
        len,
        huge: AtomicBool::new(huge),
    })
}

impl Mapping {
    /// Faults in the huge pages that start in `range` of the buffer, which its caller
    /// is about to write and holds alone, one by one and timed: a slow one turns huge
    /// pages off, for the rest of this buffer and for later mappings. Ordinary pages
    /// are left to fault as they are written (populating them here, before the writes,
    /// measured no faster: 23.0 against 21.5 ms to mobilenet_v2's first output).
    fn fault_in(&self, range: std::ops::Range<usize>) {
        let end = range.end.min(self.len);
        let mut block = range.start.next_multiple_of(HUGE_PAGE);
        while self.huge.load(Ordering::Relaxed) && block < end {
            if !HUGE_PAGES.load(Ordering::Relaxed) {
                advise(
                    &self.map,
                    self.start + block,
                    self.len - block,
                    Advice::NoHugePage,
                );
                self.huge.store(false, Ordering::Relaxed);
                break;
            }
            let t = Instant::now();
            // A write fault: a read would map the shared zero page. A kernel that
            // cannot populate (before Linux 5.14) cannot be probed: no huge pages.
            let probed = advise(&self.map, self.start + block, 1, Advice::PopulateWrite);
            if !probed || t.elapsed() > SLOW_HUGE_PAGE {
                HUGE_PAGES.store(false, Ordering::Relaxed);
            }
            block += HUGE_PAGE;
        }
    }
}

/// What [`advise`] asks of the system for a range of a mapping.
#[derive(Clone, Copy)]
enum Advice {
    HugePage,
    NoHugePage,
    /// Fault the pages in, writable, now.
    PopulateWrite,
}

/// Gives `advice` for `bytes` of `map` from `offset`; whether the system took it. A
/// refusal (no transparent huge pages, an older kernel) changes nothing: pages are
/// then ordinary ones, faulted in as they are first written.
#[cfg(target_os = "linux")]
fn advise(map: &MmapMut, offset: usize, bytes: usize, advice: Advice) -> bool {
    let advice = match advice {
        Advice::HugePage => memmap2::Advice::HugePage,
        Advice::NoHugePage => memmap2::Advice::NoHugePage,
        Advice::PopulateWrite => memmap2::Advice::PopulateWrite,
    };
    map.advise_range(advice, offset, bytes).is_ok()
}

#[cfg(not(target_os = "linux"))]
fn advise(_map: &MmapMut, _offset: usize, _bytes: usize, _advice: Advice) -> bool {
    false
}

/// Temporaries for a pass that builds many layers one after another, such as a
/// method's load, where each layer rearranges its weights through a temporary before
/// packing them. A buffer given back is kept and lent again, so its pages are faulted
/// in once for the pass instead of once per layer; dropping the `Staging` frees it.
///
/// resnet18's 3×3 layers that are not Winograd's rearrange 35 MB of weights this way.
/// Its load, one thread, interleaved, medians of 15, without huge pages: 64.4 → 56.8
/// ms; with them, 3,351 → 2,841 page faults.
pub struct Staging {
    /// The largest buffer given back and not lent since; `None` also while it is out.
    spare: Mutex<Option<Zeroed<u8>>>,
    /// Whether given-back buffers are kept ([`Staging::passing`] keeps none).
    keeps: bool,
}

impl Default for Staging {
    fn default() -> Self {
        Self::new()
    }
}

impl Staging {
    /// A staging that keeps what is given back until it is dropped.
    pub const fn new() -> Self {
        Staging {
            spare: Mutex::new(None),
            keeps: true,
        }
    }

    /// A staging that keeps nothing: each buffer is freed when given back. For work
    /// outside any pass (a layer rebuilt during an execution), which must not hold
    /// memory after it.
    pub const fn passing() -> Self {
        Staging {
            spare: Mutex::new(None),
            keeps: false,
        }
    }

    /// `len` values of `T` for the caller alone until the guard drops, 64-byte
    /// aligned; what they hold is left from an earlier use (zero when fresh). `None`
    /// when the system refuses the memory.
    pub fn take<T: bytemuck::Pod>(&self, len: usize) -> Option<Staged<'_, T>> {
        let bytes = len.checked_mul(size_of::<T>())?;
        let spare = self.lock().take().filter(|b| b.len() >= bytes);
        // Too small a spare is freed before the larger buffer is made.
        let buf = match spare {
            Some(b) => b,
            None => Zeroed::try_new(bytes)?,
        };
        Some(Staged {
            buf,
            len,
            home: self,
            elem: PhantomData,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Zeroed<u8>>> {
        self.spare
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A buffer lent by a [`Staging`], given back when dropped.
pub struct Staged<'a, T> {
    buf: Zeroed<u8>,
    /// Values of `T` (the buffer may be longer).
    len: usize,
    home: &'a Staging,
    elem: PhantomData<T>,
}

impl<T: bytemuck::Pod> std::ops::Deref for Staged<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        let bytes = self
            .buf
            .get(..self.len * size_of::<T>())
            .unwrap_or_default();
        // The buffer starts on a 64-byte boundary.
        bytemuck::try_cast_slice(bytes).unwrap_or_default()
    }
}

impl<T: bytemuck::Pod> std::ops::DerefMut for Staged<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let n = self.len * size_of::<T>();
        let bytes = self.buf.get_mut(..n).unwrap_or_default();
        bytemuck::try_cast_slice_mut(bytes).unwrap_or_default()
    }
}

impl<T> Drop for Staged<'_, T> {
    fn drop(&mut self) {
        if !self.home.keeps {
            return;
        }
        let mut spare = self.home.lock();
        // Of two buffers out at once, the larger is kept.
        if spare.as_ref().is_none_or(|s| s.len() < self.buf.len()) {
            *spare = Some(std::mem::take(&mut self.buf));
        }
    }
}

/// The mapping that shared buffers are being cut from.
struct Chunks(Mutex<Option<Current>>);

struct Current {
    /// Weak: the mapping goes when its last buffer does.
    chunk: Weak<Mapping>,
    /// Its first byte on a 2 MiB boundary.
    base: NonNull<u8>,
    /// Bytes from `base` already handed out.
    used: usize,
}

// SAFETY: the pointer is only read or advanced under the mutex.
unsafe impl Send for Chunks {}
// SAFETY: as above.
unsafe impl Sync for Chunks {}

static CHUNKS: Chunks = Chunks(Mutex::new(None));

impl Chunks {
    /// `bytes` (at most `CHUNK`) of zeroed memory no other buffer has, and the mapping
    /// they lie in; `None` when no mapping can be made.
    fn cut(&self, bytes: usize) -> Option<(Arc<Mapping>, NonNull<u8>)> {
        let mut current = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let rounded = bytes.checked_next_multiple_of(ALIGN)?;
        if let Some(c) = current.as_mut() {
            if let Some(chunk) = c.chunk.upgrade().filter(|_| CHUNK - c.used >= rounded) {
                // SAFETY: `used + rounded <= CHUNK`, inside the live mapping.
                let ptr = unsafe { c.base.add(c.used) };
                chunk.fault_in(c.used..c.used + rounded);
                c.used += rounded;
                return Some((chunk, ptr));
            }
        }
        // A new mapping; what is left of the old one stays unused (and untouched).
        let mut chunk = map(CHUNK, true)?;
        let start = chunk.start;
        let base = NonNull::new(chunk.map.get_mut(start..)?.as_mut_ptr())?;
        chunk.fault_in(0..rounded);
        let chunk = Arc::new(chunk);
        *current = Some(Current {
            chunk: Arc::downgrade(&chunk),
            base,
            used: rounded,
        });
        Some((chunk, base))
    }
}

/// Gives back the pages of the shared mapping being cut that no buffer holds yet. A
/// huge page is resident whole from its first buffer on, and the last one a program's
/// weights reach is mostly empty (mobilenet_v2's held 1.9 MiB of nothing); a pass that
/// cuts many buffers (a method's load) calls this at its end. Buffers cut there later
/// fault their pages in again, zeroed.
pub fn trim_shared() {
    #[cfg(unix)]
    CHUNKS.trim();
}

impl Chunks {
    #[cfg(unix)]
    fn trim(&self) {
        const PAGE: usize = 4096;
        let current = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(c) = current.as_ref() else {
            return;
        };
        let Some(chunk) = c.chunk.upgrade() else {
            return;
        };
        // Only the huge page holding the end of what was cut can be resident past it
        // (`fault_in` touches the huge pages that start inside a cut).
        let from = chunk.start + c.used.next_multiple_of(PAGE);
        let to = chunk.start + c.used.next_multiple_of(HUGE_PAGE).min(CHUNK);
        if to > from {
            // SAFETY: no buffer holds these bytes (cuts only move forward, and the
            // lock keeps others from cutting now); a later cut reads them as zeros,
            // which a private anonymous mapping gives after `MADV_DONTNEED`. A refusal
            // leaves them resident, which changes nothing but memory.
            let _ = unsafe {
                chunk.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    from,
                    to - from,
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_and_aligned_at_every_size() {
        for n in [
            0,
            1,
            1000,
            SPARSE_MAP_FROM / 4 - 1,
            SPARSE_MAP_FROM / 4,
            MAP_FROM / 4 - 1,
            MAP_FROM / 4,
            MAP_FROM / 4 * 3 + 17,
        ] {
            for v in [
                Zeroed::<f32>::try_new(n),
                Zeroed::<f32>::try_shared(n),
                Zeroed::<f32>::try_sparse(n),
            ] {
                let mut v = v.unwrap();
                assert_eq!(v.len(), n);
                assert!((v.as_ptr() as usize).is_multiple_of(ALIGN), "{n}");
                assert!(v.iter().all(|&x| x == 0.0), "{n}");
                v.fill(2.0);
                assert!(v.iter().all(|&x| x == 2.0), "{n}");
            }
        }
    }

    #[test]
    fn sparse_buffers_are_mappings_from_their_threshold_on() {
        let below = Zeroed::<u8>::try_sparse(SPARSE_MAP_FROM - 1).unwrap();
        assert!(matches!(below.store, Store::Heap(_)));
        for n in [SPARSE_MAP_FROM, MAP_FROM - 1] {
            let v = Zeroed::<u8>::try_sparse(n).unwrap();
            assert!(matches!(v.store, Store::Mapped(_)), "{n}");
        }
        // Buffers that are faulted in at once stay on the heap below `MAP_FROM`.
        let owned = Zeroed::<u8>::try_new(SPARSE_MAP_FROM).unwrap();
        assert!(matches!(owned.store, Store::Heap(_)));
    }

    #[test]
    fn shared_buffers_do_not_overlap_and_outlive_each_other() {
        // More than a chunk's worth, in sizes that are not multiples of a line.
        let mut bufs: Vec<Zeroed<u32>> = (0..40)
            .map(|i| Zeroed::try_shared(CHUNK / 4 / 16 + i * 7).unwrap())
            .collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.fill(i as u32);
        }
        // Dropping some frees nothing the others use.
        let kept: Vec<_> = bufs.into_iter().step_by(3).collect();
        for (k, b) in kept.iter().enumerate() {
            assert!(b.iter().all(|&x| x == (k * 3) as u32));
        }
        // Pieces are cut from fresh memory only: a new buffer is zeroed although
        // earlier ones of the same mapping were written and dropped.
        assert!(Zeroed::<u32>::try_shared(100)
            .unwrap()
            .iter()
            .all(|&x| x == 0));
    }

    #[test]
    fn buffers_are_zeroed_and_writable_once_huge_pages_are_off() {
        // As after a slow huge page; other tests of this process then get ordinary
        // pages too, which they must work with as well.
        let shared = Zeroed::<u8>::try_shared(3 * HUGE_PAGE / 2).unwrap();
        HUGE_PAGES.store(false, Ordering::Relaxed);
        for mut v in [
            Zeroed::<u8>::try_new(5 * HUGE_PAGE / 2).unwrap(),
            Zeroed::<u8>::try_shared(3 * HUGE_PAGE / 2).unwrap(),
        ] {
            assert!(v.iter().all(|&x| x == 0));
            v.fill(1);
            assert!(v.iter().all(|&x| x == 1));
        }
        assert!(shared.iter().all(|&x| x == 0));
    }

    #[test]
    fn trimming_keeps_what_was_cut_and_later_cuts_are_zeroed() {
        let mut before: Vec<Zeroed<u8>> = (1..20)
            .map(|i| Zeroed::try_shared(i * 1000 + 3).unwrap())
            .collect();
        for (i, b) in before.iter_mut().enumerate() {
            b.fill(i as u8 + 1);
        }
        trim_shared();
        let mut after: Vec<Zeroed<u8>> = (1..20)
            .map(|i| Zeroed::try_shared(i * 900 + 5).unwrap())
            .collect();
        for b in &mut after {
            assert!(b.iter().all(|&x| x == 0));
            b.fill(0xff);
        }
        for (i, b) in before.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8 + 1));
        }
    }

    #[test]
    fn clones_are_buffers_of_their_own() {
        let mut a = Zeroed::<i32>::try_shared(100).unwrap();
        a[7] = 3;
        let mut b = a.clone();
        b[7] = 4;
        assert_eq!((a[7], b[7], b.len()), (3, 4, 100));
    }

    #[test]
    fn buffers_move_between_threads() {
        let mut b = Zeroed::<f64>::try_shared(1000).unwrap();
        b[999] = 2.0;
        let b = std::thread::spawn(move || b).join().unwrap();
        assert_eq!(b[999], 2.0);
    }

    #[test]
    fn staging_lends_a_given_back_buffer_again() {
        let staging = Staging::new();
        let first = {
            let mut a = staging.take::<f32>(1000).unwrap();
            assert_eq!(a.len(), 1000);
            a.fill(2.0);
            a.as_ptr()
        };
        // A smaller request reuses it, contents and all.
        let b = staging.take::<u32>(10).unwrap();
        assert_eq!(
            (b.as_ptr().cast::<f32>(), b.len(), b[3]),
            (first, 10, 2f32.to_bits())
        );
        // While it is out, another request gets a buffer of its own, zeroed.
        let c = staging.take::<f32>(5).unwrap();
        assert!(c.as_ptr() != first && c.iter().all(|&x| x == 0.0));
        drop((b, c));
        // Of the two, the larger stayed; a larger request replaces it.
        assert_eq!(staging.take::<f32>(1000).unwrap().as_ptr(), first);
        let d = staging.take::<f64>(1000).unwrap();
        assert!((d.as_ptr() as usize).is_multiple_of(ALIGN) && d.len() == 1000);
    }

    #[test]
    fn a_passing_staging_keeps_nothing() {
        let staging = Staging::passing();
        drop(staging.take::<u8>(100).unwrap());
        assert!(staging.lock().is_none());
        assert!(Staging::new().take::<u64>(usize::MAX / 4).is_none());
    }

    #[test]
    fn impossible_sizes_fail_cleanly() {
        assert!(Zeroed::<u64>::try_new(usize::MAX / 4).is_none());
        assert!(Zeroed::<u64>::try_shared(usize::MAX / 4).is_none());
        assert!(Zeroed::<u8>::try_new(1 << 60).is_none());
    }
}
