//! Structure-aware fuzzing of loading and execution: start from a real program exported
//! by upstream, change it at the schema level (tensor sizes, dim orders, dtypes, memory
//! placement, value and operator indices, int arguments, int and tensor lists, jumps,
//! moves, frees, planned sizes, unplanned tensors), write it with `pte-format`'s writer,
//! then load and execute it with every kernel. The fuzzer's input only chooses the
//! mutations, so nearly every run reaches the runtime and the kernels instead of stopping
//! in the format's verification. Nothing may panic, and run under
//! `-rss_limit_mb`/`-malloc_limit_mb` no allocation may escape the memory budget.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use pte_format::schema::executorch_flatbuffer as et;
use pte_format::{ProgramImage, WriteOptions};
use pte_runtime::{BackendRegistry, LoadOptions, Program};

/// Budget of one run: small enough that a run can never reach the fuzzer's malloc limit
/// through memory the budget allowed.
const MEMORY_LIMIT: u64 = 256 << 20;
const MAX_INSTRUCTIONS: u64 = 20_000;
const MAX_LOOP_ITERATIONS: u64 = 64;

static KERNELS: std::sync::OnceLock<pte_runtime::KernelRegistry> = std::sync::OnceLock::new();

macro_rules! seeds {
    ($($name:literal),* $(,)?) => {
        [$(include_bytes!(concat!("../../tests/fixtures/", $name, "/model.pte")).as_slice()),*]
    };
}

/// Programs upstream exported, covering every operator the fixtures use, control flow,
/// dynamic shapes and mutable state.
const SEEDS: &[&[u8]] = &seeds![
    "linear_clamp", "convnet", "dynamic_batch", "scalar_io", "mutable_buffer",
    "mutable_buffer_init", "cond", "multi_output", "transformer_block", "op_add",
    "op_sub_rsub", "op_mul", "op_div", "op_int_arith", "op_remainder", "op_matmul",
    "op_conv1d", "op_conv2d", "op_max_pool2d", "op_avg_pool2d", "op_adaptive_avg_pool2d",
    "op_reduce", "op_relu_clamp", "op_activation", "op_unary_math", "op_softmax", "op_norm",
    "op_shape", "op_cat_stack", "op_slice_select", "op_split", "op_squeeze_unsqueeze",
    "op_clone_convert", "op_creation", "op_where", "op_compare", "op_logical_any",
    "op_cumsum", "op_topk", "op_max_argmax", "op_embedding", "op_index",
    "op_index_put_copy", "op_pad", "op_upsample_nearest", "op_half", "op_empty",
];

/// Sizes and ints that break things: zero, one, negatives, powers of two around the
/// widths that arithmetic overflows at.
fn edgy_int(u: &mut Unstructured<'_>) -> Result<i64> {
    Ok(match u.int_in_range(0..=9)? {
        0 => 0,
        1 => 1,
        2 => -1,
        3 => i64::from(u.int_in_range(0..=64u8)?),
        4 => 1 << u.int_in_range(0..=62u32)?,
        5 => -(1 << u.int_in_range(0..=62u32)?),
        6 => i64::MAX - i64::from(u.int_in_range(0..=3u8)?),
        7 => i64::MIN + i64::from(u.int_in_range(0..=3u8)?),
        8 => i64::from(i32::MAX),
        _ => u.arbitrary()?,
    })
}

fn edgy_i32(u: &mut Unstructured<'_>) -> Result<i32> {
    Ok(match u.int_in_range(0..=6)? {
        0 => 0,
        1 => 1,
        2 => -1,
        3 => i32::from(u.int_in_range(0..=32u8)?),
        4 => 1 << u.int_in_range(0..=30u32)?,
        5 => i32::MAX,
        _ => u.arbitrary()?,
    })
}

fn index(u: &mut Unstructured<'_>, len: usize) -> Result<i32> {
    // Mostly valid indices, sometimes just past the end or wild.
    Ok(match u.int_in_range(0..=9)? {
        0 => len as i32,
        1 => edgy_i32(u)?,
        _ => u.int_in_range(0..=len.saturating_sub(1))? as i32,
    })
}

fn scalar_type(u: &mut Unstructured<'_>) -> Result<et::ScalarType> {
    loop {
        if let Ok(t) = et::ScalarType::try_from(u.int_in_range(0..=29i8)?) {
            return Ok(t);
        }
    }
}

