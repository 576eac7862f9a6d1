#!/usr/bin/env bash
# Seeds a fuzz corpus with every committed fixture file: fuzz/seed.sh TARGET
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p "corpus/$1"
find ../tests/fixtures \( -name '*.pte' -o -name '*.ptd' -o -name '*.bpte' -o -name '*.pt2' \) | while read -r f; do
  rel=${f#../tests/fixtures/}; cp "$f" "corpus/$1/${rel//\//_}"
done
