//! Products against an f64 reference on many shapes, every available instruction set,
//! every operand kind, strided views, epilogues, 1 and 2 threads.
//! Tolerance: |got - want| <= 1e-5 · (Σ|a·b| + |bias| + |c| + 1), a bound on f32
//! accumulation error for the depths used here.

use super::*;

/// Deterministic values in [-1, 1).
pub(crate) fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

struct Case {
    m: usize,
    n: usize,
    k: usize,
}

fn reference(
    a: &MatRef<'_>,
    b: &MatRef<'_>,
    c0: &[f32],
    epi: &Epilogue<'_>,
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let m = a.rows();
    let k = a.cols();
    let mut out = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            let mut g = 1.0f64;
            for p in 0..k {
                let v = f64::from(a.at(i, p)) * f64::from(b.at(p, j));
                s += v;
                g += v.abs();
            }
            let bias = match epi.bias {
                Bias::Row(v) => f64::from(v[i]),
                Bias::Col(v) => f64::from(v[j]),
                Bias::None => 0.0,
            };
            let old = if epi.accumulate {
                f64::from(c0[i * n + j])
            } else {
                0.0
            };
            s += bias + old;
            g += bias.abs() + old.abs();
            out[i * n + j] = f64::from(epi.activation.apply_scalar(s as f32));
            mag[i * n + j] = g;
        }
    }
    (out, mag)
}

fn check(gemm: &Gemm, pool: &ThreadPool, case: &Case, variant: usize) {
    let Case { m, n, k } = *case;
    // Every epilogue meets both layouts of A (read in place or packed) in variants 0..8.
    let a_t = variant / 4 % 2 == 1;
    let b_t = variant / 2 % 2 == 1;
    // A and B stored with padding between rows, possibly transposed.
    let (a_rs, b_rs) = (k + 3, n + 5);
    let a_store = values(
        (if a_t { k * (m + 2) } else { m * a_rs }).max(1),
        1 + variant as u32,
    );
    let b_store = values(
        (if b_t { n * (k + 4) } else { k * b_rs }).max(1),
        7 + variant as u32,
    );
    let a = if a_t {
        MatRef::new(&a_store, m, k, 1, m + 2).unwrap()
    } else {
        MatRef::new(&a_store, m, k, a_rs, 1).unwrap()
    };
    let b = if b_t {
        MatRef::new(&b_store, k, n, 1, k + 4).unwrap()
    } else {
        MatRef::new(&b_store, k, n, b_rs, 1).unwrap()
    };
    let row_bias = values(m, 3);
    let col_bias = values(n, 4);
    let epilogues = [
        Epilogue::default(),
        Epilogue {
            accumulate: true,
            bias: Bias::Row(&row_bias),
            activation: Activation::RELU,
        },
        Epilogue {
            accumulate: false,
            bias: Bias::Col(&col_bias),
            activation: Activation::Clamp {
                min: -0.5,
                max: 0.5,
            },
        },
        Epilogue {
            accumulate: true,
            bias: Bias::None,
            activation: Activation::Gelu,
        },
    ];
    let epi = &epilogues[variant % epilogues.len()];
    let packed_a = gemm.pack_a(a).unwrap();
    let packed_b = gemm.pack_b(b).unwrap();
    let lhs = [Lhs::Mat(a), Lhs::Packed(&packed_a)];
    let rhs = [Rhs::Mat(b), Rhs::Packed(&packed_b)];
    for (li, l) in lhs.iter().enumerate() {
        for (ri, r) in rhs.iter().enumerate() {
            // C row-major with padding, or column-major on odd variants.
            let c_col = variant % 3 == 2;
            let c_len = if c_col { n * (m + 1) } else { m * (n + 2) };
            let init = values(c_len.max(1), 9);
            let mut c_store = init.clone();
            let c0: Vec<f32> = (0..m * n)
                .map(|x| {
                    if c_col {
                        init[x % n * (m + 1) + x / n]
                    } else {
                        init[x / n * (n + 2) + x % n]
                    }
                })
                .collect();
            let c = if c_col {
                MatMut::new(&mut c_store, m, n, 1, m + 1).unwrap()
            } else {
                MatMut::new(&mut c_store, m, n, n + 2, 1).unwrap()
            };
            let len = gemm
                .scratch_len(m, n, k, li == 1, ri == 1, pool.threads())
                .unwrap();
            let mut scratch = vec![f32::NAN; len];
            gemm.run(pool, c, *l, *r, epi, &mut scratch).unwrap();
            let (want, mag) = reference(&a, &b, &c0, epi, n);
            for i in 0..m {
                for j in 0..n {
                    let got = if c_col {
                        c_store[j * (m + 1) + i]
                    } else {
                        c_store[i * (n + 2) + j]
                    };
                    let w = want[i * n + j];
                    assert!(
                        (f64::from(got) - w).abs() <= 1e-5 * mag[i * n + j],
                        "{:?} {m}x{n}x{k} variant {variant} lhs {li} rhs {ri} threads {} at ({i},{j}): {got} vs {w}",
                        gemm.isa(),
                        pool.threads()
                    );
                }
            }
            // Padding between rows is untouched.
            if !c_col && n > 0 {
                for i in 0..m {
                    for j in n..n + 2 {
                        assert_eq!(
                            c_store[i * (n + 2) + j].to_bits(),
                            init[i * (n + 2) + j].to_bits()
                        );
                    }
                }
            }
        }
    }
}

