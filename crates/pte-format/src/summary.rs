//! Structured, serializable descriptions of files: what `pte inspect` prints.
//!
//! The summaries only read verified files, and describe rather than judge: an index that
//! points nowhere is reported as such instead of failing the whole summary.

use serde::Serialize;

use crate::bpte::Bpte;
use crate::error::Result;
use crate::header::{DataHeader, ProgramHeader};
use crate::ptd::Ptd;
use crate::pte::Pte;
use crate::scalar::{dtype_name, tensor_nbytes};
use crate::schema::bundled_program_flatbuffer as bp;
use crate::schema::executorch_flatbuffer as et;

/// Version of the JSON document shape; bumped on any incompatible change.
pub const SUMMARY_FORMAT_VERSION: u32 = 1;

/// A `.pte` program.
#[derive(Debug, Serialize)]
pub struct ProgramSummary {
    pub file_size: u64,
    pub schema_version: u32,
    pub header: Option<ProgramHeader>,
    pub segments: Vec<SegmentSummary>,
    pub methods: Vec<MethodSummary>,
    pub named_data: Vec<NamedDataSummary>,
    /// Bytes of the constant segment (padding included), 0 when there is none.
    pub constant_segment_bytes: u64,
}

/// One segment and what uses it.
#[derive(Debug, Serialize)]
pub struct SegmentSummary {
    pub index: usize,
    /// Absolute offset in the file.
    pub offset: u64,
    pub size: u64,
    /// `constants`, `mutable_data`, `delegate`, `named_data` or `unused`.
    pub role: &'static str,
}

/// An entry of the program's own named data.
#[derive(Debug, Serialize)]
pub struct NamedDataSummary {
    pub key: String,
    pub segment_index: u32,
    pub bytes: u64,
}

/// One method (execution plan).
#[derive(Debug, Serialize)]
pub struct MethodSummary {
    pub name: String,
    pub inputs: Vec<ValueSummary>,
    pub outputs: Vec<ValueSummary>,
    pub operators: Vec<OperatorSummary>,
    pub delegates: Vec<DelegateSummary>,
    /// Sizes of the memory-planned buffers, for memory ids 1, 2, ...
    pub planned_buffers: Vec<i64>,
    pub num_values: usize,
    pub num_instructions: usize,
    pub constants: ConstantsSummary,
}

/// A method input or output.
#[derive(Debug, Serialize)]
pub struct ValueSummary {
    pub index: i64,
    /// `tensor`, `int`, `double`, `bool`, `string`, `none`, a list kind, or `invalid`.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<i32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim_order: Option<Vec<u8>>,
    /// `static`, `dynamic_bound` or `dynamic_unbound`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamism: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_planned: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nbytes: Option<u64>,
    /// Literal value of int, double and bool values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// An operator and how many KernelCalls call it.
#[derive(Debug, Serialize)]
pub struct OperatorSummary {
    /// `namespace::name.overload` (no `.overload` for the default overload).
    pub name: String,
    pub calls: usize,
}

/// A backend delegate.
#[derive(Debug, Serialize)]
pub struct DelegateSummary {
    pub backend: String,
    /// `inline` or `segment`.
    pub location: &'static str,
    pub index: u32,
    pub payload_bytes: u64,
    pub compile_specs: Vec<String>,
    pub calls: usize,
}

/// The constant tensors a method uses.
#[derive(Debug, Serialize)]
pub struct ConstantsSummary {
    /// Constant tensors stored in the program.
    pub count: usize,
    /// Their bytes (distinct buffers counted once).
    pub bytes: u64,
    /// Keys of constants stored outside, in a `.ptd` file.
    pub external_keys: Vec<String>,
}

/// A `.ptd` data file.
#[derive(Debug, Serialize)]
pub struct DataSummary {
    pub file_size: u64,
    pub schema_version: u32,
    pub header: DataHeader,
    pub segments: Vec<SegmentSummary>,
    pub entries: Vec<DataEntrySummary>,
}

/// One named entry of a `.ptd` file.
#[derive(Debug, Serialize)]
pub struct DataEntrySummary {
    pub key: String,
    pub segment_index: usize,
    pub bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<i32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim_order: Option<Vec<u8>>,
}

/// A `.bpte` bundled program.
#[derive(Debug, Serialize)]
pub struct BundledSummary {
    pub file_size: u64,
    pub schema_version: u32,
    pub program: ProgramSummary,
    pub test_suites: Vec<TestSuiteSummary>,
}

/// The test cases of one method.
#[derive(Debug, Serialize)]
pub struct TestSuiteSummary {
    pub method: String,
    pub cases: Vec<TestCaseSummary>,
}

/// One test case: its inputs and expected outputs, described.
#[derive(Debug, Serialize)]
pub struct TestCaseSummary {
    pub inputs: Vec<String>,
    pub expected_outputs: Vec<String>,
}

fn dynamism_name(d: et::TensorShapeDynamism) -> &'static str {
    match d {
        et::TensorShapeDynamism::Static => "static",
        et::TensorShapeDynamism::DynamicBound => "dynamic_bound",
        et::TensorShapeDynamism::DynamicUnbound => "dynamic_unbound",
    }
}

