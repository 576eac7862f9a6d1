//! Programs: opening `.pte` (and `.bpte`) files with their `.ptd` data, listing methods
//! and their metadata, and loading methods.

use std::path::Path;
use std::sync::Arc;

use pte_format::schema::executorch_flatbuffer as et;
use pte_format::{Bpte, FileBytes, FileKind, Ptd, Pte, Verified};

use crate::dtype::DType;
use crate::error::{Result, RuntimeError};
use crate::memory::SourceBytes;
use crate::method::{LoadOptions, Method};
use crate::registry::{BackendRegistry, KernelRegistry};
use crate::tensor::{Dims, MAX_RANK};
use crate::value::Dynamism;

/// Highest `Program.version` this runtime reads (as upstream 1.5.1).
pub const MAX_SCHEMA_VERSION: u32 = 0;

/// A loaded program file and the data files that go with it.
///
/// Each file is verified once, when it is opened or added; later looks at it (method
/// metadata, loading methods) view the verified bytes in constant time.
pub struct Program {
    pub(crate) bytes: Arc<SourceBytes>,
    verified: Verified,
    pub(crate) data: Vec<Arc<SourceBytes>>,
    data_verified: Vec<Verified>,
    methods: Vec<String>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("bytes", &self.bytes.len())
            .field("data_files", &self.data.len())
            .field("methods", &self.methods)
            .finish()
    }
}

fn aligned_copy(bytes: &[u8]) -> Result<SourceBytes> {
    pte_format::AlignedBuf::try_from_bytes(bytes)
        .map(SourceBytes::Aligned)
        .map_err(|e| RuntimeError::NotSupported(format!("copying the program: {e}")))
}

impl Program {
    /// Reads a `.pte` file (or a `.bpte` bundle: its embedded program) into memory.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(FileBytes::read(path.as_ref())?)
    }

    /// A program from a file's bytes: read, or memory-mapped with the `unsafe`
    /// [`FileBytes::map`], whose contract (the file stays unchanged while mapped) then
    /// holds for as long as the program and its methods live.
    ///
    /// ```no_run
    /// # use pte_runtime::Program;
    /// // SAFETY: nothing modifies model.pte while the program is in use.
    /// let bytes = unsafe { pte_format::FileBytes::map("model.pte") }?;
    /// let program = Program::from_file(bytes)?;
    /// # Ok::<(), pte_runtime::RuntimeError>(())
    /// ```
    pub fn from_file(file: FileBytes) -> Result<Self> {
        if FileKind::detect(&file) == Some(FileKind::Bundled) {
            return Self::from_bytes(Bpte::parse(&file)?.program().bytes());
        }
        Self::new(SourceBytes::File(file))
    }

    /// Loads a program from bytes (copied into aligned memory).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if FileKind::detect(bytes) == Some(FileKind::Bundled) {
            let inner = Bpte::parse(bytes)?.program().bytes();
            return Self::new(aligned_copy(inner)?);
        }
        Self::new(aligned_copy(bytes)?)
    }

    fn new(bytes: SourceBytes) -> Result<Self> {
        let pte = Pte::parse(&bytes)?;
        let version = pte.program().version()?;
        if version > MAX_SCHEMA_VERSION {
            return Err(RuntimeError::NotSupported(format!(
                "program schema version {version}; this runtime reads up to {MAX_SCHEMA_VERSION}"
            )));
        }
        let mut methods = Vec::new();
        for plan in pte.program().execution_plan()?.into_iter().flatten() {
            methods.push(plan?.name()?.unwrap_or_default().to_owned());
        }
        let verified = pte.verified();
        Ok(Program {
            bytes: Arc::new(bytes),
            verified,
            data: Vec::new(),
            data_verified: Vec::new(),
            methods,
        })
    }

    /// Adds a `.ptd` data file (read into memory) whose tensors the program may use.
    pub fn add_data_file(&mut self, path: impl AsRef<Path>) -> Result<()> {
        self.add_data(FileBytes::read(path.as_ref())?)
    }

    /// Adds a `.ptd` data file from its bytes: read, or memory-mapped (see
    /// [`Program::from_file`]).
    pub fn add_data(&mut self, file: FileBytes) -> Result<()> {
        self.add_source(SourceBytes::File(file))
    }

    /// Adds `.ptd` data given as bytes (copied into aligned memory).
    pub fn add_data_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.add_source(aligned_copy(bytes)?)
    }

    fn add_source(&mut self, bytes: SourceBytes) -> Result<()> {
        let ptd = Ptd::parse(&bytes)?;
        let version = ptd.root().version()?;
        if version > MAX_SCHEMA_VERSION {
            return Err(RuntimeError::NotSupported(format!(
                "data file schema version {version}; this runtime reads up to {MAX_SCHEMA_VERSION}"
            )));
        }
        let verified = ptd.verified();
        self.data.push(Arc::new(bytes));
        self.data_verified.push(verified);
        Ok(())
    }

    /// Method names, in program order.
    pub fn method_names(&self) -> &[String] {
        &self.methods
    }

    /// The view of the program, verified when it was opened.
    pub(crate) fn pte(&self) -> Result<Pte<'_>> {
        Ok(Pte::reopen(&self.bytes, self.verified)?)
    }

    /// Views of the data files, verified when they were added.
    pub(crate) fn ptds(&self) -> Result<Vec<Ptd<'_>>> {
        self.data
            .iter()
            .zip(&self.data_verified)
            .map(|(d, &v)| Ok(Ptd::reopen(d, v)?))
            .collect()
    }

    pub(crate) fn plan<'p>(&self, pte: &Pte<'p>, name: &str) -> Result<et::ExecutionPlanRef<'p>> {
        for plan in pte.program().execution_plan()?.into_iter().flatten() {
            let plan = plan?;
            if plan.name()? == Some(name) {
                return Ok(plan);
            }
        }
        Err(RuntimeError::NoSuchMethod {
            name: name.to_owned(),
            available: self.methods.clone(),
        })
    }

    /// Inputs, outputs and planned memory of a method, without loading it.
    pub fn method_meta(&self, name: &str) -> Result<MethodMeta> {
        let pte = self.pte()?;
        MethodMeta::from_plan(self.plan(&pte, name)?)
    }

    /// Loads a method with the given kernels and no backends.
    pub fn load_method(&self, name: &str, kernels: &KernelRegistry) -> Result<Method> {
        self.load_method_with(
            name,
            kernels,
            &BackendRegistry::new(),
            &LoadOptions::default(),
        )
    }

    /// Loads a method with the given kernels, backends and options.
    pub fn load_method_with(
        &self,
        name: &str,
        kernels: &KernelRegistry,
        backends: &BackendRegistry,
        options: &LoadOptions,
    ) -> Result<Method> {
        Method::load(self, name, kernels, backends, options)
    }
}

