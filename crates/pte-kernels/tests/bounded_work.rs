//! Work per kernel call is bounded by the sizes of the tensors it reads and writes, never
//! by an argument alone: hostile strides, dilations, shifts, exponents, repeats and
//! paddings give small outputs computed at once (the same as with the smallest argument
//! that has the same effect), or errors when the output they ask for is past the memory
//! budget. (A kernel that looped over an argument would make these tests run for hours.)

use pte_format::schema::executorch_flatbuffer::ScalarType::{self, Float, Long};
use pte_runtime::{BackendRegistry, EValue, LoadOptions, Method, Program, RuntimeError};
use pte_testkit::program::{Memory, ProgramBuilder};

const HUGE: i64 = 1 << 40;

fn load(bytes: &[u8]) -> Result<Method, RuntimeError> {
    let options = LoadOptions {
        memory_limit: 1 << 30,
        ..LoadOptions::default()
    };
    Program::from_bytes(bytes)?.load_method_with(
        "forward",
        &pte_kernels::registry(),
        &BackendRegistry::new(),
        &options,
    )
}

/// Runs a program on deterministic example inputs.
fn run(bytes: &[u8]) -> Result<Vec<Vec<u8>>, RuntimeError> {
    let mut m = load(bytes)?;
    let inputs = m.meta().example_inputs(1 << 30)?;
    m.set_inputs(&inputs)?;
    m.execute()?;
    Ok(m.outputs()?
        .iter()
        .map(|v| match v {
            EValue::Tensor(t) => t.as_bytes().to_vec(),
            other => panic!("unexpected output {other:?}"),
        })
        .collect())
}

fn assert_budget_error(result: Result<Vec<Vec<u8>>, RuntimeError>, op: &str) {
    let err = result.expect_err("an output past the budget").to_string();
    for needle in [op, "memory budget"] {
        assert!(err.contains(needle), "{err:?} does not mention {needle:?}");
    }
}

/// A depthwise convolution of a 2x5x5 input with stride `stride` and dilation
/// `dilation`, giving a [1, 2, 1, 1] output.
fn depthwise(stride: i64, dilation: i64, dtype: ScalarType) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(dtype, &[1, 2, 5, 5], Memory::Planned);
    let w: Vec<u8> = match dtype {
        Float => (0..18)
            .flat_map(|i| (i as f32 / 7.0 - 1.0).to_le_bytes())
            .collect(),
        _ => (0..18)
            .flat_map(|i| (f64::from(i) / 7.0 - 1.0).to_le_bytes())
            .collect(),
    };
    let w = b.constant(dtype, &[2, 1, 3, 3], &w);
    let bias = b.none();
    let strides = b.int_list(&[stride, stride]);
    let pads = b.int_list(&[0, 0]);
    let dilations = b.int_list(&[dilation, dilation]);
    let no = b.bool(false);
    let out_pads = b.int_list(&[0, 0]);
    let groups = b.int(2);
    let out = b.tensor(dtype, &[1, 2, 1, 1], Memory::Unplanned);
    let args = [
        x, w, bias, strides, pads, dilations, no, out_pads, groups, out, out,
    ];
    b.call("aten::convolution", "out", &args);
    b.input(x);
    b.output(out);
    b.build()
}

#[test]
fn a_convolution_with_a_huge_stride_reads_one_window() {
    for dtype in [Float, ScalarType::Double] {
        let huge = run(&depthwise(HUGE, 1, dtype)).unwrap();
        assert_eq!(huge, run(&depthwise(3, 1, dtype)).unwrap(), "{dtype:?}");
    }
}

#[test]
fn a_convolution_with_a_huge_dilation_is_an_error() {
    let err = run(&depthwise(1, HUGE, Float)).unwrap_err().to_string();
    assert!(err.contains("larger than the padded input"), "{err}");
}

/// max_pool2d_with_indices of a 1x1x6x6 input, kernel 2, giving [1, 1, 1, 1].
fn max_pool(stride: i64, dilation: i64) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[1, 1, 6, 6], Memory::Planned);
    let kernel = b.int_list(&[2, 2]);
    let strides = b.int_list(&[stride, stride]);
    let pads = b.int_list(&[0, 0]);
    let dilations = b.int_list(&[dilation, dilation]);
    let ceil = b.bool(false);
    let out = b.tensor(Float, &[1, 1, 1, 1], Memory::Unplanned);
    let idx = b.tensor(Long, &[1, 1, 1, 1], Memory::Unplanned);
    let list = b.tensor_list(&[out, idx]);
    let args = [x, kernel, strides, pads, dilations, ceil, out, idx, list];
    b.call("aten::max_pool2d_with_indices", "out", &args);
    b.input(x);
    b.output(out);
    b.output(idx);
    b.build()
}

