//! The runtime takes a fuser's proposal only when it cannot change what the method
//! computes, and gives back constants that prepared calls captured.

use std::sync::Arc;

use pte_format::schema::executorch_flatbuffer::ScalarType::Float;
use pte_runtime::{
    Arg, Args, BackendRegistry, EValue, Fuser, Fusion, Graph, Kernel, KernelRegistry, KernelResult,
    LoadOptions, PreparedKernel, Program,
};
use pte_testkit::program::{Memory, ProgramBuilder};

mod common;
use common::load;

/// `relu(a + b)` in one call: arguments `[a, b, out]`.
struct AddRelu;

impl Kernel for AddRelu {
    fn prepare(&self, _: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        Ok(Box::new(AddReluRun))
    }
}

struct AddReluRun;

impl PreparedKernel for AddReluRun {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let sizes = args.tensor(0)?.sizes;
        args.resize(2, &sizes)?;
        let mut io = args.io(&[Arg::At(0), Arg::At(1)], &[Arg::At(2)])?;
        let (a, b) = (
            io.inputs[0].as_slice::<f32>()?,
            io.inputs[1].as_slice::<f32>()?,
        );
        let out = io.outputs[0].as_mut_slice::<f32>()?;
        for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
            *o = (x + y).max(0.0);
        }
        Ok(())
    }
}

/// Proposes every `add` followed by a `relu` of its result (read directly or through an
/// elided view).
struct AddReluFuser;

impl Fuser for AddReluFuser {
    fn fuse(&self, g: &Graph<'_>) -> Vec<Fusion> {
        g.calls()
            .windows(2)
            .filter(|w| w[0].op == "aten::add.out" && w[1].op == "aten::relu.out")
            .filter(|w| w[1].args[0] == w[0].args[3] || g.is_view_of(w[1].args[0], w[0].args[3]))
            .map(|w| Fusion {
                calls: vec![w[0].id, w[1].id],
                name: "fused add+relu".into(),
                kernel: Arc::new(AddRelu),
                args: vec![w[0].args[0], w[0].args[1], w[1].args[1]],
            })
            .collect()
    }
}

fn kernels() -> KernelRegistry {
    let mut r = pte_kernels::registry();
    r.set_fuser(AddReluFuser);
    r
}

/// `relu(x + y)`; with `sum_is_output` the sum is a method output too, with `extra_use`
/// another call reads it, with `jump` a jump lands on the relu.
fn program(sum_is_output: bool, extra_use: bool, jump: bool) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[2, 3], Memory::Planned);
    let y = b.tensor(Float, &[2, 3], Memory::Planned);
    let alpha = b.int(1);
    let sum = b.tensor(Float, &[2, 3], Memory::Planned);
    let out = b.tensor(Float, &[2, 3], Memory::Planned);
    let yes = b.bool(true);
    if jump {
        b.jump_false(yes, 2);
    }
    b.call("aten::add", "out", &[x, y, alpha, sum, sum]);
    b.call("aten::relu", "out", &[sum, out, out]);
    if extra_use {
        let neg = b.tensor(Float, &[2, 3], Memory::Planned);
        b.call("aten::neg", "out", &[sum, neg, neg]);
        b.output(neg);
    }
    b.input(x);
    b.input(y);
    b.output(out);
    if sum_is_output {
        b.output(sum);
    }
    b.build()
}

/// A run of a program's method on its example inputs.
struct Ran {
    input: Vec<u8>,
    outputs: Vec<Vec<u8>>,
    /// The operators that ran, sorted.
    ops: Vec<String>,
}

fn run_with(bytes: &[u8], kernels: &KernelRegistry) -> Ran {
    run_on(bytes, kernels, None)
}

/// A run on `inputs`, or on the method's example inputs.
fn run_on(bytes: &[u8], kernels: &KernelRegistry, inputs: Option<Vec<EValue>>) -> Ran {
    let mut m = load(bytes, kernels);
    m.set_profiling(true);
    let inputs = inputs.unwrap_or_else(|| m.meta().example_inputs(1 << 20).unwrap());
    m.set_inputs(&inputs).unwrap();
    m.execute().unwrap();
    let bytes = |v: &EValue| match v {
        EValue::Tensor(t) => t.as_bytes().to_vec(),
        other => panic!("{other:?}"),
    };
    let outputs = m.outputs().unwrap().iter().map(bytes).collect();
    let mut ops: Vec<String> = m.profile().into_iter().map(|e| e.name).collect();
    ops.sort();
    Ran {
        input: bytes(&inputs[0]),
        outputs,
        ops,
    }
}

/// The outputs with the add+relu fuser, and the names of the operators that ran.
fn run(bytes: &[u8]) -> (Vec<Vec<u8>>, Vec<String>) {
    let r = run_with(bytes, &kernels());
    (r.outputs, r.ops)
}

/// The first output of the program run by the default kernels, which do not fuse `add`
/// and `relu`.
fn run_plain(bytes: &[u8]) -> Vec<u8> {
    run_with(bytes, &pte_kernels::registry())
        .outputs
        .swap_remove(0)
}

#[test]
fn a_safe_proposal_is_taken_and_computes_the_same() {
    let (fused, ran) = run(&program(false, false, false));
    assert_eq!(ran, ["fused add+relu"]);
    assert_eq!(fused, [run_plain(&program(false, false, false))]);
}

#[test]
fn proposals_that_would_lose_a_value_are_refused() {
    for (output, extra, jump) in [
        (true, false, false),
        (false, true, false),
        (false, false, true),
    ] {
        let (_, ran) = run(&program(output, extra, jump));
        assert!(
            ran.contains(&"aten::add.out".to_owned()) && ran.contains(&"aten::relu.out".to_owned()),
            "output {output}, extra use {extra}, jump {jump}: {ran:?}"
        );
    }
}

