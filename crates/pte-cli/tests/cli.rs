//! The `pte` binary end to end: `ops`, how `inspect` and `run` report operators this
//! build has no kernel for.

use std::path::PathBuf;
use std::process::{Command, Output};

use pte_format::schema::executorch_flatbuffer::ScalarType;
use pte_testkit::program::{Memory, ProgramBuilder};

fn pte(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pte"))
        .args(args)
        .output()
        .expect("running pte")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A program calling `aten::add.out` and two operators no build will ever have.
fn program_with_missing_operators(test: &str) -> PathBuf {
    let mut b = ProgramBuilder::new();
    let x = b.tensor(ScalarType::Float, &[2], Memory::Planned);
    let out = b.tensor(ScalarType::Float, &[2], Memory::Planned);
    let alpha = b.int(1);
    b.input(x);
    b.call("aten::add", "out", &[x, x, alpha, out, out]);
    b.call("test::no_such_op", "out", &[x, out, out]);
    b.call("test::another_missing_op", "", &[x, out]);
    b.output(out);
    let path = std::env::temp_dir().join(format!("pte-cli-{test}-{}.pte", std::process::id()));
    std::fs::write(&path, b.build()).unwrap();
    path
}

#[test]
fn ops_lists_sorted_kernel_names() {
    let o = pte(&["ops"]);
    assert!(o.status.success());
    let names: Vec<String> = stdout(&o).lines().map(str::to_owned).collect();
    assert!(names.iter().any(|n| n == "aten::add.out"), "{names:?}");
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);

    let json: Vec<String> = serde_json::from_str(&stdout(&pte(&["ops", "--json"]))).unwrap();
    assert_eq!(json, names);
}

#[test]
fn inspect_marks_missing_operators() {
    let path = program_with_missing_operators("inspect");
    let file = path.to_str().unwrap();
    let text = stdout(&pte(&["inspect", file]));
    assert!(
        text.contains("missing operators (2): test::no_such_op.out, test::another_missing_op"),
        "{text}"
    );

    let o = pte(&["inspect", "--json", file]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let method = &doc["methods"][0];
    assert_eq!(
        method["missing_operators"],
        serde_json::json!(["test::no_such_op.out", "test::another_missing_op"])
    );
    for op in method["operators"].as_array().unwrap() {
        let missing = op["name"].as_str().unwrap().starts_with("test::");
        assert_eq!(op["missing"], missing, "{op}");
    }
    std::fs::remove_file(path).unwrap();
}

#[test]
fn run_names_every_missing_operator() {
    let path = program_with_missing_operators("run");
    let o = pte(&["run", path.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("test::no_such_op") && err.contains("test::another_missing_op"),
        "{err}"
    );
    assert!(!err.contains("aten::add.out"), "{err}");
    std::fs::remove_file(path).unwrap();
}

/// A committed torch.export archive.
fn archive(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/pt2/{name}/model.pt2"));
    p.to_str().unwrap().to_owned()
}

#[test]
fn compile_writes_a_program_that_runs_and_prints_stages() {
    let dir = std::env::temp_dir().join(format!("pte-cli-compile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pte_path = dir.join("m.pte");
    let ptd_path = dir.join("m.ptd");
    let o = pte(&[
        "compile",
        &archive("linear_clamp"),
        "-o",
        pte_path.to_str().unwrap(),
        "--external-constants",
        ptd_path.to_str().unwrap(),
        "--print",
        "planned",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = stdout(&o);
    assert!(text.contains("torch.ops.aten.addmm.out("), "{text}");
    assert!(text.contains("Planned memory:"), "{text}");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        err.contains("planned memory") && err.contains("upstream"),
        "{err}"
    );
    // Without the .ptd the program cannot load; with it, it runs.
    assert!(!pte(&["run", pte_path.to_str().unwrap()]).status.success());
    let run = pte(&[
        "run",
        pte_path.to_str().unwrap(),
        "--data",
        ptd_path.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn compile_rejects_unknown_stages_and_bad_archives() {
    let o = pte(&[
        "compile",
        &archive("linear_clamp"),
        "-o",
        "/dev/null",
        "--print",
        "nope",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("export, core, edge, planned"));
    let bad = std::env::temp_dir().join(format!("pte-cli-bad-{}.pt2", std::process::id()));
    std::fs::write(&bad, b"not an archive").unwrap();
    let o = pte(&["compile", bad.to_str().unwrap(), "-o", "/dev/null"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a zip archive"));
    std::fs::remove_file(&bad).ok();
}

/// `pte bench` counts heap allocations: none per execution in the steady state, for
/// plain programs and for XNNPACK-delegated ones (float, quantized pooling, dynamically
/// quantized and 4-bit products, attention), on one and two threads.
#[test]
fn bench_reports_no_allocations_per_execution() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests");
    for file in [
        "fixtures/linear_clamp/model.pte",
        "fixtures/convnet/model.pte",
        "fixtures/transformer_block/model.pte",
        "xnnpack/xnn_convnet/model.pte",
        "xnnpack/xnn_int8_static/model.pte",
        "xnnpack/xnn_int8_dynamic/model.pte",
        "xnnpack/xnn_int4_groupwise/model.pte",
        "xnnpack/xnn_transformer_block/model.pte",
    ] {
        let path = format!("{root}/{file}");
        for threads in ["1", "2"] {
            let o = pte(&[
                "bench",
                &path,
                "--threads",
                threads,
                "--warmup",
                "1",
                "--iterations",
                "3",
                "--json",
            ]);
            assert!(
                o.status.success(),
                "{file}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(
                doc["allocations_per_execution"],
                serde_json::json!(0.0),
                "{file} on {threads} thread(s)"
            );
        }
    }
}
