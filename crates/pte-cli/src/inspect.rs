//! `pte inspect`: what is inside a `.pte`, `.ptd` or `.bpte` file.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use pte_format::summary::{self, MethodSummary, ProgramSummary, ValueSummary};
use pte_format::{Bpte, FileBytes, FileKind, Ptd, Pte};
use serde::Serialize;

use crate::table::Table;

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Document {
    Program(ProgramSummary),
    Data(summary::DataSummary),
    Bundled(summary::BundledSummary),
}

#[derive(Serialize)]
struct Envelope<'a> {
    format_version: u32,
    path: &'a str,
    #[serde(flatten)]
    document: Document,
}

/// Summaries of the XNNPACK delegates' payloads, per method and delegate (`None` for
/// other backends; an error message for a payload that does not validate).
type Xnnpack = Vec<Vec<Option<std::result::Result<pte_xnnpack::Summary, String>>>>;

fn xnnpack_details(pte: &Pte<'_>) -> Result<Xnnpack> {
    let mut out = Vec::new();
    for plan in pte.program().execution_plan()?.into_iter().flatten() {
        let mut delegates = Vec::new();
        for d in plan?.delegates()?.into_iter().flatten() {
            let d = d?;
            let entry = match (d.id()?, d.processed()?) {
                (Some(pte_xnnpack::BACKEND_ID), Some(r)) => Some(
                    pte.delegate_data(r)
                        .map_err(|e| e.to_string())
                        .and_then(|p| pte_xnnpack::summarize(p).map_err(|e| e.to_string())),
                ),
                _ => None,
            };
            delegates.push(entry);
        }
        out.push(delegates);
    }
    Ok(out)
}

pub fn run(path: &Path, json: bool) -> Result<()> {
    let bytes = FileBytes::read(path)?;
    let mut xnnpack = Xnnpack::new();
    let document = match FileKind::detect(&bytes) {
        Some(FileKind::Program) => {
            let pte = Pte::parse(&bytes)?;
            xnnpack = xnnpack_details(&pte)?;
            Document::Program(summary::program(&pte)?)
        }
        Some(FileKind::Data) => Document::Data(summary::data(&Ptd::parse(&bytes)?)?),
        Some(FileKind::Bundled) => {
            let bpte = Bpte::parse(&bytes)?;
            xnnpack = xnnpack_details(bpte.program())?;
            Document::Bundled(summary::bundled(&bpte, bytes.len() as u64)?)
        }
        None => bail!(
            "{} is not a .pte, .ptd or .bpte file (its identifier at offset 4 is {:?})",
            path.display(),
            String::from_utf8_lossy(bytes.get(4..8).unwrap_or(&[]))
        ),
    };
    let missing = missing_operators(&document);
    if json {
        let envelope = Envelope {
            format_version: summary::SUMMARY_FORMAT_VERSION,
            path: &path.to_string_lossy(),
            document,
        };
        let mut value = serde_json::to_value(&envelope).context("JSON output")?;
        mark_missing(&mut value, &missing);
        add_xnnpack(&mut value, &xnnpack)?;
        println!(
            "{}",
            serde_json::to_string_pretty(&value).context("JSON output")?
        );
        return Ok(());
    }
    let text = match &document {
        Document::Program(p) => program_text(path, p, "program", &missing, &xnnpack),
        Document::Data(d) => data_text(path, d),
        Document::Bundled(b) => bundled_text(path, b, &missing, &xnnpack),
    };
    print!("{text}");
    Ok(())
}

/// The operators of a program (or of a bundle's program) that this build has no kernel for.
fn missing_operators(document: &Document) -> BTreeSet<String> {
    let program = match document {
        Document::Program(p) => p,
        Document::Bundled(b) => &b.program,
        Document::Data(_) => return BTreeSet::new(),
    };
    let kernels = pte_kernels::registry();
    program
        .methods
        .iter()
        .flat_map(|m| &m.operators)
        .filter(|op| kernels.get(&op.name).is_none())
        .map(|op| op.name.clone())
        .collect()
}

/// Adds `"xnnpack"` (the payload summary, or `{"error": message}`) to every XNNPACK
/// delegate of the JSON document.
fn add_xnnpack(document: &mut serde_json::Value, xnnpack: &Xnnpack) -> Result<()> {
    let program = match document.get("program") {
        Some(serde_json::Value::Object(_)) => &mut document["program"],
        _ => document,
    };
    let Some(methods) = program
        .get_mut("methods")
        .and_then(serde_json::Value::as_array_mut)
    else {
        return Ok(());
    };
    for (method, details) in methods.iter_mut().zip(xnnpack) {
        let Some(delegates) = method
            .get_mut("delegates")
            .and_then(serde_json::Value::as_array_mut)
        else {
            continue;
        };
        for (d, detail) in delegates.iter_mut().zip(details) {
            match detail {
                Some(Ok(summary)) => {
                    d["xnnpack"] = serde_json::to_value(summary).context("JSON output")?
                }
                Some(Err(e)) => d["xnnpack"] = serde_json::json!({ "error": e }),
                None => {}
            }
        }
    }
    Ok(())
}

