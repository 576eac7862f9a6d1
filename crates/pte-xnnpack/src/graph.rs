//! The XNNGraph read into a validated model: values with their types, shapes,
//! quantization and constant bytes, and nodes with their parameters and value indices.
//!
//! [`Graph::parse`] reads every field it uses once, through planus's checked accessors,
//! and checks everything a later stage relies on: ids resolve, each value is produced
//! once and before it is read, shapes fit `XNN_MAX_TENSOR_DIMS` and do not overflow,
//! quantization parameters are what XNNPACK accepts, and constants have exactly the bytes
//! their tensors need. The work is bounded by a budget proportional to the payload size
//! (a flatbuffer may share one large vector between many tables).

use std::collections::HashMap;
use std::ops::Range;

use planus::ReadAsRoot;
use pte_compute::elementwise::Activation;
use pte_runtime::{NamedData, SharedBytes};
use smallvec::SmallVec;

use crate::error::{fb, fb_at, Result, XnnError};
use crate::payload;
use crate::schema::fb_xnnpack as x;

/// Most dimensions a value may have (XNNPACK's `XNN_MAX_TENSOR_DIMS`).
pub const MAX_DIMS: usize = 6;
/// Most external ids (upstream's runtime refuses more).
const MAX_EXTERNS: u32 = 4096;
/// The id meaning "no value" (XNNPACK's `XNN_INVALID_VALUE_ID`).
pub const INVALID_ID: u32 = u32::MAX;
/// Value flag bits: an input of the graph, an output of the graph.
const FLAG_INPUT: u32 = 1;
const FLAG_OUTPUT: u32 = 2;

/// Dimensions of a value, outermost first.
pub type Dims = SmallVec<[usize; MAX_DIMS]>;

/// Element types of values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Datatype {
    F32,
    F16,
    Bf16,
    /// int8, one scale and zero point.
    QInt8,
    /// uint8, one scale and zero point.
    QUInt8,
    /// int32, one scale (biases).
    QInt32,
    /// int8, one scale per channel.
    QcInt8,
    /// int32, one scale per channel (biases).
    QcInt32,
    /// 4-bit, one scale per channel, two values per byte along the last dimension.
    QcInt4,
    /// int8 quantized at run time with per-row parameters.
    QdInt8,
    /// 4-bit, one scale per block of the last dimension.
    QbInt4,
    Int32,
}

impl Datatype {
    fn from_schema(d: x::XnnDatatype) -> Option<Datatype> {
        use x::XnnDatatype as D;
        Some(match d {
            D::XnnDatatypeFp32 => Datatype::F32,
            D::XnnDatatypeFp16 => Datatype::F16,
            D::XnnDatatypeBf16 => Datatype::Bf16,
            D::XnnDatatypeQint8 => Datatype::QInt8,
            D::XnnDatatypeQuint8 => Datatype::QUInt8,
            D::XnnDatatypeQint32 => Datatype::QInt32,
            D::XnnDatatypeQcint8 => Datatype::QcInt8,
            D::XnnDatatypeQcint32 => Datatype::QcInt32,
            D::XnnDatatypeQcint4 => Datatype::QcInt4,
            D::XnnDatatypeQdint8 => Datatype::QdInt8,
            D::XnnDatatypeQbint4 => Datatype::QbInt4,
            D::XnnDatatypeInt32 => Datatype::Int32,
            D::XnnDatatypeInvalid | D::XnnDatatypeQpint8 | D::XnnDatatypePfp32 => return None,
        })
    }

    /// Upstream's name (without the `xnn_datatype_` prefix).
    pub fn name(self) -> &'static str {
        match self {
            Datatype::F32 => "fp32",
            Datatype::F16 => "fp16",
            Datatype::Bf16 => "bf16",
            Datatype::QInt8 => "qint8",
            Datatype::QUInt8 => "quint8",
            Datatype::QInt32 => "qint32",
            Datatype::QcInt8 => "qcint8",
            Datatype::QcInt32 => "qcint32",
            Datatype::QcInt4 => "qcint4",
            Datatype::QdInt8 => "qdint8",
            Datatype::QbInt4 => "qbint4",
            Datatype::Int32 => "int32",
        }
    }

    /// True for the floating-point types (computed in f32 here).
    pub fn is_float(self) -> bool {
        matches!(self, Datatype::F32 | Datatype::F16 | Datatype::Bf16)
    }

    /// Bytes of a constant of these dimensions as upstream serializes it (4-bit types
    /// pack two values per byte along the last dimension, rows padded to whole bytes).
    pub fn constant_bytes(self, dims: &[usize]) -> Option<usize> {
        match self {
            Datatype::QcInt4 | Datatype::QbInt4 => {
                let (last, rows) = dims.split_last().map_or((1, &[][..]), |(l, r)| (*l, r));
                checked_numel(rows)?.checked_mul(last.div_ceil(2))
            }
            d => checked_numel(dims)?.checked_mul(d.element_bytes()),
        }
    }

    /// Bytes per element of a serialized constant (4-bit types: 1, see
    /// [`Datatype::constant_bytes`]).
    pub fn element_bytes(self) -> usize {
        match self {
            Datatype::F32 | Datatype::QInt32 | Datatype::QcInt32 | Datatype::Int32 => 4,
            Datatype::F16 | Datatype::Bf16 => 2,
            Datatype::QInt8
            | Datatype::QUInt8
            | Datatype::QcInt8
            | Datatype::QdInt8
            | Datatype::QcInt4
            | Datatype::QbInt4 => 1,
        }
    }
}

/// Number of elements, `None` on overflow.
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// Quantization parameters of a value.
#[derive(Clone, Debug, PartialEq)]
pub enum Quant {
    /// Not quantized.
    None,
    /// One scale and zero point.
    PerTensor { scale: f32, zero_point: i32 },
    /// One scale per index of `channel_dim` (zero point 0, or 8 for 4-bit).
    PerChannel {
        scales: Vec<f32>,
        channel_dim: usize,
    },
    /// Parameters computed per row at run time; rows are the first
    /// `rank - nonbatch_dims` dimensions.
    PerToken { nonbatch_dims: usize },
    /// One scale per block of `block` input channels of each output channel.
    Blockwise {
        scales: Vec<f32>,
        channel_dim: usize,
        block: usize,
    },
}

/// Bytes of one constant, kept where the program or data file holds them (absent
/// when the graph was only read for a summary).
#[derive(Clone, Debug)]
pub struct Constant {
    bytes: Option<SharedBytes>,
    range: Range<usize>,
}

impl Constant {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
            .as_ref()
            .and_then(|b| b.get(self.range.clone()))
            .unwrap_or_default()
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Gives the pages holding the bytes in a mapped file back to the system, once a
    /// kernel holds its own copy (see [`SharedBytes::release_pages`]).
    pub fn release_pages(&self) {
        if let Some(b) = &self.bytes {
            b.release_pages(self.range.clone());
        }
    }