/// `relu(view(x + y))`, the view elided (planned at the sum's place, never written); with
/// `view_read_elsewhere` a `neg` reads the view too.
fn program_through_view(view_read_elsewhere: bool) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[2, 3], Memory::Planned);
    let y = b.tensor(Float, &[2, 3], Memory::Planned);
    let alpha = b.int(1);
    let sum = b.tensor(Float, &[2, 3], Memory::Planned);
    let view = b.tensor(Float, &[2, 3], Memory::Planned);
    let out = b.tensor(Float, &[2, 3], Memory::Planned);
    b.call("aten::add", "out", &[x, y, alpha, sum, sum]);
    b.call("aten::relu", "out", &[view, out, out]);
    if view_read_elsewhere {
        let neg = b.tensor(Float, &[2, 3], Memory::Planned);
        b.call("aten::neg", "out", &[view, neg, neg]);
        b.output(neg);
    }
    b.input(x);
    b.input(y);
    b.output(out);
    let bytes = b.build();
    let mut image = pte_format::ProgramImage::parse(&bytes).unwrap();
    let values = image.program.execution_plan.as_mut().unwrap()[0]
        .values
        .as_mut()
        .unwrap();
    use pte_format::schema::executorch_flatbuffer::KernelTypes;
    let place = match &values[sum as usize].val {
        Some(KernelTypes::Tensor(t)) => t.allocation_info.clone(),
        _ => None,
    };
    if let Some(KernelTypes::Tensor(t)) = &mut values[view as usize].val {
        t.allocation_info = place;
    }
    image.to_bytes(&Default::default()).unwrap()
}

#[test]
fn a_value_read_through_an_elided_view_fuses_only_if_nothing_else_reads_the_view() {
    let bytes = program_through_view(false);
    let (fused, ran) = run(&bytes);
    assert_eq!(ran, ["fused add+relu"]);
    assert_eq!(fused, [run_plain(&bytes)]);
    let (_, ran) = run(&program_through_view(true));
    assert!(
        ran.contains(&"aten::add.out".to_owned()) && ran.contains(&"aten::relu.out".to_owned()),
        "{ran:?}"
    );
}

/// `transpose(W)` is folded at load; a call that packs it at prepare captures it.
struct Capturing;

impl Kernel for Capturing {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        let packed = args.constant(1)?.map(<[u8]>::to_vec).unwrap_or_default();
        Ok(Box::new(Captured(packed)))
    }
}

struct Captured(Vec<u8>);

impl PreparedKernel for Captured {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let mut io = args.io(&[], &[Arg::At(2)])?;
        io.outputs[0].bytes_mut().copy_from_slice(&self.0);
        Ok(())
    }

    fn consumed(&self) -> &[usize] {
        &[1]
    }
}

#[test]
fn a_constant_computed_at_load_is_released_once_captured() {
    let build = || {
        let mut b = ProgramBuilder::new();
        let x = b.tensor(Float, &[64, 64], Memory::Planned);
        let weights = vec![0.5f32; 64 * 64];
        let w = b.constant(Float, &[64, 64], bytemuck::cast_slice(&weights));
        let dims = b.int_list(&[1, 0]);
        let wt = b.tensor(Float, &[64, 64], Memory::Planned);
        b.call("aten::permute_copy", "out", &[w, dims, wt, wt]);
        let out = b.tensor(Float, &[64, 64], Memory::Planned);
        b.call("test::capture", "out", &[x, wt, out, out]);
        b.input(x);
        b.output(out);
        b.build()
    };
    let used = |capturing: bool| {
        let mut r = pte_kernels::registry();
        if capturing {
            r.register("test::capture.out", Capturing);
        } else {
            r.register_fn("test::capture.out", |a| {
                a.io(&[Arg::At(1)], &[Arg::At(2)]).map(drop)
            });
        }
        r.mark_pure("test::capture.out");
        Program::from_bytes(&build())
            .unwrap()
            .load_method_with(
                "forward",
                &r,
                &BackendRegistry::new(),
                &LoadOptions::default(),
            )
            .unwrap()
            .memory_used()
            .0
    };
    // The folded transpose (16 KiB) is held only while a call still reads it.
    assert_eq!(used(false) - used(true), 64 * 64 * 4);
}

/// `steps` products `h ← h · W + bias` in a row, each reading the same constant
/// `[k, k]` weight, as an unrolled recurrent network reads its weight at every step.
fn repeated_product(steps: usize, k: usize) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let weights: Vec<f32> = (0..k * k)
        .map(|i| ((i * 7 % 23) as f32 - 11.0) / (4.0 * k as f32))
        .collect();
    let bias: Vec<f32> = (0..k).map(|j| j as f32 / k as f32 - 0.5).collect();
    let kk = k as i32;
    let mut b = ProgramBuilder::new();
    let w = b.constant(Float, &[kk, kk], bytemuck::cast_slice(&weights));
    let bias_value = b.constant(Float, &[kk], bytemuck::cast_slice(&bias));
    let one = b.int(1);
    let x = b.tensor(Float, &[1, kk], Memory::Planned);
    let mut h = x;
    for _ in 0..steps {
        let next = b.tensor(Float, &[1, kk], Memory::Planned);
        b.call(
            "aten::addmm",
            "out",
            &[bias_value, h, w, one, one, next, next],
        );
        h = next;
    }
    b.input(x);
    b.output(h);
    (b.build(), weights, bias)
}

