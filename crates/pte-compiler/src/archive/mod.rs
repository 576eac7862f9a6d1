//! Reading torch 2.15 `.pt2` archives (`torch.export.save`, `package_pt2`).
//!
//! An archive is a zip file whose entries share one top-level folder:
//! `archive_format` (`pt2`), `archive_version`, `models/<name>.json` (one exported program
//! each), `data/weights/<name>_weights_config.json` and `data/constants/<name>_constants_config.json`
//! (which entry holds each parameter, buffer and constant, and how to view it), and the raw
//! bytes of each storage (`data/weights/weight_<i>`, `data/constants/tensor_<i>`).
//!
//! The archive is untrusted. Entry names must be relative paths without `..`; entries are
//! read only when needed, each checked against the size its header declares and charged to
//! [`ArchiveLimits`] before anything is allocated, so a small file cannot unpack into a large
//! one; JSON is parsed with serde's nesting limit; every tensor view (sizes, strides, offset)
//! is checked against the bytes of its storage with checked arithmetic.

pub mod json;

use std::collections::{BTreeMap, HashMap};
use std::io::{Cursor, Read};

use crate::dtype::{self, DType};
use crate::error::{CompileError, Result};

/// The torch release whose archives this compiler reads.
pub const SUPPORTED_TORCH: &str = "2.15";
/// The export schema major version of that release.
pub const SUPPORTED_SCHEMA_MAJOR: i64 = 8;

/// Limits on what reading an archive may take.
#[derive(Clone, Copy, Debug)]
pub struct ArchiveLimits {
    /// Most entries in the zip directory.
    pub max_entries: usize,
    /// Most bytes all entries read may unpack to, together.
    pub max_total_bytes: u64,
    /// Most bytes one JSON document may have.
    pub max_json_bytes: u64,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        ArchiveLimits {
            max_entries: 100_000,
            max_total_bytes: 16 << 30,
            max_json_bytes: 512 << 20,
        }
    }
}

/// A tensor's bytes made contiguous, with its element type and sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorData {
    /// Element type.
    pub dtype: DType,
    /// Sizes.
    pub sizes: Vec<i64>,
    /// Contiguous (row-major) bytes.
    pub bytes: Vec<u8>,
}

/// One exported program of an archive with its weights and constants.
#[derive(Debug)]
pub struct Model {
    /// The name under `models/` (`model` for `torch.export.save`).
    pub name: String,
    /// The program.
    pub program: json::ExportedProgram,
    /// Parameters and buffers by fully qualified name.
    pub weights: BTreeMap<String, TensorData>,
    /// Lifted tensor constants by name.
    pub constants: BTreeMap<String, TensorData>,
}

/// Every exported program of an archive, sorted by name.
#[derive(Debug)]
pub struct Archive {
    /// The programs.
    pub models: Vec<Model>,
}

fn err(msg: impl Into<String>) -> CompileError {
    CompileError::Archive(msg.into())
}

struct Zip<'a> {
    zip: zip::ZipArchive<Cursor<&'a [u8]>>,
    /// Name without the top-level folder -> entry index.
    entries: HashMap<String, usize>,
    budget: u64,
}