    /// [`Self::release_pages`] for `part` of the bytes alone (a view into them, such
    /// as the slab of a weight packed so far); nothing when `part` is not one.
    pub fn release_part(&self, part: &[u8]) {
        let (Some(b), bytes) = (&self.bytes, self.bytes()) else {
            return;
        };
        if let Some(r) = pte_runtime::range_within(bytes, part) {
            let at = self.range.start;
            b.release_pages(at.saturating_add(r.start)..at.saturating_add(r.end));
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

/// One value of the graph.
#[derive(Clone, Debug)]
pub struct Value {
    /// The id nodes name it by (`id_out`).
    pub id: u32,
    pub dtype: Datatype,
    pub dims: Dims,
    pub quant: Quant,
    /// Constant bytes, for weights and other constants.
    pub data: Option<Constant>,
    /// The position in the delegate call's arguments, for graph inputs and outputs.
    pub external: Option<u32>,
    pub is_input: bool,
    pub is_output: bool,
}

impl Value {
    /// Zero point and scale of a per-tensor quantized value.
    pub fn per_tensor(&self) -> Option<(f32, i32)> {
        match self.quant {
            Quant::PerTensor { scale, zero_point } => Some((scale, zero_point)),
            _ => None,
        }
    }
}

/// Binary elementwise operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Subtract,
    Multiply,
    Divide,
    Minimum,
    Maximum,
}

/// Unary elementwise operations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Abs,
    Negate,
    Square,
    SquareRoot,
    ReciprocalSquareRoot,
    Floor,
    Ceiling,
    Exp,
    Log,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Gelu,
    Hardswish,
    Elu {
        alpha: f32,
    },
    LeakyRelu {
        slope: f32,
    },
    /// Only the node's output bounds.
    Clamp,
    /// `x · sigmoid(x)`: not a schema node, the fusion of a sigmoid and a product.
    Silu,
}

/// Geometry of a 2-D convolution (regular, depthwise or transposed), NHWC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Top, right, bottom, left.
    pub padding: [u32; 4],
    pub kernel: [u32; 2],
    /// Stride (subsampling; upsampling for a transposed convolution).
    pub stride: [u32; 2],
    pub dilation: [u32; 2],
    pub groups: u32,
    pub group_input_channels: u32,
    pub group_output_channels: u32,
    /// Extra output rows and columns of a transposed convolution.
    pub adjustment: [u32; 2],
}

/// Geometry of a 2-D pooling, NHWC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolGeometry {
    /// Top, right, bottom, left.
    pub padding: [u32; 4],
    pub window: [u32; 2],
    pub stride: [u32; 2],
    pub dilation: [u32; 2],
}

/// What a node computes.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Binary(BinaryOp),
    Unary(UnaryOp),
    PRelu,
    Softmax,
    Convert,
    Copy,
    FullyConnected {
        transpose_weights: bool,
    },
    Conv2d(ConvGeometry),
    DepthwiseConv2d(ConvGeometry),
    ConvTranspose2d(ConvGeometry),
    MaxPooling2d(PoolGeometry),
    AvgPooling2d(PoolGeometry),
    ArgMaxPooling2d(PoolGeometry),
    GlobalAvgPooling2d {
        keep_dims: bool,
    },
    StaticTranspose {
        perm: Dims,
    },
    StaticReshape {
        shape: Dims,
    },
    StaticSlice {
        offsets: Dims,
        sizes: Dims,
    },
    StaticConstantPad {
        pre: Dims,
        post: Dims,
        value: f32,
    },
    StaticResizeBilinear2D {
        height: usize,
        width: usize,
        align_corners: bool,
        legacy: bool,
    },
    Concatenate {
        axis: usize,
    },
    BatchMatrixMultiply {
        transpose_b: bool,
    },
    ScaledDotProductAttention,
}

/// One node: the operation, the values it reads and writes (indices into
/// [`Graph::values`]; an absent optional input is `None`), and its output bounds.
#[derive(Clone, Debug)]
pub struct Node {
    pub op: Op,
    /// The schema's name of the node kind (`Conv2d`, `Add`, ...).
    pub kind: &'static str,
    pub debug_handle: u32,
    pub inputs: SmallVec<[Option<usize>; 5]>,
    pub outputs: SmallVec<[usize; 2]>,
    pub min: f32,
    pub max: f32,
    /// The schema's flags field.
    pub flags: u32,
    /// An activation (SiLU, hardswish) fused into the node's output (see `fuse.rs`).
    pub fused: Option<Activation>,
    /// On a depthwise convolution: the pointwise convolutions (and residual addition)
    /// fused around it (see `fuse.rs`).
    pub chain: Option<Box<Chain>>,
}

/// The nodes fused with a depthwise convolution into one band-by-band chain: the
/// node then reads the expansion's input (or its own) and a residual (input 3), and
/// writes the last fused node's output.
#[derive(Clone, Debug)]
pub struct Chain {
    /// A 1×1 convolution producing the depthwise node's input.
    pub expand: Option<Node>,
    /// A 1×1 convolution reading its output.
    pub project: Option<Node>,
    /// The bounds of an addition of the projection's output and input 3.
    pub residual: Option<(f32, f32)>,
}

/// A validated XNNGraph.
#[derive(Clone, Debug)]
pub struct Graph {
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    /// Number of external ids the call provides (inputs, then outputs).
    pub num_externs: u32,
    /// Values that are graph inputs and outputs, by value index.
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
    /// Whether the payload had an `XH00` header, and its flatbuffer identifier.
    pub has_header: bool,
    pub identifier: [u8; 4],
    /// Bytes of constant data the graph's values reference.
    pub constant_bytes: u64,
}

/// Bounds the parsing work by the payload size.
struct Work {
    left: u64,
    limit: u64,
}

impl Work {
    fn new(len: usize) -> Self {
        let limit = (len as u64).saturating_mul(8).max(1 << 20);
        Work { left: limit, limit }
    }

    fn charge(&mut self, units: usize) -> Result<()> {
        self.left = self
            .left
            .checked_sub(units as u64)
            .ok_or(XnnError::TooComplex(self.limit))?;
        Ok(())
    }
}

/// Where constants come from: the payload's constant region and the named data; both
/// absent when only a summary is wanted.
struct Sources<'a> {
    payload: &'a [u8],
    keep: Option<(&'a SharedBytes, &'a dyn NamedData)>,
    region: Range<usize>,
}

impl Graph {
    /// Parses and validates a payload. `named` resolves constant data stored by key.
    pub fn parse(payload: &SharedBytes, named: &dyn NamedData) -> Result<Graph> {
        Self::parse_from(payload, Some((payload, named)))
    }

