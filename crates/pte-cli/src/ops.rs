//! `pte ops`: the operator names this build has kernels for.

use anyhow::{Context, Result};

pub fn run(json: bool) -> Result<()> {
    let kernels = pte_kernels::registry();
    let names: Vec<&str> = kernels.names().collect();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&names).context("JSON output")?
        );
    } else {
        for name in names {
            println!("{name}");
        }
    }
    Ok(())
}