#[test]
fn calls_reading_one_weight_share_its_packed_copy() {
    let k = 96;
    let load = |steps| {
        Program::from_bytes(&repeated_product(steps, k).0)
            .unwrap()
            .load_method_with(
                "forward",
                &pte_kernels::registry(),
                &BackendRegistry::new(),
                &LoadOptions::default(),
            )
            .unwrap()
            .memory_used()
            .0
    };
    // Seven more steps hold their outputs and biases, not seven more packed weights.
    let (one, eight) = (load(1), load(8));
    assert!(
        eight - one < (k * k * 4) as u64,
        "1 step holds {one} bytes, 8 steps {eight}"
    );
    // And every step computes its product: h₈ against f64.
    let (bytes, w, bias) = repeated_product(8, k);
    let ran = run_with(&bytes, &pte_kernels::registry());
    let mut h: Vec<f64> = bytemuck::pod_collect_to_vec::<u8, f32>(&ran.input)
        .into_iter()
        .map(f64::from)
        .collect();
    for _ in 0..8 {
        h = (0..k)
            .map(|j| {
                (0..k).map(|p| h[p] * f64::from(w[p * k + j])).sum::<f64>() + f64::from(bias[j])
            })
            .collect();
    }
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&ran.outputs[0]);
    for (j, (&g, &want)) in got.iter().zip(&h).enumerate() {
        assert!(
            (f64::from(g) - want).abs() < 1e-4 * (1.0 + want.abs()),
            "{j}: {g} vs {want}"
        );
    }
}

/// A fuser that proposes nothing: the registry's kernels, each call on its own.
struct NoFusion;

impl Fuser for NoFusion {
    fn fuse(&self, _: &Graph<'_>) -> Vec<Fusion> {
        Vec::new()
    }
}

/// Asks folding to wait for every `permute_copy`, then fuses nothing: the permutes
/// must still be folded, after the fusions.
struct DeferOnly;

impl Fuser for DeferOnly {
    fn fuse(&self, _: &Graph<'_>) -> Vec<Fusion> {
        Vec::new()
    }

    fn defer_folding(&self, g: &Graph<'_>) -> Vec<pte_runtime::CallId> {
        g.calls()
            .iter()
            .filter(|c| c.op == "aten::permute_copy.out")
            .map(|c| c.id)
            .collect()
    }
}

/// `x · transpose(W) (+ bias) [→ relu]` as the exporter writes a linear layer: a
/// `permute_copy` of the constant `[n, k]` weight, then `addmm` (or `mm` without a
/// bias); with `shared` a second product reads the same transpose.
fn transposed_product(addmm: bool, relu: bool, shared: bool) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let (m, k, n) = (5usize, 19usize, 11usize);
    let weights: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0)
        .collect();
    let bias: Vec<f32> = (0..n).map(|j| j as f32 / 4.0 - 1.0).collect();
    let dims = |v: &[usize]| v.iter().map(|&d| d as i32).collect::<Vec<_>>();
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &dims(&[m, k]), Memory::Planned);
    let w = b.constant(Float, &dims(&[n, k]), bytemuck::cast_slice(&weights));
    let perm = b.int_list(&[1, 0]);
    let wt = b.tensor(Float, &dims(&[k, n]), Memory::Planned);
    let y = b.tensor(Float, &dims(&[m, n]), Memory::Planned);
    b.call("aten::permute_copy", "out", &[w, perm, wt, wt]);
    let product = |b: &mut ProgramBuilder, out: i32| {
        if addmm {
            let bias = b.constant(Float, &dims(&[n]), bytemuck::cast_slice(&bias));
            let one = b.int(1);
            b.call("aten::addmm", "out", &[bias, x, wt, one, one, out, out]);
        } else {
            b.call("aten::mm", "out", &[x, wt, out, out]);
        }
    };
    product(&mut b, y);
    let mut out = y;
    if relu {
        out = b.tensor(Float, &dims(&[m, n]), Memory::Planned);
        b.call("aten::relu", "out", &[y, out, out]);
    }
    b.input(x);
    b.output(out);
    if shared {
        let z = b.tensor(Float, &dims(&[m, n]), Memory::Planned);
        product(&mut b, z);
        b.output(z);
    }
    (b.build(), weights, if addmm { bias } else { vec![0.0; n] })
}

/// The registry's kernels with another fuser.
fn with_fuser(fuser: impl Fuser + 'static) -> KernelRegistry {
    let mut r = pte_kernels::registry();
    r.set_fuser(fuser);
    r
}

#[test]
fn a_transposed_weight_is_packed_as_stored_and_the_transpose_never_runs() {
    let (k, n) = (19, 11);
    for (addmm, relu) in [(true, false), (true, true), (false, false), (false, true)] {
        let (bytes, w, bias) = transposed_product(addmm, relu, false);
        let fused = run_with(&bytes, &pte_kernels::registry());
        let name = format!(
            "fused permute+{}{}",
            if addmm { "addmm" } else { "mm" },
            if relu { "+activation" } else { "" }
        );
        assert_eq!(fused.ops, [name], "addmm {addmm}, relu {relu}");
        // Each call on its own: the transpose folded, the product packing its result.
        let plain = run_with(&bytes, &with_fuser(NoFusion));
        assert!(
            !plain.ops.iter().any(|op| op.contains("permute")),
            "{:?}",
            plain.ops
        );
        assert_eq!(fused.outputs, plain.outputs, "addmm {addmm}, relu {relu}");
        // What the product is: y = x · Wᵀ + bias.
        let what = format!("addmm {addmm}, relu {relu}");
        let x: Vec<f32> = bytemuck::pod_collect_to_vec(&fused.input);
        let wt = |p: usize, j: usize| w[j * k + p];
        assert_product(&x, &fused.outputs[0], (k, n), wt, &bias, relu, &what);
    }
}

/// Checks `y` (rows of `n` values) against the rows of `x` (`k` values) times the
/// `k × n` weight `w(p, j)`, plus `bias`, [then ReLU].
fn assert_product(
    x: &[f32],
    y: &[u8],
    (k, n): (usize, usize),
    w: impl Fn(usize, usize) -> f32,
    bias: &[f32],
    relu: bool,
    what: &str,
) {
    let y: Vec<f32> = bytemuck::pod_collect_to_vec(y);
    assert_eq!(y.len(), x.len() / k * n, "{what}");
    for (i, row) in y.chunks(n).enumerate() {
        for (j, &got) in row.iter().enumerate() {
            let dot: f64 = (0..k)
                .map(|p| f64::from(x[i * k + p]) * f64::from(w(p, j)))
                .sum::<f64>()
                + f64::from(bias[j]);
            let want = if relu { dot.max(0.0) } else { dot };
            assert!(
                (f64::from(got) - want).abs() < 1e-4,
                "{what} ({i}, {j}): {got} vs {want}"
            );
        }
    }
}