impl<'a> Zip<'a> {
    fn open(bytes: &'a [u8], limits: &ArchiveLimits) -> Result<Self> {
        let zip = zip::ZipArchive::new(Cursor::new(bytes))
            .map_err(|e| err(format!("not a zip archive: {e}")))?;
        if zip.len() > limits.max_entries {
            return Err(err(format!(
                "{} entries, more than the limit of {}",
                zip.len(),
                limits.max_entries
            )));
        }
        let mut entries = HashMap::new();
        let mut root: Option<String> = None;
        let names: Vec<String> = zip
            .file_names()
            .map(|n| n.map(|n| n.into_owned()))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| err(format!("bad entry name: {e}")))?;
        for (i, name) in names.iter().enumerate() {
            let name = name.as_str();
            let bad = || err(format!("entry {i} has an unsafe name {name:?}"));
            if name.starts_with('/') || name.contains('\\') || name.contains('\0') {
                return Err(bad());
            }
            let parts: Vec<&str> = name.split('/').collect();
            if parts.iter().any(|p| *p == ".." || *p == ".") {
                return Err(bad());
            }
            let (first, rest) = name.split_once('/').ok_or_else(bad)?;
            match &root {
                None => root = Some(first.to_owned()),
                Some(r) if r == first => {}
                Some(r) => {
                    return Err(err(format!(
                        "entries in two top-level folders ({r:?} and {first:?})"
                    )))
                }
            }
            if rest.is_empty() || rest.ends_with('/') {
                continue;
            }
            if entries.insert(rest.to_owned(), i).is_some() {
                return Err(err(format!("duplicate entry {name:?}")));
            }
        }
        Ok(Zip {
            zip,
            entries,
            budget: limits.max_total_bytes,
        })
    }

    fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Reads an entry, at most `max` bytes, charged to the archive's budget.
    fn read(&mut self, name: &str, max: u64) -> Result<Vec<u8>> {
        let &index = self
            .entries
            .get(name)
            .ok_or_else(|| err(format!("missing entry {name:?}")))?;
        let mut file = self
            .zip
            .by_index(index)
            .map_err(|e| err(format!("entry {name:?}: {e}")))?;
        let declared = file.size();
        if declared > max || declared > self.budget {
            return Err(err(format!(
                "entry {name:?} declares {declared} bytes, more than the {} allowed",
                max.min(self.budget)
            )));
        }
        let mut out = Vec::new();
        out.try_reserve_exact(declared as usize)
            .map_err(|_| err(format!("cannot allocate {declared} bytes for {name:?}")))?;
        // One byte more than declared shows a lying header without unpacking more.
        (&mut file)
            .take(declared + 1)
            .read_to_end(&mut out)
            .map_err(|e| err(format!("entry {name:?}: {e}")))?;
        if out.len() as u64 != declared {
            return Err(err(format!(
                "entry {name:?} unpacks to {}{} bytes but declares {declared}",
                out.len(),
                if out.len() as u64 > declared { "+" } else { "" }
            )));
        }
        self.budget -= declared;
        Ok(out)
    }

    fn read_string(&mut self, name: &str, max: u64) -> Result<String> {
        String::from_utf8(self.read(name, max)?).map_err(|_| err(format!("{name:?} is not UTF-8")))
    }
}

/// Reads an archive: every exported program, its weights and constants.
pub fn read(bytes: &[u8], limits: &ArchiveLimits) -> Result<Archive> {
    let mut zip = Zip::open(bytes, limits)?;
    let format = zip.read_string("archive_format", 64)?;
    if format.trim() != "pt2" {
        return Err(CompileError::Unsupported(format!(
            "archive_format is {format:?}; pte compile reads archives written by \
             torch.export.save (format \"pt2\") with torch {SUPPORTED_TORCH}"
        )));
    }
    if zip.has("archive_version") {
        let v = zip.read_string("archive_version", 64)?;
        if v.trim() != "0" {
            return Err(CompileError::Unsupported(format!(
                "archive_version {v:?}; pte compile reads version 0 (torch {SUPPORTED_TORCH})"
            )));
        }
    }
    if zip.has("byteorder") {
        let order = zip.read_string("byteorder", 64)?;
        if order.trim() != "little" {
            return Err(CompileError::Unsupported(format!(
                "byte order {order:?}; only little-endian archives are read"
            )));
        }
    }
    let mut names: Vec<String> = zip
        .entries
        .keys()
        .filter_map(|n| {
            n.strip_prefix("models/")?
                .strip_suffix(".json")
                .map(str::to_owned)
        })
        .filter(|n| !n.contains('/'))
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(err(
            "no exported program (models/<name>.json) in the archive",
        ));
    }
    let mut models = Vec::with_capacity(names.len());
    for name in names {
        models.push(read_model(&mut zip, &name, limits)?);
    }
    Ok(Archive { models })
}