    /// Parses and validates a payload without resolving its constants (their sizes are
    /// checked as the entries state them): what `pte inspect` shows.
    pub fn summary(payload: &[u8]) -> Result<Graph> {
        Self::parse_from(payload, None)
    }

    fn parse_from(payload: &[u8], keep: Option<(&SharedBytes, &dyn NamedData)>) -> Result<Graph> {
        let layout = payload::layout(payload)?;
        let (fb_off, fb_len) = layout.flatbuffer;
        let flat = payload.get(fb_off..fb_off + fb_len).unwrap_or_default();
        let mut identifier = [0u8; 4];
        identifier.copy_from_slice(flat.get(4..8).unwrap_or(b"????"));
        let root = x::XnnGraphRef::read_as_root(flat).map_err(fb("XNNGraph"))?;
        let mut work = Work::new(payload.len());
        let sources = Sources {
            payload,
            keep,
            region: layout.constants.0..layout.constants.0 + layout.constants.1,
        };
        let num_externs = root.num_externs().map_err(fb("XNNGraph.num_externs"))?;
        if num_externs > MAX_EXTERNS {
            return Err(XnnError::graph(format!(
                "num_externs {num_externs} exceeds {MAX_EXTERNS}"
            )));
        }
        let constants = Constants::read(&root, &sources, &mut work)?;
        let xvalues = root
            .xvalues()
            .map_err(fb("XNNGraph.xvalues"))?
            .ok_or_else(|| XnnError::graph("xvalues is missing"))?;
        let mut values = Vec::new();
        let mut ids: HashMap<u32, usize> = HashMap::new();
        let mut extra_nodes = Vec::new();
        for (i, v) in xvalues.iter().enumerate() {
            work.charge(16)?;
            let v = v.map_err(fb_at(|| format!("xvalues[{i}]")))?;
            let parsed = read_value(v, i, &constants, &mut work)?;
            if parsed.dq {
                // Old payloads: an fp32 input quantized at run time. Its id names the
                // quantized value; the float input gets an id of its own.
                let float = parsed.value;
                let quantized = Value {
                    id: float.id,
                    dtype: Datatype::QdInt8,
                    dims: float.dims.clone(),
                    quant: Quant::PerToken { nonbatch_dims: 1 },
                    data: None,
                    external: None,
                    is_input: false,
                    is_output: false,
                };
                let float_index = values.len();
                values.push(Value {
                    id: INVALID_ID,
                    ..float
                });
                insert_id(&mut ids, quantized.id, values.len())?;
                values.push(quantized);
                extra_nodes.push(Node {
                    op: Op::Convert,
                    kind: "Convert",
                    debug_handle: 0,
                    inputs: [Some(float_index)].into_iter().collect(),
                    outputs: [values.len() - 1].into_iter().collect(),
                    min: f32::NEG_INFINITY,
                    max: f32::INFINITY,
                    flags: 0,
                    fused: None,
                    chain: None,
                });
            } else {
                insert_id(&mut ids, parsed.value.id, values.len())?;
                values.push(parsed.value);
            }
        }
        let xnodes = root
            .xnodes()
            .map_err(fb("XNNGraph.xnodes"))?
            .ok_or_else(|| XnnError::graph("xnodes is missing"))?;
        let mut nodes = extra_nodes;
        for (i, n) in xnodes.iter().enumerate() {
            work.charge(16)?;
            let n = n.map_err(fb_at(|| format!("xnodes[{i}]")))?;
            nodes.push(read_node(n, i, &ids, &mut work)?);
        }
        let mut graph = Graph {
            values,
            nodes,
            num_externs,
            inputs: Vec::new(),
            outputs: Vec::new(),
            has_header: layout.has_header,
            identifier,
            constant_bytes: constants.total,
        };
        graph.check_structure()?;
        Ok(graph)
    }

    /// Checks externals and the order of production and use.
    fn check_structure(&mut self) -> Result<()> {
        let mut seen_ext: HashMap<u32, usize> = HashMap::new();
        for (i, v) in self.values.iter().enumerate() {
            let Some(ext) = v.external else { continue };
            if ext >= self.num_externs {
                return Err(XnnError::value(
                    v.id,
                    format!(
                        "external id {ext} is not below num_externs {}",
                        self.num_externs
                    ),
                ));
            }
            if let Some(&other) = seen_ext.get(&ext) {
                return Err(XnnError::value(
                    v.id,
                    format!(
                        "external id {ext} is also used by value {}",
                        self.values.get(other).map_or(0, |o| o.id)
                    ),
                ));
            }
            seen_ext.insert(ext, i);
            if v.is_input {
                self.inputs.push(i);
            } else {
                self.outputs.push(i);
            }
        }
        // Each value is produced at most once, by a node that comes before its readers;
        // graph inputs and constants are never written.
        let mut produced = vec![false; self.values.len()];
        for (n, node) in self.nodes.iter().enumerate() {
            let fail = |message: String| XnnError::Node {
                index: n,
                kind: node.kind,
                debug_handle: node.debug_handle,
                message,
            };
            for &i in node.inputs.iter().flatten() {
                let v = self.values.get(i).ok_or_else(|| fail("bad input".into()))?;
                if !(v.is_input || v.data.is_some() || produced.get(i) == Some(&true)) {
                    return Err(fail(format!(
                        "reads value {} before any node produced it",
                        v.id
                    )));
                }
            }
            for &o in &node.outputs {
                let v = self
                    .values
                    .get(o)
                    .ok_or_else(|| fail("bad output".into()))?;
                if v.is_input || v.data.is_some() {
                    return Err(fail(format!(
                        "writes value {}, which is a graph input or a constant",
                        v.id
                    )));
                }
                if node.inputs.contains(&Some(o)) {
                    return Err(fail(format!("reads and writes value {}", v.id)));
                }
                match produced.get_mut(o) {
                    Some(p) if !*p => *p = true,
                    _ => {
                        return Err(fail(format!(
                            "writes value {}, which another node already produced",
                            v.id
                        )))
                    }
                }
            }
        }
        for &o in &self.outputs {
            if produced.get(o) != Some(&true) {
                let id = self.values.get(o).map_or(0, |v| v.id);
                return Err(XnnError::value(id, "is a graph output no node produces"));
            }
        }
        Ok(())
    }
}

fn insert_id(ids: &mut HashMap<u32, usize>, id: u32, index: usize) -> Result<()> {
    if id == INVALID_ID {
        return Err(XnnError::value(id, "id_out is the invalid id 0xFFFFFFFF"));
    }
    if ids.insert(id, index).is_some() {
        return Err(XnnError::value(id, "id_out is used by two values"));
    }
    Ok(())
}

/// The constant entries, resolved to bytes once.
struct Constants {
    entries: Vec<Option<Constant>>,
    total: u64,
}

