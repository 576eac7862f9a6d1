//! Copies that move no data are elided at load, and only when nothing overwrites the
//! bytes their output now reads.

use pte_format::schema::executorch_flatbuffer::ScalarType::Float;
use pte_runtime::{EValue, Method, Program, Tensor};
use pte_testkit::program::{Memory, ProgramBuilder};

fn load(bytes: &[u8]) -> Method {
    Program::from_bytes(bytes)
        .unwrap()
        .load_method("forward", &pte_kernels::registry())
        .unwrap()
}

/// Runs the method on `x` (its one input, of `sizes`): the first output as f32 values,
/// and the operators that ran.
fn run(bytes: &[u8], sizes: &[usize], x: &[f32]) -> (Vec<f32>, Vec<String>) {
    run_method(load(bytes), sizes, x)
}

/// [`run`] on a loaded method.
fn run_method(mut m: Method, sizes: &[usize], x: &[f32]) -> (Vec<f32>, Vec<String>) {
    m.set_profiling(true);
    m.set_inputs(&[EValue::Tensor(Tensor::from_slice(sizes, x).unwrap())])
        .unwrap();
    m.execute().unwrap();
    let out = match &m.outputs().unwrap()[0] {
        EValue::Tensor(t) => t.as_slice::<f32>().unwrap().to_vec(),
        other => panic!("{other:?}"),
    };
    (out, m.profile().into_iter().map(|e| e.name).collect())
}

fn input(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 - 2.5).collect()
}

#[test]
fn copies_that_keep_the_order_are_elided() {
    // a = -x; u = unsqueeze(a, 0); p = permute(u, [1, 0, 2]) (moves a size-1 dim);
    // v: a view of p's place the exporter elided; out = relu(v).
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[2, 3], Memory::Planned);
    let a = b.tensor(Float, &[2, 3], Memory::Planned);
    let u = b.tensor(Float, &[1, 2, 3], Memory::Planned);
    let p = b.tensor(Float, &[2, 1, 3], Memory::Planned);
    let p_at = 3 * 32;
    let v = b.tensor(Float, &[6], Memory::At(p_at));
    let out = b.tensor(Float, &[6], Memory::Planned);
    let zero = b.int(0);
    let dims = b.int_list(&[1, 0, 2]);
    b.call("aten::neg", "out", &[x, a, a]);
    b.call("aten::unsqueeze_copy", "out", &[a, zero, u, u]);
    b.call("aten::permute_copy", "out", &[u, dims, p, p]);
    b.call("aten::relu", "out", &[v, out, out]);
    b.input(x);
    b.output(out);
    let bytes = b.build();
    let xs = input(6);
    let (got, ran) = run(&bytes, &[2, 3], &xs);
    let want: Vec<f32> = xs.iter().map(|v| (-v).max(0.0)).collect();
    assert_eq!(got, want);
    assert!(
        !ran.iter().any(|n| n.contains("_copy")),
        "copies still ran: {ran:?}"
    );
}

#[test]
fn a_real_transposition_still_runs() {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[2, 3], Memory::Planned);
    let a = b.tensor(Float, &[2, 3], Memory::Planned);
    let t = b.tensor(Float, &[3, 2], Memory::Planned);
    let dims = b.int_list(&[1, 0]);
    b.call("aten::neg", "out", &[x, a, a]);
    b.call("aten::permute_copy", "out", &[a, dims, t, t]);
    b.input(x);
    b.output(t);
    let xs = input(6);
    let (got, ran) = run(&b.build(), &[2, 3], &xs);
    let want: Vec<f32> = (0..6).map(|k| -xs[(k % 2) * 3 + k / 2]).collect();
    assert_eq!(got, want);
    assert!(ran.iter().any(|n| n.contains("permute_copy")));
}

