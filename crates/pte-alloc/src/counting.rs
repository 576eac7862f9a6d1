//! The system's allocator, counting its calls. A program installs it with
//! `#[global_allocator]` to see how many heap allocations something makes: `pte bench`
//! reports them per execution, tests assert that steady-state execution makes none.
//! One relaxed atomic increment per allocation.

// Implementing `GlobalAlloc` is `unsafe` by definition; every call is forwarded.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting allocations and reallocations (see [`allocations`]).
pub struct CountingAllocator;

// SAFETY: every method forwards to the system allocator with the caller's arguments
// unchanged, so `System`'s guarantees are this allocator's; the count has no effect on
// memory.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations (and reallocations) made so far by every thread of the process, when
/// [`CountingAllocator`] is its global allocator (else 0).
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}
