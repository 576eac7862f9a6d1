//! Calls of pure kernels on constants run once, at load, with the results they would give
//! at every execution.

use pte_format::schema::executorch_flatbuffer::ScalarType::Float;
use pte_runtime::{EValue, KernelRegistry, Method};
use pte_testkit::program::{Memory, ProgramBuilder};

mod common;
use common::load;

/// The same kernels, none of them marked pure: nothing folds.
fn unfolded() -> KernelRegistry {
    let all = pte_kernels::registry();
    let mut r = KernelRegistry::new();
    for name in all.names() {
        r.register(name, Forward(all.get(name).unwrap().clone()));
    }
    r
}

struct Forward(std::sync::Arc<dyn pte_runtime::Kernel>);

impl pte_runtime::Kernel for Forward {
    fn prepare(
        &self,
        args: &pte_runtime::Args<'_>,
    ) -> pte_runtime::KernelResult<Box<dyn pte_runtime::PreparedKernel>> {
        self.0.prepare(args)
    }
}

/// `y = x @ transpose(W)`, x [3, 4] and W [5, 4] constant: the input and the product.
fn weight_product(b: &mut ProgramBuilder) -> (i32, i32) {
    let x = b.tensor(Float, &[3, 4], Memory::Planned);
    let weights: Vec<f32> = (0..20).map(|i| i as f32 / 7.0 - 1.0).collect();
    let w = b.constant(Float, &[5, 4], bytemuck::cast_slice(&weights));
    let dims = b.int_list(&[1, 0]);
    let wt = b.tensor(Float, &[4, 5], Memory::Planned);
    b.call("aten::permute_copy", "out", &[w, dims, wt, wt]);
    let y = b.tensor(Float, &[3, 5], Memory::Planned);
    b.call("aten::mm", "out", &[x, wt, y, y]);
    (x, y)
}

/// `x @ transpose(W)` with W constant, then a constant chain: `arange(4) * 2` added.
fn linear_program() -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let (x, y) = weight_product(&mut b);
    let (start, end, step) = (b.int(0), b.int(5), b.int(1));
    let range = b.tensor(Float, &[5], Memory::Planned);
    b.call(
        "aten::arange",
        "start_out",
        &[start, end, step, range, range],
    );
    let two = b.double(2.0);
    let doubled = b.tensor(Float, &[5], Memory::Planned);
    b.call("aten::mul", "Scalar_out", &[range, two, doubled, doubled]);
    let alpha = b.int(1);
    let out = b.tensor(Float, &[3, 5], Memory::Planned);
    b.call("aten::add", "out", &[y, doubled, alpha, out, out]);
    b.input(x);
    b.output(out);
    b.build()
}

