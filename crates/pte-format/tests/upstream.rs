//! Files we write run in upstream ExecuTorch with outputs identical to the originals.
//!
//! Needs the reference environment (`.venv-ref`, see DEVELOPERS.md), so it is ignored by
//! default and CI skips it: `cargo test -p pte-format --test upstream -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

use pte_format::{write_ptd, ProgramImage, WriteOptions};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn json_str(s: &Path) -> String {
    format!("{:?}", s.to_str().expect("utf-8 path"))
}

#[test]
#[ignore = "needs the reference environment in .venv-ref"]
fn rewritten_programs_run_identically_in_upstream() {
    let python = root().join(".venv-ref/bin/python");
    assert!(python.exists(), "create .venv-ref first (DEVELOPERS.md)");
    let tmp = std::env::temp_dir().join(format!("pte-upstream-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();

    // (original outdir, rewritten outdir, number of outputs, what)
    let mut comparisons: Vec<(PathBuf, PathBuf, usize, String)> = Vec::new();
    let mut jobs: Vec<String> = Vec::new();
    let job = |model: &Path,
               data: &[PathBuf],
               method: &str,
               inputs: &[PathBuf],
               kinds: &[String],
               out: &Path| {
        format!(
            "{{\"model\": {}, \"data\": [{}], \"method\": {:?}, \"inputs\": [{}], \"input_kinds\": [{}], \"outdir\": {}}}",
            json_str(model),
            data.iter().map(|d| json_str(d)).collect::<Vec<_>>().join(","),
            method,
            inputs.iter().map(|d| json_str(d)).collect::<Vec<_>>().join(","),
            kinds.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(","),
            json_str(out),
        )
    };
    let manifest = pte_testkit::manifest();
    for f in manifest
        .fixtures
        .iter()
        .filter(|f| !f.bundled && !f.sequential)
    {
        let bytes = std::fs::read(f.program_path()).unwrap();
        let mut variants: Vec<(String, Vec<u8>, Vec<PathBuf>)> = Vec::new();
        for alignment in [128u64, 4096] {
            let options = WriteOptions {
                segment_alignment: alignment,
                ..Default::default()
            };
            let out = ProgramImage::parse(&bytes)
                .unwrap()
                .to_bytes(&options)
                .unwrap();
            variants.push((format!("aligned{alignment}"), out, f.data_paths()));
        }
        if f.data.is_empty() {
            let options = WriteOptions::default();
            let mut image = ProgramImage::parse(&bytes).unwrap();
            let entries = image.externalize_constants(&options).unwrap();
            if !entries.is_empty() {
                let ptd = tmp.join(format!("{}.ptd", f.name));
                std::fs::write(&ptd, write_ptd(&entries, &options).unwrap()).unwrap();
                variants.push(("external".into(), image.write(&options).unwrap(), vec![ptd]));
            }
        }
        for (label, program, _) in &variants {
            std::fs::write(tmp.join(format!("{}-{label}.pte", f.name)), program).unwrap();
        }
        for (k, c) in f.cases.iter().enumerate() {
            let inputs: Vec<PathBuf> = c.inputs.iter().map(|i| f.path(i)).collect();
            let reference = tmp.join(format!("{}-{k}-ref", f.name));
            jobs.push(job(
                &f.program_path(),
                &f.data_paths(),
                &c.method,
                &inputs,
                &c.input_kinds,
                &reference,
            ));
            for (label, _, data) in &variants {
                let out = tmp.join(format!("{}-{k}-{label}", f.name));
                let model = tmp.join(format!("{}-{label}.pte", f.name));
                jobs.push(job(&model, data, &c.method, &inputs, &c.input_kinds, &out));
                comparisons.push((
                    reference.clone(),
                    out,
                    c.outputs.len(),
                    format!("{} {label} case {k}", f.name),
                ));
            }
        }
    }
    let jobs_file = tmp.join("jobs.json");
    std::fs::write(&jobs_file, format!("[{}]", jobs.join(",\n"))).unwrap();
    let status = Command::new(&python)
        .arg(root().join("tools/upstream_run.py"))
        .arg("--jobs")
        .arg(&jobs_file)
        .status()
        .expect("running upstream");
    assert!(
        status.success(),
        "upstream failed on one of the programs (see output)"
    );
    for (reference, out, n, what) in &comparisons {
        for i in 0..*n {
            let a = std::fs::read(reference.join(format!("{i}.npy"))).unwrap();
            let b = std::fs::read(out.join(format!("{i}.npy"))).unwrap();
            assert_eq!(a, b, "{what}: output {i} differs");
        }
    }
    assert!(
        comparisons.len() > 100,
        "{} runs compared",
        comparisons.len()
    );
    eprintln!(
        "{} rewritten-program runs matched upstream's originals exactly",
        comparisons.len()
    );
    std::fs::remove_dir_all(&tmp).ok();
}