/// Describes a program.
pub fn program(pte: &Pte<'_>) -> Result<ProgramSummary> {
    let p = pte.program();
    let mut roles = vec!["unused"; pte.num_segments()];
    let mut mark = |i: usize, role| {
        if let Some(r) = roles.get_mut(i) {
            *r = role;
        }
    };
    if let Some(c) = p.constant_segment()? {
        mark(c.segment_index()? as usize, "constants");
    }
    for m in p.mutable_data_segments()?.into_iter().flatten() {
        mark(m?.segment_index()? as usize, "mutable_data");
    }
    let mut named_data = Vec::new();
    for n in p.named_data()?.into_iter().flatten() {
        let n = n?;
        let segment_index = n.segment_index()?;
        mark(segment_index as usize, "named_data");
        named_data.push(NamedDataSummary {
            key: n.key()?.unwrap_or_default().to_owned(),
            segment_index,
            bytes: pte.segment(segment_index as usize)?.len() as u64,
        });
    }
    let mut methods = Vec::new();
    for plan in p.execution_plan()?.into_iter().flatten() {
        let plan = plan?;
        for d in plan.delegates()?.into_iter().flatten() {
            if let Some(r) = d?.processed()? {
                if r.location()? == et::DataLocation::Segment {
                    mark(r.index()? as usize, "delegate");
                }
            }
        }
        methods.push(method(pte, plan)?);
    }
    let constant_segment_bytes = match pte.constant_segment()? {
        Some(c) => c.data().len() as u64,
        None => 0,
    };
    let segments = (0..pte.num_segments())
        .map(|i| {
            let r = pte.segment_range(i)?;
            Ok(SegmentSummary {
                index: i,
                offset: r.start as u64,
                size: r.len() as u64,
                role: roles.get(i).copied().unwrap_or("unused"),
            })
        })
        .collect::<Result<_>>()?;
    Ok(ProgramSummary {
        file_size: pte.bytes().len() as u64,
        schema_version: p.version()?,
        header: pte.header().copied(),
        segments,
        methods,
        named_data,
        constant_segment_bytes,
    })
}

