//! Benchmarks of pte-compute against the `gemm` crate and rayon, printed as tables.
//!
//! `cargo run --release -p pte-compute --example bench [peak|gemm|conv|qconv|nhwc|cold|chain|pool|attention|ops|all] [--quick] [--isa avx2|avx512|generic] [--cpu-time]`
//!
//! Each figure is the median of several rounds; the rounds of the compared
//! implementations are interleaved so that machine noise hits them alike.

// A benchmark program: a setup failure should stop it loudly.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use pte_compute::{
    Activation, Conv2d, Conv2dParams, ConvWeights, Epilogue, Gemm, Isa, Lhs, MatMut, MatRef, Rhs,
    ThreadPool,
};

/// Temporaries for the layers' weights, lent again from one layer to the next.
static STAGING: pte_compute::Staging = pte_compute::Staging::new();

/// Set by `--cpu-time`: time by the process's CPU time instead of the wall clock. On a
/// shared machine a one-thread run is then not charged for the time another process
/// held its core (use it for one-thread rows only: two threads add up their CPU time).
static CPU_TIME: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The process's CPU time (all threads).
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A stopwatch on the wall clock, or on CPU time with `--cpu-time`.
struct Clock(Instant, Duration);

impl Clock {
    fn start() -> Self {
        Clock(Instant::now(), cpu_now())
    }
    fn elapsed(&self) -> Duration {
        if CPU_TIME.load(std::sync::atomic::Ordering::Relaxed) {
            cpu_now() - self.1
        } else {
            self.0.elapsed()
        }
    }
}

/// Median seconds per call of `f`, timed in `rounds` rounds of at least `min` each.
fn time<F: FnMut()>(f: &mut F, min: Duration) -> f64 {
    f();
    let mut iters = 1u32;
    loop {
        let t = Clock::start();
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
    isa: Isa,
    /// `--only TEXT`: the NHWC layers whose names contain it.
    only: Option<String>,
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
        // resnext50 pointwise convolutions (pixels x c_out x c_in)
        (3136, 128, 256),
        (3136, 256, 128),
        (784, 512, 256),
        // vector-matrix
        (1, 1024, 1024),
    ];
    let g = Gemm::with_isa(o.isa).unwrap();
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

/// The machine's f32 multiply-add peak on one thread, GFLOP/s: 12 independent chains of
/// FMAs (more than latency × throughput on any x86-64 core), on 256-bit vectors and, where
/// the CPU has AVX-512, on 512-bit ones.
#[cfg(target_arch = "x86_64")]
fn fma_peak(o: &Opts) -> Option<(f64, Option<f64>)> {
    use std::arch::x86_64::*;
    macro_rules! chains {
        ($name:ident, $feat:literal, $v:ty, $lanes:literal, $zero:ident, $set1:ident, $fmadd:ident, $add:ident, $store:ident) => {
            #[target_feature(enable = $feat)]
            fn $name(iters: usize) -> f32 {
                let mut acc = [$zero(); 12];
                let (a, b) = ($set1(0.999_999), $set1(1e-7));
                for _ in 0..iters {
                    for x in acc.iter_mut() {
                        *x = $fmadd(*x, a, b);
                    }
                }
                let mut sum = $zero();
                for x in acc {
                    sum = $add(sum, x);
                }
                let mut out = [0f32; $lanes];
                // SAFETY: `out` holds one vector of floats.
                unsafe { $store(out.as_mut_ptr(), sum) };
                out.iter().sum()
            }
        };
    }
    chains!(
        chains256,
        "avx2,fma",
        __m256,
        8,
        _mm256_setzero_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_add_ps,
        _mm256_storeu_ps
    );
    chains!(
        chains512,
        "avx512f",
        __m512,
        16,
        _mm512_setzero_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_add_ps,
        _mm512_storeu_ps
    );
    if !Isa::Avx2.is_available() {
        return None;
    }
    let iters = 100_000;
    let gflops = |lanes: usize, t: f64| (iters * 12 * lanes * 2) as f64 / t / 1e9;
    // SAFETY: AVX2 and FMA are available (checked above).
    let t = race(
        &mut [&mut || {
            black_box(unsafe { chains256(black_box(iters)) });
        }],
        o.rounds,
        o.min,
    );
    let wide = Isa::Avx512.is_available().then(|| {
        // SAFETY: AVX-512F is available (checked just above).
        let t = race(
            &mut [&mut || {
                black_box(unsafe { chains512(black_box(iters)) });
            }],
            o.rounds,
            o.min,
        );
        gflops(16, t[0])
    });
    Some((gflops(8, t[0]), wide))
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_peak(_: &Opts) -> Option<(f64, Option<f64>)> {
    None
}

fn bench_pool(o: &Opts) {
    println!("## Fork-join overhead: a job of `tasks` empty tasks, microseconds per call\n");
    println!("| threads | tasks | pte ThreadPool::parallel_for | rayon install + par_iter |");
    println!("|---:|---:|---:|---:|");
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads).unwrap();
        let rp = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for tasks in [2, 16] {
            let sink = std::sync::atomic::AtomicUsize::new(0);
            let mut ours = || {
                pool.parallel_for(tasks, |t, _| {
                    sink.fetch_add(t, std::sync::atomic::Ordering::Relaxed);
                })
            };
            let mut theirs = || {
                use rayon::prelude::*;
                rp.install(|| {
                    (0..tasks).into_par_iter().for_each(|t| {
                        sink.fetch_add(t, std::sync::atomic::Ordering::Relaxed);
                    })
                })
            };
            let t = race(&mut [&mut ours, &mut theirs], o.rounds, o.min);
            println!(
                "| {threads} | {tasks} | {:.2} | {:.2} |",
                t[0] * 1e6,
                t[1] * 1e6
            );
        }
    }
    println!();
}