#[test]
fn a_transpose_read_by_two_products_is_folded_once_and_not_fused() {
    let (bytes, _, _) = transposed_product(true, false, true);
    let fused = run_with(&bytes, &pte_kernels::registry());
    assert_eq!(fused.ops, ["aten::addmm.out"]);
    assert_eq!(
        fused.outputs,
        run_with(&bytes, &with_fuser(NoFusion)).outputs
    );
}

#[test]
fn a_deferred_call_no_fusion_takes_is_folded_after_the_fusions() {
    let (bytes, _, _) = transposed_product(true, true, false);
    let deferred = run_with(&bytes, &with_fuser(DeferOnly));
    assert_eq!(deferred.ops, ["aten::addmm.out", "aten::relu.out"]);
    assert_eq!(
        deferred.outputs,
        run_with(&bytes, &with_fuser(NoFusion)).outputs
    );
}

/// How [`expanded_product`] writes `bmm(x, expand_copy(W))`.
#[derive(Clone, Copy, Debug, Default)]
struct Expanded {
    /// `W` is `[1, k, n]` rather than `[k, n]`.
    lead_one: bool,
    /// `bmm` reads the expansion through a view the exporter elided.
    view: bool,
    /// A `relu` of the product follows.
    relu: bool,
    /// The expansion is also a method output.
    expansion_out: bool,
    /// `W` is a method input rather than a constant.
    variable: bool,
}

/// `bmm(x, expand_copy(W, [b, k, n]))` for `x` `[b, m, k]`, as `linear` on a tensor
/// that is not contiguous exports (`nn.MultiheadAttention`'s input projection on a
/// batch of sequences). Returns the program and `W`.
fn expanded_product(e: Expanded) -> (Vec<u8>, Vec<f32>) {
    let (batch, m, k, n) = (3usize, 5usize, 19usize, 37usize);
    let weights: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5 % 29) as f32 - 14.0) / 8.0)
        .collect();
    let dims = |v: &[usize]| v.iter().map(|&d| d as i32).collect::<Vec<_>>();
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &dims(&[batch, m, k]), Memory::Planned);
    let w_dims = if e.lead_one {
        vec![1, k, n]
    } else {
        vec![k, n]
    };
    let w = if e.variable {
        b.tensor(Float, &dims(&w_dims), Memory::Planned)
    } else {
        b.constant(Float, &dims(&w_dims), bytemuck::cast_slice(&weights))
    };
    let sizes = b.int_list(&[batch as i64, -1, -1]);
    let implicit = b.bool(false);
    let expanded = b.tensor(Float, &dims(&[batch, k, n]), Memory::Planned);
    b.call(
        "aten::expand_copy",
        "out",
        &[w, sizes, implicit, expanded, expanded],
    );
    let rhs = if e.view {
        let at = b.place(expanded).unwrap();
        b.tensor(Float, &dims(&[batch, k, n]), Memory::At(at))
    } else {
        expanded
    };
    let y = b.tensor(Float, &dims(&[batch, m, n]), Memory::Planned);
    b.call("aten::bmm", "out", &[x, rhs, y, y]);
    let mut out = y;
    if e.relu {
        out = b.tensor(Float, &dims(&[batch, m, n]), Memory::Planned);
        b.call("aten::relu", "out", &[y, out, out]);
    }
    b.input(x);
    if e.variable {
        b.input(w);
    }
    b.output(out);
    if e.expansion_out {
        b.output(expanded);
    }
    (b.build(), weights)
}

#[test]
fn a_constant_expanded_over_a_batch_is_one_product_and_never_repeated() {
    let (k, n) = (19, 37);
    for lead_one in [false, true] {
        for view in [false, true] {
            for relu in [false, true] {
                let e = Expanded {
                    lead_one,
                    view,
                    relu,
                    ..Expanded::default()
                };
                let (bytes, w) = expanded_product(e);
                let fused = run_with(&bytes, &pte_kernels::registry());
                let name = format!("fused expand+bmm{}", if relu { "+activation" } else { "" });
                assert_eq!(fused.ops, [name], "{e:?}");
                let plain = run_with(&bytes, &with_fuser(NoFusion));
                // Unfused, the expansion is folded into a repeated constant.
                assert!(plain.ops.iter().any(|op| op == "aten::bmm.out"), "{e:?}");
                // Every row of every matrix of x times W.
                let x: Vec<f32> = bytemuck::pod_collect_to_vec(&fused.input);
                let what = format!("{e:?}");
                for got in [&fused.outputs[0], &plain.outputs[0]] {
                    let wt = |p: usize, j: usize| w[p * n + j];
                    assert_product(&x, got, (k, n), wt, &vec![0.0; n], relu, &what);
                }
            }
        }
    }
}

#[test]
fn an_expansion_read_elsewhere_or_of_a_variable_is_not_fused() {
    for e in [
        Expanded {
            expansion_out: true,
            ..Expanded::default()
        },
        Expanded {
            view: true,
            expansion_out: true,
            ..Expanded::default()
        },
        Expanded {
            variable: true,
            ..Expanded::default()
        },
    ] {
        let (bytes, _) = expanded_product(e);
        let ran = run_with(&bytes, &pte_kernels::registry());
        assert_eq!(ran.ops, ["aten::bmm.out", "aten::expand_copy.out"], "{e:?}");
        let inputs = e.variable.then(|| {
            let m = load(&bytes, &pte_kernels::registry());
            m.meta().example_inputs(1 << 20).unwrap()
        });
        assert_eq!(
            run_on(&bytes, &pte_kernels::registry(), inputs.clone()).outputs,
            run_on(&bytes, &with_fuser(NoFusion), inputs).outputs,
            "{e:?}"
        );
    }
}

