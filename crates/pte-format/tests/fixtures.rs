//! Every committed fixture parses, round-trips losslessly, and survives repacking.

use std::collections::BTreeSet;

use pte_format::schema::executorch_flatbuffer as et;
use pte_format::summary::{self, operator_name};
use pte_format::{Bpte, FileBytes, FileKind, ProgramImage, Ptd, Pte, WriteOptions};

fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The embedded program bytes of a fixture (the file itself, or the one in a bundle).
fn program_bytes(bytes: &[u8]) -> &[u8] {
    match FileKind::detect(bytes) {
        Some(FileKind::Bundled) => Bpte::parse(bytes).unwrap().program().bytes(),
        _ => bytes,
    }
}

#[test]
fn every_fixture_parses_and_lists_upstreams_operators() {
    let manifest = pte_testkit::manifest();
    assert!(manifest.fixtures.len() >= 10);
    for f in &manifest.fixtures {
        let bytes = FileBytes::read(f.program_path()).unwrap();
        let pte = Pte::parse(program_bytes(&bytes)).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let s = summary::program(&pte).unwrap();
        let methods: BTreeSet<_> = s.methods.iter().map(|m| m.name.clone()).collect();
        assert_eq!(
            methods,
            f.methods.iter().cloned().collect(),
            "{}: methods",
            f.name
        );
        for m in &s.methods {
            let ours: BTreeSet<_> = m.operators.iter().map(|o| o.name.clone()).collect();
            let theirs: BTreeSet<_> = f
                .operators
                .get(&m.name)
                .unwrap_or_else(|| panic!("{}: no operators for {}", f.name, m.name))
                .iter()
                .cloned()
                .collect();
            assert_eq!(ours, theirs, "{}.{}: operators", f.name, m.name);
        }
        for d in f.data_paths() {
            let bytes = read(&d);
            let ptd = Ptd::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            assert!(!ptd.is_empty());
        }
    }
}

#[test]
fn bundled_fixture_has_test_cases() {
    let manifest = pte_testkit::manifest();
    let f = manifest
        .fixtures
        .iter()
        .find(|f| f.bundled)
        .expect("a bundled fixture");
    let bytes = read(&f.program_path());
    let bpte = Bpte::parse(&bytes).unwrap();
    let suites = summary::bundled(&bpte, bytes.len() as u64)
        .unwrap()
        .test_suites;
    assert!(!suites.is_empty());
    let cases: usize = suites.iter().map(|s| s.cases.len()).sum();
    assert!(cases >= 2, "{cases} cases");
    assert!(suites
        .iter()
        .all(|s| s.cases.iter().all(|c| !c.inputs.is_empty())));
}

/// The program with every segment offset zeroed, for comparing layouts that differ only in
/// where segments were placed.
fn without_offsets(mut p: et::Program) -> et::Program {
    for s in p.segments.iter_mut().flatten() {
        s.offset = 0;
    }
    p
}

/// The fixtures' programs and the conformance suite's (every scalar type upstream writes,
/// complex ones included).
fn all_programs() -> Vec<(String, Vec<u8>)> {
    let fixtures = pte_testkit::manifest().fixtures.into_iter().map(|f| {
        let bytes = read(&f.program_path());
        (f.name.clone(), program_bytes(&bytes).to_vec())
    });
    let suite = pte_testkit::files_under(&pte_testkit::conformance_dir(), "pte")
        .into_iter()
        .map(|p| (p.display().to_string(), read(&p)));
    let all: Vec<_> = fixtures.chain(suite).collect();
    assert!(all.len() > 1000, "only {} programs found", all.len());
    all
}

#[test]
fn read_write_read_is_lossless() {
    for (name, bytes) in all_programs() {
        let image = ProgramImage::parse(&bytes).unwrap();
        let written = image.to_bytes(&WriteOptions::default()).unwrap();
        let again = ProgramImage::parse(&written).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Compared as text: NaN scalars must round-trip too, and NaN != NaN.
        assert_eq!(
            format!("{:?}", without_offsets(again.program.clone())),
            format!("{:?}", without_offsets(image.program.clone())),
            "{name}: program table changed"
        );
        assert_eq!(
            again.segments, image.segments,
            "{name}: segment bytes changed"
        );
        // Writing is deterministic and idempotent.
        assert_eq!(
            again.to_bytes(&WriteOptions::default()).unwrap(),
            written,
            "{name}"
        );
        // The header is there exactly when there is segment data.
        let has_data = image.segments.iter().any(|s| !s.data.is_empty());
        assert_eq!(
            Pte::parse(&written).unwrap().header().is_some(),
            has_data,
            "{name}"
        );
    }
}