fn shapes(gemm: &Gemm) -> Vec<Case> {
    let (mr, nr) = (gemm.mr, gemm.nr);
    let mut v = Vec::new();
    for &m in &[0, 1, 2, mr - 1, mr, mr + 1, 2 * mr + 3] {
        for &n in &[1, nr - 1, nr, nr + 1, 3 * nr + 2] {
            for &k in &[0, 1, 7, 64] {
                v.push(Case { m, n, k });
            }
        }
    }
    // Around the block sizes.
    v.push(Case {
        m: gemm.mc + 1,
        n: 2 * nr + 1,
        k: KC + 1,
    });
    v.push(Case {
        m: 3,
        n: gemm.nc + nr + 3,
        k: 20,
    });
    // Several runs of panels per row tile of the in-place path (the last one short).
    let per_run = L2_PANEL_BYTES / (KC * nr * 4);
    v.push(Case {
        m: 2 * mr + 1,
        n: 2 * per_run * nr + 5,
        k: KC + 7,
    });
    v.push(Case {
        m: 2 * gemm.mc + mr + 1,
        n: 5,
        k: 2 * KC + 3,
    });
    // A few rows over more than one depth block: packed weights swept whole-depth.
    v.push(Case {
        m: 1,
        n: 3 * nr + 2,
        k: 2 * KC + 5,
    });
    v.push(Case {
        m: GEMV_ROWS,
        n: nr + 1,
        k: KC + 9,
    });
    v
}

#[test]
fn products_match_the_reference() {
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    for isa in Isa::available() {
        let gemm = Gemm::with_isa(isa).unwrap();
        for (i, case) in shapes(&gemm).iter().enumerate() {
            // Every case on one thread; the larger ones on two as well.
            // Cases beyond a block size meet every variant; the others one each.
            let beyond = case.k > KC || case.m > gemm.mc || case.n > gemm.nc;
            for variant in if beyond { 0..8 } else { i % 8..i % 8 + 1 } {
                check(&gemm, &pools[0], case, variant);
            }
            if case.m * case.n * case.k >= PARALLEL_WORK / 64 {
                check(&gemm, &pools[1], case, (i + 1) % 8);
            }
        }
    }
}

#[test]
fn one_row_products_split_their_columns_over_threads() {
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    // Columns in whole groups of DOT_ROWS and a tail, in whole groups of panels (at
    // every panel width up to 32) and single panels, depths in whole vectors and a
    // tail, over threads once B has enough values.
    let n = 9 * 32 + DOT_ROWS - 1;
    let k = (VECTOR_SPLIT_VALUES / n).next_multiple_of(16) + 13;
    let case = Case { m: 1, n, k };
    for isa in Isa::available() {
        let gemm = Gemm::with_isa(isa).unwrap();
        for variant in 0..8 {
            for pool in &pools {
                check(&gemm, pool, &case, variant);
            }
        }
    }
}

#[test]
fn two_threads_split_either_way() {
    let pool = ThreadPool::new(2).unwrap();
    for isa in Isa::available() {
        let gemm = Gemm::with_isa(isa).unwrap();
        for case in [
            Case {
                m: 8,
                n: 300,
                k: 100,
            },
            Case {
                m: 301,
                n: 9,
                k: 100,
            },
            Case {
                m: 97,
                n: 131,
                k: 40,
            },
        ] {
            for variant in 0..8 {
                check(&gemm, &pool, &case, variant);
            }
        }
    }
}

