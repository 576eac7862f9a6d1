//! Fuzzing of XNNPACK delegate payloads: parsing, validation, node preparation and
//! execution. Start from a program upstream lowered to XNNPACK, take its delegate
//! payload, and either change its bytes (header, flatbuffer, constants) or decode the
//! graph and change it at the schema level (datatypes, dims, ids, flags, quantization
//! parameters, constant entries, node parameters, node and value lists), write the
//! payload back, then load the method with the XNNPACK backend and execute it. Nothing
//! may panic, and under `-rss_limit_mb`/`-malloc_limit_mb` no allocation may escape the
//! memory budget.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use planus::ReadAsRoot;
use pte_format::schema::executorch_flatbuffer as et;
use pte_format::{ProgramImage, Segment, WriteOptions};
use pte_runtime::{BackendRegistry, LoadOptions, Program};
use pte_xnnpack::schema::fb_xnnpack as x;

const MEMORY_LIMIT: u64 = 64 << 20;

static KERNELS: std::sync::OnceLock<pte_runtime::KernelRegistry> = std::sync::OnceLock::new();
static BACKENDS: std::sync::OnceLock<BackendRegistry> = std::sync::OnceLock::new();

macro_rules! seeds {
    ($($dir:literal / $name:literal),* $(,)?) => {
        [$(include_bytes!(concat!("../../tests/", $dir, "/", $name, "/model.pte")).as_slice()),*]
    };
}

/// XNNPACK-lowered programs upstream exported: float, fp16, static and dynamic int8,
/// 4-bit, dynamic shapes, every node family, fused inverted residual blocks, 8-bit
/// means and repeated-row products.
const SEEDS: &[&[u8]] = &seeds![
    "xnnpack"/"xnn_convnet", "xnnpack"/"xnn_convnet_f16", "xnnpack"/"xnn_linear_clamp",
    "xnnpack"/"xnn_transformer_block", "xnnpack"/"xnn_int8_static", "xnnpack"/"xnn_int8_dynamic",
    "xnnpack"/"xnn_int4_groupwise", "xnnpack"/"xnn_dynamic_batch", "xnnpack"/"xnn_ops_unary",
    "xnnpack"/"xnn_ops_unary_f16", "xnnpack"/"xnn_ops_binary", "xnnpack"/"xnn_ops_shape",
    "xnnpack"/"xnn_ops_spatial", "xnnpack"/"xnn_ops_spatial_f16", "xnnpack"/"xnn_silu",
    "xnnpack"/"xnn_inverted_residual", "xnnpack"/"xnn_int8_means", "xnnpack"/"xnn_int8_gates",
    "fixtures"/"xnnpack_linear_conv", "fixtures"/"xnnpack_partial",
];

fn edgy_u32(u: &mut Unstructured<'_>) -> Result<u32> {
    Ok(match u.int_in_range(0..=7)? {
        0 => 0,
        1 => 1,
        2 => u32::MAX,
        3 => u32::from(u.int_in_range(0..=64u8)?),
        4 => 1 << u.int_in_range(0..=31u32)?,
        5 => u32::MAX - u32::from(u.int_in_range(1..=3u8)?),
        6 => i32::MAX as u32,
        _ => u.arbitrary()?,
    })
}

fn edgy_f32(u: &mut Unstructured<'_>) -> Result<f32> {
    Ok(match u.int_in_range(0..=7)? {
        0 => 0.0,
        1 => -1.0,
        2 => f32::NAN,
        3 => f32::INFINITY,
        4 => f32::NEG_INFINITY,
        5 => f32::MIN_POSITIVE / 2.0,
        6 => 1e30,
        _ => u.arbitrary()?,
    })
}

fn datatype(u: &mut Unstructured<'_>) -> Result<x::XnnDatatype> {
    Ok(*u.choose(&x::XnnDatatype::ENUM_VALUES)?)
}

fn mutate_tensor(u: &mut Unstructured<'_>, t: &mut x::XnnTensorValue) -> Result<()> {
    match u.int_in_range(0..=8)? {
        0 => t.datatype = datatype(u)?,
        1 => {
            let dims = t.dims.get_or_insert_with(Vec::new);
            match u.int_in_range(0..=2)? {
                0 if !dims.is_empty() => {
                    let i = u.choose_index(dims.len())?;
                    dims[i] = edgy_u32(u)?;
                }
                1 => dims.push(edgy_u32(u)?),
                _ => {
                    dims.pop();
                }
            }
        }
        2 => t.num_dims = edgy_u32(u)?,
        3 => t.constant_buffer_idx = edgy_u32(u)?,
        4 => t.external_id = edgy_u32(u)?,
        5 => t.flags = u.int_in_range(0..=7)?,
        6 => t.id_out = edgy_u32(u)?,
        7 => t.dq_datatype = datatype(u)?,
        _ => t.dims = None,
    }
    Ok(())
}