fn mutate_tensor(u: &mut Unstructured<'_>, t: &mut et::Tensor, n_values: usize) -> Result<()> {
    match u.int_in_range(0..=9)? {
        0 => {
            let sizes = t.sizes.get_or_insert_with(Vec::new);
            if let Some(s) = u.choose_iter(sizes.iter_mut()).ok() {
                *s = edgy_i32(u)?;
            }
        }
        1 => {
            let rank = u.int_in_range(0..=5usize)?;
            t.sizes = Some((0..rank).map(|_| edgy_i32(u)).collect::<Result<_>>()?);
            t.dim_order = Some((0..rank as u8).collect());
        }
        2 => {
            let order = t.dim_order.get_or_insert_with(Vec::new);
            if order.len() > 1 {
                let i = u.choose_index(order.len())?;
                let j = u.choose_index(order.len())?;
                order.swap(i, j);
            }
            if u.ratio(1, 8)? {
                if let Some(d) = u.choose_iter(order.iter_mut()).ok() {
                    *d = u.arbitrary()?;
                }
            }
        }
        3 => t.scalar_type = scalar_type(u)?,
        4 => {
            let a = t.allocation_info.get_or_insert_with(Default::default);
            match u.int_in_range(0..=2)? {
                0 => a.memory_offset_low = edgy_i32(u)? as u32,
                1 => a.memory_offset_high = u.arbitrary()?,
                _ => a.memory_id = u.int_in_range(0..=3)?,
            }
        }
        5 => t.allocation_info = None,
        6 => t.data_buffer_idx = u.int_in_range(0..=n_values as u32)?,
        7 => {
            t.shape_dynamism = match u.int_in_range(0..=2)? {
                0 => et::TensorShapeDynamism::Static,
                1 => et::TensorShapeDynamism::DynamicBound,
                _ => et::TensorShapeDynamism::DynamicUnbound,
            }
        }
        8 => t.storage_offset = edgy_i32(u)?,
        _ => {
            let info = t.extra_tensor_info.get_or_insert_with(Default::default);
            info.location = et::TensorDataLocation::External;
            info.fully_qualified_name = Some(u.arbitrary::<String>()?);
        }
    }
    Ok(())
}

fn mutate_value(u: &mut Unstructured<'_>, v: &mut et::EValue, n_values: usize) -> Result<()> {
    use et::KernelTypes as K;
    match &mut v.val {
        Some(K::Tensor(t)) => mutate_tensor(u, t, n_values)?,
        Some(K::Int(i)) => i.int_val = edgy_int(u)?,
        Some(K::Double(d)) => {
            d.double_val = *u.choose(&[0.0, -0.0, 1.0, -1.0, 0.5, 1e300, f64::NAN, f64::INFINITY])?
        }
        Some(K::Bool(b)) => b.bool_val = !b.bool_val,
        Some(K::IntList(l)) => {
            let items = l.items.get_or_insert_with(Vec::new);
            match u.int_in_range(0..=2)? {
                0 => items.push(i64::from(index(u, n_values)?)),
                1 => {
                    items.pop();
                }
                _ => {
                    if let Some(it) = u.choose_iter(items.iter_mut()).ok() {
                        *it = i64::from(index(u, n_values)?);
                    }
                }
            }
        }
        Some(K::TensorList(l)) => {
            let items = l.items.get_or_insert_with(Vec::new);
            if u.arbitrary()? {
                items.push(index(u, n_values)?);
            } else if let Some(it) = u.choose_iter(items.iter_mut()).ok() {
                *it = index(u, n_values)?;
            }
        }
        Some(K::OptionalTensorList(l)) => {
            l.items.get_or_insert_with(Vec::new).push(index(u, n_values)? - 1);
        }
        _ => {}
    }
    if u.ratio(1, 16)? {
        // Another kind of value altogether.
        v.val = Some(match u.int_in_range(0..=4)? {
            0 => K::Null(Box::default()),
            1 => K::Int(Box::new(et::Int { int_val: edgy_int(u)? })),
            2 => K::Bool(Box::new(et::Bool { bool_val: u.arbitrary()? })),
            3 => K::IntList(Box::new(et::IntList {
                items: Some(vec![i64::from(index(u, n_values)?); u.int_in_range(0..=4)?]),
            })),
            _ => K::Tensor(Box::new(et::Tensor {
                scalar_type: scalar_type(u)?,
                sizes: Some(vec![edgy_i32(u)?]),
                dim_order: Some(vec![0]),
                ..Default::default()
            })),
        });
    }
    Ok(())
}

