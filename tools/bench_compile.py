#!/usr/bin/env python3
"""Compile time and planned memory: `pte compile` against upstream's to_edge + to_executorch.

For each archive of a manifest written by tools/gen_pt2_fixtures.py --models DIR, loads
the ExportedProgram (torch.export.load), times upstream's `to_edge(ep).to_executorch()`
(default configs, the program serialized) and `pte compile` of the same archive, in
alternating rounds, and reads each program's planned memory (non_const_buffer_sizes).
Prints a Markdown table (medians over the rounds).

    .venv-ref/bin/python tools/bench_compile.py --dir DIR [--only resnet18] [--rounds 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")
import logging  # noqa: E402

logging.disable(logging.WARNING)
from executorch.exir import to_edge  # noqa: E402
from executorch.exir._serialize._program import deserialize_pte_binary  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def planned(pte_bytes: bytes) -> int:
    program = deserialize_pte_binary(pte_bytes).program
    return sum(sum(p.non_const_buffer_sizes) for p in program.execution_plan)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pte", default=str(ROOT / "target" / "release" / "pte"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    only = [n for n in args.only.split(",") if n]
    manifest = json.loads((args.dir / "manifest.json").read_text())
    print("| model | pte compile (s) | upstream to_edge + to_executorch (s) | ratio | planned bytes, pte | planned bytes, upstream |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for f in manifest["fixtures"]:
            if only and f["name"] not in only:
                continue
            archive = args.dir / f["program"]
            out = Path(tmp) / "out.pte"
            ours, theirs = [], []
            up_planned = None
            for _ in range(args.rounds):
                t = time.perf_counter()
                subprocess.run([args.pte, "compile", str(archive), "-o", str(out)], check=True, capture_output=True)
                ours.append(time.perf_counter() - t)
                ep = torch.export.load(str(archive))
                t = time.perf_counter()
                buf = to_edge(ep).to_executorch().buffer
                theirs.append(time.perf_counter() - t)
                up_planned = planned(buf)
            our_planned = planned(out.read_bytes())
            a, b = statistics.median(ours), statistics.median(theirs)
            print(f"| {f['name']} | {a:.2f} | {b:.2f} | {b / a:.0f}x | {our_planned:,} | {up_planned:,} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
