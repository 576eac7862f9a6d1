//! The float32 fast paths (`install_fast_paths`) compute what the generic kernels
//! compute, on many shapes: odd sizes, sizes around the micro-kernels' block sizes,
//! strides, groups, padding, dilation, batches; fused chains (convolution, batch
//! normalization, residual addition, activation; product and activation) against the
//! same calls run one by one.
//!
//! Each program is run twice: with `reference_registry()` (generic kernels, no fusion)
//! and with a registry whose generic kernels for the fast operators are replaced by
//! kernels that fail, plus the fast paths — so a call that should take a fast path and
//! does not makes the test fail instead of passing on the generic kernel.

use pte_format::schema::executorch_flatbuffer::ScalarType::{Float, Long};
use pte_runtime::{
    Args, EValue, Kernel, KernelError, KernelRegistry, KernelResult, LoadOptions, Method,
    PreparedKernel, Program, Tensor,
};
use pte_testkit::program::{Memory, ProgramBuilder};
use pte_testkit::values;

/// A kernel that refuses to run: stands for a generic kernel the fast path must replace
/// (fast kernels may prepare the generic one beside them for shapes they do not
/// cover, but must not run it on these).
struct Refuse;

impl Kernel for Refuse {
    fn prepare(&self, _: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        Ok(Box::new(Refuse))
    }
}

impl PreparedKernel for Refuse {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        Err(KernelError::Failed(format!(
            "{}: the generic kernel ran",
            args.op()
        )))
    }
}

/// The reference kernels with `fast_ops` refused, then the fast paths.
fn fast_only(fast_ops: &[&str]) -> KernelRegistry {
    let mut r = pte_kernels::reference_registry();
    for op in fast_ops {
        r.register(op, Refuse);
    }
    pte_kernels::install_fast_paths(&mut r);
    r
}

fn load(bytes: &[u8], kernels: &KernelRegistry, threads: usize) -> Method {
    let options = LoadOptions {
        threads: Some(threads),
        ..LoadOptions::default()
    };
    Program::from_bytes(bytes)
        .unwrap()
        .load_method_with("forward", kernels, &Default::default(), &options)
        .unwrap()
}

/// Runs the method on `inputs` (float32 tensors) twice and returns every output of
/// the second execution (as f64), and the names of the operators that ran.
fn run(
    bytes: &[u8],
    kernels: &KernelRegistry,
    inputs: &[(Vec<usize>, Vec<f32>)],
    threads: usize,
) -> (Vec<Vec<f64>>, Vec<String>) {
    let mut m = load(bytes, kernels, threads);
    let inputs: Vec<EValue> = inputs
        .iter()
        .map(|(s, v)| EValue::Tensor(Tensor::from_slice(s, v).unwrap()))
        .collect();
    m.set_profiling(true);
    for _ in 0..2 {
        m.set_inputs(&inputs).unwrap();
        m.execute().unwrap();
    }
    let outputs = m
        .outputs()
        .unwrap()
        .iter()
        .map(|v| {
            let t = v.as_tensor().unwrap();
            match t.dtype() {
                pte_runtime::DType::F32 => t
                    .as_slice::<f32>()
                    .unwrap()
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect(),
                pte_runtime::DType::I64 => t
                    .as_slice::<i64>()
                    .unwrap()
                    .iter()
                    .map(|&x| x as f64)
                    .collect(),
                d => panic!("unexpected output dtype {d}"),
            }
        })
        .collect();
    let ran = m.profile().into_iter().map(|e| e.name).collect();
    (outputs, ran)
}

/// Asserts `got` matches `want` within float32 rounding of sums of `terms` products of
/// values of magnitude about `scale`.
fn assert_close(got: &[Vec<f64>], want: &[Vec<f64>], terms: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: number of outputs");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len(), "{what}: output length");
        let scale = w.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let tol = 1e-6 * scale * (terms as f64).sqrt().max(1.0) * 4.0;
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            let ok = (a - b).abs() <= tol + 1e-6 * b.abs() || (a.is_nan() && b.is_nan());
            assert!(
                ok,
                "{what}: element {i}: fast {a} vs reference {b} (tolerance {tol})"
            );
        }
    }
}

fn dims(v: &[usize]) -> Vec<i32> {
    v.iter().map(|&d| d as i32).collect()
}

/// A convolution and what follows it in a test program.
#[derive(Clone, Copy, Debug)]
struct Conv {
    batch: usize,
    c_in: usize,
    c_out: usize,
    groups: usize,
    /// Input height (1 with `one_d`) and width.
    input: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 2],
    dilation: [usize; 2],
    one_d: bool,
    bias: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum After {
    Nothing,
    Relu,
    Hardtanh,
    Silu,
    Sigmoid,
    Gelu,
    /// `clamp(x, 0, None)` then `clamp(·, None, 6)`.
    Relu6Pair,
    /// `x · relu6(x + 3) / 6` in the calls exporters decompose it into, the 3 and 6
    /// one-element constants copied by `_to_dim_order_copy`.
    HardSwish,
    /// The same without the product by `x`.
    HardSigmoid,
    /// `leaky_relu(x, 0.1)`.
    LeakyRelu,
}

impl Conv {
    fn out(&self) -> [usize; 2] {
        let axis = |a: usize| {
            (self.input[a] + 2 * self.pad[a] - self.dilation[a] * (self.kernel[a] - 1) - 1)
                / self.stride[a]
                + 1
        };
        [axis(0), axis(1)]
    }

    fn x_sizes(&self) -> Vec<usize> {
        let mut s = vec![self.batch, self.c_in];
        if !self.one_d {
            s.push(self.input[0]);
        }
        s.push(self.input[1]);
        s
    }

    fn y_sizes(&self) -> Vec<usize> {
        let o = self.out();
        let mut s = vec![self.batch, self.c_out];
        if !self.one_d {
            s.push(o[0]);
        }
        s.push(o[1]);
        s
    }

    fn pair(&self, v: [usize; 2]) -> Vec<i64> {
        if self.one_d {
            vec![v[1] as i64]
        } else {
            vec![v[0] as i64, v[1] as i64]
        }
    }

    /// A program: `act(add(bn(conv(x)), r))` with the optional parts as asked; inputs
    /// `x` (and `r`).
    fn program(&self, bn: bool, residual: bool, after: After) -> Vec<u8> {
        let mut b = ProgramBuilder::new();
        let x = b.tensor(Float, &dims(&self.x_sizes()), Memory::Planned);
        let mut w_sizes = vec![self.c_out, self.c_in / self.groups];
        if !self.one_d {
            w_sizes.push(self.kernel[0]);
        }
        w_sizes.push(self.kernel[1]);
        let wn: usize = w_sizes.iter().product();
        let w = b.constant(Float, &dims(&w_sizes), bytemuck::cast_slice(&values(wn, 1)));
        let bias = if self.bias {
            b.constant(
                Float,
                &[self.c_out as i32],
                bytemuck::cast_slice(&values(self.c_out, 2)),
            )
        } else {
            b.none()
        };
        let stride = b.int_list(&self.pair(self.stride));
        let pad = b.int_list(&self.pair(self.pad));
        let dil = b.int_list(&self.pair(self.dilation));
        let transposed = b.bool(false);
        let out_pad = b.int_list(&self.pair([0, 0]));
        let groups = b.int(self.groups as i64);
        let ys = dims(&self.y_sizes());
        let mut y = b.tensor(Float, &ys, Memory::Planned);
        b.call(
            "aten::convolution",
            "out",
            &[
                x, w, bias, stride, pad, dil, transposed, out_pad, groups, y, y,
            ],
        );
        b.input(x);
        if bn {
            y = batch_norm(&mut b, y, &ys, true);
        }
        if residual {
            let r = b.tensor(Float, &ys, Memory::Planned);
            b.input(r);
            let alpha = b.int(1);
            let out = b.tensor(Float, &ys, Memory::Planned);
            b.call("aten::add", "out", &[y, r, alpha, out, out]);
            y = out;
        }
        y = activation(&mut b, y, &ys, after);
        b.output(y);
        b.build()
    }
}

/// Appends an inference batch normalization of `y` (shape `ys`, channels at dim 1),
/// with a weight and bias when `affine`, and returns its output.
fn batch_norm(b: &mut ProgramBuilder, y: i32, ys: &[i32], affine: bool) -> i32 {
    let c = ys[1];
    let n = c as usize;
    let mut vector = |seed| b.constant(Float, &[c], bytemuck::cast_slice(&values(n, seed)));
    let (gamma, beta) = if affine {
        (vector(3), vector(4))
    } else {
        (b.none(), b.none())
    };
    let mean = b.constant(Float, &[c], bytemuck::cast_slice(&values(n, 5)));
    let var: Vec<f32> = values(n, 6).iter().map(|v| v.abs() + 0.5).collect();
    let var = b.constant(Float, &[c], bytemuck::cast_slice(&var));
    let (momentum, eps) = (b.double(0.1), b.double(1e-5));
    let out = b.tensor(Float, ys, Memory::Planned);
    let sm = b.tensor(Float, &[0], Memory::Planned);
    let si = b.tensor(Float, &[0], Memory::Planned);
    let list = b.tensor_list(&[out, sm, si]);
    b.call(
        "aten::_native_batch_norm_legit_no_training",
        "out",
        &[y, gamma, beta, mean, var, momentum, eps, out, sm, si, list],
    );
    out
}

/// Appends `after` applied to `y` (shape `ys`) and returns its output.
fn activation(b: &mut ProgramBuilder, y: i32, ys: &[i32], after: After) -> i32 {
    let out = b.tensor(Float, ys, Memory::Planned);
    match after {
        After::Nothing => return y,
        After::Relu => b.call("aten::relu", "out", &[y, out, out]),
        After::Hardtanh => {
            let (lo, hi) = (b.double(0.0), b.double(6.0));
            b.call("aten::hardtanh", "out", &[y, lo, hi, out, out]);
        }
        After::Sigmoid => b.call("aten::sigmoid", "out", &[y, out, out]),
        After::LeakyRelu => {
            let slope = b.double(0.1);
            b.call("aten::leaky_relu", "out", &[y, slope, out, out]);
        }
        After::Silu => {
            let s = b.tensor(Float, ys, Memory::Planned);
            b.call("aten::sigmoid", "out", &[y, s, s]);
            b.call("aten::mul", "out", &[y, s, out, out]);
        }
        After::Gelu => {
            let approx = b.string("none");
            b.call("aten::gelu", "out", &[y, approx, out, out]);
        }
        After::Relu6Pair => return relu6_pair(b, y, ys),
        After::HardSwish | After::HardSigmoid => {
            let three = scalar_tensor(b, 3.0);
            let shifted = b.tensor(Float, ys, Memory::Planned);
            let alpha = b.int(1);
            b.call("aten::add", "out", &[y, three, alpha, shifted, shifted]);
            let mut c = relu6_pair(b, shifted, ys);
            if after == After::HardSwish {
                let p = b.tensor(Float, ys, Memory::Planned);
                b.call("aten::mul", "out", &[y, c, p, p]);
                c = p;
            }
            let six = scalar_tensor(b, 6.0);
            b.call("aten::div", "out", &[c, six, out, out]);
        }
    }
    out
}

