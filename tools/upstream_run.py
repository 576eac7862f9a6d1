#!/usr/bin/env python3
"""Run a program once in the upstream ExecuTorch runtime (reference environment).

    upstream_run.py MODEL.pte [--data F.ptd] [--method NAME] \
        --inputs a.npy b.npy ... [--input-kinds tensor,int,...] --outdir DIR
    upstream_run.py MODEL.bpte --bundled      # verify the embedded test cases
    upstream_run.py --jobs JOBS.json          # many runs in one process


Writes the flattened outputs to DIR/0.npy, DIR/1.npy, ...; non-tensor outputs become
0-d arrays (int -> int64, float -> float64, bool -> bool).  Inputs are tensors unless
--input-kinds says otherwise (0-d .npy holding an int/float/bool value).  With
--bundled, every test case of every method in the .bpte is run and checked against
its expected outputs; the exit status is 1 on any mismatch.  With --jobs, JOBS.json is a
list of {"model", "data": [..], "method", "inputs": [..], "input_kinds": [..], "outdir"}
objects, run in order in one process (importing torch once).  Needs the .venv-ref
environment described in tools/gen_fixtures.py.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from executorch.extension.pybindings.portable_lib import (
    _load_bundled_program_from_buffer,
    _load_for_executorch,
    _load_for_executorch_from_bundled_program,
)


def to_input(arr: np.ndarray, kind: str):
    if kind == "tensor":
        # Fresh contiguous strides: numpy gives zero-size dimensions strides torch would not.
        return torch.from_numpy(arr.copy()).clone(memory_format=torch.contiguous_format) \
            if arr.size else torch.empty(arr.shape, dtype=torch.from_numpy(arr.copy()).dtype)
    return {"int": int, "float": float, "bool": bool}[kind](arr.item())


def to_numpy(v) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        return v.detach().contiguous().numpy().copy(order="C")
    if isinstance(v, bool):
        return np.array(v, dtype=np.bool_)
    if isinstance(v, int):
        return np.array(v, dtype=np.int64)
    return np.array(v, dtype=np.float64)


def run_bundled(path: Path) -> int:
    from executorch.devtools.bundled_program.serialize import (
        deserialize_from_flatbuffer_to_bundled_program,
    )

    buf = path.read_bytes()
    suites = deserialize_from_flatbuffer_to_bundled_program(buf).method_test_suites
    bundle = _load_bundled_program_from_buffer(buf)
    failures = 0
    for suite in suites:
        for i in range(len(suite.test_cases)):
            try:
                bundle.verify_result_with_bundled_expected_output(suite.method_name, i)
                print(f"{suite.method_name}[{i}]: ok")
            except RuntimeError as e:
                failures += 1
                print(f"{suite.method_name}[{i}]: MISMATCH ({e})")
    return 1 if failures else 0


def run_one(model: Path, data, method: str, inputs: list, kinds: list, outdir: Path) -> None:
    if not kinds:
        kinds = ["tensor"] * len(inputs)
    if len(kinds) != len(inputs):
        raise SystemExit("input kinds must have one entry per input")
    values = [to_input(np.load(p), k) for p, k in zip(inputs, kinds)]
    if model.suffix == ".bpte":
        bundle = _load_bundled_program_from_buffer(model.read_bytes())
        module = _load_for_executorch_from_bundled_program(bundle, data) if data else \
            _load_for_executorch_from_bundled_program(bundle)
    else:
        module = _load_for_executorch(str(model), data)
    outputs = module.run_method(method, values)
    outdir.mkdir(parents=True, exist_ok=True)
    for i, v in enumerate(outputs):
        with open(outdir / f"{i}.npy", "wb") as f:
            np.save(f, to_numpy(v), allow_pickle=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, nargs="?")
    ap.add_argument("--data", action="append", default=[], help=".ptd file (upstream pybindings take one)")
    ap.add_argument("--method", default="forward")
    ap.add_argument("--inputs", nargs="*", default=[])
    ap.add_argument("--input-kinds", default="", help="comma list: tensor,int,float,bool")
    ap.add_argument("--outdir", type=Path)
    ap.add_argument("--bundled", action="store_true", help="verify the test cases embedded in a .bpte")
    ap.add_argument("--jobs", type=Path, help="JSON list of runs to do in one process")
    args = ap.parse_args()

    if args.jobs:
        for job in json.loads(args.jobs.read_text()):
            data = job.get("data") or []
            if len(data) > 1:
                raise SystemExit("the upstream Python runtime accepts a single data file")
            run_one(Path(job["model"]), data[0] if data else None, job.get("method", "forward"),
                    job.get("inputs", []), job.get("input_kinds", []), Path(job["outdir"]))
        return 0
    if args.model is None:
        ap.error("MODEL is required unless --jobs")
    if len(args.data) > 1:
        ap.error("the upstream Python runtime accepts a single --data file")
    data = args.data[0] if args.data else None
    if args.bundled:
        return run_bundled(args.model)
    if args.outdir is None:
        ap.error("--outdir is required unless --bundled")
    kinds = args.input_kinds.split(",") if args.input_kinds else []
    run_one(args.model, data, args.method, args.inputs, kinds, args.outdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