/// Adds `"missing": bool` to every operator and a `missing_operators` list to every method
/// of the JSON document (the program's, or the bundled program's).
fn mark_missing(document: &mut serde_json::Value, missing: &BTreeSet<String>) {
    let program = match document.get("program") {
        Some(serde_json::Value::Object(_)) => &mut document["program"],
        _ => document,
    };
    let Some(methods) = program
        .get_mut("methods")
        .and_then(serde_json::Value::as_array_mut)
    else {
        return;
    };
    for method in methods {
        let mut lacking = Vec::new();
        if let Some(ops) = method
            .get_mut("operators")
            .and_then(serde_json::Value::as_array_mut)
        {
            for op in ops {
                let name = op["name"].as_str().unwrap_or_default().to_owned();
                let is_missing = missing.contains(&name);
                op["missing"] = is_missing.into();
                if is_missing {
                    lacking.push(serde_json::Value::from(name));
                }
            }
        }
        method["missing_operators"] = lacking.into();
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 10 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 10 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

fn program_text(
    path: &Path,
    p: &ProgramSummary,
    what: &str,
    missing: &BTreeSet<String>,
    xnnpack: &Xnnpack,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: ExecuTorch {what} (ET12, schema version {}), {}",
        path.display(),
        p.schema_version,
        bytes(p.file_size)
    );
    match &p.header {
        Some(h) => {
            let _ = writeln!(
                out,
                "header: eh00, {} bytes; program data {} ; segments at {:#x}, {}",
                h.length,
                bytes(h.program_size),
                h.segment_base_offset,
                h.segment_data_size
                    .map_or("size not recorded".to_owned(), bytes)
            );
        }
        None => out.push_str("header: none (no segment data)\n"),
    }
    if !p.segments.is_empty() {
        let mut t = Table::new(["segment", "offset", "size", "role"]);
        for s in &p.segments {
            t.row(vec![
                s.index.to_string(),
                format!("{:#x}", s.offset),
                bytes(s.size),
                s.role.to_owned(),
            ]);
        }
        out.push_str("\nsegments:\n");
        out.push_str(&t.render());
    }
    if !p.named_data.is_empty() {
        let mut t = Table::new(["key", "segment", "size"]);
        for n in &p.named_data {
            t.row(vec![
                n.key.clone(),
                n.segment_index.to_string(),
                bytes(n.bytes),
            ]);
        }
        out.push_str("\nnamed data:\n");
        out.push_str(&t.render());
    }
    for (i, m) in p.methods.iter().enumerate() {
        method_text(
            &mut out,
            m,
            missing,
            xnnpack.get(i).map_or(&[], Vec::as_slice),
        );
    }
    out
}

/// "Name count, name count, ..." of a count map.
fn counts(map: &std::collections::BTreeMap<String, usize>) -> String {
    let mut v: Vec<(&String, &usize)> = map.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn value_row(direction: &str, i: usize, v: &ValueSummary) -> Vec<String> {
    let shape = v
        .shape
        .as_ref()
        .map(|s| format!("{s:?}"))
        .or_else(|| v.value.clone())
        .unwrap_or_default();
    vec![
        format!("{direction} {i}"),
        v.kind.to_owned(),
        v.dtype.unwrap_or("").to_owned(),
        shape,
        v.dim_order
            .as_ref()
            .map(|d| format!("{d:?}"))
            .unwrap_or_default(),
        v.dynamism.unwrap_or("").to_owned(),
        match v.memory_planned {
            Some(true) => "planned".to_owned(),
            Some(false) => "caller".to_owned(),
            None => String::new(),
        },
        v.nbytes.map(bytes).unwrap_or_default(),
    ]
}

fn method_text(
    out: &mut String,
    m: &MethodSummary,
    missing: &BTreeSet<String>,
    xnnpack: &[Option<std::result::Result<pte_xnnpack::Summary, String>>],
) {
    let _ = writeln!(
        out,
        "\nmethod {:?}: {} values, {} instructions",
        m.name, m.num_values, m.num_instructions
    );
    let mut t = Table::new([
        "",
        "kind",
        "dtype",
        "shape",
        "dim order",
        "dynamism",
        "memory",
        "bytes",
    ]);
    for (i, v) in m.inputs.iter().enumerate() {
        t.row(value_row("input", i, v));
    }
    for (i, v) in m.outputs.iter().enumerate() {
        t.row(value_row("output", i, v));
    }
    out.push_str(&t.render());
    let planned: Vec<String> = m
        .planned_buffers
        .iter()
        .map(|&b| bytes(b.max(0) as u64))
        .collect();
    let _ = writeln!(
        out,
        "  planned memory: {}",
        if planned.is_empty() {
            "none".to_owned()
        } else {
            planned.join(", ")
        }
    );
    let _ = write!(
        out,
        "  constants: {} tensors, {}",
        m.constants.count,
        bytes(m.constants.bytes)
    );
    if !m.constants.external_keys.is_empty() {
        let _ = write!(
            out,
            "; {} external: {}",
            m.constants.external_keys.len(),
            m.constants.external_keys.join(", ")
        );
    }
    out.push('\n');
    if !m.operators.is_empty() {
        let mut t = Table::new(["operator", "calls", "kernel"]);
        let mut lacking = Vec::new();
        for op in &m.operators {
            let is_missing = missing.contains(&op.name);
            if is_missing {
                lacking.push(op.name.as_str());
            }
            t.row(vec![
                op.name.clone(),
                op.calls.to_string(),
                if is_missing { "MISSING" } else { "" }.to_owned(),
            ]);
        }
        out.push_str(&t.render());
        if !lacking.is_empty() {
            let _ = writeln!(
                out,
                "  missing operators ({}): {} (see `pte ops`)",
                lacking.len(),
                lacking.join(", ")
            );
        }
    }
    if !m.delegates.is_empty() {
        let mut t = Table::new(["delegate", "payload", "location", "calls", "compile specs"]);
        for d in &m.delegates {
            t.row(vec![
                d.backend.clone(),
                bytes(d.payload_bytes),
                format!("{} {}", d.location, d.index),
                d.calls.to_string(),
                d.compile_specs.join(", "),
            ]);
        }
        out.push_str(&t.render());
        for (i, detail) in xnnpack.iter().enumerate() {
            match detail {
                Some(Ok(x)) => {
                    let _ = writeln!(
                        out,
                        "  XNNPACK delegate {i} ({}{}): {} nodes, {} values ({} constants, {}), \
                         {} inputs, {} outputs",
                        x.identifier,
                        if x.header { ", XH00 header" } else { "" },
                        x.num_nodes,
                        x.num_values,
                        x.constants,
                        bytes(x.constant_bytes),
                        x.inputs,
                        x.outputs
                    );
                    let _ = writeln!(out, "    nodes: {}", counts(&x.nodes));
                    let _ = writeln!(out, "    datatypes: {}", counts(&x.datatypes));
                }
                Some(Err(e)) => {
                    let _ = writeln!(out, "  XNNPACK delegate {i}: invalid payload: {e}");
                }
                None => {}
            }
        }
    }
}

fn data_text(path: &Path, d: &summary::DataSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: ExecuTorch named data (FT01, schema version {}), {}",
        path.display(),
        d.schema_version,
        bytes(d.file_size)
    );
    let _ = writeln!(
        out,
        "header: FH01, flatbuffer {} at {}; segments at {:#x}, {}",
        bytes(d.header.flatbuffer_size),
        d.header.flatbuffer_offset,
        d.header.segment_base_offset,
        bytes(d.header.segment_data_size)
    );
    let mut t = Table::new(["key", "dtype", "shape", "dim order", "bytes", "segment"]);
    for e in &d.entries {
        t.row(vec![
            e.key.clone(),
            e.dtype.unwrap_or("(blob)").to_owned(),
            e.shape
                .as_ref()
                .map(|s| format!("{s:?}"))
                .unwrap_or_default(),
            e.dim_order
                .as_ref()
                .map(|s| format!("{s:?}"))
                .unwrap_or_default(),
            bytes(e.bytes),
            e.segment_index.to_string(),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    out
}

fn bundled_text(
    path: &Path,
    b: &summary::BundledSummary,
    missing: &BTreeSet<String>,
    xnnpack: &Xnnpack,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: ExecuTorch bundled program (BP08, schema version {}), {}",
        path.display(),
        b.schema_version,
        bytes(b.file_size)
    );
    let mut t = Table::new(["method", "case", "inputs", "expected outputs"]);
    for s in &b.test_suites {
        for (i, c) in s.cases.iter().enumerate() {
            t.row(vec![
                s.method.clone(),
                i.to_string(),
                c.inputs.join(", "),
                c.expected_outputs.join(", "),
            ]);
        }
    }
    out.push_str("\ntest suites:\n");
    out.push_str(&t.render());
    out.push_str("\nembedded ");
    out.push_str(&program_text(
        Path::new("program"),
        &b.program,
        "program",
        missing,
        xnnpack,
    ));
    out
}