fn bench_attention(o: &Opts) {
    use pte_compute::{BatchMut, BatchRef};
    println!(
        "## Attention-shaped batched products, microseconds per batch (median of {} rounds)\n",
        o.rounds
    );
    println!("| batch x heads | m x n x k | threads | pte run_batched | gemm crate, one call per matrix | GFLOP/s (pte) |");
    println!("|---:|---|---:|---:|---:|---:|");
    let g = Gemm::with_isa(o.isa).unwrap();
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads).unwrap();
        for (count, m, n, k) in [(4, 64, 64, 64), (16, 64, 64, 64), (12, 128, 128, 64)] {
            let a = values(count * m * k);
            // K is [count, n, k]: its transposed view is the right operand (Q·Kᵀ).
            let b = values(count * n * k);
            let mut c = vec![0.0; count * m * n];
            let mut c2 = c.clone();
            let mut scratch = vec![0.0; g.batched_scratch_len(m, n, k, threads).unwrap()];
            let epi = Epilogue::default();
            let ab = BatchRef::new(&a, count, m, k, k, 1, m * k).unwrap();
            let bb = BatchRef::new(&b, count, k, n, 1, k, n * k).unwrap();
            let mut ours = || {
                let cb = BatchMut::new(&mut c, count, m, n, n, 1, m * n).unwrap();
                g.run_batched(&pool, cb, ab, bb, &epi, &mut scratch)
                    .unwrap();
            };
            let rp = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let par = if threads == 1 {
                gemm::Parallelism::None
            } else {
                gemm::Parallelism::Rayon(threads)
            };
            let mut theirs = || {
                rp.install(|| {
                    for i in 0..count {
                        // SAFETY: in-bounds row-major buffers; C does not alias A or B.
                        unsafe {
                            gemm::gemm(
                                m,
                                n,
                                k,
                                c2[i * m * n..].as_mut_ptr(),
                                1,
                                n as isize,
                                false,
                                a[i * m * k..].as_ptr(),
                                1,
                                k as isize,
                                b[i * n * k..].as_ptr(),
                                k as isize,
                                1,
                                0.0,
                                1.0,
                                false,
                                false,
                                false,
                                par,
                            )
                        }
                    }
                })
            };
            let t = race(&mut [&mut ours, &mut theirs], o.rounds, o.min);
            let fl = 2.0 * (count * m * n * k) as f64 / 1e9;
            println!(
                "| {count} | {m}x{n}x{k} | {threads} | {:.1} | {:.1} | {:.1} |",
                t[0] * 1e6,
                t[1] * 1e6,
                fl / t[0]
            );
        }
    }
    println!();
}

fn bench_ops(o: &Opts) {
    use pte_compute::elementwise;
    use pte_compute::pooling::{self, AvgOptions, Pool2dParams};
    println!(
        "## Pooling and elementwise, microseconds (median of {} rounds, 1 thread)\n",
        o.rounds
    );
    println!("| operation | size | pte | scalar loop |");
    println!("|---|---|---:|---:|");
    let pool = ThreadPool::new(1).unwrap();
    let p = Pool2dParams {
        input: [112, 112],
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
        dilation: [1, 1],
        ceil_mode: false,
    };
    let x = values(64 * 112 * 112);
    let mut y = vec![0.0; 64 * 56 * 56];
    let mut y2 = y.clone();
    let mut ps = vec![0.0; p.scratch_len(1).unwrap()];
    let mut ours = || pooling::max_pool2d(o.isa, &pool, &p, &x, &mut y, None, &mut ps).unwrap();
    let mut naive = || {
        for (plane, out) in y2.chunks_mut(56 * 56).enumerate() {
            for (i, v) in out.iter_mut().enumerate() {
                let (oy, ox) = (i / 56, i % 56);
                let mut m = f32::NEG_INFINITY;
                for ky in 0..3 {
                    for kx in 0..3 {
                        let (iy, ix) = ((oy * 2 + ky) as isize - 1, (ox * 2 + kx) as isize - 1);
                        if iy >= 0 && ix >= 0 && iy < 112 && ix < 112 {
                            m = m.max(x[plane * 12544 + iy as usize * 112 + ix as usize]);
                        }
                    }
                }
                *v = m;
            }
        }
    };
    let t = race(&mut [&mut ours, &mut naive], o.rounds, o.min);
    println!(
        "| max_pool2d 3x3/2 pad 1 (resnet18) | 64x112x112 | {:.1} | {:.1} |",
        t[0] * 1e6,
        t[1] * 1e6
    );
    let xa = values(1280 * 49);
    let mut ya = vec![0.0; 1280];
    let mut ya2 = ya.clone();
    let mut ours = || pooling::global_avg_pool(o.isa, &xa, 49, &mut ya).unwrap();
    let mut naive = || {
        for (v, p) in ya2.iter_mut().zip(xa.chunks(49)) {
            *v = p.iter().sum::<f32>() / 49.0;
        }
    };
    let t = race(&mut [&mut ours, &mut naive], o.rounds, o.min);
    println!(
        "| global average pool | 1280x7x7 | {:.1} | {:.1} |",
        t[0] * 1e6,
        t[1] * 1e6
    );
    let pa = Pool2dParams {
        input: [14, 14],
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0, 0],
        dilation: [1, 1],
        ceil_mode: false,
    };
    let xp = values(256 * 196);
    let mut yp = vec![0.0; 256 * 49];
    let opts = AvgOptions {
        count_include_pad: true,
        divisor_override: None,
    };
    let mut ours = || pooling::avg_pool2d(&pool, &pa, opts, &xp, &mut yp).unwrap();
    let t = race(&mut [&mut ours], o.rounds, o.min);
    println!("| avg_pool2d 2x2/2 | 256x14x14 | {:.1} | - |", t[0] * 1e6);
    let n = 64 * 1024;
    let xe = values(n);
    let mut ye = vec![0.0; n];
    for (name, act, scalar) in [
        (
            "gelu",
            Activation::Gelu,
            (|v: f32| 0.5 * v * (1.0 + libm_erf(v / std::f32::consts::SQRT_2))) as fn(f32) -> f32,
        ),
        ("sigmoid", Activation::Sigmoid, |v: f32| {
            1.0 / (1.0 + (-v).exp())
        }),
        ("tanh", Activation::Tanh, f32::tanh),
        ("silu", Activation::Silu, |v: f32| v / (1.0 + (-v).exp())),
        ("relu (the copy's cost)", Activation::RELU, |v: f32| {
            v.max(0.0)
        }),
    ] {
        let mut y2 = ye.clone();
        let mut ours = || {
            ye.copy_from_slice(&xe);
            elementwise::activate(o.isa, &mut ye, act);
        };
        let mut naive = || {
            for (d, &s) in y2.iter_mut().zip(&xe) {
                *d = scalar(s);
            }
            black_box(&y2);
        };
        let t = race(&mut [&mut ours, &mut naive], o.rounds, o.min);
        println!(
            "| {name} | {n} | {:.1} | {:.1} (std) |",
            t[0] * 1e6,
            t[1] * 1e6
        );
    }
    let mut ys = vec![0.0; n];
    let mut ours = || elementwise::softmax_rows(o.isa, &mut ys, &xe, 64).unwrap();
    let t = race(&mut [&mut ours], o.rounds, o.min);
    println!(
        "| softmax rows of 64 (attention scores) | 1024 rows | {:.1} | - |",
        t[0] * 1e6
    );
    let g: Vec<f32> = values(256);
    let mut ours = || {
        elementwise::layer_norm_rows(o.isa, &mut ys, &xe, 256, Some(&g), Some(&g), 1e-5, None)
            .unwrap()
    };
    let t = race(&mut [&mut ours], o.rounds, o.min);
    println!(
        "| layer_norm rows of 256 | 256 rows | {:.1} | - |\n",
        t[0] * 1e6
    );
}

