//! Malformed payloads are load-time errors that name what is wrong: real programs from
//! upstream with one thing of their XNNPACK payload broken.

use planus::ReadAsRoot;
use pte_format::schema::executorch_flatbuffer as et;
use pte_format::{ProgramImage, Segment, WriteOptions};
use pte_runtime::{BackendRegistry, LoadOptions, Program, RuntimeError};
use pte_xnnpack::schema::fb_xnnpack as x;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(pte_testkit::xnnpack_dir().join(name).join("model.pte")).unwrap()
}

/// The program with its first delegate's payload replaced by `f(payload)`.
fn with_payload(pte: &[u8], f: impl FnOnce(&[u8]) -> Vec<u8>) -> Vec<u8> {
    let mut image = ProgramImage::parse(pte).unwrap();
    let plan = &image.program.execution_plan.as_ref().unwrap()[0];
    let r = plan.delegates.as_ref().unwrap()[0]
        .processed
        .as_ref()
        .unwrap();
    assert_eq!(r.location, et::DataLocation::Segment);
    let index = r.index as usize;
    let payload = f(&image.segments[index].data);
    image.segments[index] = Segment {
        data: payload.into(),
        alignment: 16,
    };
    image.to_bytes(&WriteOptions::default()).unwrap()
}

/// The program with its first delegate's graph changed by `f`.
fn with_graph(pte: &[u8], f: impl FnOnce(&mut x::XnnGraph)) -> Vec<u8> {
    with_payload(pte, |p| {
        let l = pte_xnnpack::payload::layout(p).unwrap();
        let fb = &p[l.flatbuffer.0..l.flatbuffer.0 + l.flatbuffer.1];
        let mut g = x::XnnGraph::try_from(x::XnnGraphRef::read_as_root(fb).unwrap()).unwrap();
        f(&mut g);
        pte_xnnpack::payload::write(&g, &p[l.constants.0..l.constants.0 + l.constants.1]).unwrap()
    })
}

fn load(pte: &[u8], limit: Option<u64>) -> Result<pte_runtime::Method, RuntimeError> {
    let program = Program::from_bytes(pte).unwrap();
    let mut backends = BackendRegistry::new();
    pte_xnnpack::register(&mut backends);
    let mut options = LoadOptions::default();
    if let Some(l) = limit {
        options.memory_limit = l;
    }
    program.load_method_with("forward", &pte_kernels::registry(), &backends, &options)
}

/// Loading fails with a delegate error whose message contains every `needle`.
fn refused(pte: &[u8], needles: &[&str]) {
    let err = load(pte, None).expect_err("the broken payload loaded");
    assert!(
        matches!(err, RuntimeError::Delegate { index: 0, .. }),
        "{err}"
    );
    let msg = err.to_string();
    for n in needles {
        assert!(msg.contains(n), "{msg:?} does not mention {n:?}");
    }
}

fn tensor(g: &mut x::XnnGraph, id: u32) -> &mut x::XnnTensorValue {
    for v in g.xvalues.as_mut().unwrap() {
        let t = match v.xvalue_union.as_mut().unwrap() {
            x::XValueUnion::XnnTensorValue(t) => t,
            x::XValueUnion::XnnQuantizedTensorValue(q) => q.tensor_value.as_mut().unwrap(),
        };
        if t.id_out == id {
            return t;
        }
    }
    panic!("no value {id}");
}

#[test]
fn a_bad_header_names_the_field() {
    let pte = fixture("xnn_convnet");
    refused(
        &with_payload(&pte, |p| {
            let mut p = p.to_vec();
            p[14..18].copy_from_slice(&u32::MAX.to_le_bytes());
            p
        }),
        &["payload", "flatbuffer", "lies outside"],
    );
    refused(
        &with_payload(&pte, |p| {
            let mut p = p.to_vec();
            p[36..40].copy_from_slice(b"ET12");
            p
        }),
        &["identifier"],
    );
    refused(&with_payload(&pte, |p| p[..40].to_vec()), &["payload"]);
}

#[test]
fn broken_values_name_the_value() {
    let pte = fixture("xnn_convnet");
    refused(
        &with_graph(&pte, |g| {
            let t = tensor(g, 0);
            t.dims = Some(vec![1 << 30; 6]);
            t.num_dims = 6;
        }),
        &["value 0", "overflow"],
    );
    refused(
        &with_graph(&pte, |g| tensor(g, 0).num_dims = 3),
        &["value 0", "num_dims"],
    );
    refused(
        &with_graph(&pte, |g| tensor(g, 1).id_out = 2),
        &["value 2", "two values"],
    );
    refused(
        &with_graph(&pte, |g| tensor(g, 0).flags = 0x10),
        &["value 0", "flag"],
    );
    refused(
        &with_graph(&pte, |g| tensor(g, 0).external_id = 7),
        &["external id 7"],
    );
    refused(
        &with_graph(&pte, |g| {
            tensor(g, 0).datatype = x::XnnDatatype::XnnDatatypeQpint8
        }),
        &["value 0", "not supported"],
    );
}

