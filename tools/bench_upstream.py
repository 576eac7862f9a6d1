#!/usr/bin/env python3
"""Times a program in the upstream ExecuTorch runtime, for ratios against `pte bench`.

    .venv-ref/bin/python tools/bench_upstream.py MODEL.pte [--data F.ptd] [--method NAME]
        [--warmup N] [--iterations N] [--threads N]

Prints one line: `median_ms=... p10_ms=... p90_ms=... first_ms=...`.  Inputs are random
tensors of each input's declared shape and dtype (speed does not depend on values).
"""

import argparse
import time

import torch
from executorch.extension.pybindings import portable_lib as et


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--data")
    ap.add_argument("--method", default="forward")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--threads", type=int)
    args = ap.parse_args()
    if args.threads:
        et._unsafe_reset_threadpool(args.threads)
    module = et._load_for_executorch(args.model, args.data) if args.data else \
        et._load_for_executorch(args.model)
    meta = module.method_meta(args.method)
    inputs = []
    for i in range(meta.num_inputs()):
        t = meta.input_tensor_meta(i)
        dtype = {6: torch.float32, 7: torch.float64, 4: torch.int64, 3: torch.int32,
                 11: torch.bool, 5: torch.float16}[t.dtype()]
        shape = list(t.sizes())
        inputs.append(torch.rand(shape).to(dtype) if dtype.is_floating_point
                      else torch.randint(0, 10, shape).to(dtype))
    start = time.perf_counter()
    module.run_method(args.method, inputs)
    first = (time.perf_counter() - start) * 1e3
    for _ in range(args.warmup):
        module.run_method(args.method, inputs)
    times = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        module.run_method(args.method, inputs)
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    pick = lambda p: times[round((len(times) - 1) * p)]
    print(f"median_ms={pick(0.5):.3f} p10_ms={pick(0.1):.3f} p90_ms={pick(0.9):.3f} first_ms={first:.3f}")


if __name__ == "__main__":
    main()
