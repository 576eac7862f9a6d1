#!/usr/bin/env python3
"""Times pte against upstream ExecuTorch and ONNX Runtime on the same models, interleaved.

    .venv-ref/bin/python tools/gen_fixtures.py --bench bench-models      # once
    .venv-ref/bin/python tools/bench_side_by_side.py [--models bench-models]
        [--only resnet18,vit_tiny] [--threads 1,2] [--rounds 3] [--iterations 20]
        [--portable-iterations 1] [--json results.json]
    .venv-ref/bin/python tools/bench_side_by_side.py --xnnpack [--only ...] [--threads 1,2]

`--only` also takes the other architectures of `gen_fixtures.EXTRA_BENCH` (mobilenet_v3,
regnet, squeezenet, ..., the segmentation networks lraspp, deeplabv3 and fcn, and
wav2letter, edsr, lstm, mlp_mixer, conformer, gru, tcn, unet, mobilevit and gpt_prefill)
once generated with `gen_fixtures.py --bench DIR --only NAME_portable,NAME_xnnpack`.

For every model and thread count, in each round and in a rotating order, one fresh process
each times: `pte bench` on the plain (portable) `.pte`; upstream's runtime on the
XNNPACK-lowered `.pte` and on the plain one; ONNX Runtime on the same model exported to
ONNX (written next to the plain program on first use, from the same seeded weights). A
process reports its load time, first execution and the median of `--iterations` timed
executions after warm-up. The table shows medians over rounds, pte's ratio to the
faster of upstream-XNNPACK and ONNX Runtime (below 1: pte is faster), the same ratio
paired (each round's, then their median: a round's runtimes run back to back, so they
share the machine's state, where a shared two-vCPU virtual machine sometimes runs two
threads near one thread's speed for a while), and time to first output (load + first
execution). Needs the reference environment plus onnx, onnxscript
and onnxruntime from PyPI.

`pte bench` maps every program with `--mmap`, as upstream's `MmapDataLoader` maps it.
With `--xnnpack`, both runtimes run the same XNNPACK-lowered file: `pte bench` (its
XnnpackBackend)
against upstream's runtime (the XNNPACK C library), interleaved the same way. Before
timing, `pte run` on each file is compared with the outputs upstream recorded for it
(`case0/output_*.npy`); the table shows the largest absolute difference. The
quantized models of `tools/gen_xnnpack_fixtures.py --models DIR` are named as written
there:

    .venv-ref/bin/python tools/bench_side_by_side.py --xnnpack --models DIR \
        --only mobilenet_v2_xnnpack_int8,resnet18_xnnpack_int8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["mobilenet_v2", "resnet18", "transformer_encoder", "efficientnet_b0", "vit_tiny", "decoder_lm"]
RUNTIMES = ["pte", "et_xnnpack", "ort", "et_portable"]
XNNPACK_RUNTIMES = ["pte_xnnpack", "et_xnnpack"]


# ---------------------------------------------------------------------------------------
# Workers: one measurement in a fresh process, printed as JSON.
# ---------------------------------------------------------------------------------------


def _summary(load_ms: float, first_ms: float, times: list) -> dict:
    times = sorted(times)
    return {
        "load_ms": load_ms,
        "first_ms": first_ms,
        "median_ms": statistics.median(times),
        "min_ms": times[0],
        "iterations": len(times),
    }


def worker_et(model: str, input_path: str, threads: int, iterations: int, warmup: int) -> dict:
    import numpy as np
    import torch
    from executorch.extension.pybindings import portable_lib as et

    et._unsafe_reset_threadpool(threads)
    x = torch.from_numpy(np.load(input_path))
    t = time.perf_counter()
    module = et._load_for_executorch(model)
    load_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    module.run_method("forward", [x])
    first_ms = (time.perf_counter() - t) * 1e3
    for _ in range(warmup):
        module.run_method("forward", [x])
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        module.run_method("forward", [x])
        times.append((time.perf_counter() - t) * 1e3)
    return _summary(load_ms, first_ms, times)


def worker_ort(model: str, input_path: str, threads: int, iterations: int, warmup: int) -> dict:
    import numpy as np
    import onnxruntime as ort

    x = np.load(input_path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    t = time.perf_counter()
    session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    load_ms = (time.perf_counter() - t) * 1e3
    feed = {session.get_inputs()[0].name: x}
    t = time.perf_counter()
    session.run(None, feed)
    first_ms = (time.perf_counter() - t) * 1e3
    for _ in range(warmup):
        session.run(None, feed)
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - t) * 1e3)
    return _summary(load_ms, first_ms, times)


# Pause before each measured process, seconds.
SETTLE_S = 0.5


def measure(runtime: str, paths: dict, threads: int, iterations: int, warmup: int, pte: Path) -> dict:
    if runtime in ("pte", "pte_xnnpack"):
        model = paths["plain" if runtime == "pte" else "xnnpack"]
        # --mmap: both programs mapped, as upstream's loader maps (and locks) the file.
        cmd = [str(pte), "bench", str(model), "--input", str(paths["input"]),
               "--threads", str(threads), "--iterations", str(iterations),
               "--warmup", str(warmup), "--json", "--mmap"]
    else:
        model = paths[{"et_xnnpack": "xnnpack", "et_portable": "plain", "ort": "onnx"}[runtime]]
        kind = "ort" if runtime == "ort" else "et"
        cmd = [sys.executable, __file__, "worker", kind, str(model), str(paths["input"]),
               str(threads), str(iterations), str(warmup)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------


def max_abs_diff(pte: Path, paths: dict) -> float:
    """Runs pte on the XNNPACK-lowered file; the largest difference from upstream's outputs."""
    import tempfile

    import numpy as np

    case = paths["xnnpack"].parent / "case0"
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([str(pte), "run", str(paths["xnnpack"]), "--input", str(paths["input"]),
                        "--outputs", out], check=True, capture_output=True)
        worst = 0.0
        for k, want in enumerate(sorted(case.glob("output_*.npy"), key=lambda p: int(p.stem[7:]))):
            got, want = np.load(Path(out) / f"{k}.npy"), np.load(want)
            if got.shape != want.shape:
                sys.exit(f"{paths['xnnpack']}: output {k} is {got.shape}, upstream's {want.shape}")
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
        return worst