impl Constants {
    fn read(root: &x::XnnGraphRef<'_>, src: &Sources<'_>, work: &mut Work) -> Result<Constants> {
        let mut entries = Vec::new();
        let mut total = 0u64;
        if let Some(list) = root.constant_data().map_err(fb("XNNGraph.constant_data"))? {
            for (i, e) in list.iter().enumerate() {
                work.charge(8)?;
                let index = i as u32;
                let bad = |message: String| XnnError::Constant { index, message };
                let e = e.map_err(|err| bad(err.to_string()))?;
                if i == 0 {
                    // Entry 0 is reserved ("not a constant").
                    entries.push(None);
                    continue;
                }
                let size = e.size().map_err(|err| bad(err.to_string()))?;
                let key = e.named_key().map_err(|err| bad(err.to_string()))?;
                let c = match key {
                    Some(key) => {
                        work.charge(key.len())?;
                        match src.keep {
                            Some((_, named)) => {
                                let bytes = named.get(key).ok_or_else(|| {
                                    bad(format!(
                                        "named data {key:?} is in neither the program nor its \
                                         data files (load the .ptd file that holds it)"
                                    ))
                                })?;
                                let size = usize::try_from(size)
                                    .ok()
                                    .filter(|&s| s <= bytes.len())
                                    .ok_or_else(|| {
                                        bad(format!(
                                            "size {size} exceeds the {} bytes stored under {key:?}",
                                            bytes.len()
                                        ))
                                    })?;
                                Constant {
                                    bytes: Some(bytes),
                                    range: 0..size,
                                }
                            }
                            None => Constant {
                                bytes: None,
                                range: 0..usize::try_from(size).unwrap_or(usize::MAX),
                            },
                        }
                    }
                    None => {
                        let offset = e.offset().map_err(|err| bad(err.to_string()))?;
                        let region = src.region.len() as u64;
                        if offset > region || size > region - offset {
                            return Err(bad(format!(
                                "{offset}..+{size} lies outside the {region}-byte constant region"
                            )));
                        }
                        let start = src.region.start + offset as usize;
                        Constant {
                            bytes: src.keep.map(|(p, _)| p.clone()),
                            range: start..start + size as usize,
                        }
                    }
                };
                total = total.saturating_add(c.range.len() as u64);
                entries.push(Some(c));
            }
        } else if let Some(list) = root
            .constant_buffer()
            .map_err(fb("XNNGraph.constant_buffer"))?
        {
            // Oldest payloads: bytes inline in the flatbuffer.
            for (i, b) in list.iter().enumerate() {
                work.charge(8)?;
                let index = i as u32;
                let bad = |message: String| XnnError::Constant { index, message };
                if i == 0 {
                    entries.push(None);
                    continue;
                }
                let storage = b
                    .map_err(|err| bad(err.to_string()))?
                    .storage()
                    .map_err(|err| bad(err.to_string()))?
                    .unwrap_or_default();
                let start = (storage.as_ptr() as usize)
                    .checked_sub(src.payload.as_ptr() as usize)
                    .filter(|s| s + storage.len() <= src.payload.len())
                    .ok_or_else(|| bad("storage lies outside the payload".into()))?;
                total = total.saturating_add(storage.len() as u64);
                entries.push(Some(Constant {
                    bytes: src.keep.map(|(p, _)| p.clone()),
                    range: start..start + storage.len(),
                }));
            }
        }
        Ok(Constants { entries, total })
    }

    fn get(&self, index: u32, value: u32) -> Result<&Constant> {
        self.entries
            .get(index as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                XnnError::value(
                    value,
                    format!(
                        "constant index {index} names no constant entry ({} entries)",
                        self.entries.len()
                    ),
                )
            })
    }
}

struct Parsed {
    value: Value,
    /// Old payloads' `dq_datatype = qint8`: quantize this float input at run time.
    dq: bool,
}

fn read_value(
    v: x::XValueRef<'_>,
    index: usize,
    constants: &Constants,
    work: &mut Work,
) -> Result<Parsed> {
    let at = |what: &str| format!("xvalues[{index}].{what}");
    let (tensor, quant) = match v
        .xvalue_union()
        .map_err(fb_at(|| at("xvalue_union")))?
        .ok_or_else(|| XnnError::graph(format!("{} is missing", at("xvalue_union"))))?
    {
        x::XValueUnionRef::XnnTensorValue(t) => (t, None),
        x::XValueUnionRef::XnnQuantizedTensorValue(q) => (
            q.tensor_value()
                .map_err(fb_at(|| at("tensor_value")))?
                .ok_or_else(|| XnnError::graph(format!("{} is missing", at("tensor_value"))))?,
            Some(
                q.quant_params()
                    .map_err(fb_at(|| at("quant_params")))?
                    .ok_or_else(|| XnnError::graph(format!("{} is missing", at("quant_params"))))?,
            ),
        ),
    };
    let id = tensor.id_out().map_err(fb_at(|| at("id_out")))?;
    let err = |m: String| XnnError::value(id, m);
    let raw_dtype = tensor.datatype().map_err(fb_at(|| at("datatype")))?;
    let dtype = Datatype::from_schema(raw_dtype)
        .ok_or_else(|| err(format!("datatype {raw_dtype:?} is not supported")))?;
    let flags = tensor.flags().map_err(fb_at(|| at("flags")))?;
    if flags & !(FLAG_INPUT | FLAG_OUTPUT) != 0 {
        return Err(err(format!("unsupported flag bits {flags:#x}")));
    }
    if flags == FLAG_INPUT | FLAG_OUTPUT {
        return Err(err(
            "is flagged both a graph input and a graph output".into()
        ));
    }
    let dims_vec = tensor.dims().map_err(fb_at(|| at("dims")))?;
    let num_dims = tensor.num_dims().map_err(fb_at(|| at("num_dims")))? as usize;
    let n = dims_vec.map_or(0, |d| d.len());
    if n > MAX_DIMS {
        return Err(err(format!("has {n} dimensions, more than {MAX_DIMS}")));
    }
    if n != num_dims {
        return Err(err(format!(
            "num_dims is {num_dims} but dims has {n} entries"
        )));
    }
    work.charge(n)?;
    let dims: Dims = dims_vec.into_iter().flatten().map(|d| d as usize).collect();
    let numel = checked_numel(&dims)
        .filter(|&n| n <= isize::MAX as usize / 8)
        .ok_or_else(|| err(format!("dims {dims:?} overflow")))?;
    let cidx = tensor
        .constant_buffer_idx()
        .map_err(fb_at(|| at("constant_buffer_idx")))?;
    let data = if cidx == 0 {
        None
    } else {
        Some(constants.get(cidx, id)?.clone())
    };
    let external = tensor.external_id().map_err(fb_at(|| at("external_id")))?;
    let (is_input, is_output) = (flags & FLAG_INPUT != 0, flags & FLAG_OUTPUT != 0);
    if (is_input || is_output) != (external != INVALID_ID) {
        return Err(err(format!(
            "external id {external:#x} does not agree with flags {flags:#x}"
        )));
    }
    if data.is_some() && (is_input || is_output) {
        return Err(err("is a constant and a graph input or output".into()));
    }
    let dq_raw = tensor.dq_datatype().map_err(fb_at(|| at("dq_datatype")))?;
    let dq = dq_raw != x::XnnDatatype::XnnDatatypeInvalid;
    if dq {
        if dq_raw != x::XnnDatatype::XnnDatatypeQint8 {
            return Err(err(format!(
                "dq_datatype {dq_raw:?}: only qint8 is supported"
            )));
        }
        if !is_input || quant.is_some() || !dtype.is_float() {
            return Err(err(
                "dq_datatype is set on something other than a float graph input".into(),
            ));
        }
    }
    let quant = match quant {
        None => {
            if !(dtype.is_float() || dtype == Datatype::Int32) {
                return Err(err(format!(
                    "{} needs quantization parameters",
                    dtype.name()
                )));
            }
            Quant::None
        }
        Some(q) => read_quant(q, dtype, &dims, id, constants, work)?,
    };
    if let Some(c) = &data {
        let want = dtype
            .constant_bytes(&dims)
            .ok_or_else(|| err("constant size overflows".into()))?;
        if c.len() != want {
            return Err(err(format!(
                "constant has {} bytes, but a {} tensor of dims {dims:?} needs {want}",
                c.len(),
                dtype.name()
            )));
        }
    } else if matches!(
        dtype,
        Datatype::QcInt4 | Datatype::QbInt4 | Datatype::QInt32 | Datatype::QcInt32
    ) {
        return Err(err(format!("{} values must be constants", dtype.name())));
    }
    let _ = numel;
    Ok(Parsed {
        value: Value {
            id,
            dtype,
            dims,
            quant,
            data,
            external: (external != INVALID_ID).then_some(external),
            is_input,
            is_output,
        },
        dq,
    })
}

