//! What a kernel sees of one call: its arguments, their metadata, and views of their data.
//!
//! A kernel reads scalars and tensor metadata through [`Args`], resizes its outputs, then
//! asks [`Args::io`] for views of the tensors it reads and writes. The views never alias:
//! an input that shares memory with an output is copied first, so kernels are plain safe
//! Rust over slices.

use smallvec::SmallVec;

use crate::dtype::{DType, Element};
use crate::error::{KernelError, KernelResult};
use crate::memory::{Access, Memory, SharedBytes, Storage};
use crate::tensor::{checked_numel, contiguous_dim_order, strides_for, Dims};
use crate::value::{Dynamism, Slot, TensorSlot};

/// A scalar argument (an `Int`, `Double` or `Bool` value).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Int(i64),
    Double(f64),
    Bool(bool),
}

impl Scalar {
    /// As a float.
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Int(v) => v as f64,
            Scalar::Double(v) => v,
            Scalar::Bool(v) => f64::from(u8::from(v)),
        }
    }

    /// As an integer (doubles truncate toward zero).
    pub fn to_i64(self) -> i64 {
        match self {
            Scalar::Int(v) => v,
            Scalar::Double(v) => v as i64,
            Scalar::Bool(v) => i64::from(v),
        }
    }

    /// As a bool (non-zero is true).
    pub fn to_bool(self) -> bool {
        match self {
            Scalar::Int(v) => v != 0,
            Scalar::Double(v) => v != 0.0,
            Scalar::Bool(v) => v,
        }
    }

    /// The dtype PyTorch gives a tensor made from this scalar alone.
    pub fn dtype(self) -> DType {
        match self {
            Scalar::Int(_) => DType::I64,
            Scalar::Double(_) => DType::F64,
            Scalar::Bool(_) => DType::Bool,
        }
    }
}

/// Inputs and outputs whose views a call of many arguments ([`Args::io_many`]) holds
/// without a heap allocation, in two sizes: a delegate call of up to 24 inputs and 8
/// outputs (lraspp's XNNPACK calls pass 17), and one of up to 256 and 64 (a lowered
/// recurrent network concatenates its 32 steps in one call). The larger views cost
/// their copies (tens of kilobytes), so a call takes the smallest that fits; a call of
/// more allocates. Kernel calls ([`Args::io`]) hold 8 and 4: larger inline views cost
/// every call their copies.
pub const INLINE_READS: usize = 24;
/// See [`INLINE_READS`].
pub const INLINE_WRITES: usize = 8;
/// See [`INLINE_READS`].
pub const MANY_READS: usize = 256;
/// See [`INLINE_READS`].
pub const MANY_WRITES: usize = 64;

/// Metadata of a tensor argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: DType,
    pub sizes: Dims,
    pub dim_order: Dims,
}

impl TensorInfo {
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.sizes.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }

    /// Bytes of data.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// True for the default (row-major) dim order.
    pub fn is_contiguous(&self) -> bool {
        self.dim_order.iter().enumerate().all(|(i, &d)| i == d)
    }

    /// Strides in elements, from the dim order.
    pub fn strides(&self) -> Dims {
        strides_for(&self.sizes, &self.dim_order)
    }

    /// Normalizes a possibly negative dimension index against this rank.
    pub fn dim(&self, d: i64) -> KernelResult<usize> {
        normalize_dim(d, self.rank())
    }
}

/// Normalizes a dimension index in `-rank..rank` (a rank-0 tensor accepts -1 and 0).
pub fn normalize_dim(d: i64, rank: usize) -> KernelResult<usize> {
    let r = rank.max(1) as i64;
    let n = if d < 0 { d + r } else { d };
    if n < 0 || n >= r {
        return Err(KernelError::invalid(format!(
            "dimension {d} is out of range for rank {rank}"
        )));
    }
    Ok(n as usize)
}

/// Names a tensor of the call: the argument at a position, or element `j` of the tensor
/// list at position `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    At(usize),
    Item(usize, usize),
}