/// Metadata of a tensor declared in a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMeta {
    pub dtype: DType,
    /// Serialized sizes: the upper bound for dynamic tensors.
    pub sizes: Vec<usize>,
    pub dim_order: Vec<usize>,
    pub dynamism: Dynamism,
    /// Whether the runtime owns the tensor's memory (planned or constant); false for
    /// inputs whose data the caller provides.
    pub memory_planned: bool,
    /// Bytes at the serialized sizes.
    pub nbytes: usize,
}

impl ValueMeta {
    /// The kind's name, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            ValueMeta::Tensor(_) => "tensor",
            ValueMeta::Int(_) => "int",
            ValueMeta::Double(_) => "float",
            ValueMeta::Bool(_) => "bool",
            ValueMeta::String(_) => "string",
            ValueMeta::None => "None",
            ValueMeta::List(kind) => kind,
        }
    }
}

/// Metadata of a method input or output.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueMeta {
    Tensor(TensorMeta),
    Int(i64),
    Double(f64),
    Bool(bool),
    String(String),
    None,
    /// A list value (upstream's method metadata does not describe lists either).
    List(&'static str),
}

/// A method's interface and memory needs.
#[derive(Clone, Debug, PartialEq)]
pub struct MethodMeta {
    pub name: String,
    pub inputs: Vec<ValueMeta>,
    pub outputs: Vec<ValueMeta>,
    /// Sizes of the planned buffers for memory ids 1, 2, ...
    pub planned_buffers: Vec<usize>,
}

/// Checked shape facts of a serialized tensor, shared by metadata and method loading.
pub(crate) struct TensorShape {
    pub dtype: DType,
    pub sizes: Dims,
    pub dim_order: Dims,
    pub dynamism: Dynamism,
    pub numel: usize,
    pub nbytes: usize,
}

