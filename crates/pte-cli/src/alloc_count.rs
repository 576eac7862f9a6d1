//! The process's global allocator: the system's, counting calls
//! ([`pte_alloc::CountingAllocator`]), so that `pte bench` reports how many heap
//! allocations an execution makes in the steady state (the runtime's aim is none).

#[global_allocator]
static GLOBAL: pte_alloc::CountingAllocator = pte_alloc::CountingAllocator;

pub use pte_alloc::allocations;