/// `_softmax` over the last dim of x [3, 4, 5], then PyTorch's `_safe_softmax`
/// decomposition as attention exports it; `masked_value` is the value `eq` compares
/// with (-inf in the real pattern).
fn safe_softmax_program(masked_value: f64) -> Vec<u8> {
    use pte_format::schema::executorch_flatbuffer::ScalarType::Bool;
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[3, 4, 5], Memory::Planned);
    let (dim, no, yes) = (b.int(-1), b.bool(false), b.bool(true));
    let s = b.tensor(Float, &[3, 4, 5], Memory::Planned);
    b.call("aten::_softmax", "out", &[x, dim, no, s, s]);
    let masked = b.tensor(Bool, &[3, 4, 5], Memory::Planned);
    let value = b.double(masked_value);
    b.call("aten::eq", "Scalar_out", &[x, value, masked, masked]);
    let kept = b.tensor(Bool, &[3, 4, 5], Memory::Planned);
    b.call("aten::logical_not", "out", &[masked, kept, kept]);
    let any_kept = b.tensor(Bool, &[3, 4, 1], Memory::Planned);
    let last = b.int(2);
    b.call("aten::any", "out", &[kept, last, yes, any_kept, any_kept]);
    let all_masked = b.tensor(Bool, &[3, 4, 1], Memory::Planned);
    b.call(
        "aten::logical_not",
        "out",
        &[any_kept, all_masked, all_masked],
    );
    let (zero, none) = (b.double(0.0), b.none());
    let zeros = b.tensor(Float, &[3, 4, 5], Memory::Planned);
    b.call("aten::full_like", "out", &[s, zero, none, zeros, zeros]);
    let out = b.tensor(Float, &[3, 4, 5], Memory::Planned);
    b.call("aten::where", "self_out", &[all_masked, zeros, s, out, out]);
    b.input(x);
    b.output(out);
    b.build()
}

/// Runs the safe softmax program on rows of: -inf only (0, 5), -inf and finite values
/// (1), -inf and a NaN (2), NaN and finite values (3), finite values (the rest).
fn run_safe_softmax(bytes: &[u8], kernels: &KernelRegistry) -> (Vec<f32>, Vec<String>) {
    let mut x: Vec<f32> = (0..60).map(|i| ((i * 7 % 11) as f32 - 5.0) / 2.0).collect();
    let inf = f32::INFINITY;
    x[..5].fill(-inf);
    x[25..30].fill(-inf);
    x[5..8].fill(-inf);
    x[10..15].fill(-inf);
    x[12] = f32::NAN;
    x[17] = f32::NAN;
    let t = pte_runtime::Tensor::from_slice(&[3, 4, 5], &x).unwrap();
    let mut ran = run_on(bytes, kernels, Some(vec![EValue::Tensor(t)]));
    ran.ops.dedup();
    (bytemuck::pod_collect_to_vec(&ran.outputs[0]), ran.ops)
}

#[test]
fn the_safe_softmax_decomposition_runs_as_one_call() {
    let bytes = safe_softmax_program(f64::NEG_INFINITY);
    let (fused, ops) = run_safe_softmax(&bytes, &pte_kernels::registry());
    assert_eq!(ops, ["fused safe softmax"]);
    let (plain, ops) = run_safe_softmax(&bytes, &with_fuser(NoFusion));
    assert_eq!(ops.len(), 6, "{ops:?}");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&fused), bits(&plain));
    for (r, row) in fused.chunks(5).enumerate() {
        match r {
            0 | 5 => assert!(row.iter().all(|&v| v == 0.0), "row {r}: {row:?}"),
            2 | 3 => assert!(row.iter().all(|v| v.is_nan()), "row {r}: {row:?}"),
            _ => assert!((row.iter().map(|&v| f64::from(v)).sum::<f64>() - 1.0).abs() < 1e-6),
        }
    }
    assert!(fused[5..8].iter().all(|&v| v == 0.0) && fused[8] > 0.0);
}

#[test]
fn a_softmax_masked_on_another_value_is_not_fused() {
    let bytes = safe_softmax_program(0.0);
    let (fused, ops) = run_safe_softmax(&bytes, &pte_kernels::registry());
    assert!(ops.contains(&"aten::where.self_out".to_owned()), "{ops:?}");
    let (plain, _) = run_safe_softmax(&bytes, &with_fuser(NoFusion));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&fused), bits(&plain));
    // Rows of -inf only are NaN: nothing here tests for -inf.
    assert!(fused[..5].iter().all(|v| v.is_nan()));
}

/// x [2, 3, 4] → unsqueeze(1) → permute [3, 1, 0, 2] → squeeze(1) → clone: y [4, 2, 3]
/// with y[a][b][c] = x[b][c][a]; with `permute` false the permute is left out (the
/// chain keeps the elements in order); with `shared` the permute's output is a method
/// output too.
fn copy_chain_program(permute: bool, shared: bool) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[2, 3, 4], Memory::Planned);
    let one = b.int(1);
    let u = b.tensor(Float, &[2, 1, 3, 4], Memory::Planned);
    b.call("aten::unsqueeze_copy", "out", &[x, one, u, u]);
    let mut last = u;
    if permute {
        let perm = b.int_list(&[3, 1, 0, 2]);
        let p = b.tensor(Float, &[4, 1, 2, 3], Memory::Planned);
        b.call("aten::permute_copy", "out", &[u, perm, p, p]);
        last = p;
        if shared {
            b.output(p);
        }
    }
    let dims = b.int_list(&[1]);
    let squeezed = if permute { [4, 2, 3] } else { [2, 3, 4] };
    let s = b.tensor(Float, &squeezed, Memory::Planned);
    b.call("aten::squeeze_copy", "dims_out", &[last, dims, s, s]);
    let none = b.none();
    let y = b.tensor(Float, &squeezed, Memory::Planned);
    b.call("aten::clone", "out", &[s, none, y, y]);
    b.input(x);
    b.output(y);
    b.build()
}

