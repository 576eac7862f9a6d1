//! The nodes: each kind checks its values' types and shapes when the delegate loads,
//! captures what it can prepare once (packed weights, requantization scales, lookup
//! tables), infers its output shapes, and computes.
//!
//! Modules by family: [`elementwise`] (unary, binary, clamp, convert, copy, PReLU),
//! [`linear`] (fully connected, batch matrix multiply), [`conv`] (convolutions),
//! [`pool`] (pooling), [`shape`] (transpose, reshape, slice, pad, concatenate, resize),
//! [`attention`] (softmax, scaled dot-product attention).

mod attention;
mod conv;
mod elementwise;
mod linear;
mod pool;
pub(crate) mod quant;
mod shape;
mod weights;

use std::sync::Arc;

use pte_compute::ThreadPool;
use pte_runtime::{DerivedStates, MemoryBudget, MemoryError};

use crate::exec::{Cx, In, Out};
use crate::graph::{Datatype, Dims, Graph, Node, Op, Quant, Value};

/// Why a node cannot be prepared.
#[derive(Debug)]
pub(crate) enum PrepareError {
    /// The node or its values are invalid or unsupported.
    Invalid(String),
    /// Prepared state would exceed the memory budget.
    Memory(MemoryError),
}

impl From<String> for PrepareError {
    fn from(m: String) -> Self {
        PrepareError::Invalid(m)
    }
}

impl From<&str> for PrepareError {
    fn from(m: &str) -> Self {
        PrepareError::Invalid(m.to_owned())
    }
}

impl From<MemoryError> for PrepareError {
    fn from(e: MemoryError) -> Self {
        PrepareError::Memory(e)
    }
}

pub(crate) type PResult<T> = Result<T, PrepareError>;

/// Result of running or reshaping: a message for the caller to place.
pub(crate) type KResult<T = ()> = Result<T, String>;

/// A node prepared to run.
pub(crate) trait Kernel: Send {
    /// Output shapes from input shapes (`None` for absent optional inputs).
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult;
    /// Scratch bytes one run needs for the current shapes on `threads` threads.
    fn scratch_bytes(&self, _threads: usize) -> usize {
        0
    }
    /// Computes the outputs. Inputs the kernel captured at load are `None`.
    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult;
    /// Whether the output is the input's bytes unchanged (a copy or a reshape), so
    /// that it can share the input's memory and the node need not run.
    fn is_view(&self) -> bool {
        false
    }
    /// How the node computes, when it has a choice (a convolution's algorithm), for
    /// profiles.
    fn variant(&self) -> Option<&'static str> {
        None
    }
}

/// A kernel and which of its inputs it captured at load (constant weights), and of
/// those which it reads where the file holds them rather than from a copy.
pub(crate) struct Prepared {
    pub kernel: Box<dyn Kernel>,
    captured: u8,
    in_place: u8,
}

impl Prepared {
    fn new(kernel: impl Kernel + 'static) -> PResult<Prepared> {
        Ok(Prepared {
            kernel: Box::new(kernel),
            captured: 0,
            in_place: 0,
        })
    }

    fn capturing(kernel: impl Kernel + 'static, positions: &[usize]) -> PResult<Prepared> {
        Ok(Prepared {
            kernel: Box::new(kernel),
            captured: positions.iter().fold(0u8, |m, &p| m | (1 << p)),
            in_place: 0,
        })
    }

    /// Marks captured input `pos` as read where the file holds it.
    fn reading_in_place(mut self, pos: usize) -> Self {
        if pos < 8 {
            self.in_place |= 1 << pos;
        }
        self
    }

    /// Whether input `pos` was captured at load (and is not passed at run time).
    pub(crate) fn captures(&self, pos: usize) -> bool {
        pos < 8 && self.captured & (1 << pos) != 0
    }

    /// Whether captured input `pos` is read at run time where the file holds it.
    pub(crate) fn reads_in_place(&self, pos: usize) -> bool {
        pos < 8 && self.in_place & (1 << pos) != 0
    }
}