#[test]
fn constants_must_match_their_tensors() {
    let pte = fixture("xnn_convnet");
    // The first constant: shrink its entry, or point a value at a missing one.
    refused(
        &with_graph(&pte, |g| {
            let c = &mut g.constant_data.as_mut().unwrap()[1];
            c.size -= 4;
        }),
        &["constant has", "bytes"],
    );
    refused(
        &with_graph(&pte, |g| {
            let c = &mut g.constant_data.as_mut().unwrap()[1];
            c.named_key = Some("no such key".into());
        }),
        &["constant data entry 1", "no such key", ".ptd"],
    );
    refused(
        &with_graph(&pte, |g| {
            let t = g
                .xvalues
                .as_mut()
                .unwrap()
                .iter_mut()
                .find_map(|v| match v.xvalue_union.as_mut().unwrap() {
                    x::XValueUnion::XnnTensorValue(t) if t.constant_buffer_idx != 0 => Some(t),
                    _ => None,
                })
                .unwrap();
            t.constant_buffer_idx = 999;
        }),
        &["constant index 999"],
    );
}

#[test]
fn quantization_parameters_are_checked() {
    let pte = fixture("xnn_int8_static");
    let set = |f: fn(&mut x::XnnQuantParams)| {
        with_graph(&pte, |g| {
            let q = g
                .xvalues
                .as_mut()
                .unwrap()
                .iter_mut()
                .find_map(|v| match v.xvalue_union.as_mut().unwrap() {
                    x::XValueUnion::XnnQuantizedTensorValue(q)
                        if matches!(q.quant_params, Some(x::XnnQuantParams::PerTensorQuant(_))) =>
                    {
                        q.quant_params.as_mut()
                    }
                    _ => None,
                })
                .unwrap();
            f(q);
        })
    };
    refused(
        &set(|q| {
            if let x::XnnQuantParams::PerTensorQuant(p) = q {
                p.scale = f32::NAN;
            }
        }),
        &["scale NaN"],
    );
    refused(
        &set(|q| {
            if let x::XnnQuantParams::PerTensorQuant(p) = q {
                p.zero_point = 300;
            }
        }),
        &["zero point 300"],
    );
}

#[test]
fn graphs_must_be_in_order() {
    let pte = fixture("xnn_convnet");
    // Nodes reversed: the first reads what the last produces.
    refused(
        &with_graph(&pte, |g| g.xnodes.as_mut().unwrap().reverse()),
        &["before any node produced it"],
    );
    // A node twice: its output produced twice.
    refused(
        &with_graph(&pte, |g| {
            let n = g.xnodes.as_ref().unwrap()[0].clone();
            g.xnodes.as_mut().unwrap().push(n);
        }),
        &["already produced"],
    );
    // A node naming a value that does not exist.
    refused(
        &with_graph(&pte, |g| {
            if let Some(x::XNodeUnion::XnnStaticTranspose(t)) =
                g.xnodes.as_mut().unwrap()[0].xnode_union.as_mut()
            {
                t.input_id = 12345;
            }
        }),
        &["node 0", "value id 12345"],
    );
}

#[test]
fn node_parameters_are_checked_at_load() {
    let pte = fixture("xnn_convnet");
    let conv = |f: fn(&mut x::XnnNodeConv)| {
        with_graph(&pte, |g| {
            for n in g.xnodes.as_mut().unwrap() {
                if let Some(x::XNodeUnion::XnnConv2d(c)) = n.xnode_union.as_mut() {
                    f(c);
                    return;
                }
            }
        })
    };
    refused(&conv(|c| c.subsampling_height = 0), &["Conv2d", "stride"]);
    refused(&conv(|c| c.groups = 5), &["Conv2d", "filter"]);
    refused(&conv(|c| c.kernel_width = 1 << 30), &["Conv2d"]);
    // An absurd padding gives an output no budget holds: the error names it.
    refused(&conv(|c| c.padding_left = u32::MAX), &["Conv2d", "budget"]);
}

#[test]
fn prepared_state_is_charged_to_the_budget() {
    let pte = fixture("xnn_convnet");
    let err = load(&pte, Some(20_000)).expect_err("loaded within 20 kB");
    let msg = err.to_string();
    assert!(msg.contains("budget"), "{msg}");
}

#[test]
fn arguments_must_fit_the_graph() {
    let pte = fixture("xnn_convnet");
    refused(
        &with_graph(&pte, |g| g.num_externs = 7),
        &["arguments", "7"],
    );
    refused(
        &with_graph(&pte, |g| tensor(g, 0).dims = Some(vec![1, 3, 31, 32])),
        &["arguments", "value 0"],
    );
}