/// `clamp(clamp(y, 0, None), None, 6)`'s output.
fn relu6_pair(b: &mut ProgramBuilder, y: i32, ys: &[i32]) -> i32 {
    let (zero, six, none) = (b.double(0.0), b.double(6.0), b.none());
    let lo = b.tensor(Float, ys, Memory::Planned);
    b.call("aten::clamp", "out", &[y, zero, none, lo, lo]);
    let hi = b.tensor(Float, ys, Memory::Planned);
    b.call("aten::clamp", "out", &[lo, none, six, hi, hi]);
    hi
}

/// A planned 0-d tensor holding `v`, copied from a constant at each execution (as
/// exporters write scalar operands).
fn scalar_tensor(b: &mut ProgramBuilder, v: f32) -> i32 {
    let k = b.constant(Float, &[], bytemuck::bytes_of(&v));
    let out = b.tensor(Float, &[], Memory::Planned);
    let (non_blocking, order) = (b.bool(false), b.int_list(&[]));
    b.call(
        "dim_order_ops::_to_dim_order_copy",
        "out",
        &[k, non_blocking, order, out, out],
    );
    out
}

fn conv(
    batch: usize,
    (c_in, c_out, groups): (usize, usize, usize),
    input: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 2],
    dilation: [usize; 2],
) -> Conv {
    Conv {
        batch,
        c_in,
        c_out,
        groups,
        input,
        kernel,
        stride,
        pad,
        dilation,
        one_d: false,
        bias: true,
    }
}

fn check_conv(c: Conv, bn: bool, residual: bool, after: After, threads: usize) {
    let bytes = c.program(bn, residual, after);
    let xn: usize = c.x_sizes().iter().product();
    let yn: usize = c.y_sizes().iter().product();
    let mut inputs = vec![(c.x_sizes(), values(xn, 7))];
    if residual {
        inputs.push((c.y_sizes(), values(yn, 8)));
    }
    let what = format!("{c:?} bn {bn} residual {residual} {after:?} threads {threads}");
    let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
    let refused = [
        "aten::convolution.out",
        "aten::_native_batch_norm_legit_no_training.out",
    ];
    let refused = if bn { &refused[..] } else { &refused[..1] };
    let (got, ran) = run(&bytes, &fast_only(refused), &inputs, threads);
    let terms = c.c_in / c.groups * c.kernel[0] * c.kernel[1];
    assert_close(&got, &want, terms, &what);
    if bn || residual || after != After::Nothing {
        assert!(
            ran.len() == 1 && ran[0].starts_with("fused convolution"),
            "{what}: not fused: {ran:?}"
        );
    }
}

#[test]
fn convolutions_match_the_generic_kernel() {
    let cases = [
        // pointwise, around the 6 x 16 register tile and the blocks
        conv(1, (16, 96, 1), [7, 9], [1, 1], [1, 1], [0, 0], [1, 1]),
        conv(1, (5, 7, 1), [13, 11], [1, 1], [1, 1], [0, 0], [1, 1]),
        conv(2, (3, 17, 1), [5, 5], [1, 1], [1, 1], [0, 0], [1, 1]),
        conv(1, (300, 130, 1), [3, 4], [1, 1], [1, 1], [0, 0], [1, 1]),
        // strided pointwise (a downsampling shortcut)
        conv(1, (8, 16, 1), [9, 9], [1, 1], [2, 2], [0, 0], [1, 1]),
        // 3 x 3 and 7 x 7, stride, padding, dilation
        conv(1, (3, 8, 1), [16, 16], [3, 3], [1, 1], [1, 1], [1, 1]),
        conv(1, (4, 6, 1), [15, 17], [3, 3], [2, 2], [1, 1], [1, 1]),
        conv(2, (5, 9, 1), [12, 10], [3, 3], [1, 2], [2, 1], [2, 2]),
        conv(1, (3, 16, 1), [23, 23], [7, 7], [2, 2], [3, 3], [1, 1]),
        conv(1, (7, 5, 1), [6, 8], [2, 3], [1, 1], [0, 1], [1, 1]),
        conv(1, (70, 20, 1), [9, 9], [3, 3], [1, 1], [1, 1], [1, 1]),
        // groups and depthwise (with a channel multiplier)
        conv(1, (8, 12, 4), [10, 10], [3, 3], [1, 1], [1, 1], [1, 1]),
        conv(1, (32, 32, 32), [14, 14], [3, 3], [1, 1], [1, 1], [1, 1]),
        conv(2, (24, 24, 24), [15, 13], [3, 3], [2, 2], [1, 1], [1, 1]),
        conv(1, (6, 12, 6), [9, 11], [5, 5], [1, 1], [2, 2], [1, 1]),
        conv(1, (16, 16, 16), [7, 7], [3, 3], [1, 1], [2, 2], [2, 2]),
        // a kernel as large as the padded input
        conv(1, (2, 3, 1), [4, 4], [4, 4], [1, 1], [0, 0], [1, 1]),
    ];
    for c in cases {
        for threads in [1, 2] {
            check_conv(c, false, false, After::Nothing, threads);
        }
        check_conv(Conv { bias: false, ..c }, false, false, After::Nothing, 1);
    }
    // 1-d
    for (c_in, c_out, groups, w, k, s, p, d) in [
        (4, 6, 1, 50, 3, 1, 1, 1),
        (8, 8, 8, 33, 5, 2, 2, 1),
        (3, 5, 1, 40, 4, 3, 0, 2),
    ] {
        let c = Conv {
            one_d: true,
            ..conv(
                2,
                (c_in, c_out, groups),
                [1, w],
                [1, k],
                [1, s],
                [0, p],
                [1, d],
            )
        };
        check_conv(c, false, false, After::Nothing, 1);
        check_conv(c, true, false, After::Relu, 2);
    }
}

/// Found by the `mutate` fuzz target: a convolution with no output channels made weight
/// packing panic. Empty convolutions run the generic kernel, with PyTorch's results.
#[test]
fn empty_convolutions_match_the_generic_kernel() {
    for c in [
        conv(1, (4, 0, 1), [5, 5], [3, 3], [1, 1], [1, 1], [1, 1]),
        conv(1, (0, 3, 1), [5, 5], [3, 3], [1, 1], [1, 1], [1, 1]),
        conv(0, (2, 3, 1), [5, 5], [3, 3], [1, 1], [1, 1], [1, 1]),
    ] {
        let bytes = c.program(false, false, After::Nothing);
        let inputs = [(c.x_sizes(), values(c.x_sizes().iter().product(), 7))];
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        let (got, _) = run(&bytes, &pte_kernels::registry(), &inputs, 1);
        assert_close(&got, &want, 1, &format!("{c:?}"));
    }
}

#[test]
fn fused_convolution_chains_match_the_calls_one_by_one() {
    let shapes = [
        conv(1, (8, 16, 1), [10, 10], [3, 3], [1, 1], [1, 1], [1, 1]),
        conv(2, (12, 7, 1), [9, 7], [1, 1], [1, 1], [0, 0], [1, 1]),
        conv(1, (16, 16, 16), [11, 9], [3, 3], [2, 2], [1, 1], [1, 1]),
    ];
    let afters = [
        After::Nothing,
        After::Relu,
        After::Hardtanh,
        After::Silu,
        After::Sigmoid,
        After::Gelu,
        After::Relu6Pair,
        After::HardSwish,
        After::HardSigmoid,
        After::LeakyRelu,
    ];
    for c in shapes {
        for after in afters {
            for bn in [false, true] {
                check_conv(c, bn, false, after, 1);
            }
        }
        for after in [After::Nothing, After::Relu] {
            check_conv(c, true, true, after, 2);
            check_conv(Conv { bias: false, ..c }, false, true, after, 1);
        }
    }
}

/// `addmm(bias, x, permute(w))`, `linear(x, w, bias)` or `mm(x, w)` then `after`.
fn product_program(
    op: &str,
    m: usize,
    k: usize,
    n: usize,
    after: After,
    lead: &[usize],
) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let mut x_sizes: Vec<usize> = lead.to_vec();
    x_sizes.extend([m, k]);
    let x = b.tensor(Float, &dims(&x_sizes), Memory::Planned);
    b.input(x);
    let mut y_sizes: Vec<usize> = lead.to_vec();
    y_sizes.extend([m, n]);
    let ys = dims(&y_sizes);
    let y = b.tensor(Float, &ys, Memory::Planned);
    let w = values(k * n, 11);
    let bias = b.constant(Float, &[n as i32], bytemuck::cast_slice(&values(n, 12)));
    match op {
        "addmm" => {
            // The exporter's form: the weight [n, k] transposed by a permute at load.
            let wt = b.constant(Float, &[n as i32, k as i32], bytemuck::cast_slice(&w));
            let perm = b.int_list(&[1, 0]);
            let wk = b.tensor(Float, &[k as i32, n as i32], Memory::Planned);
            b.call("aten::permute_copy", "out", &[wt, perm, wk, wk]);
            let (beta, alpha) = (b.int(1), b.int(1));
            b.call("aten::addmm", "out", &[bias, x, wk, beta, alpha, y, y]);
        }
        "linear" => {
            let wt = b.constant(Float, &[n as i32, k as i32], bytemuck::cast_slice(&w));
            b.call("aten::linear", "out", &[x, wt, bias, y, y]);
        }
        _ => {
            let wk = b.constant(Float, &[k as i32, n as i32], bytemuck::cast_slice(&w));
            b.call("aten::mm", "out", &[x, wk, y, y]);
        }
    }
    let out = activation(&mut b, y, &ys, after);
    b.output(out);
    b.build()
}

#[test]
fn products_with_constant_weights_match_the_generic_kernel() {
    let shapes = [
        (1, 1, 1),
        (1, 256, 1000),
        (5, 7, 3),
        (6, 16, 16),
        (7, 17, 33),
        (64, 256, 768),
        (13, 300, 129),
        (130, 70, 250),
    ];
    for (m, k, n) in shapes {
        for op in ["addmm", "linear", "mm"] {
            let bytes = product_program(op, m, k, n, After::Nothing, &[]);
            let inputs = [(vec![m, k], values(m * k, 13))];
            let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
            let refused = [format!("aten::{op}.out")];
            let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
            for threads in [1, 2] {
                let (got, _) = run(&bytes, &fast_only(&refused), &inputs, threads);
                assert_close(
                    &got,
                    &want,
                    k,
                    &format!("{op} {m}x{k}x{n}, {threads} threads"),
                );
            }
        }
    }
    // linear over leading dimensions
    let bytes = product_program("linear", 9, 20, 11, After::Nothing, &[2, 3]);
    let inputs = [(vec![2, 3, 9, 20], values(2 * 3 * 9 * 20, 14))];
    let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
    let (got, _) = run(&bytes, &fast_only(&["aten::linear.out"]), &inputs, 2);
    assert_close(&got, &want, 20, "linear with leading dimensions");
}

