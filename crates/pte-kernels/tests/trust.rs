//! What `docs/security.md` promises about running methods: memory is bounded by one
//! budget, frees never leak, loops and long executions end, and one program serves many
//! threads at once with the results of sequential runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pte_format::schema::executorch_flatbuffer as et;
use pte_format::{ProgramImage, WriteOptions};
use pte_runtime::{BackendRegistry, EValue, LoadOptions, Method, Program, RuntimeError, Tensor};
use pte_testkit::program::{Memory, ProgramBuilder};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(pte_testkit::fixtures_dir().join(name).join("model.pte")).unwrap()
}

fn load_with(bytes: &[u8], options: &LoadOptions) -> Result<Method, RuntimeError> {
    Program::from_bytes(bytes)?.load_method_with(
        "forward",
        &pte_kernels::registry(),
        &BackendRegistry::new(),
        options,
    )
}

fn load(bytes: &[u8]) -> Method {
    load_with(bytes, &LoadOptions::default()).unwrap()
}

fn run_once(m: &mut Method) -> Result<Vec<EValue>, RuntimeError> {
    let inputs = m.meta().example_inputs(1 << 30)?;
    m.set_inputs(&inputs)?;
    m.execute()?;
    m.outputs()
}

fn bytes_of(outputs: &[EValue]) -> Vec<Vec<u8>> {
    outputs
        .iter()
        .map(|v| v.as_tensor().unwrap().as_bytes().to_vec())
        .collect()
}

/// Rewrites a fixture's only method.
fn edited(bytes: &[u8], edit: impl FnOnce(&mut et::ExecutionPlan)) -> Vec<u8> {
    let mut image = ProgramImage::parse(bytes).unwrap();
    edit(&mut image.program.execution_plan.as_mut().unwrap()[0]);
    image.to_bytes(&WriteOptions::default()).unwrap()
}

fn instructions(plan: &mut et::ExecutionPlan) -> &mut Vec<et::Instruction> {
    plan.chains.as_mut().unwrap()[0]
        .instructions
        .as_mut()
        .unwrap()
}

/// Frees the output of every single-output kernel call right before the call writes it.
fn free_before_each_write(plan: &mut et::ExecutionPlan) {
    let old = std::mem::take(instructions(plan));
    let is_tensor = |plan: &et::ExecutionPlan, v: i32| {
        matches!(
            plan.values.as_ref().unwrap()[v as usize].val,
            Some(et::KernelTypes::Tensor(_))
        )
    };
    for instr in old {
        if let Some(et::InstructionArguments::KernelCall(k)) = &instr.instr_args {
            let out = *k.args.as_ref().unwrap().last().unwrap();
            if !is_tensor(plan, out) {
                instructions(plan).push(instr);
                continue;
            }
            instructions(plan).push(et::Instruction {
                instr_args: Some(et::InstructionArguments::FreeCall(Box::new(et::FreeCall {
                    value_index: out,
                }))),
            });
        }
        instructions(plan).push(instr);
    }
}

/// A small conv net (conv, relu, add) whose intermediates are not memory-planned, with or
/// without a free before each write.
fn unplanned_conv_net(frees: bool) -> Vec<u8> {
    use et::ScalarType::Float;
    let mut b = ProgramBuilder::new();
    let x = b.tensor(Float, &[1, 3, 8, 8], Memory::Planned);
    let weights: Vec<f32> = (0..108)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 10.0)
        .collect();
    let w = b.constant(Float, &[4, 3, 3, 3], bytemuck::cast_slice(&weights));
    let bias = b.none();
    let ones = b.int_list(&[1, 1]);
    let zeros = b.int_list(&[0, 0]);
    let no = b.bool(false);
    let groups = b.int(1);
    let alpha = b.int(1);
    let conv = b.tensor(Float, &[1, 4, 6, 6], Memory::Unplanned);
    let relu = b.tensor(Float, &[1, 4, 6, 6], Memory::Unplanned);
    let out = b.tensor(Float, &[1, 4, 6, 6], Memory::Planned);
    let free = |b: &mut ProgramBuilder, v| {
        if frees {
            b.free(v);
        }
    };
    free(&mut b, conv);
    let conv_args = [x, w, bias, ones, zeros, ones, no, zeros, groups, conv, conv];
    b.call("aten::convolution", "out", &conv_args);
    free(&mut b, relu);
    b.call("aten::relu", "out", &[conv, relu, relu]);
    b.call("aten::add", "out", &[relu, conv, alpha, out, out]);
    b.input(x);
    b.output(out);
    b.build()
}

