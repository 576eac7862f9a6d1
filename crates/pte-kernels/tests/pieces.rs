//! `split_with_sizes_copy` writes its pieces and `cat` / `stack` read their parts a few
//! per view call: every piece holds exactly its run of the input and every part lands
//! at its place, for more of them than one call takes, along inner and outer dims,
//! empty ones and (for `cat`) other dtypes included. Slices, selections and views copy
//! the right elements, whether they are one run of the input (copied as bytes) or not.

use pte_format::schema::executorch_flatbuffer::ScalarType::{Float, Int};
use pte_runtime::{EValue, LoadOptions, Program, Tensor};
use pte_testkit::program::{Memory, ProgramBuilder};
use pte_testkit::values;

/// A program splitting its input of `xs` along `dim` into pieces of `sizes`.
fn split_program(xs: &[usize], dim: usize, sizes: &[usize]) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let to_i32 = |v: &[usize]| v.iter().map(|&d| d as i32).collect::<Vec<_>>();
    let x = b.tensor(Float, &to_i32(xs), Memory::Planned);
    let pieces: Vec<i32> = sizes
        .iter()
        .map(|&s| {
            let mut ps = xs.to_vec();
            ps[dim] = s;
            b.tensor(Float, &to_i32(&ps), Memory::Planned)
        })
        .collect();
    let extents: Vec<i64> = sizes.iter().map(|&s| s as i64).collect();
    let (extents, d) = (b.int_list(&extents), b.int(dim as i64));
    let (out, ret) = (b.tensor_list(&pieces), b.tensor_list(&pieces));
    b.call(
        "aten::split_with_sizes_copy",
        "out",
        &[x, extents, d, out, ret],
    );
    b.input(x);
    for &p in &pieces {
        b.output(p);
    }
    b.build()
}

#[test]
fn every_piece_holds_its_run_of_the_input() {
    let cases: [(&[usize], usize, &[usize]); 4] = [
        (&[2, 11, 3], 1, &[1, 2, 3, 1, 1, 2, 1]),
        (&[1, 1, 9], 2, &[1; 9]),
        (&[5, 4], 0, &[1, 0, 2, 1, 1]),
        (&[3, 8], 1, &[2, 2, 2, 2]),
    ];
    for (xs, dim, sizes) in cases {
        let bytes = split_program(xs, dim, sizes);
        let n: usize = xs.iter().product();
        let data = values(n, 5);
        let input = [EValue::Tensor(Tensor::from_slice(xs, &data).unwrap())];
        let got = outputs(&bytes, &input);
        let (outer, inner) = (
            xs[..dim].iter().product::<usize>(),
            xs[dim + 1..].iter().product::<usize>(),
        );
        let mut at = 0;
        for (k, (&s, got)) in sizes.iter().zip(&got).enumerate() {
            let want: Vec<f32> = (0..outer)
                .flat_map(|o| {
                    let start = (o * xs[dim] + at) * inner;
                    data[start..start + s * inner].to_vec()
                })
                .collect();
            assert_eq!(got, &want, "{xs:?} along {dim}, piece {k}");
            at += s;
        }
    }
}

/// The method's outputs after two executions on `inputs`, as f32.
fn outputs(bytes: &[u8], inputs: &[EValue]) -> Vec<Vec<f32>> {
    let program = Program::from_bytes(bytes).unwrap();
    let mut method = program
        .load_method_with(
            "forward",
            &pte_kernels::registry(),
            &Default::default(),
            &LoadOptions::default(),
        )
        .unwrap();
    for _ in 0..2 {
        method.set_inputs(inputs).unwrap();
        method.execute().unwrap();
    }
    method
        .outputs()
        .unwrap()
        .iter()
        .map(|v| v.as_tensor().unwrap().as_slice::<f32>().unwrap().to_vec())
        .collect()
}