#[test]
fn a_chain_of_rearranging_copies_runs_as_one_gather() {
    let bytes = copy_chain_program(true, false);
    let fused = run_with(&bytes, &pte_kernels::registry());
    assert_eq!(fused.ops, ["fused copies"]);
    let plain = run_with(&bytes, &with_fuser(NoFusion));
    assert!(plain.ops.len() >= 2, "{:?}", plain.ops);
    assert_eq!(fused.outputs, plain.outputs);
    let x: Vec<f32> = bytemuck::pod_collect_to_vec(&fused.input);
    let y: Vec<f32> = bytemuck::pod_collect_to_vec(&fused.outputs[0]);
    for a in 0..4 {
        for b in 0..2 {
            for c in 0..3 {
                assert_eq!(y[(a * 2 + b) * 3 + c], x[(b * 3 + c) * 4 + a]);
            }
        }
    }
}

#[test]
fn copies_that_keep_the_order_or_share_a_value_are_not_fused_whole() {
    // In order: left to alias elision.
    let in_order = run_with(&copy_chain_program(false, false), &pte_kernels::registry());
    assert!(
        !in_order.ops.iter().any(|o| o == "fused copies"),
        "{:?}",
        in_order.ops
    );
    // The permute's output is read by the method too: the chain ends there, and what
    // follows runs on its own.
    let bytes = copy_chain_program(true, true);
    let shared = run_with(&bytes, &pte_kernels::registry());
    assert!(
        shared.ops.contains(&"fused copies".to_owned()),
        "{:?}",
        shared.ops
    );
    assert_eq!(
        shared.outputs,
        run_with(&bytes, &with_fuser(NoFusion)).outputs
    );
}

/// Where an LSTM cell's gates come from.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Gates {
    /// A method input `[rows, 4 × h]`.
    Given,
    /// The sum of two method inputs, as an exported step adds its two products:
    /// `[1, rows, 4 × h] + [rows, 4 × h]`, the second read through `relu` then
    /// `squeeze_copy` of `[1, rows, 4 × h]` (a copy the runtime elides) when `squeezed`.
    Summed { squeezed: bool },
    /// An exported step: `addmm(bias, x, permute_copy(W))` of a method input `x` of
    /// [`PRODUCT_DEPTH`] columns and a constant `W`, read as `[1, rows, 4 × h]` through
    /// a view the exporter elided, plus
    /// a method input `[rows, 4 × h]`; with `exposed` the product is a method output.
    Product { exposed: bool },
}

/// Columns of [`Gates::Product`]'s input.
const PRODUCT_DEPTH: usize = 24;
/// Where [`Gates::Product`] plans its product, past the other tensors.
const PRODUCT_AT: u64 = 1 << 20;

/// The weight `[4h, PRODUCT_DEPTH]` and bias `[4h]` of [`Gates::Product`].
fn product_constants(h: usize) -> (Vec<f32>, Vec<f32>) {
    let weights: Vec<f32> = pte_testkit::values(4 * h * PRODUCT_DEPTH, 44)
        .iter()
        .map(|w| w / 4.0)
        .collect();
    (weights, pte_testkit::values(4 * h, 45))
}

impl Gates {
    /// The sizes of the gates (`[1, rows, 4 × h]` when summed) with the last replaced.
    fn sizes(self, rows: i32, last: i32) -> Vec<i32> {
        match self {
            Gates::Given => vec![rows, last],
            Gates::Summed { .. } | Gates::Product { .. } => vec![1, rows, last],
        }
    }
}

