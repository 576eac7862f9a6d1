//! Values: the public owned [`EValue`], and the method's internal value slots.

use crate::args::TensorInfo;
use crate::memory::{Access, Storage};
use crate::tensor::Tensor;

/// A value of any kind the program schema has, owned. Method inputs and outputs are
/// EValues.
#[derive(Clone, Debug)]
pub enum EValue {
    None,
    Int(i64),
    Double(f64),
    Bool(bool),
    String(String),
    Tensor(Tensor),
    IntList(Vec<i64>),
    DoubleList(Vec<f64>),
    BoolList(Vec<bool>),
    TensorList(Vec<Tensor>),
    OptionalTensorList(Vec<Option<Tensor>>),
}

impl EValue {
    /// The kind's name, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            EValue::None => "None",
            EValue::Int(_) => "Int",
            EValue::Double(_) => "Double",
            EValue::Bool(_) => "Bool",
            EValue::String(_) => "String",
            EValue::Tensor(_) => "Tensor",
            EValue::IntList(_) => "IntList",
            EValue::DoubleList(_) => "DoubleList",
            EValue::BoolList(_) => "BoolList",
            EValue::TensorList(_) => "TensorList",
            EValue::OptionalTensorList(_) => "OptionalTensorList",
        }
    }

    /// The tensor, if this is one.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            EValue::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

impl From<Tensor> for EValue {
    fn from(t: Tensor) -> Self {
        EValue::Tensor(t)
    }
}

/// How a tensor's shape may change at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dynamism {
    /// The shape never changes.
    Static,
    /// Any shape of the same rank with at most as many elements as the serialized one.
    Bound,
}

/// A tensor value of a loaded method: metadata plus where its bytes are.
#[derive(Clone, Debug)]
pub(crate) struct TensorSlot {
    /// Dtype, sizes and dim order: lent as they are to the kernels' views.
    pub info: TensorInfo,
    pub dynamism: Dynamism,
    /// Most elements the tensor may hold (the serialized shape's element count).
    pub capacity: usize,
    pub storage: Storage,
}

impl TensorSlot {
    pub(crate) fn numel(&self) -> usize {
        self.info.numel()
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.info.nbytes()
    }

    /// Where all of the tensor's bytes are.
    pub(crate) fn access(&self) -> Access {
        Access {
            storage: self.storage,
            nbytes: self.nbytes(),
        }
    }
}

/// One value of a loaded method. Lists hold value indices, as the program does, so that
/// they see values computed at run time.
#[derive(Clone, Debug)]
pub(crate) enum Slot {
    None,
    Int(i64),
    Double(f64),
    Bool(bool),
    String(Box<str>),
    Tensor(TensorSlot),
    IntList(Box<[u32]>),
    DoubleList(Box<[f64]>),
    BoolList(Box<[bool]>),
    TensorList(Box<[u32]>),
    OptionalTensorList(Box<[Option<u32>]>),
}

impl Slot {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Slot::None => "None",
            Slot::Int(_) => "Int",
            Slot::Double(_) => "Double",
            Slot::Bool(_) => "Bool",
            Slot::String(_) => "String",
            Slot::Tensor(_) => "Tensor",
            Slot::IntList(_) => "IntList",
            Slot::DoubleList(_) => "DoubleList",
            Slot::BoolList(_) => "BoolList",
            Slot::TensorList(_) => "TensorList",
            Slot::OptionalTensorList(_) => "OptionalTensorList",
        }
    }
}