#[test]
fn fused_products_match_the_calls_one_by_one() {
    let afters = [
        After::Relu,
        After::Gelu,
        After::Hardtanh,
        After::Silu,
        After::HardSwish,
        After::LeakyRelu,
    ];
    for after in afters {
        for (op, m, k, n) in [
            ("addmm", 64, 256, 1024),
            ("linear", 7, 33, 20),
            ("mm", 3, 5, 17),
        ] {
            let bytes = product_program(op, m, k, n, after, &[]);
            let inputs = [(vec![m, k], values(m * k, 15))];
            let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
            let (got, ran) = run(&bytes, &pte_kernels::registry(), &inputs, 2);
            let what = format!("{op} {m}x{k}x{n} {after:?}");
            assert_close(&got, &want, k, &what);
            assert!(
                ran.len() == 1 && ran[0].starts_with("fused"),
                "{what}: not fused: {ran:?}"
            );
        }
    }
}

#[test]
fn variable_products_match_the_generic_kernel() {
    for (batch, m, k, n) in [
        (1, 5, 7, 3),
        (12, 64, 64, 64),
        (3, 17, 1, 33),
        (4, 130, 40, 9),
    ] {
        for batched in [false, true] {
            if !batched && batch > 1 {
                continue;
            }
            let lead: Vec<usize> = if batched { vec![batch] } else { vec![] };
            let mut b = ProgramBuilder::new();
            let sizes = |r: usize, c: usize| {
                let mut s = lead.clone();
                s.extend([r, c]);
                s
            };
            let x = b.tensor(Float, &dims(&sizes(m, k)), Memory::Planned);
            let w = b.tensor(Float, &dims(&sizes(k, n)), Memory::Planned);
            let y = b.tensor(Float, &dims(&sizes(m, n)), Memory::Planned);
            let op = if batched { "aten::bmm" } else { "aten::mm" };
            b.call(op, "out", &[x, w, y, y]);
            b.input(x);
            b.input(w);
            b.output(y);
            let bytes = b.build();
            let inputs = [
                (sizes(m, k), values(batch * m * k, 16)),
                (sizes(k, n), values(batch * k * n, 17)),
            ];
            let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
            let (got, _) = run(&bytes, &fast_only(&[&format!("{op}.out")]), &inputs, 2);
            assert_close(&got, &want, k, &format!("{op} {batch}x{m}x{k}x{n}"));
        }
    }
}

#[test]
fn max_pooling_matches_the_generic_kernel() {
    // (input, kernel, stride, padding, dilation, ceil_mode)
    let cases = [
        (
            [112usize, 112usize],
            [3usize, 3],
            [2usize, 2],
            [1usize, 1],
            [1usize, 1],
            false,
        ),
        ([13, 17], [2, 2], [2, 2], [0, 0], [1, 1], true),
        ([9, 9], [3, 2], [1, 2], [1, 1], [2, 1], false),
        ([5, 6], [5, 6], [1, 1], [0, 0], [1, 1], false),
    ];
    for (input, kernel, stride, pad, dil, ceil) in cases {
        let axis = |a: usize| {
            let span = input[a] + 2 * pad[a] - dil[a] * (kernel[a] - 1) - 1;
            let mut o = if ceil {
                span.div_ceil(stride[a]) + 1
            } else {
                span / stride[a] + 1
            };
            if ceil && (o - 1) * stride[a] >= input[a] + pad[a] {
                o -= 1;
            }
            o
        };
        let out = [axis(0), axis(1)];
        for indices_used in [false, true] {
            let mut b = ProgramBuilder::new();
            let xs = [2, 3, input[0], input[1]];
            let ys = dims(&[2, 3, out[0], out[1]]);
            let x = b.tensor(Float, &dims(&xs), Memory::Planned);
            let list =
                |b: &mut ProgramBuilder, v: [usize; 2]| b.int_list(&[v[0] as i64, v[1] as i64]);
            let (k, s, p, d) = (
                list(&mut b, kernel),
                list(&mut b, stride),
                list(&mut b, pad),
                list(&mut b, dil),
            );
            let c = b.bool(ceil);
            let y = b.tensor(Float, &ys, Memory::Planned);
            let idx = b.tensor(Long, &ys, Memory::Planned);
            let outs = b.tensor_list(&[y, idx]);
            b.call(
                "aten::max_pool2d_with_indices",
                "out",
                &[x, k, s, p, d, c, y, idx, outs],
            );
            b.input(x);
            b.output(y);
            if indices_used {
                b.output(idx);
            }
            let bytes = b.build();
            let n: usize = xs.iter().product();
            let mut data = values(n, 18);
            data[3] = f32::NAN;
            let inputs = [(xs.to_vec(), data)];
            let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
            let (got, ran) = run(
                &bytes,
                &fast_only(&["aten::max_pool2d_with_indices.out"]),
                &inputs,
                2,
            );
            let what =
                format!("{input:?} {kernel:?} {stride:?} {pad:?} {dil:?} {ceil} {indices_used}");
            assert_eq!(got.len(), want.len(), "{what}");
            for (g, w) in got.iter().zip(&want) {
                for (a, b) in g.iter().zip(w) {
                    assert!(a == b || (a.is_nan() && b.is_nan()), "{what}: {a} vs {b}");
                }
            }
            let fused = ran.iter().any(|r| r == "max_pool2d");
            assert_eq!(fused, !indices_used, "{what}: {ran:?}");
        }
    }
}

#[test]
fn average_pooling_matches_the_generic_kernel() {
    // (input, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    let cases = [
        (
            [56usize, 56usize],
            [2usize, 2],
            [2usize, 2],
            [0usize, 0],
            false,
            true,
            None,
        ),
        ([13, 17], [3, 3], [2, 2], [1, 1], true, false, None),
        ([13, 17], [3, 3], [2, 2], [1, 1], false, true, None),
        ([9, 7], [3, 2], [1, 2], [1, 0], false, true, Some(5)),
        ([7, 7], [7, 7], [1, 1], [0, 0], false, true, None),
    ];
    for (input, kernel, stride, pad, ceil, include_pad, divisor) in cases {
        let axis = |a: usize| {
            let span = input[a] + 2 * pad[a] - kernel[a];
            let mut o = if ceil {
                span.div_ceil(stride[a]) + 1
            } else {
                span / stride[a] + 1
            };
            if ceil && (o - 1) * stride[a] >= input[a] + pad[a] {
                o -= 1;
            }
            o
        };
        let xs = [2, 5, input[0], input[1]];
        let ys = dims(&[2, 5, axis(0), axis(1)]);
        let mut b = ProgramBuilder::new();
        let x = b.tensor(Float, &dims(&xs), Memory::Planned);
        let list = |b: &mut ProgramBuilder, v: [usize; 2]| b.int_list(&[v[0] as i64, v[1] as i64]);
        let (k, s, p) = (
            list(&mut b, kernel),
            list(&mut b, stride),
            list(&mut b, pad),
        );
        let (c, i) = (b.bool(ceil), b.bool(include_pad));
        let d = match divisor {
            Some(d) => b.int(d),
            None => b.none(),
        };
        let y = b.tensor(Float, &ys, Memory::Planned);
        b.call("aten::avg_pool2d", "out", &[x, k, s, p, c, i, d, y, y]);
        b.input(x);
        b.output(y);
        let bytes = b.build();
        let inputs = [(xs.to_vec(), values(xs.iter().product(), 19))];
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        for threads in [1, 2] {
            let fast = fast_only(&["aten::avg_pool2d.out"]);
            let (got, _) = run(&bytes, &fast, &inputs, threads);
            let what =
                format!("{input:?} {kernel:?} {stride:?} {pad:?} {ceil} {include_pad} {divisor:?}");
            assert_close(&got, &want, kernel[0] * kernel[1], &what);
        }
    }
}

#[test]
fn concatenations_normalized_and_activated_match_the_calls_one_by_one() {
    // (part channels, batch, height × width, batch norm weights, activation); parts past
    // eight are read in a second group; an empty part list is a lone batch norm.
    type Case = (&'static [usize], usize, [usize; 2], bool, After);
    let cases: [Case; 6] = [
        (&[64, 32, 32], 1, [56, 56], true, After::Relu),
        (&[3, 5], 2, [7, 9], false, After::Relu),
        (
            &[16, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8],
            1,
            [14, 14],
            true,
            After::Relu,
        ),
        (
            &[4, 6, 2, 7, 1, 3, 5, 2, 9],
            2,
            [5, 3],
            true,
            After::Nothing,
        ),
        (&[], 2, [6, 5], true, After::Hardtanh),
        (&[2, 3], 3, [1, 1], true, After::Silu),
    ];
    for (parts, batch, [h, w], affine, after) in cases {
        let mut b = ProgramBuilder::new();
        let channels = if parts.is_empty() {
            6
        } else {
            parts.iter().sum()
        };
        let mut inputs = Vec::new();
        let mut xs = Vec::new();
        for (k, &c) in parts
            .iter()
            .chain(parts.is_empty().then_some(&6))
            .enumerate()
        {
            let sizes = vec![batch, c, h, w];
            let x = b.tensor(Float, &dims(&sizes), Memory::Planned);
            b.input(x);
            xs.push(x);
            inputs.push((sizes.clone(), values(sizes.iter().product(), 30 + k as u64)));
        }
        let ys = dims(&[batch, channels, h, w]);
        let mut y = xs[0];
        if !parts.is_empty() {
            let list = b.tensor_list(&xs);
            let dim = b.int(1);
            y = b.tensor(Float, &ys, Memory::Planned);
            b.call("aten::cat", "out", &[list, dim, y, y]);
        }
        y = batch_norm(&mut b, y, &ys, affine);
        y = activation(&mut b, y, &ys, after);
        b.output(y);
        let bytes = b.build();
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        let refused = [
            "aten::cat.out",
            "aten::_native_batch_norm_legit_no_training.out",
        ];
        for threads in [1, 2] {
            let (got, ran) = run(&bytes, &fast_only(&refused), &inputs, threads);
            let what = format!("{parts:?} batch {batch} {h}x{w} {affine} {after:?}");
            assert_close(&got, &want, 1, &what);
            let fused = ran
                .iter()
                .any(|r| r.starts_with("fused") && r.contains("batch_norm"));
            assert!(fused, "{what}: {ran:?}");
        }
    }
}

/// A program of one call `op(x, extra..., out)` with `x` as its input; `extra` builds
/// the arguments between the input and the output.
fn unary_program(
    op: &str,
    overload: &str,
    x_sizes: &[usize],
    out_sizes: &[usize],
    extra: impl FnOnce(&mut ProgramBuilder) -> Vec<i32>,
    extra_outputs: &[Vec<usize>],
) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &dims(x_sizes), Memory::Planned);
    b.input(x);
    let mut args = vec![x];
    args.extend(extra(&mut b));
    let y = b.tensor(Float, &dims(out_sizes), Memory::Planned);
    let mut outs = vec![y];
    for s in extra_outputs {
        outs.push(b.tensor(Float, &dims(s), Memory::Planned));
    }
    args.extend(&outs);
    if outs.len() > 1 {
        let list = b.tensor_list(&outs);
        args.push(list);
    } else {
        args.push(y);
    }
    b.call(op, overload, &args);
    for o in outs {
        b.output(o);
    }
    b.build()
}

