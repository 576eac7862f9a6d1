//! Selection and sorting that leave equal elements where the C++ standard library
//! (libstdc++) leaves them. PyTorch's `topk` exposes that order: ties come out as
//! `std::partial_sort`, `std::nth_element` and `std::sort` arrange them, and with
//! `sorted=False` the result is `nth_element`'s arrangement itself. These are the same
//! algorithms (heap select, introselect with median-of-three pivots, introsort with a final
//! insertion sort), written from their definitions so that the same comparisons on the
//! same sequence give the same permutation.
//!
//! Every function works on positions `first..last` of `q` and compares elements with
//! `less` (a strict weak order). Reads and writes outside `q` are ignored rather than
//! trusted: the loops that rely on a sentinel are bounded as well.

fn get(q: &[usize], i: usize) -> usize {
    q.get(i).copied().unwrap_or_default()
}

fn put(q: &mut [usize], i: usize, v: usize) {
    if let Some(s) = q.get_mut(i) {
        *s = v;
    }
}

fn swap(q: &mut [usize], a: usize, b: usize) {
    if a < q.len() && b < q.len() {
        q.swap(a, b);
    }
}

/// `floor(log2(n))` for `n > 0`.
fn lg(n: usize) -> usize {
    n.checked_ilog2().unwrap_or(0) as usize
}

/// `std::partial_sort(first, first + k, end)` over all of `q`: the `k` first elements in
/// order, the rest in heap-select order.
pub fn partial_sort(q: &mut [usize], k: usize, less: &impl Fn(usize, usize) -> bool) {
    let k = k.min(q.len());
    heap_select(q, 0, k, q.len(), less);
    sort_heap(q, 0, k, less);
}

/// `std::nth_element(begin, begin + nth, end)` over all of `q`.
pub fn nth_element(q: &mut [usize], nth: usize, less: &impl Fn(usize, usize) -> bool) {
    let len = q.len();
    if len == 0 || nth >= len {
        return;
    }
    introselect(q, 0, nth, len, lg(len) * 2, less);
}

/// `std::sort(begin, begin + end)`.
pub fn sort(q: &mut [usize], end: usize, less: &impl Fn(usize, usize) -> bool) {
    let end = end.min(q.len());
    if end == 0 {
        return;
    }
    introsort_loop(q, 0, end, lg(end) * 2, less);
    final_insertion_sort(q, 0, end, less);
}

fn push_heap(
    q: &mut [usize],
    first: usize,
    mut hole: usize,
    top: usize,
    value: usize,
    less: &impl Fn(usize, usize) -> bool,
) {
    let mut parent = hole.saturating_sub(1) / 2;
    while hole > top && less(get(q, first + parent), value) {
        put(q, first + hole, get(q, first + parent));
        hole = parent;
        parent = hole.saturating_sub(1) / 2;
    }
    put(q, first + hole, value);
}

fn adjust_heap(
    q: &mut [usize],
    first: usize,
    mut hole: usize,
    len: usize,
    value: usize,
    less: &impl Fn(usize, usize) -> bool,
) {
    let top = hole;
    let mut second = hole;
    while second < len.saturating_sub(1) / 2 {
        second = 2 * (second + 1);
        if less(get(q, first + second), get(q, first + second - 1)) {
            second -= 1;
        }
        put(q, first + hole, get(q, first + second));
        hole = second;
    }
    if len.is_multiple_of(2) && len >= 2 && second == (len - 2) / 2 {
        second = 2 * (second + 1);
        put(q, first + hole, get(q, first + second - 1));
        hole = second - 1;
    }
    push_heap(q, first, hole, top, value, less);
}