fn check_scale(s: f32, id: u32, what: &str) -> Result<()> {
    if s.is_normal() && s > 0.0 {
        Ok(())
    } else {
        Err(XnnError::value(
            id,
            format!("{what} {s} is not finite, normal and positive"),
        ))
    }
}

/// Reads `n` little-endian scales from a constant of 4 (f32) or 2 (bf16) bytes each.
fn constant_scales(
    constants: &Constants,
    index: u32,
    n: usize,
    bf16: bool,
    id: u32,
) -> Result<Vec<f32>> {
    let c = constants.get(index, id)?;
    let width = if bf16 { 2 } else { 4 };
    if c.len() != n * width {
        return Err(XnnError::value(
            id,
            format!(
                "scale constant {index} has {} bytes, {n} scales need {}",
                c.len(),
                n * width
            ),
        ));
    }
    if c.bytes.is_none() {
        // A summary: the scales themselves are not read.
        return Ok(vec![1.0; n]);
    }
    let bytes = c.bytes();
    Ok(bytes
        .chunks_exact(width)
        .map(|b| match *b {
            [a, b] => f32::from_bits(u32::from(u16::from_le_bytes([a, b])) << 16),
            [a, b, c, d] => f32::from_le_bytes([a, b, c, d]),
            _ => f32::NAN,
        })
        .collect())
}

fn read_quant(
    q: x::XnnQuantParamsRef<'_>,
    dtype: Datatype,
    dims: &[usize],
    id: u32,
    constants: &Constants,
    work: &mut Work,
) -> Result<Quant> {
    let err = |m: String| XnnError::value(id, m);
    let fbe = |what: &'static str| move |e: planus::Error| err(format!("{what}: {e}"));
    let quant = match q {
        x::XnnQuantParamsRef::PerTensorQuant(p) => {
            let scale = p.scale().map_err(fbe("scale"))?;
            let zero_point = p.zero_point().map_err(fbe("zero_point"))?;
            let ok = match dtype {
                Datatype::QInt8 => i8::try_from(zero_point).is_ok(),
                Datatype::QUInt8 => u8::try_from(zero_point).is_ok(),
                Datatype::QInt32 => zero_point == 0,
                _ => {
                    return Err(err(format!(
                        "per-tensor quantization of a {} value",
                        dtype.name()
                    )))
                }
            };
            if !ok {
                return Err(err(format!(
                    "zero point {zero_point} is out of range for {}",
                    dtype.name()
                )));
            }
            check_scale(scale, id, "scale")?;
            Quant::PerTensor { scale, zero_point }
        }
        x::XnnQuantParamsRef::PerChannelQuant(p) => {
            if !matches!(
                dtype,
                Datatype::QcInt8 | Datatype::QcInt32 | Datatype::QcInt4
            ) {
                return Err(err(format!(
                    "per-channel quantization of a {} value",
                    dtype.name()
                )));
            }
            let channel_dim = p.channel_dim().map_err(fbe("channel_dim"))?;
            let channel_dim = usize::try_from(channel_dim)
                .ok()
                .filter(|&c| c < dims.len())
                .ok_or_else(|| {
                    err(format!(
                        "channel_dim {channel_dim} is not a dimension of {dims:?}"
                    ))
                })?;
            let channels = dims.get(channel_dim).copied().unwrap_or(0);
            let buffer = p.scale_buffer_idx().map_err(fbe("scale_buffer_idx"))?;
            let scales = if buffer != 0 {
                let n = p.num_scales().map_err(fbe("num_scales"))? as usize;
                if n != channels {
                    return Err(err(format!(
                        "num_scales {n} is not the {channels} channels of dimension {channel_dim}"
                    )));
                }
                work.charge(n)?;
                constant_scales(constants, buffer, n, false, id)?
            } else {
                let v = p
                    .scale()
                    .map_err(fbe("scale"))?
                    .ok_or_else(|| err("per-channel scales are missing".into()))?;
                if v.len() != channels {
                    return Err(err(format!(
                        "{} scales for the {channels} channels of dimension {channel_dim}",
                        v.len()
                    )));
                }
                work.charge(v.len())?;
                v.iter().collect()
            };
            for &s in &scales {
                check_scale(s, id, "channel scale")?;
            }
            Quant::PerChannel {
                scales,
                channel_dim,
            }
        }
        x::XnnQuantParamsRef::PerTokenDynamicQuant(p) => {
            if dtype != Datatype::QdInt8 {
                return Err(err(format!(
                    "per-token dynamic quantization of a {} value",
                    dtype.name()
                )));
            }
            let n = p.num_nonbatch_dims().map_err(fbe("num_nonbatch_dims"))?;
            let nonbatch_dims = usize::try_from(n)
                .ok()
                .filter(|&n| n >= 1 && n <= dims.len())
                .ok_or_else(|| {
                    err(format!(
                        "num_nonbatch_dims {n} is not in 1..={}",
                        dims.len()
                    ))
                })?;
            Quant::PerToken { nonbatch_dims }
        }
        x::XnnQuantParamsRef::PerChannelGroupQuant(p) => {
            if dtype != Datatype::QbInt4 {
                return Err(err(format!(
                    "blockwise quantization of a {} value",
                    dtype.name()
                )));
            }
            if dims.len() != 2 {
                return Err(err(format!(
                    "blockwise quantized weights must be 2-D, not {dims:?}"
                )));
            }
            let channel_dim = p.channel_dim().map_err(fbe("channel_dim"))?;
            let channel_dim = usize::try_from(channel_dim)
                .ok()
                .filter(|&c| c < 2)
                .ok_or_else(|| err(format!("channel_dim {channel_dim} is not 0 or 1")))?;
            let block = p.group_size().map_err(fbe("group_size"))?;
            let (rows, cols) = (
                dims.first().copied().unwrap_or(0),
                dims.get(1).copied().unwrap_or(0),
            );
            let block = usize::try_from(block)
                .ok()
                .filter(|&b| b > 0 && cols % b == 0)
                .ok_or_else(|| {
                    err(format!(
                        "group_size {block} does not divide the {cols} input channels"
                    ))
                })?;
            let n = rows * (cols / block);
            let buffer = p.scale_buffer_idx().map_err(fbe("scale_buffer_idx"))?;
            let scales = if buffer != 0 {
                let stated = p.num_scales().map_err(fbe("num_scales"))? as usize;
                if stated != n {
                    return Err(err(format!(
                        "num_scales {stated} is not {rows} rows x {} blocks",
                        cols / block
                    )));
                }
                work.charge(n)?;
                constant_scales(constants, buffer, n, true, id)?
            } else {
                let v = p
                    .scale()
                    .map_err(fbe("scale"))?
                    .ok_or_else(|| err("block scales are missing".into()))?;
                if v.len() != n {
                    return Err(err(format!(
                        "{} block scales, {rows} rows x {} blocks need {n}",
                        v.len(),
                        cols / block
                    )));
                }
                work.charge(n)?;
                // Upstream rounds fp32 scales to bf16 before use.
                v.iter().map(round_to_bf16).collect()
            };
            for &s in &scales {
                check_scale(s, id, "block scale")?;
            }
            Quant::Blockwise {
                scales,
                channel_dim,
                block,
            }
        }
    };
    Ok(quant)
}