/// A node and its graph, for preparation.
pub(crate) struct NodeCx<'a> {
    pub node: &'a Node,
    pub graph: &'a Graph,
    pub budget: &'a MemoryBudget,
    /// The method's threads, for packing large weights.
    pub pool: &'a Arc<ThreadPool>,
    /// Weights packed once for every node of the method's delegates that reads them.
    pub derived: &'a DerivedStates,
}

impl<'a> NodeCx<'a> {
    /// Input `pos`, which must be present.
    pub(crate) fn input(&self, pos: usize) -> PResult<&'a Value> {
        self.opt_input(pos)?
            .ok_or_else(|| format!("input {pos} is missing").into())
    }

    /// Input `pos`, if present.
    pub(crate) fn opt_input(&self, pos: usize) -> PResult<Option<&'a Value>> {
        match self.node.inputs.get(pos) {
            Some(Some(i)) => self
                .graph
                .values
                .get(*i)
                .map(Some)
                .ok_or_else(|| "input value out of range".into()),
            _ => Ok(None),
        }
    }

    /// Output `k`.
    pub(crate) fn output(&self, k: usize) -> PResult<&'a Value> {
        self.node
            .outputs
            .get(k)
            .and_then(|&o| self.graph.values.get(o))
            .ok_or_else(|| format!("output {k} is missing").into())
    }

    /// True when every listed value is a float type.
    pub(crate) fn all_float(&self, values: &[&Value]) -> bool {
        values.iter().all(|v| v.dtype.is_float())
    }

    /// The node's output bounds.
    pub(crate) fn bounds(&self) -> PResult<(f32, f32)> {
        let (min, max) = (self.node.min, self.node.max);
        if min.is_nan() || max.is_nan() || min > max {
            return Err(format!("output bounds [{min}, {max}] are invalid").into());
        }
        Ok((min, max))
    }
}

/// The datatype and quantization of a value, for messages.
pub(crate) fn describe(v: &Value) -> String {
    match &v.quant {
        Quant::None => v.dtype.name().to_owned(),
        Quant::PerTensor { scale, zero_point } => {
            format!("{}(scale {scale}, zero point {zero_point})", v.dtype.name())
        }
        _ => v.dtype.name().to_owned(),
    }
}

/// Prepares one node.
pub(crate) fn prepare(
    node: &Node,
    graph: &Graph,
    budget: &MemoryBudget,
    pool: &Arc<ThreadPool>,
    derived: &DerivedStates,
) -> PResult<Prepared> {
    let cx = NodeCx {
        node,
        graph,
        budget,
        pool,
        derived,
    };
    match &node.op {
        Op::Binary(op) => elementwise::binary(&cx, *op),
        Op::Unary(op) => elementwise::unary(&cx, *op),
        Op::PRelu => elementwise::prelu(&cx),
        Op::Convert => elementwise::convert(&cx),
        Op::Copy => shape::copy(&cx),
        Op::Softmax => attention::softmax(&cx),
        Op::ScaledDotProductAttention => attention::sdpa(&cx),
        Op::FullyConnected { transpose_weights } => {
            linear::fully_connected(&cx, *transpose_weights)
        }
        Op::BatchMatrixMultiply { transpose_b } => linear::batch_matmul(&cx, *transpose_b),
        Op::Conv2d(g) => conv::convolution(&cx, g, conv::Kind::Regular),
        Op::DepthwiseConv2d(g) => conv::convolution(&cx, g, conv::Kind::Depthwise),
        Op::ConvTranspose2d(g) => conv::deconvolution(&cx, g),
        Op::MaxPooling2d(g) => pool::max_pooling(&cx, g),
        Op::AvgPooling2d(g) => pool::avg_pooling(&cx, g),
        Op::ArgMaxPooling2d(g) => pool::argmax_pooling(&cx, g),
        Op::GlobalAvgPooling2d { keep_dims } => pool::global_avg_pooling(&cx, *keep_dims),
        Op::StaticTranspose { perm } => shape::transpose(&cx, perm),
        Op::StaticReshape { shape: s } => shape::reshape(&cx, s),
        Op::StaticSlice { offsets, sizes } => shape::slice(&cx, offsets, sizes),
        Op::StaticConstantPad { pre, post, value } => shape::pad(&cx, pre, post, *value),
        Op::StaticResizeBilinear2D {
            height,
            width,
            align_corners,
            legacy,
        } => shape::resize_bilinear(&cx, *height, *width, *align_corners, *legacy),
        Op::Concatenate { axis } => shape::concatenate(&cx, *axis),
    }
}

