//! The counting allocator counts what the process allocates, and nothing else.

#[global_allocator]
static COUNTING: pte_alloc::CountingAllocator = pte_alloc::CountingAllocator;

#[test]
fn allocations_are_counted() {
    let before = pte_alloc::allocations();
    let mut v: Vec<u64> = Vec::with_capacity(3);
    v.extend([1, 2, 3, 4]); // grows: a reallocation
    let made = pte_alloc::allocations() - before;
    assert!(made >= 2, "{made} allocations counted");
    let before = pte_alloc::allocations();
    let sum: u64 = v.iter().sum();
    drop(v);
    assert_eq!(sum, 10);
    assert_eq!(
        pte_alloc::allocations(),
        before,
        "freeing is not an allocation"
    );
}