impl From<usize> for Arg {
    fn from(i: usize) -> Self {
        Arg::At(i)
    }
}

/// The arguments of one kernel or delegate call.
pub struct Args<'a> {
    pub(crate) op: &'a str,
    pub(crate) ids: &'a [u32],
    pub(crate) values: &'a mut [Slot],
    pub(crate) memory: &'a mut Memory,
    pub(crate) pool: &'a pte_compute::ThreadPool,
    pub(crate) staging: &'a pte_compute::Staging,
    /// While a method loads, what its kernels derive from constants, shared.
    pub(crate) derived: Option<&'a crate::DerivedStates>,
}

/// What executions lend from (see [`Args::staging`]): nothing is kept.
pub(crate) static PASSING: pte_compute::Staging = pte_compute::Staging::passing();

impl<'a> Args<'a> {
    /// The operator (or delegate) name, for messages.
    pub fn op(&self) -> &str {
        self.op
    }

    /// Number of arguments (schema arguments, then returns).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when the call has no arguments.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn id(&self, i: usize) -> KernelResult<usize> {
        self.ids.get(i).map(|&v| v as usize).ok_or_else(|| {
            KernelError::invalid(format!(
                "argument {i} is missing: the call has {} arguments",
                self.ids.len()
            ))
        })
    }

    fn slot(&self, i: usize) -> KernelResult<&Slot> {
        self.value(self.id(i)?)
    }

    fn value(&self, id: usize) -> KernelResult<&Slot> {
        self.values
            .get(id)
            .ok_or_else(|| KernelError::invalid(format!("value {id} does not exist")))
    }

    /// The thread pool to split work on: the method's (see `LoadOptions::threads`). At
    /// load, its thread count sizes per-thread working memory.
    pub fn pool(&self) -> &'a pte_compute::ThreadPool {
        self.pool
    }

    /// Temporaries for preparing a kernel (weights rearranged before they are packed):
    /// while a method loads, each buffer given back is lent to the next kernel, so the
    /// load faults its temporaries in once; during an execution nothing is kept.
    pub fn staging(&self) -> &'a pte_compute::Staging {
        self.staging
    }

    /// The method's memory budget: state a kernel prepares (packed weights) is charged
    /// to it through [`crate::Buffer`].
    pub fn budget(&self) -> &crate::MemoryBudget {
        &self.memory.budget
    }

    fn wrong(&self, i: usize, expected: &str) -> KernelError {
        let found = self.slot(i).map_or("missing", Slot::kind);
        KernelError::invalid(format!("argument {i} is {found}, expected {expected}"))
    }

    /// The kind of argument `i` (`Tensor`, `Int`, ...).
    pub fn kind(&self, i: usize) -> KernelResult<&'static str> {
        self.slot(i).map(Slot::kind)
    }

    /// True when argument `i` is None.
    pub fn is_none(&self, i: usize) -> KernelResult<bool> {
        Ok(matches!(self.slot(i)?, Slot::None))
    }

    /// An `Int` argument.
    pub fn int(&self, i: usize) -> KernelResult<i64> {
        match self.slot(i)? {
            Slot::Int(v) => Ok(*v),
            _ => Err(self.wrong(i, "Int")),
        }
    }

    /// A `Double` argument (an `Int` is converted).
    pub fn double(&self, i: usize) -> KernelResult<f64> {
        match self.slot(i)? {
            Slot::Double(v) => Ok(*v),
            Slot::Int(v) => Ok(*v as f64),
            _ => Err(self.wrong(i, "Double")),
        }
    }

    /// A `Bool` argument.
    pub fn bool(&self, i: usize) -> KernelResult<bool> {
        match self.slot(i)? {
            Slot::Bool(v) => Ok(*v),
            _ => Err(self.wrong(i, "Bool")),
        }
    }

    /// A scalar argument of any kind.
    pub fn scalar(&self, i: usize) -> KernelResult<Scalar> {
        match self.slot(i)? {
            Slot::Int(v) => Ok(Scalar::Int(*v)),
            Slot::Double(v) => Ok(Scalar::Double(*v)),
            Slot::Bool(v) => Ok(Scalar::Bool(*v)),
            _ => Err(self.wrong(i, "a scalar")),
        }
    }

    /// An optional `Int`.
    pub fn opt_int(&self, i: usize) -> KernelResult<Option<i64>> {
        if self.is_none(i)? {
            Ok(None)
        } else {
            self.int(i).map(Some)
        }
    }

    /// An optional `Double`.
    pub fn opt_double(&self, i: usize) -> KernelResult<Option<f64>> {
        if self.is_none(i)? {
            Ok(None)
        } else {
            self.double(i).map(Some)
        }
    }

    /// An optional `Bool`.
    pub fn opt_bool(&self, i: usize) -> KernelResult<Option<bool>> {
        if self.is_none(i)? {
            Ok(None)
        } else {
            self.bool(i).map(Some)
        }
    }

    /// An optional scalar.
    pub fn opt_scalar(&self, i: usize) -> KernelResult<Option<Scalar>> {
        if self.is_none(i)? {
            Ok(None)
        } else {
            self.scalar(i).map(Some)
        }
    }

    /// A `String` argument.
    pub fn string(&self, i: usize) -> KernelResult<&str> {
        match self.slot(i)? {
            Slot::String(s) => Ok(s),
            _ => Err(self.wrong(i, "String")),
        }
    }

    /// An `IntList` argument, its elements read from their values now.
    pub fn int_list(&self, i: usize) -> KernelResult<SmallVec<[i64; 8]>> {
        match self.slot(i)? {
            Slot::IntList(items) => items
                .iter()
                .map(|&v| match self.value(v as usize)? {
                    Slot::Int(x) => Ok(*x),
                    other => Err(KernelError::invalid(format!(
                        "argument {i}: int list element (value {v}) is {}",
                        other.kind()
                    ))),
                })
                .collect(),
            _ => Err(self.wrong(i, "IntList")),
        }
    }

    /// An optional `IntList`.
    pub fn opt_int_list(&self, i: usize) -> KernelResult<Option<SmallVec<[i64; 8]>>> {
        if self.is_none(i)? {
            Ok(None)
        } else {
            self.int_list(i).map(Some)
        }
    }

    /// A `DoubleList` argument.
    pub fn double_list(&self, i: usize) -> KernelResult<&[f64]> {
        match self.slot(i)? {
            Slot::DoubleList(v) => Ok(v),
            _ => Err(self.wrong(i, "DoubleList")),
        }
    }

    /// A `BoolList` argument.
    pub fn bool_list(&self, i: usize) -> KernelResult<&[bool]> {
        match self.slot(i)? {
            Slot::BoolList(v) => Ok(v),
            _ => Err(self.wrong(i, "BoolList")),
        }
    }

    /// Value index of a tensor argument or list element.
    fn tensor_id(&self, a: Arg) -> KernelResult<usize> {
        match a {
            Arg::At(i) => match self.slot(i)? {
                Slot::Tensor(_) => self.id(i),
                _ => Err(self.wrong(i, "Tensor")),
            },
            Arg::Item(i, j) => {
                let item = match self.slot(i)? {
                    Slot::TensorList(items) => items.get(j).copied(),
                    Slot::OptionalTensorList(items) => items.get(j).copied().flatten(),
                    _ => return Err(self.wrong(i, "TensorList")),
                };
                let id = item.ok_or_else(|| {
                    KernelError::invalid(format!("argument {i}: no tensor at list position {j}"))
                })? as usize;
                match self.value(id)? {
                    Slot::Tensor(_) => Ok(id),
                    other => Err(KernelError::invalid(format!(
                        "argument {i}: list element {j} is {}",
                        other.kind()
                    ))),
                }
            }
        }
    }

    fn tensor_slot(&self, a: Arg) -> KernelResult<&TensorSlot> {
        match self.value(self.tensor_id(a)?)? {
            Slot::Tensor(t) => Ok(t),
            other => Err(KernelError::invalid(format!(
                "{:?} is {}, not a tensor",
                a,
                other.kind()
            ))),
        }
    }

    fn tensor_slot_mut(&mut self, a: Arg) -> KernelResult<&mut TensorSlot> {
        let id = self.tensor_id(a)?;
        match self.values.get_mut(id) {
            Some(Slot::Tensor(t)) => Ok(t),
            _ => Err(KernelError::invalid(format!("{a:?} is not a tensor"))),
        }
    }

    /// Metadata of a tensor argument, owned: it outlives changes to the arguments
    /// (see [`Args::info`] for a view).
    pub fn tensor(&self, a: impl Into<Arg>) -> KernelResult<TensorInfo> {
        self.info(a).cloned()
    }

    /// Metadata of a tensor argument, lent from its slot (no copy of the sizes, for
    /// kernels that read them on every call).
    pub fn info(&self, a: impl Into<Arg>) -> KernelResult<&TensorInfo> {
        Ok(&self.tensor_slot(a.into())?.info)
    }

    /// Metadata of an optional tensor argument.
    pub fn opt_tensor(&self, i: usize) -> KernelResult<Option<TensorInfo>> {
        if self.is_none(i)? {
            Ok(None)
        } else {
            self.tensor(i).map(Some)
        }
    }

    /// Length of a `TensorList` or `OptionalTensorList` argument.
    pub fn list_len(&self, i: usize) -> KernelResult<usize> {
        match self.slot(i)? {
            Slot::TensorList(items) => Ok(items.len()),
            Slot::OptionalTensorList(items) => Ok(items.len()),
            _ => Err(self.wrong(i, "TensorList")),
        }
    }

    /// Element `j` of an `OptionalTensorList` argument (None for absent entries).
    pub fn opt_list_item(&self, i: usize, j: usize) -> KernelResult<Option<TensorInfo>> {
        match self.slot(i)? {
            Slot::OptionalTensorList(items) => match items.get(j) {
                Some(None) => Ok(None),
                Some(Some(_)) => self.tensor(Arg::Item(i, j)).map(Some),
                None => Err(KernelError::invalid(format!(
                    "argument {i}: list has no position {j}"
                ))),
            },
            _ => self.tensor(Arg::Item(i, j)).map(Some),
        }
    }

    /// Gives an output tensor new sizes, within what its declaration allows: the same
    /// rank, and for a static tensor the same sizes, for a dynamic one at most its
    /// serialized number of elements.
    pub fn resize(&mut self, a: impl Into<Arg>, sizes: &[usize]) -> KernelResult {
        let t = self.tensor_slot_mut(a.into())?;
        resize_slot(t, sizes)
    }

    /// Sets a scalar output (a prim op's result). The value takes the scalar's own kind,
    /// whatever scalar kind the program declared (the exporter declares every symbolic
    /// scalar an `Int`, including those holding floats), as upstream's prim ops do.
    pub fn set_scalar(&mut self, i: usize, value: Scalar) -> KernelResult {
        let id = self.id(i)?;
        let slot = self
            .values
            .get_mut(id)
            .ok_or_else(|| KernelError::invalid(format!("value {id} does not exist")))?;
        match slot {
            Slot::Int(_) | Slot::Double(_) | Slot::Bool(_) | Slot::None => {}
            other => {
                return Err(KernelError::invalid(format!(
                    "argument {i} is {}, cannot hold a scalar result",
                    other.kind()
                )))
            }
        }
        *slot = match value {
            Scalar::Int(v) => Slot::Int(v),
            Scalar::Double(v) => Slot::Double(v),
            Scalar::Bool(v) => Slot::Bool(v),
        };
        Ok(())
    }

    /// Makes output `out` a view of `src`'s data with new sizes (same dtype, contiguous,
    /// no more bytes than `src` has).
    pub fn alias(&mut self, out: usize, src: usize, sizes: &[usize]) -> KernelResult {
        let s = self.tensor_slot(Arg::At(src))?;
        let (dtype, held, storage) = (s.info.dtype, s.numel(), s.storage);
        let t = self.tensor_slot_mut(Arg::At(out))?;
        if t.info.dtype != dtype {
            return Err(KernelError::dtypes(&[dtype, t.info.dtype]));
        }
        let numel =
            checked_numel(sizes).ok_or_else(|| KernelError::invalid("view size overflows"))?;
        if numel != held {
            return Err(KernelError::invalid(format!(
                "cannot view {held} elements as {sizes:?}"
            )));
        }
        if sizes.len() != t.info.sizes.len() {
            return Err(KernelError::invalid(format!(
                "view output has rank {}, not {}",
                t.info.sizes.len(),
                sizes.len()
            )));
        }
        t.info.sizes = sizes.into();
        t.info.dim_order = contiguous_dim_order(sizes.len());
        t.storage = storage;
        Ok(())
    }

    fn access(&self, a: Arg) -> KernelResult<Access> {
        Ok(self.tensor_slot(a)?.access())
    }

    /// Bytes of a constant tensor (in the program or its data files, or computed from
    /// constants at load), which stay the same for the life of the method; `None` for any
    /// other tensor.
    pub fn constant(&self, a: impl Into<Arg>) -> KernelResult<Option<&[u8]>> {
        let access = self.access(a.into())?;
        match access.storage {
            Storage::Program { .. } | Storage::External { .. } | Storage::Folded { .. } => {
                self.memory.read(access).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The bytes of a constant tensor stored in the program or a data file, for a
    /// prepared kernel that keeps reading them where they are (instead of a copy);
    /// `None` for any other tensor, constants computed at load among them.
    pub fn shared_constant(&self, a: impl Into<Arg>) -> KernelResult<Option<SharedBytes>> {
        self.memory.shared(self.access(a.into())?)
    }

    /// Gives the pages holding constant tensor `a` in a mapped program or data file back
    /// to the system, for a kernel that has copied it into a layout of its own (packed
    /// weights) and reads it again at most to prepare anew. Otherwise the file's copy
    /// stays resident beside the packed one, about doubling a method's memory. The
    /// bytes do not change: whatever reads them later maps them again from the file.
    /// Does nothing for any other argument, nor for a file read into memory.
    pub fn release_pages(&self, a: impl Into<Arg>) {
        if let Ok(access) = self.access(a.into()) {
            self.memory.release_pages(access, 0..access.nbytes);
        }
    }

    /// [`Self::release_pages`] for `part` of constant tensor `a` alone (a view into
    /// its bytes, such as the slab of a weight packed so far), for a kernel that
    /// gives a large weight's pages back while it packs the rest. Does nothing when
    /// `part` is not a view into `a`'s bytes.
    pub fn release_part(&self, a: impl Into<Arg>, part: &[u8]) {
        let a = a.into();
        let Ok(access) = self.access(a) else {
            return;
        };
        let Ok(bytes) = self.memory.read(access) else {
            return;
        };
        if let Some(range) = crate::memory::range_within(bytes, part) {
            self.memory.release_pages(access, range);
        }
    }

    /// State derived from the constant tensor `a` alone (a packed weight), made by `make`
    /// once while the method loads and shared by every call that asks for the same
    /// `kind` and `variant` of the same constant bytes. `variant` holds whatever else the
    /// state depends on, such as the dimensions the bytes are read with. For a tensor
    /// that is not a constant, or during an execution, `make` runs at every call.
    pub fn derived<T: std::any::Any + Send + Sync>(
        &self,
        a: impl Into<Arg>,
        kind: &'static str,
        variant: u64,
        make: impl FnOnce() -> KernelResult<T>,
    ) -> KernelResult<std::sync::Arc<T>> {
        match (self.derived, self.constant(a)?) {
            (Some(states), Some(bytes)) => states.get_or_make(bytes, kind, variant, make),
            _ => make().map(std::sync::Arc::new),
        }
    }

    /// A shared view of one tensor, for kernels that read some data (an index, a
    /// condition) before deciding on output sizes.
    pub fn read(&self, a: impl Into<Arg>) -> KernelResult<TensorData<'_>> {
        let t = self.tensor_slot(a.into())?;
        let bytes = self.memory.read(t.access())?;
        Ok(TensorData {
            info: &t.info,
            bytes,
        })
    }

    /// Views of the tensors a kernel reads and writes; all must have the default (row
    /// major) dim order.
    pub fn io(&mut self, reads: &[Arg], writes: &[Arg]) -> KernelResult<Io<'_>> {
        self.io_inner(reads, writes, true)
    }

    /// Like [`Args::io`], for kernels that handle any dim order themselves.
    pub fn io_strided(&mut self, reads: &[Arg], writes: &[Arg]) -> KernelResult<Io<'_>> {
        self.io_inner(reads, writes, false)
    }

    /// Like [`Args::io_strided`], for calls of many arguments such as a delegate's,
    /// with views of `R` inputs and `W` outputs held inline (see [`INLINE_READS`]).
    pub fn io_many<const R: usize, const W: usize>(
        &mut self,
        reads: &[Arg],
        writes: &[Arg],
    ) -> KernelResult<Io<'_, R, W>> {
        self.io_inner(reads, writes, false)
    }

    fn io_inner<const R: usize, const W: usize>(
        &mut self,
        reads: &[Arg],
        writes: &[Arg],
        contiguous: bool,
    ) -> KernelResult<Io<'_, R, W>> {
        // Outputs that are not memory-planned get runtime-owned memory on first use.
        for &w in writes {
            let id = self.tensor_id(w)?;
            let Some(Slot::Tensor(t)) = self.values.get_mut(id) else {
                return Err(KernelError::invalid(format!("{w:?} is not a tensor")));
            };
            match t.storage {
                Storage::Null => t.storage = Storage::Heap { owner: id as u32 },
                Storage::Heap { .. } | Storage::Planned { .. } => {}
                Storage::Program { .. } | Storage::External { .. } | Storage::Folded { .. } => {
                    return Err(KernelError::invalid(format!(
                        "{}: a constant tensor cannot be written",
                        self.op
                    )))
                }
            }
            if let Storage::Heap { owner } = t.storage {
                let nbytes = t.nbytes();
                self.memory.grow_heap(owner, nbytes)?;
            }
        }
        // Each argument's metadata (lent to its view) and where its bytes are.
        let values: &[Slot] = self.values;
        let mut infos: SmallVec<[&TensorInfo; R]> = SmallVec::new();
        let mut out_infos: SmallVec<[&TensorInfo; W]> = SmallVec::new();
        let mut read_accesses: SmallVec<[Access; R]> = SmallVec::new();
        let mut write_accesses: SmallVec<[Access; W]> = SmallVec::new();
        for (k, &a) in reads.iter().chain(writes).enumerate() {
            let id = self.tensor_id(a)?;
            let Some(Slot::Tensor(t)) = values.get(id) else {
                return Err(KernelError::invalid(format!("{a:?} is not a tensor")));
            };
            if contiguous && !t.info.is_contiguous() {
                return Err(KernelError::invalid(format!(
                    "{}: tensor with dim order {:?} is not supported (only the default order)",
                    self.op, t.info.dim_order
                )));
            }
            if k < reads.len() {
                infos.push(&t.info);
                read_accesses.push(t.access());
            } else {
                out_infos.push(&t.info);
                write_accesses.push(t.access());
            }
        }
        let borrowed = self
            .memory
            .borrow::<R, W>(&read_accesses, &write_accesses)?;
        let inputs = borrowed
            .reads
            .into_iter()
            .zip(infos)
            .map(|(bytes, info)| TensorData { info, bytes })
            .collect();
        let outputs = borrowed
            .writes
            .into_iter()
            .zip(out_infos)
            .map(|(bytes, info)| TensorDataMut { info, bytes })
            .collect();
        Ok(Io {
            inputs,
            outputs,
            scratch: borrowed.workspace,
        })
    }
}