pub(crate) fn tensor_shape(t: et::TensorRef<'_>, what: &str) -> Result<TensorShape> {
    if t.storage_offset()? != 0 {
        return Err(RuntimeError::NotSupported(format!(
            "{what}: storage_offset {} (only 0 is supported)",
            t.storage_offset()?
        )));
    }
    let dynamism = match t.shape_dynamism()? {
        et::TensorShapeDynamism::Static => Dynamism::Static,
        et::TensorShapeDynamism::DynamicBound => Dynamism::Bound,
        et::TensorShapeDynamism::DynamicUnbound => {
            return Err(RuntimeError::NotSupported(format!(
                "{what}: DYNAMIC_UNBOUND tensors (upstream does not run them either)"
            )))
        }
    };
    let sizes = t
        .sizes()?
        .ok_or_else(|| RuntimeError::invalid_program(format!("{what}: tensor has no sizes")))?;
    if sizes.len() > MAX_RANK {
        return Err(RuntimeError::invalid_program(format!(
            "{what}: rank {} exceeds the limit of {MAX_RANK}",
            sizes.len()
        )));
    }
    let sizes: Dims = sizes
        .iter()
        .map(|s| {
            usize::try_from(s)
                .map_err(|_| RuntimeError::invalid_program(format!("{what}: negative size {s}")))
        })
        .collect::<Result<_>>()?;
    let dim_order = t
        .dim_order()?
        .ok_or_else(|| RuntimeError::invalid_program(format!("{what}: tensor has no dim_order")))?;
    pte_format::scalar::check_dim_order(dim_order, sizes.len(), what)?;
    let dtype = DType::from_scalar_type(t.scalar_type()?);
    let numel = crate::tensor::checked_numel(&sizes)
        .ok_or_else(|| RuntimeError::invalid_program(format!("{what}: element count overflows")))?;
    let nbytes = numel
        .checked_mul(dtype.size())
        .ok_or_else(|| RuntimeError::invalid_program(format!("{what}: byte size overflows")))?;
    Ok(TensorShape {
        dtype,
        sizes,
        dim_order: dim_order.iter().map(|&d| usize::from(d)).collect(),
        dynamism,
        numel,
        nbytes,
    })
}

impl MethodMeta {
    pub(crate) fn from_plan(plan: et::ExecutionPlanRef<'_>) -> Result<Self> {
        let name = plan
            .name()?
            .ok_or_else(|| RuntimeError::invalid_program("execution plan without a name"))?
            .to_owned();
        let values = plan
            .values()?
            .ok_or_else(|| RuntimeError::invalid_program(format!("method {name}: no values")))?;
        let describe =
            |list: Option<planus::Vector<'_, i32>>, what: &str| -> Result<Vec<ValueMeta>> {
                let list = list.ok_or_else(|| {
                    RuntimeError::invalid_program(format!("method {name}: no {what} list"))
                })?;
                list.iter()
                    .enumerate()
                    .map(|(k, idx)| {
                        let field = format!("method {name} {what} {k}");
                        let v = usize::try_from(idx)
                            .ok()
                            .and_then(|i| values.get(i))
                            .ok_or_else(|| {
                                RuntimeError::invalid_program(format!(
                                    "{field}: value index {idx} is out of range"
                                ))
                            })??;
                        value_meta(v, &field)
                    })
                    .collect()
            };
        let inputs = describe(plan.inputs()?, "input")?;
        let outputs = describe(plan.outputs()?, "output")?;
        let sizes = plan.non_const_buffer_sizes()?.ok_or_else(|| {
            RuntimeError::invalid_program(format!("method {name}: no non_const_buffer_sizes"))
        })?;
        let planned_buffers = sizes
            .iter()
            .skip(1)
            .map(|s| {
                usize::try_from(s).map_err(|_| {
                    RuntimeError::invalid_program(format!(
                        "method {name}: planned buffer size {s} is negative"
                    ))
                })
            })
            .collect::<Result<_>>()?;
        Ok(MethodMeta {
            name,
            inputs,
            outputs,
            planned_buffers,
        })
    }
}