#[test]
fn every_part_of_a_cat_or_stack_lands_at_its_place() {
    // Parts [2, e, 3] along dim 1 (one of them the 1-D empty tensor `cat` skips), the
    // fourth int32 (converted), more parts than one call reads; the float parts of
    // extent 1 stacked, and concatenated along dim 0.
    let extents = [1usize, 2, 0, 3, 1, 1, 2, 1, 1, 2];
    let dtype = |j: usize| if j == 3 { Int } else { Float };
    let mut b = ProgramBuilder::new();
    let parts: Vec<i32> = extents
        .iter()
        .enumerate()
        .map(|(j, &e)| {
            let sizes: Vec<i32> = if e == 0 {
                vec![0]
            } else {
                vec![2, e as i32, 3]
            };
            b.tensor(dtype(j), &sizes, Memory::Planned)
        })
        .collect();
    let total: usize = extents.iter().sum();
    let list = b.tensor_list(&parts);
    let dim = b.int(1);
    let out = b.tensor(Float, &[2, total as i32, 3], Memory::Planned);
    b.call("aten::cat", "out", &[list, dim, out, out]);
    // `stack` of the float parts of extent 1 along a new dim 0.
    let ones: Vec<i32> = (0..extents.len())
        .filter(|&j| extents[j] == 1 && dtype(j) == Float)
        .map(|j| parts[j])
        .collect();
    let stack_list = b.tensor_list(&ones);
    let zero = b.int(0);
    let stacked = b.tensor(Float, &[ones.len() as i32, 2, 1, 3], Memory::Planned);
    b.call("aten::stack", "out", &[stack_list, zero, stacked, stacked]);
    // `cat` of the same parts along dim 0: each one run of the output.
    let cat_list = b.tensor_list(&ones);
    let leading = b.tensor(Float, &[2 * ones.len() as i32, 1, 3], Memory::Planned);
    b.call("aten::cat", "out", &[cat_list, zero, leading, leading]);
    for &p in &parts {
        b.input(p);
    }
    b.output(out);
    b.output(stacked);
    b.output(leading);
    let bytes = b.build();
    let data: Vec<Vec<f32>> = extents
        .iter()
        .enumerate()
        .map(|(j, &e)| {
            let v = values(2 * e * 3, 10 + j as u64);
            if dtype(j) == Int {
                v.iter().map(|x| (x * 10.0).round()).collect()
            } else {
                v
            }
        })
        .collect();
    let inputs: Vec<EValue> = extents
        .iter()
        .enumerate()
        .map(|(j, &e)| {
            let sizes: Vec<usize> = if e == 0 { vec![0] } else { vec![2, e, 3] };
            EValue::Tensor(if dtype(j) == Int {
                let ints: Vec<i32> = data[j].iter().map(|&x| x as i32).collect();
                Tensor::from_slice(&sizes, &ints).unwrap()
            } else {
                Tensor::from_slice(&sizes, &data[j]).unwrap()
            })
        })
        .collect();
    let got = outputs(&bytes, &inputs);
    // cat: row r of the output holds each part's row r in turn.
    let want: Vec<f32> = (0..2)
        .flat_map(|r| {
            let data = &data;
            extents
                .iter()
                .enumerate()
                .flat_map(move |(j, &e)| data[j][r * e * 3..(r + 1) * e * 3].to_vec())
        })
        .collect();
    assert_eq!(got[0], want);
    let want: Vec<f32> = (0..extents.len())
        .filter(|&j| extents[j] == 1 && dtype(j) == Float)
        .flat_map(|j| data[j].clone())
        .collect();
    assert_eq!(got[1], want);
    assert_eq!(got[2], want);
}

/// A fuser that proposes nothing: every copy runs (none is elided into a view).
struct NoFusion;

impl pte_runtime::Fuser for NoFusion {
    fn fuse(&self, _: &pte_runtime::Graph<'_>) -> Vec<pte_runtime::Fusion> {
        Vec::new()
    }
}