#[test]
fn upstream_layout_is_reproduced_for_the_seed_program() {
    // linear_clamp/model.pte is upstream's own buffer: our writer must put the header and
    // segments where upstream put them.
    let bytes = read(&pte_testkit::fixtures_dir().join("linear_clamp/model.pte"));
    let original = Pte::parse(&bytes).unwrap();
    let written = ProgramImage::parse(&bytes)
        .unwrap()
        .to_bytes(&WriteOptions::default())
        .unwrap();
    let ours = Pte::parse(&written).unwrap();
    let (h0, h1) = (original.header().unwrap(), ours.header().unwrap());
    assert_eq!(h1.length, h0.length);
    assert_eq!(h1.segment_data_size, h0.segment_data_size);
    assert_eq!(h1.segment_base_offset % 128, 0);
    assert_eq!(&written[4..12], b"ET12eh00");
    for i in 0..original.num_segments() {
        assert_eq!(ours.segment(i).unwrap(), original.segment(i).unwrap());
    }
}

#[test]
fn repacking_aligns_segments() {
    for (name, bytes) in all_programs() {
        for alignment in [64u64, 4096] {
            let options = WriteOptions {
                segment_alignment: alignment,
                ..WriteOptions::default()
            };
            let written = ProgramImage::parse(&bytes)
                .unwrap()
                .to_bytes(&options)
                .unwrap();
            let pte = Pte::parse(&written).unwrap();
            for i in 0..pte.num_segments() {
                let range = pte.segment_range(i).unwrap();
                if !range.is_empty() {
                    assert_eq!(range.start as u64 % alignment, 0, "{name} segment {i}");
                }
            }
        }
    }
}

#[test]
fn externalized_constants_match_the_original_bytes() {
    let mut moved_any = false;
    for (name, bytes) in all_programs() {
        let original = Pte::parse(&bytes).unwrap();
        let mut image = ProgramImage::from_pte(&original).unwrap();
        let options = WriteOptions::default();
        let entries = image.externalize_constants(&options).unwrap();
        let ptd_bytes = pte_format::write_ptd(&entries, &options).unwrap();
        let ptd = Ptd::parse(&ptd_bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(ptd.len(), entries.len());
        let written = image.write(&options).unwrap();
        let rewritten = Pte::parse(&written).unwrap();
        assert!(summary::program(&rewritten)
            .unwrap()
            .methods
            .iter()
            .all(|m| m.constants.count == 0));

        // Walk the original and rewritten values side by side.
        let plans = original.program().execution_plan().unwrap().unwrap();
        let new_plans = rewritten.program().execution_plan().unwrap().unwrap();
        for (plan, new_plan) in plans.iter().zip(new_plans.iter()) {
            let values = plan.unwrap().values().unwrap().unwrap();
            let new_values = new_plan.unwrap().values().unwrap().unwrap();
            for (v, nv) in values.iter().zip(new_values.iter()) {
                let (Some(et::KernelTypesRef::Tensor(t)), Some(et::KernelTypesRef::Tensor(nt))) =
                    (v.unwrap().val().unwrap(), nv.unwrap().val().unwrap())
                else {
                    continue;
                };
                let idx = t.data_buffer_idx().unwrap() as usize;
                let already_external = t
                    .extra_tensor_info()
                    .unwrap()
                    .is_some_and(|e| e.location().unwrap() == et::TensorDataLocation::External);
                if idx == 0 || t.allocation_info().unwrap().is_some() || already_external {
                    continue;
                }
                let sizes: Vec<i64> = t.sizes().unwrap().unwrap().iter().map(i64::from).collect();
                let nbytes =
                    pte_format::scalar::tensor_nbytes(t.scalar_type().unwrap(), sizes, "t")
                        .unwrap();
                let expected = original
                    .constant_segment()
                    .unwrap()
                    .unwrap()
                    .get(idx, nbytes)
                    .unwrap();
                let info = nt.extra_tensor_info().unwrap().expect("external info");
                assert_eq!(info.location().unwrap(), et::TensorDataLocation::External);
                let key = info.fully_qualified_name().unwrap().unwrap();
                let entry = ptd
                    .get(key)
                    .unwrap()
                    .unwrap_or_else(|| panic!("{name}: {key}"));
                let layout = entry.layout.unwrap();
                assert_eq!(layout.scalar_type, t.scalar_type().unwrap());
                assert_eq!(
                    layout.sizes,
                    t.sizes().unwrap().unwrap().iter().collect::<Vec<_>>()
                );
                assert_eq!(layout.dim_order, t.dim_order().unwrap().unwrap());
                assert_eq!(&entry.data[..nbytes], expected, "{name}: {key}");
                moved_any = true;
            }
        }
    }
    assert!(moved_any);
}

#[test]
fn operator_names_join_overloads() {
    assert_eq!(operator_name("aten::add", "out"), "aten::add.out");
    assert_eq!(operator_name("aten::copy_", ""), "aten::copy_");
}
