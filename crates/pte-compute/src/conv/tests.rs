//! Convolutions against a direct f64 reference on many geometries (odd sizes, groups,
//! depthwise with multipliers, strides, asymmetric padding, dilation, 1-D, batch 2),
//! every available instruction set, 1 and 2 threads.
//! Tolerance: |got - want| <= 1e-5 · (Σ|w·x| + |bias| + 1).

use super::*;
use crate::gemm::tests::values;

static STAGING: crate::Staging = crate::Staging::new();

fn reference(
    p: &Conv2dParams,
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    act: Activation,
    batch: usize,
) -> (Vec<f64>, Vec<f64>) {
    let [oh, ow] = p.output().unwrap();
    let (cig, cog) = p.channels_per_group();
    let [h, wd] = p.input;
    let [kh, kw] = p.kernel;
    let mut out = Vec::new();
    let mut mag = Vec::new();
    for b in 0..batch {
        for oc in 0..p.out_channels {
            let g = oc / cog;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = f64::from(bias[oc]);
                    let mut m = 1.0 + s.abs();
                    for ci in 0..cig {
                        let c = g * cig + ci;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * p.stride[0] + ky * p.dilation[0]) as isize
                                    - p.padding[0] as isize;
                                let ix = (ox * p.stride[1] + kx * p.dilation[1]) as isize
                                    - p.padding[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let xv = x[((b * p.in_channels + c) * h + iy as usize) * wd
                                    + ix as usize];
                                let wv = w[((oc * cig + ci) * kh + ky) * kw + kx];
                                let v = f64::from(xv) * f64::from(wv);
                                s += v;
                                m += v.abs();
                            }
                        }
                    }
                    out.push(f64::from(act.apply_scalar(s as f32)));
                    mag.push(m);
                }
            }
        }
    }
    (out, mag)
}

#[allow(clippy::too_many_arguments)]
fn case(
    c_in: usize,
    c_out: usize,
    groups: usize,
    input: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 4],
    dilation: [usize; 2],
) -> Conv2dParams {
    Conv2dParams {
        in_channels: c_in,
        out_channels: c_out,
        groups,
        input,
        kernel,
        stride,
        padding,
        dilation,
    }
}

