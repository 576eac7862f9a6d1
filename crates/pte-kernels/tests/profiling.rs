//! `Method::profile` counts every operator call and the time spent in it.

use pte_runtime::Program;

#[test]
fn the_profile_counts_calls_per_operator() {
    let program = Program::open(pte_testkit::fixtures_dir().join("convnet/model.pte")).unwrap();
    // The reference kernels: with the fast paths, convolutions and their activations
    // run as one fused call.
    let mut m = program
        .load_method("forward", &pte_kernels::reference_registry())
        .unwrap();
    let inputs = m.meta().example_inputs(1 << 20).unwrap();
    m.set_inputs(&inputs).unwrap();
    m.execute().unwrap();
    assert!(
        m.profile().is_empty(),
        "nothing is recorded while profiling is off"
    );
    m.set_profiling(true);
    for _ in 0..3 {
        m.set_inputs(&inputs).unwrap();
        m.execute().unwrap();
    }
    let profile = m.profile();
    let calls = |name: &str| profile.iter().find(|e| e.name == name).map(|e| e.calls);
    // The conv net calls convolution twice and addmm once per execution.
    assert_eq!(calls("aten::convolution.out"), Some(6));
    assert_eq!(calls("aten::addmm.out"), Some(3));
    assert!(profile.windows(2).all(|w| w[0].total >= w[1].total));
    assert!(profile.iter().all(|e| !e.delegate));
}