/// An LSTM cell's gates as exported: `gates` of `[rows, 4 × h]` split along the last
/// dim into four, `sigmoid` / `tanh`, then `c' = f·c + i·g` and `h' = o·tanh(c')`, both
/// outputs. With `expose`, the input gate is a method output too; `alpha` is the cell
/// addition's.
fn lstm_cell_program(rows: usize, h: usize, expose: bool, alpha: i64, from: Gates) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let (r, h) = (rows as i32, h as i32);
    let gates = b.tensor(Float, &from.sizes(r, 4 * h), Memory::Planned);
    let mut inputs = vec![gates];
    if let Gates::Summed { squeezed } = from {
        let x = b.tensor(Float, &[1, r, 4 * h], Memory::Planned);
        let y = if squeezed {
            let y = b.tensor(Float, &[1, r, 4 * h], Memory::Planned);
            inputs.push(y);
            let (relu, flat) = (
                b.tensor(Float, &[1, r, 4 * h], Memory::Planned),
                b.tensor(Float, &[r, 4 * h], Memory::Planned),
            );
            b.call("aten::relu", "out", &[y, relu, relu]);
            let dims = b.int_list(&[0]);
            b.call("aten::squeeze_copy", "dims_out", &[relu, dims, flat, flat]);
            flat
        } else {
            let y = b.tensor(Float, &[r, 4 * h], Memory::Planned);
            inputs.push(y);
            y
        };
        inputs[0] = x;
        let one = b.int(1);
        b.call("aten::add", "out", &[x, y, one, gates, gates]);
    }
    if let Gates::Product { exposed } = from {
        // h0 · Wᵀ + bias, viewed as [1, r, 4h], plus the batched slice xs.
        let k = PRODUCT_DEPTH as i32;
        let (weights, bias) = product_constants(h as usize);
        let x = b.tensor(Float, &[r, k], Memory::Planned);
        let xs = b.tensor(Float, &[r, 4 * h], Memory::Planned);
        let w = b.constant(Float, &[4 * h, k], bytemuck::cast_slice(&weights));
        let bias = b.constant(Float, &[4 * h], bytemuck::cast_slice(&bias));
        let (perm, one) = (b.int_list(&[1, 0]), b.int(1));
        let wt = b.tensor(Float, &[k, 4 * h], Memory::Planned);
        // The view the exporter elided: a tensor at the product's place that no
        // instruction writes.
        let product = b.tensor(Float, &[r, 4 * h], Memory::At(PRODUCT_AT));
        let viewed = b.tensor(Float, &[1, r, 4 * h], Memory::At(PRODUCT_AT));
        b.call("aten::permute_copy", "out", &[w, perm, wt, wt]);
        b.call(
            "aten::addmm",
            "out",
            &[bias, x, wt, one, one, product, product],
        );
        b.call("aten::add", "out", &[viewed, xs, one, gates, gates]);
        inputs = vec![x, xs];
        if exposed {
            b.output(product);
        }
    }
    let c = b.tensor(Float, &[r, h], Memory::Planned);
    let piece = from.sizes(r, h);
    let pieces: Vec<i32> = (0..4)
        .map(|_| b.tensor(Float, &piece, Memory::Planned))
        .collect();
    let (sizes, dim) = (b.int_list(&[i64::from(h); 4]), b.int(-1));
    let (list, ret) = (b.tensor_list(&pieces), b.tensor_list(&pieces));
    b.call(
        "aten::split_with_sizes_copy",
        "out",
        &[gates, sizes, dim, list, ret],
    );
    let unary = |b: &mut ProgramBuilder, op: &str, x: i32| {
        let y = b.tensor(Float, &piece, Memory::Planned);
        b.call(op, "out", &[x, y, y]);
        y
    };
    let i = unary(&mut b, "aten::sigmoid", pieces[0]);
    let f = unary(&mut b, "aten::sigmoid", pieces[1]);
    let g = unary(&mut b, "aten::tanh", pieces[2]);
    let o = unary(&mut b, "aten::sigmoid", pieces[3]);
    let binary = |b: &mut ProgramBuilder, op: &str, x: i32, y: i32, alpha: Option<i64>| {
        let z = b.tensor(Float, &piece, Memory::Planned);
        match alpha {
            Some(a) => {
                let a = b.int(a);
                b.call(op, "out", &[x, y, a, z, z]);
            }
            None => b.call(op, "out", &[x, y, z, z]),
        }
        z
    };
    let fc = binary(&mut b, "aten::mul", f, c, None);
    let ig = binary(&mut b, "aten::mul", i, g, None);
    let c2 = binary(&mut b, "aten::add", fc, ig, Some(alpha));
    let tc = unary(&mut b, "aten::tanh", c2);
    let h2 = binary(&mut b, "aten::mul", o, tc, None);
    for x in inputs {
        b.input(x);
    }
    b.input(c);
    b.output(h2);
    b.output(c2);
    if expose {
        b.output(i);
    }
    b.build()
}

/// The cell run on deterministic inputs by `kernels`.
fn run_lstm_cell(
    bytes: &[u8],
    rows: usize,
    h: usize,
    from: Gates,
    kernels: &KernelRegistry,
) -> Ran {
    let tensor = |sizes: &[usize], seed| {
        let values: Vec<f32> = pte_testkit::values(sizes.iter().product(), seed);
        EValue::Tensor(pte_runtime::Tensor::from_slice(sizes, &values).unwrap())
    };
    let mut inputs = match from {
        Gates::Given => vec![tensor(&[rows, 4 * h], 41)],
        Gates::Summed { squeezed: true } => {
            vec![tensor(&[1, rows, 4 * h], 41), tensor(&[1, rows, 4 * h], 43)]
        }
        Gates::Summed { squeezed: false } => {
            vec![tensor(&[1, rows, 4 * h], 41), tensor(&[rows, 4 * h], 43)]
        }
        Gates::Product { .. } => {
            vec![
                tensor(&[rows, PRODUCT_DEPTH], 41),
                tensor(&[rows, 4 * h], 43),
            ]
        }
    };
    inputs.push(tensor(&[rows, h], 42));
    run_on(bytes, kernels, Some(inputs))
}

#[test]
fn an_lstm_cell_runs_as_one_elementwise_chain_with_the_same_bits() {
    // Blocks of 256 values: one block, one and a bit, the largest fused size; gates
    // given, or summed first (the sum cut into pieces inside the chain).
    let summed = Gates::Summed { squeezed: false };
    for (h, expose, from) in [
        (128, false, Gates::Given),
        (300, true, Gates::Given),
        (4096, false, Gates::Given),
        (128, false, summed),
        (300, true, summed),
    ] {
        let bytes = lstm_cell_program(1, h, expose, 1, from);
        let fused = run_lstm_cell(&bytes, 1, h, from, &pte_kernels::registry());
        assert_eq!(fused.ops, ["fused elementwise chain"], "h {h}, {from:?}");
        let plain = run_lstm_cell(&bytes, 1, h, from, &with_fuser(NoFusion));
        assert!(plain.ops.len() >= 5, "{:?}", plain.ops);
        assert_eq!(fused.outputs, plain.outputs, "h {h}, {from:?}");
        // h' = o · tanh(f · c + i · g), from the inputs in f64 (the sum in f32).
        let mut gates: Vec<f32> = pte_testkit::values(4 * h, 41);
        if from != Gates::Given {
            let other: Vec<f32> = pte_testkit::values(4 * h, 43);
            gates.iter_mut().zip(other).for_each(|(g, o)| *g += o);
        }
        let c: Vec<f32> = pte_testkit::values(h, 42);
        let out: Vec<f32> = bytemuck::pod_collect_to_vec(&fused.outputs[0]);
        let sig = |x: f32| 1.0 / (1.0 + (-f64::from(x)).exp());
        for j in 0..h {
            let [i, f, g, o] = [0, 1, 2, 3].map(|k| gates[k * h + j]);
            let want = sig(o) * (sig(f) * f64::from(c[j]) + sig(i) * f64::from(g).tanh()).tanh();
            assert!((f64::from(out[j]) - want).abs() < 1e-5, "h {h}, value {j}");
        }
    }
}

