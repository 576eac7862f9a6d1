//! Programs that pass format verification but are wrong inside get an error at load or at
//! execution: never a panic, an out-of-bounds access or a hang.

use pte_format::schema::executorch_flatbuffer as et;
use pte_format::{ProgramImage, WriteOptions};
use pte_runtime::{BackendRegistry, EValue, LoadOptions, Program, RuntimeError};

fn seed() -> Vec<u8> {
    std::fs::read(pte_testkit::fixtures_dir().join("linear_clamp/model.pte")).unwrap()
}

/// Applies `edit` to the seed program's only method and writes the result.
fn edited(edit: impl FnOnce(&mut et::ExecutionPlan)) -> Vec<u8> {
    let bytes = seed();
    let mut image = ProgramImage::parse(&bytes).unwrap();
    edit(&mut image.program.execution_plan.as_mut().unwrap()[0]);
    image.to_bytes(&WriteOptions::default()).unwrap()
}

fn load(bytes: &[u8]) -> Result<pte_runtime::Method, RuntimeError> {
    Program::from_bytes(bytes)?.load_method("forward", &pte_kernels::registry())
}

fn run(bytes: &[u8]) -> Result<(), RuntimeError> {
    let mut m = load(bytes)?;
    let inputs = m.meta().example_inputs(1 << 30)?;
    m.set_inputs(&inputs)?;
    m.execute()
}

fn kernel_call(plan: &mut et::ExecutionPlan, n: usize) -> &mut et::KernelCall {
    let instr = &mut plan.chains.as_mut().unwrap()[0]
        .instructions
        .as_mut()
        .unwrap()[n];
    match instr.instr_args.as_mut().unwrap() {
        et::InstructionArguments::KernelCall(k) => k,
        _ => panic!("instruction {n} is not a kernel call"),
    }
}

fn tensor(plan: &mut et::ExecutionPlan, index: usize) -> &mut et::Tensor {
    match plan.values.as_mut().unwrap()[index].val.as_mut().unwrap() {
        et::KernelTypes::Tensor(t) => t,
        _ => panic!("value {index} is not a tensor"),
    }
}

fn first_planned_tensor(plan: &et::ExecutionPlan) -> usize {
    plan.values
        .as_ref()
        .unwrap()
        .iter()
        .position(
            |v| matches!(&v.val, Some(et::KernelTypes::Tensor(t)) if t.allocation_info.is_some()),
        )
        .unwrap()
}

fn assert_invalid(result: Result<impl std::fmt::Debug, RuntimeError>, needle: &str) {
    match result {
        Err(e) => assert!(
            e.to_string().contains(needle),
            "error {e:?} does not mention {needle:?}"
        ),
        Ok(v) => panic!("expected an error mentioning {needle:?}, got {v:?}"),
    }
}

#[test]
fn the_seed_program_runs() {
    run(&seed()).unwrap();
}

#[test]
fn value_indices_out_of_range() {
    assert_invalid(
        load(&edited(|p| {
            kernel_call(p, 0).args.as_mut().unwrap()[0] = 9999
        })),
        "out of range",
    );
    assert_invalid(
        load(&edited(|p| {
            kernel_call(p, 0).args.as_mut().unwrap()[0] = -1
        })),
        "out of range",
    );
    assert_invalid(
        load(&edited(|p| p.inputs = Some(vec![12345]))),
        "out of range",
    );
    assert_invalid(
        load(&edited(|p| p.outputs = Some(vec![-7]))),
        "out of range",
    );
    assert_invalid(
        load(&edited(|p| kernel_call(p, 0).op_index = 99)),
        "operator index",
    );
}

#[test]
fn argument_of_the_wrong_kind() {
    // Point `add`'s first tensor argument at the int list of `permute_copy`'s dims.
    let bytes = edited(|p| {
        let dims = kernel_call(p, 1).args.as_ref().unwrap()[1];
        kernel_call(p, 0).args.as_mut().unwrap()[0] = dims;
    });
    assert_invalid(run(&bytes), "argument 0 is IntList");
}