fn cases() -> Vec<Conv2dParams> {
    vec![
        // pointwise
        case(5, 7, 1, [6, 9], [1, 1], [1, 1], [0; 4], [1, 1]),
        case(16, 33, 1, [7, 7], [1, 1], [1, 1], [0; 4], [1, 1]),
        // 1x1 with stride (downsample) and with padding
        case(8, 12, 1, [9, 9], [1, 1], [2, 2], [0; 4], [1, 1]),
        case(3, 4, 1, [5, 5], [1, 1], [1, 1], [1, 1, 1, 1], [1, 1]),
        // 3x3 same, stride 2, dilation 2, asymmetric padding
        case(3, 16, 1, [11, 13], [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        case(6, 14, 1, [12, 15], [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
        case(4, 5, 1, [10, 10], [3, 3], [1, 1], [2, 2, 2, 2], [2, 2]),
        case(3, 6, 1, [8, 9], [3, 2], [2, 1], [0, 1, 2, 0], [1, 2]),
        // stem-like 7x7 stride 2
        case(3, 8, 1, [23, 21], [7, 7], [2, 2], [3, 3, 3, 3], [1, 1]),
        // grouped
        case(8, 12, 4, [7, 8], [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        case(6, 6, 2, [5, 5], [1, 1], [1, 1], [0; 4], [1, 1]),
        // depthwise: stride 1 and 2, multiplier 2, 5x5, dilation, asymmetric pads
        case(8, 8, 8, [14, 15], [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        case(5, 5, 5, [15, 16], [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
        case(4, 8, 4, [9, 10], [5, 5], [1, 2], [2, 2, 2, 2], [1, 1]),
        case(3, 3, 3, [10, 11], [3, 3], [3, 3], [0, 2, 1, 0], [2, 2]),
        case(2, 2, 2, [6, 40], [1, 7], [1, 3], [0, 3, 0, 3], [1, 1]),
        // depthwise kernel too large for the direct loop (runs as products)
        case(2, 2, 2, [12, 12], [9, 9], [1, 1], [4, 4, 4, 4], [1, 1]),
        // 1-D as height 1
        case(4, 6, 1, [1, 30], [1, 5], [1, 2], [0, 2, 0, 2], [1, 1]),
        case(4, 4, 4, [1, 30], [1, 3], [1, 1], [0, 1, 0, 1], [1, 3]),
        // kernel as large as the input; output 1x1
        case(3, 5, 1, [4, 4], [4, 4], [1, 1], [0; 4], [1, 1]),
        // more pixels than a GEMM column block and depth above one k block
        case(32, 10, 1, [48, 50], [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        // depthwise by groups of output rows: a height not a multiple of the group
        // (13 = 3 groups of 4 and one row), a width past one chunk, rows read by one to
        // four outputs of a group; dilated rows with stride 2; padding beyond the
        // kernel's reach (rows of bias alone)
        case(3, 3, 3, [13, 19], [7, 7], [1, 1], [3, 3, 3, 3], [1, 1]),
        case(2, 2, 2, [17, 9], [3, 3], [2, 1], [3, 1, 2, 1], [3, 1]),
        case(2, 2, 2, [6, 6], [3, 3], [1, 1], [4, 4, 4, 4], [1, 1]),
        // stride 1 on AVX-512 (rows cut from two loads): 5×5 with a multiplier over two
        // whole chunks, 7×7 over three and a part with asymmetric padding, an output
        // narrower than the kernel
        case(4, 8, 4, [9, 32], [5, 5], [1, 1], [2, 2, 2, 2], [1, 1]),
        case(3, 3, 3, [5, 56], [7, 7], [1, 1], [3, 1, 2, 3], [1, 1]),
        case(2, 2, 2, [3, 3], [7, 7], [1, 1], [3, 3, 3, 3], [1, 1]),
        // taps that read only padding (dropped): an atrous 3×3 whose outer taps all
        // fall outside, one axis of them, the middle tap alone of a wide padding, and
        // a depthwise one
        case(6, 5, 1, [7, 7], [3, 3], [1, 1], [12, 12, 12, 12], [12, 12]),
        case(4, 6, 1, [9, 5], [3, 3], [1, 1], [6, 6, 6, 6], [6, 6]),
        case(3, 4, 1, [6, 5], [3, 3], [1, 1], [10, 1, 10, 1], [8, 1]),
        case(4, 4, 4, [5, 6], [3, 3], [2, 1], [7, 7, 7, 7], [7, 7]),
        // few output pixels, the product's rows (audio frames, wav2letter-like): by
        // receptive fields, pointwise, in groups
        case(10, 48, 1, [1, 51], [1, 7], [1, 1], [0, 3, 0, 3], [1, 1]),
        case(12, 32, 1, [1, 17], [1, 1], [1, 1], [0; 4], [1, 1]),
        case(8, 32, 2, [1, 20], [1, 3], [1, 1], [0, 1, 0, 1], [1, 1]),
    ]
}

#[test]
fn convolutions_match_the_reference() {
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    for isa in Isa::available() {
        let gemm = Gemm::with_isa(isa).unwrap();
        for (i, p) in cases().iter().enumerate() {
            let batch = 1 + i % 2;
            let (cig, _) = p.channels_per_group();
            let w = values(p.out_channels * cig * p.kernel[0] * p.kernel[1], i as u32);
            let bias = values(p.out_channels, 100 + i as u32);
            let act = [Activation::Identity, Activation::RELU6, Activation::Silu][i % 3];
            let conv = Conv2d::new(
                &pools[i % 2],
                gemm,
                *p,
                ConvWeights::oihw(&w),
                Some(&bias),
                act,
            )
            .unwrap();
            let (x_len, y_len) = conv.io_len(batch).unwrap();
            let x = values(x_len, 200 + i as u32);
            let (want, mag) = reference(p, &x, &w, &bias, act, batch);
            for pool in &pools {
                let mut y = vec![f32::NAN; y_len + 3];
                let mut scratch = vec![f32::NAN; conv.scratch_len(pool.threads()).unwrap()];
                conv.run(pool, &x, batch, &mut y, &mut scratch).unwrap();
                for (j, (&got, (&w, &m))) in y.iter().zip(want.iter().zip(&mag)).enumerate() {
                    assert!(
                        (f64::from(got) - w).abs() <= 1e-5 * m,
                        "{isa:?} case {i} {} threads {} at {j}: {got} vs {w}",
                        conv.algorithm(),
                        pool.threads()
                    );
                }
                assert!(y[y_len..].iter().all(|v| v.is_nan()));
            }
        }
    }
}

#[test]
fn residuals_are_added_before_the_activation() {
    // `run_add`: act(conv(x) + bias + residual), on every geometry and both threads
    // (the pixel-row cases carry the residual through their transposes).
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    let gemm = Gemm::new();
    for (i, p) in cases().iter().enumerate() {
        let (cig, _) = p.channels_per_group();
        let w = values(p.out_channels * cig * p.kernel[0] * p.kernel[1], i as u32);
        let bias = values(p.out_channels, 300 + i as u32);
        let act = Activation::RELU6;
        let pool = &pools[i % 2];
        let conv = Conv2d::new(pool, gemm, *p, ConvWeights::oihw(&w), Some(&bias), act).unwrap();
        let (x_len, y_len) = conv.io_len(1).unwrap();
        let x = values(x_len, 400 + i as u32);
        let r = values(y_len, 500 + i as u32);
        let (sum, mag) = reference(p, &x, &w, &bias, Activation::Identity, 1);
        let mut y = vec![f32::NAN; y_len];
        let mut scratch = vec![f32::NAN; conv.scratch_len(pool.threads()).unwrap()];
        conv.run_add(pool, &x, 1, &r, &mut y, &mut scratch).unwrap();
        for (j, &got) in y.iter().enumerate() {
            let want = f64::from(act.apply_scalar((sum[j] + f64::from(r[j])) as f32));
            let tol = 1e-5 * (mag[j] + f64::from(r[j]).abs());
            assert!(
                (f64::from(got) - want).abs() <= tol,
                "case {i} {} at {j}: {got} vs {want}",
                conv.algorithm()
            );
        }
    }
}

#[test]
fn algorithms_are_chosen_by_shape() {
    let g = Gemm::new();
    let pool = ThreadPool::new(1).unwrap();
    let algo = |p: Conv2dParams| {
        let (cig, _) = p.channels_per_group();
        let w = vec![0.0; p.out_channels * cig * p.kernel[0] * p.kernel[1]];
        Conv2d::new(
            &pool,
            g,
            p,
            ConvWeights::oihw(&w),
            None,
            Activation::Identity,
        )
        .unwrap()
        .algorithm()
    };
    assert_eq!(algo(cases()[0]), "pointwise");
    assert_eq!(algo(cases()[2]), "im2col");
    assert_eq!(algo(cases()[4]), "im2col");
    assert_eq!(algo(cases()[11]), "depthwise");
}

#[test]
fn taps_reading_only_padding_are_dropped_unless_not_finite() {
    let g = Gemm::new();
    let pool = ThreadPool::new(1).unwrap();
    // An atrous 3×3 on a map smaller than its dilation: only the middle tap reads
    // the input, so the layer is a pointwise one.
    let p = case(3, 2, 1, [5, 5], [3, 3], [1, 1], [9, 9, 9, 9], [9, 9]);
    let run = |w: &[f32]| {
        let conv = Conv2d::new(
            &pool,
            g,
            p,
            ConvWeights::oihw(w),
            None,
            Activation::Identity,
        )
        .unwrap();
        let (x_len, y_len) = conv.io_len(1).unwrap();
        let mut y = vec![0.0; y_len];
        let mut scratch = vec![0.0; conv.scratch_len(1).unwrap()];
        conv.run(&pool, &values(x_len, 7), 1, &mut y, &mut scratch)
            .unwrap();
        (conv.algorithm(), y)
    };
    let mut w = values(2 * 3 * 9, 3);
    let (algo, y) = run(&w);
    assert_eq!(algo, "pointwise");
    assert!(y.iter().all(|v| v.is_finite()));
    // An infinite weight on a tap that reads padding: PyTorch multiplies the padding
    // by it (NaN), so the tap stays.
    w[0] = f32::INFINITY;
    let (algo, y) = run(&w);
    assert_eq!(algo, "im2col");
    assert!(y.iter().take(25).all(|v| v.is_nan()));
}

#[test]
fn invalid_layers_are_refused() {
    let g = Gemm::new();
    let pool = ThreadPool::new(1).unwrap();
    let good = cases()[4];
    let w = vec![0.0; good.out_channels * good.in_channels * 9];
    assert!(Conv2d::new(
        &pool,
        g,
        good,
        ConvWeights::oihw(&w[1..]),
        None,
        Activation::Identity
    )
    .is_err());
    assert!(Conv2d::new(
        &pool,
        g,
        good,
        ConvWeights::oihw(&w),
        Some(&[1.0]),
        Activation::Identity
    )
    .is_err());
    for bad in [
        Conv2dParams { groups: 2, ..good },
        Conv2dParams {
            stride: [0, 1],
            ..good
        },
        Conv2dParams {
            kernel: [20, 3],
            ..good
        },
        Conv2dParams {
            dilation: [usize::MAX, 1],
            ..good
        },
    ] {
        assert!(
            Conv2d::new(
                &pool,
                g,
                bad,
                ConvWeights::oihw(&w),
                None,
                Activation::Identity
            )
            .is_err(),
            "{bad:?}"
        );
    }
    let conv = Conv2d::new(
        &pool,
        g,
        good,
        ConvWeights::oihw(&w),
        None,
        Activation::Identity,
    )
    .unwrap();
    let (x_len, y_len) = conv.io_len(1).unwrap();
    let mut y = vec![0.0; y_len];
    assert!(conv
        .run(&pool, &vec![0.0; x_len - 1], 1, &mut y, &mut [])
        .is_err());
    assert!(matches!(
        conv.run(&pool, &vec![0.0; x_len], 1, &mut y, &mut []),
        Err(Error::ScratchTooSmall { .. })
    ));
}

#[test]
fn nhwc_convolutions_match_the_reference() {
    let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
    for isa in Isa::available() {
        let gemm = Gemm::with_isa(isa).unwrap();
        for (i, p) in cases().iter().enumerate() {
            let batch = 1 + i % 2;
            let (cig, _) = p.channels_per_group();
            let w = values(p.out_channels * cig * p.kernel[0] * p.kernel[1], i as u32);
            let bias = values(p.out_channels, 100 + i as u32);
            let act = [Activation::Identity, Activation::RELU6, Activation::Silu][i % 3];
            let conv = crate::nhwc::ConvNhwc::new(
                &pools[i % 2],
                &STAGING,
                gemm,
                *p,
                crate::nhwc::ConvWeights::oihw(&w),
                Some(&bias),
                act,
                &mut |_| {},
            )
            .unwrap();
            let (x_len, y_len) = conv.io_len(batch).unwrap();
            let x = values(x_len, 200 + i as u32);
            let [oh, ow] = conv.output_size();
            let pixels = (p.input[0] * p.input[1], oh * ow);
            let mut x_nhwc = vec![0.0; x_len];
            crate::layout::transpose(&pools[0], &x, batch, p.in_channels, pixels.0, &mut x_nhwc)
                .unwrap();
            // With a residual: act(conv + bias + r), r shaped as the output.
            let residual = values(y_len, 300 + i as u32);
            for with_residual in [false, true] {
                let (want, mag) = reference(
                    p,
                    &x,
                    &w,
                    &bias,
                    if with_residual {
                        Activation::Identity
                    } else {
                        act
                    },
                    batch,
                );
                let want: Vec<f64> = if with_residual {
                    want.iter()
                        .zip(&residual)
                        .map(|(&v, &r)| f64::from(act.apply_scalar((v + f64::from(r)) as f32)))
                        .collect()
                } else {
                    want
                };
                let mut r_nhwc = vec![0.0; y_len];
                crate::layout::transpose(
                    &pools[1],
                    &residual,
                    batch,
                    p.out_channels,
                    pixels.1,
                    &mut r_nhwc,
                )
                .unwrap();
                for (pool, from_nchw) in pools.iter().zip([false, true]) {
                    let mut y = vec![f32::NAN; y_len];
                    let r = with_residual.then_some(&r_nhwc[..]);
                    if from_nchw {
                        let len = conv.nchw_scratch_len(batch, pool.threads()).unwrap();
                        let mut scratch = vec![f32::NAN; len];
                        conv.run_nchw(pool, &x, batch, r, &mut y, &mut scratch)
                            .unwrap();
                    } else {
                        let mut scratch = vec![f32::NAN; conv.scratch_len(pool.threads()).unwrap()];
                        conv.run(pool, &x_nhwc, batch, r, &mut y, &mut scratch)
                            .unwrap();
                    }
                    let mut y_nchw = vec![0.0; y_len];
                    crate::layout::transpose(
                        pool,
                        &y,
                        batch,
                        pixels.1,
                        p.out_channels,
                        &mut y_nchw,
                    )
                    .unwrap();
                    for (j, (&got, (&w, &m))) in
                        y_nchw.iter().zip(want.iter().zip(&mag)).enumerate()
                    {
                        assert!(
                            (f64::from(got) - w).abs() <= 1e-5 * (m + 2.0),
                            "{isa:?} case {i} {} residual {with_residual} threads {} at {j}: {got} vs {w}",
                            conv.algorithm(),
                            pool.threads()
                        );
                    }
                }
            }
        }
    }
}

/// Weights scaled per output channel while they are packed give, bit for bit, what the
/// same weights scaled beforehand give; other layouts and wrong scales are refused.
#[test]
fn scaled_weights_equal_weights_scaled_beforehand() {
    let g = Gemm::new();
    let pool = ThreadPool::new(1).unwrap();
    for (i, p) in cases().iter().enumerate() {
        let (cig, _) = p.channels_per_group();
        let per_channel = cig * p.kernel[0] * p.kernel[1];
        let w = values(p.out_channels * per_channel, i as u32);
        let scale: Vec<f64> = (0..p.out_channels).map(|o| 0.5 + o as f64 / 7.0).collect();
        let scaled: Vec<f32> = w
            .iter()
            .enumerate()
            .map(|(j, &v)| (f64::from(v) * scale[j / per_channel]) as f32)
            .collect();
        let run = |w: ConvWeights<'_>| {
            let conv = Conv2d::new(&pool, g, *p, w, None, Activation::Identity).unwrap();
            let (x_len, y_len) = conv.io_len(1).unwrap();
            let x = values(x_len, 7);
            let mut y = vec![f32::NAN; y_len];
            let mut scratch = vec![0.0; conv.scratch_len(1).unwrap()];
            conv.run(&pool, &x, 1, &mut y, &mut scratch).unwrap();
            y
        };
        let (got, want) = (
            run(ConvWeights::oihw(&w).scaled(&scale)),
            run(ConvWeights::oihw(&scaled)),
        );
        let differs = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(differs, None, "case {i}: first differing output");
        let refused =
            |w: ConvWeights<'_>| Conv2d::new(&pool, g, *p, w, None, Activation::Identity).is_err();
        assert!(
            refused(ConvWeights::oihw(&w).scaled(&scale[1..])),
            "case {i}"
        );
        assert!(refused(ConvWeights::ohwi(&w)), "case {i}");
    }
}

#[test]
fn all_finite_finds_any_non_finite_value_in_any_block() {
    let edges = [f32::MAX, f32::MIN, f32::MIN_POSITIVE, 1e-45, -0.0];
    let mut v: Vec<f32> = (0..3000).map(|i| edges[i % edges.len()]).collect();
    assert!(super::all_finite(&v));
    assert!(super::all_finite(&[]));
    for at in [0, 1023, 1024, 2999] {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN] {
            let kept = v[at];
            v[at] = bad;
            assert!(!super::all_finite(&v), "{bad} at {at}");
            v[at] = kept;
        }
    }
}