#[test]
fn pooling_with_a_huge_stride_reads_one_window_and_a_huge_dilation_is_an_error() {
    assert_eq!(
        run(&max_pool(HUGE, 1)).unwrap(),
        run(&max_pool(6, 1)).unwrap()
    );
    let err = run(&max_pool(1, HUGE)).unwrap_err().to_string();
    assert!(err.contains("leaves no output"), "{err}");
}

/// roll of an 8-element int64 tensor by `shift`.
fn roll(shift: i64) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Long, &[8], Memory::Planned);
    let shifts = b.int_list(&[shift]);
    let dims = b.int_list(&[0]);
    let out = b.tensor(Long, &[8], Memory::Unplanned);
    b.call("aten::roll", "out", &[x, shifts, dims, out, out]);
    b.input(x);
    b.output(out);
    b.build()
}

#[test]
fn a_huge_roll_is_one_rotation() {
    let shift = i64::MAX - 3;
    assert_eq!(run(&roll(shift)).unwrap(), run(&roll(shift % 8)).unwrap());
}

/// slice_copy of dim 0 of an [8, 4] int64 tensor from `start` with step `step`, into `len`
/// rows.
fn slice(start: i64, step: i64, len: i32) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Long, &[8, 4], Memory::Planned);
    let dim = b.int(0);
    let start = b.int(start);
    let end = b.none();
    let step = b.int(step);
    let out = b.tensor(Long, &[len, 4], Memory::Unplanned);
    b.call(
        "aten::slice_copy",
        "Tensor_out",
        &[x, dim, start, end, step, out, out],
    );
    b.input(x);
    b.output(out);
    b.build()
}

/// Found by the `mutate` fuzz target: a step near 2^63 overflowed the window's stride
/// although a slice that long takes one entry.
#[test]
fn a_huge_slice_step_takes_one_entry() {
    for step in [i64::MAX, 1 << 62, 9] {
        assert_eq!(
            run(&slice(2, step, 1)).unwrap(),
            run(&slice(2, 8, 1)).unwrap()
        );
    }
}

/// pow(x, e) on int64, then pow(that, f) when `f` is given.
fn pow(e: i64, f: Option<i64>) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Long, &[4], Memory::Planned);
    let e = b.int(e);
    let mut out = b.tensor(Long, &[4], Memory::Unplanned);
    b.call("aten::pow", "Tensor_Scalar_out", &[x, e, out, out]);
    if let Some(f) = f {
        let f = b.int(f);
        let second = b.tensor(Long, &[4], Memory::Unplanned);
        b.call("aten::pow", "Tensor_Scalar_out", &[out, f, second, second]);
        out = second;
    }
    b.input(x);
    b.output(out);
    b.build()
}

#[test]
fn an_integer_power_takes_one_step_per_bit_of_the_exponent() {
    // (x^(2^31))^(2^31) = x^(2^62) in wrapping arithmetic too.
    let once = run(&pow(1 << 62, None)).unwrap();
    assert_eq!(once, run(&pow(1 << 31, Some(1 << 31))).unwrap());
    assert!(run(&pow(i64::MAX, None)).is_ok());
}

#[test]
fn repeating_past_the_budget_is_an_error() {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[1], Memory::Planned);
    let reps = b.int_list(&[1 << 20, 1 << 20]);
    let out = b.tensor(Float, &[1 << 20, 1 << 20], Memory::Unplanned);
    b.call("aten::repeat", "out", &[x, reps, out, out]);
    b.input(x);
    b.output(out);
    assert_budget_error(run(&b.build()), "aten::repeat.out");
}

#[test]
fn padding_past_the_budget_is_an_error() {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[1, 1], Memory::Planned);
    let pad = b.int_list(&[(1 << 20) - 1, 0, (1 << 20) - 1, 0]);
    let value = b.double(0.0);
    let out = b.tensor(Float, &[1 << 20, 1 << 20], Memory::Unplanned);
    b.call("aten::constant_pad_nd", "out", &[x, pad, value, out, out]);
    b.input(x);
    b.output(out);
    assert_budget_error(run(&b.build()), "aten::constant_pad_nd.out");
}

#[test]
fn a_range_past_the_budget_is_an_error() {
    let mut b = ProgramBuilder::new();
    let end = b.int(1 << 30);
    let out = b.tensor(Float, &[1 << 30], Memory::Unplanned);
    b.call("aten::arange", "out", &[end, out, out]);
    b.output(out);
    assert_budget_error(run(&b.build()), "aten::arange.out");
}