#[test]
fn planned_tensor_past_the_end_of_its_buffer() {
    let bytes = edited(|p| {
        let i = first_planned_tensor(p);
        let alloc = tensor(p, i).allocation_info.as_mut().unwrap();
        alloc.memory_offset_low = u32::MAX;
        alloc.memory_offset_high = u32::MAX;
    });
    assert_invalid(load(&bytes), "past the end");
    let bytes = edited(|p| {
        let i = first_planned_tensor(p);
        tensor(p, i).allocation_info.as_mut().unwrap().memory_id = 0;
    });
    assert_invalid(load(&bytes), "memory id 0");
    let bytes = edited(|p| {
        let i = first_planned_tensor(p);
        tensor(p, i).allocation_info.as_mut().unwrap().memory_id = 7;
    });
    assert_invalid(load(&bytes), "memory id 7");
}

#[test]
fn sizes_whose_byte_count_overflows() {
    let bytes = edited(|p| {
        let i = first_planned_tensor(p);
        let t = tensor(p, i);
        t.sizes = Some(vec![i32::MAX; 4]);
        t.dim_order = Some(vec![0, 1, 2, 3]);
    });
    assert_invalid(load(&bytes), "overflows");
    let bytes = edited(|p| {
        let i = first_planned_tensor(p);
        tensor(p, i).sizes = Some(vec![3, -4]);
    });
    assert_invalid(load(&bytes), "negative size");
}

#[test]
fn rank_above_16() {
    let bytes = edited(|p| {
        let i = first_planned_tensor(p);
        let t = tensor(p, i);
        t.sizes = Some(vec![1; 17]);
        t.dim_order = Some((0..17).collect());
    });
    assert_invalid(load(&bytes), "rank 17");
}

#[test]
fn dim_order_that_is_not_a_permutation() {
    let bytes = edited(|p| {
        let i = first_planned_tensor(p);
        tensor(p, i).dim_order = Some(vec![1, 1]);
    });
    assert_invalid(load(&bytes), "permutation");
}

#[test]
fn constant_index_out_of_range() {
    let bytes = edited(|p| {
        let i = p
            .values
            .as_ref()
            .unwrap()
            .iter()
            .position(
                |v| matches!(&v.val, Some(et::KernelTypes::Tensor(t)) if t.data_buffer_idx > 0),
            )
            .unwrap();
        tensor(p, i).data_buffer_idx = 1000;
    });
    assert_invalid(load(&bytes), "constant index 1000");
}

#[test]
fn an_instruction_loop_is_stopped() {
    let bytes = edited(|p| {
        let values = p.values.as_mut().unwrap();
        values.push(et::EValue {
            val: Some(et::KernelTypes::Bool(Box::new(et::Bool {
                bool_val: false,
            }))),
        });
        let cond = (values.len() - 1) as i32;
        p.chains.as_mut().unwrap()[0].instructions = Some(vec![et::Instruction {
            instr_args: Some(et::InstructionArguments::JumpFalseCall(Box::new(
                et::JumpFalseCall {
                    cond_value_index: cond,
                    destination_instruction: 0,
                },
            ))),
        }]);
    });
    let started = std::time::Instant::now();
    let err = run(&bytes).unwrap_err();
    assert!(
        matches!(err, RuntimeError::LoopLimit { limit, .. } if limit == pte_runtime::MIN_LOOP_ITERATIONS),
        "{err}"
    );
    assert!(started.elapsed().as_secs() < 5);
    // With loops allowed, the instruction cap still stops it.
    let options = LoadOptions {
        max_loop_iterations: Some(u64::MAX),
        max_instructions: 100_000,
        ..LoadOptions::default()
    };
    let mut m = Program::from_bytes(&bytes)
        .unwrap()
        .load_method_with(
            "forward",
            &pte_kernels::registry(),
            &BackendRegistry::new(),
            &options,
        )
        .unwrap();
    let inputs = m.meta().example_inputs(1 << 20).unwrap();
    m.set_inputs(&inputs).unwrap();
    assert!(matches!(
        m.execute(),
        Err(RuntimeError::InstructionLimit(100_000))
    ));
}

#[test]
fn a_jump_on_a_non_bool_is_an_error() {
    let bytes = edited(|p| {
        let instrs = p.chains.as_mut().unwrap()[0].instructions.as_mut().unwrap();
        instrs.insert(
            0,
            et::Instruction {
                instr_args: Some(et::InstructionArguments::JumpFalseCall(Box::new(
                    et::JumpFalseCall {
                        cond_value_index: 0,
                        destination_instruction: 0,
                    },
                ))),
            },
        );
    });
    assert_invalid(run(&bytes), "jump condition");
}

