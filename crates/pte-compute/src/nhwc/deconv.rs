//! NHWC transposed 2-D convolution, one output row per task: each input row that
//! reaches the output row through a kernel row `ky` is multiplied by that kernel
//! row's weights (every kernel column and output channel of each input pixel at
//! once), and the products are added into the output pixels they reach, which start
//! at the bias. When the width axis tiles (stride equal to the kernel width, no
//! dilation or left padding, one group) and one input row reaches the output row —
//! a UNet's 2×2 stride-2 upsampling — the product is written straight into the row
//! with bias and activation, no buffer in between.

use crate::elementwise::{self, Activation};
use crate::error::{self, Error, Result};
use crate::gemm::{Bias, Epilogue, Gemm, PackedB};
use crate::mat::{MatMut, MatRef};
use crate::pool::{FirstError, ThreadPool};

/// A transposed convolution prepared for repeated runs.
#[derive(Debug)]
pub struct DeconvNhwc {
    input: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    /// Top, right, bottom, left: cropped from the full output.
    padding: [usize; 4],
    out: [usize; 2],
    groups: usize,
    cig: usize,
    cog: usize,
    gemm: Gemm,
    /// Per group, per kernel row `ky`: `[cig, kw·cog]`, column `kx·cog + oc`.
    weights: Vec<PackedB>,
    bias: Vec<f32>,
    /// The bias once per kernel column (a directly written row's columns), when the
    /// width axis tiles.
    tiled_bias: Option<Vec<f32>>,
    activation: Activation,
}

