//! With profiling on, an XNNPACK delegate's profile entry splits its time by node kind.

use pte_runtime::{BackendRegistry, LoadOptions, Program};

#[test]
fn a_delegate_profile_has_its_node_kinds() {
    let path = pte_testkit::xnnpack_dir().join("xnn_convnet/model.pte");
    let program = Program::open(path).unwrap();
    let mut backends = BackendRegistry::new();
    pte_xnnpack::register(&mut backends);
    let options = LoadOptions {
        threads: Some(1),
        ..LoadOptions::default()
    };
    let mut m = program
        .load_method_with("forward", &pte_kernels::registry(), &backends, &options)
        .unwrap();
    let inputs = m.meta().example_inputs(1 << 20).unwrap();
    m.set_inputs(&inputs).unwrap();
    m.execute().unwrap();
    m.set_profiling(true);
    const RUNS: u64 = 3;
    for _ in 0..RUNS {
        m.set_inputs(&inputs).unwrap();
        m.execute().unwrap();
    }
    let profile = m.profile();
    let delegate = profile
        .iter()
        .find(|e| e.name == "delegate XnnpackBackend")
        .expect("the delegate's entry");
    assert!(delegate.delegate);
    assert_eq!(delegate.calls, RUNS);
    // The payload's node kinds, as `pte inspect` lists them (16 nodes).
    let kinds = [
        "Conv2d",
        "DepthwiseConv2d",
        "StaticTranspose",
        "Add",
        "AvgPooling2d",
        "ConvTranspose2d",
        "FullyConnected",
        "GlobalAvgPooling2d",
        "Hardswish",
        "MaxPooling2d",
        "Sigmoid",
        "StaticReshape",
    ];
    assert!(!delegate.parts.is_empty());
    for part in &delegate.parts {
        // "Conv2d (pointwise)": the kind, then how a convolution computes.
        let kind = part.name.split(" (").next().unwrap_or_default();
        assert!(
            kind.split('+').all(|k| kinds.contains(&k)),
            "{} is not made of the payload's node kinds",
            part.name
        );
        assert!(part.calls > 0 && part.calls % RUNS == 0, "{part:?}");
    }
    let steps: u64 = delegate.parts.iter().map(|p| p.calls).sum::<u64>() / RUNS;
    assert!((1..=16).contains(&steps), "{steps} steps for 16 nodes");
    let parts_time: std::time::Duration = delegate.parts.iter().map(|p| p.total).sum();
    assert!(parts_time <= delegate.total);
    // The reshape before the classifier shares its input's memory and never runs.
    assert!(delegate.parts.iter().all(|p| p.name != "StaticReshape"));
    // Convolutions say which algorithm runs them.
    assert!(delegate
        .parts
        .iter()
        .filter(|p| p.name.starts_with("Conv2d"))
        .all(|p| p.name.ends_with(')')));
    assert!(delegate.parts.windows(2).all(|w| w[0].total >= w[1].total));
    // Turning profiling on again starts over.
    m.set_profiling(true);
    m.set_inputs(&inputs).unwrap();
    m.execute().unwrap();
    let again = m.profile();
    let delegate = again.iter().find(|e| e.delegate).unwrap();
    assert_eq!(delegate.calls, 1);
    assert_eq!(
        delegate.parts.iter().map(|p| p.calls).sum::<u64>(),
        steps,
        "one execution runs every step once"
    );
}