/// Upstream's fp32 -> bf16 conversion of block scales (scaled so that truncation
/// rounds), widened back to fp32.
fn round_to_bf16(v: f32) -> f32 {
    // Upstream's constant, as written there.
    #[allow(clippy::excessive_precision)]
    let adjusted = v * 1.003_891_05_f32;
    f32::from_bits(adjusted.to_bits() & 0xFFFF_0000)
}

fn read_node(
    n: x::XNodeRef<'_>,
    index: usize,
    ids: &HashMap<u32, usize>,
    work: &mut Work,
) -> Result<Node> {
    use x::XNodeUnionRef as U;
    let at = |what: &str| format!("xnodes[{index}].{what}");
    let debug_handle = n.debug_handle().map_err(fb_at(|| at("debug_handle")))?;
    let (min, max) = match n.output_min_max().map_err(fb_at(|| at("output_min_max")))? {
        Some(m) => (
            m.output_min().map_err(fb_at(|| at("output_min")))?,
            m.output_max().map_err(fb_at(|| at("output_max")))?,
        ),
        None => (f32::NEG_INFINITY, f32::INFINITY),
    };
    let union = n
        .xnode_union()
        .map_err(fb_at(|| at("xnode_union")))?
        .ok_or_else(|| XnnError::graph(format!("{} is missing", at("xnode_union"))))?;
    let mut node = Node {
        op: Op::Copy,
        kind: "?",
        debug_handle,
        inputs: SmallVec::new(),
        outputs: SmallVec::new(),
        min,
        max,
        flags: 0,
        fused: None,
        chain: None,
    };
    // Field reads: errors name the node.
    macro_rules! get {
        ($t:expr, $f:ident) => {
            $t.$f().map_err(|e| {
                node_err(
                    index,
                    node.kind,
                    debug_handle,
                    format!("{}: {e}", stringify!($f)),
                )
            })?
        };
    }
    let resolve = |id: u32, kind: &'static str, optional: bool| -> Result<Option<usize>> {
        if optional && id == INVALID_ID {
            return Ok(None);
        }
        ids.get(&id).copied().map(Some).ok_or_else(|| {
            node_err(
                index,
                kind,
                debug_handle,
                format!("value id {id} does not exist"),
            )
        })
    };
    let list =
        |v: Option<planus::Vector<'_, u32>>, what: &str, kind, work: &mut Work| -> Result<Dims> {
            let v =
                v.ok_or_else(|| node_err(index, kind, debug_handle, format!("{what} is missing")))?;
            if v.len() > MAX_DIMS {
                return Err(node_err(
                    index,
                    kind,
                    debug_handle,
                    format!("{what} has {} entries, more than {MAX_DIMS}", v.len()),
                ));
            }
            work.charge(v.len())?;
            Ok(v.iter().map(|d| d as usize).collect())
        };
    macro_rules! io1 {
        ($t:expr) => {{
            node.inputs
                .push(resolve(get!($t, input_id), node.kind, false)?);
            node.outputs
                .push(resolve(get!($t, output_id), node.kind, false)?.unwrap_or(0));
            node.flags = get!($t, flags);
        }};
    }
    macro_rules! io2 {
        ($t:expr) => {{
            node.inputs
                .push(resolve(get!($t, input1_id), node.kind, false)?);
            node.inputs
                .push(resolve(get!($t, input2_id), node.kind, false)?);
            node.outputs
                .push(resolve(get!($t, output_id), node.kind, false)?.unwrap_or(0));
            node.flags = get!($t, flags);
        }};
    }
    let unary = |op| Op::Unary(op);
    let (kind, op): (&'static str, Op) = match &union {
        U::XnnAdd(_) => ("Add", Op::Binary(BinaryOp::Add)),
        U::XnnSubtract(_) => ("Subtract", Op::Binary(BinaryOp::Subtract)),
        U::XnnMultiply(_) => ("Multiply", Op::Binary(BinaryOp::Multiply)),
        U::XnnDiv(_) => ("Div", Op::Binary(BinaryOp::Divide)),
        U::XnnMinimum(_) => ("Minimum", Op::Binary(BinaryOp::Minimum)),
        U::XnnMaximum(_) => ("Maximum", Op::Binary(BinaryOp::Maximum)),
        U::XnnpReLu(_) => ("PReLU", Op::PRelu),
        U::XnnBatchMatrixMultiply(_) => ("BatchMatrixMultiply", Op::Copy),
        U::XnnSoftmax(_) => ("Softmax", Op::Softmax),
        U::XnnSigmoid(_) => ("Sigmoid", unary(UnaryOp::Sigmoid)),
        U::XnnClamp(_) => ("Clamp", unary(UnaryOp::Clamp)),
        U::XnnFloor(_) => ("Floor", unary(UnaryOp::Floor)),
        U::XnnConvert(_) => ("Convert", Op::Convert),
        U::XnnGlobalAvgPooling2d(_) => ("GlobalAvgPooling2d", Op::Copy),
        U::XnnSquareRoot(_) => ("SquareRoot", unary(UnaryOp::SquareRoot)),
        U::XnnCeiling(_) => ("Ceiling", unary(UnaryOp::Ceiling)),
        U::XnnHardswish(_) => ("Hardswish", unary(UnaryOp::Hardswish)),
        U::XnnNegate(_) => ("Negate", unary(UnaryOp::Negate)),
        U::XnnSquare(_) => ("Square", unary(UnaryOp::Square)),
        U::XnnAbs(_) => ("Abs", unary(UnaryOp::Abs)),
        U::XnnReciprocalSquareRoot(_) => {
            ("ReciprocalSquareRoot", unary(UnaryOp::ReciprocalSquareRoot))
        }
        U::XnnLog(_) => ("Log", unary(UnaryOp::Log)),
        U::XnnGelu(_) => ("Gelu", unary(UnaryOp::Gelu)),
        U::XnnTanh(_) => ("Tanh", unary(UnaryOp::Tanh)),
        U::XnnExp(_) => ("Exp", unary(UnaryOp::Exp)),
        U::XnnSin(_) => ("Sin", unary(UnaryOp::Sin)),
        U::XnnCos(_) => ("Cos", unary(UnaryOp::Cos)),
        U::XnnCopy(_) => ("Copy", Op::Copy),
        U::Xnnelu(_) => ("ELU", Op::Copy),
        U::XnnLeakyReLu(_) => ("LeakyReLU", Op::Copy),
        U::XnnFullyConnected(_) => ("FullyConnected", Op::Copy),
        U::XnnConv2d(_) => ("Conv2d", Op::Copy),
        U::XnnDepthwiseConv2d(_) => ("DepthwiseConv2d", Op::Copy),
        U::XnnConvTranspose2d(_) => ("ConvTranspose2d", Op::Copy),
        U::XnnMaxPooling2d(_) => ("MaxPooling2d", Op::Copy),
        U::XnnAvgPooling2d(_) => ("AvgPooling2d", Op::Copy),
        U::XnnArgMaxPooling2d(_) => ("ArgMaxPooling2d", Op::Copy),
        U::XnnStaticTranspose(_) => ("StaticTranspose", Op::Copy),
        U::XnnStaticReshape(_) => ("StaticReshape", Op::Copy),
        U::XnnStaticSlice(_) => ("StaticSlice", Op::Copy),
        U::XnnStaticConstantPad(_) => ("StaticConstantPad", Op::Copy),
        U::XnnStaticResizeBilinear2D(_) => ("StaticResizeBilinear2D", Op::Copy),
        U::XnnConcatenate2(_) => ("Concatenate2", Op::Copy),
        U::XnnConcatenate3(_) => ("Concatenate3", Op::Copy),
        U::XnnConcatenate4(_) => ("Concatenate4", Op::Copy),
        U::XnnConcatenate5(_) => ("Concatenate5", Op::Copy),
        U::XnnScaledDotProductAttention(_) => ("ScaledDotProductAttention", Op::Copy),
    };
    node.kind = kind;
    node.op = op;
    match &union {
        U::XnnAdd(t)
        | U::XnnSubtract(t)
        | U::XnnMultiply(t)
        | U::XnnDiv(t)
        | U::XnnMinimum(t)
        | U::XnnMaximum(t)
        | U::XnnpReLu(t) => io2!(t),
        U::XnnBatchMatrixMultiply(t) => {
            io2!(t);
            node.op = Op::BatchMatrixMultiply {
                transpose_b: node.flags & 1 != 0,
            };
        }
        U::XnnSoftmax(t)
        | U::XnnSigmoid(t)
        | U::XnnClamp(t)
        | U::XnnFloor(t)
        | U::XnnConvert(t)
        | U::XnnSquareRoot(t)
        | U::XnnCeiling(t)
        | U::XnnHardswish(t)
        | U::XnnNegate(t)
        | U::XnnSquare(t)
        | U::XnnAbs(t)
        | U::XnnReciprocalSquareRoot(t)
        | U::XnnLog(t)
        | U::XnnGelu(t)
        | U::XnnTanh(t)
        | U::XnnExp(t)
        | U::XnnSin(t)
        | U::XnnCos(t)
        | U::XnnCopy(t) => io1!(t),
        U::XnnGlobalAvgPooling2d(t) => {
            io1!(t);
            node.op = Op::GlobalAvgPooling2d {
                keep_dims: node.flags & 0x40 != 0,
            };
        }
        U::Xnnelu(t) => {
            io1!(t);
            node.op = Op::Unary(UnaryOp::Elu {
                alpha: get!(t, alpha),
            });
        }
        U::XnnLeakyReLu(t) => {
            io1!(t);
            node.op = Op::Unary(UnaryOp::LeakyRelu {
                slope: get!(t, negative_slope),
            });
        }
        U::XnnFullyConnected(t) => {
            node.inputs.push(resolve(get!(t, input1_id), kind, false)?);
            node.inputs.push(resolve(get!(t, filter_id), kind, false)?);
            node.inputs.push(resolve(get!(t, bias_id), kind, true)?);
            node.outputs
                .push(resolve(get!(t, output_id), kind, false)?.unwrap_or(0));
            node.flags = get!(t, flags);
            node.op = Op::FullyConnected {
                transpose_weights: node.flags & 1 != 0,
            };
        }
        U::XnnConv2d(t) | U::XnnDepthwiseConv2d(t) | U::XnnConvTranspose2d(t) => {
            node.inputs.push(resolve(get!(t, input1_id), kind, false)?);
            node.inputs.push(resolve(get!(t, filter_id), kind, false)?);
            node.inputs.push(resolve(get!(t, bias_id), kind, true)?);
            node.outputs
                .push(resolve(get!(t, output_id), kind, false)?.unwrap_or(0));
            node.flags = get!(t, flags);
            let g = ConvGeometry {
                padding: [
                    get!(t, padding_top),
                    get!(t, padding_right),
                    get!(t, padding_bottom),
                    get!(t, padding_left),
                ],
                kernel: [get!(t, kernel_height), get!(t, kernel_width)],
                stride: [get!(t, subsampling_height), get!(t, subsampling_width)],
                dilation: [get!(t, dilation_height), get!(t, dilation_width)],
                groups: get!(t, groups),
                group_input_channels: get!(t, group_input_channels),
                group_output_channels: get!(t, group_output_channels),
                adjustment: [get!(t, adjustment_height), get!(t, adjustment_width)],
            };
            node.op = match &union {
                U::XnnConv2d(_) => Op::Conv2d(g),
                U::XnnDepthwiseConv2d(_) => Op::DepthwiseConv2d(g),
                _ => Op::ConvTranspose2d(g),
            };
        }
        U::XnnMaxPooling2d(t) | U::XnnAvgPooling2d(t) => {
            io1!(t);
            let g = PoolGeometry {
                padding: [
                    get!(t, padding_top),
                    get!(t, padding_right),
                    get!(t, padding_bottom),
                    get!(t, padding_left),
                ],
                window: [get!(t, pooling_height), get!(t, pooling_width)],
                stride: [get!(t, stride_height), get!(t, stride_width)],
                dilation: [get!(t, dilation_height), get!(t, dilation_width)],
            };
            node.op = if matches!(union, U::XnnMaxPooling2d(_)) {
                Op::MaxPooling2d(g)
            } else {
                Op::AvgPooling2d(g)
            };
        }
        U::XnnArgMaxPooling2d(t) => {
            node.inputs.push(resolve(get!(t, input_id), kind, false)?);
            node.outputs
                .push(resolve(get!(t, output_value_id), kind, false)?.unwrap_or(0));
            node.outputs
                .push(resolve(get!(t, output_index_id), kind, false)?.unwrap_or(0));
            node.flags = get!(t, flags);
            let window = [get!(t, pooling_height), get!(t, pooling_width)];
            node.op = Op::ArgMaxPooling2d(PoolGeometry {
                padding: [
                    get!(t, padding_top),
                    get!(t, padding_right),
                    get!(t, padding_bottom),
                    get!(t, padding_left),
                ],
                window,
                // Argmax pooling strides by its window.
                stride: window,
                dilation: [1, 1],
            });
        }
        U::XnnStaticTranspose(t) => {
            io1!(t);
            let perm = list(get!(t, perm), "perm", kind, work)?;
            let num_dims = get!(t, num_dims) as usize;
            if num_dims != perm.len() {
                return Err(node_err(
                    index,
                    kind,
                    debug_handle,
                    format!("num_dims {num_dims} but perm has {} entries", perm.len()),
                ));
            }
            node.op = Op::StaticTranspose { perm };
        }
        U::XnnStaticReshape(t) => {
            io1!(t);
            let shape = list(get!(t, new_shape), "new_shape", kind, work)?;
            let num_dims = get!(t, num_dims) as usize;
            if num_dims != shape.len() {
                return Err(node_err(
                    index,
                    kind,
                    debug_handle,
                    format!(
                        "num_dims {num_dims} but new_shape has {} entries",
                        shape.len()
                    ),
                ));
            }
            node.op = Op::StaticReshape { shape };
        }
        U::XnnStaticSlice(t) => {
            io1!(t);
            let offsets = list(get!(t, offsets), "offsets", kind, work)?;
            let sizes = list(get!(t, sizes), "sizes", kind, work)?;
            let num_dims = get!(t, num_dims) as usize;
            if offsets.len() != sizes.len() || num_dims != sizes.len() {
                return Err(node_err(
                    index,
                    kind,
                    debug_handle,
                    format!(
                        "num_dims {num_dims}, {} offsets and {} sizes disagree",
                        offsets.len(),
                        sizes.len()
                    ),
                ));
            }
            node.op = Op::StaticSlice { offsets, sizes };
        }
        U::XnnStaticConstantPad(t) => {
            io1!(t);
            let pre = list(get!(t, pre_paddings), "pre_paddings", kind, work)?;
            let post = list(get!(t, post_paddings), "post_paddings", kind, work)?;
            if pre.len() != post.len() {
                return Err(node_err(
                    index,
                    kind,
                    debug_handle,
                    format!(
                        "{} pre_paddings but {} post_paddings",
                        pre.len(),
                        post.len()
                    ),
                ));
            }
            node.op = Op::StaticConstantPad {
                pre,
                post,
                value: get!(t, padding_value),
            };
        }
        U::XnnStaticResizeBilinear2D(t) => {
            io1!(t);
            let flags = node.flags;
            if flags & 0x4 != 0 && flags & 0x8 != 0 {
                return Err(node_err(
                    index,
                    kind,
                    debug_handle,
                    "align-corners and legacy-mode flags are exclusive".into(),
                ));
            }
            node.op = Op::StaticResizeBilinear2D {
                height: get!(t, new_height) as usize,
                width: get!(t, new_width) as usize,
                align_corners: flags & 0x8 != 0,
                legacy: flags & 0x4 != 0,
            };
        }
        U::XnnConcatenate2(t)
        | U::XnnConcatenate3(t)
        | U::XnnConcatenate4(t)
        | U::XnnConcatenate5(t) => {
            let count = match &union {
                U::XnnConcatenate2(_) => 2,
                U::XnnConcatenate3(_) => 3,
                U::XnnConcatenate4(_) => 4,
                _ => 5,
            };
            let ids = [
                get!(t, input1_id),
                get!(t, input2_id),
                get!(t, input3_id),
                get!(t, input4_id),
                get!(t, input5_id),
            ];
            for &id in ids.iter().take(count) {
                node.inputs.push(resolve(id, kind, false)?);
            }
            node.outputs
                .push(resolve(get!(t, output_id), kind, false)?.unwrap_or(0));
            node.flags = get!(t, flags);
            node.op = Op::Concatenate {
                axis: get!(t, axis) as usize,
            };
        }
        U::XnnScaledDotProductAttention(t) => {
            node.inputs.push(resolve(get!(t, query_id), kind, false)?);
            node.inputs.push(resolve(get!(t, key_id), kind, false)?);
            node.inputs.push(resolve(get!(t, value_id), kind, false)?);
            node.inputs.push(resolve(get!(t, scale_id), kind, false)?);
            node.inputs.push(resolve(get!(t, mask_id), kind, true)?);
            node.outputs
                .push(resolve(get!(t, output_id), kind, false)?.unwrap_or(0));
            node.flags = get!(t, flags);
            node.op = Op::ScaledDotProductAttention;
        }
    }
    Ok(node)
}

fn node_err(index: usize, kind: &'static str, debug_handle: u32, message: String) -> XnnError {
    XnnError::Node {
        index,
        kind,
        debug_handle,
        message,
    }
}