#[test]
fn every_missing_operator_is_reported_at_once() {
    let bytes = edited(|p| {
        for op in p.operators.as_mut().unwrap().iter_mut() {
            op.name = Some(format!("custom::{}", op.name.as_deref().unwrap()));
        }
    });
    match load(&bytes) {
        Err(RuntimeError::MissingOperators(ops)) => assert_eq!(ops.len(), 4, "{ops:?}"),
        other => panic!("expected missing operators, got {other:?}"),
    }
}

#[test]
fn a_missing_backend_is_a_load_error() {
    let bytes =
        std::fs::read(pte_testkit::fixtures_dir().join("xnnpack_linear_conv/model.pte")).unwrap();
    match load(&bytes) {
        Err(RuntimeError::MissingBackends(b)) => assert_eq!(b, ["XnnpackBackend"]),
        other => panic!("expected a missing backend, got {other:?}"),
    }
}

#[test]
fn a_tensor_list_must_name_earlier_tensors() {
    let bytes = edited(|p| {
        let values = p.values.as_mut().unwrap();
        let n = values.len() as i32;
        values.push(et::EValue {
            val: Some(et::KernelTypes::TensorList(Box::new(et::TensorList {
                items: Some(vec![n + 5]),
            }))),
        });
    });
    assert_invalid(load(&bytes), "out of range");
}

/// Found by the `mutate` fuzz target: a list naming itself made constant folding recurse
/// until the stack overflowed.
#[test]
fn an_int_list_must_name_int_values() {
    for own_index in [true, false] {
        let bytes = edited(|p| {
            let values = p.values.as_mut().unwrap();
            let n = values.len() as i64;
            values.push(et::EValue {
                val: Some(et::KernelTypes::IntList(Box::new(et::IntList {
                    items: Some(vec![if own_index { n } else { n + 1 }]),
                }))),
            });
            values.push(et::EValue {
                val: Some(et::KernelTypes::IntList(Box::new(et::IntList {
                    items: Some(vec![n]),
                }))),
            });
        });
        assert_invalid(load(&bytes), "is not an Int value");
    }
}

#[test]
fn inputs_are_checked() {
    let mut m = load(&seed()).unwrap();
    let wrong_shape = pte_runtime::Tensor::from_slice(&[4, 3], &[0f32; 12]).unwrap();
    assert_invalid(m.set_input(0, &EValue::Tensor(wrong_shape)), "input 0");
    let wrong_dtype = pte_runtime::Tensor::from_slice(&[3, 4], &[0i64; 12]).unwrap();
    assert_invalid(
        m.set_input(0, &EValue::Tensor(wrong_dtype)),
        "expected float32",
    );
    assert_invalid(m.set_input(1, &EValue::Int(1)), "does not exist");
    assert!(matches!(m.execute(), Err(RuntimeError::InputNotSet(0))));
}

#[test]
fn dynamic_inputs_past_their_bound_or_of_another_rank_are_rejected() {
    let program =
        Program::open(pte_testkit::fixtures_dir().join("dynamic_batch/model.pte")).unwrap();
    let mut m = program
        .load_method("forward", &pte_kernels::registry())
        .unwrap();
    let pte_runtime::ValueMeta::Tensor(meta) = m.meta().inputs[0].clone() else {
        panic!("tensor input expected")
    };
    let mut sizes = meta.sizes.clone();
    sizes[0] += 1;
    let n: usize = sizes.iter().product();
    let too_big = pte_runtime::Tensor::from_slice(&sizes, &vec![0f32; n]).unwrap();
    assert_invalid(m.set_input(0, &EValue::Tensor(too_big)), "bound");
    let flat = pte_runtime::Tensor::from_slice(&[n], &vec![0f32; n]).unwrap();
    assert_invalid(m.set_input(0, &EValue::Tensor(flat)), "rank");
    sizes[0] = 2;
    let n: usize = sizes.iter().product();
    let fits = pte_runtime::Tensor::from_slice(&sizes, &vec![0f32; n]).unwrap();
    m.set_input(0, &EValue::Tensor(fits)).unwrap();
}

#[test]
fn planned_buffer_sizes_that_overflow_are_refused() {
    let bytes = edited(|p| p.non_const_buffer_sizes = Some(vec![0, i64::MAX, i64::MAX, 16]));
    assert_invalid(load(&bytes), "memory budget");
    let bytes = edited(|p| p.non_const_buffer_sizes = Some(vec![0, -5]));
    assert_invalid(load(&bytes), "negative");
}