#[test]
fn freeing_before_every_write_runs_in_constant_memory_with_the_same_outputs() {
    // Planned intermediates (upstream's conv net with a free inserted before each kernel
    // writes), and intermediates that are not planned (the runtime allocates them).
    let plain = fixture("convnet");
    let cases = [
        (plain.clone(), edited(&plain, free_before_each_write)),
        (unplanned_conv_net(false), unplanned_conv_net(true)),
    ];
    for (without, with) in cases {
        let expected = bytes_of(&run_once(&mut load(&without)).unwrap());
        let mut m = load(&with);
        let inputs = m.meta().example_inputs(1 << 30).unwrap();
        m.set_inputs(&inputs).unwrap();
        m.execute().unwrap();
        let (after_first, _) = m.memory_used();
        for _ in 0..3000 {
            // The memory plan may reuse an input's memory once it is consumed, so inputs
            // are set before every execution.
            m.set_inputs(&inputs).unwrap();
            m.execute().unwrap();
            assert_eq!(m.memory_used().0, after_first);
        }
        // Frees between calls keep the fuser from merging them, so the two programs
        // may round differently in the last place.
        let got = bytes_of(&m.outputs().unwrap());
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(&expected) {
            let floats = |b: &[u8]| -> Vec<f32> {
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            };
            let (g, e) = (floats(g), floats(e));
            assert_eq!(g.len(), e.len());
            for (a, b) in g.iter().zip(&e) {
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
            }
        }
    }
}

/// A program whose only instruction jumps back to itself.
fn endless_loop() -> Vec<u8> {
    let mut b = ProgramBuilder::new();
    let no = b.bool(false);
    b.jump_false(no, 0);
    b.build()
}