fn compare(bytes: &[u8], op: &str, inputs: &[(Vec<usize>, Vec<f32>)], terms: usize, what: &str) {
    let (want, _) = run(bytes, &pte_kernels::reference_registry(), inputs, 1);
    for threads in [1, 2] {
        let (got, _) = run(bytes, &fast_only(&[op]), inputs, threads);
        assert_close(&got, &want, terms, &format!("{what}, {threads} threads"));
    }
}

#[test]
fn bilinear_upsampling_matches_the_generic_kernel() {
    // (input, output, align_corners, scale factors instead of sizes)
    type Case = ([usize; 4], [usize; 2], bool, Option<[f64; 2]>);
    let cases: &[Case] = &[
        ([1, 21, 28, 28], [224, 224], false, None),
        ([2, 3, 1, 1], [14, 14], false, None),
        ([1, 5, 7, 9], [13, 4], true, None),
        ([1, 4, 13, 6], [5, 17], false, None),
        ([1, 3, 5, 6], [12, 9], false, Some([2.5, 1.5])),
        ([1, 2, 6, 6], [12, 12], true, Some([2.0, 2.0])),
        ([1, 2, 1, 7], [3, 1], true, None),
    ];
    for &(xs, [oh, ow], align_corners, scales) in cases {
        let ys = [xs[0], xs[1], oh, ow];
        let bytes = unary_program(
            "aten::upsample_bilinear2d",
            "vec_out",
            &xs,
            &ys,
            |b| {
                let size = match scales {
                    Some(_) => b.none(),
                    None => b.int_list(&[oh as i64, ow as i64]),
                };
                let align = b.bool(align_corners);
                let factors = match scales {
                    Some(f) => b.double_list(&f),
                    None => b.none(),
                };
                vec![size, align, factors]
            },
            &[],
        );
        let inputs = [(xs.to_vec(), values(xs.iter().product(), 31))];
        let what = format!("{xs:?} -> {oh}x{ow}, align_corners {align_corners}, scales {scales:?}");
        compare(
            &bytes,
            "aten::upsample_bilinear2d.vec_out",
            &inputs,
            4,
            &what,
        );
    }
}

/// Builds the arguments of a call between its input and its output.
type Extra = dyn Fn(&mut ProgramBuilder) -> Vec<i32>;

#[test]
fn activations_match_the_generic_kernels() {
    // Around the vector widths, and past the size that is split over threads.
    for n in [1usize, 7, 8, 33, 1000, 70_001] {
        let mut x = values(n, 20);
        x.iter_mut().for_each(|v| *v *= 8.0);
        if n > 3 {
            x[1] = f32::NAN;
            x[2] = -0.0;
        }
        let inputs = [(vec![n], x)];
        let cases: [(&str, Box<Extra>); 8] = [
            ("relu", Box::new(|_| vec![])),
            ("sigmoid", Box::new(|_| vec![])),
            ("tanh", Box::new(|_| vec![])),
            ("silu", Box::new(|_| vec![])),
            ("hardswish", Box::new(|_| vec![])),
            ("gelu", Box::new(|b| vec![b.string("tanh")])),
            (
                "hardtanh",
                Box::new(|b| vec![b.double(-1.5), b.double(2.0)]),
            ),
            ("clamp", Box::new(|b| vec![b.none(), b.int(3)])),
        ];
        for (op, extra) in cases {
            let bytes = unary_program(&format!("aten::{op}"), "out", &[n], &[n], extra, &[]);
            compare(
                &bytes,
                &format!("aten::{op}.out"),
                &inputs,
                1,
                &format!("{op} of {n}"),
            );
        }
        let bytes = unary_program(
            "aten::gelu",
            "out",
            &[n],
            &[n],
            |b| vec![b.string("none")],
            &[],
        );
        compare(
            &bytes,
            "aten::gelu.out",
            &inputs,
            1,
            &format!("gelu of {n}"),
        );
    }
}

#[test]
fn binary_operations_match_the_generic_kernels() {
    // (self, other): equal shapes, a per-channel vector (NCHW and trailing), a
    // one-element tensor, `self`'s last dims repeated over the first (an attention
    // bias over the heads, split over threads; fewer dims; fewer dims of the same
    // elements, as an LSTM's gates); `other` as a scalar below.
    let shapes: [(&[usize], &[usize]); 10] = [
        (&[1, 1, 512], &[1, 512]),
        (&[2, 3, 5, 7], &[2, 3, 5, 7]),
        (&[1, 96, 28, 28], &[1, 96, 1, 1]),
        (&[2, 16, 9, 9], &[16, 1, 1]),
        (&[3, 197, 192], &[192]),
        (&[4, 50, 33], &[1, 1, 33]),
        (&[5, 70_000], &[1]),
        (&[64, 3, 49, 49], &[1, 3, 49, 49]),
        (&[7, 5, 33], &[5, 33]),
        (&[3, 1, 4, 9], &[1, 1, 4, 9]),
    ];
    for (xs, ys) in shapes {
        for (op, alpha) in [("add", true), ("sub", true), ("mul", false)] {
            let bytes = unary_program(
                &format!("aten::{op}"),
                "out",
                xs,
                xs,
                |b| {
                    let y = b.tensor(Float, &dims(ys), Memory::Planned);
                    b.input(y);
                    if alpha {
                        vec![y, b.int(1)]
                    } else {
                        vec![y]
                    }
                },
                &[],
            );
            let (xn, yn) = (xs.iter().product(), ys.iter().product());
            let inputs = [(xs.to_vec(), values(xn, 21)), (ys.to_vec(), values(yn, 22))];
            compare(
                &bytes,
                &format!("aten::{op}.out"),
                &inputs,
                1,
                &format!("{op} {xs:?} {ys:?}"),
            );
        }
    }
    for (op, overload, alpha) in [("add", "Scalar_out", true), ("mul", "Scalar_out", false)] {
        let bytes = unary_program(
            &format!("aten::{op}"),
            overload,
            &[3, 40_000],
            &[3, 40_000],
            |b| {
                let s = b.double(0.37);
                if alpha {
                    vec![s, b.int(1)]
                } else {
                    vec![s]
                }
            },
            &[],
        );
        let inputs = [(vec![3, 40_000], values(120_000, 23))];
        compare(
            &bytes,
            &format!("aten::{op}.{overload}"),
            &inputs,
            1,
            &format!("{op} scalar"),
        );
    }
}

#[test]
fn softmax_layer_norm_and_mean_match_the_generic_kernels() {
    for sizes in [
        vec![3usize, 197, 197],
        vec![64, 256],
        vec![2, 5],
        vec![4, 1000],
        vec![1, 7],
    ] {
        let n: usize = sizes.iter().product();
        let mut x = values(n, 24);
        x.iter_mut().for_each(|v| *v *= 10.0);
        let inputs = [(sizes.clone(), x)];
        let last = sizes.len() as i64 - 1;
        let bytes = unary_program(
            "aten::_softmax",
            "out",
            &sizes,
            &sizes,
            |b| vec![b.int(last), b.bool(false)],
            &[],
        );
        compare(
            &bytes,
            "aten::_softmax.out",
            &inputs,
            1,
            &format!("softmax {sizes:?}"),
        );
        let row = *sizes.last().unwrap();
        let mut stat = sizes.clone();
        *stat.last_mut().unwrap() = 1;
        for affine in [false, true] {
            let bytes = unary_program(
                "aten::native_layer_norm",
                "out",
                &sizes,
                &sizes,
                |b| {
                    let shape = b.int_list(&[row as i64]);
                    let (w, bias) = if affine {
                        (
                            b.constant(
                                Float,
                                &[row as i32],
                                bytemuck::cast_slice(&values(row, 25)),
                            ),
                            b.constant(
                                Float,
                                &[row as i32],
                                bytemuck::cast_slice(&values(row, 26)),
                            ),
                        )
                    } else {
                        (b.none(), b.none())
                    };
                    vec![shape, w, bias, b.double(1e-5)]
                },
                &[stat.clone(), stat.clone()],
            );
            let what = format!("layer norm {sizes:?} affine {affine}");
            compare(&bytes, "aten::native_layer_norm.out", &inputs, row, &what);
        }
    }
    // mean over trailing dimensions (global average pooling), keepdim or not, and
    // over a leading one (the generic kernel behind the fast one).
    for (sizes, dims_, keep) in [
        (vec![2usize, 3, 7, 7], vec![-1i64, -2], true),
        (vec![1, 1280, 7, 7], vec![2, 3], false),
        (vec![5, 33], vec![1], false),
        (vec![4, 6, 5], vec![0], true),
    ] {
        let n: usize = sizes.iter().product();
        let mut out = sizes.clone();
        let rank = sizes.len() as i64;
        let norm: Vec<usize> = dims_
            .iter()
            .map(|&d| ((d + rank) % rank) as usize)
            .collect();
        for &d in &norm {
            out[d] = 1;
        }
        let out: Vec<usize> = if keep {
            out
        } else {
            out.iter()
                .enumerate()
                .filter(|(i, _)| !norm.contains(i))
                .map(|(_, &s)| s)
                .collect()
        };
        let bytes = unary_program(
            "aten::mean",
            "out",
            &sizes,
            &out,
            |b| vec![b.int_list(&dims_), b.bool(keep), b.none()],
            &[],
        );
        let inputs = [(sizes.clone(), values(n, 27))];
        let what = format!("mean {sizes:?} {dims_:?}");
        let trailing = norm.iter().all(|&d| d + norm.len() >= sizes.len());
        if trailing {
            compare(&bytes, "aten::mean.out", &inputs, 49, &what);
        } else {
            // Not over trailing dimensions: the generic kernel behind the fast one.
            let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
            let (got, _) = run(&bytes, &pte_kernels::registry(), &inputs, 2);
            assert_close(&got, &want, 49, &what);
        }
    }
}

/// Values for inputs of `shapes`, input `i` from seed `seed + i`.
fn inputs_of(shapes: &[Vec<usize>], seed: u64) -> Vec<(Vec<usize>, Vec<f32>)> {
    shapes
        .iter()
        .zip(seed..)
        .map(|(s, seed)| (s.clone(), values(s.iter().product(), seed)))
        .collect()
}

/// Builds small convolutional networks value by value.
struct Net {
    b: ProgramBuilder,
    seed: u64,
}

impl Net {
    fn new() -> Self {
        Net {
            b: ProgramBuilder::new(),
            seed: 100,
        }
    }

    fn constant(&mut self, sizes: &[usize], scale: f32) -> i32 {
        self.seed += 1;
        let n: usize = sizes.iter().product();
        let v: Vec<f32> = values(n, self.seed).iter().map(|x| x * scale).collect();
        self.b
            .constant(Float, &dims(sizes), bytemuck::cast_slice(&v))
    }

    fn tensor(&mut self, sizes: &[usize]) -> i32 {
        self.b.tensor(Float, &dims(sizes), Memory::Planned)
    }