fn mutate_quant(u: &mut Unstructured<'_>, q: &mut x::XnnQuantParams) -> Result<()> {
    match q {
        x::XnnQuantParams::PerTensorQuant(p) => {
            if u.arbitrary()? {
                p.scale = edgy_f32(u)?;
            } else {
                p.zero_point = edgy_u32(u)? as i32;
            }
        }
        x::XnnQuantParams::PerChannelQuant(p) => match u.int_in_range(0..=3)? {
            0 => p.channel_dim = edgy_u32(u)? as i32,
            1 => p.scale_buffer_idx = edgy_u32(u)?,
            2 => p.num_scales = edgy_u32(u)?,
            _ => {
                let s = p.scale.get_or_insert_with(Vec::new);
                if s.is_empty() || u.arbitrary()? {
                    s.push(edgy_f32(u)?);
                } else {
                    let i = u.choose_index(s.len())?;
                    s[i] = edgy_f32(u)?;
                }
            }
        },
        x::XnnQuantParams::PerChannelGroupQuant(p) => match u.int_in_range(0..=3)? {
            0 => p.channel_dim = edgy_u32(u)? as i32,
            1 => p.group_size = edgy_u32(u)? as i32,
            2 => p.scale_buffer_idx = edgy_u32(u)?,
            _ => p.num_scales = edgy_u32(u)?,
        },
        x::XnnQuantParams::PerTokenDynamicQuant(p) => p.num_nonbatch_dims = edgy_u32(u)? as i32,
    }
    Ok(())
}

fn mutate_value(u: &mut Unstructured<'_>, v: &mut x::XValue) -> Result<()> {
    match v.xvalue_union.as_mut() {
        Some(x::XValueUnion::XnnTensorValue(t)) => mutate_tensor(u, t),
        Some(x::XValueUnion::XnnQuantizedTensorValue(q)) => {
            if u.arbitrary()? {
                if let Some(t) = q.tensor_value.as_mut() {
                    mutate_tensor(u, t)?;
                }
                Ok(())
            } else if let Some(p) = q.quant_params.as_mut() {
                mutate_quant(u, p)
            } else {
                Ok(())
            }
        }
        None => Ok(()),
    }
}