#[test]
fn a_product_and_the_gates_after_it_run_as_one_call() {
    for h in [128, 300] {
        let from = Gates::Product { exposed: false };
        let bytes = lstm_cell_program(1, h, false, 1, from);
        let fused = run_lstm_cell(&bytes, 1, h, from, &pte_kernels::registry());
        assert_eq!(
            fused.ops,
            ["fused permute+addmm+elementwise chain"],
            "h {h}"
        );
        let plain = run_lstm_cell(&bytes, 1, h, from, &with_fuser(NoFusion));
        assert!(plain.ops.len() >= 5, "{:?}", plain.ops);
        // The same product kernel, then the same vector functions.
        assert_eq!(fused.outputs, plain.outputs, "h {h}");
        // h' = o · tanh(f · c + i · g), the gates x · Wᵀ + bias + xs, in f64.
        let (w, bias) = product_constants(h);
        let (x, xs) = (
            pte_testkit::values(PRODUCT_DEPTH, 41),
            pte_testkit::values(4 * h, 43),
        );
        let gate = |j: usize| {
            let row = &w[j * PRODUCT_DEPTH..(j + 1) * PRODUCT_DEPTH];
            let dot: f64 = row
                .iter()
                .zip(&x)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            dot + f64::from(bias[j]) + f64::from(xs[j])
        };
        let c: Vec<f32> = pte_testkit::values(h, 42);
        let out: Vec<f32> = bytemuck::pod_collect_to_vec(&fused.outputs[0]);
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        for j in 0..h {
            let [i, f, g, o] = [0, 1, 2, 3].map(|k| gate(k * h + j));
            let want = sig(o) * (sig(f) * f64::from(c[j]) + sig(i) * g.tanh()).tanh();
            assert!((f64::from(out[j]) - want).abs() < 1e-5, "h {h}, value {j}");
        }
    }
}

#[test]
fn a_product_joins_only_the_calls_a_chain_can_take() {
    // The product is a method output: it is stored, and the gates form a chain of
    // their own. Two rows: the gates' pieces are not runs, so the product takes only
    // the addition, and the split runs on its own.
    for (rows, exposed, want) in [
        (1, true, ["fused elementwise chain", "fused permute+addmm"]),
        (
            2,
            false,
            [
                "aten::split_with_sizes_copy.out",
                "fused permute+addmm+elementwise chain",
            ],
        ),
    ] {
        let from = Gates::Product { exposed };
        let bytes = lstm_cell_program(rows, 64, false, 1, from);
        let fused = run_lstm_cell(&bytes, rows, 64, from, &pte_kernels::registry());
        for op in want {
            assert!(
                fused.ops.contains(&op.to_owned()),
                "rows {rows}: {:?}",
                fused.ops
            );
        }
        let plain = run_lstm_cell(&bytes, rows, 64, from, &with_fuser(NoFusion));
        assert_eq!(fused.outputs, plain.outputs, "rows {rows}");
    }
}

#[test]
fn a_copy_read_by_a_call_of_several_outputs_is_elided() {
    // The chain writes h' and c'; the squeezed addend it reads is a view of the relu's
    // result, with no copy.
    let from = Gates::Summed { squeezed: true };
    let bytes = lstm_cell_program(1, 64, false, 1, from);
    let fused = run_lstm_cell(&bytes, 1, 64, from, &pte_kernels::registry());
    assert_eq!(fused.ops, ["aten::relu.out", "fused elementwise chain"]);
    let plain = run_lstm_cell(&bytes, 1, 64, from, &with_fuser(NoFusion));
    assert_eq!(fused.outputs, plain.outputs);
}

#[test]
fn elementwise_chains_stop_where_their_conditions_do() {
    // Pieces that are not runs of the input (two rows), tensors above the fused size,
    // an addition scaled by alpha: the chain is cut there or not formed, and every
    // result is the same.
    for (rows, h, alpha) in [(2, 64, 1), (1, 4097, 1), (1, 64, 2)] {
        let bytes = lstm_cell_program(rows, h, false, alpha, Gates::Given);
        let fused = run_lstm_cell(&bytes, rows, h, Gates::Given, &pte_kernels::registry());
        let plain = run_lstm_cell(&bytes, rows, h, Gates::Given, &with_fuser(NoFusion));
        assert_eq!(
            fused.outputs, plain.outputs,
            "rows {rows}, h {h}, alpha {alpha}"
        );
        let whole = fused.ops == ["fused elementwise chain"];
        assert!(!whole, "rows {rows}, h {h}, alpha {alpha}: {:?}", fused.ops);
    }
    // With alpha 2, the calls before the addition still form a chain.
    let bytes = lstm_cell_program(1, 64, false, 2, Gates::Given);
    let ops = run_lstm_cell(&bytes, 1, 64, Gates::Given, &pte_kernels::registry()).ops;
    assert!(
        ops.contains(&"fused elementwise chain".to_owned()),
        "{ops:?}"
    );
    // Summed gates cut into pieces that are not runs (two rows): the sum stays a call
    // of its own, and the results are the same.
    let from = Gates::Summed { squeezed: false };
    let bytes = lstm_cell_program(2, 64, false, 1, from);
    let fused = run_lstm_cell(&bytes, 2, 64, from, &pte_kernels::registry());
    assert!(
        fused.ops.contains(&"aten::add.out".to_owned()),
        "{:?}",
        fused.ops
    );
    let plain = run_lstm_cell(&bytes, 2, 64, from, &with_fuser(NoFusion));
    assert_eq!(fused.outputs, plain.outputs);
}