#[test]
fn a_leading_select_reads_at_its_offset() {
    // s = select(-x, 0, 2): the third 2x2 matrix, one run at element 8.
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[3, 2, 2], Memory::Planned);
    let a = b.tensor(Float, &[3, 2, 2], Memory::Planned);
    let s = b.tensor(Float, &[2, 2], Memory::Planned);
    let out = b.tensor(Float, &[2, 2], Memory::Planned);
    let (zero, two) = (b.int(0), b.int(2));
    b.call("aten::neg", "out", &[x, a, a]);
    b.call("aten::select_copy", "int_out", &[a, zero, two, s, s]);
    b.call("aten::relu", "out", &[s, out, out]);
    b.input(x);
    b.output(out);
    let xs: Vec<f32> = (0..12).map(|i| 5.0 - i as f32).collect();
    let (got, ran) = run(&b.build(), &[3, 2, 2], &xs);
    let want: Vec<f32> = xs[8..].iter().map(|v| (-v).max(0.0)).collect();
    assert_eq!(got, want);
    assert!(!ran.iter().any(|n| n.contains("select_copy")), "{ran:?}");
}

/// `u = unsqueeze(a)`, then `t = exp(u)` planned over a's bytes (a is dead to the
/// planner), then `out = u + t`, which must see a's old values. `a` is `-x` or, with
/// `a_is_input`, the input `x` itself.
fn overwritten_source(a_is_input: bool) -> (Vec<f32>, Vec<String>) {
    let mut b = ProgramBuilder::new();
    let a_at = 32;
    let x = b.tensor(
        Float,
        &[2, 3],
        Memory::At(if a_is_input { a_at } else { 0 }),
    );
    let a = if a_is_input {
        x
    } else {
        b.tensor(Float, &[2, 3], Memory::At(a_at))
    };
    let u = b.tensor(Float, &[1, 2, 3], Memory::At(64));
    let t = b.tensor(Float, &[1, 2, 3], Memory::At(a_at));
    let out = b.tensor(Float, &[1, 2, 3], Memory::At(96));
    let (zero, one) = (b.int(0), b.int(1));
    if !a_is_input {
        b.call("aten::neg", "out", &[x, a, a]);
    }
    b.call("aten::unsqueeze_copy", "out", &[a, zero, u, u]);
    b.call("aten::exp", "out", &[u, t, t]);
    b.call("aten::add", "out", &[u, t, one, out, out]);
    b.input(x);
    b.output(out);
    let xs = input(6);
    let (got, ran) = run(&b.build(), &[2, 3], &xs);
    let sign = if a_is_input { 1.0 } else { -1.0 };
    let want: Vec<f32> = xs.iter().map(|v| sign * v + (sign * v).exp()).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
    (got, ran)
}

#[test]
fn a_copy_whose_source_is_overwritten_before_its_last_read_reads_a_moved_source() {
    // -x moves to a buffer of its own, where exp's output does not reach it.
    let (_, ran) = overwritten_source(false);
    assert!(!ran.iter().any(|n| n.contains("unsqueeze_copy")), "{ran:?}");
}

#[test]
fn a_copy_of_an_overwritten_input_runs() {
    // The caller's input is not moved: the copy keeps its values.
    let (_, ran) = overwritten_source(true);
    assert!(ran.iter().any(|n| n.contains("unsqueeze_copy")), "{ran:?}");
}

#[test]
fn a_method_output_keeps_its_bytes_to_the_end() {
    // out = view(x, [6]) is a method output: elided only when nothing overwrites the
    // input x before the method ends (`overwrite`: t, planned over x's bytes, comes
    // after). A computed source would move instead (see above); an input stays.
    for overwrite in [false, true] {
        let mut b = ProgramBuilder::new();
        let x_at = 32;
        let x = b.tensor(Float, &[2, 3], Memory::At(x_at));
        let out = b.tensor(Float, &[6], Memory::At(64));
        let sizes = b.int_list(&[6]);
        b.call("aten::view_copy", "out", &[x, sizes, out, out]);
        b.input(x);
        b.output(out);
        if overwrite {
            let t = b.tensor(Float, &[2, 3], Memory::At(x_at));
            b.call("aten::exp", "out", &[x, t, t]);
            b.output(t);
        }
        let xs = input(6);
        let (got, ran) = run(&b.build(), &[2, 3], &xs);
        assert_eq!(got, xs);
        assert_eq!(
            ran.iter().any(|n| n.contains("view_copy")),
            overwrite,
            "{ran:?}"
        );
    }
}