fn read_model(zip: &mut Zip<'_>, name: &str, limits: &ArchiveLimits) -> Result<Model> {
    let path = format!("models/{name}.json");
    let text = zip.read(&path, limits.max_json_bytes)?;
    let program: json::ExportedProgram = serde_json::from_slice(&text).map_err(|e| {
        if !text.starts_with(b"{") {
            CompileError::Unsupported(format!("{path} is not JSON"))
        } else {
            CompileError::invalid(&path, e.to_string())
        }
    })?;
    check_version(&program, &path)?;
    for legacy in [
        format!("data/weights/{name}.pt"),
        format!("data/constants/{name}.pt"),
    ] {
        if zip.has(&legacy) {
            return Err(CompileError::Unsupported(format!(
                "{legacy} holds pickled tensors (an older archive layout); pte compile reads \
                 raw tensor bytes as torch {SUPPORTED_TORCH}'s torch.export.save writes them"
            )));
        }
    }
    let weights = read_payloads(
        zip,
        &format!("data/weights/{name}_weights_config.json"),
        "data/weights/",
        limits,
    )?;
    let constants = read_payloads(
        zip,
        &format!("data/constants/{name}_constants_config.json"),
        "data/constants/",
        limits,
    )?;
    Ok(Model {
        name: name.to_owned(),
        program,
        weights,
        constants,
    })
}

fn check_version(program: &json::ExportedProgram, path: &str) -> Result<()> {
    let v = &program.schema_version;
    let torch = program.torch_version.as_str();
    let version_ok = torch == SUPPORTED_TORCH || torch.starts_with(&format!("{SUPPORTED_TORCH}."));
    if v.major != SUPPORTED_SCHEMA_MAJOR || !version_ok {
        return Err(CompileError::Unsupported(format!(
            "{path} was written by torch {torch:?} (export schema {}.{}); pte compile reads \
             archives from torch {SUPPORTED_TORCH} (export schema {SUPPORTED_SCHEMA_MAJOR}.x): \
             export and save the model with torch {SUPPORTED_TORCH}",
            v.major, v.minor
        )));
    }
    Ok(())
}

fn read_payloads(
    zip: &mut Zip<'_>,
    config_path: &str,
    dir: &str,
    limits: &ArchiveLimits,
) -> Result<BTreeMap<String, TensorData>> {
    let mut out = BTreeMap::new();
    if !zip.has(config_path) {
        return Ok(out);
    }
    let text = zip.read(config_path, limits.max_json_bytes)?;
    let config: json::PayloadConfig = serde_json::from_slice(&text)
        .map_err(|e| CompileError::invalid(config_path, e.to_string()))?;
    let mut files: HashMap<String, Vec<u8>> = HashMap::new();
    // How many tensors still view each storage: the last one may take its bytes.
    let mut remaining: HashMap<&str, usize> = HashMap::new();
    for meta in config.config.values() {
        *remaining.entry(meta.path_name.as_str()).or_default() += 1;
    }
    for (fqn, meta) in &config.config {
        let field = format!("{config_path}: {fqn}");
        if meta.use_pickle {
            return Err(CompileError::Unsupported(format!(
                "{field} is pickled (a tensor subclass or custom object); pte compile reads \
                 plain tensors stored as raw bytes"
            )));
        }
        if meta.path_name.is_empty()
            || meta.path_name.contains('/')
            || meta.path_name.contains("..")
        {
            return Err(CompileError::invalid(
                &field,
                format!("bad path {:?}", meta.path_name),
            ));
        }
        let tm = meta
            .tensor_meta
            .as_ref()
            .ok_or_else(|| CompileError::invalid(&field, "no tensor_meta"))?;
        if !files.contains_key(&meta.path_name) {
            let data = zip.read(&format!("{dir}{}", meta.path_name), u64::MAX)?;
            files.insert(meta.path_name.clone(), data);
        }
        let left = remaining.entry(meta.path_name.as_str()).or_default();
        *left = left.saturating_sub(1);
        // The last view of a storage may take its bytes (no copy when it covers them all).
        let storage = if *left == 0 {
            std::borrow::Cow::Owned(files.remove(&meta.path_name).unwrap_or_default())
        } else {
            std::borrow::Cow::Borrowed(
                files
                    .get(&meta.path_name)
                    .map(Vec::as_slice)
                    .unwrap_or_default(),
            )
        };
        out.insert(fqn.clone(), view_tensor(storage, tm, &field)?);
    }
    Ok(out)
}

fn static_ints(v: &[json::SymInt], field: &str, what: &str) -> Result<Vec<i64>> {
    v.iter()
        .map(|s| match s {
            json::SymInt::AsInt(i) => Ok(*i),
            json::SymInt::AsExpr(_) => {
                Err(CompileError::invalid(field, format!("symbolic {what}")))
            }
        })
        .collect()
}