fn method(pte: &Pte<'_>, plan: et::ExecutionPlanRef<'_>) -> Result<MethodSummary> {
    let values: Vec<et::EValueRef<'_>> = plan
        .values()?
        .map(|v| v.iter().collect::<planus::Result<_>>())
        .transpose()?
        .unwrap_or_default();
    let describe = |index: i64| -> Result<ValueSummary> {
        let v = usize::try_from(index).ok().and_then(|i| values.get(i));
        value_summary(index, v.copied())
    };
    let inputs = plan
        .inputs()?
        .into_iter()
        .flatten()
        .map(|i| describe(i.into()))
        .collect::<Result<_>>()?;
    let outputs = plan
        .outputs()?
        .into_iter()
        .flatten()
        .map(|i| describe(i.into()))
        .collect::<Result<_>>()?;

    let operators: Vec<et::OperatorRef<'_>> = plan
        .operators()?
        .map(|v| v.iter().collect::<planus::Result<_>>())
        .transpose()?
        .unwrap_or_default();
    let delegate_refs: Vec<et::BackendDelegateRef<'_>> = plan
        .delegates()?
        .map(|v| v.iter().collect::<planus::Result<_>>())
        .transpose()?
        .unwrap_or_default();
    let mut op_calls = vec![0usize; operators.len()];
    let mut delegate_calls = vec![0usize; delegate_refs.len()];
    let mut num_instructions = 0;
    for chain in plan.chains()?.into_iter().flatten() {
        for instr in chain?.instructions()?.into_iter().flatten() {
            num_instructions += 1;
            match instr?.instr_args()? {
                Some(et::InstructionArgumentsRef::KernelCall(k)) => {
                    if let Some(c) = usize::try_from(k.op_index()?)
                        .ok()
                        .and_then(|i| op_calls.get_mut(i))
                    {
                        *c += 1;
                    }
                }
                Some(et::InstructionArgumentsRef::DelegateCall(d)) => {
                    if let Some(c) = usize::try_from(d.delegate_index()?)
                        .ok()
                        .and_then(|i| delegate_calls.get_mut(i))
                    {
                        *c += 1;
                    }
                }
                _ => {}
            }
        }
    }
    let operators = operators
        .iter()
        .zip(op_calls)
        .map(|(op, calls)| {
            Ok(OperatorSummary {
                name: operator_name(op.name()?.unwrap_or(""), op.overload()?.unwrap_or("")),
                calls,
            })
        })
        .collect::<Result<_>>()?;
    let delegates = delegate_refs
        .iter()
        .zip(delegate_calls)
        .map(|(d, calls)| {
            let processed = d.processed()?;
            let (location, index, payload_bytes) = match processed {
                Some(r) => (
                    match r.location()? {
                        et::DataLocation::Inline => "inline",
                        et::DataLocation::Segment => "segment",
                    },
                    r.index()?,
                    pte.delegate_data(r)?.len() as u64,
                ),
                None => ("none", 0, 0),
            };
            let compile_specs = d
                .compile_specs()?
                .into_iter()
                .flatten()
                .map(|s| Ok(s?.key()?.unwrap_or("").to_owned()))
                .collect::<Result<_>>()?;
            Ok(DelegateSummary {
                backend: d.id()?.unwrap_or("").to_owned(),
                location,
                index,
                payload_bytes,
                compile_specs,
                calls,
            })
        })
        .collect::<Result<_>>()?;

    let mut constants = ConstantsSummary {
        count: 0,
        bytes: 0,
        external_keys: Vec::new(),
    };
    let constant_segment = pte.constant_segment()?;
    let mut seen_buffers = std::collections::BTreeSet::new();
    for v in &values {
        let Some(et::KernelTypesRef::Tensor(t)) = v.val()? else {
            continue;
        };
        if t.allocation_info()?.is_some() {
            continue;
        }
        let external = match t.extra_tensor_info()? {
            Some(e) if e.location()? == et::TensorDataLocation::External => {
                e.fully_qualified_name()?.map(str::to_owned)
            }
            _ => None,
        };
        if let Some(key) = external {
            if !constants.external_keys.contains(&key) {
                constants.external_keys.push(key);
            }
            continue;
        }
        let idx = t.data_buffer_idx()?;
        if idx == 0 {
            continue;
        }
        constants.count += 1;
        if seen_buffers.insert(idx) {
            let sizes = t
                .sizes()?
                .map(|s| s.iter().map(i64::from).collect::<Vec<_>>());
            let nbytes =
                tensor_nbytes(t.scalar_type()?, sizes.unwrap_or_default(), "constant").unwrap_or(0);
            if constant_segment.is_some() {
                constants.bytes += nbytes as u64;
            } else if let Some(b) = pte.program().constant_buffer()? {
                if let Some(buf) = b.get(idx as usize) {
                    constants.bytes += buf?.storage()?.map_or(0, |s| s.len() as u64);
                }
            }
        }
    }
    let planned_buffers = plan
        .non_const_buffer_sizes()?
        .map(|s| s.iter().skip(1).collect())
        .unwrap_or_default();
    Ok(MethodSummary {
        name: plan.name()?.unwrap_or("").to_owned(),
        inputs,
        outputs,
        operators,
        delegates,
        planned_buffers,
        num_values: values.len(),
        num_instructions,
        constants,
    })
}

/// The registry name of an operator: `name` plus `.overload` unless the overload is empty.
pub fn operator_name(name: &str, overload: &str) -> String {
    if overload.is_empty() {
        name.to_owned()
    } else {
        format!("{name}.{overload}")
    }
}

