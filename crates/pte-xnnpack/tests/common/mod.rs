//! Pieces the tests share: XNNPACK graph values written by hand, and methods loaded
//! with the XNNPACK backend registered.

use pte_format::schema::executorch_flatbuffer::ScalarType::Float;
use pte_runtime::{BackendRegistry, EValue, LoadOptions, Method, Program, Tensor};
use pte_testkit::program::{Memory, ProgramBuilder};
use pte_xnnpack::schema::fb_xnnpack as x;

/// Value `id`: fp32 of `dims`, constant entry `constant` (0: none), and an external id
/// with its input (1) or output (2) flag.
pub fn tensor(id: u32, dims: &[usize], constant: u32, external: Option<(u32, u32)>) -> x::XValue {
    let (external_id, flags) = external.unwrap_or((u32::MAX, 0));
    x::XValue {
        xvalue_union: Some(x::XValueUnion::XnnTensorValue(Box::new(
            x::XnnTensorValue {
                datatype: x::XnnDatatype::XnnDatatypeFp32,
                num_dims: dims.len() as u32,
                dims: Some(dims.iter().map(|&d| d as u32).collect()),
                constant_buffer_idx: constant,
                external_id,
                flags,
                id_out: id,
                dq_datatype: x::XnnDatatype::XnnDatatypeInvalid,
            },
        ))),
    }
}

/// Method "forward" of `program`, its delegates run by pte's XNNPACK backend on
/// `threads` threads.
pub fn load(program: &Program, threads: usize) -> Method {
    let mut backends = BackendRegistry::new();
    pte_xnnpack::register(&mut backends);
    let options = LoadOptions {
        threads: Some(threads),
        ..LoadOptions::default()
    };
    program
        .load_method_with("forward", &pte_kernels::registry(), &backends, &options)
        .unwrap()
}

/// A program of one delegate running `nodes` on `values`: external 0 the input of
/// `input` dims, external 1 (value `output_id`) the output of `output` dims; constant
/// entry 1 the `filter`, entry 2 the `bias`.
#[allow(dead_code)] // not every test file builds a product
pub fn product_program(
    nodes: Vec<x::XNode>,
    values: Vec<x::XValue>,
    output_id: u32,
    (filter, bias): (&[f32], &[f32]),
    input: &[usize],
    output: &[usize],
) -> Vec<u8> {
    let mut constants: Vec<u8> = bytemuck::cast_slice(filter).to_vec();
    let bias_at = constants.len() as u64;
    constants.extend_from_slice(bytemuck::cast_slice(bias));
    let graph = x::XnnGraph {
        version: Some(String::new()),
        xnodes: Some(nodes),
        xvalues: Some(values),
        num_externs: 2,
        input_ids: Some(vec![0]),
        output_ids: Some(vec![output_id]),
        constant_buffer: None,
        mem_buffer_sizes: None,
        constant_data: Some(vec![
            x::ConstantDataOffset::default(),
            x::ConstantDataOffset {
                offset: 0,
                size: bias_at,
                named_key: None,
            },
            x::ConstantDataOffset {
                offset: bias_at,
                size: std::mem::size_of_val(bias) as u64,
                named_key: None,
            },
        ]),
    };
    let payload = pte_xnnpack::payload::write(&graph, &constants).unwrap();
    let dims = |d: &[usize]| d.iter().map(|&v| v as i32).collect::<Vec<_>>();
    let mut b = ProgramBuilder::new();
    let xv = b.tensor(Float, &dims(input), Memory::Planned);
    let yv = b.tensor(Float, &dims(output), Memory::Planned);
    b.delegate("XnnpackBackend", payload, &[xv, yv]);
    b.input(xv);
    b.output(yv);
    b.build()
}

/// The first output of two executions of `bytes` on the f32 `input` of `dims`, and the
/// bytes the method holds.
#[allow(dead_code)] // not every test file builds a product
pub fn run_product(bytes: &[u8], dims: &[usize], input: &[f32], threads: usize) -> (Vec<f32>, u64) {
    run_program(&Program::from_bytes(bytes).unwrap(), dims, input, threads)
}

/// [`run_product`] on a program already opened.
#[allow(dead_code)] // not every test file builds a product
pub fn run_program(
    program: &Program,
    dims: &[usize],
    input: &[f32],
    threads: usize,
) -> (Vec<f32>, u64) {
    let mut method = load(program, threads);
    let inputs = [EValue::Tensor(Tensor::from_slice(dims, input).unwrap())];
    for _ in 0..2 {
        method.set_inputs(&inputs).unwrap();
        method.execute().unwrap();
    }
    let out = method.outputs().unwrap()[0]
        .as_tensor()
        .unwrap()
        .as_slice::<f32>()
        .unwrap()
        .to_vec();
    (out, method.memory_used().0)
}

/// A program of one delegate: `y = x · wᵀ + bias` for `x` of `m × k` and `w` given
/// `[n, k]`, stored as given or (`transpose`) as `[k, n]` with XNNPACK's transposed
/// flag.
#[allow(dead_code)] // not every test file builds a product
pub fn fc_program(
    m: usize,
    (n, k): (usize, usize),
    w: &[f32],
    bias: &[f32],
    transpose: bool,
) -> Vec<u8> {
    let stored: Vec<f32> = if transpose {
        (0..k * n).map(|i| w[(i % n) * k + i / n]).collect()
    } else {
        w.to_vec()
    };
    let filter_dims = if transpose { [k, n] } else { [n, k] };
    let node = x::XNode {
        xnode_union: Some(x::XNodeUnion::XnnFullyConnected(Box::new(
            x::XnnFullyConnected {
                input1_id: 0,
                filter_id: 1,
                bias_id: 2,
                output_id: 3,
                flags: u32::from(transpose),
            },
        ))),
        debug_handle: 0,
        output_min_max: None,
    };
    let values = vec![
        tensor(0, &[m, k], 0, Some((0, 1))),
        tensor(1, &filter_dims, 1, None),
        tensor(2, &[n], 2, None),
        tensor(3, &[m, n], 0, Some((1, 2))),
    ];
    product_program(vec![node], values, 3, (&stored, bias), &[m, k], &[m, n])
}