/// `x[.., start : start + len · step : step, ..]` along `dim`, row-major.
fn slice_ref(
    xs: &[usize],
    data: &[f32],
    dim: usize,
    start: usize,
    len: usize,
    step: usize,
) -> Vec<f32> {
    let (outer, inner) = (
        xs[..dim].iter().product::<usize>(),
        xs[dim + 1..].iter().product::<usize>(),
    );
    (0..outer)
        .flat_map(|o| {
            (0..len).flat_map(move |j| {
                let at = (o * xs[dim] + start + j * step) * inner;
                data[at..at + inner].iter().copied()
            })
        })
        .collect()
}

#[test]
fn slices_selections_and_views_copy_the_right_elements() {
    // Runs of the input (a leading dim, or only ones before it) and strided windows,
    // each as the one call of its program.
    let slices: [(&[usize], usize, usize, usize, usize); 5] = [
        (&[4, 3, 5], 0, 1, 2, 1),
        (&[1, 6, 5], 1, 2, 3, 1),
        (&[4, 6, 5], 1, 2, 3, 1),
        (&[4, 3, 5], 0, 0, 2, 2),
        (&[1, 1, 7], 2, 3, 4, 1),
    ];
    let mut kernels = pte_kernels::registry();
    kernels.set_fuser(NoFusion);
    let run = |bytes: &[u8], xs: &[usize], data: &[f32]| {
        let program = Program::from_bytes(bytes).unwrap();
        let mut method = program
            .load_method_with(
                "forward",
                &kernels,
                &Default::default(),
                &LoadOptions::default(),
            )
            .unwrap();
        let input = [EValue::Tensor(Tensor::from_slice(xs, data).unwrap())];
        method.set_inputs(&input).unwrap();
        method.execute().unwrap();
        method.outputs().unwrap()[0]
            .as_tensor()
            .unwrap()
            .as_slice::<f32>()
            .unwrap()
            .to_vec()
    };
    let to_i32 = |v: &[usize]| v.iter().map(|&d| d as i32).collect::<Vec<_>>();
    for (xs, dim, start, len, step) in slices {
        let data = values(xs.iter().product(), 7);
        let mut ys = xs.to_vec();
        ys[dim] = len;
        let mut b = ProgramBuilder::new();
        let x = b.tensor(Float, &to_i32(xs), Memory::Planned);
        let y = b.tensor(Float, &to_i32(&ys), Memory::Planned);
        let (d, s, e, st) = (
            b.int(dim as i64),
            b.int(start as i64),
            b.int((start + (len - 1) * step + 1) as i64),
            b.int(step as i64),
        );
        b.call("aten::slice_copy", "Tensor_out", &[x, d, s, e, st, y, y]);
        b.input(x);
        b.output(y);
        let got = run(&b.build(), xs, &data);
        let want = slice_ref(xs, &data, dim, start, len, step);
        assert_eq!(
            got, want,
            "slice of {xs:?} along {dim} from {start}, {len} by {step}"
        );
    }
    // select along a leading dim and along an inner one; a view.
    for (xs, dim, index) in [(&[4usize, 3, 5][..], 0usize, 2usize), (&[4, 3, 5], 1, 1)] {
        let data = values(xs.iter().product(), 8);
        let ys: Vec<usize> = xs
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != dim)
            .map(|(_, &s)| s)
            .collect();
        let mut b = ProgramBuilder::new();
        let x = b.tensor(Float, &to_i32(xs), Memory::Planned);
        let y = b.tensor(Float, &to_i32(&ys), Memory::Planned);
        let (d, i) = (b.int(dim as i64), b.int(index as i64));
        b.call("aten::select_copy", "int_out", &[x, d, i, y, y]);
        b.input(x);
        b.output(y);
        let got = run(&b.build(), xs, &data);
        assert_eq!(
            got,
            slice_ref(xs, &data, dim, index, 1, 1),
            "select {index} of {xs:?} along {dim}"
        );
    }
    let data = values(60, 9);
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[4, 3, 5], Memory::Planned);
    let y = b.tensor(Float, &[12, 5], Memory::Planned);
    let sizes = b.int_list(&[12, 5]);
    b.call("aten::view_copy", "out", &[x, sizes, y, y]);
    b.input(x);
    b.output(y);
    assert_eq!(run(&b.build(), &[4, 3, 5], &data), data);
}