impl DeconvNhwc {
    /// Weights are `[groups·cog, kh, kw, cig]`; the output is `stride·(in - 1) +
    /// adjustment + dilated kernel - padding` per axis.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gemm: Gemm,
        input: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
        padding: [usize; 4],
        adjustment: [usize; 2],
        groups: usize,
        cig: usize,
        cog: usize,
        weights: &[f32],
        bias: Option<&[f32]>,
        activation: Activation,
    ) -> Result<Self> {
        let bad = |what: String| Error::InvalidParameter { what };
        if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) || groups == 0 {
            return Err(bad(format!(
                "kernel {kernel:?}, stride {stride:?}, dilation {dilation:?}, {groups} groups"
            )));
        }
        let axis =
            |input: usize, stride: usize, adj: usize, kernel: usize, dil: usize, pads: usize| {
                let full = input
                    .saturating_sub(1)
                    .checked_mul(stride)
                    .and_then(|v| v.checked_add(adj))
                    .and_then(|v| v.checked_add((kernel - 1).checked_mul(dil)? + 1))
                    .ok_or(Error::SizeOverflow {
                        what: "deconvolution output",
                    })?;
                full.checked_sub(pads)
                    .ok_or_else(|| bad(format!("padding {padding:?} exceeds the output")))
            };
        let [pt, pr, pb, pl] = padding;
        let out = [
            axis(
                input[0],
                stride[0],
                adjustment[0],
                kernel[0],
                dilation[0],
                pt + pb,
            )?,
            axis(
                input[1],
                stride[1],
                adjustment[1],
                kernel[1],
                dilation[1],
                pl + pr,
            )?,
        ];
        let [kh, kw] = kernel;
        let taps = error::mul(kh, kw, "kernel")?;
        let cout = error::mul(groups, cog, "output channels")?;
        let per_group = error::mul(error::mul(cog, taps, "weights")?, cig, "weights")?;
        error::need(
            "deconvolution weights",
            weights.len(),
            error::mul(per_group, groups, "weights")?,
        )?;
        let bias = crate::conv::bias_or_zeros(bias, cout)?;
        let n = error::mul(kw, cog, "deconvolution columns")?;
        let mut packed = Vec::with_capacity(groups * kh);
        let mut t = vec![0f32; error::mul(cig, n, "deconvolution weights")?];
        for gi in 0..groups {
            for ky in 0..kh {
                // B[ci, kx·cog + oc] = W[g·cog + oc, ky, kx, ci].
                for oc in 0..cog {
                    for kx in 0..kw {
                        let src = (((gi * cog + oc) * kh + ky) * kw + kx) * cig;
                        let taps = weights.get(src..src + cig).unwrap_or_default();
                        for (ci, &v) in taps.iter().enumerate() {
                            if let Some(d) = t.get_mut(ci * n + kx * cog + oc) {
                                *d = v;
                            }
                        }
                    }
                }
                packed.push(gemm.pack_b(MatRef::row_major(&t, cig, n)?)?);
            }
        }
        let tiles = stride[1] == kw && dilation[1] == 1 && pl == 0 && groups == 1;
        let tiled_bias = (tiles && out[1] >= input[1] * kw).then(|| bias.repeat(kw));
        Ok(Self {
            input,
            kernel,
            stride,
            dilation,
            padding,
            out,
            groups,
            cig,
            cog,
            gemm,
            weights: packed,
            bias,
            tiled_bias,
            activation,
        })
    }

    /// Output height and width.
    pub fn output_size(&self) -> [usize; 2] {
        self.out
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.groups * self.cog
    }

    /// Heap bytes held.
    pub fn bytes(&self) -> usize {
        let tiled = self.tiled_bias.as_ref().map_or(0, Vec::len);
        self.weights.iter().map(PackedB::bytes).sum::<usize>() + (self.bias.len() + tiled) * 4
    }

    /// Columns of one kernel row's product: every kernel column's output channels.
    fn cols(&self) -> usize {
        self.kernel[1] * self.cog
    }

    /// Per thread: one kernel row's products for an input row, and the product's
    /// scratch.
    fn per_thread(&self) -> Result<usize> {
        let iw = self.input[1];
        let products = error::mul(iw, self.cols(), "deconvolution products")?;
        let g = self.gemm.caller_scratch_len(iw, self.cols(), self.cig)?;
        error::add(products, g, "deconvolution scratch")
    }

    /// Scratch (f32) for a run on `threads` threads.
    pub fn scratch_len(&self, threads: usize) -> Result<usize> {
        error::mul(self.per_thread()?, threads, "deconvolution scratch")
    }

    /// The input rows reaching output row `oy`, each with its kernel row.
    fn sources(&self, oy: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let (ih, sh, dh, pt) = (
            self.input[0],
            self.stride[0],
            self.dilation[0],
            self.padding[0],
        );
        (0..self.kernel[0]).filter_map(move |ky| {
            let at = (oy + pt).checked_sub(ky * dh)?;
            (at % sh == 0 && at / sh < ih).then_some((at / sh, ky))
        })
    }

    /// Runs on `batch` NHWC images.
    pub fn run(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        batch: usize,
        y: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        let cin = self.groups * self.cig;
        let cout = self.groups * self.cog;
        let [ih, iw] = self.input;
        let [oh, ow] = self.out;
        let x_row = error::mul(iw, cin, "input")?;
        let x_len = error::mul(error::mul(ih, batch, "input")?, x_row, "input")?;
        error::need("deconvolution input", x.len(), x_len)?;
        let y_row = error::mul(ow, cout, "output")?;
        let y_len = error::mul(error::mul(oh, batch, "output")?, y_row, "output")?;
        error::need("deconvolution output", y.len(), y_len)?;
        let per_thread = self.per_thread()?;
        error::need(
            "deconvolution scratch",
            scratch.len(),
            self.scratch_len(pool.threads())?,
        )?;
        let y = y.get_mut(..y_len).unwrap_or_default();
        let failed = FirstError::default();
        pool.parallel_chunks(y, y_row, scratch, per_thread, |r, row, part| {
            let (n, oy) = (r / oh.max(1), r % oh.max(1));
            let image = x.get(n * ih * x_row..).unwrap_or_default();
            failed.keep(self.output_row(image, oy, row, part));
        })?;
        failed.into_result()
    }

    /// Output row `oy` of the image whose input is `image`.
    fn output_row(&self, image: &[f32], oy: usize, row: &mut [f32], part: &mut [f32]) -> Result {
        let (cin, cout, cols) = (self.groups * self.cig, self.groups * self.cog, self.cols());
        let [_, iw] = self.input;
        let [kh, kw] = self.kernel;
        let x_row = iw * cin;
        let isa = self.gemm.isa();
        let mut sources = self.sources(oy);
        let first = sources.next();
        if let (Some((iy, ky)), None, Some(bias)) = (first, sources.next(), &self.tiled_bias) {
            // The product's rows are the row's runs of kw pixels.
            let (head, tail) = row.split_at_mut((iw * cols).min(row.len()));
            let c = MatMut::new(head, iw, cols, cols, 1)?;
            let a = MatRef::new(image.get(iy * x_row..).unwrap_or_default(), iw, cin, cin, 1)?;
            let b = self
                .weights
                .get(ky)
                .ok_or_else(|| Error::InvalidParameter {
                    what: format!("deconvolution: no weights for kernel row {ky}"),
                })?;
            let epilogue = Epilogue {
                accumulate: false,
                bias: Bias::Col(bias),
                activation: self.activation,
            };
            self.gemm.run_on_caller(c, a, b, &epilogue, part)?;
            for px in tail.chunks_exact_mut(cout.max(1)) {
                elementwise::add_vector_activate(isa, px, &self.bias, self.activation)?;
            }
            return Ok(());
        }
        for px in row.chunks_exact_mut(cout.max(1)) {
            px.copy_from_slice(self.bias.get(..cout).unwrap_or_default());
        }
        let (products, gemm_scratch) = part.split_at_mut((iw * cols).min(part.len()));
        let (sw, dw, pl) = (self.stride[1], self.dilation[1], self.padding[3]);
        for (iy, ky) in self.sources(oy) {
            for gi in 0..self.groups {
                let a = MatRef::new(
                    image.get(iy * x_row + gi * self.cig..).unwrap_or_default(),
                    iw,
                    self.cig,
                    cin,
                    1,
                )?;
                let b = self
                    .weights
                    .get(gi * kh + ky)
                    .ok_or_else(|| Error::InvalidParameter {
                        what: format!("deconvolution: no weights for group {gi}, kernel row {ky}"),
                    })?;
                let c = MatMut::row_major(&mut *products, iw, cols)?;
                self.gemm
                    .run_on_caller(c, a, b, &Epilogue::default(), gemm_scratch)?;
                for ix in 0..iw {
                    for kx in 0..kw {
                        let Some(ox) = (ix * sw + kx * dw).checked_sub(pl) else {
                            continue;
                        };
                        let src = products
                            .get(ix * cols + kx * self.cog..)
                            .unwrap_or_default();
                        let d = ox * cout + gi * self.cog;
                        if let Some(dst) = row.get_mut(d..d + self.cog) {
                            for (o, &v) in dst.iter_mut().zip(src) {
                                *o += v;
                            }
                        }
                    }
                }
            }
        }
        elementwise::activate(isa, row, self.activation);
        Ok(())
    }
}
