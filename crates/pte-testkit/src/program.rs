//! Builds small programs value by value, for tests that need a program upstream would
//! never write: hostile sizes, loops, frees, unplanned tensors.

use pte_format::schema::executorch_flatbuffer as et;
use pte_format::{ProgramImage, Segment, WriteOptions};

/// Where a tensor's memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Memory-planned in buffer 1 (offsets assigned in order, 16-byte aligned).
    Planned,
    /// Not planned: the runtime allocates it when it is written (or the caller sets it).
    Unplanned,
    /// Planned in buffer 1 at this byte offset, sharing memory with the tensors already
    /// there (as a planner reuses the place of a dead tensor, or an exporter's view).
    At(u64),
}

/// One method (`forward`) of a program under construction.
#[derive(Default)]
pub struct ProgramBuilder {
    values: Vec<et::EValue>,
    operators: Vec<et::Operator>,
    instructions: Vec<et::Instruction>,
    inputs: Vec<i32>,
    outputs: Vec<i32>,
    planned: u64,
    constants: Vec<u8>,
    constant_offsets: Vec<u64>,
    /// Delegates, each with its payload (a segment after the constants').
    delegates: Vec<(et::BackendDelegate, Vec<u8>)>,
}

fn value(v: et::KernelTypes) -> et::EValue {
    et::EValue { val: Some(v) }
}

impl ProgramBuilder {
    /// An empty method.
    pub fn new() -> Self {
        ProgramBuilder {
            constant_offsets: vec![0],
            ..Default::default()
        }
    }

    /// Where a planned tensor sits in buffer 1: pass it as [`Memory::At`] to place
    /// another tensor there (an exporter's view, a dead tensor's place reused).
    pub fn place(&self, v: i32) -> Option<u64> {
        let et::KernelTypes::Tensor(t) = self.values.get(usize::try_from(v).ok()?)?.val.as_ref()?
        else {
            return None;
        };
        let a = t.allocation_info.as_ref()?;
        Some(u64::from(a.memory_offset_low) | (u64::from(a.memory_offset_high) << 32))
    }

    fn push(&mut self, v: et::KernelTypes) -> i32 {
        self.values.push(value(v));
        (self.values.len() - 1) as i32
    }

    /// An `Int` value.
    pub fn int(&mut self, v: i64) -> i32 {
        self.push(et::KernelTypes::Int(Box::new(et::Int { int_val: v })))
    }

    /// A `Double` value.
    pub fn double(&mut self, v: f64) -> i32 {
        self.push(et::KernelTypes::Double(Box::new(et::Double {
            double_val: v,
        })))
    }

    /// A `Bool` value.
    pub fn bool(&mut self, v: bool) -> i32 {
        self.push(et::KernelTypes::Bool(Box::new(et::Bool { bool_val: v })))
    }

    /// A `String` value.
    pub fn string(&mut self, v: &str) -> i32 {
        self.push(et::KernelTypes::String(Box::new(et::String {
            string_val: Some(v.to_owned()),
        })))
    }

    /// A `Null` value (an absent optional).
    pub fn none(&mut self) -> i32 {
        self.push(et::KernelTypes::Null(Box::new(et::Null {})))
    }

    /// An `IntList`: one `Int` value per item, then the list naming them.
    pub fn int_list(&mut self, items: &[i64]) -> i32 {
        let ids: Vec<i64> = items.iter().map(|&v| i64::from(self.int(v))).collect();
        self.push(et::KernelTypes::IntList(Box::new(et::IntList {
            items: Some(ids),
        })))
    }

    /// A `DoubleList` (its values inline, as the schema keeps them).
    pub fn double_list(&mut self, items: &[f64]) -> i32 {
        self.push(et::KernelTypes::DoubleList(Box::new(et::DoubleList {
            items: Some(items.to_vec()),
        })))
    }

    /// A `TensorList` of earlier tensor values.
    pub fn tensor_list(&mut self, items: &[i32]) -> i32 {
        self.push(et::KernelTypes::TensorList(Box::new(et::TensorList {
            items: Some(items.to_vec()),
        })))
    }

    /// A static tensor of `dtype` and `sizes` in the default dim order.
    pub fn tensor(&mut self, dtype: et::ScalarType, sizes: &[i32], memory: Memory) -> i32 {
        self.tensor_with(dtype, sizes, memory, et::TensorShapeDynamism::Static)
    }

    /// A tensor with the given dynamism (the sizes are its upper bound when dynamic).
    pub fn tensor_with(
        &mut self,
        dtype: et::ScalarType,
        sizes: &[i32],
        memory: Memory,
        dynamism: et::TensorShapeDynamism,
    ) -> i32 {
        let offset = match memory {
            Memory::Planned => Some(self.planned),
            Memory::At(at) => Some(at),
            Memory::Unplanned => None,
        };
        let allocation_info = offset.map(|offset| {
            let nbytes = sizes.iter().map(|&s| s.max(0) as u64).product::<u64>()
                * pte_format::scalar::element_size(dtype).unwrap_or(1) as u64;
            self.planned = self.planned.max((offset + nbytes).next_multiple_of(16));
            Box::new(et::AllocationDetails {
                memory_id: 1,
                memory_offset_low: offset as u32,
                memory_offset_high: (offset >> 32) as u32,
            })
        });
        self.push(et::KernelTypes::Tensor(Box::new(et::Tensor {
            scalar_type: dtype,
            sizes: Some(sizes.to_vec()),
            dim_order: Some((0..sizes.len() as u8).collect()),
            allocation_info,
            shape_dynamism: dynamism,
            ..Default::default()
        })))
    }