/// `split_with_sizes_copy(-x, [2, 4], dim)` of a `[rows, 6]` tensor, each piece then
/// negated again and the two concatenated: `x` back, from pieces that are runs of the
/// input when `rows` is 1 and split along dim 1, or split along dim 0.
fn split_back(rows: usize, dim: i64) -> (Vec<f32>, Vec<String>) {
    let r = rows as i32;
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[r, 6], Memory::Planned);
    let a = b.tensor(Float, &[r, 6], Memory::Planned);
    let piece = |b: &mut ProgramBuilder, len: i32| {
        let sizes = if dim == 0 { [len, 6] } else { [r, len] };
        b.tensor(Float, &sizes, Memory::Planned)
    };
    let (lens, p) = if dim == 0 {
        let lens = [1, rows as i64 - 1];
        (lens, [piece(&mut b, 1), piece(&mut b, r - 1)])
    } else {
        ([2, 4], [piece(&mut b, 2), piece(&mut b, 4)])
    };
    let n = [piece(&mut b, lens[0] as i32), piece(&mut b, lens[1] as i32)];
    let out = b.tensor(Float, &[r, 6], Memory::Planned);
    let (list, sizes, d) = (b.tensor_list(&p), b.int_list(&lens), b.int(dim));
    let cat_list = b.tensor_list(&n);
    b.call("aten::neg", "out", &[x, a, a]);
    b.call(
        "aten::split_with_sizes_copy",
        "out",
        &[a, sizes, d, list, list],
    );
    for k in 0..2 {
        b.call("aten::neg", "out", &[p[k], n[k], n[k]]);
    }
    b.call("aten::cat", "out", &[cat_list, d, out, out]);
    b.input(x);
    b.output(out);
    let xs = input(rows * 6);
    let (got, ran) = run(&b.build(), &[rows, 6], &xs);
    assert_eq!(got, xs, "rows {rows}, dim {dim}");
    (got, ran)
}

#[test]
fn a_split_into_runs_of_its_input_is_elided() {
    for (rows, dim) in [(1, 1), (3, 0)] {
        let (_, ran) = split_back(rows, dim);
        assert!(!ran.iter().any(|n| n.contains("split")), "{ran:?}");
    }
}

#[test]
fn a_split_into_pieces_that_are_not_runs_runs() {
    let (_, ran) = split_back(2, 1);
    assert!(ran.iter().any(|n| n.contains("split")), "{ran:?}");
}

/// A delegate negating its input (argument 0) into its output (argument 1), naming the
/// output as the one argument it writes, or not.
struct Negate {
    names_output: bool,
}

struct NegateCall {
    written: Option<[usize; 1]>,
}

impl pte_runtime::Backend for Negate {
    fn init(
        &self,
        _: &pte_runtime::DelegateInit<'_>,
    ) -> pte_runtime::KernelResult<Box<dyn pte_runtime::PreparedKernel>> {
        Ok(Box::new(NegateCall {
            written: self.names_output.then_some([1]),
        }))
    }
}

impl pte_runtime::PreparedKernel for NegateCall {
    fn run(&mut self, args: &mut pte_runtime::Args<'_>) -> pte_runtime::KernelResult {
        let mut io = args.io(&[0.into()], &[1.into()])?;
        let x: Vec<f32> = bytemuck::pod_collect_to_vec(io.inputs[0].bytes());
        let y: &mut [f32] = bytemuck::cast_slice_mut(io.outputs[0].bytes_mut());
        for (y, x) in y.iter_mut().zip(x) {
            *y = -x;
        }
        Ok(())
    }

    fn written(&self) -> Option<&[usize]> {
        self.written.as_ref().map(|w| &w[..])
    }
}