pub(crate) fn resize_slot(t: &mut TensorSlot, sizes: &[usize]) -> KernelResult {
    if t.info.sizes.as_slice() == sizes {
        return Ok(());
    }
    if sizes.len() != t.info.sizes.len() {
        return Err(KernelError::invalid(format!(
            "cannot resize a rank-{} tensor {:?} to rank {} {sizes:?}",
            t.info.sizes.len(),
            t.info.sizes.as_slice(),
            sizes.len()
        )));
    }
    match t.dynamism {
        Dynamism::Static => Err(KernelError::invalid(format!(
            "the tensor has the static shape {:?}; got {sizes:?}",
            t.info.sizes.as_slice()
        ))),
        Dynamism::Bound => {
            let numel = checked_numel(sizes).unwrap_or(usize::MAX);
            if numel > t.capacity {
                return Err(KernelError::invalid(format!(
                    "shape {sizes:?} has {numel} elements, more than the {} its dynamic bound allows",
                    t.capacity
                )));
            }
            t.info.sizes = sizes.into();
            Ok(())
        }
    }
}

/// Views of a kernel call's data: inputs shared, outputs exclusive, never overlapping;
/// and the method's scratch memory, kept between calls and charged to the method's
/// budget (grow it with [`crate::Buffer::slice_mut`]).
pub struct Io<'a, const R: usize = 8, const W: usize = 4> {
    pub inputs: SmallVec<[TensorData<'a>; R]>,
    pub outputs: SmallVec<[TensorDataMut<'a>; W]>,
    pub scratch: &'a mut crate::Buffer,
}

/// A shared view of a tensor's data.
pub struct TensorData<'a> {
    pub info: &'a TensorInfo,
    bytes: &'a [u8],
}

