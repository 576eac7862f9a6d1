//! Steady-state calls allocate nothing: every primitive runs once to warm up, then
//! again under a counting global allocator, on 1 and 2 threads. (One test in its own
//! binary, so that no other test allocates meanwhile.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use pte_compute::elementwise::{self, BinaryOp};
use pte_compute::pooling::{self, Pool2dParams};
use pte_compute::{
    Activation, BatchMut, BatchRef, Bias, Conv2d, Conv2dParams, ConvWeights, Epilogue, Gemm, Isa,
    Lhs, MatMut, MatRef, Rhs, ThreadPool,
};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

fn conv(
    c_in: usize,
    c_out: usize,
    groups: usize,
    k: usize,
    stride: usize,
    pad: usize,
) -> Conv2dParams {
    Conv2dParams {
        in_channels: c_in,
        out_channels: c_out,
        groups,
        input: [20, 20],
        kernel: [k, k],
        stride: [stride, stride],
        padding: [pad; 4],
        dilation: [1, 1],
    }
}

#[test]
fn steady_state_calls_do_not_allocate() {
    let isa = Isa::best();
    let g = Gemm::new();
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads).unwrap();
        let (m, n, k) = (70, 300, 130);
        let (a, b) = (values(m * k), values(k * n));
        let bias = values(n);
        let am = MatRef::row_major(&a, m, k).unwrap();
        let bm = MatRef::row_major(&b, k, n).unwrap();
        let packed = g.pack_b(bm).unwrap();
        let mut c = vec![0.0; m * n];
        let mut gs = vec![0.0; g.scratch_len(m, n, k, false, false, threads).unwrap()];
        let epi = Epilogue {
            accumulate: false,
            bias: Bias::Col(&bias),
            activation: Activation::Gelu,
        };
        let layers: Vec<Conv2d> = [
            conv(8, 16, 1, 3, 1, 1),
            conv(8, 16, 1, 1, 1, 0),
            conv(8, 8, 8, 3, 2, 1),
        ]
        .iter()
        .map(|p| {
            let w = values(p.out_channels * p.in_channels / p.groups * p.kernel[0] * p.kernel[1]);
            Conv2d::new(
                &pool,
                g,
                *p,
                ConvWeights::oihw(&w),
                Some(&values(p.out_channels)),
                Activation::RELU6,
            )
            .unwrap()
        })
        .collect();
        let cs = layers
            .iter()
            .map(|l| l.scratch_len(threads).unwrap())
            .max()
            .unwrap_or(0);
        let mut conv_scratch = vec![0.0; cs];
        let x = values(8 * 400);
        let mut y = vec![0.0; 16 * 400];
        let pp = Pool2dParams {
            input: [20, 20],
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1],
            dilation: [1, 1],
            ceil_mode: false,
        };
        let mut ps = vec![0.0; pp.scratch_len(threads).unwrap()];
        let mut pooled = vec![0.0; 8 * 100];
        let mut idx = vec![0i64; 8 * 100];
        let (bq, bk) = (values(6 * 32 * 16), values(6 * 32 * 16));
        let mut bc = vec![0.0; 6 * 32 * 32];
        let mut bs = vec![0.0; g.batched_scratch_len(32, 32, 16, threads).unwrap()];
        let mut e = values(64 * 32);
        let ex = e.clone();

        let mut run = || {
            g.run(
                &pool,
                MatMut::row_major(&mut c, m, n).unwrap(),
                Lhs::Mat(am),
                Rhs::Packed(&packed),
                &epi,
                &mut gs,
            )
            .unwrap();
            g.run(
                &pool,
                MatMut::row_major(&mut c, m, n).unwrap(),
                Lhs::Mat(am),
                Rhs::Mat(bm),
                &epi,
                &mut gs,
            )
            .unwrap();
            for l in &layers {
                let (xl, yl) = l.io_len(1).unwrap();
                l.run(&pool, &x[..xl], 1, &mut y[..yl], &mut conv_scratch)
                    .unwrap();
            }
            pooling::max_pool2d(isa, &pool, &pp, &x, &mut pooled, None, &mut ps).unwrap();
            pooling::max_pool2d(isa, &pool, &pp, &x, &mut pooled, Some(&mut idx), &mut ps).unwrap();
            let qa = BatchRef::new(&bq, 6, 32, 16, 16, 1, 512).unwrap();
            let ka = BatchRef::new(&bk, 6, 16, 32, 1, 16, 512).unwrap();
            let out = BatchMut::new(&mut bc, 6, 32, 32, 32, 1, 1024).unwrap();
            g.run_batched(&pool, out, qa, ka, &Epilogue::default(), &mut bs)
                .unwrap();
            elementwise::softmax_rows(isa, &mut e, &ex, 32).unwrap();
            elementwise::layer_norm_rows(isa, &mut e, &ex, 32, None, None, 1e-5, None).unwrap();
            elementwise::binary_channels(
                isa,
                &mut e,
                &ex,
                &ex[..32],
                2,
                BinaryOp::Add,
                Activation::Silu,
            )
            .unwrap();
        };
        run();
        COUNTING.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            run();
        }
        COUNTING.store(false, Ordering::SeqCst);
        assert_eq!(
            ALLOCATIONS.load(Ordering::SeqCst),
            0,
            "allocations on {threads} threads"
        );
    }
}