fn value_meta(v: et::EValueRef<'_>, field: &str) -> Result<ValueMeta> {
    use et::KernelTypesRef as K;
    Ok(match v.val()? {
        None | Some(K::Null(_)) => ValueMeta::None,
        Some(K::Int(i)) => ValueMeta::Int(i.int_val()?),
        Some(K::Double(d)) => ValueMeta::Double(d.double_val()?),
        Some(K::Bool(b)) => ValueMeta::Bool(b.bool_val()?),
        Some(K::String(s)) => ValueMeta::String(s.string_val()?.unwrap_or_default().to_owned()),
        Some(K::Tensor(t)) => {
            let s = tensor_shape(t, field)?;
            ValueMeta::Tensor(TensorMeta {
                dtype: s.dtype,
                sizes: s.sizes.to_vec(),
                dim_order: s.dim_order.to_vec(),
                dynamism: s.dynamism,
                memory_planned: t.allocation_info()?.is_some() || t.data_buffer_idx()? != 0,
                nbytes: s.nbytes,
            })
        }
        Some(K::IntList(_)) => ValueMeta::List("IntList"),
        Some(K::DoubleList(_)) => ValueMeta::List("DoubleList"),
        Some(K::BoolList(_)) => ValueMeta::List("BoolList"),
        Some(K::TensorList(_)) => ValueMeta::List("TensorList"),
        Some(K::OptionalTensorList(_)) => ValueMeta::List("OptionalTensorList"),
    })
}

impl MethodMeta {
    /// Deterministic inputs that fit the metadata: tensors at their declared (upper
    /// bound) sizes filled with a fixed pseudo-random pattern (floats in [-1, 1), integers
    /// in 0..10, alternating bools); scalars at the value the program was exported with.
    /// Tensors that would take more than `max_bytes` in all are refused.
    pub fn example_inputs(&self, max_bytes: u64) -> Result<Vec<crate::EValue>> {
        use crate::EValue;
        let total = self.inputs.iter().fold(0u64, |sum, m| match m {
            ValueMeta::Tensor(t) => sum.saturating_add(t.nbytes as u64),
            _ => sum,
        });
        if total > max_bytes {
            return Err(RuntimeError::NotSupported(format!(
                "the method's inputs take {total} bytes, more than the {max_bytes} allowed"
            )));
        }
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, m)| {
                Ok(match m {
                    ValueMeta::Tensor(t) => EValue::Tensor(example_tensor(t, i as u64)?),
                    ValueMeta::Int(v) => EValue::Int(*v),
                    ValueMeta::Double(v) => EValue::Double(*v),
                    ValueMeta::Bool(v) => EValue::Bool(*v),
                    ValueMeta::String(s) => EValue::String(s.clone()),
                    ValueMeta::None => EValue::None,
                    ValueMeta::List(kind) => {
                        return Err(RuntimeError::NotSupported(format!(
                            "input {i} is a {kind}; list inputs are not supported"
                        )))
                    }
                })
            })
            .collect()
    }
}

fn example_tensor(meta: &TensorMeta, seed: u64) -> Result<crate::Tensor> {
    use crate::Tensor;
    // A fixed 64-bit LCG: the pattern must never change between versions, which the
    // `rand` crate does not promise for its generators.
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    };
    let mut t = Tensor::zeros_in(meta.dtype, &meta.sizes, &meta.dim_order)?;
    fn fill<T: crate::Element>(t: &mut Tensor, mut f: impl FnMut() -> T) -> Result<()> {
        t.as_mut_slice::<T>()?.iter_mut().for_each(|v| *v = f());
        Ok(())
    }
    let mut int = || ((next() + 1.0) * 5.0) as i64;
    match meta.dtype {
        DType::F32 => fill(&mut t, || next() as f32),
        DType::F64 => fill(&mut t, &mut next),
        DType::F16 => fill(&mut t, || half::f16::from_f64(next())),
        DType::BF16 => fill(&mut t, || half::bf16::from_f64(next())),
        DType::I64 => fill(&mut t, int),
        DType::I32 => fill(&mut t, || int() as i32),
        DType::I16 => fill(&mut t, || int() as i16),
        DType::I8 => fill(&mut t, || int() as i8),
        DType::U8 => fill(&mut t, || int() as u8),
        DType::Bool => {
            let mut k = 0u8;
            fill(&mut t, || {
                k ^= 1;
                k
            })
        }
        other => Err(RuntimeError::NotSupported(format!(
            "cannot generate {other} example inputs"
        ))),
    }?;
    Ok(t)
}