fn run(m: &mut Method) -> Vec<u8> {
    let inputs = m.meta().example_inputs(1 << 20).unwrap();
    m.set_inputs(&inputs).unwrap();
    m.execute().unwrap();
    match &m.outputs().unwrap()[0] {
        EValue::Tensor(t) => t.as_bytes().to_vec(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn calls_on_constants_run_once_at_load_with_the_same_results() {
    let bytes = linear_program();
    let mut folded = load(&bytes, &pte_kernels::registry());
    let mut plain = load(&bytes, &unfolded());
    folded.set_profiling(true);
    plain.set_profiling(true);
    assert_eq!(run(&mut folded), run(&mut plain));
    let ops = |m: &Method| -> Vec<String> { m.profile().into_iter().map(|e| e.name).collect() };
    // Only the products of the input run; the constant chain does not, and the
    // transpose is read by the product as it packs the weight (never computed).
    let mut executed = ops(&folded);
    executed.sort();
    assert_eq!(executed, ["aten::add.out", "fused permute+mm"]);
    assert_eq!(ops(&plain).len(), 5);
}

#[test]
fn a_call_that_fails_at_load_is_left_to_run() {
    // A transpose with a bad permutation in a branch that is jumped over: folding it
    // fails, so it stays, and it never runs.
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[2, 2], Memory::Planned);
    let w = b.constant(Float, &[2, 2], bytemuck::cast_slice(&[1f32, 2.0, 3.0, 4.0]));
    let no = b.bool(false);
    let bad = b.int_list(&[0, 0]);
    let wt = b.tensor(Float, &[2, 2], Memory::Planned);
    let out = b.tensor(Float, &[2, 2], Memory::Planned);
    b.jump_false(no, 2);
    b.call("aten::permute_copy", "out", &[w, bad, wt, wt]);
    b.call("aten::relu", "out", &[x, out, out]);
    b.input(x);
    b.output(out);
    let mut m = load(&b.build(), &pte_kernels::registry());
    run(&mut m);
}

#[test]
fn a_tensor_read_through_an_elided_view_keeps_its_planned_memory() {
    // arange writes a planned tensor that a never-written view (same place, another
    // shape) reads: folding arange into a buffer of its own would leave the view empty.
    let mut b = ProgramBuilder::new();
    let (start, end, step) = (b.int(0), b.int(4), b.int(1));
    let range = b.tensor(Float, &[4], Memory::Planned);
    b.call(
        "aten::arange",
        "start_out",
        &[start, end, step, range, range],
    );
    // At the range's place, as the exporter plans a static view_copy.
    let view = b.tensor(Float, &[2, 2], Memory::At(b.place(range).unwrap()));
    let out = b.tensor(Float, &[2, 2], Memory::Planned);
    b.call("aten::relu", "out", &[view, out, out]);
    b.output(out);
    let bytes = b.build();
    let mut m = load(&bytes, &pte_kernels::registry());
    let out = run(&mut m);
    assert_eq!(out, bytemuck::cast_slice::<f32, u8>(&[0.0, 1.0, 2.0, 3.0]));
}

#[test]
fn a_tensor_read_through_an_elided_view_by_a_fused_call_keeps_its_planned_memory() {
    // Swin Transformer's shifted-window mask: computed from constants, then read through
    // a view by a permute and a clone that fuse into one copy. The folds that follow
    // the fusions (here because of the weight transpose before `mm`) must see the fused
    // call as reading the view, or the mask folds away from the view's place.
    let mut b = ProgramBuilder::new();
    let (x, y) = weight_product(&mut b);
    let (start, end, step) = (b.int(0), b.int(24), b.int(1));
    let range = b.tensor(Float, &[24], Memory::Planned);
    b.call(
        "aten::arange",
        "start_out",
        &[start, end, step, range, range],
    );
    let view = b.tensor(Float, &[2, 3, 4], Memory::At(b.place(range).unwrap()));
    let dims = b.int_list(&[2, 0, 1]);
    let permuted = b.tensor(Float, &[4, 2, 3], Memory::Planned);
    b.call(
        "aten::permute_copy",
        "out",
        &[view, dims, permuted, permuted],
    );
    let none = b.none();
    let out = b.tensor(Float, &[4, 2, 3], Memory::Planned);
    b.call("aten::clone", "out", &[permuted, none, out, out]);
    b.input(x);
    b.output(out);
    b.output(y);
    let mut m = load(&b.build(), &pte_kernels::registry());
    m.set_profiling(true);
    let got = run(&mut m);
    let ran: Vec<String> = m.profile().into_iter().map(|e| e.name).collect();
    assert!(ran.contains(&"fused copies".to_owned()), "{ran:?}");
    // out[i][j][k] = view[j][k][i] = 12j + 4k + i.
    let expected: Vec<f32> = (0..4)
        .flat_map(|i| (0..2).flat_map(move |j| (0..3).map(move |k| (12 * j + 4 * k + i) as f32)))
        .collect();
    assert_eq!(got, bytemuck::cast_slice::<f32, u8>(&expected));
}
