//! Test support shared by the workspace's integration tests: where the reference fixtures
//! live and what `tests/fixtures/manifest.json` (written by `tools/gen_fixtures.py`) and
//! `tests/xnnpack/manifest.json` (`tools/gen_xnnpack_fixtures.py`) say about each of them, and [`program::ProgramBuilder`] for programs made up in tests.

#![forbid(unsafe_code)]

pub mod program;

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The committed fixture directory, or `PTE_FIXTURE_DIR` when set (e.g. the larger
/// models `tools/gen_fixtures.py --bench DIR` writes, in the same layout).
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("PTE_FIXTURE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"),
    }
}

/// The whole manifest.
#[derive(Debug, Deserialize)]
pub struct Manifest {
    pub executorch: String,
    pub torch: String,
    pub fixtures: Vec<Fixture>,
}

/// One exported program with its cases.
#[derive(Debug, Deserialize)]
pub struct Fixture {
    pub name: String,
    /// Path of the `.pte` or `.bpte`, relative to the fixture directory.
    pub program: String,
    /// `.ptd` files the program needs.
    #[serde(default)]
    pub data: Vec<String>,
    #[serde(default)]
    pub methods: Vec<String>,
    /// Sorted operator names each method calls, as upstream's exporter recorded them.
    #[serde(default)]
    pub operators: std::collections::BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub cases: Vec<Case>,
    /// Cases must run in order on one loaded method (state carries over).
    #[serde(default)]
    pub sequential: bool,
    /// Loading without the `.ptd` files must fail.
    #[serde(default)]
    pub expect_error_without_data: bool,
    #[serde(default)]
    pub bundled: bool,
    /// `portable`, or the backend the program was lowered to (`xnnpack`).
    #[serde(default)]
    pub lowering: String,
    /// Tolerance for float outputs; every fixture states its own.
    pub tolerance: Tolerance,
    /// The directory its paths are relative to (set by [`manifest_in`]; the fixture
    /// directory otherwise).
    #[serde(skip)]
    pub root: Option<PathBuf>,
}

/// One call of a method with upstream's recorded outputs.
#[derive(Debug, Deserialize)]
pub struct Case {
    pub method: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// `tensor`, `int`, `float` or `bool` per input (all tensors when absent).
    #[serde(default)]
    pub input_kinds: Vec<String>,
    #[serde(default)]
    pub output_kinds: Vec<String>,
}

/// Tolerance for float outputs, exactly as the manifest states it: an element passes when
/// `|actual - expected| <= atol + rtol * |expected|` (numpy's `allclose` rule). NaN must
/// match NaN and infinities must be equal.
#[derive(Clone, Copy, Debug, Deserialize)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Tolerance {
    /// The first element where `actual` and `expected` differ beyond tolerance, as
    /// `(index, actual, expected)`.
    pub fn first_mismatch(&self, actual: &[f64], expected: &[f64]) -> Option<(usize, f64, f64)> {
        actual
            .iter()
            .zip(expected)
            .enumerate()
            .find(|(_, (&a, &b))| {
                if a.is_nan() || b.is_nan() {
                    !(a.is_nan() && b.is_nan())
                } else if a.is_infinite() || b.is_infinite() {
                    a != b
                } else {
                    (a - b).abs() > self.atol + self.rtol * b.abs()
                }
            })
            .map(|(i, (&a, &b))| (i, a, b))
    }
}

impl Fixture {
    /// Absolute path of a fixture-relative path.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.root
            .clone()
            .unwrap_or_else(fixtures_dir)
            .join(relative)
    }

    /// The program file.
    pub fn program_path(&self) -> PathBuf {
        self.path(&self.program)
    }

    /// The `.ptd` files.
    pub fn data_paths(&self) -> Vec<PathBuf> {
        self.data.iter().map(|d| self.path(d)).collect()
    }
}

/// Reads the manifest.
pub fn manifest() -> Manifest {
    manifest_in(&fixtures_dir())
}

/// Reads the manifest of another fixture directory of the same layout; its fixtures'
/// paths are relative to `dir`.
pub fn manifest_in(dir: &Path) -> Manifest {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut m: Manifest =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad {}: {e}", path.display()));
    for f in &mut m.fixtures {
        f.root = Some(dir.to_path_buf());
    }
    m
}

/// The committed XNNPACK-delegated fixtures (`tests/xnnpack`, written by
/// `tools/gen_xnnpack_fixtures.py`).
pub fn xnnpack_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/xnnpack")
}

/// `n` deterministic values in [-1, 1) from a linear congruential sequence seeded by
/// `seed`, for tests that need inputs and weights without a random-number crate.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The committed operator conformance suite (`tests/conformance`).
pub fn conformance_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance")
}

/// Every fixture file of a kind (by extension) under the fixture directory.
pub fn files_with_extension(ext: &str) -> Vec<PathBuf> {
    files_under(&fixtures_dir(), ext)
}

/// Every file of a kind (by extension) under `root`, sorted.
pub fn files_under(root: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("fixture dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Resident bytes of this process's mappings of the file at `path`, from
/// `/proc/self/smaps` (0 where the system does not say).
pub fn resident_bytes_of(path: &Path) -> usize {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let name = path.to_string_lossy();
    let mut inside = false;
    let mut kb = 0;
    for line in smaps.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            if inside {
                kb += rss
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<usize>()
                    .unwrap_or(0);
            }
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|f| f.contains('-'))
        {
            // A mapping's header: `start-end perms offset dev inode [path]`.
            inside = line.ends_with(name.as_ref());
        }
    }
    kb * 1024
}

/// A file in the system's temporary directory, removed when dropped.
pub struct TempFile(PathBuf);

impl TempFile {
    /// Writes `bytes` to a file named after `name` and this process.
    pub fn new(name: &str, bytes: &[u8]) -> std::io::Result<Self> {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::write(&path, bytes)?;
        Ok(TempFile(path))
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
