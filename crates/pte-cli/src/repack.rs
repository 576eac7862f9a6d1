//! `pte repack`: rewrite a program with other segment alignment, or with its constants
//! moved to a `.ptd` file.

use std::path::Path;

use anyhow::{Context, Result};
use pte_format::{write_ptd, FileBytes, ProgramImage, WriteOptions};

pub fn run(
    input: &Path,
    output: &Path,
    segment_alignment: u64,
    external_constants: Option<&Path>,
) -> Result<()> {
    let bytes = FileBytes::read(input)?;
    let mut image =
        ProgramImage::parse(&bytes).with_context(|| format!("reading {}", input.display()))?;
    let options = WriteOptions {
        segment_alignment,
        ..WriteOptions::default()
    };
    let ptd = match external_constants {
        Some(path) => {
            let entries = image.externalize_constants(&options)?;
            let data = write_ptd(&entries, &options)?;
            std::fs::write(path, &data).with_context(|| format!("writing {}", path.display()))?;
            eprintln!(
                "moved {} constant tensors ({} bytes) to {}",
                entries.len(),
                entries.iter().map(|e| e.data.len()).sum::<usize>(),
                path.display()
            );
            Some(path)
        }
        None => None,
    };
    let out = image.write(&options)?;
    std::fs::write(output, &out).with_context(|| format!("writing {}", output.display()))?;
    eprintln!(
        "wrote {} ({} bytes, segments aligned to {segment_alignment}){}",
        output.display(),
        out.len(),
        ptd.map(|p| format!("; load it with {}", p.display()))
            .unwrap_or_default()
    );
    Ok(())
}
