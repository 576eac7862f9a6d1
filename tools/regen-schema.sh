#!/usr/bin/env bash
# Regenerates crates/pte-format/src/generated.rs from our schema transcriptions.
# Needs planus-cli 1.3.0: cargo install planus-cli --version 1.3.0 --locked
# With --check, fails if the checked-in file differs from a fresh generation.
set -euo pipefail
cd "$(dirname "$0")/../crates/pte-format"
out=src/generated.rs
if [[ "${1:-}" == "--check" ]]; then
  out=$(mktemp --suffix=.rs)
  trap 'rm -f "$out"' EXIT
fi
planus rust -o "$out" schema/program.fbs schema/flat_tensor.fbs schema/bundled_program.fbs
if [[ "${1:-}" == "--check" ]]; then
  diff -q "$out" src/generated.rs >/dev/null || {
    echo "crates/pte-format/src/generated.rs is stale: run tools/regen-schema.sh" >&2
    exit 1
  }
fi