/// The elements of an f32 value (its first `numel` values of storage).
pub(crate) fn f32s(b: &[u8], numel: usize) -> KResult<&[f32]> {
    bytemuck::try_cast_slice::<u8, f32>(b)
        .map_err(|e| format!("misaligned f32 data: {e}"))?
        .get(..numel)
        .ok_or_else(|| format!("f32 data holds fewer than {numel} elements"))
}

/// The elements of an f32 output.
pub(crate) fn f32s_mut(b: &mut [u8], numel: usize) -> KResult<&mut [f32]> {
    bytemuck::try_cast_slice_mut::<u8, f32>(b)
        .map_err(|e| format!("misaligned f32 data: {e}"))?
        .get_mut(..numel)
        .ok_or_else(|| format!("f32 data holds fewer than {numel} elements"))
}

/// The elements of an i32 output.
pub(crate) fn i32s_mut(b: &mut [u8], numel: usize) -> KResult<&mut [i32]> {
    bytemuck::try_cast_slice_mut::<u8, i32>(b)
        .map_err(|e| format!("misaligned i32 data: {e}"))?
        .get_mut(..numel)
        .ok_or_else(|| format!("i32 data holds fewer than {numel} elements"))
}

/// The first `n` bytes.
pub(crate) fn bytes(b: &[u8], n: usize) -> KResult<&[u8]> {
    b.get(..n)
        .ok_or_else(|| format!("data holds fewer than {n} bytes"))
}

/// The first `n` bytes of an output.
pub(crate) fn bytes_mut(b: &mut [u8], n: usize) -> KResult<&mut [u8]> {
    b.get_mut(..n)
        .ok_or_else(|| format!("data holds fewer than {n} bytes"))
}

/// Number of elements of dims, `usize::MAX` when that overflows (shapes are checked
/// when memory is planned, after the nodes reshape).
pub(crate) fn numel(dims: &[usize]) -> usize {
    // Saturating: a count no buffer can hold fails the length checks that follow.
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .unwrap_or(usize::MAX)
}

/// Input `pos` at run time.
pub(crate) fn arg<'a, 'b>(inputs: &'b [Option<In<'a>>], pos: usize) -> KResult<&'b In<'a>> {
    inputs
        .get(pos)
        .and_then(Option::as_ref)
        .ok_or_else(|| format!("input {pos} is missing"))
}

/// Shape of input `pos` at reshape time.
pub(crate) fn shape_of<'a>(inputs: &[Option<&'a [usize]>], pos: usize) -> KResult<&'a [usize]> {
    inputs
        .get(pos)
        .copied()
        .flatten()
        .ok_or_else(|| format!("input {pos} has no shape"))
}

/// Sets output `k`'s shape.
pub(crate) fn set_shape(outputs: &mut [Dims], k: usize, dims: &[usize]) -> KResult {
    let o = outputs.get_mut(k).ok_or("output missing")?;
    *o = dims.iter().copied().collect();
    Ok(())
}

/// The storage datatype family of a value, for matching kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    Float,
    QInt8,
    QUInt8,
    Other(Datatype),
}

pub(crate) fn family(v: &Value) -> Family {
    match v.dtype {
        d if d.is_float() => Family::Float,
        Datatype::QInt8 => Family::QInt8,
        Datatype::QUInt8 => Family::QUInt8,
        d => Family::Other(d),
    }
}