/// Changes one field of a node: its ids, or one of its parameters.
fn mutate_node(u: &mut Unstructured<'_>, n: &mut x::XNode) -> Result<()> {
    if u.int_in_range(0..=5)? == 0 {
        let mm = n.output_min_max.get_or_insert_with(Default::default);
        mm.output_min = edgy_f32(u)?;
        mm.output_max = edgy_f32(u)?;
        return Ok(());
    }
    let Some(union) = n.xnode_union.as_mut() else { return Ok(()) };
    use x::XNodeUnion as U;
    let v = edgy_u32(u)?;
    let k = u.int_in_range(0..=19u32)?;
    match union {
        U::XnnAdd(t) | U::XnnSubtract(t) | U::XnnMultiply(t) | U::XnnDiv(t) | U::XnnMinimum(t)
        | U::XnnMaximum(t) | U::XnnpReLu(t) | U::XnnBatchMatrixMultiply(t) => match k % 4 {
            0 => t.input1_id = v,
            1 => t.input2_id = v,
            2 => t.output_id = v,
            _ => t.flags = v,
        },
        U::XnnSoftmax(t) | U::XnnSigmoid(t) | U::XnnClamp(t) | U::XnnFloor(t) | U::XnnConvert(t)
        | U::XnnGlobalAvgPooling2d(t) | U::XnnSquareRoot(t) | U::XnnCeiling(t)
        | U::XnnHardswish(t) | U::XnnNegate(t) | U::XnnSquare(t) | U::XnnAbs(t)
        | U::XnnReciprocalSquareRoot(t) | U::XnnLog(t) | U::XnnGelu(t) | U::XnnTanh(t)
        | U::XnnExp(t) | U::XnnSin(t) | U::XnnCopy(t) | U::XnnCos(t) => match k % 3 {
            0 => t.input_id = v,
            1 => t.output_id = v,
            _ => t.flags = v,
        },
        U::XnnConv2d(t) | U::XnnDepthwiseConv2d(t) | U::XnnConvTranspose2d(t) => match k {
            0 => t.padding_top = v,
            1 => t.padding_right = v,
            2 => t.padding_bottom = v,
            3 => t.padding_left = v,
            4 => t.kernel_height = v,
            5 => t.kernel_width = v,
            6 => t.subsampling_height = v,
            7 => t.subsampling_width = v,
            8 => t.dilation_height = v,
            9 => t.dilation_width = v,
            10 => t.group_input_channels = v,
            11 => t.group_output_channels = v,
            12 => t.groups = v,
            13 => t.adjustment_height = v,
            14 => t.adjustment_width = v,
            15 => t.input1_id = v,
            16 => t.filter_id = v,
            17 => t.bias_id = v,
            18 => t.output_id = v,
            _ => t.flags = v,
        },
        U::XnnMaxPooling2d(t) | U::XnnAvgPooling2d(t) => match k % 13 {
            0 => t.padding_top = v,
            1 => t.padding_right = v,
            2 => t.padding_bottom = v,
            3 => t.padding_left = v,
            4 => t.pooling_height = v,
            5 => t.pooling_width = v,
            6 => t.stride_height = v,
            7 => t.stride_width = v,
            8 => t.dilation_height = v,
            9 => t.dilation_width = v,
            10 => t.input_id = v,
            11 => t.output_id = v,
            _ => t.flags = v,
        },
        U::XnnFullyConnected(t) => match k % 5 {
            0 => t.input1_id = v,
            1 => t.filter_id = v,
            2 => t.bias_id = v,
            3 => t.output_id = v,
            _ => t.flags = v,
        },
        U::XnnStaticTranspose(t) => match k % 3 {
            0 => t.num_dims = v,
            1 => t.perm.get_or_insert_with(Vec::new).push(v),
            _ => t.input_id = v,
        },
        U::XnnStaticReshape(t) => match k % 3 {
            0 => t.num_dims = v,
            1 => {
                let s = t.new_shape.get_or_insert_with(Vec::new);
                if let Some(last) = s.last_mut() {
                    *last = v;
                }
            }
            _ => t.output_id = v,
        },
        U::XnnStaticSlice(t) => match k % 3 {
            0 => t.offsets.get_or_insert_with(Vec::new).insert(0, v),
            1 => {
                if let Some(s) = t.sizes.as_mut().and_then(|s| s.first_mut()) {
                    *s = v;
                }
            }
            _ => t.num_dims = v,
        },
        U::XnnStaticConstantPad(t) => match k % 3 {
            0 => {
                if let Some(p) = t.pre_paddings.as_mut().and_then(|s| s.first_mut()) {
                    *p = v;
                }
            }
            1 => t.post_paddings.get_or_insert_with(Vec::new).push(v),
            _ => t.padding_value = edgy_f32(u)?,
        },
        U::XnnStaticResizeBilinear2D(t) => match k % 3 {
            0 => t.new_height = v,
            1 => t.new_width = v,
            _ => t.flags = v,
        },
        U::XnnConcatenate2(t) | U::XnnConcatenate3(t) | U::XnnConcatenate4(t)
        | U::XnnConcatenate5(t) => match k % 4 {
            0 => t.axis = v,
            1 => t.input1_id = v,
            2 => t.input5_id = v,
            _ => t.output_id = v,
        },
        U::XnnArgMaxPooling2d(t) => match k % 4 {
            0 => t.pooling_height = v,
            1 => t.padding_left = v,
            2 => t.output_index_id = v,
            _ => t.output_value_id = v,
        },
        U::Xnnelu(t) => t.alpha = edgy_f32(u)?,
        U::XnnLeakyReLu(t) => t.negative_slope = edgy_f32(u)?,
        U::XnnScaledDotProductAttention(t) => match k % 3 {
            0 => t.query_id = v,
            1 => t.mask_id = v,
            _ => t.scale_id = v,
        },
    }
    Ok(())
}