def model_paths(models_dir: Path, name: str, onnx: bool = True, xnnpack_only: bool = False) -> dict:
    plain_dir = models_dir / f"{name}_portable"
    if xnnpack_only and not (models_dir / f"{name}_xnnpack").exists():
        # A model of tools/gen_xnnpack_fixtures.py --models DIR (e.g. resnet18_xnnpack_int8):
        # the lowered program alone, with its own input and upstream's outputs.
        d = models_dir / name
        paths = {"xnnpack": d / "model.pte", "input": d / "case0" / "input_0.npy"}
        for key in ("xnnpack", "input"):
            if not paths[key].exists():
                sys.exit(f"{paths[key]} is missing: run tools/gen_xnnpack_fixtures.py --models {models_dir}")
        return paths
    paths = {
        "plain": plain_dir / "model.pte",
        "xnnpack": models_dir / f"{name}_xnnpack" / "model.pte",
        "input": plain_dir / "case0" / "input_0.npy",
        "onnx": plain_dir / "model.onnx",
    }
    for key in ("plain", "xnnpack", "input"):
        if not paths[key].exists():
            sys.exit(f"{paths[key]} is missing: run tools/gen_fixtures.py --bench {models_dir}")
    if onnx and not paths["onnx"].exists():
        export_onnx(name, paths["onnx"])
    return paths