    /// conv (+ batch norm) of `x` (shape `xs`), returning the output and its shape.
    #[allow(clippy::too_many_arguments)]
    fn conv(
        &mut self,
        x: i32,
        xs: &[usize],
        c_out: usize,
        groups: usize,
        k: usize,
        stride: usize,
        bn: bool,
    ) -> (i32, Vec<usize>) {
        self.dilated_conv(x, xs, c_out, [groups, k, stride, 1], bn)
    }

    /// [`Self::conv`] with the taps `dilation` pixels apart (padded to keep the size
    /// at stride 1).
    fn dilated_conv(
        &mut self,
        x: i32,
        xs: &[usize],
        c_out: usize,
        [groups, k, stride, dilation]: [usize; 4],
        bn: bool,
    ) -> (i32, Vec<usize>) {
        let (n, c_in, h, w) = (xs[0], xs[1], xs[2], xs[3]);
        let pad = dilation * (k / 2);
        let scale = 1.0 / ((c_in / groups * k * k) as f32).sqrt();
        let weight = self.constant(&[c_out, c_in / groups, k, k], scale);
        let bias = self.constant(&[c_out], 0.1);
        let s = self.b.int_list(&[stride as i64, stride as i64]);
        let p = self.b.int_list(&[pad as i64, pad as i64]);
        let d = self.b.int_list(&[dilation as i64, dilation as i64]);
        let t = self.b.bool(false);
        let op = self.b.int_list(&[0, 0]);
        let g = self.b.int(groups as i64);
        let extent = dilation * (k - 1) + 1;
        let ys = vec![
            n,
            c_out,
            (h + 2 * pad - extent) / stride + 1,
            (w + 2 * pad - extent) / stride + 1,
        ];
        let y = self.tensor(&ys);
        self.b.call(
            "aten::convolution",
            "out",
            &[x, weight, bias, s, p, d, t, op, g, y, y],
        );
        if !bn {
            return (y, ys);
        }
        let gamma = self.constant(&[c_out], 1.0);
        let beta = self.constant(&[c_out], 0.2);
        let mean = self.constant(&[c_out], 0.1);
        let var = self.b.constant(
            Float,
            &[c_out as i32],
            bytemuck::cast_slice(&vec![0.8f32; c_out]),
        );
        let (mo, eps) = (self.b.double(0.1), self.b.double(1e-5));
        let out = self.tensor(&ys);
        let sm = self.tensor(&[0]);
        let si = self.tensor(&[0]);
        let list = self.b.tensor_list(&[out, sm, si]);
        self.b.call(
            "aten::_native_batch_norm_legit_no_training",
            "out",
            &[y, gamma, beta, mean, var, mo, eps, out, sm, si, list],
        );
        (out, ys)
    }

    fn act(&mut self, x: i32, xs: &[usize], after: After) -> i32 {
        activation(&mut self.b, x, &dims(xs), after)
    }

    fn binary(&mut self, op: &str, a: i32, b: i32, ys: &[usize]) -> i32 {
        let out = self.tensor(ys);
        if op == "add" {
            let alpha = self.b.int(1);
            self.b.call("aten::add", "out", &[a, b, alpha, out, out]);
        } else {
            self.b.call("aten::mul", "out", &[a, b, out, out]);
        }
        out
    }

    fn max_pool(&mut self, x: i32, xs: &[usize]) -> (i32, Vec<usize>) {
        let ys = vec![xs[0], xs[1], (xs[2] - 1) / 2 + 1, (xs[3] - 1) / 2 + 1];
        let k = self.b.int_list(&[3, 3]);
        let s = self.b.int_list(&[2, 2]);
        let p = self.b.int_list(&[1, 1]);
        let d = self.b.int_list(&[1, 1]);
        let c = self.b.bool(false);
        let y = self.tensor(&ys);
        let idx = self.b.tensor(Long, &dims(&ys), Memory::Planned);
        let list = self.b.tensor_list(&[y, idx]);
        self.b.call(
            "aten::max_pool2d_with_indices",
            "out",
            &[x, k, s, p, d, c, y, idx, list],
        );
        (y, ys)
    }

    /// `avg_pool2d` of a square window `k`, stride `s`, padding `p`.
    fn avg_pool(
        &mut self,
        x: i32,
        xs: &[usize],
        [k, s, p]: [usize; 3],
        (ceil, include_pad, divisor): (bool, bool, Option<i64>),
    ) -> (i32, Vec<usize>) {
        // PyTorch's output size: a ceil-mode window must start inside the input or
        // its leading padding.
        let out = |i: usize| {
            let o = (i + 2 * p - k + if ceil { s - 1 } else { 0 }) / s + 1;
            if ceil && (o - 1) * s >= i + p {
                o - 1
            } else {
                o
            }
        };
        let ys = vec![xs[0], xs[1], out(xs[2]), out(xs[3])];
        let kl = self.b.int_list(&[k as i64, k as i64]);
        let sl = self.b.int_list(&[s as i64, s as i64]);
        let pl = self.b.int_list(&[p as i64, p as i64]);
        let (c, inc) = (self.b.bool(ceil), self.b.bool(include_pad));
        let d = match divisor {
            Some(d) => self.b.int(d),
            None => self.b.none(),
        };
        let y = self.tensor(&ys);
        self.b
            .call("aten::avg_pool2d", "out", &[x, kl, sl, pl, c, inc, d, y, y]);
        (y, ys)
    }

    /// `upsample_bilinear2d` of `x` to `size` (half-pixel centres).
    fn upsample(&mut self, x: i32, xs: &[usize], size: [usize; 2]) -> (i32, Vec<usize>) {
        let ys = vec![xs[0], xs[1], size[0], size[1]];
        let sl = self.b.int_list(&[size[0] as i64, size[1] as i64]);
        let (align, none) = (self.b.bool(false), self.b.none());
        let y = self.tensor(&ys);
        self.b.call(
            "aten::upsample_bilinear2d",
            "vec_out",
            &[x, sl, align, none, y, y],
        );
        (y, ys)
    }

    /// The mean over the dimensions after the channels.
    fn mean(&mut self, x: i32, xs: &[usize], keep: bool) -> (i32, Vec<usize>) {
        let ys = if keep {
            let mut s = vec![1; xs.len()];
            s[..2].copy_from_slice(&xs[..2]);
            s
        } else {
            vec![xs[0], xs[1]]
        };
        let dims: Vec<i64> = (2..xs.len() as i64).map(|d| d - xs.len() as i64).collect();
        let dl = self.b.int_list(&dims);
        let k = self.b.bool(keep);
        let none = self.b.none();
        let y = self.tensor(&ys);
        self.b.call("aten::mean", "out", &[x, dl, k, none, y, y]);
        (y, ys)
    }

    /// `x` (shape `xs`) times its squeeze-and-excitation gate: the mean, a 1×1
    /// convolution to `squeezed` channels, `inner`, one back to the channels of `x`,
    /// `gate`.
    fn squeeze_excite(
        &mut self,
        x: i32,
        xs: &[usize],
        squeezed: usize,
        inner: After,
        gate: After,
    ) -> i32 {
        let (s, ss) = self.mean(x, xs, true);
        let (s, ss) = self.conv(s, &ss, squeezed, 1, 1, 1, false);
        let s = self.act(s, &ss, inner);
        let (s, ss) = self.conv(s, &ss, xs[1], 1, 1, 1, false);
        let s = self.act(s, &ss, gate);
        self.binary("mul", x, s, xs)
    }
}

/// A network with the blocks of resnet, mobilenet_v2, efficientnet, mobilenet_v3,
/// squeezenet and inception: stem, max pool, a residual block, an inverted residual
/// with depthwise convolution, squeeze-and-excitation blocks, a concatenation, average
/// pooling of windows, global average pooling. With `leak`, an inner value is also a
/// method output (it leaves the run late); with `external`, the residual of the first
/// block is a second method input (converted at the run's start).
fn network(batch: usize, size: usize, leak: bool, external: bool) -> (Vec<u8>, Vec<Vec<usize>>) {
    let mut n = Net::new();
    let xs = vec![batch, 3, size, size];
    let x = n.tensor(&xs);
    n.b.input(x);
    let mut inputs = vec![xs.clone()];
    // stem
    let (y, ys) = n.conv(x, &xs, 16, 1, 3, 2, true);
    let y = n.act(y, &ys, After::Relu);
    let (y, ys) = n.max_pool(y, &ys);
    // residual block
    let (a, as_) = n.conv(y, &ys, 16, 1, 3, 1, true);
    let a = n.act(a, &as_, After::Relu);
    let (a, as_) = n.conv(a, &as_, 16, 1, 3, 1, true);
    let shortcut = if external {
        let r = n.tensor(&ys);
        n.b.input(r);
        inputs.push(ys.clone());
        r
    } else {
        y
    };
    let y = n.binary("add", a, shortcut, &as_);
    let y = n.act(y, &as_, After::Relu);
    if leak {
        n.b.output(y);
    }
    let ys = as_;
    // inverted residual: expand, depthwise, project, add (no activation)
    let (e, es) = n.conv(y, &ys, 48, 1, 1, 1, true);
    let e = n.act(e, &es, After::Hardtanh);
    let (e, es) = n.conv(e, &es, 48, 48, 3, 1, true);
    let e = n.act(e, &es, After::Hardtanh);
    let (e, es) = n.conv(e, &es, 16, 1, 1, 1, true);
    let y = n.binary("add", e, y, &es);
    // squeeze and excitation with SiLU
    let (e, es) = n.conv(y, &ys, 32, 1, 1, 1, true);
    let e = n.act(e, &es, After::Silu);
    let y = n.squeeze_excite(e, &es, 8, After::Silu, After::Sigmoid);
    // mobilenet_v3's block, its activations as exporters decompose them: hardswish,
    // relu6 as two clamps, squeeze-and-excitation with hardsigmoid
    let (e, es) = n.conv(y, &es, 24, 1, 1, 1, true);
    let e = n.act(e, &es, After::HardSwish);
    let (e, es) = n.conv(e, &es, 24, 24, 3, 1, true);
    let e = n.act(e, &es, After::Relu6Pair);
    let y = n.squeeze_excite(e, &es, 8, After::Relu, After::HardSigmoid);
    // squeezenet's fire module: two expansions of one squeeze, concatenated
    let (q, qs) = n.conv(y, &es, 8, 1, 1, 1, false);
    let q = n.act(q, &qs, After::Relu);
    let (a, as_) = n.conv(q, &qs, 12, 1, 1, 1, false);
    let a = n.act(a, &as_, After::Relu);
    let (b, bs) = n.conv(q, &qs, 20, 1, 3, 1, false);
    let b = n.act(b, &bs, After::Relu);
    let es = vec![bs[0], 32, bs[2], bs[3]];
    let y = n.tensor(&es);
    let (list, dim) = (n.b.tensor_list(&[a, b]), n.b.int(-3));
    n.b.call("aten::cat", "out", &[list, dim, y, y]);
    // inception's branch pooling, then average pooling in the other modes: not
    // counting the padding, in ceil mode (counting it), over a fixed divisor
    let (y, ys) = n.avg_pool(y, &es, [3, 1, 1], (false, true, None));
    let (y, ys) = n.conv(y, &ys, 24, 1, 1, 1, false);
    let (y, ys) = n.avg_pool(y, &ys, [3, 1, 1], (false, false, None));
    let (y, ys) = n.avg_pool(y, &ys, [3, 2, 1], (true, true, None));
    let (y, ys) = n.avg_pool(y, &ys, [2, 1, 0], (false, true, Some(3)));
    let (y, _) = n.mean(y, &ys, false);
    n.b.output(y);
    (n.b.build(), inputs)
}