    /// A constant tensor holding `bytes` (in the program's constant segment).
    pub fn constant(&mut self, dtype: et::ScalarType, sizes: &[i32], bytes: &[u8]) -> i32 {
        let start = self.constants.len().next_multiple_of(16);
        self.constants.resize(start, 0);
        self.constants.extend_from_slice(bytes);
        self.constant_offsets.push(start as u64);
        let index = (self.constant_offsets.len() - 1) as u32;
        self.push(et::KernelTypes::Tensor(Box::new(et::Tensor {
            scalar_type: dtype,
            sizes: Some(sizes.to_vec()),
            dim_order: Some((0..sizes.len() as u8).collect()),
            data_buffer_idx: index,
            ..Default::default()
        })))
    }

    fn instruction(&mut self, args: et::InstructionArguments) {
        self.instructions.push(et::Instruction {
            instr_args: Some(args),
        });
    }

    /// A kernel call of `name.overload` (`overload` empty for the default).
    pub fn call(&mut self, name: &str, overload: &str, args: &[i32]) {
        let op = et::Operator {
            name: Some(name.to_owned()),
            overload: Some(overload.to_owned()),
        };
        let index = match self.operators.iter().position(|o| *o == op) {
            Some(i) => i,
            None => {
                self.operators.push(op);
                self.operators.len() - 1
            }
        };
        self.instruction(et::InstructionArguments::KernelCall(Box::new(
            et::KernelCall {
                op_index: index as i32,
                args: Some(args.to_vec()),
            },
        )));
    }

    /// A call of a delegate of `backend` holding `payload`, with `args` (its inputs,
    /// then its outputs).
    pub fn delegate(&mut self, backend: &str, payload: Vec<u8>, args: &[i32]) {
        let delegate = et::BackendDelegate {
            id: Some(backend.to_owned()),
            processed: Some(Box::new(et::BackendDelegateDataReference {
                location: et::DataLocation::Segment,
                index: (self.delegates.len() + 1) as u32,
            })),
            compile_specs: Some(Vec::new()),
        };
        self.instruction(et::InstructionArguments::DelegateCall(Box::new(
            et::DelegateCall {
                delegate_index: self.delegates.len() as i32,
                args: Some(args.to_vec()),
            },
        )));
        self.delegates.push((delegate, payload));
    }

    /// Jumps to instruction `destination` when `cond` is false.
    pub fn jump_false(&mut self, cond: i32, destination: i32) {
        self.instruction(et::InstructionArguments::JumpFalseCall(Box::new(
            et::JumpFalseCall {
                cond_value_index: cond,
                destination_instruction: destination,
            },
        )));
    }

    /// Frees a tensor.
    pub fn free(&mut self, value: i32) {
        self.instruction(et::InstructionArguments::FreeCall(Box::new(et::FreeCall {
            value_index: value,
        })));
    }

    /// Copies value `from` into value `to`.
    pub fn mov(&mut self, from: i32, to: i32) {
        self.instruction(et::InstructionArguments::MoveCall(Box::new(et::MoveCall {
            move_from: from,
            move_to: to,
        })));
    }

    /// Number of instructions so far (the index of the next one).
    pub fn next_instruction(&self) -> i32 {
        self.instructions.len() as i32
    }

    /// Declares a method input.
    pub fn input(&mut self, v: i32) {
        self.inputs.push(v);
    }

    /// Declares a method output.
    pub fn output(&mut self, v: i32) {
        self.outputs.push(v);
    }

    /// The program file.
    pub fn build(self) -> Vec<u8> {
        let (delegates, payloads): (Vec<_>, Vec<_>) = self.delegates.into_iter().unzip();
        let plan = et::ExecutionPlan {
            name: Some("forward".into()),
            values: Some(self.values),
            inputs: Some(self.inputs),
            outputs: Some(self.outputs),
            chains: Some(vec![et::Chain {
                inputs: Some(Vec::new()),
                outputs: Some(Vec::new()),
                instructions: Some(self.instructions),
                stacktrace: None,
            }]),
            operators: Some(self.operators),
            delegates: Some(delegates),
            non_const_buffer_sizes: Some(vec![0, self.planned as i64]),
            ..Default::default()
        };
        let program = et::Program {
            execution_plan: Some(vec![plan]),
            constant_buffer: Some(Vec::new()),
            backend_delegate_data: Some(Vec::new()),
            segments: Some(vec![
                et::DataSegment { offset: 0, size: 0 };
                1 + payloads.len()
            ]),
            constant_segment: Some(Box::new(et::SubsegmentOffsets {
                segment_index: 0,
                offsets: Some(self.constant_offsets),
            })),
            ..Default::default()
        };
        let image = ProgramImage {
            program,
            segments: std::iter::once(self.constants)
                .chain(payloads)
                .map(Segment::new)
                .collect(),
        };
        image
            .to_bytes(&WriteOptions::default())
            .expect("a program the builder made can be written")
    }
}