def export_onnx(name: str, path: Path) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    import gen_fixtures

    torch.manual_seed(gen_fixtures.seed_for(name))  # the seed the bench fixtures use
    model, x = gen_fixtures.BENCH_MODELS[name]()
    print(f"exporting {name} to ONNX", file=sys.stderr)
    with torch.no_grad():
        torch.onnx.export(model, (x,), str(path), dynamo=True, external_data=False)


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def cpu_description() -> str:
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    shown = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vnni", "avx_vnni") if f in flags]
    return f"{model}, {os.cpu_count()} logical CPUs, features: {' '.join(shown) or 'unknown'}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        kind, model, input_path = sys.argv[2:5]
        threads, iterations, warmup = map(int, sys.argv[5:8])
        fn = worker_ort if kind == "ort" else worker_et
        print(json.dumps(fn(model, input_path, threads, iterations, warmup)))
        return 0

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=str(ROOT / "bench-models"))
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--portable-iterations", type=int, default=1,
                    help="timed runs of upstream's portable program (slow); 0 skips it")
    ap.add_argument("--json", help="also write every measurement to this file")
    ap.add_argument("--xnnpack", action="store_true",
                    help="pte and upstream both on the XNNPACK-lowered file, outputs compared")
    args = ap.parse_args()

    names = args.only.split(",") if args.only else MODELS
    threads_list = [int(t) for t in args.threads.split(",")]
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "pte-cli"], cwd=ROOT, check=True)
    pte = ROOT / "target" / "release" / "pte"
    paths = {n: model_paths(Path(args.models), n, onnx=not args.xnnpack, xnnpack_only=args.xnnpack)
             for n in names}
    if args.xnnpack:
        runtimes = XNNPACK_RUNTIMES
        diffs = {n: max_abs_diff(pte, paths[n]) for n in names}
    else:
        runtimes = [r for r in RUNTIMES if r != "et_portable" or args.portable_iterations > 0]

    results: dict = {}
    for r in range(args.rounds):
        for threads in threads_list:
            for n in names:
                # Rotate the order every round so no runtime always runs first or last.
                shift = (r + names.index(n)) % len(runtimes)
                for rt in runtimes[shift:] + runtimes[:shift]:
                    if rt == "et_portable" and r > 0:
                        continue  # seconds per run: one round is enough to show the gap
                    iters = args.portable_iterations if rt == "et_portable" else args.iterations
                    warm = 0 if rt == "et_portable" else args.warmup
                    # Let the system finish tearing down the previous process (freeing a
                    # Python worker's gigabyte takes the kernel about 0.1 s): a `pte`
                    # started at once loaded 3x slower; a Python worker imports torch
                    # for seconds before its clock starts.
                    time.sleep(SETTLE_S)
                    m = measure(rt, paths[n], threads, iters, warm, pte)
                    results.setdefault((n, threads, rt), []).append(m)
                    print(f"round {r} {n} {threads}t {rt}: {m['median_ms']:.2f} ms "
                          f"(load {m['load_ms']:.1f}, first {m['first_ms']:.1f})", file=sys.stderr)

    def med(n, t, rt, key="median_ms"):
        ms = results.get((n, t, rt))
        return statistics.median(x[key] for x in ms) if ms else float("nan")

    def paired(n, t, rt, peers):
        # Round i of every runtime is entry i of its list (upstream's portable program,
        # timed in round 0 only, is never a peer).
        runs = [results.get((n, t, r), []) for r in (rt, *peers)]
        ratios = [runs[0][i]["median_ms"] / min(r[i]["median_ms"] for r in runs[1:])
                  for i in range(min(map(len, runs)))]
        return statistics.median(ratios) if ratios else float("nan")

    def first_output(n, t, rt):
        ms = results.get((n, t, rt))
        return statistics.median(x["load_ms"] + x["first_ms"] for x in ms) if ms else float("nan")

    print(f"\n{date.today()}, {cpu_description()}, load average {os.getloadavg()[0]:.1f}")
    if args.xnnpack:
        print(f"the XNNPACK-lowered file in both; medians of {args.rounds} rounds x {args.iterations} "
              f"executions, ms; ratio = pte / upstream, below 1: pte is faster; first output = "
              f"load + first execution; max |diff| = pte against upstream's recorded outputs\n")
        print("| model | threads | pte | upstream XNNPACK | ratio | paired | first output: pte "
              "| upstream | ratio | max abs diff |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in names:
            for t in threads_list:
                ours, xnn = med(n, t, "pte_xnnpack"), med(n, t, "et_xnnpack")
                f_ours, f_xnn = first_output(n, t, "pte_xnnpack"), first_output(n, t, "et_xnnpack")
                pair = paired(n, t, "pte_xnnpack", ["et_xnnpack"])
                print(f"| {n} | {t} | {ours:.2f} | {xnn:.2f} | {ours / xnn:.2f} | {pair:.2f} "
                      f"| {f_ours:.1f} | {f_xnn:.1f} | {f_ours / f_xnn:.2f} | {diffs[n]:.2e} |")
        write_json(args, results)
        return 0
    print(f"medians of {args.rounds} rounds x {args.iterations} executions, ms; "
          f"ratio = pte / min(upstream XNNPACK, ONNX Runtime), below 1: pte is faster\n")
    header = ("| model | threads | pte | upstream XNNPACK | ONNX Runtime | upstream portable | ratio "
              "| paired | first output: pte | upstream XNNPACK | ORT |")
    print(header)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in names:
        for t in threads_list:
            ours, xnn, ort_ = med(n, t, "pte"), med(n, t, "et_xnnpack"), med(n, t, "ort")
            pair = paired(n, t, "pte", ["et_xnnpack", "ort"])
            print(f"| {n} | {t} | {ours:.2f} | {xnn:.2f} | {ort_:.2f} | {med(n, t, 'et_portable'):.0f} "
                  f"| {ours / min(xnn, ort_):.2f} | {pair:.2f} | {first_output(n, t, 'pte'):.1f} "
                  f"| {first_output(n, t, 'et_xnnpack'):.1f} | {first_output(n, t, 'ort'):.1f} |")
    write_json(args, results)
    return 0


def write_json(args, results: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"date": str(date.today()), "cpu": cpu_description(),
             "results": [{"model": n, "threads": t, "runtime": rt, "runs": v}
                         for (n, t, rt), v in results.items()]}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
