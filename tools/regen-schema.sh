#!/usr/bin/env bash
# Regenerates the checked-in planus bindings from our schema transcriptions:
#   crates/pte-format/src/generated.rs   (program, flat_tensor, bundled_program)
#   crates/pte-xnnpack/src/generated.rs  (the XNNPACK delegate payload's XNNGraph)
# Needs planus-cli 1.3.0: cargo install planus-cli --version 1.3.0 --locked
# With --check, fails if a checked-in file differs from a fresh generation.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
check="${1:-}"
stale=0

# regen CRATE SCHEMA...
regen() {
  local crate="$1"
  shift
  cd "$root/crates/$crate"
  local out=src/generated.rs
  if [[ "$check" == "--check" ]]; then
    out=$(mktemp --suffix=.rs)
  fi
  planus rust -o "$out" "$@"
  if [[ "$check" == "--check" ]]; then
    if ! diff -q "$out" src/generated.rs >/dev/null; then
      echo "crates/$crate/src/generated.rs is stale: run tools/regen-schema.sh" >&2
      stale=1
    fi
    rm -f "$out"
  fi
}

regen pte-format schema/program.fbs schema/flat_tensor.fbs schema/bundled_program.fbs
regen pte-xnnpack schema/xnnpack.fbs
exit "$stale"
