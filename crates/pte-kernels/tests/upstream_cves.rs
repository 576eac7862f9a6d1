//! One regression test per class of upstream ExecuTorch's published loading
//! vulnerabilities (2025, see section 6 of the shared executorch facts): the same kind of
//! hostile program gets a clear error here, never memory unsafety, a panic or an abort.
//! Malformed-file classes of the format itself (segment and buffer bounds, header
//! arithmetic near 2^64, truncation) are covered by `pte-format/tests/malformed.rs`.

use pte_format::schema::executorch_flatbuffer::{self as et, ScalarType};
use pte_runtime::{LoadOptions, Program, RuntimeError};
use pte_testkit::program::{Memory, ProgramBuilder};

fn run(bytes: &[u8]) -> Result<(), RuntimeError> {
    let program = Program::from_bytes(bytes)?;
    let mut m = program.load_method_with(
        "forward",
        &pte_kernels::registry(),
        &Default::default(),
        &LoadOptions {
            memory_limit: 1 << 30,
            ..LoadOptions::default()
        },
    )?;
    let inputs = m.meta().example_inputs(1 << 30)?;
    m.set_inputs(&inputs)?;
    m.execute()
}

fn assert_error(bytes: &[u8], needle: &str) {
    match run(bytes) {
        Err(e) => assert!(
            e.to_string().contains(needle),
            "{e} does not mention {needle:?}"
        ),
        Ok(()) => panic!("expected an error mentioning {needle:?}"),
    }
}

/// A planned tensor at `offset` in a buffer of `buffer` bytes.
fn planned_at(offset: u64, buffer: i64) -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(ScalarType::Float, &[4], Memory::Planned);
    b.output(x);
    let bytes = b.build();
    let mut image = pte_format::ProgramImage::parse(&bytes).unwrap();
    let plan = &mut image.program.execution_plan.as_mut().unwrap()[0];
    plan.non_const_buffer_sizes = Some(vec![0, buffer]);
    if let Some(et::KernelTypes::Tensor(t)) = &mut plan.values.as_mut().unwrap()[x as usize].val {
        let a = t.allocation_info.as_mut().unwrap();
        a.memory_offset_low = offset as u32;
        a.memory_offset_high = (offset >> 32) as u32;
    }
    image.to_bytes(&Default::default()).unwrap()
}

/// CVE-2025-30404 and CVE-2025-30405: offset + size arithmetic of planned tensors that
/// overflows, placing a tensor outside (or wrapping around) its buffer.
#[test]
fn cve_2025_30404_30405_planned_offsets_that_overflow() {
    assert_error(
        &planned_at(u64::MAX - 7, 64),
        "lie past the end of planned buffer",
    );
    assert_error(
        &planned_at(1 << 40, 64),
        "lie past the end of planned buffer",
    );
    assert_error(&planned_at(56, 64), "lie past the end of planned buffer");
    run(&planned_at(48, 64)).unwrap();
}

/// CVE-2025-54949: `et_copy_index` writing past its destination.
#[test]
fn cve_2025_54949_copy_index_out_of_bounds() {
    for (index, from_sizes) in [
        (5, vec![3]),
        (1 << 40, vec![3]),
        (0, vec![4]),
        (-1, vec![3]),
    ] {
        let mut b = ProgramBuilder::new();
        let to = b.tensor_with(
            ScalarType::Float,
            &[2, 3],
            Memory::Planned,
            et::TensorShapeDynamism::DynamicBound,
        );
        let from = b.tensor(ScalarType::Float, &from_sizes, Memory::Planned);
        let i = b.int(index);
        b.call("executorch_prim::et_copy_index", "tensor", &[to, from, i]);
        b.input(from);
        b.output(to);
        assert!(
            run(&b.build()).is_err(),
            "index {index}, from {from_sizes:?}"
        );
    }
}

/// CVE-2025-54950: prim ops called with too few arguments or arguments of the wrong kind.
#[test]
fn cve_2025_54950_prim_ops_with_wrong_arguments() {
    let mut b = ProgramBuilder::new();
    let x = b.int(1);
    b.call("executorch_prim::add", "Scalar", &[x]);
    assert_error(&b.build(), "missing");

    let mut b = ProgramBuilder::new();
    let t = b.tensor(ScalarType::Float, &[2], Memory::Planned);
    let n = b.none();
    b.call("executorch_prim::add", "Scalar", &[t, n, t]);
    assert_error(&b.build(), "executorch_prim::add.Scalar");

    let mut b = ProgramBuilder::new();
    let t = b.tensor(ScalarType::Float, &[2], Memory::Planned);
    let x = b.int(3);
    b.call("executorch_prim::et_view", "default", &[t, x, t]);
    assert_error(&b.build(), "IntList");
}

/// CVE-2025-54951: tensors of rank above 16.
#[test]
fn cve_2025_54951_rank_above_16() {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(ScalarType::Float, &[1; 17], Memory::Unplanned);
    b.output(x);
    assert_error(&b.build(), "rank 17");
}

/// CVE-2025-54952: element count times element size that overflows (an undersized
/// allocation upstream), for lists and tensors alike.
#[test]
fn cve_2025_54952_sizes_that_overflow() {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(
        ScalarType::Long,
        &[i32::MAX, i32::MAX, i32::MAX],
        Memory::Unplanned,
    );
    b.output(x);
    assert_error(&b.build(), "overflows");

    // A list naming values that do not exist.
    let mut b = ProgramBuilder::new();
    let list = b.tensor_list(&[]);
    let bytes = b.build();
    let mut image = pte_format::ProgramImage::parse(&bytes).unwrap();
    let plan = &mut image.program.execution_plan.as_mut().unwrap()[0];
    if let Some(et::KernelTypes::TensorList(l)) =
        &mut plan.values.as_mut().unwrap()[list as usize].val
    {
        l.items = Some(vec![i32::MAX, -5]);
    }
    assert_error(&image.to_bytes(&Default::default()).unwrap(), "value 0");
}

/// Upstream #18176: `FreeCall` of a value index out of range, or of a value that is not a
/// tensor.
#[test]
fn free_call_index_validation() {
    let mut b = ProgramBuilder::new();
    b.free(12345);
    assert_error(&b.build(), "out of range");

    let mut b = ProgramBuilder::new();
    let x = b.int(1);
    b.free(x);
    assert_error(&b.build(), "cannot free a Int");
}
