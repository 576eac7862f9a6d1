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
    let mut m = load(bytes);
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