#[test]
fn convolution_chains_run_channels_last_with_the_same_results() {
    for (batch, size, leak, external) in [
        (1, 32, false, false),
        (2, 17, false, false),
        (1, 24, true, false),
        (1, 20, false, true),
    ] {
        let (bytes, shapes) = network(batch, size, leak, external);
        let inputs = inputs_of(&shapes, 40);
        let what = format!("batch {batch} size {size} leak {leak} external {external}");
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        for threads in [1, 2] {
            let (got, ran) = run(&bytes, &pte_kernels::registry(), &inputs, threads);
            assert_close(&got, &want, 400, &format!("{what}, {threads} threads"));
            assert_eq!(
                ran.len(),
                1,
                "{what}: the network is not one region: {ran:?}"
            );
            assert!(ran[0].contains("NHWC region"), "{what}: {ran:?}");
        }
    }
}

/// DeepLab's head: a stem, then the atrous pyramid (a 1×1 branch, 3×3 branches with
/// `dilations`, a pooling branch: mean, 1×1, upsampled from one pixel), concatenated,
/// projected, a 3×3 and a 1×1 classifier, upsampled to the input's size.
fn pyramid_network(batch: usize, size: usize, dilations: &[usize]) -> (Vec<u8>, Vec<usize>) {
    let mut n = Net::new();
    let xs = vec![batch, 3, size, size];
    let x = n.tensor(&xs);
    n.b.input(x);
    let (y, ys) = n.conv(x, &xs, 16, 1, 3, 2, true);
    let y = n.act(y, &ys, After::Relu);
    let mut parts = Vec::new();
    let (b, bs) = n.conv(y, &ys, 8, 1, 1, 1, true);
    parts.push(n.act(b, &bs, After::Relu));
    for &d in dilations {
        let (b, bs) = n.dilated_conv(y, &ys, 8, [1, 3, 1, d], true);
        parts.push(n.act(b, &bs, After::Relu));
    }
    let (p, ps) = n.mean(y, &ys, true);
    let (p, ps) = n.conv(p, &ps, 8, 1, 1, 1, false);
    let p = n.act(p, &ps, After::Relu);
    let (p, _) = n.upsample(p, &ps, [ys[2], ys[3]]);
    parts.push(p);
    let cs = vec![batch, 8 * parts.len(), ys[2], ys[3]];
    let y = n.cat(&parts, &cs);
    let (y, ys) = n.conv(y, &cs, 16, 1, 1, 1, true);
    let y = n.act(y, &ys, After::Relu);
    let (y, ys) = n.conv(y, &ys, 16, 1, 3, 1, true);
    let y = n.act(y, &ys, After::Relu);
    let (y, ys) = n.conv(y, &ys, 5, 1, 1, 1, false);
    let (y, _) = n.upsample(y, &ys, [size, size]);
    n.b.output(y);
    (n.b.build(), xs)
}

#[test]
fn an_atrous_pyramid_runs_channels_last_with_the_same_results() {
    // Five and seven parts; dilations whose outer taps read the input at a few
    // pixels, at none (dropped), or at most.
    for (batch, size, dilations) in [(1, 28, &[3, 6, 40][..]), (2, 21, &[2, 5, 7, 9, 11][..])] {
        let (bytes, xs) = pyramid_network(batch, size, dilations);
        let inputs = [(xs.clone(), values(xs.iter().product(), 50))];
        let what = format!("batch {batch} size {size} dilations {dilations:?}");
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        for threads in [1, 2] {
            let (got, ran) = run(&bytes, &pte_kernels::registry(), &inputs, threads);
            assert_close(&got, &want, 400, &format!("{what}, {threads} threads"));
            // One region up to the last upsampling, which the NCHW kernel runs.
            assert_eq!(ran.len(), 2, "{what}: {ran:?}");
            assert!(ran[0].contains("NHWC region"), "{what}: {ran:?}");
            assert!(ran[1].contains("upsample_bilinear2d"), "{what}: {ran:?}");
        }
    }
}

impl Net {
    /// A channel shuffle of `x` (`[n, c, h, w]`) in `groups` groups as exported: an
    /// elided view as `[n, groups, c / groups, h, w]`, `permute_copy` of its middle
    /// dimensions, a copy into the default dim order, an elided view back to 4-d.
    fn shuffle(&mut self, x: i32, xs: &[usize], groups: usize) -> i32 {
        let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
        let at = Memory::At(self.b.place(x).unwrap());
        let v5 = self
            .b
            .tensor(Float, &dims(&[n, groups, c / groups, h, w]), at);
        let swapped = dims(&[n, c / groups, groups, h, w]);
        let p = self.b.tensor(Float, &swapped, Memory::Planned);
        let order = self.b.int_list(&[0, 2, 1, 3, 4]);
        self.b.call("aten::permute_copy", "out", &[v5, order, p, p]);
        let q = self.b.tensor(Float, &swapped, Memory::Planned);
        let (blocking, none) = (self.b.bool(false), self.b.none());
        self.b.call(
            "dim_order_ops::_clone_dim_order",
            "out",
            &[p, blocking, none, q, q],
        );
        let at = Memory::At(self.b.place(q).unwrap());
        self.b.tensor(Float, &dims(xs), at)
    }

    /// `split_with_sizes_copy` of `x` along channels, the pieces placed over `reuse`
    /// (dead tensors whose places a planner gives them) where given.
    fn split(&mut self, x: i32, xs: &[usize], sizes: &[usize], reuse: &[i32]) -> Vec<i32> {
        let pieces: Vec<i32> = sizes
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let memory = reuse
                    .get(i)
                    .map_or(Memory::Planned, |&r| Memory::At(self.b.place(r).unwrap()));
                self.b
                    .tensor(Float, &dims(&[xs[0], c, xs[2], xs[3]]), memory)
            })
            .collect();
        let sizes: Vec<i64> = sizes.iter().map(|&s| s as i64).collect();
        let (sizes, dim) = (self.b.int_list(&sizes), self.b.int(1));
        let (out, ret) = (self.b.tensor_list(&pieces), self.b.tensor_list(&pieces));
        self.b.call(
            "aten::split_with_sizes_copy",
            "out",
            &[x, sizes, dim, out, ret],
        );
        pieces
    }

    fn cat(&mut self, parts: &[i32], ys: &[usize]) -> i32 {
        let y = self.tensor(ys);
        let (list, dim) = (self.b.tensor_list(parts), self.b.int(1));
        self.b.call("aten::cat", "out", &[list, dim, y, y]);
        y
    }

    /// shufflenet_v2's branch: pointwise, depthwise, pointwise.
    fn branch(&mut self, x: i32, xs: &[usize], c: usize) -> (i32, Vec<usize>) {
        let (y, ys) = self.conv(x, xs, c, 1, 1, 1, true);
        let y = self.act(y, &ys, After::Relu);
        let (y, ys) = self.conv(y, &ys, c, c, 3, 1, true);
        let (y, ys) = self.conv(y, &ys, c, 1, 1, 1, true);
        (self.act(y, &ys, After::Relu), ys)
    }
}

/// shufflenet_v2's blocks as exported: two branches concatenated, their channels
/// shuffled and split in halves for the next block (the pieces over the dead
/// branches' places), a last shuffle read on by a convolution; then a shuffle in
/// `groups` groups of one convolution's output and a split at `cut` channels (neither a
/// multiple of the groups when `cut` is not).
fn shuffle_network(batch: usize, size: usize, groups: usize, cut: usize) -> (Vec<u8>, Vec<usize>) {
    let mut n = Net::new();
    let xs = vec![batch, 8, size, size];
    let x = n.tensor(&xs);
    n.b.input(x);
    let (y, ys) = n.conv(x, &xs, 16, 1, 3, 1, true);
    let y = n.act(y, &ys, After::Relu);
    // A block of the first kind: both branches read the whole input.
    let (a, a_s) = n.conv(y, &ys, 16, 16, 3, 1, true);
    let (a, a_s) = n.conv(a, &a_s, 16, 1, 1, 1, true);
    let a = n.act(a, &a_s, After::Relu);
    let (b, _) = n.branch(y, &ys, 16);
    let cs = vec![batch, 32, size, size];
    let c = n.cat(&[a, b], &cs);
    let s = n.shuffle(c, &cs, 2);
    let halves = n.split(s, &cs, &[16, 16], &[a, b]);
    // A block of the second kind: one half passes, the other goes through a branch.
    let (b, _) = n.branch(halves[1], &ys, 16);
    let c = n.cat(&[halves[0], b], &cs);
    let s = n.shuffle(c, &cs, 2);
    let (y, ys) = n.conv(s, &cs, 24, 1, 1, 1, true);
    let y = n.act(y, &ys, After::Relu);
    let s = n.shuffle(y, &ys, groups);
    let pieces = n.split(s, &ys, &[cut, ys[1] - cut], &[]);
    let (p, ps) = n.conv(pieces[0], &[batch, cut, size, size], 8, 1, 3, 1, true);
    let q = n
        .conv(
            pieces[1],
            &[batch, ys[1] - cut, size, size],
            8,
            1,
            1,
            1,
            false,
        )
        .0;
    let y = n.binary("add", p, q, &ps);
    let (y, _) = n.mean(y, &ps, false);
    n.b.output(y);
    (n.b.build(), xs)
}

#[test]
fn channel_shuffles_and_splits_run_channels_last_with_the_same_results() {
    for (batch, size, groups, cut) in [(1, 9, 3, 12), (2, 6, 4, 8), (1, 7, 2, 5), (1, 16, 3, 7)] {
        let (bytes, xs) = shuffle_network(batch, size, groups, cut);
        let inputs = [(xs.clone(), values(xs.iter().product(), 11))];
        let what = format!("batch {batch} size {size} groups {groups} cut {cut}");
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        for threads in [1, 2] {
            let (got, ran) = run(&bytes, &pte_kernels::registry(), &inputs, threads);
            assert_close(&got, &want, 400, &format!("{what}, {threads} threads"));
            assert_eq!(
                ran.len(),
                1,
                "{what}: the network is not one region: {ran:?}"
            );
        }
    }
}

