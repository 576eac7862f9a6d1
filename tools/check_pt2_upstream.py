#!/usr/bin/env python3
"""Compile every .pt2 fixture with `pte compile` and run the programs in upstream ExecuTorch.

For each fixture of a manifest written by tools/gen_pt2_fixtures.py, the archive is
compiled twice (constants in the program; constants in a .ptd), each program is loaded
by upstream's runtime (executorch 1.5.1 pybindings) and its outputs are compared with the
recorded eager PyTorch outputs, within the fixture's tolerance. Prints one line per
fixture and a closing `N passed, M failed`; exits 1 on any failure.

    .venv-ref/bin/python tools/check_pt2_upstream.py                       # committed fixtures
    .venv-ref/bin/python tools/check_pt2_upstream.py --dir DIR --only resnet18
    .venv-ref/bin/python tools/check_pt2_upstream.py --pte target/release/pte

`cargo test -p pte-compiler --test fixtures -- --ignored` runs this script.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore")

from executorch.extension.pybindings.portable_lib import _load_for_executorch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def pte_binary(given):
    if given:
        return Path(given)
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "pte-cli"], cwd=ROOT, check=True)
    return ROOT / "target" / "release" / "pte"


def run_fixture(pte, d: Path, f, external: bool, tmp: Path):
    out = tmp / f"{f['name']}.pte"
    cmd = [str(pte), "compile", str(d / f["program"]), "-o", str(out)]
    data = None
    if external:
        data = tmp / f"{f['name']}.ptd"
        cmd += ["--external-constants", str(data)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return f"compile failed: {r.stderr.strip()}"
    if data is not None and not data.exists():
        data = None  # a program without constants has no .ptd
    module = _load_for_executorch(str(out), str(data) if data else None)
    tol = f["tolerance"]
    for i, case in enumerate(f["cases"]):
        if not f.get("sequential") and i > 0:
            module = _load_for_executorch(str(out), str(data) if data else None)
        kinds = case.get("input_kinds", ["tensor"] * len(case["inputs"]))
        convert = {"tensor": torch.from_numpy, "int": lambda a: int(a.item()),
                   "float": lambda a: float(a.item()), "bool": lambda a: bool(a.item())}
        inputs = [convert[k](np.load(d / p)) for k, p in zip(kinds, case["inputs"])]
        got = module.run_method(case["method"], inputs)
        if len(got) != len(case["outputs"]):
            return f"case {i}: {len(got)} outputs, eager has {len(case['outputs'])}"
        for k, (g, p) in enumerate(zip(got, case["outputs"])):
            want = np.load(d / p)
            g = g.numpy() if isinstance(g, torch.Tensor) else np.array(g)
            if g.shape != want.shape or g.dtype != want.dtype:
                return f"case {i} output {k}: {g.dtype}{list(g.shape)}, eager {want.dtype}{list(want.shape)}"
            if np.issubdtype(want.dtype, np.floating):
                if not np.allclose(g, want, rtol=tol["rtol"], atol=tol["atol"], equal_nan=True):
                    err = np.max(np.abs(g.astype(np.float64) - want))
                    return f"case {i} output {k}: max abs error {err:.3g}"
            elif not np.array_equal(g, want):
                return f"case {i} output {k}: differs"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=ROOT / "tests" / "fixtures" / "pt2")
    ap.add_argument("--only", default="")
    ap.add_argument("--pte", default="")
    args = ap.parse_args()
    manifest = json.loads((args.dir / "manifest.json").read_text())
    only = [n for n in args.only.split(",") if n]
    pte = pte_binary(args.pte)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for f in manifest["fixtures"]:
            if only and f["name"] not in only:
                continue
            for external in (False, True):
                label = f"{f['name']}{' (.ptd)' if external else ''}"
                try:
                    err = run_fixture(pte, args.dir, f, external, Path(tmp))
                except RuntimeError as e:
                    err = f"upstream: {e}"

                if err:
                    failed += 1
                    print(f"FAIL {label}: {err}")
                else:
                    passed += 1
                    print(f"ok   {label}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