fn mutate_graph(u: &mut Unstructured<'_>, g: &mut x::XnnGraph) -> Result<()> {
    for _ in 0..u.int_in_range(1..=4)? {
        match u.int_in_range(0..=7)? {
            0 | 1 => {
                if let Some(v) = g.xvalues.as_mut().filter(|v| !v.is_empty()) {
                    let i = u.choose_index(v.len())?;
                    mutate_value(u, &mut v[i])?;
                }
            }
            2 | 3 => {
                if let Some(n) = g.xnodes.as_mut().filter(|n| !n.is_empty()) {
                    let i = u.choose_index(n.len())?;
                    mutate_node(u, &mut n[i])?;
                }
            }
            4 => {
                if let Some(c) = g.constant_data.as_mut().filter(|c| !c.is_empty()) {
                    let i = u.choose_index(c.len())?;
                    match u.int_in_range(0..=2)? {
                        0 => c[i].offset = u64::from(edgy_u32(u)?),
                        1 => c[i].size = u64::from(edgy_u32(u)?),
                        _ => c[i].named_key = None,
                    }
                }
            }
            5 => g.num_externs = edgy_u32(u)?,
            6 => {
                // Drop or duplicate a node, or swap two.
                if let Some(n) = g.xnodes.as_mut().filter(|n| !n.is_empty()) {
                    let i = u.choose_index(n.len())?;
                    match u.int_in_range(0..=2)? {
                        0 => {
                            n.remove(i);
                        }
                        1 => {
                            let d = n[i].clone();
                            n.push(d);
                        }
                        _ => {
                            let j = u.choose_index(n.len())?;
                            n.swap(i, j);
                        }
                    }
                }
            }
            _ => {
                if let Some(v) = g.xvalues.as_mut().filter(|v| !v.is_empty()) {
                    let i = u.choose_index(v.len())?;
                    if u.arbitrary()? {
                        v.remove(i);
                    } else {
                        let d = v[i].clone();
                        v.push(d);
                    }
                }
            }
        }
    }
    Ok(())
}

/// A mutated payload: bytes changed in place, or the graph changed and rewritten.
fn mutate_payload(u: &mut Unstructured<'_>, payload: &[u8]) -> Result<Vec<u8>> {
    let layout = pte_xnnpack::payload::layout(payload).ok();
    let structured = layout.is_some() && u.int_in_range(0..=3)? > 0;
    if let (true, Some(l)) = (structured, layout) {
        let (off, len) = l.flatbuffer;
        let (coff, clen) = l.constants;
        let fb = payload.get(off..off + len).unwrap_or_default();
        let constants = payload.get(coff..coff + clen).unwrap_or_default();
        let Ok(root) = x::XnnGraphRef::read_as_root(fb) else {
            return Ok(payload.to_vec());
        };
        let Ok(mut graph) = x::XnnGraph::try_from(root) else {
            return Ok(payload.to_vec());
        };
        mutate_graph(u, &mut graph)?;
        return Ok(pte_xnnpack::payload::write(&graph, constants).unwrap_or_else(|_| payload.to_vec()));
    }
    let mut bytes = payload.to_vec();
    for _ in 0..u.int_in_range(1..=8)? {
        if bytes.is_empty() {
            break;
        }
        let i = u.choose_index(bytes.len())?;
        match u.int_in_range(0..=3)? {
            0 => bytes[i] ^= 1 << u.int_in_range(0..=7u8)?,
            1 => bytes[i] = u.arbitrary()?,
            2 => bytes.truncate(i),
            _ => {
                let v: u32 = edgy_u32(u)?;
                for (k, b) in v.to_le_bytes().iter().enumerate() {
                    if let Some(x) = bytes.get_mut(i + k) {
                        *x = *b;
                    }
                }
            }
        }
    }
    Ok(bytes)
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(seed) = u.choose(SEEDS) else { return };
    let Ok(mut image) = ProgramImage::parse(seed) else { return };
    // The first delegate with its payload in a segment.
    let Some(plan) = image.program.execution_plan.as_ref().and_then(|p| p.first()) else {
        return;
    };
    let segment = plan.delegates.iter().flatten().find_map(|d| {
        let r = d.processed.as_ref()?;
        (r.location == et::DataLocation::Segment).then_some(r.index as usize)
    });
    let Some(segment) = segment else { return };
    let Some(original) = image.segments.get(segment) else { return };
    let Ok(payload) = mutate_payload(&mut u, &original.data) else { return };
    if let Some(s) = image.segments.get_mut(segment) {
        *s = Segment {
            data: payload.into(),
            alignment: 16,
        };
    }
    let Ok(bytes) = image.to_bytes(&WriteOptions::default()) else { return };
    let Ok(program) = Program::from_bytes(&bytes) else { return };
    let kernels = KERNELS.get_or_init(pte_kernels::registry);
    let backends = BACKENDS.get_or_init(|| {
        let mut b = BackendRegistry::new();
        pte_xnnpack::register(&mut b);
        b
    });
    let options = LoadOptions {
        memory_limit: MEMORY_LIMIT,
        threads: Some(1),
        ..LoadOptions::default()
    };
    let Ok(mut method) = program.load_method_with("forward", kernels, backends, &options) else {
        return;
    };
    let Ok(inputs) = method.meta().example_inputs(MEMORY_LIMIT) else { return };
    if method.set_inputs(&inputs).is_ok() {
        let _ = method.execute();
        let _ = method.outputs();
    }
});
