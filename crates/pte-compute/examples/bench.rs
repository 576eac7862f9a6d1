//! Benchmarks of pte-compute against the `gemm` crate and rayon, printed as tables.
//!
//! `cargo run --release -p pte-compute --example bench [gemm|conv|pool|all] [--quick]`
//!
//! Each figure is the median of several rounds; the rounds of the compared
//! implementations are interleaved so that machine noise hits them alike.

// A benchmark program: a setup failure should stop it loudly.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use pte_compute::{Epilogue, Gemm, Lhs, MatMut, MatRef, Rhs, ThreadPool};

/// Median seconds per call of `f`, timed in `rounds` rounds of at least `min` each.
fn time<F: FnMut()>(f: &mut F, min: Duration) -> f64 {
    f();
    let mut iters = 1u32;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        let e = t.elapsed();
        if e >= min {
            return e.as_secs_f64() / f64::from(iters);
        }
        iters = iters.saturating_mul(2);
    }
}

/// Interleaved rounds of every closure; medians in seconds.
fn race(fs: &mut [&mut dyn FnMut()], rounds: usize, min: Duration) -> Vec<f64> {
    let mut samples = vec![Vec::new(); fs.len()];
    for _ in 0..rounds {
        for (f, s) in fs.iter_mut().zip(samples.iter_mut()) {
            s.push(time(f, min));
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        })
        .collect()
}

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

struct Opts {
    rounds: usize,
    min: Duration,
}

fn bench_gemm(o: &Opts) {
    println!(
        "## GEMM, f32, C = A·B (row-major), GFLOP/s (median of {} rounds)\n",
        o.rounds
    );
    println!("| m | n | k | threads | pte strided | pte packed B | pte packed A | gemm crate |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let shapes = [
        (1024, 1024, 1024),
        (512, 512, 512),
        (256, 256, 256),
        (128, 128, 128),
        (64, 64, 64),
        // transformer encoder d=256, 64 tokens: QKV, out-proj, FFN up and down
        (64, 768, 256),
        (64, 256, 256),
        (64, 1024, 256),
        (64, 256, 1024),
        // resnet18 as NCHW im2col products (c_out x k x pixels)
        (64, 3136, 576),
        (128, 784, 1152),
        (256, 196, 2304),
        (512, 49, 4608),
        // vector-matrix
        (1, 1024, 1024),
    ];
    let g = Gemm::new();
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads).unwrap();
        let par = if threads == 1 {
            gemm::Parallelism::None
        } else {
            gemm::Parallelism::Rayon(threads)
        };
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
            .ok();
        let rayon_pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for &(m, n, k) in &shapes {
            let a = values(m * k);
            let b = values(k * n);
            let mut c = vec![0.0f32; m * n];
            let am = MatRef::row_major(&a, m, k).unwrap();
            let bm = MatRef::row_major(&b, k, n).unwrap();
            let pb = g.pack_b(bm).unwrap();
            let mut scratch = vec![0.0; g.scratch_len(m, n, k, false, false, threads).unwrap()];
            let mut scratch2 = scratch.clone();
            let epi = Epilogue::default();
            let pa = g.pack_a(am).unwrap();
            let mut c4 = vec![0.0f32; m * n];
            let mut scratch4 = scratch.clone();
            let mut packed_a = || {
                let cm = MatMut::row_major(&mut c4, m, n).unwrap();
                g.run(
                    &pool,
                    cm,
                    Lhs::Packed(&pa),
                    Rhs::Mat(bm),
                    &epi,
                    &mut scratch4,
                )
                .unwrap();
            };
            let mut strided = || {
                let cm = MatMut::row_major(&mut c, m, n).unwrap();
                g.run(&pool, cm, Lhs::Mat(am), Rhs::Mat(bm), &epi, &mut scratch)
                    .unwrap();
            };
            let mut c2 = vec![0.0f32; m * n];
            let mut packed = || {
                let cm = MatMut::row_major(&mut c2, m, n).unwrap();
                g.run(
                    &pool,
                    cm,
                    Lhs::Mat(am),
                    Rhs::Packed(&pb),
                    &epi,
                    &mut scratch2,
                )
                .unwrap();
            };
            let mut c3 = vec![0.0f32; m * n];
            let mut theirs = || {
                rayon_pool.install(|| {
                    // SAFETY: row-major buffers of the stated sizes; C does not alias A or B.
                    unsafe {
                        gemm::gemm(
                            m,
                            n,
                            k,
                            c3.as_mut_ptr(),
                            1,
                            n as isize,
                            false,
                            a.as_ptr(),
                            1,
                            k as isize,
                            b.as_ptr(),
                            1,
                            n as isize,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            par,
                        )
                    }
                });
                black_box(&c3);
            };
            let t = race(
                &mut [&mut strided, &mut packed, &mut packed_a, &mut theirs],
                o.rounds,
                o.min,
            );
            let fl = 2.0 * (m * n * k) as f64 / 1e9;
            println!(
                "| {m} | {n} | {k} | {threads} | {:.1} | {:.1} | {:.1} | {:.1} |",
                fl / t[0],
                fl / t[1],
                fl / t[2],
                fl / t[3]
            );
        }
    }
    println!();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let what = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map_or("all", String::as_str);
    let o = if quick {
        Opts {
            rounds: 3,
            min: Duration::from_millis(20),
        }
    } else {
        Opts {
            rounds: 7,
            min: Duration::from_millis(50),
        }
    };
    println!("isa: {}\n", pte_compute::Isa::best().name());
    if what == "gemm" || what == "all" {
        bench_gemm(&o);
    }
}
