//! Hostile and malformed archives: every one is an error that says what is wrong, never a
//! panic, and reading stays within its limits.

use std::io::{Cursor, Read, Write};
use std::path::Path;

use pte_compiler::{compile, ArchiveLimits, CompileError, CompileOptions};
use zip::write::SimpleFileOptions;

fn fixture(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/pt2/{name}/model.pt2"));
    std::fs::read(p).unwrap()
}

/// Every entry of an archive, in order, as (name, bytes).
fn entries(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut z = zip::ZipArchive::new(Cursor::new(archive)).unwrap();
    (0..z.len())
        .map(|i| {
            let mut f = z.by_index(i).unwrap();
            let mut b = Vec::new();
            f.read_to_end(&mut b).unwrap();
            (f.name().unwrap().into_owned(), b)
        })
        .collect()
}

fn zip_of(entries: &[(String, Vec<u8>)], method: zip::CompressionMethod) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = SimpleFileOptions::default().compression_method(method);
    for (name, data) in entries {
        w.start_file(name.as_str(), opts).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// The fixture with one entry's content changed.
fn edited(name: &str, entry_suffix: &str, f: impl Fn(&str) -> String) -> Vec<u8> {
    let mut es = entries(&fixture(name));
    let e = es
        .iter_mut()
        .find(|(n, _)| n.ends_with(entry_suffix))
        .unwrap();
    e.1 = f(std::str::from_utf8(&e.1).unwrap()).into_bytes();
    zip_of(&es, zip::CompressionMethod::Stored)
}

fn err(bytes: &[u8]) -> CompileError {
    match compile(bytes, &CompileOptions::default()) {
        Ok(_) => panic!("compiled"),
        Err(e) => e,
    }
}

#[test]
fn the_unchanged_fixture_compiles_after_rezipping() {
    let es = entries(&fixture("linear_clamp"));
    for method in [
        zip::CompressionMethod::Stored,
        zip::CompressionMethod::Deflated,
    ] {
        compile(&zip_of(&es, method), &CompileOptions::default()).unwrap();
    }
}

#[test]
fn not_a_zip_is_an_archive_error() {
    assert!(matches!(
        err(b"not a zip file at all"),
        CompileError::Archive(_)
    ));
    assert!(matches!(err(&[]), CompileError::Archive(_)));
}

#[test]
fn unsafe_entry_names_are_refused() {
    for bad in [
        "m/../../etc/passwd",
        "/abs/archive_format",
        "m/./archive_format",
    ] {
        let mut es = entries(&fixture("linear_clamp"));
        es.push((bad.to_owned(), b"x".to_vec()));
        let e = err(&zip_of(&es, zip::CompressionMethod::Stored));
        assert!(
            e.to_string().contains("unsafe name") || e.to_string().contains("top-level"),
            "{bad}: {e}"
        );
    }
    let mut es = entries(&fixture("linear_clamp"));
    es.push(("other/models/model.json".into(), b"{}".to_vec()));
    assert!(err(&zip_of(&es, zip::CompressionMethod::Stored))
        .to_string()
        .contains("two top-level folders"));
}

#[test]
fn other_torch_versions_are_refused_saying_what_is_supported() {
    let bytes = edited("linear_clamp", "models/model.json", |s| {
        s.replace("\"torch_version\": \"2.15.0", "\"torch_version\": \"2.9.1")
    });
    let e = err(&bytes);
    assert!(matches!(e, CompileError::Unsupported(_)));
    let msg = e.to_string();
    assert!(msg.contains("2.9.1") && msg.contains("torch 2.15"), "{msg}");
    let bytes = edited("linear_clamp", "models/model.json", |s| {
        s.replace("\"major\": 8", "\"major\": 7")
    });
    assert!(err(&bytes).to_string().contains("export schema 7."));
    let bytes = edited("linear_clamp", "archive_format", |_| "pt1".into());
    assert!(matches!(err(&bytes), CompileError::Unsupported(_)));
}

#[test]
fn pickled_weights_are_refused() {
    let bytes = edited("linear_clamp", "weights_config.json", |s| {
        s.replacen("\"use_pickle\": false", "\"use_pickle\": true", 1)
    });
    let e = err(&bytes);
    assert!(matches!(e, CompileError::Unsupported(_)));
    assert!(e.to_string().contains("pickled"), "{e}");
}

#[test]
fn a_weight_view_past_its_storage_is_refused() {
    let bytes = edited("linear_clamp", "weights_config.json", |s| {
        s.replacen(
            "\"storage_offset\": {\"as_int\": 0}",
            "\"storage_offset\": {\"as_int\": 1000000}",
            1,
        )
    });
    assert!(err(&bytes).to_string().contains("reaches past its storage"));
    let bytes = edited("linear_clamp", "weights_config.json", |s| {
        s.replacen(
            "\"strides\": [{\"as_int\": 4}",
            "\"strides\": [{\"as_int\": 4611686018427387904}",
            1,
        )
    });
    let _ = err(&bytes);
}

#[test]
fn a_zip_bomb_stops_at_the_limit() {
    // 64 MiB of zeros deflate to about 64 KiB.
    let mut es = entries(&fixture("linear_clamp"));
    let w = es
        .iter_mut()
        .find(|(n, _)| n.ends_with("data/weights/weight_0"))
        .unwrap();
    w.1 = vec![0; 64 << 20];
    let bytes = zip_of(&es, zip::CompressionMethod::Deflated);
    assert!(bytes.len() < 1 << 20);
    let options = CompileOptions {
        limits: ArchiveLimits {
            max_total_bytes: 8 << 20,
            ..Default::default()
        },
        ..Default::default()
    };
    let e = compile(&bytes, &options).err().unwrap();
    assert!(e.to_string().contains("more than the"), "{e}");
}

#[test]
fn deeply_nested_json_is_an_error() {
    let bytes = edited("linear_clamp", "models/model.json", |s| {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        s.replacen("\"verifiers\": [", &format!("\"verifiers\": [{deep}, "), 1)
    });
    assert!(matches!(err(&bytes), CompileError::Invalid { .. }));
}

#[test]
fn operators_without_decomposition_are_listed_together() {
    let bytes = edited("convnet", "models/model.json", |s| {
        s.replacen(
            "torch.ops.aten.conv2d.default",
            "torch.ops.aten.frobnicate.default",
            1,
        )
        .replacen(
            "torch.ops.aten.max_pool2d.default",
            "torch.ops.aten.quux.default",
            1,
        )
    });
    let e = err(&bytes);
    let msg = e.to_string();
    assert!(
        msg.contains("aten::frobnicate") && msg.contains("aten::quux"),
        "{msg}"
    );
    assert!(msg.contains("run_decompositions"), "{msg}");
}

#[test]
fn truncated_and_corrupted_archives_never_panic() {
    let good = fixture("cond");
    for cut in (0..good.len()).step_by(97) {
        let _ = compile(good.get(..cut).unwrap(), &CompileOptions::default());
    }
    // Deterministic byte flips (xorshift), also inside the JSON.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..300 {
        let mut bytes = good.clone();
        for _ in 0..4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = (state as usize) % bytes.len();
            bytes[i] ^= (state >> 32) as u8 | 1;
        }
        let _ = compile(&bytes, &CompileOptions::default());
    }
    // Edits of the JSON that keep it valid but wrong.
    for (from, to) in [
        ("\"as_int\": 4", "\"as_int\": -4"),
        ("\"as_int\": 4", "\"as_int\": 99999999999"),
        ("\"name\": \"x\"", "\"name\": \"nothing\""),
        ("\"dtype\": 7", "\"dtype\": 99"),
        ("\"as_tensor\"", "\"as_float\""),
    ] {
        let bytes = edited("cond", "models/model.json", |s| s.replacen(from, to, 1));
        let _ = compile(&bytes, &CompileOptions::default());
    }
}