impl<'a> TensorData<'a> {
    /// The raw bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The elements as `T` (`u8` for bool tensors); errors if `T` is not the dtype.
    pub fn as_slice<T: Element>(&self) -> KernelResult<&'a [T]> {
        check_type::<T>(self.info.dtype)?;
        if self.bytes.is_empty() {
            return Ok(&[]);
        }
        bytemuck::try_cast_slice(self.bytes)
            .map_err(|e| KernelError::Failed(format!("tensor data is misaligned: {e}")))
    }
}

/// An exclusive view of an output tensor's data.
pub struct TensorDataMut<'a> {
    pub info: &'a TensorInfo,
    bytes: &'a mut [u8],
}

impl<'a> TensorDataMut<'a> {
    /// The raw bytes.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.bytes
    }

    /// The elements as `T` (`u8` for bool tensors); errors if `T` is not the dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> KernelResult<&mut [T]> {
        check_type::<T>(self.info.dtype)?;
        if self.bytes.is_empty() {
            return Ok(&mut []);
        }
        bytemuck::try_cast_slice_mut(self.bytes)
            .map_err(|e| KernelError::Failed(format!("tensor data is misaligned: {e}")))
    }

    /// Like [`TensorDataMut::as_mut_slice`], giving up the view.
    pub fn into_slice<T: Element>(self) -> KernelResult<&'a mut [T]> {
        check_type::<T>(self.info.dtype)?;
        if self.bytes.is_empty() {
            return Ok(&mut []);
        }
        bytemuck::try_cast_slice_mut(self.bytes)
            .map_err(|e| KernelError::Failed(format!("tensor data is misaligned: {e}")))
    }

    /// Consumes the view, returning its raw bytes.
    pub fn into_bytes(self) -> &'a mut [u8] {
        self.bytes
    }
}

fn check_type<T: Element>(dtype: DType) -> KernelResult {
    if T::DTYPE == dtype || (dtype == DType::Bool && T::DTYPE == DType::U8) {
        Ok(())
    } else {
        Err(KernelError::invalid(format!(
            "tensor holds {dtype}, read as {}",
            T::DTYPE
        )))
    }
}
