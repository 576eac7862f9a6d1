//! A delegate call allocates nothing in the steady state, also when it has more
//! arguments than a kernel call usually has (lraspp's lowered program passes 17, a
//! lowered LSTM's concatenation of its 32 steps 33).

mod common;

use common::{load, tensor};
use pte_format::schema::executorch_flatbuffer::ScalarType::Float;
use pte_runtime::{EValue, Program, Tensor};
use pte_testkit::program::{Memory, ProgramBuilder};
use pte_testkit::values;
use pte_xnnpack::schema::fb_xnnpack as x;

#[global_allocator]
static COUNTING: pte_alloc::CountingAllocator = pte_alloc::CountingAllocator;

/// A program of one delegate that sums `inputs` vectors of `len` values with a chain
/// of Add nodes and returns the sum and the last input doubled.
fn sum_program(inputs: usize, len: usize) -> Vec<u8> {
    let external = |k: usize, flag: u32| Some((k as u32, flag));
    let mut xvalues: Vec<x::XValue> = (0..inputs)
        .map(|k| tensor(k as u32, &[len], 0, external(k, 1)))
        .collect();
    let mut xnodes = Vec::new();
    let mut add = |a: usize, b: usize, out: usize| {
        xnodes.push(x::XNode {
            xnode_union: Some(x::XNodeUnion::XnnAdd(Box::new(x::XnnNode2x1 {
                input1_id: a as u32,
                input2_id: b as u32,
                output_id: out as u32,
                flags: 0,
            }))),
            debug_handle: 0,
            output_min_max: None,
        });
    };
    // Partial sums take ids from `inputs` on; the last is the first output.
    let mut acc = 0;
    for k in 1..inputs {
        let out = inputs + k - 1;
        add(acc, k, out);
        acc = out;
    }
    let doubled = inputs * 2 - 1;
    add(inputs - 1, inputs - 1, doubled);
    for id in inputs..2 * inputs - 2 {
        xvalues.push(tensor(id as u32, &[len], 0, None));
    }
    xvalues.push(tensor(acc as u32, &[len], 0, external(inputs, 2)));
    xvalues.push(tensor(doubled as u32, &[len], 0, external(inputs + 1, 2)));
    let graph = x::XnnGraph {
        version: Some(String::new()),
        xnodes: Some(xnodes),
        xvalues: Some(xvalues),
        num_externs: inputs as u32 + 2,
        input_ids: Some((0..inputs as u32).collect()),
        output_ids: Some(vec![acc as u32, doubled as u32]),
        constant_buffer: None,
        mem_buffer_sizes: None,
        constant_data: Some(vec![x::ConstantDataOffset::default()]),
    };
    let payload = pte_xnnpack::payload::write(&graph, &[]).unwrap();
    let mut b = ProgramBuilder::new();
    let ins: Vec<_> = (0..inputs)
        .map(|_| b.tensor(Float, &[len as i32], Memory::Planned))
        .collect();
    let outs = [0; 2].map(|_| b.tensor(Float, &[len as i32], Memory::Planned));
    let args: Vec<_> = ins.iter().chain(&outs).copied().collect();
    b.delegate("XnnpackBackend", payload, &args);
    for &i in &ins {
        b.input(i);
    }
    for &o in &outs {
        b.output(o);
    }
    b.build()
}

#[test]
fn a_delegate_call_of_many_arguments_allocates_nothing_after_the_first() {
    let (len, runs) = (37, 3);
    // Each size of inline views, below and at its bound, and the next size.
    for inputs in [2, 9, 17, 22, 24, 25, 33, 100, 256] {
        let bytes = sum_program(inputs, len);
        let program = Program::from_bytes(&bytes).unwrap();
        let data: Vec<Vec<f32>> = (0..inputs).map(|k| values(len, k as u64)).collect();
        let tensors: Vec<EValue> = data
            .iter()
            .map(|d| EValue::Tensor(Tensor::from_slice(&[len], d).unwrap()))
            .collect();
        for threads in [1, 2] {
            let mut method = load(&program, threads);
            method.set_inputs(&tensors).unwrap();
            method.execute().unwrap();
            let before = pte_alloc::allocations();
            for _ in 0..runs {
                method.set_inputs(&tensors).unwrap();
                method.execute().unwrap();
            }
            let made = pte_alloc::allocations() - before;
            assert_eq!(
                made, 0,
                "{inputs} inputs, {threads} threads: {made} allocations in {runs} executions"
            );
            let outputs = method.outputs().unwrap();
            let sum = outputs[0].as_tensor().unwrap().as_slice::<f32>().unwrap();
            let doubled = outputs[1].as_tensor().unwrap().as_slice::<f32>().unwrap();
            for i in 0..len {
                // The chain adds in input order, as f32, like the nodes do.
                let want = data.iter().skip(1).fold(data[0][i], |s, d| s + d[i]);
                assert_eq!(sum[i], want, "{inputs} inputs: sum {i}");
                assert_eq!(
                    doubled[i],
                    2.0 * data[inputs - 1][i],
                    "{inputs} inputs: doubled {i}"
                );
            }
        }
    }
}