#[test]
fn a_copy_between_delegates_that_name_their_outputs_is_elided() {
    // a = D(x); s = squeeze(a); t = exp(x), planned over a's bytes; out = D(s) + t.
    for names_output in [true, false] {
        let mut b = ProgramBuilder::new();
        let x = b.tensor(Float, &[1, 2, 3], Memory::At(0));
        let a_at = 32;
        let a = b.tensor(Float, &[1, 2, 3], Memory::At(a_at));
        let s = b.tensor(Float, &[2, 3], Memory::At(64));
        let t = b.tensor(Float, &[1, 2, 3], Memory::At(a_at));
        let d = b.tensor(Float, &[2, 3], Memory::At(96));
        let out = b.tensor(Float, &[1, 2, 3], Memory::At(128));
        let one = b.int(1);
        let dims = b.int_list(&[0]);
        b.delegate("Negate", vec![0; 8], &[x, a]);
        b.call("aten::squeeze_copy", "dims_out", &[a, dims, s, s]);
        b.call("aten::exp", "out", &[x, t, t]);
        b.delegate("Negate", vec![0; 8], &[s, d]);
        b.call("aten::add", "out", &[d, t, one, out, out]);
        b.input(x);
        b.output(out);
        let mut backends = pte_runtime::BackendRegistry::new();
        backends.register("Negate", Negate { names_output });
        let program = Program::from_bytes(&b.build()).unwrap();
        let m = program
            .load_method_with(
                "forward",
                &pte_kernels::registry(),
                &backends,
                &pte_runtime::LoadOptions::default(),
            )
            .unwrap();
        let xs = input(6);
        let (got, ran) = run_method(m, &[1, 2, 3], &xs);
        for (g, v) in got.iter().zip(&xs) {
            let w = v + v.exp();
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{got:?}");
        }
        assert_eq!(
            ran.iter().any(|n| n.contains("squeeze_copy")),
            !names_output,
            "{ran:?}"
        );
    }
}

#[test]
fn an_unbind_and_a_split_by_size_into_runs_are_elided() {
    // -x of [3, 2] unbound along dim 0 (three runs), or split in pieces of 2 rows (two
    // runs, the last of one row); each piece negated again and the pieces concatenated:
    // x back, flattened for the unbind.
    for unbind in [true, false] {
        let mut b = ProgramBuilder::new();
        let x = b.tensor(Float, &[3, 2], Memory::Planned);
        let a = b.tensor(Float, &[3, 2], Memory::Planned);
        let shapes: Vec<Vec<i32>> = if unbind {
            vec![vec![2]; 3]
        } else {
            vec![vec![2, 2], vec![1, 2]]
        };
        let pieces: Vec<i32> = shapes
            .iter()
            .map(|s| b.tensor(Float, s, Memory::Planned))
            .collect();
        let back: Vec<i32> = shapes
            .iter()
            .map(|s| b.tensor(Float, s, Memory::Planned))
            .collect();
        let out_shape: &[i32] = if unbind { &[6] } else { &[3, 2] };
        let out = b.tensor(Float, out_shape, Memory::Planned);
        let (list, back_list, zero, two) = (
            b.tensor_list(&pieces),
            b.tensor_list(&back),
            b.int(0),
            b.int(2),
        );
        b.call("aten::neg", "out", &[x, a, a]);
        if unbind {
            b.call("aten::unbind_copy", "int_out", &[a, zero, list, list]);
        } else {
            b.call(
                "aten::split_copy",
                "Tensor_out",
                &[a, two, zero, list, list],
            );
        }
        for (&p, &n) in pieces.iter().zip(&back) {
            b.call("aten::neg", "out", &[p, n, n]);
        }
        b.call("aten::cat", "out", &[back_list, zero, out, out]);
        b.input(x);
        b.output(out);
        let xs = input(6);
        let (got, ran) = run(&b.build(), &[3, 2], &xs);
        assert_eq!(got, xs, "unbind {unbind}");
        assert!(
            !ran.iter()
                .any(|n| n.contains("unbind") || n.contains("split")),
            "{ran:?}"
        );
    }
}