/// Copies the view `meta` describes out of a storage's raw bytes, contiguously.
pub(crate) fn view_tensor(
    storage: std::borrow::Cow<'_, [u8]>,
    meta: &json::TensorMeta,
    field: &str,
) -> Result<TensorData> {
    let dtype = dtype::from_export_code(meta.dtype).ok_or_else(|| {
        CompileError::invalid(field, format!("unsupported dtype code {}", meta.dtype))
    })?;
    let sizes = static_ints(&meta.sizes, field, "size")?;
    let strides = static_ints(&meta.strides, field, "stride")?;
    let offset = match &meta.storage_offset {
        Some(s) => *static_ints(std::slice::from_ref(s), field, "storage offset")?
            .first()
            .unwrap_or(&0),
        None => 0,
    };
    if sizes.len() != strides.len() || sizes.len() > 16 {
        return Err(CompileError::invalid(
            field,
            "sizes and strides disagree or rank > 16",
        ));
    }
    if sizes.iter().chain(&strides).any(|&v| v < 0) || offset < 0 {
        return Err(CompileError::invalid(
            field,
            "negative size, stride or offset",
        ));
    }
    let esize = dtype::size_of(dtype);
    let numel = sizes
        .iter()
        .try_fold(1u64, |acc, &s| acc.checked_mul(s as u64))
        .ok_or_else(|| CompileError::Overflow(format!("{field}: element count")))?;
    let nbytes = numel
        .checked_mul(esize as u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| CompileError::Overflow(format!("{field}: byte size")))?;
    if numel == 0 {
        return Ok(TensorData {
            dtype,
            sizes,
            bytes: Vec::new(),
        });
    }
    // torch stores an all-zero tensor of any size as an empty record.
    if storage.is_empty() {
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(nbytes)
            .map_err(|_| CompileError::Overflow(format!("{field}: {nbytes} bytes")))?;
        bytes.resize(nbytes, 0);
        return Ok(TensorData {
            dtype,
            sizes,
            bytes,
        });
    }
    if !storage.len().is_multiple_of(esize) {
        return Err(CompileError::invalid(
            field,
            format!(
                "storage of {} bytes is not a whole number of {esize}-byte elements",
                storage.len()
            ),
        ));
    }
    let storage_numel = (storage.len() / esize) as u64;
    let last = sizes
        .iter()
        .zip(&strides)
        .try_fold(offset as u64, |acc, (&s, &st)| {
            (s as u64 - 1)
                .checked_mul(st as u64)
                .and_then(|x| acc.checked_add(x))
        });
    match last {
        Some(l) if l < storage_numel => {}
        _ => {
            return Err(CompileError::invalid(
                field,
                format!(
                    "view (sizes {sizes:?}, strides {strides:?}, offset {offset}) reaches past \
                     its storage of {storage_numel} elements"
                ),
            ))
        }
    }
    let mut expected = 1i64;
    let contiguous = sizes.iter().zip(&strides).rev().all(|(&s, &st)| {
        let ok = s == 1 || st == expected;
        expected = expected.saturating_mul(s);
        ok
    });
    if contiguous && offset == 0 && storage.len() == nbytes {
        return Ok(TensorData {
            dtype,
            sizes,
            bytes: storage.into_owned(),
        });
    }
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(nbytes)
        .map_err(|_| CompileError::Overflow(format!("{field}: {nbytes} bytes")))?;
    if contiguous {
        let start = offset as usize * esize;
        bytes.extend_from_slice(storage.get(start..start + nbytes).unwrap_or_default());
        return Ok(TensorData {
            dtype,
            sizes,
            bytes,
        });
    }
    // Walk the view in row-major order; every index was bounded above.
    let rank = sizes.len();
    let mut index = vec![0i64; rank];
    for _ in 0..numel {
        let elem = index
            .iter()
            .zip(&strides)
            .fold(offset, |acc, (&i, &st)| acc + i * st) as usize;
        let start = elem * esize;
        bytes.extend_from_slice(storage.get(start..start + esize).unwrap_or_default());
        for d in (0..rank).rev() {
            if let (Some(i), Some(&s)) = (index.get_mut(d), sizes.get(d)) {
                *i += 1;
                if *i < s {
                    break;
                }
                *i = 0;
            }
        }
    }
    Ok(TensorData {
        dtype,
        sizes,
        bytes,
    })
}