/// One convolution (with batch normalization and ReLU) and what follows it: the mean
/// over height and width (a network's head), or nothing (its output leaves NCHW).
/// A 1-d convolution of `x` (`[n, c, length]`) with `[groups, k, stride, pad,
/// dilation]`, then batch normalization if asked.
fn conv1d(
    n: &mut Net,
    x: i32,
    xs: &[usize],
    c_out: usize,
    [groups, k, stride, pad, dilation]: [usize; 5],
    bn: bool,
) -> (i32, Vec<usize>) {
    let scale = 1.0 / ((xs[1] / groups * k) as f32).sqrt();
    let weight = n.constant(&[c_out, xs[1] / groups, k], scale);
    let bias = n.constant(&[c_out], 0.1);
    let s = n.b.int_list(&[stride as i64]);
    let p = n.b.int_list(&[pad as i64]);
    let d = n.b.int_list(&[dilation as i64]);
    let t = n.b.bool(false);
    let op = n.b.int_list(&[0]);
    let g = n.b.int(groups as i64);
    let ys = vec![
        xs[0],
        c_out,
        (xs[2] + 2 * pad - dilation * (k - 1) - 1) / stride + 1,
    ];
    convolution_call(n, [x, weight, bias, s, p, d, t, op, g], ys, bn)
}

/// `aten::convolution` with these nine arguments into a new tensor of sizes `ys`,
/// then batch normalization if asked.
fn convolution_call(
    n: &mut Net,
    operands: [i32; 9],
    ys: Vec<usize>,
    bn: bool,
) -> (i32, Vec<usize>) {
    let y = n.tensor(&ys);
    let mut args = operands.to_vec();
    args.extend([y, y]);
    n.b.call("aten::convolution", "out", &args);
    let y = if bn {
        batch_norm(&mut n.b, y, &dims(&ys), true)
    } else {
        y
    };
    (y, ys)
}

/// Wav2letter-like: 1-d convolutions (strided, dilated, depthwise, pointwise) with a
/// residual addition, ending in one whose window covers the whole length, or (`head`)
/// in the mean over the length.
fn conv1d_network(batch: usize, length: usize, head: bool) -> (Vec<u8>, Vec<Vec<usize>>) {
    let mut n = Net::new();
    let xs = vec![batch, 3, length];
    let x = n.tensor(&xs);
    n.b.input(x);
    let (a, as_) = conv1d(&mut n, x, &xs, 16, [1, 5, 2, 2, 1], false);
    let a = n.act(a, &as_, After::Relu);
    let (y, ys) = conv1d(&mut n, a, &as_, 16, [1, 3, 1, 1, 1], true);
    let y = n.act(y, &ys, After::Relu);
    let y = n.binary("add", y, a, &ys);
    let (y, ys) = conv1d(&mut n, y, &ys, 16, [16, 3, 1, 2, 2], false);
    let y = n.act(y, &ys, After::Hardtanh);
    let (y, ys) = conv1d(&mut n, y, &ys, 24, [1, 1, 1, 0, 1], false);
    let y = n.act(y, &ys, After::Relu);
    let (y, _) = if head {
        n.mean(y, &ys, false)
    } else {
        conv1d(&mut n, y, &ys, 5, [1, ys[2], 1, 0, 1], false)
    };
    n.b.output(y);
    (n.b.build(), vec![xs])
}

#[test]
fn one_dimensional_convolution_chains_run_channels_last() {
    for (batch, length, head) in [(1, 40, false), (2, 23, true), (1, 200, false), (1, 9, true)] {
        let (bytes, shapes) = conv1d_network(batch, length, head);
        let inputs = inputs_of(&shapes, 11);
        let what = format!("batch {batch} length {length} head {head}");
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        for threads in [1, 2] {
            let (got, ran) = run(&bytes, &pte_kernels::registry(), &inputs, threads);
            assert_close(&got, &want, 400, &format!("{what}, {threads} threads"));
            assert_eq!(ran.len(), 1, "{what}: not one region: {ran:?}");
            assert!(ran[0].contains("NHWC region"), "{what}: {ran:?}");
        }
    }
}

impl Net {
    /// `constant_pad_nd(x, pads, value)`: `pads` before and after each of the last
    /// dimensions, the last first.
    fn pad(&mut self, x: i32, xs: &[usize], pads: &[usize], value: f64) -> (i32, Vec<usize>) {
        let mut ys = xs.to_vec();
        for (i, p) in pads.chunks(2).enumerate() {
            ys[xs.len() - 1 - i] += p[0] + p[1];
        }
        let list = self
            .b
            .int_list(&pads.iter().map(|&p| p as i64).collect::<Vec<_>>());
        let value = self.b.double(value);
        let y = self.tensor(&ys);
        self.b
            .call("aten::constant_pad_nd", "out", &[x, list, value, y, y]);
        (y, ys)
    }
}

/// TCN-like: causal dilated 1-d convolutions (zeros padded on the left, none of their
/// own) with residual additions; the last padding is by `last_value`. Then, as
/// TensorFlow's "same" padding exports a stride-2 convolution, zeros after the length
/// (with `rank_2`: after the width and the height of a 2-d image).
fn padded_network(
    batch: usize,
    length: usize,
    last_value: f64,
    rank_2: bool,
) -> (Vec<u8>, Vec<Vec<usize>>) {
    let mut n = Net::new();
    let xs = if rank_2 {
        vec![batch, 8, length, length + 3]
    } else {
        vec![batch, 8, length]
    };
    let x = n.tensor(&xs);
    n.b.input(x);
    let (mut y, ys) = if rank_2 {
        n.conv(x, &xs, 16, 1, 1, 1, false)
    } else {
        conv1d(&mut n, x, &xs, 16, [1, 1, 1, 0, 1], false)
    };
    let axes = ys.len() - 2;
    for (i, d) in [1usize, 2, 4].into_iter().enumerate() {
        let value = if i == 2 { last_value } else { 0.0 };
        let pads = if rank_2 {
            vec![2 * d, 0, 2 * d, 0]
        } else {
            vec![2 * d, 0]
        };
        let (p, ps) = n.pad(y, &ys, &pads, value);
        let (c, cs) = if rank_2 {
            let scale = 1.0 / ((16 * 9) as f32).sqrt();
            let weight = n.constant(&[16, 16, 3, 3], scale);
            let bias = n.constant(&[16], 0.1);
            let s = n.b.int_list(&[1, 1]);
            let z = n.b.int_list(&[0, 0]);
            let dl = n.b.int_list(&[d as i64, d as i64]);
            let t = n.b.bool(false);
            let op = n.b.int_list(&[0, 0]);
            let g = n.b.int(1);
            convolution_call(
                &mut n,
                [p, weight, bias, s, z, dl, t, op, g],
                ys.clone(),
                i == 1,
            )
        } else {
            conv1d(&mut n, p, &ps, 16, [1, 3, 1, 0, d], i == 1)
        };
        let c = n.act(c, &cs, After::Relu);
        y = n.binary("add", y, c, &ys);
    }
    let (p, ps) = n.pad(y, &ys, &[0, 1].repeat(axes), 0.0);
    let k = 3;
    let weight = n.constant(
        &[12, 16]
            .into_iter()
            .chain(std::iter::repeat_n(k, axes))
            .collect::<Vec<_>>(),
        0.2,
    );
    let bias = n.constant(&[12], 0.1);
    let s = n.b.int_list(&vec![2; axes]);
    let z = n.b.int_list(&vec![0; axes]);
    let one = n.b.int_list(&vec![1; axes]);
    let t = n.b.bool(false);
    let op = n.b.int_list(&vec![0; axes]);
    let g = n.b.int(1);
    let mut out_sizes = vec![batch, 12];
    out_sizes.extend(ps[2..].iter().map(|&i| (i - k) / 2 + 1));
    let (y, _) = convolution_call(
        &mut n,
        [p, weight, bias, s, z, one, t, op, g],
        out_sizes,
        false,
    );
    n.b.output(y);
    (n.b.build(), vec![xs])
}

#[test]
fn zeros_padded_before_a_convolution_are_its_own_padding() {
    for (batch, length, rank_2) in [(1, 40, false), (2, 23, false), (1, 9, true), (2, 12, true)] {
        for last_value in [0.0, 0.5] {
            let (bytes, shapes) = padded_network(batch, length, last_value, rank_2);
            let inputs = inputs_of(&shapes, 12);
            let what = format!("batch {batch} length {length} 2-d {rank_2} value {last_value}");
            let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
            for threads in [1, 2] {
                let (got, ran) = run(&bytes, &pte_kernels::registry(), &inputs, threads);
                assert_close(&got, &want, 400, &format!("{what}, {threads} threads"));
                // Zeros join the convolution after them; another value is padded alone.
                let pads = ran.iter().filter(|r| r.contains("constant_pad_nd")).count();
                assert_eq!(pads, usize::from(last_value != 0.0), "{what}: {ran:?}");
                if last_value == 0.0 {
                    assert_eq!(ran.len(), 1, "{what}: not one region: {ran:?}");
                    assert!(ran[0].contains("NHWC region"), "{what}: {ran:?}");
                }
            }
        }
    }
}

/// A transposed convolution of `x` (`[n, c, h, w]` or `[n, c, length]`) with
/// `[groups, k, stride, pad, output_padding]`, then batch normalization if asked.
fn deconv(
    n: &mut Net,
    x: i32,
    xs: &[usize],
    c_out: usize,
    [groups, k, stride, pad, adj]: [usize; 5],
    bn: bool,
) -> (i32, Vec<usize>) {
    let axes = xs.len() - 2;
    let mut ws = vec![xs[1], c_out / groups];
    ws.extend(std::iter::repeat_n(k, axes));
    let scale = 1.0 / ((xs[1] / groups * k * k) as f32).sqrt();
    let weight = n.constant(&ws, scale);
    let bias = n.constant(&[c_out], 0.1);
    let list = |n: &mut Net, v: usize| n.b.int_list(&vec![v as i64; axes]);
    let (s, p, d, op) = (list(n, stride), list(n, pad), list(n, 1), list(n, adj));
    let t = n.b.bool(true);
    let g = n.b.int(groups as i64);
    let mut ys = vec![xs[0], c_out];
    ys.extend(
        xs[2..]
            .iter()
            .map(|&i| (i - 1) * stride + k + adj - 2 * pad),
    );
    convolution_call(n, [x, weight, bias, s, p, d, t, op, g], ys, bn)
}

/// UNet-like: two encoder levels (leaky ReLU), transposed convolutions back up (2×2 stride 2 on
/// even sizes, 3×3 stride 2 with padding on odd ones), the encoder's values
/// concatenated in after them, two transposed convolutions of DCGAN's kind (4×4,
/// stride 2, padding 1; grouped, and with batch normalization) added up, a 1×1
/// convolution last.
fn unet_network(batch: usize, size: usize) -> (Vec<u8>, Vec<Vec<usize>>) {
    let mut n = Net::new();
    let xs = vec![batch, 3, size, size];
    let x = n.tensor(&xs);
    n.b.input(x);
    let (a, as_) = n.conv(x, &xs, 16, 1, 3, 1, false);
    let a = n.act(a, &as_, After::LeakyRelu);
    let (b, bs) = n.conv(a, &as_, 24, 1, 3, 2, true);
    let b = n.act(b, &bs, After::LeakyRelu);
    let up = if size.is_multiple_of(2) {
        [1, 2, 2, 0, 0]
    } else {
        [1, 3, 2, 1, 0]
    };
    let (u, us) = deconv(&mut n, b, &bs, 16, up, true);
    assert_eq!(us, as_, "the upsampled value meets the encoder's");
    let u = n.act(u, &us, After::Relu);
    let cs = vec![batch, 32, size, size];
    let c = n.cat(&[u, a], &cs);
    let (p, ps) = deconv(&mut n, c, &cs, 8, [2, 4, 2, 1, 0], false);
    let (q, _) = deconv(&mut n, c, &cs, 8, [1, 4, 2, 1, 0], true);
    let y = n.binary("add", p, q, &ps);
    let y = n.act(y, &ps, After::Hardtanh);
    let (y, _) = n.conv(y, &ps, 4, 1, 1, 1, false);
    n.b.output(y);
    (n.b.build(), vec![xs])
}