/// erf by its Taylor series (the scalar baseline only; std has no erf).
fn libm_erf(x: f32) -> f32 {
    let x = f64::from(x.clamp(-4.0, 4.0));
    let (mut term, mut sum) = (x, x);
    for n in 1..60 {
        term *= -x * x / f64::from(n);
        sum += term / f64::from(2 * n + 1);
    }
    (sum * 2.0 / std::f64::consts::PI.sqrt()) as f32
}

/// A convolution layer of a network and how many times it occurs.
struct Layer {
    p: Conv2dParams,
    count: usize,
}

#[allow(clippy::too_many_arguments)]
fn layer(
    c_in: usize,
    c_out: usize,
    groups: usize,
    size: usize,
    k: usize,
    stride: usize,
    pad: usize,
) -> Conv2dParams {
    Conv2dParams {
        in_channels: c_in,
        out_channels: c_out,
        groups,
        input: [size, size],
        kernel: [k, k],
        stride: [stride, stride],
        padding: [pad; 4],
        dilation: [1, 1],
    }
}

fn push(v: &mut Vec<Layer>, p: Conv2dParams) {
    match v.iter_mut().find(|l| l.p == p) {
        Some(l) => l.count += 1,
        None => v.push(Layer { p, count: 1 }),
    }
}

/// torchvision resnet18's convolutions at 224x224.
fn resnet18() -> Vec<Layer> {
    let mut v = Vec::new();
    push(&mut v, layer(3, 64, 1, 224, 7, 2, 3));
    let mut c = 64;
    let mut size = 56;
    for (i, out) in [64, 128, 256, 512].into_iter().enumerate() {
        for block in 0..2 {
            let s = if i > 0 && block == 0 { 2 } else { 1 };
            push(&mut v, layer(c, out, 1, size, 3, s, 1));
            if s == 2 {
                push(&mut v, layer(c, out, 1, size, 1, 2, 0));
                size /= 2;
            }
            push(&mut v, layer(out, out, 1, size, 3, 1, 1));
            c = out;
        }
    }
    v
}

/// mobilenet_v2's stages: expansion, output channels, blocks, first stride.
const MOBILENET_V2_BLOCKS: [(usize, usize, usize, usize); 7] = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
];

/// torchvision mobilenet_v2's convolutions at 224x224.
fn mobilenet_v2() -> Vec<Layer> {
    let mut v = Vec::new();
    push(&mut v, layer(3, 32, 1, 224, 3, 2, 1));
    let (mut c, mut size) = (32, 112);
    for (t, out, n, s) in MOBILENET_V2_BLOCKS {
        for i in 0..n {
            let stride = if i == 0 { s } else { 1 };
            let hidden = c * t;
            if t != 1 {
                push(&mut v, layer(c, hidden, 1, size, 1, 1, 0));
            }
            push(&mut v, layer(hidden, hidden, hidden, size, 3, stride, 1));
            size = (size - 1) / stride + 1;
            push(&mut v, layer(hidden, out, 1, size, 1, 1, 0));
            c = out;
        }
    }
    push(&mut v, layer(320, 1280, 1, 7, 1, 1, 0));
    v
}

/// The pre-existing path of pte-kernels for a non-depthwise convolution: im2col into a
/// buffer, then the `gemm` crate per group, bias pre-filled.
fn im2col_gemm_crate(
    p: &Conv2dParams,
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    y: &mut [f32],
    col: &mut [f32],
    par: gemm::Parallelism,
) {
    let [oh, ow] = p.output().unwrap();
    let (cig, cog) = (p.in_channels / p.groups, p.out_channels / p.groups);
    let [h, wd] = p.input;
    let [kh, kw] = p.kernel;
    let kk = cig * kh * kw;
    let n = oh * ow;
    for g in 0..p.groups {
        let xg = &x[g * cig * h * wd..];
        for r in 0..kk {
            let (c, ky, kx) = (r / (kh * kw), r / kw % kh, r % kw);
            for oy in 0..oh {
                for ox in 0..ow {
                    let iy = (oy * p.stride[0] + ky) as isize - p.padding[0] as isize;
                    let ix = (ox * p.stride[1] + kx) as isize - p.padding[1] as isize;
                    col[r * n + oy * ow + ox] =
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                            0.0
                        } else {
                            xg[c * h * wd + iy as usize * wd + ix as usize]
                        };
                }
            }
        }
        let yg = &mut y[g * cog * n..(g + 1) * cog * n];
        for (row, &b) in yg.chunks_mut(n).zip(&bias[g * cog..]) {
            row.fill(b);
        }
        // SAFETY: row-major buffers of the stated sizes; y does not alias w or col.
        unsafe {
            gemm::gemm(
                cog,
                n,
                kk,
                yg.as_mut_ptr(),
                1,
                n as isize,
                true,
                w[g * cog * kk..].as_ptr(),
                1,
                kk as isize,
                col.as_ptr(),
                1,
                n as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                par,
            );
        }
    }
}

