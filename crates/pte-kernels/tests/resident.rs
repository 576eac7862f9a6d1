//! Weights packed at load leave the resident set of a mapped program: once a layer
//! holds its packed copy, the pages of the file's copy are given back, and what the
//! method computes is unchanged (the same bits as from a program read into memory).
#![cfg(target_os = "linux")]

use pte_format::schema::executorch_flatbuffer::ScalarType::Float;
use pte_format::FileBytes;
use pte_runtime::{EValue, KernelRegistry, LoadOptions, Program, Tensor};
use pte_testkit::program::{Memory, ProgramBuilder};
use pte_testkit::{resident_bytes_of, values, TempFile};

fn dims(s: &[usize]) -> Vec<i32> {
    s.iter().map(|&d| d as i32).collect()
}

/// A program of two 3×3 convolutions (an NHWC region; 4.1 MB of weights) and a linear
/// layer (2.4 MB), and the bytes of its weights.
fn network() -> (Vec<u8>, usize) {
    let mut b = ProgramBuilder::new();
    let xs = [1, 128, 6, 6];
    let x = b.tensor(Float, &dims(&xs), Memory::Planned);
    b.input(x);
    let mut weights = 0;
    let mut h = x;
    for (i, (cin, cout)) in [(128, 256), (256, 256)].into_iter().enumerate() {
        let w = values(cout * cin * 9, 20 + i as u64);
        weights += w.len() * 4;
        let w = b.constant(
            Float,
            &[cout as i32, cin as i32, 3, 3],
            bytemuck::cast_slice(&w),
        );
        let bias = values(cout, 30 + i as u64);
        let bias = b.constant(Float, &[cout as i32], bytemuck::cast_slice(&bias));
        let (stride, pad, dil) = (
            b.int_list(&[1, 1]),
            b.int_list(&[1, 1]),
            b.int_list(&[1, 1]),
        );
        let (transposed, out_pad, groups) = (b.bool(false), b.int_list(&[0, 0]), b.int(1));
        let y = b.tensor(Float, &[1, cout as i32, 6, 6], Memory::Planned);
        b.call(
            "aten::convolution",
            "out",
            &[
                h, w, bias, stride, pad, dil, transposed, out_pad, groups, y, y,
            ],
        );
        let r = b.tensor(Float, &[1, cout as i32, 6, 6], Memory::Planned);
        b.call("aten::relu", "out", &[y, r]);
        h = r;
    }
    b.output(h);
    let (k, n) = (600, 1000);
    let v = b.tensor(Float, &[3, k as i32], Memory::Planned);
    b.input(v);
    let w = values(n * k, 40);
    weights += w.len() * 4;
    let w = b.constant(Float, &[n as i32, k as i32], bytemuck::cast_slice(&w));
    let bias = b.constant(Float, &[n as i32], bytemuck::cast_slice(&values(n, 41)));
    let y = b.tensor(Float, &[3, n as i32], Memory::Planned);
    b.call("aten::linear", "out", &[v, w, bias, y, y]);
    b.output(y);
    (b.build(), weights)
}

/// The outputs of one execution of `program`'s method, as bits.
fn outputs(program: &Program, kernels: &KernelRegistry) -> Vec<Vec<u32>> {
    let options = LoadOptions {
        threads: Some(1),
        ..LoadOptions::default()
    };
    let mut m = program
        .load_method_with("forward", kernels, &Default::default(), &options)
        .unwrap();
    let inputs = [
        EValue::Tensor(Tensor::from_slice(&[1, 128, 6, 6], &values(128 * 36, 1)).unwrap()),
        EValue::Tensor(Tensor::from_slice(&[3, 600], &values(3 * 600, 2)).unwrap()),
    ];
    m.set_inputs(&inputs).unwrap();
    m.execute().unwrap();
    m.outputs()
        .unwrap()
        .iter()
        .map(|v| {
            let t = v.as_tensor().unwrap();
            t.as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn packed_weights_leave_a_mapped_file_resident_no_more() {
    let (bytes, weights) = network();
    let file = TempFile::new("pte-resident.pte", &bytes).unwrap();
    let path = file.path();
    let mut kernels = pte_kernels::reference_registry();
    pte_kernels::install_fast_paths(&mut kernels);

    // SAFETY: the file is this test's own; nothing writes it while it is mapped.
    let mapped = Program::from_file(unsafe { FileBytes::map(path) }.unwrap()).unwrap();
    let read = Program::from_bytes(&bytes).unwrap();
    let want = outputs(&read, &kernels);
    let got = outputs(&mapped, &kernels);
    let left = resident_bytes_of(path);
    assert!(
        left < weights / 8,
        "{left} bytes of the mapped file resident after packing {weights} bytes of weights"
    );
    assert_eq!(got, want, "outputs of the mapped program");
    // A second method of the same mapped program packs its weights again, from pages
    // mapped anew.
    assert_eq!(outputs(&mapped, &kernels), want, "outputs of a second load");
}