fn value_summary(index: i64, value: Option<et::EValueRef<'_>>) -> Result<ValueSummary> {
    let mut s = ValueSummary {
        index,
        kind: "invalid",
        dtype: None,
        shape: None,
        dim_order: None,
        dynamism: None,
        memory_planned: None,
        nbytes: None,
        value: None,
    };
    let Some(value) = value else {
        return Ok(s);
    };
    use et::KernelTypesRef as K;
    s.kind = match value.val()? {
        None | Some(K::Null(_)) => "none",
        Some(K::Int(i)) => {
            s.value = Some(i.int_val()?.to_string());
            "int"
        }
        Some(K::Bool(b)) => {
            s.value = Some(b.bool_val()?.to_string());
            "bool"
        }
        Some(K::Double(d)) => {
            s.value = Some(d.double_val()?.to_string());
            "double"
        }
        Some(K::String(_)) => "string",
        Some(K::IntList(_)) => "int_list",
        Some(K::DoubleList(_)) => "double_list",
        Some(K::BoolList(_)) => "bool_list",
        Some(K::TensorList(_)) => "tensor_list",
        Some(K::OptionalTensorList(_)) => "optional_tensor_list",
        Some(K::Tensor(t)) => {
            let dtype = t.scalar_type()?;
            let shape: Vec<i32> = t.sizes()?.map(|v| v.iter().collect()).unwrap_or_default();
            s.nbytes = tensor_nbytes(dtype, shape.iter().map(|&d| i64::from(d)), "tensor")
                .ok()
                .map(|n| n as u64);
            s.dtype = Some(dtype_name(dtype));
            s.shape = Some(shape);
            s.dim_order = t.dim_order()?.map(<[u8]>::to_vec);
            s.dynamism = Some(dynamism_name(t.shape_dynamism()?));
            s.memory_planned = Some(t.allocation_info()?.is_some() || t.data_buffer_idx()? != 0);
            "tensor"
        }
    };
    Ok(s)
}

/// Describes a `.ptd` file.
pub fn data(ptd: &Ptd<'_>) -> Result<DataSummary> {
    let segments = (0..ptd.num_segments())
        .map(|i| {
            let r = ptd.segment_range(i)?;
            Ok(SegmentSummary {
                index: i,
                offset: r.start as u64,
                size: r.len() as u64,
                role: "named_data",
            })
        })
        .collect::<Result<_>>()?;
    let entries = ptd
        .entries()?
        .into_iter()
        .map(|e| DataEntrySummary {
            key: e.key.to_owned(),
            segment_index: e.segment_index,
            bytes: e
                .layout
                .as_ref()
                .and_then(|l| l.nbytes().ok())
                .unwrap_or(e.data.len()) as u64,
            dtype: e.layout.as_ref().map(|l| dtype_name(l.scalar_type)),
            shape: e.layout.as_ref().map(|l| l.sizes.clone()),
            dim_order: e.layout.as_ref().map(|l| l.dim_order.clone()),
        })
        .collect();
    Ok(DataSummary {
        file_size: ptd.bytes().len() as u64,
        schema_version: ptd.root().version()?,
        header: *ptd.header(),
        segments,
        entries,
    })
}

/// Describes a `.bpte` bundled program.
pub fn bundled(bpte: &Bpte<'_>, file_size: u64) -> Result<BundledSummary> {
    let describe = |v: planus::Result<bp::ValueRef<'_>>| -> Result<String> {
        Ok(match v?.val()? {
            None => "none".to_owned(),
            Some(bp::ValueUnionRef::Tensor(t)) => {
                let shape: Vec<i32> = t.sizes()?.map(|s| s.iter().collect()).unwrap_or_default();
                format!("{}{:?}", dtype_name(t.scalar_type()?), shape)
            }
            Some(bp::ValueUnionRef::Int(i)) => format!("int {}", i.int_val()?),
            Some(bp::ValueUnionRef::Bool(b)) => format!("bool {}", b.bool_val()?),
            Some(bp::ValueUnionRef::Double(d)) => format!("double {}", d.double_val()?),
        })
    };
    let mut test_suites = Vec::new();
    for suite in bpte.test_suites()? {
        let mut cases = Vec::new();
        for case in suite.test_cases()?.into_iter().flatten() {
            let case = case?;
            cases.push(TestCaseSummary {
                inputs: case
                    .inputs()?
                    .into_iter()
                    .flatten()
                    .map(describe)
                    .collect::<Result<_>>()?,
                expected_outputs: case
                    .expected_outputs()?
                    .into_iter()
                    .flatten()
                    .map(describe)
                    .collect::<Result<_>>()?,
            });
        }
        test_suites.push(TestSuiteSummary {
            method: suite.method_name()?.unwrap_or("").to_owned(),
            cases,
        });
    }
    Ok(BundledSummary {
        file_size,
        schema_version: bpte.root().version()?,
        program: program(bpte.program())?,
        test_suites,
    })
}