#[test]
fn a_hostile_loop_around_a_conv_net_ends_within_seconds() {
    let bytes = edited(&fixture("convnet"), |p| {
        let values = p.values.as_mut().unwrap();
        values.push(et::EValue {
            val: Some(et::KernelTypes::Bool(Box::new(et::Bool {
                bool_val: false,
            }))),
        });
        let cond = (values.len() - 1) as i32;
        instructions(p).push(et::Instruction {
            instr_args: Some(et::InstructionArguments::JumpFalseCall(Box::new(
                et::JumpFalseCall {
                    cond_value_index: cond,
                    destination_instruction: 0,
                },
            ))),
        });
    });
    let started = Instant::now();
    let err = run_once(&mut load(&bytes)).unwrap_err();
    assert!(matches!(err, RuntimeError::LoopLimit { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_timeout_stops_an_execution() {
    let options = LoadOptions {
        max_loop_iterations: Some(u64::MAX),
        max_instructions: u64::MAX,
        ..LoadOptions::default()
    };
    let mut m = load_with(&endless_loop(), &options).unwrap();
    m.set_timeout(Some(Duration::from_millis(100)));
    let started = Instant::now();
    let err = m.execute().unwrap_err();
    assert!(matches!(err, RuntimeError::DeadlineExceeded(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_cancel_handle_stops_an_execution_from_another_thread() {
    let options = LoadOptions {
        max_loop_iterations: Some(u64::MAX),
        max_instructions: u64::MAX,
        ..LoadOptions::default()
    };
    let mut m = load_with(&endless_loop(), &options).unwrap();
    let cancel = m.cancel_handle();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        cancel.cancel();
    });
    let err = m.execute().unwrap_err();
    assert!(matches!(err, RuntimeError::Cancelled), "{err}");
    canceller.join().unwrap();
}

#[test]
fn an_unplanned_output_past_the_budget_is_an_error_naming_op_value_and_size() {
    // full([2^20, 2^20], 1.0) into a tensor that is not memory-planned: 4 TiB.
    let mut b = ProgramBuilder::new();
    let size = b.int_list(&[1 << 20, 1 << 20]);
    let fill = b.double(1.0);
    let out = b.tensor(
        et::ScalarType::Float,
        &[1 << 20, 1 << 20],
        Memory::Unplanned,
    );
    b.call("aten::full", "out", &[size, fill, out, out]);
    b.output(out);
    let err = run_once(&mut load(&b.build())).unwrap_err().to_string();
    for needle in [
        "aten::full.out",
        &format!("value {out}"),
        "needs 4398046511104 more bytes",
        "memory budget",
    ] {
        assert!(err.contains(needle), "{err:?} does not mention {needle:?}");
    }
}

#[test]
fn planned_memory_counts_against_the_budget() {
    let bytes = fixture("convnet");
    let planned: usize = Program::from_bytes(&bytes)
        .unwrap()
        .method_meta("forward")
        .unwrap()
        .planned_buffers
        .iter()
        .sum();
    let tight = LoadOptions {
        memory_limit: planned as u64 / 2,
        ..LoadOptions::default()
    };
    let err = load_with(&bytes, &tight).unwrap_err();
    assert!(
        matches!(err, RuntimeError::Memory { .. }) && err.to_string().contains("planned buffer 1"),
        "{err}"
    );
    let m = load(&bytes);
    assert!(m.memory_used().0 >= planned as u64);
}

/// Inputs of the fixture's shape, scaled by `k`, so that every one gives other outputs.
fn scaled_inputs(m: &Method, k: usize) -> Vec<EValue> {
    m.meta()
        .example_inputs(1 << 30)
        .unwrap()
        .into_iter()
        .map(|v| match v {
            EValue::Tensor(t) => {
                let scale = 0.5 + k as f32 / 4.0;
                let values: Vec<f32> = t
                    .as_slice::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x * scale)
                    .collect();
                EValue::Tensor(Tensor::from_slice(t.sizes(), &values).unwrap())
            }
            other => other,
        })
        .collect()
}

#[test]
fn one_program_serves_many_threads_with_the_results_of_sequential_runs() {
    for (name, per_thread) in [("linear_clamp", 2500), ("convnet", 60)] {
        let program = Arc::new(Program::from_bytes(&fixture(name)).unwrap());
        let kernels = Arc::new(pte_kernels::registry());
        let mut sequential = program.load_method("forward", &kernels).unwrap();
        let inputs: Vec<Vec<EValue>> = (0..7).map(|k| scaled_inputs(&sequential, k)).collect();
        let expected: Vec<Vec<Vec<u8>>> = inputs
            .iter()
            .map(|x| {
                sequential.set_inputs(x).unwrap();
                sequential.execute().unwrap();
                bytes_of(&sequential.outputs().unwrap())
            })
            .collect();
        let inputs = Arc::new(inputs);
        let expected = Arc::new(expected);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (program, kernels) = (program.clone(), kernels.clone());
                let (inputs, expected) = (inputs.clone(), expected.clone());
                std::thread::spawn(move || {
                    let mut m = program.load_method("forward", &kernels).unwrap();
                    for i in 0..per_thread {
                        let k = (i * (t + 1) + t) % inputs.len();
                        m.set_inputs(&inputs[k]).unwrap();
                        m.execute().unwrap();
                        assert_eq!(bytes_of(&m.outputs().unwrap()), expected[k], "{name}");
                    }
                    per_thread
                })
            })
            .collect();
        let runs: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(runs, 4 * per_thread);
    }
}