/// 1-d convolutions down, transposed ones back up (stride 2 with and without
/// output padding, 2 groups), each output read by the next step alone.
fn conv1d_upsampling(batch: usize, length: usize) -> (Vec<u8>, Vec<Vec<usize>>) {
    let mut n = Net::new();
    let xs = vec![batch, 4, length];
    let x = n.tensor(&xs);
    n.b.input(x);
    let (a, as_) = conv1d(&mut n, x, &xs, 12, [1, 3, 2, 1, 1], false);
    let a = n.act(a, &as_, After::Relu);
    let (b, bs) = deconv(&mut n, a, &as_, 10, [2, 2, 2, 0, 1], false);
    let b = n.act(b, &bs, After::Relu);
    let (y, _) = deconv(&mut n, b, &bs, 6, [1, 3, 2, 1, 1], false);
    n.b.output(y);
    (n.b.build(), vec![xs])
}

#[test]
fn transposed_convolutions_run_channels_last() {
    let cases: [(&str, usize, usize); 5] = [
        ("unet", 1, 12),
        ("unet", 2, 9),
        ("unet", 1, 33),
        ("1-d", 1, 17),
        ("1-d", 2, 40),
    ];
    for (kind, batch, size) in cases {
        let (bytes, shapes) = if kind == "unet" {
            unet_network(batch, size)
        } else {
            conv1d_upsampling(batch, size)
        };
        let inputs = inputs_of(&shapes, 5);
        let what = format!("{kind} batch {batch} size {size}");
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        for threads in [1, 2] {
            let (got, ran) = run(&bytes, &pte_kernels::registry(), &inputs, threads);
            assert_close(&got, &want, 600, &format!("{what}, {threads} threads"));
            assert_eq!(ran.len(), 1, "{what}: not one region: {ran:?}");
            assert!(ran[0].contains("NHWC region"), "{what}: {ran:?}");
        }
    }
}

/// Values that leave a region before its last step: `a` read after the region (by a
/// nearest upsampling, which regions do not take), and an inverted residual block's
/// depthwise output a method output (so the block cannot run as a chain that never
/// writes it), the block's input added back at its end; the last convolution's
/// output leaves last.
fn late_exits(batch: usize, size: usize) -> (Vec<u8>, Vec<Vec<usize>>) {
    let mut n = Net::new();
    let xs = vec![batch, 3, size, size];
    let x = n.tensor(&xs);
    n.b.input(x);
    let (a, as_) = n.conv(x, &xs, 16, 1, 3, 1, false);
    let a = n.act(a, &as_, After::Relu);
    let (b, bs) = n.conv(a, &as_, 32, 1, 1, 1, true);
    let b = n.act(b, &bs, After::Relu);
    let (d, ds) = n.conv(b, &bs, 32, 32, 3, 1, true);
    let d = n.act(d, &ds, After::Relu);
    let (e, es) = n.conv(d, &ds, 16, 1, 1, 1, false);
    let e = n.binary("add", e, a, &es);
    let (f, fs) = n.conv(e, &es, 16, 1, 3, 1, false);
    let f = n.act(f, &fs, After::Relu);
    let us = vec![batch, 16, 2 * size, 2 * size];
    let u = n.tensor(&us);
    let (none, scales) = (n.b.none(), n.b.double_list(&[2.0, 2.0]));
    n.b.call(
        "aten::upsample_nearest2d",
        "vec_out",
        &[a, none, scales, u, u],
    );
    n.b.output(f);
    n.b.output(d);
    n.b.output(u);
    (n.b.build(), vec![xs])
}

#[test]
fn values_read_after_a_region_leave_it_late() {
    for (batch, size) in [(1, 12), (2, 7), (1, 40)] {
        let (bytes, shapes) = late_exits(batch, size);
        let inputs = inputs_of(&shapes, 3);
        let what = format!("batch {batch} size {size}");
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        for threads in [1, 2] {
            let (got, ran) = run(&bytes, &pte_kernels::registry(), &inputs, threads);
            assert_close(&got, &want, 400, &format!("{what}, {threads} threads"));
            assert_eq!(ran.len(), 2, "{what}: {ran:?}");
            assert!(
                ran[0].contains("NHWC region (5 convolutions"),
                "{what}: {ran:?}"
            );
        }
    }
}

fn one_convolution(batch: usize, size: usize, k: usize, head: bool) -> (Vec<u8>, Vec<Vec<usize>>) {
    let mut n = Net::new();
    let xs = vec![batch, 24, size, size];
    let x = n.tensor(&xs);
    n.b.input(x);
    let (y, ys) = n.conv(x, &xs, 40, 1, k, 1, true);
    let y = n.act(y, &ys, After::Relu);
    let y = if head { n.mean(y, &ys, false).0 } else { y };
    n.b.output(y);
    (n.b.build(), vec![xs])
}

#[test]
fn a_last_convolution_and_its_mean_run_channels_last() {
    for (batch, size, k, head) in [
        (1, 7, 1, true),
        (2, 5, 3, true),
        (1, 1, 1, true),
        (1, 7, 1, false),
    ] {
        let (bytes, shapes) = one_convolution(batch, size, k, head);
        let inputs = inputs_of(&shapes, 7);
        let what = format!("batch {batch} size {size} kernel {k} head {head}");
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        for threads in [1, 2] {
            let (got, ran) = run(&bytes, &pte_kernels::registry(), &inputs, threads);
            assert_close(&got, &want, 400, &format!("{what}, {threads} threads"));
            let regions = ran.iter().filter(|r| r.contains("NHWC region")).count();
            // A lone convolution whose output leaves NHWC stays NCHW (a conversion on
            // each side would cost more than the layout gains).
            let expected = usize::from(head);
            assert_eq!(regions, expected, "{what}: {ran:?}");
        }
    }
}

#[test]
fn a_region_times_its_steps_when_profiled() {
    let (bytes, shapes) = one_convolution(1, 7, 3, true);
    let inputs: Vec<EValue> = shapes
        .iter()
        .map(|s| EValue::Tensor(Tensor::from_slice(s, &values(s.iter().product(), 3)).unwrap()))
        .collect();
    let mut m = load(&bytes, &pte_kernels::registry(), 1);
    m.set_profiling(true);
    for _ in 0..3 {
        m.set_inputs(&inputs).unwrap();
        m.execute().unwrap();
    }
    let region_of = |profile: Vec<pte_runtime::ProfileEntry>| {
        profile
            .into_iter()
            .find(|e| e.name.contains("NHWC region"))
            .expect("the program runs as a region")
    };
    let region = region_of(m.profile());
    let names: Vec<&str> = region.parts.iter().map(|p| p.name.as_str()).collect();
    assert!(
        names.iter().any(|n| n.starts_with("convolution (")),
        "{names:?}"
    );
    assert!(names.contains(&"mean"), "{names:?}");
    assert!(names.contains(&"conversion to channels-last"), "{names:?}");
    // Each step runs once per execution.
    assert!(
        region.parts.iter().all(|p| p.calls == 3),
        "{:?}",
        region.parts
    );
    let parts: std::time::Duration = region.parts.iter().map(|p| p.total).sum();
    assert!(parts <= region.total, "{parts:?} > {:?}", region.total);
    assert!(region.parts.windows(2).all(|w| w[0].total >= w[1].total));
    // Turning profiling on again starts over.
    m.set_profiling(true);
    m.set_inputs(&inputs).unwrap();
    m.execute().unwrap();
    let region = region_of(m.profile());
    assert!(
        region.parts.iter().all(|p| p.calls == 1),
        "{:?}",
        region.parts
    );
}

impl Net {
    /// `op(a, b)` (`relu(a)` without `b`), shaped `ys`, written over the planned bytes
    /// of `over` as an exporter's planner may place it once `over` is dead.
    fn over(&mut self, op: &str, a: i32, b: Option<i32>, ys: &[usize], over: i32) -> i32 {
        let at = Memory::At(self.b.place(over).unwrap());
        let y = self.b.tensor(Float, &dims(ys), at);
        match b {
            Some(b) => {
                let alpha = self.b.int(1);
                self.b.call(op, "out", &[a, b, alpha, y, y]);
            }
            None => self.b.call(op, "out", &[a, y, y]),
        }
        y
    }

    /// A residual block whose sum is planned over the block's input `s` (dead once the
    /// sum is computed), the bytes of the values computed on the way taken by the
    /// next two convolutions' outputs while the sum is still read: fused, the first
    /// step would write over what it reads, with no spare bytes to move to.
    fn overlapping_block(&mut self, s: i32, ss: &[usize]) -> (i32, i32) {
        let (t, _) = self.conv(s, ss, ss[1], 1, 3, 1, false);
        let u = self.binary("add", t, s, ss);
        let v = self.over("aten::relu", u, None, ss, s);
        let (w, _) = self.conv(v, ss, ss[1], 1, 1, 1, false);
        let w = self.over("aten::relu", w, None, ss, t);
        let (z, _) = self.conv(w, ss, ss[1], 1, 1, 1, false);
        let z = self.binary("add", z, v, ss);
        (self.over("aten::relu", z, None, ss, u), v)
    }
}

#[test]
fn steps_planned_over_their_own_inputs_run_with_the_same_results() {
    for (batch, size) in [(1, 10), (2, 7)] {
        let mut n = Net::new();
        let xs = vec![batch, 8, size, size];
        let x = n.tensor(&xs);
        n.b.input(x);
        let (s, ss) = n.conv(x, &xs, 16, 1, 3, 1, true);
        let s = n.act(s, &ss, After::Relu);
        // The first block's sum stays live through the next two blocks, whose sums
        // must then be put elsewhere than where it is.
        let (y, first) = n.overlapping_block(s, &ss);
        let (y, _) = n.overlapping_block(y, &ss);
        let (y, _) = n.overlapping_block(y, &ss);
        let y = n.binary("add", y, first, &ss);
        n.b.output(y);
        let bytes = n.b.build();
        let inputs = vec![(xs.clone(), values(xs.iter().product(), 11))];
        let what = format!("batch {batch} size {size}");
        let (want, _) = run(&bytes, &pte_kernels::reference_registry(), &inputs, 1);
        for threads in [1, 2] {
            let (got, ran) = run(&bytes, &pte_kernels::registry(), &inputs, threads);
            assert_close(&got, &want, 400, &format!("{what}, {threads} threads"));
            assert_eq!(ran.len(), 1, "{what}: not one region: {ran:?}");
        }
    }
}