fn bench_conv(o: &Opts, name: &str, layers: &[Layer]) {
    println!(
        "## {name} convolutions (1x3x224x224), milliseconds per layer (median of {} rounds)\n",
        o.rounds
    );
    println!("| layer (c_in→c_out, groups, input, kernel/stride/pad) | count | algorithm | GFLOP | pte 1T | pte 2T | im2col+gemm crate 1T | 2T |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    let g = Gemm::with_isa(o.isa).unwrap();
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    let mut totals = [0.0f64; 4];
    let mut flops = 0.0;
    for l in layers {
        let p = &l.p;
        let (cig, _) = (p.in_channels / p.groups, 0);
        let w = values(p.out_channels * cig * p.kernel[0] * p.kernel[1]);
        let bias = values(p.out_channels);
        let conv = Conv2d::new(
            &pools[0],
            g,
            *p,
            ConvWeights::oihw(&w),
            Some(&bias),
            Activation::RELU,
        )
        .unwrap();
        let (x_len, y_len) = conv.io_len(1).unwrap();
        let x = values(x_len);
        let [oh, ow] = conv.output_size();
        let gflop = 2.0 * (p.out_channels * oh * ow * cig * p.kernel[0] * p.kernel[1]) as f64 / 1e9;
        let mut ys = [
            vec![0.0; y_len],
            vec![0.0; y_len],
            vec![0.0; y_len],
            vec![0.0; y_len],
        ];
        let mut scratch = [
            vec![0.0; conv.scratch_len(1).unwrap()],
            vec![0.0; conv.scratch_len(2).unwrap()],
        ];
        let depthwise = conv.algorithm() == "depthwise";
        let mut col = vec![
            0.0;
            if depthwise {
                0
            } else {
                cig * p.kernel[0] * p.kernel[1] * oh * ow
            }
        ];
        let rayon2 = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let [y0, y1, y2, y3] = &mut ys;
        let [s0, s1] = &mut scratch;
        let mut col2 = col.clone();
        let mut f0 = || conv.run(&pools[0], &x, 1, y0, s0).unwrap();
        let mut f1 = || conv.run(&pools[1], &x, 1, y1, s1).unwrap();
        let mut f2 = || {
            if !depthwise {
                im2col_gemm_crate(p, &x, &w, &bias, y2, &mut col, gemm::Parallelism::None)
            }
        };
        let mut f3 = || {
            if !depthwise {
                rayon2.install(|| {
                    im2col_gemm_crate(p, &x, &w, &bias, y3, &mut col2, gemm::Parallelism::Rayon(2))
                })
            }
        };
        let t = race(&mut [&mut f0, &mut f1, &mut f2, &mut f3], o.rounds, o.min);
        let c = l.count as f64;
        for (tot, v) in totals.iter_mut().zip(&t) {
            *tot += v * c;
        }
        flops += gflop * c;
        let base = |v: f64| {
            if depthwise {
                "-".to_string()
            } else {
                format!("{:.3}", v * 1e3)
            }
        };
        println!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {} | {} |",
            layer_label(p),
            l.count,
            conv.algorithm(),
            gflop,
            t[0] * 1e3,
            t[1] * 1e3,
            base(t[2]),
            base(t[3])
        );
    }
    println!(
        "| **all convolutions** | | | {:.2} | {:.2} ({:.0} GFLOP/s) | {:.2} ({:.0} GFLOP/s) | {:.2}* | {:.2}* |\n",
        flops, totals[0] * 1e3, flops / totals[0], totals[1] * 1e3, flops / totals[1], totals[2] * 1e3, totals[3] * 1e3
    );
}

/// A layer as the tables name it: channels, groups, input size, kernel/stride/padding.
fn layer_label(p: &Conv2dParams) -> String {
    format!(
        "{}→{}, g{}, {}x{}, {}/{}/{}",
        p.in_channels,
        p.out_channels,
        p.groups,
        p.input[0],
        p.input[1],
        p.kernel[0],
        p.stride[0],
        p.padding[0]
    )
}

/// mobilenet_v2's convolutions as 8-bit NHWC ones (signed activations, per-channel
/// weights): milliseconds per layer and multiply-adds per second.
fn bench_qconv(o: &Opts) {
    use pte_compute::qconv::{QConvNhwc, QuantParams};
    println!("## mobilenet_v2 8-bit convolutions, milliseconds per layer\n");
    println!("| layer | count | algorithm | MMAC | 1T | GMAC/s | 2T |");
    println!("|---|---:|---|---:|---:|---:|---:|");
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    let (mut total, mut macs) = ([0.0f64; 2], 0.0);
    for l in mobilenet_v2() {
        let p = l.p;
        let depthwise = p.groups == p.in_channels && p.groups > 1;
        let cig = p.in_channels / p.groups;
        let w: Vec<i8> = (0..p.out_channels * cig * p.kernel[0] * p.kernel[1])
            .map(|i| ((i * 7919) % 255) as i8)
            .collect();
        let bias: Vec<i32> = (0..p.out_channels as i32).map(|i| i * 37 - 500).collect();
        let scale = vec![1.0 / 4096.0; p.out_channels];
        let q = QuantParams {
            signed: true,
            input_zero: -3,
            weight_zero: 0,
            bias: &bias,
            scale: &scale,
            output_zero: 2,
            output_min: -128,
            output_max: 127,
        };
        let conv = QConvNhwc::new(p, depthwise, &w, &q).unwrap();
        let (x_len, y_len) = conv.io_len(1).unwrap();
        let x: Vec<u8> = (0..x_len).map(|i| ((i * 131) % 251) as u8).collect();
        let mut ys = [vec![0u8; y_len], vec![0u8; y_len]];
        let mut scratch = vec![0u8; conv.scratch_len(1).unwrap()];
        let mut scratch2 = scratch.clone();
        let [y0, y1] = &mut ys;
        let mut f0 = || conv.run(&pools[0], &x, 1, y0, &mut scratch).unwrap();
        let mut f1 = || conv.run(&pools[1], &x, 1, y1, &mut scratch2).unwrap();
        let t = race(&mut [&mut f0, &mut f1], o.rounds, o.min);
        let [oh, ow] = conv.output_size();
        let mmac = (p.out_channels * oh * ow * cig * p.kernel[0] * p.kernel[1]) as f64 / 1e6;
        let c = l.count as f64;
        total[0] += t[0] * c;
        total[1] += t[1] * c;
        macs += mmac * c;
        println!(
            "| {} | {} | {} | {:.1} | {:.3} | {:.1} | {:.3} |",
            layer_label(&p),
            l.count,
            conv.algorithm(),
            mmac,
            t[0] * 1e3,
            mmac / t[0] / 1e3,
            t[1] * 1e3
        );
    }
    println!(
        "| **all** | | | {macs:.0} | {:.2} | {:.1} | {:.2} |\n",
        total[0] * 1e3,
        macs / total[0] / 1e3,
        total[1] * 1e3
    );
}