#[test]
fn errors_are_reported() {
    let gemm = Gemm::new();
    let pool = ThreadPool::new(1).unwrap();
    let a = values(6, 1);
    let b = values(6, 2);
    let mut c = vec![0.0; 4];
    let am = MatRef::row_major(&a, 2, 3).unwrap();
    let bm = MatRef::row_major(&b, 2, 3).unwrap();
    let e = gemm.run(
        &pool,
        MatMut::row_major(&mut c, 2, 2).unwrap(),
        Lhs::Mat(am),
        Rhs::Mat(bm),
        &Epilogue::default(),
        &mut [],
    );
    assert!(matches!(e, Err(Error::ShapeMismatch { .. })));
    let bm = MatRef::row_major(&b, 3, 2).unwrap();
    let short = [0.0; 1];
    let epi = Epilogue {
        bias: Bias::Col(&short),
        ..Epilogue::default()
    };
    let e = gemm.run(
        &pool,
        MatMut::row_major(&mut c, 2, 2).unwrap(),
        Lhs::Mat(am),
        Rhs::Mat(bm),
        &epi,
        &mut [],
    );
    assert!(matches!(e, Err(Error::BufferTooSmall { .. })));
    let e = gemm.run(
        &pool,
        MatMut::row_major(&mut c, 2, 2).unwrap(),
        Lhs::Mat(am),
        Rhs::Mat(bm),
        &Epilogue::default(),
        &mut [],
    );
    assert!(matches!(e, Err(Error::ScratchTooSmall { .. })));
    if let Some(other) = Isa::available().find(|&i| i != gemm.isa()) {
        let packed = Gemm::with_isa(other).unwrap().pack_b(bm).unwrap();
        let mut s = vec![0.0; 10_000];
        let e = gemm.run(
            &pool,
            MatMut::row_major(&mut c, 2, 2).unwrap(),
            Lhs::Mat(am),
            Rhs::Packed(&packed),
            &Epilogue::default(),
            &mut s,
        );
        assert!(matches!(e, Err(Error::PackingMismatch { .. })));
    }
}

/// A pool with more threads than a product splits into: the product still gets the
/// scratch the pool hands out per thread.
#[test]
fn products_split_over_fewer_tasks_than_threads() {
    let pool = ThreadPool::new(4).unwrap();
    let gemm = Gemm::new();
    for case in [
        Case {
            m: 18,
            n: 16,
            k: 1400,
        },
        Case {
            m: 12,
            n: 40,
            k: 700,
        },
        Case {
            m: 200,
            n: 48,
            k: 64,
        },
    ] {
        for variant in 0..8 {
            check(&gemm, &pool, &case, variant);
        }
    }
}

/// Packing slab by slab gives the panels of packing at once, for widths and depths
/// below, at and above a slab and a panel, on 1 and 2 threads, and reports each
/// value of the transposed operand once, in order, slab by slab.
#[test]
fn slab_by_slab_packing_equals_packing_at_once() {
    for isa in Isa::available() {
        let gemm = Gemm::with_isa(isa).unwrap();
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads).unwrap();
            for (n, k) in [
                (1, 1),
                (5, 3),
                (17, 40),
                (300, 1000),
                (1000, 1280),
                (70, 5000),
            ] {
                let bt = values(n * k, (n + k) as u32);
                let at_once = gemm
                    .pack_b_on(&pool, MatRef::row_major(&bt, n, k).unwrap().t())
                    .unwrap();
                let mut parts = Vec::new();
                let slabs = gemm
                    .pack_bt_on(&pool, &bt, n, k, &mut |part| {
                        let at = (part.as_ptr() as usize - bt.as_ptr() as usize) / 4;
                        parts.push(at..at + part.len());
                    })
                    .unwrap();
                let case = format!("{isa:?} n {n} k {k} ({threads} threads)");
                let same = at_once.panels().data().iter().map(|v| v.to_bits());
                assert!(
                    same.eq(slabs.panels().data().iter().map(|v| v.to_bits())),
                    "{case}"
                );
                // Slabs of whole panels of B's columns, at most 1 MiB unless one panel
                // is more.
                let mut next = 0;
                for part in &parts {
                    assert_eq!(part.start, next, "{case}: {parts:?}");
                    assert!(part.start / k % gemm.nr == 0, "{case}: {parts:?}");
                    assert!(part.len() * 4 <= (1 << 20).max(gemm.nr * k * 4), "{case}");
                    next = part.end;
                }
                assert_eq!(next, bt.len(), "{case}: {parts:?}");
                if n * k * 4 > 1 << 21 {
                    assert!(parts.len() > 1, "{case}: {parts:?}");
                }
            }
        }
    }
}

/// A slab of the wrong width, or an operand finished before its last slab, is an
/// error.
#[test]
fn slabs_out_of_turn_are_errors() {
    let gemm = Gemm::new();
    let pool = ThreadPool::new(1).unwrap();
    let bt = values(40 * 8, 1);
    let mut slabs = gemm.slabs_b(&pool, 8, 40).unwrap();
    let cols = slabs.next_columns().unwrap();
    assert_eq!(cols, 0..40);
    let short = MatRef::row_major(&bt[..39 * 8], 39, 8).unwrap();
    assert!(matches!(
        slabs.pack(short),
        Err(Error::ShapeMismatch { .. })
    ));
    let shallow = MatRef::row_major(&bt[..40 * 7], 40, 7).unwrap();
    assert!(matches!(
        slabs.pack(shallow),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        gemm.slabs_b(&pool, 8, 40).unwrap().finish(),
        Err(Error::ShapeMismatch { .. })
    ));
    slabs.pack(MatRef::row_major(&bt, 40, 8).unwrap()).unwrap();
    assert_eq!(slabs.next_columns(), None);
    slabs.finish().unwrap();
}
