//! `split_with_sizes_copy` writes its pieces a few per view call: every piece holds
//! exactly its run of the input, for more pieces than one call takes, along inner and
//! outer dims, empty pieces included.

use pte_format::schema::executorch_flatbuffer::ScalarType::Float;
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
        let program = Program::from_bytes(&bytes).unwrap();
        let mut method = program
            .load_method_with(
                "forward",
                &pte_kernels::registry(),
                &Default::default(),
                &LoadOptions::default(),
            )
            .unwrap();
        let n: usize = xs.iter().product();
        let data = values(n, 5);
        let input = [EValue::Tensor(Tensor::from_slice(xs, &data).unwrap())];
        for _ in 0..2 {
            method.set_inputs(&input).unwrap();
            method.execute().unwrap();
        }
        let (outer, inner) = (
            xs[..dim].iter().product::<usize>(),
            xs[dim + 1..].iter().product::<usize>(),
        );
        let outputs = method.outputs().unwrap();
        let mut at = 0;
        for (k, (&s, out)) in sizes.iter().zip(&outputs).enumerate() {
            let got = out.as_tensor().unwrap().as_slice::<f32>().unwrap();
            let want: Vec<f32> = (0..outer)
                .flat_map(|o| {
                    let start = (o * xs[dim] + at) * inner;
                    data[start..start + s * inner].to_vec()
                })
                .collect();
            assert_eq!(got, want.as_slice(), "{xs:?} along {dim}, piece {k}");
            at += s;
        }
    }
}
