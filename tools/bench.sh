#!/usr/bin/env bash
# Times the benchmark models with `pte bench` and with upstream ExecuTorch in the same run,
# and prints each median with upstream time / our time for upstream's portable and XNNPACK
# programs (above 1: we are faster).
#
#   .venv-ref/bin/python tools/gen_fixtures.py --bench bench-models   # once
#   tools/bench.sh bench-models [THREADS]
#
# Our runtime runs the portable program (it has no XNNPACK backend yet); upstream runs
# both. Upstream's portable kernels are single-threaded whatever THREADS says.
set -euo pipefail
dir=${1:?usage: tools/bench.sh MODELS_DIR [THREADS]}
threads=${2:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/.venv-ref/bin/python"
cargo build --release -q -p pte-cli --manifest-path "$root/Cargo.toml"
pte="$root/target/release/pte"

median() { sed -n 's/.*median \([0-9.]*\) ms.*/\1/p; s/.*median_ms=\([0-9.]*\).*/\1/p'; }

printf '%-22s %12s %14s %14s %10s %10s\n' model "pte ms" "upstream ms" "xnnpack ms" "vs port." "vs xnn."
for model in mobilenet_v2 resnet18 transformer_encoder; do
  portable="$dir/${model}_portable/model.pte"
  xnnpack="$dir/${model}_xnnpack/model.pte"
  [[ -f "$portable" ]] || continue
  ours=$("$pte" bench "$portable" --warmup 2 --iterations 10 --threads "$threads" | median)
  up=$("$py" "$root/tools/bench_upstream.py" "$portable" --warmup 0 --iterations 3 --threads "$threads" 2>/dev/null | median)
  xnn=$("$py" "$root/tools/bench_upstream.py" "$xnnpack" --warmup 3 --iterations 20 --threads "$threads" 2>/dev/null | median)
  awk -v m="$model" -v o="$ours" -v u="$up" -v x="$xnn" \
    'BEGIN { printf "%-22s %12.2f %14.2f %14.2f %9.1fx %9.2fx\n", m, o, u, x, u / o, x / o }'
done