/// NHWC convolutions on the benchmark shapes: (name, c_in, c_out, groups, size, k,
/// stride, pad), ReLU fused.
fn bench_nhwc(o: &Opts) {
    use pte_compute::nhwc::{ConvNhwc, ConvWeights};
    type Shape = (
        &'static str,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
    );
    let shapes: &[Shape] = &[
        ("mbv2 dw 32 112 s1", 32, 32, 32, 112, 3, 1, 1),
        ("mbv2 dw 96 112 s2", 96, 96, 96, 112, 3, 2, 1),
        ("mbv2 dw 144 56 s1", 144, 144, 144, 56, 3, 1, 1),
        ("mbv2 dw 384 14 s1", 384, 384, 384, 14, 3, 1, 1),
        ("mbv2 dw 960 7 s1", 960, 960, 960, 7, 3, 1, 1),
        ("mnas dw5 480 14 s1", 480, 480, 480, 14, 5, 1, 2),
        ("mnas dw5 1152 7 s1", 1152, 1152, 1152, 7, 5, 1, 2),
        ("mnas dw5 120 28 s1", 120, 120, 120, 28, 5, 1, 2),
        ("mbv2 pw 32->16 112", 32, 16, 1, 112, 1, 1, 0),
        ("mbv2 pw 24->144 56", 24, 144, 1, 56, 1, 1, 0),
        ("mbv2 pw 144->24 56", 144, 24, 1, 56, 1, 1, 0),
        ("mbv2 pw 384->64 14", 384, 64, 1, 14, 1, 1, 0),
        ("mbv2 pw 320->1280 7", 320, 1280, 1, 7, 1, 1, 0),
        ("r18 3x3 64 56", 64, 64, 1, 56, 3, 1, 1),
        ("r18 3x3 128 28", 128, 128, 1, 28, 3, 1, 1),
        ("r18 3x3 256 14", 256, 256, 1, 14, 3, 1, 1),
        ("r18 3x3 512 7", 512, 512, 1, 7, 3, 1, 1),
        ("stem 3x3 s2 3->32 224", 3, 32, 1, 224, 3, 2, 1),
        ("stem 7x7 s2 3->64 224", 3, 64, 1, 224, 7, 2, 3),
        ("rx50 g32 128 56", 128, 128, 32, 56, 3, 1, 1),
        ("rx50 g32 256 28", 256, 256, 32, 28, 3, 1, 1),
        ("rx50 g32 512 14", 512, 512, 32, 14, 3, 1, 1),
        ("rx50 g32 1024 7", 1024, 1024, 32, 7, 3, 1, 1),
        ("rx50 g32 256 56 s2", 256, 256, 32, 56, 3, 2, 1),
        ("rx50 pw s2 256->512 56", 256, 512, 1, 56, 1, 2, 0),
        ("rx50 pw 256->128 56", 256, 128, 1, 56, 1, 1, 0),
        ("rx50 pw 1024->512 14", 1024, 512, 1, 14, 1, 1, 0),
        ("rx50 pw 2048->1024 7", 2048, 1024, 1, 7, 1, 1, 0),
        ("regx pw 160->160 14", 160, 160, 1, 14, 1, 1, 0),
        ("regx pw 400->400 7", 400, 400, 1, 7, 1, 1, 0),
        ("regx g2 32 56", 32, 32, 2, 56, 3, 1, 1),
        ("regx g4 64 28", 64, 64, 4, 28, 3, 1, 1),
        ("regx g10 160 14", 160, 160, 10, 14, 3, 1, 1),
        ("regx g25 400 7", 400, 400, 25, 7, 3, 1, 1),
        ("regx g2 32 112 s2", 32, 32, 2, 112, 3, 2, 1),
        ("regx g4 64 56 s2", 64, 64, 4, 56, 3, 2, 1),
        ("regx g10 160 28 s2", 160, 160, 10, 28, 3, 2, 1),
        ("regx g25 400 14 s2", 400, 400, 25, 14, 3, 2, 1),
    ];
    println!(
        "## NHWC convolutions, milliseconds per layer (median of {} rounds)\n",
        o.rounds
    );
    println!("| layer | algorithm | 1T | 2T | GFLOP/s 1T |");
    println!("|---|---|---:|---:|---:|");
    let g = Gemm::with_isa(o.isa).unwrap();
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    let chosen = shapes
        .iter()
        .filter(|s| o.only.as_deref().is_none_or(|only| s.0.contains(only)));
    for &(name, ci, co, groups, size, k, s, pad) in chosen {
        let p = layer(ci, co, groups, size, k, s, pad);
        let w = values(co * ci / groups * k * k);
        let bias = values(co);
        let conv = ConvNhwc::new(
            &pools[0],
            &STAGING,
            g,
            p,
            ConvWeights::oihw(&w),
            Some(&bias),
            Activation::RELU,
            &mut |_| {},
        )
        .unwrap();
        let (xl, yl) = conv.io_len(1).unwrap();
        let x = values(xl);
        let mut ys = [vec![0.0; yl], vec![0.0; yl]];
        let mut sc = [
            vec![0.0; conv.scratch_len(1).unwrap()],
            vec![0.0; conv.scratch_len(2).unwrap()],
        ];
        let [y0, y1] = &mut ys;
        let [s0, s1] = &mut sc;
        let mut f0 = || conv.run(&pools[0], &x, 1, None, y0, s0).unwrap();
        let mut f1 = || conv.run(&pools[1], &x, 1, None, y1, s1).unwrap();
        let t = race(&mut [&mut f0, &mut f1], o.rounds, o.min);
        let [oh, ow] = p.output().unwrap();
        let flops = 2.0 * (oh * ow * co * ci / groups * k * k) as f64;
        println!(
            "| {name} | {} | {:.3} | {:.3} | {:.1} |",
            conv.algorithm(),
            t[0] * 1e3,
            t[1] * 1e3,
            flops / t[0] / 1e9
        );
    }
    println!();
}

