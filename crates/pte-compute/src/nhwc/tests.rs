use super::*;
use crate::gemm::Gemm;
use crate::pool::ThreadPool;
use crate::Isa;

/// Shared by every test: layers are built with temporaries other layers left behind.
static STAGING: crate::Staging = crate::Staging::new();

/// `ConvNhwc::new` with no activation, temporaries from `STAGING`, and the packed runs
/// not reported.
fn prepared(
    pool: &ThreadPool,
    gemm: Gemm,
    p: Conv2dParams,
    weights: ConvWeights<'_>,
    bias: Option<&[f32]>,
) -> ConvNhwc {
    let identity = crate::Activation::Identity;
    ConvNhwc::new(
        pool,
        &STAGING,
        gemm,
        p,
        weights,
        bias,
        identity,
        &mut |_| {},
    )
    .unwrap()
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// Direct NHWC convolution (regular weights `[cout, kh, kw, cig]`, or depthwise
/// `[kh, kw, cout]`).
#[allow(clippy::too_many_arguments)]
fn reference(
    g: &Geometry,
    groups: usize,
    cig: usize,
    cog: usize,
    depthwise: bool,
    batch: usize,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    min: f32,
    max: f32,
) -> Vec<f32> {
    let [oh, ow] = g.output().unwrap();
    let (cin, cout) = (groups * cig, groups * cog);
    let [kh, kw] = g.kernel;
    let mut y = vec![0.0; batch * oh * ow * cout];
    for n in 0..batch {
        for oy in 0..oh {
            for ox in 0..ow {
                for oc in 0..cout {
                    let gi = oc / cog;
                    let mut acc = b[oc] as f64;
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let Some((iy, ix)) = g.source(oy, ox, ky, kx) else {
                                continue;
                            };
                            for ci in 0..cig {
                                let xv = x[((n * g.input[0] + iy) * g.input[1] + ix) * cin
                                    + gi * cig
                                    + ci];
                                let wv = if depthwise {
                                    w[(ky * kw + kx) * cout + oc]
                                } else {
                                    w[((oc * kh + ky) * kw + kx) * cig + ci]
                                };
                                acc += xv as f64 * wv as f64;
                            }
                        }
                    }
                    y[((n * oh + oy) * ow + ox) * cout + oc] = (acc as f32).clamp(min, max);
                }
            }
        }
    }
    y
}

/// (input, kernel, stride, dilation, padding, groups, cig, cog, depthwise)
type ConvCase = (
    [usize; 2],
    [usize; 2],
    [usize; 2],
    [usize; 2],
    [usize; 4],
    usize,
    usize,
    usize,
    bool,
);