fn make_heap(q: &mut [usize], first: usize, last: usize, less: &impl Fn(usize, usize) -> bool) {
    let len = last.saturating_sub(first);
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let value = get(q, first + parent);
        adjust_heap(q, first, parent, len, value, less);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

/// Moves the heap's top to `result` and the element at `result` into the heap.
fn pop_heap(
    q: &mut [usize],
    first: usize,
    last: usize,
    result: usize,
    less: &impl Fn(usize, usize) -> bool,
) {
    let value = get(q, result);
    put(q, result, get(q, first));
    adjust_heap(q, first, 0, last.saturating_sub(first), value, less);
}

fn heap_select(
    q: &mut [usize],
    first: usize,
    middle: usize,
    last: usize,
    less: &impl Fn(usize, usize) -> bool,
) {
    make_heap(q, first, middle, less);
    for i in middle..last {
        if less(get(q, i), get(q, first)) {
            pop_heap(q, first, middle, i, less);
        }
    }
}

fn sort_heap(q: &mut [usize], first: usize, mut last: usize, less: &impl Fn(usize, usize) -> bool) {
    while last.saturating_sub(first) > 1 {
        last -= 1;
        pop_heap(q, first, last, last, less);
    }
}

/// Puts the median of the elements at `a`, `b` and `c` at `result`.
fn move_median_to_first(
    q: &mut [usize],
    result: usize,
    [a, b, c]: [usize; 3],
    less: &impl Fn(usize, usize) -> bool,
) {
    let lt = |x: usize, y: usize| less(get(q, x), get(q, y));
    let median = if lt(a, b) {
        if lt(b, c) {
            b
        } else if lt(a, c) {
            c
        } else {
            a
        }
    } else if lt(a, c) {
        a
    } else if lt(b, c) {
        c
    } else {
        b
    };
    swap(q, result, median);
}

/// Hoare partition of `first..last` around the element at `pivot`; returns the cut.
fn partition(
    q: &mut [usize],
    mut first: usize,
    mut last: usize,
    pivot: usize,
    less: &impl Fn(usize, usize) -> bool,
) -> usize {
    let end = last;
    loop {
        while first < end && less(get(q, first), get(q, pivot)) {
            first += 1;
        }
        last = last.saturating_sub(1);
        while last > 0 && less(get(q, pivot), get(q, last)) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        swap(q, first, last);
        first += 1;
    }
}

fn partition_pivot(
    q: &mut [usize],
    first: usize,
    last: usize,
    less: &impl Fn(usize, usize) -> bool,
) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(q, first, [first + 1, mid, last - 1], less);
    partition(q, first + 1, last, first, less)
}

/// Inserts the element at `last` into the sorted run before it.
fn linear_insert(q: &mut [usize], first: usize, last: usize, less: &impl Fn(usize, usize) -> bool) {
    let value = get(q, last);
    let mut pos = last;
    while pos > first && less(value, get(q, pos - 1)) {
        put(q, pos, get(q, pos - 1));
        pos -= 1;
    }
    put(q, pos, value);
}

fn insertion_sort(
    q: &mut [usize],
    first: usize,
    last: usize,
    less: &impl Fn(usize, usize) -> bool,
) {
    for i in first.saturating_add(1)..last {
        // (Smaller than the first element: the whole run shifts, as std::move_backward.)
        linear_insert(q, first, i, less);
    }
}

fn introselect(
    q: &mut [usize],
    mut first: usize,
    nth: usize,
    mut last: usize,
    mut depth: usize,
    less: &impl Fn(usize, usize) -> bool,
) {
    while last - first > 3 {
        if depth == 0 {
            heap_select(q, first, nth + 1, last, less);
            swap(q, first, nth);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(q, first, last, less);
        if cut <= nth {
            first = cut;
        } else {
            last = cut;
        }
    }
    insertion_sort(q, first, last, less);
}

/// Runs of at most this many elements are left to the final insertion sort.
const THRESHOLD: usize = 16;

fn introsort_loop(
    q: &mut [usize],
    first: usize,
    mut last: usize,
    mut depth: usize,
    less: &impl Fn(usize, usize) -> bool,
) {
    while last - first > THRESHOLD {
        if depth == 0 {
            heap_select(q, first, last, last, less);
            sort_heap(q, first, last, less);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(q, first, last, less);
        introsort_loop(q, cut, last, depth, less);
        last = cut;
    }
}

fn final_insertion_sort(
    q: &mut [usize],
    first: usize,
    last: usize,
    less: &impl Fn(usize, usize) -> bool,
) {
    if last - first > THRESHOLD {
        insertion_sort(q, first, first + THRESHOLD, less);
        for i in first + THRESHOLD..last {
            linear_insert(q, first, i, less);
        }
    } else {
        insertion_sort(q, first, last, less);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every order the functions produce is a permutation that satisfies their contract,
    /// whatever the ties.
    #[test]
    fn contracts_hold_with_ties() {
        for n in 0..70usize {
            let vals: Vec<u32> = (0..n).map(|i| ((i * 7919) % 5) as u32).collect();
            let less = |a: usize, b: usize| vals[a] > vals[b];
            for k in 0..=n {
                let mut q: Vec<usize> = (0..n).collect();
                partial_sort(&mut q, k, &less);
                let mut sorted: Vec<u32> = vals.clone();
                sorted.sort_by(|a, b| b.cmp(a));
                let got: Vec<u32> = q[..k].iter().map(|&i| vals[i]).collect();
                assert_eq!(got, sorted[..k]);
                if k < n {
                    let mut q: Vec<usize> = (0..n).collect();
                    nth_element(&mut q, k, &less);
                    assert_eq!(vals[q[k]], sorted[k]);
                    assert!(q[..k].iter().all(|&i| vals[i] >= sorted[k]));
                    assert!(q[k..].iter().all(|&i| vals[i] <= sorted[k]));
                    sort(&mut q, k, &less);
                    let got: Vec<u32> = q[..k].iter().map(|&i| vals[i]).collect();
                    assert_eq!(got, sorted[..k]);
                    let mut p = q.clone();
                    p.sort_unstable();
                    assert_eq!(p, (0..n).collect::<Vec<_>>());
                }
            }
        }
    }
}