/// mobilenet_v2's inverted residual blocks (expand 1×1, depthwise 3×3, project 1×1,
/// the residual where the shapes allow) run as one `DepthwiseChain` and layer by layer
/// through memory, on one and two threads.
fn bench_chain(o: &Opts) {
    use pte_compute::nhwc::{ConvNhwc, ConvWeights, DepthwiseChain};
    println!(
        "## mobilenet_v2 inverted residual blocks, milliseconds (median of {} rounds)\n",
        o.rounds
    );
    println!("| block | MFLOP | chain 1T | layers 1T | chain 2T | layers 2T | chain 1T GFLOP/s |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let g = Gemm::with_isa(o.isa).unwrap();
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    let conv = |p: Conv2dParams, act: Activation| {
        let w = values(p.out_channels * p.in_channels / p.groups * p.kernel[0] * p.kernel[1]);
        let bias = values(p.out_channels);
        ConvNhwc::new(
            &pools[0],
            &STAGING,
            g,
            p,
            ConvWeights::oihw(&w),
            Some(&bias),
            act,
            &mut |_| {},
        )
        .unwrap()
    };
    let (mut c, mut size) = (32, 112);
    for (t, out, n, s) in MOBILENET_V2_BLOCKS {
        for i in 0..n {
            let stride = if i == 0 { s } else { 1 };
            let hidden = c * t;
            let relu6 = Activation::RELU6;
            let expand = (t != 1).then(|| conv(layer(c, hidden, 1, size, 1, 1, 0), relu6));
            let dw = conv(layer(hidden, hidden, hidden, size, 3, stride, 1), relu6);
            let osize = (size - 1) / stride + 1;
            let project = conv(layer(hidden, out, 1, osize, 1, 1, 0), Activation::Identity);
            let chain = DepthwiseChain::new(expand.as_ref(), &dw, Some(&project)).unwrap();
            let flops = 2.0
                * (size * size * c * hidden * usize::from(t != 1)
                    + osize * osize * hidden * 9
                    + osize * osize * hidden * out) as f64;
            let x = values(size * size * c);
            let residual = (stride == 1 && c == out).then(|| values(osize * osize * out));
            let residual = residual.as_deref();
            let mut y = vec![0.0; osize * osize * out];
            let mut mid = [
                vec![0.0; size * size * hidden],
                vec![0.0; osize * osize * hidden],
            ];
            let scratch_len = [&dw, &project]
                .into_iter()
                .chain(expand.as_ref())
                .map(|l| l.scratch_len(2).unwrap())
                .chain([chain.scratch_len(2).unwrap()])
                .max()
                .unwrap();
            let mut scratch = vec![0.0; scratch_len];
            let mut times = Vec::new();
            for pool in &pools {
                let mut fused = || {
                    chain
                        .run(pool, &x, 1, residual, &mut y, &mut scratch)
                        .unwrap()
                };
                let t_chain = race(&mut [&mut fused], o.rounds, o.min)[0];
                let mut layers = || {
                    let [m0, m1] = &mut mid;
                    let dw_in = match &expand {
                        Some(e) => {
                            e.run(pool, &x, 1, None, m0, &mut scratch).unwrap();
                            &m0[..]
                        }
                        None => &x[..],
                    };
                    dw.run(pool, dw_in, 1, None, m1, &mut scratch).unwrap();
                    project
                        .run(pool, m1, 1, residual, &mut y, &mut scratch)
                        .unwrap();
                };
                let t_layers = race(&mut [&mut layers], o.rounds, o.min)[0];
                times.extend([t_chain, t_layers]);
            }
            println!(
                "| {c}→{hidden}→{out} at {size}, stride {stride} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} |",
                flops / 1e6,
                times[0] * 1e3,
                times[1] * 1e3,
                times[2] * 1e3,
                times[3] * 1e3,
                flops / times[0] / 1e9
            );
            c = out;
            size = osize;
        }
    }
    println!();
}

/// 1×1 convolutions whose weights are in cache (one layer run again and again)
/// against weights that come from memory, as a network's do once per execution
/// (copies of the layer run in turn, 96 MiB of weights in all).
fn bench_cold(o: &Opts) {
    use pte_compute::nhwc::{ConvNhwc, ConvWeights};
    println!(
        "## 1×1 convolutions, everything in cache, weights from memory, activations from memory, 1 thread, GFLOP/s (best of {} rounds)\n",
        o.rounds
    );
    println!("| layer | weights KiB | in cache | weights from memory | activations from memory |");
    println!("|---|---:|---:|---:|---:|");
    let g = Gemm::with_isa(o.isa).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    // (in, out, size): resnext50's and regnet_x_400mf's pointwise layers.
    for (ci, co, size) in [
        (256, 128, 56),
        (128, 256, 56),
        (512, 256, 28),
        (1024, 512, 14),
        (2048, 1024, 7),
        (1024, 2048, 7),
        (160, 160, 14),
        (400, 400, 7),
    ] {
        let p = layer(ci, co, 1, size, 1, 1, 0);
        let (w, bias) = (values(ci * co), values(co));
        let copies = (96 << 20) / (ci * co * 4) + 1;
        let convs: Vec<_> = (0..copies)
            .map(|_| {
                let weights = ConvWeights::oihw(&w);
                ConvNhwc::new(
                    &pool,
                    &STAGING,
                    g,
                    p,
                    weights,
                    Some(&bias),
                    Activation::RELU,
                    &mut |_| {},
                )
                .unwrap()
            })
            .collect();
        let (xl, yl) = convs[0].io_len(1).unwrap();
        // Inputs and outputs cycled through 64 MB, for the activations from memory.
        let sets = (64 << 20) / ((xl + yl) * 4) + 2;
        let xs: Vec<Vec<f32>> = (0..sets).map(|_| values(xl)).collect();
        let mut ys = vec![vec![0.0; yl]; sets];
        let mut scratch = vec![0.0; convs[0].scratch_len(1).unwrap()];
        let mut best = [f64::MAX; 3];
        for _ in 0..o.rounds {
            // (weights from memory, activations from memory) per column.
            let cold = [(false, false), (true, false), (false, true)];
            for (b, (cold_weights, cold_activations)) in best.iter_mut().zip(cold) {
                let layers = if cold_weights {
                    &convs[..]
                } else {
                    &convs[..1]
                };
                let t = Clock::start();
                for i in 0..copies {
                    let conv = &layers[i % layers.len()];
                    let io = if cold_activations { i % sets } else { 0 };
                    conv.run(&pool, &xs[io], 1, None, &mut ys[io], &mut scratch)
                        .unwrap();
                }
                *b = b.min(t.elapsed().as_secs_f64() / copies as f64);
            }
        }
        let flops = 2.0 * (size * size * ci * co) as f64;
        println!(
            "| {ci}→{co} at {size}×{size} | {} | {:.1} | {:.1} | {:.1} |",
            ci * co * 4 / 1024,
            flops / best[0] / 1e9,
            flops / best[1] / 1e9,
            flops / best[2] / 1e9
        );
    }
    println!();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    if args.iter().any(|a| a == "--cpu-time") {
        CPU_TIME.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let what = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .map_or("all", String::as_str);
    let isa = match args
        .iter()
        .position(|a| a == "--isa")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
    {
        Some("avx2") => Isa::Avx2,
        Some("generic") => Isa::Generic,
        Some("avx512") => Isa::Avx512,
        _ => Isa::best(),
    };
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let o = if quick {
        Opts {
            rounds: 3,
            min: Duration::from_millis(20),
            isa,
            only: only.clone(),
        }
    } else {
        Opts {
            rounds: 7,
            min: Duration::from_millis(50),
            isa,
            only: only.clone(),
        }
    };
    println!(
        "isa: {} (best on this CPU: {})\n",
        o.isa.name(),
        Isa::best().name()
    );
    if what == "pool" || what == "all" {
        bench_pool(&o);
    }
    if what == "peak" || what == "gemm" || what == "all" {
        match fma_peak(&o) {
            Some((p, wide)) => {
                println!("measured AVX2 FMA peak, 1 thread: {p:.1} GFLOP/s");
                if let Some(w) = wide {
                    println!("measured AVX-512 FMA peak, 1 thread: {w:.1} GFLOP/s");
                }
                println!();
            }
            None => println!("no AVX2 FMA peak on this CPU\n"),
        }
    }
    if what == "gemm" || what == "all" {
        bench_gemm(&o);
    }
    if what == "conv" || what == "all" {
        bench_conv(&o, "resnet18", &resnet18());
        bench_conv(&o, "mobilenet_v2", &mobilenet_v2());
        println!("\\* without the depthwise layers, which the baseline column skips.\n");
    }
    if what == "qconv" || what == "all" {
        bench_qconv(&o);
    }
    if what == "nhwc" || what == "all" {
        bench_nhwc(&o);
    }
    if what == "cold" || what == "all" {
        bench_cold(&o);
    }
    if what == "chain" || what == "all" {
        bench_chain(&o);
    }
    if what == "attention" || what == "all" {
        bench_attention(&o);
    }
    if what == "ops" || what == "all" {
        bench_ops(&o);
    }
    if what == "product" {
        // One product in a loop, for a profiler: product M N K THREADS [packed-b]
        let v: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
        if let [m, n, k, threads] = v[..] {
            let g = Gemm::with_isa(o.isa).unwrap();
            let pool = ThreadPool::new(threads).unwrap();
            let (a, b) = (values(m * k), values(k * n));
            let mut c = vec![0.0; m * n];
            let bm = MatRef::row_major(&b, k, n).unwrap();
            let pb = g.pack_b(bm).unwrap();
            let packed = args.iter().any(|a| a == "packed-b");
            let mut scratch = vec![0.0; g.scratch_len(m, n, k, false, packed, threads).unwrap()];
            let am = MatRef::row_major(&a, m, k).unwrap();
            let rhs = if packed {
                Rhs::Packed(&pb)
            } else {
                Rhs::Mat(bm)
            };
            let pa = g.pack_a(am).unwrap();
            let lhs = if args.iter().any(|a| a == "packed-a") {
                Lhs::Packed(&pa)
            } else {
                Lhs::Mat(am)
            };
            let t = Clock::start();
            let mut runs = 0;
            while t.elapsed() < Duration::from_secs(3) {
                let cm = MatMut::row_major(&mut c, m, n).unwrap();
                g.run(&pool, cm, lhs, rhs, &Epilogue::default(), &mut scratch)
                    .unwrap();
                runs += 1;
            }
            let s = t.elapsed().as_secs_f64() / f64::from(runs);
            println!("{:.1} GFLOP/s", 2.0 * (m * n * k) as f64 / s / 1e9);
        }
    }
    if what == "depthwise" {
        // One NCHW depthwise layer, for a profiler: depthwise CHANNELS SIZE K STRIDE THREADS
        let v: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
        if let [c, size, k, stride, threads] = v[..] {
            let p = layer(c, c, c, size, k, stride, k / 2);
            let pool = ThreadPool::new(threads).unwrap();
            let (w, bias) = (values(c * k * k), values(c));
            let g = Gemm::with_isa(o.isa).unwrap();
            let conv = Conv2d::new(
                &pool,
                g,
                p,
                ConvWeights::oihw(&w),
                Some(&bias),
                Activation::Identity,
            )
            .unwrap();
            let (x_len, y_len) = conv.io_len(1).unwrap();
            let x = values(x_len);
            let mut y = vec![0.0; y_len];
            let mut scratch = vec![0.0; conv.scratch_len(threads).unwrap()];
            let [oh, ow] = conv.output_size();
            let s = time(
                &mut || conv.run(&pool, &x, 1, &mut y, &mut scratch).unwrap(),
                Duration::from_secs(2),
            );
            println!(
                "{} {:.3} ms, {:.1} GFLOP/s",
                conv.algorithm(),
                s * 1e3,
                2.0 * (c * oh * ow * k * k) as f64 / s / 1e9
            );
        }
    }
    if what == "maxpool" {
        // One NHWC max pooling, for a profiler: maxpool CHANNELS SIZE K STRIDE THREADS
        use pte_compute::nhwc::{pool2d, Geometry, PoolKind};
        let v: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
        if let [c, size, k, stride, threads] = v[..] {
            let pad = k / 2;
            let g = Geometry {
                input: [size, size],
                kernel: [k, k],
                stride: [stride, stride],
                dilation: [1, 1],
                padding: [pad; 4],
            };
            let [oh, ow] = g.output().unwrap();
            let pool = ThreadPool::new(threads).unwrap();
            let x = values(size * size * c);
            let mut y = vec![0.0; oh * ow * c];
            let (lo, hi) = (f32::NEG_INFINITY, f32::INFINITY);
            let s = time(
                &mut || pool2d(o.isa, &pool, PoolKind::Max, &g, c, 1, &x, &mut y, lo, hi).unwrap(),
                Duration::from_secs(2),
            );
            println!(
                "max pooling {:.3} ms, {:.1} GB/s read",
                s * 1e3,
                (x.len() * 4) as f64 / s / 1e9
            );
        }
    }
    if what == "transpose" {
        // One transpose of f32 in a loop, for a profiler: transpose ROWS COLS THREADS
        let v: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
        if let [rows, cols, threads] = v[..] {
            let pool = ThreadPool::new(threads).unwrap();
            let x = values(rows * cols);
            let mut y = vec![0.0; rows * cols];
            let s = time(
                &mut || pte_compute::layout::transpose(&pool, &x, 1, rows, cols, &mut y).unwrap(),
                Duration::from_secs(1),
            );
            println!(
                "transpose {rows} x {cols}: {:.2} us, {:.1} GB/s read",
                s * 1e6,
                (x.len() * 4) as f64 / s / 1e9
            );
        }
    }
    if what == "batched" {
        // A batch in a loop, for a profiler: batched COUNT M N K THREADS
        use pte_compute::{BatchMut, BatchRef};
        let v: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
        if let [count, m, n, k, threads] = v[..] {
            let g = Gemm::with_isa(o.isa).unwrap();
            let pool = ThreadPool::new(threads).unwrap();
            let (a, b) = (values(count * m * k), values(count * n * k));
            let mut c = vec![0.0; count * m * n];
            let mut scratch = vec![0.0; g.batched_scratch_len(m, n, k, threads).unwrap()];
            let ab = BatchRef::new(&a, count, m, k, k, 1, m * k).unwrap();
            let bb = BatchRef::new(&b, count, k, n, 1, k, n * k).unwrap();
            let t = Instant::now();
            let mut runs = 0;
            while t.elapsed() < Duration::from_secs(3) {
                let cb = BatchMut::new(&mut c, count, m, n, n, 1, m * n).unwrap();
                g.run_batched(&pool, cb, ab, bb, &Epilogue::default(), &mut scratch)
                    .unwrap();
                runs += 1;
            }
            println!(
                "{:.1} us",
                t.elapsed().as_secs_f64() * 1e6 / f64::from(runs)
            );
        }
    }
    if what == "nhwc-layer" {
        // One NHWC layer in a loop: nhwc-layer C_IN C_OUT GROUPS SIZE K STRIDE PAD THREADS
        // [COPIES]; with COPIES, as many layers of their own weights run in turn, so
        // that each finds its weights out of cache, as in a network.
        let n: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
        let (dims, copies) = match n[..] {
            [.., c] if n.len() == 9 => (&n[..8], c.max(1)),
            _ => (&n[..], 1),
        };
        if let [ci, co, g, size, k, s, pad, threads] = dims[..] {
            let p = layer(ci, co, g, size, k, s, pad);
            let gemm = Gemm::with_isa(o.isa).unwrap();
            let pool = ThreadPool::new(threads).unwrap();
            let convs: Vec<_> = (0..copies)
                .map(|_| {
                    let w = values(co * ci / g * k * k);
                    pte_compute::nhwc::ConvNhwc::new(
                        &pool,
                        &STAGING,
                        gemm,
                        p,
                        pte_compute::nhwc::ConvWeights::oihw(&w),
                        None,
                        Activation::RELU,
                        &mut |_| {},
                    )
                    .unwrap()
                })
                .collect();
            let conv = &convs[0];
            let (xl, yl) = conv.io_len(1).unwrap();
            let (x, mut y) = (values(xl), vec![0.0; yl]);
            let mut scratch = vec![0.0; conv.scratch_len(threads).unwrap()];
            let t = Clock::start();
            let mut runs = 0;
            while t.elapsed() < Duration::from_secs(3) {
                for conv in &convs {
                    conv.run(&pool, &x, 1, None, &mut y, &mut scratch).unwrap();
                    runs += 1;
                }
            }
            let ms = t.elapsed().as_secs_f64() * 1e3 / f64::from(runs);
            let [oh, ow] = conv.output_size();
            let flops = 2.0 * (oh * ow * co * ci / g * k * k) as f64;
            println!(
                "{} {ms:.3} ms, {:.1} GFLOP/s ({runs} runs)",
                conv.algorithm(),
                flops / ms / 1e6
            );
        }
    }
    if what == "layer" {
        // One layer in a loop, for a profiler: layer C_IN C_OUT GROUPS SIZE K STRIDE PAD THREADS
        let n: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
        if let [ci, co, g, size, k, s, pad, threads] = n[..] {
            let p = layer(ci, co, g, size, k, s, pad);
            let w = values(co * ci / g * k * k);
            let pool = ThreadPool::new(threads).unwrap();
            let conv = Conv2d::new(
                &pool,
                Gemm::with_isa(o.isa).unwrap(),
                p,
                ConvWeights::oihw(&w),
                None,
                Activation::RELU,
            )
            .unwrap();
            let (xl, yl) = conv.io_len(1).unwrap();
            let (x, mut y) = (values(xl), vec![0.0; yl]);
            let mut scratch = vec![0.0; conv.scratch_len(threads).unwrap()];
            let t = Instant::now();
            let mut runs = 0;
            while t.elapsed() < Duration::from_secs(3) {
                conv.run(&pool, &x, 1, &mut y, &mut scratch).unwrap();
                runs += 1;
            }
            println!(
                "{} {:.3} ms ({runs} runs)",
                conv.algorithm(),
                t.elapsed().as_secs_f64() * 1e3 / f64::from(runs)
            );
        }
    }
}