#[test]
fn convolutions_match_a_direct_loop() {
    // (input, kernel, stride, dilation, padding, groups, cig, cog, depthwise)
    let cases: &[ConvCase] = &[
        ([5, 6], [1, 1], [1, 1], [1, 1], [0; 4], 1, 7, 9, false),
        (
            [12, 12],
            [7, 7],
            [2, 2],
            [1, 1],
            [3, 3, 3, 3],
            1,
            3,
            20,
            false,
        ),
        ([4, 5], [1, 1], [1, 1], [1, 1], [0; 4], 3, 40, 21, false),
        (
            [5, 6],
            [3, 3],
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            1,
            5,
            17,
            false,
        ),
        ([9, 8], [3, 3], [2, 2], [1, 1], [1, 0, 0, 1], 1, 3, 8, false),
        // Images one pixel wide (`conv1d` along the height, as XNNPACK programs write
        // it): tiles across many one-pixel output rows, causal (top only) padding,
        // dilation, stride, and without padding (read in place).
        (
            [37, 1],
            [3, 1],
            [1, 1],
            [4, 1],
            [8, 0, 0, 0],
            1,
            9,
            21,
            false,
        ),
        (
            [40, 1],
            [3, 1],
            [2, 1],
            [1, 1],
            [1, 0, 1, 0],
            1,
            16,
            19,
            false,
        ),
        ([29, 1], [5, 1], [1, 1], [2, 1], [0; 4], 1, 12, 8, false),
        // Stems read through strides: tiles inside and across output rows, a vertical
        // dilation, and more kernel rows than one micro-kernel call takes.
        (
            [9, 31],
            [3, 3],
            [2, 1],
            [2, 1],
            [1, 2, 0, 1],
            1,
            2,
            19,
            false,
        ),
        (
            [40, 3],
            [34, 1],
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            1,
            1,
            5,
            false,
        ),
        ([7, 7], [3, 2], [1, 2], [2, 1], [2, 1, 0, 3], 2, 4, 6, false),
        // Row tiles take blocks of groups whose weights stay in L2 together: all of
        // them (regnet's 8 channels), 4 then 3 of 7 (37 KB each), or one at a time
        // (330 KB each).
        (
            [9, 7],
            [3, 3],
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            13,
            8,
            8,
            false,
        ),
        (
            [9, 7],
            [3, 3],
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            7,
            32,
            32,
            false,
        ),
        (
            [5, 4],
            [3, 3],
            [2, 1],
            [1, 1],
            [1, 1, 1, 1],
            2,
            96,
            100,
            false,
        ),
        ([6, 5], [1, 1], [2, 2], [1, 1], [0; 4], 1, 6, 4, false),
        // The interleaved grouped kernel: 8, 4, 2 and 16 output channels per group
        // (2, 4, 8 and 1 groups per 512-bit vector), group counts that leave a last
        // block short, input channels per group other than the outputs', stride 2,
        // dilation, asymmetric padding, and outputs wider than a tile.
        (
            [14, 15],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            6,
            8,
            8,
            false,
        ),
        (
            [5, 17],
            [3, 3],
            [1, 1],
            [2, 1],
            [2, 0, 1, 1],
            7,
            3,
            4,
            false,
        ),
        (
            [6, 6],
            [3, 3],
            [1, 2],
            [1, 1],
            [1, 1, 1, 1],
            12,
            5,
            2,
            false,
        ),
        (
            [7, 5],
            [1, 3],
            [1, 1],
            [1, 1],
            [0, 1, 0, 1],
            3,
            16,
            16,
            false,
        ),
        ([4, 4], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 5, 2, 8, false),
        // One group per vector on images large enough that the input is read in
        // place and only the border's windows are copied: odd sizes at stride 2,
        // dilation with asymmetric padding, a 5 × 5 kernel at mixed strides, fewer
        // input channels than outputs per group.
        (
            [21, 22],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            3,
            16,
            16,
            false,
        ),
        (
            [19, 24],
            [3, 3],
            [1, 1],
            [2, 1],
            [2, 0, 1, 3],
            2,
            16,
            16,
            false,
        ),
        (
            [30, 17],
            [5, 5],
            [1, 2],
            [1, 1],
            [2, 2, 2, 2],
            2,
            8,
            16,
            false,
        ),
        (
            [26, 18],
            [3, 3],
            [2, 1],
            [1, 1],
            [1, 1, 1, 1],
            3,
            8,
            8,
            false,
        ),
        (
            [6, 7],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            10,
            4,
            4,
            false,
        ),
        // Grouped layers large enough for two threads: 7 output rows (regnet's last
        // stage, 16 channels per group), and 13 rows at stride 2 with 2 groups per
        // vector, both shared by pixels as rows too few to share evenly.
        (
            [7, 7],
            [3, 3],
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            25,
            16,
            16,
            false,
        ),
        (
            [25, 13],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            20,
            8,
            8,
            false,
        ),
        // Tiles whose whole windows lie inside the image read their rows through a
        // table of offsets, the others through a list: regnet_y's 16 channels per
        // group, a block of groups sharing each tile's rows, and a dilated window
        // with padding on one side only.
        (
            [11, 16],
            [3, 3],
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            4,
            16,
            16,
            false,
        ),
        (
            [12, 19],
            [3, 3],
            [1, 2],
            [2, 2],
            [2, 3, 0, 1],
            3,
            8,
            16,
            false,
        ),
        ([7, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 37, 1, 1, true),
        ([8, 8], [3, 3], [2, 2], [1, 1], [0, 1, 1, 0], 20, 1, 1, true),
        ([6, 6], [5, 5], [1, 1], [2, 2], [4, 4, 4, 4], 5, 1, 1, true),
        ([6, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 3, 1, 2, true),
        (
            [12, 12],
            [7, 7],
            [1, 1],
            [1, 1],
            [3, 3, 3, 3],
            16,
            1,
            1,
            true,
        ),
        // The hand-written 3×3 depthwise rows (channels a multiple of 8): stride 1
        // and 2, dilation, stride 3, no padding, widths that leave a partial group of
        // four at the right edge, and rows too narrow for any group.
        (
            [5, 13],
            [3, 3],
            [1, 1],
            [1, 1],
            [1, 1, 0, 2],
            24,
            1,
            1,
            true,
        ),
        (
            [9, 19],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            16,
            1,
            1,
            true,
        ),
        ([7, 20], [3, 3], [1, 1], [2, 2], [2, 2, 2, 2], 8, 1, 1, true),
        ([6, 30], [3, 3], [3, 3], [1, 1], [1, 0, 1, 1], 8, 1, 1, true),
        ([4, 12], [3, 3], [1, 1], [1, 1], [0; 4], 16, 1, 1, true),
        // 40 channels: edge pixels in a block of four and a single block.
        (
            [5, 11],
            [3, 3],
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            40,
            1,
            1,
            true,
        ),
        // Channels past the last block of eight, left to the scalar tail: 58
        // (shufflenet's), 20 with dilation, 13 on the 5×5 rows at stride 2.
        ([7, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 58, 1, 1, true),
        (
            [9, 12],
            [3, 3],
            [1, 1],
            [2, 2],
            [2, 2, 2, 2],
            20,
            1,
            1,
            true,
        ),
        (
            [8, 11],
            [5, 5],
            [2, 2],
            [1, 1],
            [2, 1, 2, 3],
            13,
            1,
            1,
            true,
        ),
        // The 5×5 rows: stride 1 and 2, dilation, asymmetric padding, and outputs
        // narrower than a group of four interior pixels.
        (
            [9, 14],
            [5, 5],
            [1, 1],
            [1, 1],
            [2, 2, 2, 2],
            40,
            1,
            1,
            true,
        ),
        (
            [11, 23],
            [5, 5],
            [2, 2],
            [1, 1],
            [2, 2, 2, 2],
            32,
            1,
            1,
            true,
        ),
        ([8, 20], [5, 5], [1, 1], [2, 2], [4, 4, 1, 3], 8, 1, 1, true),
        ([7, 8], [5, 5], [1, 1], [1, 1], [2, 2, 2, 2], 48, 1, 1, true),
        ([5, 4], [5, 5], [2, 2], [1, 1], [2, 2, 2, 2], 16, 1, 1, true),
        ([4, 3], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 16, 1, 1, true),
        // 72 channels: four blocks of 16 at an edge pixel (one AVX-512 vector or two
        // AVX2 vectors each), then one block of 8.
        ([6, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 72, 1, 1, true),
        ([7, 7], [5, 5], [1, 1], [1, 1], [2, 2, 2, 2], 72, 1, 1, true),
        // A 1×1 product whose weights take several blocks of panels, the last panel
        // partial.
        ([2, 3], [1, 1], [1, 1], [1, 1], [0; 4], 1, 1100, 70, false),
        // Weights larger than L2 and than the input: threads split the output
        // channels (resnet's last layers); 3×3 with padding, and 1×1.
        (
            [4, 5],
            [3, 3],
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            1,
            96,
            150,
            false,
        ),
        ([3, 3], [1, 1], [1, 1], [1, 1], [0; 4], 1, 600, 300, false),
        // No padding, each kernel row one run of the input: read in place, row by row
        // of the output (strided 1×1 projections, valid convolutions); with weights
        // larger than L2, split by channels; a dilated row is not one run.
        ([9, 11], [1, 1], [2, 2], [1, 1], [0; 4], 1, 24, 40, false),
        ([9, 10], [3, 3], [2, 2], [1, 1], [0; 4], 1, 20, 36, false),
        ([12, 9], [3, 3], [1, 2], [2, 1], [0; 4], 1, 17, 16, false),
        ([10, 12], [3, 3], [1, 1], [1, 2], [0; 4], 1, 16, 16, false),
        ([5, 5], [1, 1], [2, 2], [1, 1], [0; 4], 1, 600, 300, false),
        // Taps that read only padding for every pixel of a tile, skipped tile by tile:
        // DeepLab's atrous 3×3 (dilation 12 on a 14×14 map: the outer taps read the
        // input at two rows and columns each), a dilated 5×5 whose tiles read several
        // runs of taps, and groups.
        (
            [14, 14],
            [3, 3],
            [1, 1],
            [12, 12],
            [12, 12, 12, 12],
            1,
            20,
            19,
            false,
        ),
        (
            [9, 10],
            [5, 5],
            [1, 1],
            [3, 3],
            [6, 6, 6, 6],
            1,
            9,
            17,
            false,
        ),
        (
            [8, 7],
            [3, 3],
            [1, 1],
            [5, 4],
            [5, 4, 5, 4],
            2,
            12,
            10,
            false,
        ),
        // Split by channels into a number of panels two threads cannot share evenly
        // (5 of 32 on AVX-512), so by rows too.
        (
            [6, 7],
            [7, 1],
            [1, 1],
            [1, 1],
            [3, 0, 3, 0],
            1,
            160,
            160,
            false,
        ),
    ];
    for isa in Isa::available() {
        let gemm = Gemm::with_isa(isa).unwrap();
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads).unwrap();
            for &(input, kernel, stride, dilation, padding, groups, cig, cog, dw) in cases {
                let g = Geometry {
                    input,
                    kernel,
                    stride,
                    dilation,
                    padding,
                };
                let batch = 2;
                let x = data(batch * input[0] * input[1] * groups * cig, 1);
                let w = data(groups * cog * kernel[0] * kernel[1] * cig, 2);
                let b = data(groups * cog, 3);
                for act in [
                    crate::Activation::Clamp {
                        min: -0.9,
                        max: 2.0,
                    },
                    crate::Activation::Silu,
                ] {
                    let weights = if dw {
                        ConvWeights::hwo(&w)
                    } else {
                        ConvWeights::ohwi(&w)
                    };
                    let p = g.conv2d(groups * cig, groups * cog, groups);
                    let conv = ConvNhwc::new(
                        &pool,
                        &STAGING,
                        gemm,
                        p,
                        weights,
                        Some(&b),
                        act,
                        &mut |_| {},
                    )
                    .unwrap();
                    let [oh, ow] = conv.output_size();
                    let y_len = batch * oh * ow * groups * cog;
                    // Without and with a residual (the clamp fused in the stores, or
                    // applied after the residual).
                    let residual = data(y_len, 4);
                    for r in [None, Some(&residual[..])] {
                        let mut y = vec![f32::NAN; y_len];
                        let mut scratch = vec![0.0; conv.scratch_len(threads).unwrap()];
                        conv.run(&pool, &x, batch, r, &mut y, &mut scratch).unwrap();
                        let mut want = reference(
                            &g,
                            groups,
                            cig,
                            cog,
                            dw,
                            batch,
                            &x,
                            &w,
                            &b,
                            f32::NEG_INFINITY,
                            f32::INFINITY,
                        );
                        for (i, v) in want.iter_mut().enumerate() {
                            *v = act.apply_scalar(*v + r.map_or(0.0, |r| r[i]));
                        }
                        for (i, (a, e)) in y.iter().zip(&want).enumerate() {
                            assert!(
                                (a - e).abs() < 1e-4,
                                "{isa:?} {} case {g:?} residual {} at {i}: {a} vs {e}",
                                conv.algorithm(),
                                r.is_some()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn pooling_matches_a_direct_loop() {
    let pool = ThreadPool::new(2).unwrap();
    // Channels in blocks of 16 and 1; of 16, 8, 4 and 1.
    // Windows cut by padding on every side (ceil mode's extra bottom and right rows
    // among them), dilated windows, windows larger than the image's edge allows.
    for (c, input, kernel, stride, dilation, padding) in [19, 29].into_iter().flat_map(|c| {
        [
            ([6, 7], [2, 2], [2, 2], [1, 1], [0; 4]),
            ([6, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            ([9, 5], [3, 2], [2, 1], [1, 1], [1, 0, 1, 1]),
            ([7, 7], [7, 7], [1, 1], [1, 1], [0; 4]),
            ([9, 8], [3, 3], [2, 2], [1, 1], [1, 2, 2, 1]),
            ([9, 10], [3, 3], [2, 1], [2, 3], [2, 3, 2, 3]),
            ([5, 4], [5, 5], [1, 2], [1, 1], [2, 2, 2, 2]),
        ]
        .map(|(i, k, s, d, p)| (c, i, k, s, d, p))
    }) {
        let g = Geometry {
            input,
            kernel,
            stride,
            dilation,
            padding,
        };
        let [oh, ow] = g.output().unwrap();
        let x = data(2 * input[0] * input[1] * c, 4);
        let kinds = [
            PoolKind::Max,
            PoolKind::Average,
            PoolKind::AverageCountingPadding,
            PoolKind::AverageOver(5),
        ];
        for kind in kinds {
            let mut y = vec![0.0; 2 * oh * ow * c];
            pool2d(Isa::best(), &pool, kind, &g, c, 2, &x, &mut y, -0.5, 0.7).unwrap();
            for n in 0..2 {
                for oy in 0..oh {
                    for ox in 0..ow {
                        for ch in 0..c {
                            let vals: Vec<f32> = (0..kernel[0] * kernel[1])
                                .filter_map(|t| g.source(oy, ox, t / kernel[1], t % kernel[1]))
                                .map(|(iy, ix)| x[((n * input[0] + iy) * input[1] + ix) * c + ch])
                                .collect();
                            let want = match kind {
                                PoolKind::Max => {
                                    vals.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                                }
                                PoolKind::Average => vals.iter().sum::<f32>() / vals.len() as f32,
                                PoolKind::AverageCountingPadding => {
                                    // Taps before the end of the input and as much
                                    // padding after it as before.
                                    let taps = |o: usize, a: usize, pad: usize| {
                                        (0..kernel[a])
                                            .filter(|t| {
                                                o * stride[a] + t * dilation[a] < input[a] + 2 * pad
                                            })
                                            .count()
                                    };
                                    let n = taps(oy, 0, padding[0]) * taps(ox, 1, padding[3]);
                                    vals.iter().sum::<f32>() / n as f32
                                }
                                PoolKind::AverageOver(d) => vals.iter().sum::<f32>() / d as f32,
                            }
                            .clamp(-0.5, 0.7);
                            let got = y[((n * oh + oy) * ow + ox) * c + ch];
                            assert!((got - want).abs() < 1e-6, "{kind:?} {g:?}: {got} vs {want}");
                        }
                    }
                }
            }
        }
    }
    // A NaN in a window makes its maximum NaN (as PyTorch), in a whole block of 16
    // channels, of 8 and in the tail.
    let c = 29;
    let g = Geometry {
        input: [4, 4],
        kernel: [2, 2],
        stride: [2, 2],
        dilation: [1, 1],
        padding: [0; 4],
    };
    for isa in Isa::available() {
        let mut x = data(16 * c, 6);
        x[5 * c + 2] = f32::NAN; // pixel (1, 1), channel 2: window (0, 0)
        x[10 * c + 17] = f32::NAN; // pixel (2, 2), channel 17: window (1, 1)
        x[15 * c + 28] = f32::NAN; // pixel (3, 3), channel 28: window (1, 1)
        let mut y = vec![0.0; 4 * c];
        let (lo, hi) = (f32::NEG_INFINITY, f32::INFINITY);
        pool2d(isa, &pool, PoolKind::Max, &g, c, 1, &x, &mut y, lo, hi).unwrap();
        let nans: Vec<usize> = (0..y.len()).filter(|&i| y[i].is_nan()).collect();
        assert_eq!(nans, [2, 3 * c + 17, 3 * c + 28], "{isa:?}");
    }
    let x = data(2 * 12 * 5, 5);
    let mut y = vec![0.0; 10];
    global_avg_pool(
        Isa::best(),
        2,
        12,
        5,
        &x,
        &mut y,
        f32::NEG_INFINITY,
        f32::INFINITY,
    )
    .unwrap();
    for n in 0..2 {
        for ch in 0..5 {
            let want: f32 = (0..12).map(|p| x[(n * 12 + p) * 5 + ch]).sum::<f32>() / 12.0;
            assert!((y[n * 5 + ch] - want).abs() < 1e-6);
        }
    }
}

#[test]
fn deconvolution_matches_a_scatter() {
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    let gemm = Gemm::new();
    for (case, (input, kernel, stride, dilation, padding, adj, groups, cig, cog)) in [
        // Width tiled (stride = kernel): rows written directly, with and without
        // the adjustment's extra rows and columns.
        ([5, 7], [2, 2], [2, 2], [1, 1], [0; 4], [0, 0], 1, 9, 20),
        ([3, 5], [2, 2], [2, 2], [1, 1], [0; 4], [1, 1], 1, 4, 17),
        ([2, 3], [3, 3], [3, 3], [1, 1], [0; 4], [2, 1], 1, 6, 3),
        // Tiled, but the right padding crops the row: added up instead.
        (
            [4, 3],
            [3, 3],
            [3, 3],
            [1, 1],
            [0, 2, 1, 0],
            [0, 0],
            1,
            5,
            6,
        ),
        // Width tiled, rows reached by several input rows.
        ([3, 4], [3, 2], [1, 2], [1, 1], [0; 4], [0, 0], 1, 3, 5),
        // Rows no input row reaches (stride above the kernel).
        ([3, 3], [1, 1], [3, 3], [1, 1], [0; 4], [0, 0], 1, 4, 9),
        // DCGAN's upsampling: kernel 4, stride 2, padding 1.
        ([6, 5], [4, 4], [2, 2], [1, 1], [1; 4], [0, 0], 1, 8, 7),
        (
            [3, 4],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            3,
            5,
        ),
        ([4, 4], [2, 2], [2, 2], [1, 1], [0; 4], [0, 0], 2, 2, 3),
        (
            [5, 3],
            [3, 2],
            [1, 2],
            [2, 1],
            [0, 1, 2, 0],
            [0, 1],
            1,
            4,
            2,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let pool = &pools[case % 2];
        let batch = 2;
        let (cin, cout) = (groups * cig, groups * cog);
        let x = data(batch * input[0] * input[1] * cin, 6);
        let w = data(cout * kernel[0] * kernel[1] * cig, 7);
        let b = data(cout, 8);
        let d = DeconvNhwc::new(
            gemm,
            input,
            kernel,
            stride,
            dilation,
            padding,
            adj,
            groups,
            cig,
            cog,
            &w,
            Some(&b),
            crate::Activation::Clamp {
                min: -1.5,
                max: 1.5,
            },
        )
        .unwrap();
        let [oh, ow] = d.output_size();
        let mut y = vec![0.0; batch * oh * ow * cout];
        let mut scratch = vec![0.0; d.scratch_len(pool.threads()).unwrap()];
        d.run(pool, &x, batch, &mut y, &mut scratch).unwrap();
        let mut want = vec![0.0f64; y.len()];
        for n in 0..batch {
            for oy in 0..oh {
                for ox in 0..ow {
                    for oc in 0..cout {
                        want[((n * oh + oy) * ow + ox) * cout + oc] = b[oc] as f64;
                    }
                }
            }
            for iy in 0..input[0] {
                for ix in 0..input[1] {
                    for ky in 0..kernel[0] {
                        for kx in 0..kernel[1] {
                            let oy =
                                (iy * stride[0] + ky * dilation[0]) as isize - padding[0] as isize;
                            let ox =
                                (ix * stride[1] + kx * dilation[1]) as isize - padding[3] as isize;
                            if oy < 0 || ox < 0 || oy >= oh as isize || ox >= ow as isize {
                                continue;
                            }
                            for oc in 0..cout {
                                let gi = oc / cog;
                                for ci in 0..cig {
                                    let xv = x[((n * input[0] + iy) * input[1] + ix) * cin
                                        + gi * cig
                                        + ci];
                                    let wv = w[((oc * kernel[0] + ky) * kernel[1] + kx) * cig + ci];
                                    want[((n * oh + oy as usize) * ow + ox as usize) * cout
                                        + oc] += xv as f64 * wv as f64;
                                }
                            }
                        }
                    }
                }
            }
        }
        for (a, e) in y.iter().zip(&want) {
            assert!(
                (a - (*e as f32).clamp(-1.5, 1.5)).abs() < 1e-4,
                "case {case}: {a} against {e}"
            );
        }
    }
}

#[test]
fn few_output_channels_per_group_take_the_interleaved_kernel() {
    let pool = ThreadPool::new(1).unwrap();
    let g = Geometry {
        input: [6, 6],
        kernel: [3, 3],
        stride: [1, 1],
        dilation: [1, 1],
        padding: [1; 4],
    };
    for isa in Isa::available() {
        let gemm = Gemm::with_isa(isa).unwrap();
        for (groups, cig, cog) in [(13, 8, 8), (6, 8, 8), (12, 5, 2), (3, 16, 16), (2, 8, 24)] {
            let w = data(groups * cog * 9 * cig, 2);
            let p = g.conv2d(groups * cig, groups * cog, groups);
            let conv = prepared(&pool, gemm, p, ConvWeights::ohwi(&w), None);
            // A vector of outputs holds whole groups.
            let lanes = match isa {
                Isa::Avx512 => 16,
                Isa::Avx2 => 8,
                _ => 0,
            };
            let want = if lanes > 0 && lanes % cog == 0 {
                "grouped"
            } else {
                "indirect"
            };
            assert_eq!(
                conv.algorithm(),
                want,
                "{isa:?} {groups} groups {cig} -> {cog}"
            );
        }
    }
}

#[test]
fn one_group_per_vector_reads_large_inputs_in_place() {
    let pool = ThreadPool::new(1).unwrap();
    for isa in Isa::available() {
        let lanes = match isa {
            Isa::Avx512 => 16,
            Isa::Avx2 => 8,
            _ => continue,
        };
        let gemm = Gemm::with_isa(isa).unwrap();
        // (size, stride, algorithm): at 28 × 28 and below, stride 1, the border's
        // windows hold more values than the padded input.
        for (size, stride, want) in [
            (56, 2, "grouped-in-place"),
            (56, 1, "grouped-in-place"),
            (14, 2, "grouped-in-place"),
            (28, 1, "grouped"),
            (7, 1, "grouped"),
        ] {
            let g = Geometry {
                input: [size, size],
                kernel: [3, 3],
                stride: [stride, stride],
                dilation: [1, 1],
                padding: [1; 4],
            };
            let w = data(2 * lanes * 9 * lanes, 2);
            let p = g.conv2d(2 * lanes, 2 * lanes, 2);
            let conv = prepared(&pool, gemm, p, ConvWeights::ohwi(&w), None);
            assert_eq!(
                conv.algorithm(),
                want,
                "{isa:?} {size} × {size} stride {stride}"
            );
        }
    }
}

#[test]
fn winograd_matches_a_direct_loop() {
    // (input, padding top/right/bottom/left, in and out channels, batch, algorithm):
    // sizes that are not multiples of the tile, channels that are not of the vector
    // lanes nor of the micro-kernel's columns, depths beyond a block of the product,
    // and the sizes on either side of each variant's threshold.
    type Case = ([usize; 2], [usize; 4], usize, usize, usize, &'static str);
    let cases: &[Case] = &[
        ([26, 25], [1; 4], 16, 20, 1, "winograd-4x4"),
        ([24, 30], [0; 4], 19, 16, 2, "winograd-4x4"),
        ([25, 24], [2, 0, 1, 1], 16, 33, 1, "winograd-4x4"),
        ([24, 24], [1; 4], 260, 16, 1, "winograd-4x4"),
        ([13, 14], [1; 4], 24, 17, 1, "winograd-2x2"),
        ([12, 12], [1; 4], 16, 16, 2, "winograd-2x2"),
        ([11, 12], [1; 4], 16, 16, 1, "indirect"),
        ([30, 30], [1; 4], 8, 16, 1, "indirect"),
        // Weights that outweigh the image's tiles: on 2 and 3 threads the products
        // split by tile position.
        ([14, 13], [1; 4], 96, 400, 1, "winograd-2x2"),
        ([12, 12], [1; 4], 200, 180, 2, "winograd-2x2"),
    ];
    let pools: Vec<ThreadPool> = (1..=3).map(|t| ThreadPool::new(t).unwrap()).collect();
    for &(input, padding, cin, cout, batch, algorithm) in cases {
        let g = Geometry {
            input,
            kernel: [3, 3],
            stride: [1, 1],
            dilation: [1, 1],
            padding,
        };
        let [oh, ow] = g.output().unwrap();
        let x = data(batch * input[0] * input[1] * cin, 7);
        let w = data(cout * 9 * cin, 8);
        let b = data(cout, 9);
        let residual = data(batch * oh * ow * cout, 10);
        let (lo, hi) = (f32::NEG_INFINITY, f32::INFINITY);
        let direct = reference(&g, 1, cin, cout, false, batch, &x, &w, &b, lo, hi);
        // Errors grow with the number of terms summed (9·cin products of values
        // within ±1): measured at most 1.2e-5·√terms for F(4×4), as a direct sum's
        // for F(2×2).
        let bound = 3e-5 * (9.0 * cin as f32).sqrt();
        for isa in Isa::available() {
            let gemm = Gemm::with_isa(isa).unwrap();
            for (act, res) in [
                (
                    crate::Activation::Clamp {
                        min: -2.0,
                        max: 2.5,
                    },
                    false,
                ),
                (crate::Activation::RELU, true),
                (crate::Activation::Silu, true),
            ] {
                let p = g.conv2d(cin, cout, 1);
                let conv = ConvNhwc::new(
                    &pools[1],
                    &STAGING,
                    gemm,
                    p,
                    ConvWeights::ohwi(&w),
                    Some(&b),
                    act,
                    &mut |_| {},
                )
                .unwrap();
                assert_eq!(conv.algorithm(), algorithm, "{g:?} {cin}->{cout}");
                for pool in &pools {
                    let mut y = vec![f32::NAN; batch * oh * ow * cout];
                    let len = conv.scratch_len(pool.threads()).unwrap();
                    let mut scratch = vec![f32::NAN; len];
                    let r = res.then_some(&residual[..]);
                    conv.run(pool, &x, batch, r, &mut y, &mut scratch).unwrap();
                    for (i, (&got, &d)) in y.iter().zip(&direct).enumerate() {
                        let want = act.apply_scalar(d + if res { residual[i] } else { 0.0 });
                        assert!(
                            (got - want).abs() < bound,
                            "{isa:?} {algorithm} {g:?} {cin}->{cout} {act:?} at {i}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// Weights scaled per output channel as they are arranged give, bit for bit, what the
/// same weights scaled beforehand give, for every algorithm and layout.
#[test]
fn scaled_weights_equal_weights_scaled_beforehand() {
    // (input, kernel, stride, padding, groups, cig, cog, layout)
    type Case = (
        [usize; 2],
        [usize; 2],
        usize,
        usize,
        usize,
        usize,
        usize,
        WeightLayout,
    );
    let cases: &[Case] = &[
        ([6, 7], [1, 1], 1, 0, 1, 20, 13, WeightLayout::Oihw), // pointwise
        ([6, 7], [1, 1], 1, 0, 1, 20, 13, WeightLayout::Ohwi),
        ([9, 8], [3, 3], 2, 1, 1, 3, 16, WeightLayout::Oihw), // rows (a stem)
        ([9, 8], [3, 3], 1, 1, 2, 12, 5, WeightLayout::Oihw), // indirect, reordered
        ([9, 8], [3, 3], 1, 1, 2, 12, 5, WeightLayout::Ohwi), // indirect, in place
        ([14, 13], [3, 3], 1, 1, 1, 16, 17, WeightLayout::Oihw), // Winograd
        ([10, 9], [3, 3], 1, 1, 24, 1, 1, WeightLayout::Oihw), // depthwise
        ([10, 9], [5, 5], 2, 2, 24, 1, 1, WeightLayout::Hwo),
        // Grouped (where the instruction set has the kernel), a last block of
        // interleaved groups short of one.
        ([9, 8], [3, 3], 1, 1, 5, 8, 4, WeightLayout::Oihw),
        ([7, 6], [3, 3], 2, 1, 3, 6, 4, WeightLayout::Ohwi),
    ];
    let gemm = Gemm::new();
    let pool = ThreadPool::new(1).unwrap();
    let mut algorithms = Vec::new();
    for (c, &(input, kernel, stride, pad, groups, cig, cog, layout)) in cases.iter().enumerate() {
        let g = Geometry {
            input,
            kernel,
            stride: [stride; 2],
            dilation: [1, 1],
            padding: [pad; 4],
        };
        let p = g.conv2d(groups * cig, groups * cog, groups);
        let taps = kernel[0] * kernel[1];
        let cout = groups * cog;
        let w = data(cout * taps * cig, c as u32);
        let scale: Vec<f64> = data(cout, 50 + c as u32)
            .iter()
            .map(|&v| 1.0 + f64::from(v) / 3.0)
            .collect();
        // The output channel of each stored weight, by layout.
        let channel = |i: usize| match layout {
            WeightLayout::Oihw | WeightLayout::Ohwi => i / (taps * cig),
            WeightLayout::Hwo => i % cout,
        };
        let scaled: Vec<f32> = w
            .iter()
            .enumerate()
            .map(|(i, &v)| (f64::from(v) * scale[channel(i)]) as f32)
            .collect();
        let weights = |data| match layout {
            WeightLayout::Oihw => ConvWeights::oihw(data),
            WeightLayout::Ohwi => ConvWeights::ohwi(data),
            WeightLayout::Hwo => ConvWeights::hwo(data),
        };
        let x = data(input[0] * input[1] * groups * cig, 99);
        let bias = data(cout, 98);
        let run = |w: ConvWeights<'_>| {
            let conv = prepared(&pool, gemm, p, w, Some(&bias));
            let (_, y_len) = conv.io_len(1).unwrap();
            let mut y = vec![f32::NAN; y_len];
            let mut scratch = vec![0.0; conv.scratch_len(1).unwrap()];
            conv.run(&pool, &x, 1, None, &mut y, &mut scratch).unwrap();
            (conv.algorithm(), y)
        };
        let (algorithm, got) = run(weights(&w).scaled(&scale));
        let (_, want) = run(weights(&scaled));
        let differs = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            differs, None,
            "case {c} ({algorithm}): first differing output"
        );
        algorithms.push(algorithm);
        // One factor too few is refused.
        assert!(ConvNhwc::new(
            &pool,
            &STAGING,
            gemm,
            p,
            weights(&w).scaled(&scale[1..]),
            None,
            Default::default(),
            &mut |_| {}
        )
        .is_err());
    }
    for a in ["pointwise", "rows", "indirect", "winograd-2x2", "depthwise"] {
        assert!(algorithms.contains(&a), "{a} not covered: {algorithms:?}");
    }
    if !crate::arch::grouped_interleaves(crate::Isa::best()).is_empty() {
        assert!(algorithms.contains(&"grouped"), "{algorithms:?}");
    }
}

/// A convolution given its input in NCHW gives the bits it gives for the same input
/// in NHWC: stems of 1 to 7 channels copy it into their padded image (1 to 4 by
/// interleaving channel rows), wider ones transpose it first.
#[test]
fn nchw_inputs_match_their_channels_last_copy() {
    let gemm = Gemm::new();
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    let (batch, input, cout) = (2, [13, 11], 10);
    let g = Geometry {
        input,
        kernel: [3, 3],
        stride: [2, 2],
        dilation: [1, 1],
        padding: [1, 1, 2, 1],
    };
    for cin in 1..=9 {
        let p = g.conv2d(cin, cout, 1);
        let w = data(cout * 9 * cin, cin as u32);
        let bias = data(cout, 40 + cin as u32);
        let pixels = input[0] * input[1];
        let nchw = data(batch * cin * pixels, 80 + cin as u32);
        let mut nhwc = vec![0.0; nchw.len()];
        for (image, out) in nchw.chunks(cin * pixels).zip(nhwc.chunks_mut(cin * pixels)) {
            for (i, &v) in image.iter().enumerate() {
                out[(i % pixels) * cin + i / pixels] = v;
            }
        }
        for pool in &pools {
            let conv = prepared(pool, gemm, p, ConvWeights::oihw(&w), Some(&bias));
            let y_len = conv.io_len(batch).unwrap().1;
            let (mut want, mut got) = (vec![f32::NAN; y_len], vec![f32::NAN; y_len]);
            let threads = pool.threads();
            let mut scratch = vec![0.0; conv.nchw_scratch_len(batch, threads).unwrap()];
            conv.run(pool, &nhwc, batch, None, &mut want, &mut scratch)
                .unwrap();
            conv.run_nchw(pool, &nchw, batch, None, &mut got, &mut scratch)
                .unwrap();
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{cin} channels, {} ({threads} threads)",
                conv.algorithm()
            );
        }
    }
}

/// A chain gives the bits of its layers run one after the other: the same kernels on
/// the same values, only in bands.
#[test]
fn depthwise_chains_match_their_layers_run_in_turn() {
    // (input, kernel, stride, padding, channels in, expanded, out, expand, project)
    type Case = (
        [usize; 2],
        usize,
        usize,
        [usize; 4],
        usize,
        usize,
        usize,
        bool,
        bool,
    );
    let cases: &[Case] = &[
        ([11, 9], 3, 1, [1; 4], 5, 24, 7, true, true),
        ([12, 13], 3, 2, [1; 4], 8, 48, 16, true, true),
        ([9, 10], 5, 2, [2, 2, 1, 2], 6, 40, 9, true, true),
        ([7, 7], 3, 1, [1; 4], 8, 32, 8, true, false),
        ([15, 6], 3, 1, [0, 1, 2, 1], 16, 16, 24, false, true),
        ([3, 40], 3, 2, [1; 4], 4, 20, 4, true, true),
        // Rows expanded several at a time, the ring wrapping mid-call.
        ([21, 28], 5, 1, [2; 4], 8, 24, 8, true, true),
        ([17, 30], 3, 2, [1; 4], 8, 24, 8, true, true),
        // Rows wide enough for one projection call each, bands across images.
        ([24, 70], 3, 1, [1; 4], 4, 12, 4, true, true),
        ([20, 66], 5, 2, [2; 4], 4, 12, 4, true, true),
    ];
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    for isa in Isa::available() {
        let gemm = Gemm::with_isa(isa).unwrap();
        for (i, &(input, k, s, padding, cin, mid, cout, expand, project)) in
            cases.iter().enumerate()
        {
            let seed = 10 * i as u32;
            let act = crate::Activation::Clamp { min: 0.0, max: 6.0 };
            let silu = crate::Activation::Silu;
            let pointwise = |ci: usize, co: usize, size: [usize; 2], act, seed| {
                let g = Geometry {
                    input: size,
                    kernel: [1, 1],
                    stride: [1, 1],
                    dilation: [1, 1],
                    padding: [0; 4],
                };
                let w = data(ci * co, seed);
                let b = data(co, seed + 1);
                let p = g.conv2d(ci, co, 1);
                ConvNhwc::new(
                    &pools[0],
                    &STAGING,
                    gemm,
                    p,
                    ConvWeights::ohwi(&w),
                    Some(&b),
                    act,
                    &mut |_| {},
                )
                .unwrap()
            };
            let first = if expand { cin } else { mid };
            let e = pointwise(first, mid, input, act, seed);
            let g = Geometry {
                input,
                kernel: [k, k],
                stride: [s, s],
                dilation: [1, 1],
                padding,
            };
            let (w, b) = (data(k * k * mid, seed + 2), data(mid, seed + 3));
            let p = g.conv2d(mid, mid, mid);
            let d = ConvNhwc::new(
                &pools[0],
                &STAGING,
                gemm,
                p,
                ConvWeights::hwo(&w),
                Some(&b),
                silu,
                &mut |_| {},
            )
            .unwrap();
            let q = pointwise(
                mid,
                cout,
                d.output_size(),
                crate::Activation::Identity,
                seed + 4,
            );
            let layers = (expand.then_some(&e), project.then_some(&q));
            let chain = DepthwiseChain::new(layers.0, &d, layers.1).unwrap();
            let batch = 2;
            let (x_len, y_len) = chain.io_len(batch).unwrap();
            let x = data(x_len, seed + 5);
            let residual = data(y_len, seed + 6);
            let runs = pools.iter().flat_map(|p| [(p, false), (p, project)]);
            for (pool, with_residual) in runs {
                let r = with_residual.then_some(&residual[..]);
                // The layers in turn.
                let mut scratch = vec![0.0; 1 << 16];
                let mut value = x.clone();
                for (layer, last) in [(layers.0, false), (Some(&d), false), (layers.1, true)] {
                    let Some(layer) = layer else { continue };
                    let mut y = vec![0.0; layer.io_len(batch).unwrap().1];
                    let r = r.filter(|_| last);
                    layer
                        .run(pool, &value, batch, r, &mut y, &mut scratch)
                        .unwrap();
                    value = y;
                }
                let mut got = vec![f32::NAN; y_len];
                let mut scratch = vec![f32::NAN; chain.scratch_len(pool.threads()).unwrap()];
                // A run on other values first: nothing it leaves in the scratch may be
                // taken for this run's.
                let other = data(x_len, seed + 7);
                chain
                    .run(pool, &other, batch, r, &mut got, &mut scratch)
                    .unwrap();
                chain
                    .run(pool, &x, batch, r, &mut got, &mut scratch)
                    .unwrap();
                assert_eq!(got.len(), value.len());
                for (j, (a, b)) in got.iter().zip(&value).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{isa:?} case {i} threads {} at {j}: {a} vs {b}",
                        pool.threads()
                    );
                }
            }
        }
    }
    // Layers that do not meet.
    let pool = ThreadPool::new(1).unwrap();
    let g = Geometry {
        input: [5, 5],
        kernel: [3, 3],
        stride: [1, 1],
        dilation: [1, 1],
        padding: [1; 4],
    };
    let w = data(9 * 8, 1);
    let d = prepared(
        &pool,
        Gemm::new(),
        g.conv2d(8, 8, 8),
        ConvWeights::hwo(&w),
        None,
    );
    assert!(DepthwiseChain::new(None, &d, None).is_none());
    assert!(DepthwiseChain::new(Some(&d), &d, None).is_none());
}

#[test]
fn taps_reading_only_padding_multiply_infinite_weights() {
    // DeepLab's atrous 3×3: the top-left tap reads the input only at output rows and
    // columns 12 and 13. An infinite weight there makes every other pixel of the
    // output channel NaN in PyTorch (zero padding times infinity), so the tap is
    // multiplied in every tile.
    let g = Geometry {
        input: [14, 14],
        kernel: [3, 3],
        stride: [1, 1],
        dilation: [12, 12],
        padding: [12; 4],
    };
    // The infinite weight in the first output channel, and in the last one of weights
    // packed in two slabs (checked for infinities slab by slab as they are packed).
    for (cin, cout, at) in [(8, 4, 0), (128, 300, 299)] {
        let p = g.conv2d(cin, cout, 1);
        let mut w = data(cout * 9 * cin, 2);
        w[at * 9 * cin] = f32::INFINITY;
        let x: Vec<f32> = data(14 * 14 * cin, 1)
            .iter()
            .map(|v| v.abs() + 0.5)
            .collect();
        for isa in Isa::available() {
            let pool = ThreadPool::new(1).unwrap();
            let gemm = Gemm::with_isa(isa).unwrap();
            let weights = ConvWeights::ohwi(&w);
            let act = crate::Activation::Identity;
            let conv =
                ConvNhwc::new(&pool, &STAGING, gemm, p, weights, None, act, &mut |_| {}).unwrap();
            let mut y = vec![0.0; 14 * 14 * cout];
            let mut scratch = vec![0.0; conv.scratch_len(1).unwrap()];
            conv.run(&pool, &x, 1, None, &mut y, &mut scratch).unwrap();
            for (i, pixel) in y.chunks_exact(cout).enumerate() {
                let (oy, ox) = (i / 14, i % 14);
                let reads = oy >= 12 && ox >= 12;
                let ok = if reads {
                    pixel[at] == f32::INFINITY
                } else {
                    pixel[at].is_nan()
                };
                assert!(ok, "{isa:?} {cout} channels ({oy}, {ox}): {}", pixel[at]);
                let others = pixel.iter().enumerate().filter(|&(c, _)| c != at);
                assert!(others.into_iter().all(|(_, v)| v.is_finite()));
            }
        }
    }
}

/// Weights larger than a slab of packing (1 MiB) are packed a slab of output channels
/// at a time — 3 × 3 ones rearranged from OIHW through a temporary of one slab,
/// pointwise ones straight from the stored runs — and each value of the caller's
/// weights is reported as packed exactly once, in order, so that a caller can give
/// their pages back as it goes. The layers still match the direct loop.
#[test]
fn large_weights_pack_slab_by_slab_and_report_every_value_once() {
    let gemm = Gemm::new();
    // (kernel, stride, padding, input channels, output channels): 2, 2 and 3 slabs.
    let cases = [
        ([3, 3], [2, 2], [1, 1, 1, 1], 160, 300),
        ([1, 1], [1, 1], [0; 4], 512, 600),
        ([3, 1], [1, 2], [0, 0, 0, 0], 700, 400),
    ];
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads).unwrap();
        for (i, &(kernel, stride, padding, cin, cout)) in cases.iter().enumerate() {
            let g = Geometry {
                input: [7, 6],
                kernel,
                stride,
                dilation: [1, 1],
                padding,
            };
            let taps = kernel[0] * kernel[1];
            let oihw = data(cout * cin * taps, 10 + i as u32);
            let bias = data(cout, 20 + i as u32);
            let x = data(g.input[0] * g.input[1] * cin, 30 + i as u32);
            let mut parts = Vec::new();
            let conv = ConvNhwc::new(
                &pool,
                &STAGING,
                gemm,
                g.conv2d(cin, cout, 1),
                ConvWeights::oihw(&oihw),
                Some(&bias),
                crate::Activation::Identity,
                &mut |part| {
                    let at = (part.as_ptr() as usize - oihw.as_ptr() as usize) / 4;
                    parts.push(at..at + part.len());
                },
            )
            .unwrap();
            let case = format!("case {i}, {} ({threads} threads)", conv.algorithm());
            assert!(parts.len() >= 2, "{case}: {parts:?}");
            let mut next = 0;
            for part in &parts {
                assert_eq!(part.start, next, "{case}: {parts:?}");
                next = part.end;
            }
            assert_eq!(next, oihw.len(), "{case}: {parts:?}");

            let mut ohwi = vec![0.0; oihw.len()];
            for (o, channel) in oihw.chunks(cin * taps).enumerate() {
                for (v, &w) in channel.iter().enumerate() {
                    let (c, t) = (v / taps, v % taps);
                    ohwi[(o * taps + t) * cin + c] = w;
                }
            }
            let want = reference(
                &g,
                1,
                cin,
                cout,
                false,
                1,
                &x,
                &ohwi,
                &bias,
                f32::NEG_INFINITY,
                f32::INFINITY,
            );
            let mut y = vec![f32::NAN; want.len()];
            let mut scratch = vec![0.0; conv.scratch_len(threads).unwrap()];
            conv.run(&pool, &x, 1, None, &mut y, &mut scratch).unwrap();
            for (j, (a, e)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (a - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{case} at {j}: {a} vs {e}"
                );
            }
        }
    }
}