fn mutate_instruction(
    u: &mut Unstructured<'_>,
    chain: &mut Vec<et::Instruction>,
    n_values: usize,
    n_ops: usize,
) -> Result<()> {
    use et::InstructionArguments as I;
    let len = chain.len();
    match u.int_in_range(0..=5)? {
        0 => {
            let at = u.int_in_range(0..=len)?;
            let instr = match u.int_in_range(0..=2)? {
                0 => I::FreeCall(Box::new(et::FreeCall {
                    value_index: index(u, n_values)?,
                })),
                1 => I::MoveCall(Box::new(et::MoveCall {
                    move_from: index(u, n_values)?,
                    move_to: index(u, n_values)?,
                })),
                _ => I::JumpFalseCall(Box::new(et::JumpFalseCall {
                    cond_value_index: index(u, n_values)?,
                    destination_instruction: index(u, len + 1)?,
                })),
            };
            chain.insert(at, et::Instruction { instr_args: Some(instr) });
        }
        1 if len > 0 => {
            chain.remove(u.choose_index(len)?);
        }
        _ if len > 0 => {
            let i = u.choose_index(len)?;
            match chain[i].instr_args.as_mut() {
                Some(I::KernelCall(k)) => {
                    let args = k.args.get_or_insert_with(Vec::new);
                    match u.int_in_range(0..=3)? {
                        0 => k.op_index = index(u, n_ops)?,
                        1 if !args.is_empty() => {
                            let a = u.choose_index(args.len())?;
                            args[a] = index(u, n_values)?;
                        }
                        2 => {
                            args.pop();
                        }
                        _ => args.push(index(u, n_values)?),
                    }
                }
                Some(I::JumpFalseCall(j)) => j.destination_instruction = index(u, len + 1)?,
                Some(I::MoveCall(m)) => m.move_from = index(u, n_values)?,
                Some(I::FreeCall(f)) => f.value_index = index(u, n_values)?,
                _ => {}
            }
        }
        _ => {}
    }
    Ok(())
}

fn mutate(u: &mut Unstructured<'_>, plan: &mut et::ExecutionPlan) -> Result<()> {
    let n_values = plan.values.as_ref().map_or(0, Vec::len);
    let n_ops = plan.operators.as_ref().map_or(0, Vec::len);
    for _ in 0..u.int_in_range(1..=4)? {
        match u.int_in_range(0..=9)? {
            0..=4 => {
                if let Some(v) = plan.values.as_mut().and_then(|v| u.choose_iter(v.iter_mut()).ok())
                {
                    mutate_value(u, v, n_values)?;
                }
            }
            5..=7 => {
                if let Some(chain) = plan.chains.as_mut().and_then(|c| c.first_mut()) {
                    let instrs = chain.instructions.get_or_insert_with(Vec::new);
                    mutate_instruction(u, instrs, n_values, n_ops)?;
                }
            }
            8 => {
                let sizes = plan.non_const_buffer_sizes.get_or_insert_with(Vec::new);
                match sizes.last_mut() {
                    Some(s) if u.arbitrary()? => *s = edgy_int(u)?,
                    _ => sizes.push(edgy_int(u)?.rem_euclid(1 << 20)),
                }
            }
            _ => {
                let list = if u.arbitrary()? {
                    plan.inputs.get_or_insert_with(Vec::new)
                } else {
                    plan.outputs.get_or_insert_with(Vec::new)
                };
                if let Some(i) = u.choose_iter(list.iter_mut()).ok() {
                    *i = index(u, n_values)?;
                }
            }
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(seed) = u.choose(SEEDS) else { return };
    let Ok(mut image) = ProgramImage::parse(seed) else { return };
    let Some(plan) = image.program.execution_plan.as_mut().and_then(|p| p.first_mut()) else {
        return;
    };
    if mutate(&mut u, plan).is_err() {
        return;
    }
    let Ok(bytes) = image.to_bytes(&WriteOptions::default()) else { return };
    let Ok(program) = Program::from_bytes(&bytes) else { return };
    let kernels = KERNELS.get_or_init(pte_kernels::registry);
    let options = LoadOptions {
        memory_limit: MEMORY_LIMIT,
        max_instructions: MAX_INSTRUCTIONS,
        max_loop_iterations: Some(MAX_LOOP_ITERATIONS),
        ..LoadOptions::default()
    };
    for name in program.method_names().to_vec() {
        let Ok(mut method) =
            program.load_method_with(&name, kernels, &BackendRegistry::new(), &options)
        else {
            continue;
        };
        let Ok(inputs) = method.meta().example_inputs(MEMORY_LIMIT) else { continue };
        if method.set_inputs(&inputs).is_ok() {
            for _ in 0..2 {
                let _ = method.execute();
            }
            let _ = method.outputs();
        }
    }
});
