//! Large zeroed buffers whose memory comes in 2 MiB pages where Linux offers them
//! (transparent huge pages in `madvise` mode, a common default).
//!
//! The first touch of each 4 KiB page of fresh memory is a page fault. On a virtual
//! machine that accounts memory per control group one costs 2-3 µs: regnet_y_400mf's
//! 17 MB file read into memory and its 17 MB of packed weights took 11,000 of them, a
//! third of the time from opening the program to its first output. A buffer of at
//! least [`HUGE_FROM`] bytes asks the kernel for huge pages before it is zeroed (one
//! fault per 2 MiB); elsewhere, or when the kernel declines, it is an ordinary zeroed
//! allocation.

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

use std::alloc::Layout;

/// Buffers from this size on ask for huge pages (smaller ones would hold few).
pub const HUGE_FROM: usize = 4 << 20;

/// `n` zeroed values, or `None` when the allocation fails.
pub fn try_zeroed_vec<T: bytemuck::Zeroable>(n: usize) -> Option<Vec<T>> {
    let layout = Layout::array::<T>(n).ok()?;
    if layout.size() < HUGE_FROM || !cfg!(target_os = "linux") {
        return bytemuck::allocation::try_zeroed_vec(n).ok();
    }
    // SAFETY: `layout` has a non-zero size (at least HUGE_FROM).
    let ptr = unsafe { std::alloc::alloc(layout) };
    if ptr.is_null() {
        return None;
    }
    advise_huge_pages(ptr, layout.size());
    // SAFETY: `ptr` is a fresh allocation of `layout` (an array of `n` T) from the
    // global allocator, as `Vec` allocates; zero bytes are a valid `T` (`Zeroable`).
    unsafe {
        ptr.write_bytes(0, layout.size());
        Some(Vec::from_raw_parts(ptr.cast::<T>(), n, n))
    }
}

/// Asks for huge pages over the whole 2 MiB pages inside `len` bytes from `ptr`.
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    const HUGE_PAGE: usize = 2 << 20;
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize).saturating_add(len) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: the range lies inside an allocation this process owns; the advice
        // changes how its pages are backed, never their contents. A refusal (no
        // transparent huge pages) leaves ordinary pages, so the result is ignored.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_at_every_size() {
        for n in [
            0,
            1,
            1000,
            HUGE_FROM / 4 - 1,
            HUGE_FROM / 4,
            HUGE_FROM / 4 * 3 + 17,
        ] {
            let v = try_zeroed_vec::<f32>(n).unwrap();
            assert_eq!((v.len(), v.capacity()), (n, n));
            assert!(v.iter().all(|&x| x == 0.0), "{n}");
        }
        #[derive(Clone, Copy, bytemuck::Zeroable)]
        #[repr(C, align(64))]
        struct Line([u8; 64]);
        let lines = try_zeroed_vec::<Line>(HUGE_FROM / 64 + 3).unwrap();
        assert_eq!(lines.as_ptr() as usize % 64, 0);
        assert!(lines.iter().all(|l| l.0 == [0; 64]));
    }

    #[test]
    fn impossible_sizes_fail_cleanly() {
        assert!(try_zeroed_vec::<u64>(usize::MAX / 4).is_none());
    }
}
