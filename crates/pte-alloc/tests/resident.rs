//! A dropped shared buffer leaves the resident set although its mapping lives on.

#[cfg(target_os = "linux")]
#[test]
fn dropped_shared_buffers_give_their_pages_back() {
    fn resident_bytes() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }
    // A neighbour before and after keeps the mapping alive.
    let before = pte_alloc::Zeroed::<u8>::try_shared(1000).unwrap();
    let mut piece = pte_alloc::Zeroed::<u8>::try_shared(3 << 20).unwrap();
    let mut after = pte_alloc::Zeroed::<u8>::try_shared(1000).unwrap();
    piece.fill(7);
    after.fill(9);
    let full = resident_bytes();
    drop(piece);
    let freed = full.saturating_sub(resident_bytes());
    assert!(freed >= 2 << 20, "{freed} bytes left the resident set");
    assert!(before.iter().all(|&b| b == 0) && after.iter().all(|&b| b == 9));
}
