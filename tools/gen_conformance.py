#!/usr/bin/env python3
"""Generate the operator conformance suite (tests/conformance/).

A table-driven catalogue of single-operator programs (and a few small composites), grouped
by operator family.  Every program is exported with upstream ExecuTorch
(torch.export.export -> executorch.exir.to_edge -> to_executorch), checked to call the
operator it is meant to test, and run in upstream's runtime
(executorch.extension.pybindings.portable_lib, in a separate worker process so that a
kernel that aborts cannot take the generator down).  The same inputs go through eager
PyTorch.  Eager PyTorch is the oracle: its outputs are the expected outputs.  Where
upstream's result differs beyond the case's tolerance the manifest says
``"follows": "pytorch"`` and keeps upstream's outputs too; where upstream refuses a
case PyTorch defines it says ``"follows": "upstream_rejects"`` with upstream's error.
Random operators are checked by statistics, not values.  See tests/conformance/README.md
(written by this script) and DEVELOPERS.md.

Reference environment (pinned; the script refuses other versions): executorch 1.5.1,
torch 2.15.0 (see the docstring of tools/gen_fixtures.py for the setup command).

Usage (from the repository root):

    .venv-ref/bin/python tools/gen_conformance.py              # everything (~15 min)
    .venv-ref/bin/python tools/gen_conformance.py --only conv,pool.max   # substrings of
                                                                # "family::program"
    .venv-ref/bin/python tools/gen_conformance.py --list       # the catalogue, no export

Every program's inputs are seeded from the crc32 of its family (the catalogue is built in
a fixed order), nothing is downloaded, and data files are named by the hash of their
contents, so two runs write byte-identical files.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import io
import json
import logging
import math
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

EXPECTED_VERSIONS = {"executorch": "1.5.1", "torch": "2.15.0"}

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "conformance"


# --------------------------------------------------------------------------------------
# The upstream worker: runs programs in upstream's runtime, in its own process.
# --------------------------------------------------------------------------------------

ERROR_NAMES = {
    0x01: "Internal", 0x02: "InvalidState", 0x10: "NotSupported", 0x11: "NotImplemented",
    0x12: "InvalidArgument", 0x13: "InvalidType", 0x14: "OperatorMissing", 0x20: "NotFound",
    0x21: "MemoryAllocationFailed", 0x22: "AccessFailed", 0x23: "InvalidProgram",
    0x24: "InvalidExternalData", 0x25: "OutOfResources",
}


def _upstream_message(exc: BaseException, log: str) -> str:
    """upstream's error: the error code's name and the kernel's own check message."""
    text = str(exc)
    code = None
    if "error: 0x" in text:
        try:
            code = int(text.rsplit("error: 0x", 1)[1].split()[0], 16)
        except ValueError:
            code = None
    checks = [
        line.split("] ", 1)[-1].strip()
        for line in log.splitlines()
        if "Check failed" in line or ("] " in line and "failed" in line.lower() and "method.cpp" not in line)
    ]
    head = f"error 0x{code:02x} {ERROR_NAMES.get(code, '')}".strip() if code is not None else text.splitlines()[0]
    detail = "; ".join(dict.fromkeys(checks))[:300]
    return f"{head}: {detail}" if detail else head


def worker_main() -> None:  # pragma: no cover - runs in the worker process
    """Reads pickled requests from stdin, answers on the original stdout.

    Upstream's C++ logs go to stderr, which the parent points at a file; the worker reads
    what each call logged from there.
    """
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401
    import executorch.kernels.quantized  # noqa: F401
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    log_path = os.environ["GEN_CONFORMANCE_LOG"]
    stdin = sys.stdin.buffer
    while True:
        try:
            req = pickle.load(stdin)
        except EOFError:
            return
        results = []
        module = None
        if req.get("operator_names"):
            from executorch.extension.pybindings.portable_lib import _get_operator_names

            pickle.dump(sorted(set(_get_operator_names())), proto_out)
            proto_out.flush()
            continue
        for inputs in req["calls"]:
            start = os.path.getsize(log_path)
            try:
                if module is None or not req["sequential"]:
                    module = _load_for_executorch_from_buffer(req["pte"])
                outs = module.run_method(req["method"], list(inputs))
                results.append(("ok", [o.clone() if isinstance(o, torch.Tensor) else o for o in outs]))
            except Exception as e:  # noqa: BLE001 - upstream's errors are data here
                sys.stderr.flush()
                with open(log_path, "r", errors="replace") as f:
                    f.seek(start)
                    log = f.read()
                results.append(("error", _upstream_message(e, log)))
        pickle.dump(results, proto_out)
        proto_out.flush()


if __name__ == "__main__" and "--worker" in sys.argv:
    worker_main()
    sys.exit(0)


# --------------------------------------------------------------------------------------
# Main process setup
# --------------------------------------------------------------------------------------

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.export import Dim  # noqa: E402


def _check_versions() -> None:
    found = {
        "executorch": importlib.metadata.version("executorch").split("+")[0],
        "torch": torch.__version__.split("+")[0],
    }
    assert found == EXPECTED_VERSIONS, (
        f"reference environment mismatch: need {EXPECTED_VERSIONS}, found {found}; "
        "see the docstring of tools/gen_fixtures.py"
    )


_check_versions()
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch.ao.quantization.fx._decomposed  # noqa: E402,F401  (quantized_decomposed ops)
from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge  # noqa: E402
from executorch.exir._serialize._program import (  # noqa: E402
    deserialize_pte_binary,
    serialize_pte_binary,
)
import executorch.exir.passes._quant_patterns_and_replacements  # noqa: E402,F401
import executorch.kernels.quantized  # noqa: E402,F401  (their out variants)
import executorch.exir.passes._device_copy_ops_registry  # noqa: E402,F401  (et_copy ops)

A = torch.ops.aten
Q = torch.ops.quantized_decomposed


class Upstream:
    """A worker process running upstream's runtime; restarted when a kernel aborts it."""

    def __init__(self) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="gen_conformance_upstream_", suffix=".log", delete=False)
        self.proc: Optional[subprocess.Popen] = None

    def _start(self) -> None:
        env = dict(os.environ, GEN_CONFORMANCE_LOG=self.log.name)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.log.name, "ab"),
            env=env,
        )

    def _call(self, pte: bytes, method: str, calls: List[tuple], sequential: bool):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        start = os.path.getsize(self.log.name)
        try:
            pickle.dump({"pte": pte, "method": method, "calls": calls, "sequential": sequential}, self.proc.stdin)
            self.proc.stdin.flush()
            return pickle.load(self.proc.stdout)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError):
            code = self.proc.wait()
            self.proc = None
            with open(self.log.name, "r", errors="replace") as f:
                f.seek(start)
                lines = [ln.split("] ", 1)[-1].strip() for ln in f.read().splitlines() if ln.strip()]
            reason = {-6: "SIGABRT", -11: "SIGSEGV", -8: "SIGFPE", -4: "SIGILL", -7: "SIGBUS"}.get(code, f"exit {code}")
            checks = [ln for ln in lines if "Check failed" in ln or "failed" in ln.lower()]
            detail = "; ".join(dict.fromkeys(checks or lines[-1:]))[:300]
            return f"upstream aborted the process ({reason}): {detail}".rstrip(": ")

    def run(self, pte: bytes, method: str, calls: List[tuple], sequential: bool) -> List[Tuple[str, Any]]:
        """Per call: ("ok", outputs) or ("error", message)."""
        res = self._call(pte, method, calls, sequential)
        if not isinstance(res, str):
            return res
        if sequential or len(calls) == 1:
            return [("error", res)] * len(calls)
        # Find which calls abort: run each alone.
        out = []
        for c in calls:
            r = self._call(pte, method, [c], False)
            out.append(("error", r) if isinstance(r, str) else r[0])
        return out

    def operator_names(self) -> List[str]:
        """Every kernel name upstream's runtime registers (with the quantized library)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        pickle.dump({"operator_names": True}, self.proc.stdin)
        self.proc.stdin.flush()
        return pickle.load(self.proc.stdout)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()
        os.unlink(self.log.name)


# --------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------

# Tolerance levels: name -> (rtol, atol, why).  An element passes when
# |actual - expected| <= atol + rtol * |expected|.  Integer and bool outputs are always
# compared exactly, whatever the level.
TOLERANCES: Dict[str, Tuple[float, float, str]] = {
    "exact": (0.0, 0.0, "data movement, selection, comparisons, sign/rounding ops and "
              "integer results: bit-exact (NaN matches NaN)"),
    "f64": (1e-12, 1e-12, "float64 elementwise: a few ulp"),
    "f64.reduction": (1e-10, 1e-10, "float64 sums and products: summation order"),
    "f32": (1e-6, 1e-6, "float32 elementwise: about 8 ulp, for libm against PyTorch's "
            "vectorized math"),
    "f32.transcendental": (1e-5, 1e-6, "float32 functions PyTorch evaluates with its own "
                           "vectorized approximations (tan, erf, gelu, pow, hyperbolic "
                           "and inverse trigonometric functions): a few tens of ulp"),
    "f32.reduction": (1e-5, 1e-5, "float32 reductions, matrix products, convolutions, "
                      "normalizations and interpolations: summation order"),
    "f16": (1e-3, 1e-3, "float16 elementwise: one ulp (2^-10) from computing in float32 "
            "and rounding once"),
    "f16.reduction": (5e-3, 5e-3, "float16 reductions and products: intermediate rounding"),
    "bf16": (1e-2, 1e-2, "bfloat16 elementwise: one ulp (2^-7)"),
    "bf16.reduction": (3e-2, 3e-2, "bfloat16 reductions and products: intermediate rounding"),
    "quant": (1e-6, 1e-6, "dequantized results and quantization parameters, which upstream "
              "computes in float32 and PyTorch's reference in float64"),
}

FLOAT_LEVEL = {torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
               torch.complex64: "f32", torch.complex128: "f64"}
LEVEL_ORDER = ["exact", "f64", "f64.reduction", "quant", "f32", "f32.transcendental", "f32.reduction",
               "f16", "f16.reduction", "bf16", "bf16.reduction"]


@dataclass
class Prog:
    family: str
    name: str
    module: nn.Module
    cases: List[Tuple[str, tuple]]
    ops: List[str]
    kind: str = "elementwise"  # elementwise | transcendental | reduction | exact | quant
    edge: Dict[str, Any] = field(default_factory=dict)
    backend: Dict[str, Any] = field(default_factory=dict)
    dynamic: Any = None
    example: Optional[tuple] = None
    note: Optional[str] = None
    random: Optional[List[Optional[dict]]] = None
    expect_error: bool = False
    signed_zeros: bool = False
    sequential: bool = False
    eager: Optional[Callable[..., Any]] = None
    rewrite: Optional[Callable[[Any], None]] = None
    export_path: str = "export"
    shape_only: Sequence[int] = ()

    @property
    def full(self) -> str:
        return f"{self.family}::{self.name}"


CATALOGUE: List[Prog] = []
FAMILY_DOCS: Dict[str, str] = {}
UNREACHABLE: Dict[str, str] = {}


class Fn(nn.Module):
    """A pure function of positional inputs as a module (fixed arity for dynamic shapes)."""

    def __init__(self, fn: Callable[..., Any], arity: int):
        super().__init__()
        self.fn = fn
        self.arity = arity

    def forward(self, *args):
        return self.fn(*args)


def _fixed_arity(fn: Callable[..., Any], n: int) -> nn.Module:
    # torch.export matches dynamic_shapes against forward's signature, so give it one.
    names = ", ".join(f"a{i}" for i in range(n))
    ns: Dict[str, Any] = {}
    exec(f"def forward(self{', ' if n else ''}{names}):\n    return self.fn({names})\n", ns)
    cls = type(f"Fn{n}", (Fn,), {"forward": ns["forward"]})
    return cls(fn, n)


def add(family: str, name: str, fn, cases, ops, **kw) -> Prog:
    """Adds a program; `cases` is a list of (variant, inputs) or a single inputs tuple."""
    if isinstance(cases, tuple):
        cases = [("base", cases)]
    module = fn if isinstance(fn, nn.Module) else _fixed_arity(fn, len(cases[0][1]))
    p = Prog(family, name, module, list(cases), list(ops), **kw)
    assert all(q.full != p.full for q in CATALOGUE), f"duplicate program {p.full}"
    CATALOGUE.append(p)
    return p


def family(name: str, doc: str):
    def deco(fn):
        FAMILY_DOCS[name] = doc
        FAMILIES.append((name, fn))
        return fn

    return deco


FAMILIES: List[Tuple[str, Callable[[], None]]] = []


# --------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------

nan, inf = float("nan"), float("inf")
F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
I8, I16, I32, I64, U8, BOOL = torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool
FLOATS = [F32, F64, F16, BF16]
INTS = [I8, I16, I32, I64, U8]
SHORT = {F32: "f32", F64: "f64", F16: "f16", BF16: "bf16", I8: "i8", I16: "i16", I32: "i32", I64: "i64",
         U8: "u8", BOOL: "bool", torch.uint16: "u16", torch.uint32: "u32", torch.uint64: "u64",
         torch.complex64: "c64", torch.complex128: "c128"}


def T(values, dtype=F32, shape=None) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float64 if dtype.is_floating_point else None)
    t = t.to(dtype)
    return t.reshape(shape) if shape is not None else t


def randn(*shape, dtype=F32, scale=1.0):
    return (torch.randn(tuple(shape), dtype=torch.float64) * scale).to(dtype)


def uniform(lo, hi, *shape, dtype=F32):
    return (torch.rand(tuple(shape), dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def randint(lo, hi, *shape, dtype=I64):
    if dtype == BOOL:
        return torch.rand(tuple(shape)) < 0.5
    return torch.randint(lo, hi, shape, dtype=torch.int64).to(dtype)


def rand_of(dtype, *shape, lo=-5, hi=6, scale=2.0):
    if dtype == BOOL:
        return torch.rand(tuple(shape)) < 0.5
    if dtype.is_floating_point:
        return randn(*shape, dtype=dtype, scale=scale)
    if dtype == U8:
        lo = max(lo, 0)
    return randint(lo, hi, *shape, dtype=dtype)


def float_edges(dtype) -> List[float]:
    """Twelve values every float op should get right."""
    tiny = {F32: 1e-40, F64: 1e-310, F16: 6e-8, BF16: 1e-40}[dtype]
    big = {F32: 3e38, F64: 1e308, F16: 65504.0, BF16: 3e38}[dtype]
    return [nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, tiny, big, -7.25]


def int_edges(dtype) -> List[int]:
    if dtype == BOOL:
        return [True, False] * 6
    info = torch.iinfo(dtype)
    vals = [info.min, info.max, 0, 1, -1, 2, -2, 7, -7, info.max - 1, info.min + 1, 3]
    if info.min == 0:
        vals = [0, info.max, 1, 2, 3, 7, 100 % (info.max + 1), info.max - 1, 5, 6, 9, 4]
    return vals


def edges_of(dtype, shape=(3, 4)) -> torch.Tensor:
    vals = float_edges(dtype) if dtype.is_floating_point else int_edges(dtype)
    return T(vals, dtype).reshape(shape)


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def cases_of(*pairs) -> List[Tuple[str, tuple]]:
    return [(name, inputs if isinstance(inputs, tuple) else (inputs,)) for name, inputs in pairs]


# ==== FAMILIES ====


def dtype_sweep(fam: str, base: str, fn, ops, make, dtypes, **kw) -> None:
    """One program per dtype: make(dtype) -> list of (variant, inputs)."""
    for dt in dtypes:
        add(fam, f"{base}_{SHORT[dt]}", fn, make(dt), ops, **kw)


def layout_sweep(fam: str, base: str, fn, ops, **kw) -> None:
    """0-d, empty and channels-last float32 inputs for a one-input op."""
    add(fam, f"{base}_0d", fn, cases_of(("a", T(0.75)), ("b", T(-2.5))), ops, **kw)
    add(fam, f"{base}_empty", fn, cases_of(("base", randn(0, 3))), ops, **kw)
    add(fam, f"{base}_channels_last", fn, cases_of(("base", channels_last(randn(1, 3, 2, 2, scale=2.0)))), ops, **kw)


UNARY_MATH = [
    # name, function, random-input domain, tolerance kind
    ("sin", torch.sin, (-6, 6), "transcendental"),
    ("cos", torch.cos, (-6, 6), "transcendental"),
    ("tan", torch.tan, (-1.5, 1.5), "transcendental"),
    ("asin", torch.asin, (-0.99, 0.99), "transcendental"),
    ("acos", torch.acos, (-0.99, 0.99), "transcendental"),
    ("atan", torch.atan, (-10, 10), "transcendental"),
    ("sinh", torch.sinh, (-5, 5), "transcendental"),
    ("cosh", torch.cosh, (-5, 5), "transcendental"),
    ("tanh", torch.tanh, (-5, 5), "transcendental"),
    ("asinh", torch.asinh, (-10, 10), "transcendental"),
    ("acosh", torch.acosh, (1, 10), "transcendental"),
    ("atanh", torch.atanh, (-0.99, 0.99), "transcendental"),
    ("exp", torch.exp, (-10, 10), "transcendental"),
    ("expm1", torch.expm1, (-3, 3), "transcendental"),
    ("log", torch.log, (0.01, 10), "transcendental"),
    ("log2", torch.log2, (0.01, 10), "transcendental"),
    ("log10", torch.log10, (0.01, 10), "transcendental"),
    ("log1p", torch.log1p, (-0.99, 5), "transcendental"),
    ("sqrt", torch.sqrt, (0, 10), "elementwise"),
    ("rsqrt", torch.rsqrt, (0.01, 10), "elementwise"),
    ("sigmoid", torch.sigmoid, (-10, 10), "transcendental"),
    ("erf", torch.erf, (-3, 3), "transcendental"),
    ("reciprocal", torch.reciprocal, (-4, 4), "elementwise"),
]

UNARY_KEEP = [
    # dtype-preserving ops: name, function, integer dtypes PyTorch accepts
    ("abs", torch.abs, [I8, I16, I32, I64, U8]),
    ("neg", torch.neg, [I8, I16, I32, I64, U8]),
    ("sign", torch.sign, [I8, I32, I64, U8, BOOL]),
    ("ceil", torch.ceil, [I8, I32, I64, U8]),
    ("floor", torch.floor, [I8, I32, I64, U8]),
    ("round", torch.round, [I8, I32, I64, U8]),
    ("trunc", torch.trunc, [I8, I32, I64, U8]),
    ("relu", torch.relu, [I8, I32, I64, U8]),
]


@family("unary", "one-input math: every dtype (integers promote to float), domain edges, NaN, "
        "+-inf, +-0.0, subnormals, 0-d, empty, channels-last")
def _unary() -> None:
    for name, fn, (lo, hi), kind in UNARY_MATH:
        ops = [f"aten::{name}.out"]

        def make(dt, lo=lo, hi=hi):
            if dt.is_floating_point:
                return cases_of(("rand", uniform(lo, hi, 3, 4, dtype=dt)), ("edge", edges_of(dt)))
            return cases_of(("rand", randint(-4, 6, 3, 4, dtype=dt)), ("edge", edges_of(dt)))

        dtype_sweep("unary", name, fn, ops, make, FLOATS + [I32, BOOL], kind=kind)
        layout_sweep("unary", name, fn, ops, kind=kind)
    for name, fn, ints in UNARY_KEEP:
        ops = [f"aten::{name}.out"]

        def make(dt):
            if dt.is_floating_point:
                vals = cases_of(("edge", edges_of(dt)),
                                ("halves", T([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.4, 0.4, -0.0, 0.0, 2.7, -2.7], dt, (3, 4))))
                return cases_of(("rand", rand_of(dt, 3, 4))) + vals if dt == F32 else vals
            return cases_of(("edge", edges_of(dt)))

        dtype_sweep("unary", name, fn, ops, make, FLOATS + ints, kind="exact", signed_zeros=True,
                    note={"sign": "upstream: sign(NaN) is NaN; PyTorch: 0", "abs": "upstream: abs(-0.0) is -0.0; PyTorch: 0.0",
                          **{k: f"upstream: {k} of large int32/int64 values goes through float and overflows"
                             for k in ("ceil", "floor", "round", "trunc")}}.get(name))
        layout_sweep("unary", name, fn, ops, kind="exact", signed_zeros=True)
    for dt in [F32, F16, BF16, F64, I32, U8, BOOL]:
        add("unary", f"logical_not_{SHORT[dt]}", torch.logical_not, cases_of(("edge", edges_of(dt))),
            ["aten::logical_not.out"], kind="exact")
    for dt in [F32, F16, BF16, F64, I32]:
        add("unary", f"isnan_{SHORT[dt]}", torch.isnan, cases_of(("edge", edges_of(dt))), ["aten::isnan.out"], kind="exact")
        add("unary", f"isinf_{SHORT[dt]}", torch.isinf, cases_of(("edge", edges_of(dt))), ["aten::isinf.out"], kind="exact")
    for dt in [BOOL, I8, U8, I16, I32, I64]:
        add("unary", f"bitwise_not_{SHORT[dt]}", torch.bitwise_not, cases_of(("edge", edges_of(dt))),
            ["aten::bitwise_not.out"], kind="exact")
    layout_sweep("unary", "isnan", torch.isnan, ["aten::isnan.out"], kind="exact")


BINARY_EDGE_PAIRS = [(nan, 1.0), (1.0, nan), (inf, 1.0), (-inf, 2.0), (inf, -inf), (0.0, 0.0), (-0.0, 0.0),
                     (1.0, 0.0), (-1.0, 0.0), (1.0, -0.0), (-7.5, 2.0), (7.5, -2.0)]


def binary_edges(dt):
    a, b = zip(*BINARY_EDGE_PAIRS)
    if dt == F16:
        a, b = [min(x, 6e4) if x == x else x for x in a], b
    return T(list(a), dt, (3, 4)), T(list(b), dt, (3, 4))


def int_pairs(dt):
    info = torch.iinfo(dt)
    a = [info.max, info.min, -7, 7, -7, 7, 0, 5, info.max, 3, -1, info.min]
    b = [1, -3, 2, 2, -2, -2, 3, 3, 2, 7, info.min, 2]  # (min / -1 traps in eager PyTorch)
    if info.min == 0:
        a, b = [255, 0, 7, 7, 200, 13, 0, 5, 255, 3, 1, 128], [1, 1, 2, 3, 100, 5, 3, 3, 2, 7, 255, 2]
    return T(a, dt, (3, 4)), T(b, dt, (3, 4))


BINARY = [
    # name, function, ops, dtypes, kind, signed zeros, note
    ("add", lambda a, b: torch.add(a, b), ["aten::add.out"], FLOATS + [I8, I32, I64, U8, BOOL], "elementwise", False),
    ("add_alpha", lambda a, b: torch.add(a, b, alpha=2), ["aten::add.out"], [F32, I32, I64], "elementwise", False),
    ("sub", lambda a, b: torch.sub(a, b), ["aten::sub.out"], FLOATS + [I8, I32, I64, U8], "elementwise", False),
    ("sub_alpha", lambda a, b: torch.sub(a, b, alpha=3), ["aten::sub.out"], [F32, I64], "elementwise", False),
    ("mul", lambda a, b: a * b, ["aten::mul.out"], FLOATS + [I8, I32, I64, U8, BOOL], "elementwise", False),
    ("div", lambda a, b: a / b, ["aten::div.out"], FLOATS + [I32, I64], "elementwise", True),
    ("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), ["aten::div.out_mode"], FLOATS + [I8, I32, I64], "elementwise", True),
    ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), ["aten::div.out_mode"], FLOATS + [I8, I32, I64], "elementwise", True),
    ("remainder", torch.remainder, ["aten::remainder.Tensor_out"], FLOATS + [I8, I32, I64], "elementwise", True),
    ("fmod", torch.fmod, ["aten::fmod.Tensor_out"], FLOATS + [I8, I32, I64], "elementwise", True),
    ("pow", torch.pow, ["aten::pow.Tensor_Tensor_out"], FLOATS + [I32, I64], "transcendental", False),
    ("atan2", torch.atan2, ["aten::atan2.out"], FLOATS + [I32], "transcendental", True),
    ("maximum", torch.maximum, ["aten::maximum.out"], FLOATS + [I8, I32, I64, U8, BOOL], "exact", False),
    ("minimum", torch.minimum, ["aten::minimum.out"], FLOATS + [I8, I32, I64, U8, BOOL], "exact", False),
    ("eq", torch.eq, ["aten::eq.Tensor_out"], FLOATS + [I32, I64, U8, BOOL], "exact", False),
    ("ne", torch.ne, ["aten::ne.Tensor_out"], FLOATS + [I32, I64, BOOL], "exact", False),
    ("lt", torch.lt, ["aten::lt.Tensor_out"], FLOATS + [I32, I64, U8, BOOL], "exact", False),
    ("le", torch.le, ["aten::le.Tensor_out"], FLOATS + [I32, I64, BOOL], "exact", False),
    ("gt", torch.gt, ["aten::gt.Tensor_out"], FLOATS + [I32, I64, U8], "exact", False),
    ("ge", torch.ge, ["aten::ge.Tensor_out"], FLOATS + [I32, I64, BOOL], "exact", False),
    ("bitwise_and", torch.bitwise_and, ["aten::bitwise_and.Tensor_out"], [BOOL, I8, U8, I32, I64], "exact", False),
    ("bitwise_or", torch.bitwise_or, ["aten::bitwise_or.Tensor_out"], [BOOL, I8, U8, I32, I64], "exact", False),
    ("bitwise_xor", torch.bitwise_xor, ["aten::bitwise_xor.Tensor_out"], [BOOL, I8, U8, I32, I64], "exact", False),
    ("logical_and", torch.logical_and, ["aten::logical_and.out"], [BOOL, F32, I32, U8], "exact", False),
    ("logical_or", torch.logical_or, ["aten::logical_or.out"], [BOOL, F32, I32], "exact", False),
    ("logical_xor", torch.logical_xor, ["aten::logical_xor.out"], [BOOL, F32, I64], "exact", False),
]

BINARY_NOTES = {
    "remainder": "upstream: integer remainder takes the sign of the dividend (like fmod); PyTorch: of the divisor",
    "div_floor": "upstream: floor division loses the sign of zero results or differs on signed zeros",
    "pow": "upstream differs on integer pow edge values",
}

PROMOTIONS = [(I32, F32), (I64, F16), (U8, I8), (BOOL, I32), (F16, BF16), (F32, F64), (U8, BOOL), (I16, I64)]
BROADCASTS = [((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (3, 4)), ((2, 1, 4), (3, 1))]


@family("binary", "two-input arithmetic, comparison, bitwise and logical ops: every dtype, type "
        "promotion, broadcasting, 0-d, empty, channels-last, NaN/inf/signed zeros, integer "
        "overflow and division semantics, scalar overloads")
def _binary() -> None:
    for name, fn, ops, dtypes, kind, sz in BINARY:
        note = BINARY_NOTES.get(name)
        kw = dict(kind=kind, signed_zeros=sz, note=note)
        positive_b = name in ("div_trunc", "div_floor", "remainder", "fmod")

        def make(dt, name=name, positive_b=positive_b):
            if dt == BOOL:
                return cases_of(("all", (T([True, True, False, False] * 3, BOOL, (3, 4)), T([True, False] * 6, BOOL, (3, 4)))))
            if dt.is_floating_point:
                return cases_of(("rand", (rand_of(dt, 3, 4), rand_of(dt, 3, 4))), ("edge", binary_edges(dt)))
            a, b = int_pairs(dt)
            if name == "pow":
                b = b.abs().clamp(0, 5) if dt != U8 else b % 4
            cs = cases_of(("edge", (a, b)))
            if positive_b or name in ("div",):
                cs += cases_of(("signs", (T([-7, 7, -7, 7, -1, 1, 0, -6, 6, 9, -9, 5], dt if dt != U8 else I32, (3, 4)).to(dt),
                                          T([2, -2, -2, 2, 3, -3, 5, 4, -4, -3, 3, 1], dt if dt != U8 else I32, (3, 4)).to(dt))))
            return cs

        dtype_sweep("binary", name, fn, ops, make, dtypes, **kw)
        if name in ("add", "sub", "mul", "div", "maximum", "eq", "lt", "remainder", "pow", "bitwise_and", "logical_and", "atan2", "fmod", "div_floor"):
            for sa, sb in BROADCASTS:
                tag = "x".join(map(str, sa)) or "0d"
                bdt = I32 if name.startswith("bitwise") else F32
                add("binary", f"{name}_bcast_{tag}", fn,
                    cases_of(("rand", (rand_of(bdt, *sa, scale=3.0), rand_of(bdt, *sb, scale=3.0)))), ops, **kw)
            for da, db in PROMOTIONS:
                if name.startswith("bitwise") and (da.is_floating_point or db.is_floating_point):
                    continue
                add("binary", f"{name}_{SHORT[da]}_{SHORT[db]}", fn,
                    cases_of(("rand", (rand_of(da, 3, 4, lo=1), rand_of(db, 3, 4, lo=1)))), ops, **kw)
            if name.startswith("bitwise"):
                continue
            add("binary", f"{name}_f32_0d_i64", fn, cases_of(("rand", (rand_of(F32, 3, 4), T(3, I64)))), ops, **kw)
            add("binary", f"{name}_i32_0d_f64", fn, cases_of(("rand", (rand_of(I32, 3, 4, lo=1), T(2.5, F64)))), ops, **kw)
            add("binary", f"{name}_empty", fn, cases_of(("base", (randn(0, 4), randn(1, 4)))), ops, **kw)
            add("binary", f"{name}_channels_last", fn,
                cases_of(("base", (channels_last(randn(1, 3, 2, 2)), channels_last(randn(1, 3, 2, 2, scale=2.0))))), ops, **kw)
    add("binary", "add_mixed_dim_order", lambda a, b: a + b,
        cases_of(("base", (channels_last(randn(1, 3, 2, 2)), randn(1, 3, 2, 2)))), ["aten::add.out"])
    add("binary", "add_float_alpha", lambda a, b: torch.add(a, b, alpha=0.5), cases_of(("rand", (randn(3, 4), randn(3, 4)))), ["aten::add.out"])
    # Shifts (PyTorch: a shift by the bit width or more gives 0, or -1 for negative values shifted right).
    for dt in [I8, U8, I32, I64]:
        bits = torch.iinfo(dt).bits
        a = T([1, -1, 5, -5, 100, -100, 3, 7, 1, -8, 64, 0], dt if dt != U8 else I32, (3, 4)).to(dt)
        b = T([0, 1, 2, 3, bits - 1, bits, bits + 1, 1, 4, 2, 1, 3], dt, (3, 4))
        for d in ("left", "right"):
            op = getattr(A, f"bitwise_{d}_shift")
            add("binary", f"bitwise_{d}_shift_{SHORT[dt]}", lambda a, b, op=op: op.Tensor(a, b), cases_of(("edge", (a, b))),
                [f"aten::bitwise_{d}_shift.Tensor_out"], kind="exact", edge={"preserve_ops": [op.Tensor]})
            add("binary", f"bitwise_{d}_shift_scalar_{SHORT[dt]}", lambda a, op=op: op.Tensor_Scalar(a, 3), cases_of(("edge", (a,))),
                [f"aten::bitwise_{d}_shift.Tensor_Scalar_out"], kind="exact", edge={"preserve_ops": [op.Tensor_Scalar]})
    # Scalar overloads: the exporter keeps these when called directly.
    scalar_ops = [
        ("add", lambda x, s: A.add.Scalar(x, s), "aten::add.Scalar_out"),
        ("sub", lambda x, s: A.sub.Scalar(x, s), "aten::sub.Scalar_out"),
        ("mul", lambda x, s: A.mul.Scalar(x, s), "aten::mul.Scalar_out"),
        ("div", lambda x, s: A.div.Scalar(x, s), "aten::div.Scalar_out"),
        ("div_trunc", lambda x, s: A.div.Scalar_mode(x, s, rounding_mode="trunc"), "aten::div.Scalar_mode_out"),
        ("div_floor", lambda x, s: A.div.Scalar_mode(x, s, rounding_mode="floor"), "aten::div.Scalar_mode_out"),
        ("remainder", lambda x, s: A.remainder.Scalar(x, s), "aten::remainder.Scalar_out"),
        ("fmod", lambda x, s: A.fmod.Scalar(x, s), "aten::fmod.Scalar_out"),
        ("pow", lambda x, s: A.pow.Tensor_Scalar(x, s), "aten::pow.Tensor_Scalar_out"),
        ("rpow", lambda x, s: A.pow.Scalar(s, x), "aten::pow.Scalar_out"),
        ("rsub", lambda x, s: A.rsub.Scalar(x, s), "aten::rsub.Scalar_out"),
        ("eq", lambda x, s: A.eq.Scalar(x, s), "aten::eq.Scalar_out"),
        ("ne", lambda x, s: A.ne.Scalar(x, s), "aten::ne.Scalar_out"),
        ("lt", lambda x, s: A.lt.Scalar(x, s), "aten::lt.Scalar_out"),
        ("le", lambda x, s: A.le.Scalar(x, s), "aten::le.Scalar_out"),
        ("gt", lambda x, s: A.gt.Scalar(x, s), "aten::gt.Scalar_out"),
        ("ge", lambda x, s: A.ge.Scalar(x, s), "aten::ge.Scalar_out"),
        ("bitwise_and", lambda x, s: A.bitwise_and.Scalar(x, s), "aten::bitwise_and.Scalar_out"),
        ("bitwise_or", lambda x, s: A.bitwise_or.Scalar(x, s), "aten::bitwise_or.Scalar_out"),
        ("bitwise_xor", lambda x, s: A.bitwise_xor.Scalar(x, s), "aten::bitwise_xor.Scalar_out"),
    ]
    for name, fn, op in scalar_ops:
        bitwise = name.startswith("bitwise")
        for dt, scalar in ([(I32, 6), (I64, -3), (U8, 5), (BOOL, True)] if bitwise else
                           [(F32, 2.5), (F32, -3), (I32, 2), (I64, -3), (I32, 1.5), (F16, 0.5), (U8, 3), (BOOL, 2)]):
            if name in ("rpow",) and dt == BOOL:
                continue
            sname = str(scalar).replace("-", "m").replace(".", "p")
            add("binary", f"{name}_scalar_{SHORT[dt]}_{sname}", lambda x, fn=fn, s=scalar: fn(x, s),
                cases_of(("edge", edges_of(dt)), ("rand", rand_of(dt, 3, 4))) if dt != BOOL else cases_of(("edge", edges_of(dt))),
                [op], kind="exact" if name in ("eq", "ne", "lt", "le", "gt", "ge") or bitwise else
                ("transcendental" if "pow" in name else "elementwise"),
                signed_zeros=name.startswith(("div", "remainder", "fmod")), note=BINARY_NOTES.get(name),
                edge={"preserve_ops": [A.rsub.Scalar]} if name == "rsub" else {})
    # floor_divide (kept when called directly).
    for dt in [F32, I32, I64, I8]:
        a, b = (binary_edges(dt) if dt.is_floating_point else
                (T([-7, 7, -7, 7, -1, 1, 0, -6, 6, 9, -9, 5], dt, (3, 4)), T([2, -2, -2, 2, 3, -3, 5, 4, -4, -3, 3, 1], dt, (3, 4))))
        add("binary", f"floor_divide_{SHORT[dt]}", lambda a, b: A.floor_divide(a, b), cases_of(("edge", (a, b))),
            ["aten::floor_divide.out"], edge={"preserve_ops": [A.floor_divide.default]}, signed_zeros=True,
            note="upstream: floor division gets signed zeros or integer signs wrong")
    # where / clamp / masked_fill
    for dt in [F32, F16, I32, I64, BOOL, BF16]:
        c = T([True, False] * 6, BOOL, (3, 4))
        add("binary", f"where_{SHORT[dt]}", lambda c, a, b: torch.where(c, a, b),
            cases_of(("edge", (c, edges_of(dt), rand_of(dt, 3, 4)))), ["aten::where.self_out"], kind="exact")
    add("binary", "where_bcast", lambda c, a, b: torch.where(c, a, b),
        cases_of(("base", (T([True, False, True], BOOL, (3, 1)), randn(1, 4), randn(3, 4)))), ["aten::where.self_out"], kind="exact")
    add("binary", "where_promote", lambda c, a, b: torch.where(c, a, b),
        cases_of(("base", (T([True, False, True, False], BOOL), randint(-5, 5, 4, dtype=I32), randn(4)))), ["aten::where.self_out"], kind="exact")
    for dt in [F32, F16, I32, I64, U8, BF16, F64]:
        lo_hi = [(-0.5, 0.5), (None, 1.0), (0.0, None), (2.0, -1.0)] if dt.is_floating_point else [(-2, 3), (None, 1), (0, None), (3, -1)]
        for lo, hi in lo_hi:
            tag = f"{lo}_{hi}".replace("-", "m").replace(".", "p")
            add("binary", f"clamp_{SHORT[dt]}_{tag}", lambda x, lo=lo, hi=hi: torch.clamp(x, lo, hi),
                cases_of(("edge", edges_of(dt))), ["aten::clamp.out"], kind="exact")
    for dt in [F32, I32, F16]:
        add("binary", f"clamp_tensor_{SHORT[dt]}", lambda x, lo, hi: torch.clamp(x, lo, hi),
            cases_of(("edge", (edges_of(dt), rand_of(dt, 4, lo=-3, hi=0), rand_of(dt, 3, 1, lo=0, hi=3))),
                     ("rand", (rand_of(dt, 3, 4), rand_of(dt, 4, lo=-3, hi=0), rand_of(dt, 3, 1, lo=0, hi=3)))),
            ["aten::clamp.Tensor_out"], kind="exact")
    add("binary", "clamp_tensor_min_only", lambda x, lo: torch.clamp(x, lo, None),
        cases_of(("base", (edges_of(F32), randn(3, 1)))), ["aten::clamp.Tensor_out"], kind="exact")
    for dt in [F32, I64, BOOL, F16]:
        val = {F32: 1.5, I64: -7, BOOL: True, F16: -0.25}[dt]
        add("binary", f"masked_fill_{SHORT[dt]}", lambda x, m, v=val: x.masked_fill(m, v),
            cases_of(("base", (rand_of(dt, 3, 4), T([True, False, False] * 4, BOOL, (3, 4))))),
            ["aten::masked_fill.Scalar_out"], kind="exact", edge={"preserve_ops": [A.masked_fill.Scalar]})
    add("binary", "masked_fill_bcast", lambda x, m: x.masked_fill(m, nan),
        cases_of(("base", (randn(3, 4), T([True, False, False, True], BOOL)))),
        ["aten::masked_fill.Scalar_out"], kind="exact", edge={"preserve_ops": [A.masked_fill.Scalar]})


@family("activation", "activations and softmax: approximations, parameters, dims, dtypes, edge values")
def _activation() -> None:
    for dt in [F32, F64, F16, BF16]:
        for approx in ("none", "tanh"):
            add("activation", f"gelu_{approx}_{SHORT[dt]}", lambda x, a=approx: F.gelu(x, approximate=a),
                cases_of(("rand", rand_of(dt, 3, 4)), ("edge", edges_of(dt))), ["aten::gelu.out"], kind="transcendental")
        add("activation", f"elu_{SHORT[dt]}", lambda x: F.elu(x, 0.7), cases_of(("rand", rand_of(dt, 3, 4)), ("edge", edges_of(dt))),
            ["aten::elu.out"], kind="transcendental")
        add("activation", f"selu_{SHORT[dt]}", F.selu, cases_of(("rand", rand_of(dt, 3, 4))), ["aten::elu.out"], kind="transcendental")
        add("activation", f"leaky_relu_{SHORT[dt]}", lambda x: F.leaky_relu(x, 0.2),
            cases_of(("rand", rand_of(dt, 3, 4)), ("edge", edges_of(dt))), ["aten::leaky_relu.out"])
        add("activation", f"hardtanh_{SHORT[dt]}", lambda x: F.hardtanh(x, -0.5, 2.0),
            cases_of(("edge", edges_of(dt))), ["aten::hardtanh.out"], kind="exact")
        add("activation", f"logit_{SHORT[dt]}", lambda x: torch.logit(x), cases_of(("rand", uniform(0.01, 0.99, 3, 4, dtype=dt)), ("edge", edges_of(dt))),
            ["aten::logit.out"], kind="transcendental", edge={"preserve_ops": [A.logit.default]})
        add("activation", f"logit_eps_{SHORT[dt]}", lambda x: torch.logit(x, 0.1), cases_of(("edge", edges_of(dt))),
            ["aten::logit.out"], kind="transcendental", edge={"preserve_ops": [A.logit.default]})
        add("activation", f"glu_{SHORT[dt]}", lambda x: F.glu(x, -1), cases_of(("rand", rand_of(dt, 3, 4))),
            ["aten::glu.out"], kind="transcendental", edge={"preserve_ops": [A.glu.default]})
    add("activation", "elu_params", lambda x: A.elu(x, 0.5, 2.0, 1.5), cases_of(("rand", randn(3, 4))), ["aten::elu.out"], kind="transcendental")
    add("activation", "leaky_relu_negative_slope", lambda x: F.leaky_relu(x, -1.5), cases_of(("rand", randn(3, 4))), ["aten::leaky_relu.out"])
    add("activation", "relu6", F.relu6, cases_of(("edge", edges_of(F32))), ["aten::hardtanh.out"], kind="exact")
    add("activation", "hardtanh_i64", lambda x: A.hardtanh(x, -2, 3), cases_of(("edge", edges_of(I64))), ["aten::hardtanh.out"], kind="exact")
    add("activation", "glu_dim0", lambda x: F.glu(x, 0), cases_of(("rand", randn(4, 3))), ["aten::glu.out"], kind="transcendental",
        edge={"preserve_ops": [A.glu.default]})
    add("activation", "glu_channels_last", lambda x: F.glu(x, 1), cases_of(("rand", channels_last(randn(1, 4, 2, 2)))),
        ["aten::glu.out"], kind="transcendental", edge={"preserve_ops": [A.glu.default]})
    sm_edge = T([[0.0, 1.0, 2.0, 3.0], [-inf, 0.0, 1.0, -inf], [1e30, 1e30, -1e30, 0.0], [-inf, -inf, -inf, -inf],
                 [nan, 1.0, 2.0, 3.0], [inf, 1.0, 0.0, 0.0]], F32)
    for name, fn, op in [("softmax", F.softmax, "aten::_softmax.out"), ("log_softmax", F.log_softmax, "aten::_log_softmax.out")]:
        for dt in [F32, F64, F16, BF16]:
            add("activation", f"{name}_{SHORT[dt]}", lambda x, fn=fn: fn(x, -1),
                cases_of(("rand", rand_of(dt, 6, 4)), ("edge", sm_edge.to(dt))), [op], kind="transcendental")
        for dim in (0, 1, -3):
            add("activation", f"{name}_3d_dim{dim}".replace("-", "m"), lambda x, fn=fn, d=dim: fn(x, d),
                cases_of(("rand", randn(2, 3, 4, scale=3.0))), [op], kind="transcendental")
        add("activation", f"{name}_0d", lambda x, fn=fn: fn(x, 0), cases_of(("a", T(3.0))), [op], kind="transcendental")
        add("activation", f"{name}_empty", lambda x, fn=fn: fn(x, 1), cases_of(("a", randn(0, 4))), [op], kind="transcendental")
        add("activation", f"{name}_channels_last", lambda x, fn=fn: fn(x, 1),
            cases_of(("a", channels_last(randn(1, 3, 2, 2)))), [op], kind="transcendental")
        add("activation", f"{name}_half_to_float", lambda x, op=op: getattr(A, op.split("::")[1].split(".")[0])(x, 1, True),
            cases_of(("a", randn(2, 4, dtype=F16))), [op], kind="transcendental",
            edge={"_check_ir_validity": False})
    # Integer hardtanh: bounds outside the type or fractional compare before narrowing.
    for dt in [U8, I8, I32]:
        add("activation", f"hardtanh_default_{SHORT[dt]}", F.hardtanh, cases_of(("edge", edges_of(dt))), ["aten::hardtanh.out"], kind="exact")
    add("activation", "hardtanh_frac_i32", lambda x: A.hardtanh(x, -2.5, 3.5), cases_of(("edge", edges_of(I32))), ["aten::hardtanh.out"], kind="exact")
    add("activation", "hardtanh_wide_i8", lambda x: A.hardtanh(x, -300, 100), cases_of(("edge", edges_of(I8))), ["aten::hardtanh.out"], kind="exact")


RED_EDGE = T([[1.0, nan, 3.0, -1.0], [2.0, 2.0, -inf, 0.0], [inf, 5.0, -0.0, 0.0]], F32)


@family("reduce", "reductions: dims (negative, several, all), keepdim, dtype arguments, integer "
        "promotion to int64, NaN propagation, ties, empty and 0-d inputs, channels-last")
def _reduce() -> None:
    R = "reduce"
    x3 = lambda dt=F32: rand_of(dt, 2, 3, 4)  # noqa: E731
    for dt in [F32, F64, F16, BF16, I32, I64, U8, BOOL]:
        add(R, f"sum_all_{SHORT[dt]}", lambda x: x.sum(), cases_of(("rand", x3(dt))), ["aten::sum.IntList_out"], kind="reduction")
        add(R, f"sum_dim_{SHORT[dt]}", lambda x: x.sum(-1, keepdim=True), cases_of(("rand", x3(dt))), ["aten::sum.IntList_out"], kind="reduction")
        add(R, f"amax_{SHORT[dt]}", lambda x: x.amax(1), cases_of(("rand", x3(dt))), ["aten::amax.out"], kind="exact")
        add(R, f"amin_{SHORT[dt]}", lambda x: x.amin((0, 2), keepdim=True), cases_of(("rand", x3(dt))), ["aten::amin.out"], kind="exact")
        add(R, f"argmax_{SHORT[dt]}", lambda x: x.argmax(1), cases_of(("rand", x3(dt))), ["aten::argmax.out"], kind="exact")
        add(R, f"argmin_{SHORT[dt]}", lambda x: x.argmin(), cases_of(("rand", x3(dt))), ["aten::argmin.out"], kind="exact")
        add(R, f"max_dim_{SHORT[dt]}", lambda x: x.max(-1), cases_of(("rand", x3(dt))), ["aten::max.dim_max"], kind="exact")
        add(R, f"min_dim_{SHORT[dt]}", lambda x: x.min(0, keepdim=True), cases_of(("rand", x3(dt))), ["aten::min.dim_min"], kind="exact")
        add(R, f"max_{SHORT[dt]}", lambda x: x.max(), cases_of(("rand", x3(dt))), ["aten::max.unary_out"], kind="exact")
        add(R, f"min_{SHORT[dt]}", lambda x: x.min(), cases_of(("rand", x3(dt))), ["aten::min.unary_out"], kind="exact")
        add(R, f"cumsum_{SHORT[dt]}", lambda x: x.cumsum(-1), cases_of(("rand", x3(dt))), ["aten::cumsum.out"], kind="reduction")
        add(R, f"prod_{SHORT[dt]}", lambda x: x.prod(), cases_of(("rand", rand_of(dt, 2, 3, lo=-3, hi=4))), ["aten::prod.out"], kind="reduction")
        add(R, f"prod_dim_{SHORT[dt]}", lambda x: x.prod(1, keepdim=True), cases_of(("rand", rand_of(dt, 2, 3, 2, lo=-3, hi=4))),
            ["aten::prod.int_out"], kind="reduction")
        add(R, f"any_all_{SHORT[dt]}", lambda x: A.any.default(x), cases_of(("rand", x3(dt)), ("zeros", torch.zeros(2, 3, 4, dtype=dt))),
            ["aten::any.all_out"], kind="exact")
        add(R, f"any_dim_{SHORT[dt]}", lambda x: x.any(1), cases_of(("rand", rand_of(dt, 2, 3, 4, lo=0, hi=2))), ["aten::any.out"], kind="exact")
        add(R, f"any_dims_{SHORT[dt]}", lambda x: A.any.dims(x, [0, -1], True), cases_of(("rand", rand_of(dt, 2, 3, 4, lo=0, hi=2))),
            ["aten::any.dims_out"], kind="exact")
    for dt in [F32, F64, F16, BF16]:
        add(R, f"mean_{SHORT[dt]}", lambda x: x.mean((0, -1)), cases_of(("rand", x3(dt))), ["aten::mean.out"], kind="reduction")
        add(R, f"var_{SHORT[dt]}", lambda x: x.var(1), cases_of(("rand", x3(dt))), ["aten::var.correction_out"], kind="reduction")
        add(R, f"nan_{SHORT[dt]}", lambda x: (x.sum(1), x.amax(1), x.amin(0), x.argmax(1), x.max(1), x.min(), x.mean(0)),
            cases_of(("edge", RED_EDGE.to(dt))), ["aten::sum.IntList_out", "aten::amax.out", "aten::amin.out", "aten::argmax.out",
                                                  "aten::max.dim_max", "aten::min.unary_out", "aten::mean.out"],
            kind="reduction")
    add(R, "mean_dtype", lambda x: A.mean.default(x, dtype=F64), cases_of(("rand", x3())), ["aten::mean.dtype_out"], kind="reduction")
    add(R, "mean_dtype_f16", lambda x: A.mean.default(x, dtype=F32), cases_of(("rand", x3(F16))), ["aten::mean.dtype_out"], kind="reduction")
    add(R, "mean_keepdim", lambda x: x.mean(1, keepdim=True), cases_of(("rand", x3())), ["aten::mean.out"], kind="reduction")
    add(R, "mean_empty", lambda x: x.mean(0), cases_of(("base", randn(0, 3))), ["aten::mean.out"], kind="reduction")
    add(R, "mean_channels_last", lambda x: x.mean((2, 3), keepdim=True), cases_of(("base", channels_last(randn(1, 3, 2, 2)))),
        ["aten::mean.out"], kind="reduction")
    add(R, "sum_dtype", lambda x: x.sum(0, dtype=F64), cases_of(("rand", x3())), ["aten::sum.IntList_out"], kind="reduction")
    add(R, "sum_int_dtype", lambda x: x.sum(1, dtype=I32), cases_of(("rand", x3(I8))), ["aten::sum.IntList_out"], kind="reduction")
    add(R, "sum_overflow_i32", lambda x: x.sum(0, dtype=I32), cases_of(("edge", T([2**31 - 1, 1, 5], I32))), ["aten::sum.IntList_out"], kind="exact")
    add(R, "sum_empty", lambda x: x.sum(0), cases_of(("base", randn(0, 3))), ["aten::sum.IntList_out"], kind="reduction")
    add(R, "sum_0d", lambda x: x.sum(), cases_of(("base", T(2.5))), ["aten::sum.IntList_out"], kind="reduction")
    add(R, "sum_dims_neg", lambda x: x.sum((-1, 0)), cases_of(("rand", x3())), ["aten::sum.IntList_out"], kind="reduction")
    add(R, "sum_channels_last", lambda x: x.sum(1, keepdim=True), cases_of(("base", channels_last(randn(1, 3, 2, 2)))),
        ["aten::sum.IntList_out"], kind="reduction")
    add(R, "prod_overflow_i64", lambda x: x.prod(), cases_of(("edge", T([2**40, 2**30, 3], I64))), ["aten::prod.out"], kind="exact")
    add(R, "prod_empty", lambda x: x.prod(0), cases_of(("base", randn(0, 3))), ["aten::prod.int_out"], kind="reduction")
    add(R, "prod_dtype", lambda x: x.prod(0, dtype=F64), cases_of(("rand", randn(3, 2))), ["aten::prod.int_out"], kind="reduction")
    for corr in (0, 1, 2):
        add(R, f"var_correction{corr}", lambda x, c=corr: torch.var(x, (0, 2), correction=c, keepdim=True), cases_of(("rand", x3())),
            ["aten::var.correction_out"], kind="reduction")
        add(R, f"var_mean_correction{corr}", lambda x, c=corr: torch.var_mean(x, -1, correction=c), cases_of(("rand", x3())),
            ["aten::var_mean.correction_out"], kind="reduction", edge={"preserve_ops": [A.var_mean.correction]})
    def correction_to_unbiased(program) -> None:
        from executorch.exir.schema import Bool, EValue

        plan = program.execution_plan[0]
        for i, op in enumerate(plan.operators):
            if op.name == "aten::var" and op.overload == "correction_out":
                op.overload = "out"
                for ins in plan.chains[0].instructions:
                    a = ins.instr_args
                    if getattr(a, "op_index", None) == i:
                        plan.values.append(EValue(val=Bool(bool_val=True)))
                        a.args[2] = len(plan.values) - 1

    add(R, "var_out_overload", lambda x: torch.var(x, 1, correction=1, keepdim=True), cases_of(("rand", x3())), ["aten::var.out"],
        kind="reduction", rewrite=correction_to_unbiased,
        export_path="rewritten: var.correction_out with correction=1 called as var.out with unbiased=True")
    UNREACHABLE["aten::var.out"] = "the exporter canonicalizes every var to var.correction; tested by rewriting the call"
    add(R, "var_single", lambda x: x.var(1), cases_of(("base", randn(3, 1))), ["aten::var.correction_out"], kind="reduction")
    add(R, "var_all_f64", lambda x: x.var(), cases_of(("rand", x3(F64))), ["aten::var.correction_out"], kind="reduction")
    add(R, "var_dim_unbiased_keepdim", lambda x: A.var.dim(x, [1], False, True),
        cases_of(("rand", x3())), ["aten::var.correction_out"], kind="reduction")
    add(R, "argmax_keepdim_ties", lambda x: x.argmax(1, keepdim=True), cases_of(("ties", T([[1, 3, 3, 0], [2, 2, 2, 2]], F32))),
        ["aten::argmax.out"], kind="exact")
    add(R, "argmin_ties", lambda x: x.argmin(0), cases_of(("ties", T([[1, 0, 3], [1, 0, -3]], I32))), ["aten::argmin.out"], kind="exact")
    add(R, "max_dim_ties", lambda x: x.max(1), cases_of(("ties", T([[1, 3, 3, 0], [2, 2, 2, 2]], F32))), ["aten::max.dim_max"], kind="exact")
    add(R, "min_dim_0d", lambda x: x.min(0), cases_of(("base", T(4.0))), ["aten::min.dim_min"], kind="exact")
    add(R, "amax_empty_dims", lambda x: x.amax(()), cases_of(("rand", x3())), ["aten::amax.out"], kind="exact")
    add(R, "amax_empty_input", lambda x: x.amax(1), cases_of(("base", randn(0, 3))), ["aten::amax.out"], kind="exact")
    add(R, "amax_channels_last", lambda x: x.amax(1, keepdim=True), cases_of(("base", channels_last(randn(1, 3, 2, 2)))),
        ["aten::amax.out"], kind="exact")
    for dt in [F32, I64, F16, I32]:
        add(R, f"cumsum_dim0_{SHORT[dt]}", lambda x: x.cumsum(0), cases_of(("rand", rand_of(dt, 4, 3))), ["aten::cumsum.out"], kind="reduction")
    add(R, "cumsum_dtype", lambda x: x.cumsum(1, dtype=F64), cases_of(("rand", randn(2, 5))), ["aten::cumsum.out"], kind="reduction")
    add(R, "cumsum_nan", lambda x: x.cumsum(1), cases_of(("edge", RED_EDGE)), ["aten::cumsum.out"], kind="reduction")
    add(R, "cumsum_empty", lambda x: x.cumsum(0), cases_of(("base", randn(0, 3))), ["aten::cumsum.out"], kind="reduction")
    add(R, "cumsum_0d", lambda x: x.cumsum(0), cases_of(("base", T(3, I32))), ["aten::cumsum.out"], kind="reduction")
    for largest in (True, False):
        for dt in [F32, I32, F16, I64]:
            x = torch.randperm(24).reshape(2, 3, 4).to(dt) - 10
            add(R, f"topk_{'max' if largest else 'min'}_{SHORT[dt]}", lambda x, l=largest: torch.topk(x, 2, dim=-1, largest=l),
                cases_of(("perm", x)), ["aten::topk.values"], kind="exact")
    add(R, "topk_dim0", lambda x: torch.topk(x, 3, dim=0), cases_of(("perm", torch.randperm(20).reshape(5, 4).float())),
        ["aten::topk.values"], kind="exact")
    add(R, "topk_nan", lambda x: torch.topk(x, 2), cases_of(("edge", T([1.0, nan, 3.0, -inf, inf], F32))), ["aten::topk.values"], kind="exact")
    add(R, "topk_k0", lambda x: torch.topk(x, 0), cases_of(("base", randn(5))), ["aten::topk.values"], kind="exact")
    # Ties and sorted=False: PyTorch leaves equal values (and, unsorted, the whole top k) as
    # its C++ standard library's partial_sort / nth_element / sort arrange them.
    for tag, shape, k, kw in [("ties_select", (3, 40), 5, {}), ("ties_partial", (2, 130), 2, {}), ("ties_min", (3, 40), 7, dict(largest=False)),
                              ("ties_long", (2, 70), 33, {}), ("unsorted", (3, 12), 4, dict(sorted=False)),
                              ("unsorted_min", (2, 50), 9, dict(sorted=False, largest=False))]:
        add(R, f"topk_{tag}", lambda x, k=k, kw=kw: torch.topk(x, k, dim=-1, **kw),
            cases_of(("ties", randint(0, 4, *shape).float()), ("perm", torch.randperm(shape[0] * shape[1]).reshape(shape).float())),
            ["aten::topk.values"], kind="exact")
    add(R, "topk_ties_i32_dim0", lambda x: torch.topk(x, 4, dim=0), cases_of(("ties", randint(-2, 2, 9, 5, dtype=I32))),
        ["aten::topk.values"], kind="exact")
    # Products round to their type at each step: an intermediate overflow or underflow shows.
    for dt in [F32, F16, BF16]:
        big, tiny = {F32: (1e30, 1e-30), F16: (300.0, 1e-3), BF16: (1e30, 1e-30)}[dt]
        add(R, f"prod_steps_{SHORT[dt]}", lambda x: x.prod(-1),
            cases_of(("edge", T([[big, big, tiny, tiny], [tiny, tiny, big, big], [-2.5, 6e-8, 65504.0, -7.25]], dt))), ["aten::prod.int_out"],
            kind="exact")
    add(R, "topk_nans", lambda x: torch.topk(x, 4), cases_of(("edge", T([nan, 1.0, nan, 2.0, 2.0, nan, -inf, 1.0], F32))), ["aten::topk.values"],
        kind="exact")


@family("linalg", "matrix products: dtypes, batch, addmm's alpha/beta (beta=0 ignores NaN), linear "
        "with and without bias, cdist and pdist for several p, empty inner dimensions")
def _linalg() -> None:
    L = "linalg"
    for dt in [F32, F64, F16, BF16, I32, I64]:
        add(L, f"mm_{SHORT[dt]}", torch.mm, cases_of(("rand", (rand_of(dt, 3, 5, lo=-3, hi=4), rand_of(dt, 5, 2, lo=-3, hi=4)))),
            ["aten::mm.out"], kind="reduction")
        add(L, f"bmm_{SHORT[dt]}", torch.bmm, cases_of(("rand", (rand_of(dt, 2, 3, 4, lo=-3, hi=4), rand_of(dt, 2, 4, 2, lo=-3, hi=4)))),
            ["aten::bmm.out"], kind="reduction")
        add(L, f"addmm_{SHORT[dt]}", lambda c, a, b: torch.addmm(c, a, b),
            cases_of(("rand", (rand_of(dt, 3, 2, lo=-3, hi=4), rand_of(dt, 3, 4, lo=-3, hi=4), rand_of(dt, 4, 2, lo=-3, hi=4)))),
            ["aten::addmm.out"], kind="reduction")
    add(L, "mm_empty_inner", torch.mm, cases_of(("base", (randn(3, 0), randn(0, 2)))), ["aten::mm.out"], kind="reduction")
    add(L, "mm_empty_rows", torch.mm, cases_of(("base", (randn(0, 3), randn(3, 2)))), ["aten::mm.out"], kind="reduction")
    add(L, "mm_nan", torch.mm, cases_of(("edge", (T([[nan, 1.0], [inf, 0.0], [1.0, 2.0]], F32), T([[1.0, 0.0], [2.0, -inf]], F32)))),
        ["aten::mm.out"], kind="reduction")
    add(L, "bmm_empty", torch.bmm, cases_of(("base", (randn(0, 2, 3), randn(0, 3, 4)))), ["aten::bmm.out"], kind="reduction")
    for alpha, beta in [(2.0, 0.5), (1.0, 0.0), (0.0, 1.0), (-1.0, 2.0)]:
        tag = f"a{alpha}_b{beta}".replace(".", "p").replace("-", "m")
        add(L, f"addmm_{tag}", lambda c, a, b, al=alpha, be=beta: torch.addmm(c, a, b, alpha=al, beta=be),
            cases_of(("rand", (randn(3, 2), randn(3, 4), randn(4, 2))),
                     ("nan_self", (T([[nan, inf], [1.0, -inf], [nan, 0.0]], F32), randn(3, 4), randn(4, 2)))),
            ["aten::addmm.out"], kind="reduction", note="upstream: addmm with beta=0 still propagates NaN and inf from self")
    add(L, "addmm_bcast_row", lambda c, a, b: torch.addmm(c, a, b), cases_of(("rand", (randn(2), randn(3, 4), randn(4, 2)))),
        ["aten::addmm.out"], kind="reduction")
    for dt in [F32, F64, F16]:
        add(L, f"linear_{SHORT[dt]}", lambda x, w, b: F.linear(x, w, b), cases_of(("rand", (rand_of(dt, 2, 3, 4), rand_of(dt, 5, 4), rand_of(dt, 5)))),
            ["aten::linear.out"], kind="reduction", edge={"preserve_ops": [A.linear.default]})
    add(L, "linear_no_bias", lambda x, w: F.linear(x, w), cases_of(("rand", (randn(3, 4), randn(2, 4)))), ["aten::linear.out"],
        kind="reduction", edge={"preserve_ops": [A.linear.default]})
    add(L, "linear_1d", lambda x, w, b: F.linear(x, w, b), cases_of(("rand", (randn(4), randn(2, 4), randn(2)))), ["aten::linear.out"],
        kind="reduction", edge={"preserve_ops": [A.linear.default]})
    for p in (2.0, 1.0, 0.0, inf, 3.0):
        tag = str(p).replace(".", "p")
        add(L, f"cdist_p{tag}", lambda a, b, p=p: torch.cdist(a, b, p=p), cases_of(("rand", (randn(2, 3, 4), randn(2, 5, 4)))),
            ["aten::_cdist_forward.out"], kind="reduction")
        add(L, f"pdist_p{tag}", lambda a, p=p: F.pdist(a, p=p), cases_of(("rand", (randn(5, 3),))), ["aten::_pdist_forward.out"], kind="reduction")
    add(L, "cdist_mm_mode", lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"),
        cases_of(("rand", (randn(4, 3), randn(30, 3)))), ["aten::_cdist_forward.out"], kind="reduction")
    add(L, "cdist_f64", lambda a, b: torch.cdist(a, b), cases_of(("rand", (randn(3, 2, dtype=F64), randn(4, 2, dtype=F64)))),
        ["aten::_cdist_forward.out"], kind="reduction")
    add(L, "pdist_one_row", lambda a: F.pdist(a), cases_of(("rand", (randn(1, 3),))), ["aten::_pdist_forward.out"], kind="reduction")


@family("conv", "convolution 1-d and 2-d, stride/padding/dilation/groups/depthwise, transposed "
        "with output padding, no bias, channels-last, float64/float16; convolution_backward")
def _conv() -> None:
    C = "conv"
    cfgs = [
        ("2d", (1, 2, 5, 5), (3, 2, 3, 3), dict()),
        ("2d_stride_pad", (2, 2, 5, 6), (4, 2, 3, 2), dict(stride=2, padding=1)),
        ("2d_dilation", (1, 2, 6, 6), (2, 2, 2, 3), dict(dilation=2, padding=(1, 0))),
        ("2d_groups", (1, 4, 4, 4), (6, 2, 3, 3), dict(groups=2, padding=1)),
        ("2d_depthwise", (1, 3, 4, 4), (3, 1, 3, 3), dict(groups=3)),
        ("2d_1x1", (2, 3, 2, 2), (4, 3, 1, 1), dict()),
    ]
    for name, xs, ws, kw in cfgs:
        for dt in ([F32, F64, F16] if name == "2d" else [F32]):
            add(C, f"conv{name}_{SHORT[dt]}", lambda x, w, b, kw=kw: F.conv2d(x, w, b, **kw),
                cases_of(("rand", (randn(*xs, dtype=dt), randn(*ws, dtype=dt), randn(ws[0], dtype=dt)))), ["aten::convolution.out"], kind="reduction")
        add(C, f"conv{name}_channels_last", lambda x, w, b, kw=kw: F.conv2d(x, w, b, **kw),
            cases_of(("rand", (channels_last(randn(*xs)), randn(*ws), randn(ws[0])))), ["aten::convolution.out"], kind="reduction")
    add(C, "conv2d_no_bias", lambda x, w: F.conv2d(x, w), cases_of(("rand", (randn(1, 2, 4, 4), randn(3, 2, 2, 2)))),
        ["aten::convolution.out"], kind="reduction")
    add(C, "conv2d_no_batch", lambda x, w: F.conv2d(x, w), cases_of(("rand", (randn(2, 4, 4), randn(3, 2, 2, 2)))),
        ["aten::convolution.out"], kind="reduction")
    add(C, "conv2d_padding_same", lambda x, w: F.conv2d(x, w, padding="same"), cases_of(("rand", (randn(1, 2, 5, 5), randn(3, 2, 3, 3)))),
        ["aten::convolution.out"], kind="reduction")
    add(C, "conv2d_nan", lambda x, w: F.conv2d(x, w), cases_of(("edge", (T([nan, 1, 2, 3, inf, 5, 6, 7, 8], F32, (1, 1, 3, 3)), randn(1, 1, 2, 2)))),
        ["aten::convolution.out"], kind="reduction")
    add(C, "conv2d_empty_batch", lambda x, w: F.conv2d(x, w), cases_of(("base", (randn(0, 2, 3, 3), randn(3, 2, 2, 2)))),
        ["aten::convolution.out"], kind="reduction")
    for dt in [F32, F64]:
        add(C, f"conv1d_{SHORT[dt]}", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1),
            cases_of(("rand", (randn(2, 3, 7, dtype=dt), randn(4, 3, 3, dtype=dt), randn(4, dtype=dt)))), ["aten::convolution.out"], kind="reduction")
    add(C, "conv1d_groups_dilation", lambda x, w: F.conv1d(x, w, groups=2, dilation=2), cases_of(("rand", (randn(1, 4, 8), randn(4, 2, 3)))),
        ["aten::convolution.out"], kind="reduction")
    for name, xs, ws, kw in [("2d", (1, 2, 3, 3), (2, 3, 3, 3), dict()),
                             ("2d_stride_outpad", (1, 2, 3, 4), (2, 3, 3, 2), dict(stride=2, output_padding=1, padding=1)),
                             ("2d_groups_dilation", (1, 4, 3, 3), (4, 1, 2, 2), dict(groups=2, dilation=2))]:
        add(C, f"conv_transpose{name}", lambda x, w, kw=kw: F.conv_transpose2d(x, w, **kw), cases_of(("rand", (randn(*xs), randn(*ws)))),
            ["aten::convolution.out"], kind="reduction")
    add(C, "conv_transpose1d", lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3), cases_of(("rand", (randn(1, 2, 4), randn(2, 3, 2), randn(3)))),
        ["aten::convolution.out"], kind="reduction")
    add(C, "conv_transpose2d_channels_last", lambda x, w: F.conv_transpose2d(x, w, stride=2),
        cases_of(("rand", (channels_last(randn(1, 2, 3, 3)), randn(2, 3, 2, 2)))), ["aten::convolution.out"], kind="reduction")
    for tag, kw, mask in [("all", dict(stride=[1, 1], padding=[1, 1], groups=1), [True, True, True]),
                          ("stride2", dict(stride=[2, 2], padding=[0, 0], groups=1), [True, True, False]),
                          ("groups", dict(stride=[1, 1], padding=[1, 1], groups=2), [True, True, True]),
                          ("input_only", dict(stride=[1, 1], padding=[0, 0], groups=1), [True, False, False]),
                          ("weight_only", dict(stride=[1, 1], padding=[0, 0], groups=1), [False, True, False])]:
        g = kw["groups"]
        xs = (2, 4, 5, 5)
        ws = (4, 4 // g, 3, 3)
        x, w = randn(*xs), randn(*ws)
        out = F.conv2d(x, w, stride=kw["stride"], padding=kw["padding"], groups=g)
        add(C, f"convolution_backward_{tag}",
            lambda go, x, w, kw=kw, mask=mask: A.convolution_backward(go, x, w, [ws[0]], kw["stride"], kw["padding"], [1, 1], False,
                                                                      [0, 0], kw["groups"], mask),
            cases_of(("rand", (randn(*out.shape), x, w))), ["aten::convolution_backward.out"], kind="reduction")


@family("pool", "avg/max/adaptive pooling: kernel, stride, padding, dilation, ceil_mode, "
        "count_include_pad, divisor_override, integer dtypes, NaN, channels-last, 3-d input; "
        "max_pool2d_with_indices_backward")
def _pool() -> None:
    P = "pool"
    cfgs = [("k2", dict(kernel_size=2)), ("k3_s2_p1", dict(kernel_size=3, stride=2, padding=1)),
            ("k2_ceil", dict(kernel_size=2, ceil_mode=True)), ("k3_s1", dict(kernel_size=(3, 2), stride=1))]
    for tag, kw in cfgs:
        add(P, f"max_pool2d_{tag}", lambda x, kw=kw: F.max_pool2d(x, **kw, return_indices=True), cases_of(("rand", randn(2, 2, 5, 5))),
            ["aten::max_pool2d_with_indices.out"], kind="exact")
        add(P, f"avg_pool2d_{tag}", lambda x, kw=kw: F.avg_pool2d(x, **kw), cases_of(("rand", randn(2, 2, 5, 5))),
            ["aten::avg_pool2d.out"], kind="reduction")
    add(P, "max_pool2d_dilation", lambda x: F.max_pool2d(x, 2, dilation=2, return_indices=True), cases_of(("rand", randn(1, 2, 6, 6))),
        ["aten::max_pool2d_with_indices.out"], kind="exact")
    for dt in [F64, F16, BF16, I32, I64, U8, I8]:
        add(P, f"max_pool2d_{SHORT[dt]}", lambda x: F.max_pool2d(x, 2, return_indices=True), cases_of(("rand", rand_of(dt, 1, 2, 4, 4, lo=-50, hi=50))),
            ["aten::max_pool2d_with_indices.out"], kind="exact")
    for dt in [F64, F16, BF16, I64]:
        add(P, f"avg_pool2d_{SHORT[dt]}", lambda x: F.avg_pool2d(x, 2), cases_of(("rand", rand_of(dt, 1, 2, 4, 4, lo=-50, hi=50))),
            ["aten::avg_pool2d.out"], kind="reduction")
    add(P, "max_pool2d_nan", lambda x: F.max_pool2d(x, 2, return_indices=True),
        cases_of(("edge", T([nan, 1, 2, 3, -inf, -inf, 6, inf, 8, 9, nan, nan, 0, -0.0, 1, 1], F32, (1, 1, 4, 4)))),
        ["aten::max_pool2d_with_indices.out"], kind="exact")
    add(P, "max_pool2d_channels_last", lambda x: F.max_pool2d(x, 2, return_indices=True), cases_of(("rand", channels_last(randn(1, 3, 4, 4)))),
        ["aten::max_pool2d_with_indices.out"], kind="exact")
    add(P, "max_pool2d_3d_input", lambda x: F.max_pool2d(x, 2, return_indices=True), cases_of(("rand", randn(2, 4, 4))),
        ["aten::max_pool2d_with_indices.out"], kind="exact")
    add(P, "avg_pool2d_no_pad_count", lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), cases_of(("rand", randn(1, 2, 5, 5))),
        ["aten::avg_pool2d.out"], kind="reduction")
    add(P, "avg_pool2d_divisor", lambda x: F.avg_pool2d(x, 2, divisor_override=3), cases_of(("rand", randn(1, 2, 4, 4))),
        ["aten::avg_pool2d.out"], kind="reduction")
    add(P, "avg_pool2d_ceil_pad", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), cases_of(("rand", randn(1, 1, 6, 6))),
        ["aten::avg_pool2d.out"], kind="reduction")
    add(P, "avg_pool2d_channels_last", lambda x: F.avg_pool2d(x, 2), cases_of(("rand", channels_last(randn(1, 3, 4, 4)))),
        ["aten::avg_pool2d.out"], kind="reduction")
    add(P, "avg_pool2d_3d_input", lambda x: F.avg_pool2d(x, 2), cases_of(("rand", randn(2, 4, 4))), ["aten::avg_pool2d.out"], kind="reduction")
    for out in [(2, 2), (1, 1), (3, 2), (5, 7)]:
        add(P, f"adaptive_avg_pool2d_{out[0]}x{out[1]}", lambda x, o=out: F.adaptive_avg_pool2d(x, o), cases_of(("rand", randn(1, 2, 5, 7))),
            ["aten::_adaptive_avg_pool2d.out"], kind="reduction")
    add(P, "adaptive_avg_pool2d_channels_last", lambda x: F.adaptive_avg_pool2d(x, (2, 2)), cases_of(("rand", channels_last(randn(1, 3, 4, 4)))),
        ["aten::_adaptive_avg_pool2d.out"], kind="reduction")
    add(P, "adaptive_avg_pool2d_f16", lambda x: F.adaptive_avg_pool2d(x, (2, 3)), cases_of(("rand", randn(1, 2, 4, 6, dtype=F16))),
        ["aten::_adaptive_avg_pool2d.out"], kind="reduction")
    for tag, k, s, pad in [("k2", 2, 2, 0), ("k3_s1_p1", 3, 1, 1), ("k3_s2", 3, 2, 0)]:
        x = randn(1, 2, 5, 5)
        _, idx = F.max_pool2d(x, k, s, pad, return_indices=True)

        def mpb(g, x, k=k, s=s, pad=pad):
            _, i = A.max_pool2d_with_indices(x, [k, k], [s, s], [pad, pad])
            return A.max_pool2d_with_indices_backward(g, x, [k, k], [s, s], [pad, pad], [1, 1], False, i)

        add(P, f"max_pool2d_backward_{tag}", mpb, cases_of(("rand", (randn(*idx.shape), x)), ("again", (randn(*idx.shape), x))),
            ["aten::max_pool2d_with_indices_backward.grad_input"], kind="reduction",
            note="upstream: max_pool2d_with_indices_backward accumulates into its output without clearing it first")


@family("norm", "layer, group and batch normalization: normalized shapes, affine or not, eps, "
        "dtypes, training statistics, channels-last")
def _norm() -> None:
    N = "norm"
    for dt in [F32, F64, F16, BF16]:
        add(N, f"layer_norm_{SHORT[dt]}", lambda x, w, b: A.native_layer_norm(x, [4], w, b, 1e-5),
            cases_of(("rand", (randn(2, 3, 4, dtype=dt, scale=3.0), randn(4, dtype=dt), randn(4, dtype=dt)))),
            ["aten::native_layer_norm.out"], kind="reduction")
        add(N, f"group_norm_{SHORT[dt]}", lambda x, w, b: A.native_group_norm(x, w, b, 2, 4, 6, 2, 1e-5),
            cases_of(("rand", (randn(2, 4, 2, 3, dtype=dt), randn(4, dtype=dt), randn(4, dtype=dt)))),
            ["aten::native_group_norm.out"], kind="reduction")
        add(N, f"batch_norm_eval_{SHORT[dt]}", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, eps=1e-3),
            cases_of(("rand", (randn(2, 3, 4, dtype=dt), randn(3, dtype=dt), uniform(0.5, 2, 3, dtype=dt), randn(3, dtype=dt), randn(3, dtype=dt)))),
            ["aten::_native_batch_norm_legit_no_training.out"], kind="reduction")
    add(N, "layer_norm_2d_shape", lambda x: F.layer_norm(x, (3, 4)), cases_of(("rand", randn(2, 3, 4))), ["aten::native_layer_norm.out"], kind="reduction")
    add(N, "layer_norm_no_affine_stats", lambda x: A.native_layer_norm(x, [4], None, None, 1e-2), cases_of(("rand", randn(3, 4))),
        ["aten::native_layer_norm.out"], kind="reduction")
    add(N, "layer_norm_constant_row", lambda x: F.layer_norm(x, (4,)), cases_of(("const", T([[2.0] * 4, [1.0, 2.0, 3.0, 4.0]], F32))),
        ["aten::native_layer_norm.out"], kind="reduction")
    add(N, "layer_norm_empty", lambda x: F.layer_norm(x, (4,)), cases_of(("base", randn(0, 4))), ["aten::native_layer_norm.out"], kind="reduction")
    add(N, "group_norm_groups1", lambda x: F.group_norm(x, 1), cases_of(("rand", randn(2, 4, 3))), ["aten::native_group_norm.out"], kind="reduction")
    add(N, "group_norm_per_channel", lambda x, w, b: F.group_norm(x, 3, w, b), cases_of(("rand", (randn(1, 3, 2, 2), randn(3), randn(3)))),
        ["aten::native_group_norm.out"], kind="reduction")
    add(N, "group_norm_channels_last", lambda x: F.group_norm(x, 2), cases_of(("rand", channels_last(randn(1, 4, 2, 2)))),
        ["aten::native_group_norm.out"], kind="reduction")
    add(N, "batch_norm_eval_4d", lambda x, m, v: F.batch_norm(x, m, v), cases_of(("rand", (randn(2, 3, 2, 2), randn(3), uniform(0.5, 2, 3)))),
        ["aten::_native_batch_norm_legit_no_training.out"], kind="reduction")
    add(N, "batch_norm_eval_2d", lambda x, m, v, w: F.batch_norm(x, m, v, w), cases_of(("rand", (randn(4, 3), randn(3), uniform(0.5, 2, 3), randn(3)))),
        ["aten::_native_batch_norm_legit_no_training.out"], kind="reduction")
    add(N, "batch_norm_eval_channels_last", lambda x, m, v: F.batch_norm(x, m, v),
        cases_of(("rand", (channels_last(randn(2, 3, 2, 2)), randn(3), uniform(0.5, 2, 3)))),
        ["aten::_native_batch_norm_legit_no_training.out"], kind="reduction")
    for dt in [F32, F64]:
        add(N, f"batch_norm_train_no_stats_{SHORT[dt]}", lambda x, w, b: A._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5),
            cases_of(("rand", (randn(3, 2, 4, dtype=dt), randn(2, dtype=dt), randn(2, dtype=dt)))),
            ["aten::_native_batch_norm_legit.no_stats_out"], kind="reduction")
    add(N, "batch_norm_train_no_stats_4d", lambda x: F.batch_norm(x, None, None, training=True), cases_of(("rand", randn(2, 3, 2, 2))),
        ["aten::_native_batch_norm_legit.no_stats_out"], kind="reduction")
    add(N, "instance_norm", lambda x: F.instance_norm(x), cases_of(("rand", randn(2, 3, 4))),
        ["aten::_native_batch_norm_legit.no_stats_out"], kind="reduction")

    # _native_batch_norm_legit.out (with running statistics) has no export path: training
    # export keeps the functional variant, which has no out variant.  The program is the
    # exported no_stats program with the running mean and variance (method inputs) inserted
    # into the call, and returned after it, as upstream's kernel schema has them.
    def with_running_stats(program) -> None:
        plan = program.execution_plan[0]
        for op in plan.operators:
            if op.name == "aten::_native_batch_norm_legit" and op.overload == "no_stats_out":
                op.overload = "out"
        call = plan.chains[0].instructions[0].instr_args
        rm, rv = plan.inputs[3], plan.inputs[4]
        call.args = call.args[:3] + [rm, rv] + call.args[3:]
        # The exported program returns rm * 1 and rv * 1 (keeping the inputs used); the
        # rewritten one returns the running statistics themselves, as updated.
        plan.outputs = list(plan.outputs)[:-2] + [rm, rv]

    def legit_eager(x, w, b, rm, rv):
        out = A._native_batch_norm_legit(x, w, b, rm, rv, True, 0.1, 1e-5)
        return (*out, rm, rv)

    add(N, "batch_norm_train_running_stats",
        lambda x, w, b, rm, rv: A._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5) + (rm * 1, rv * 1),
        cases_of(("rand", (randn(4, 2, 3), randn(2), randn(2), randn(2), uniform(0.5, 2, 2)))),
        ["aten::_native_batch_norm_legit.out"], kind="reduction", rewrite=with_running_stats, eager=legit_eager,
        export_path="rewritten: the no_stats program with running statistics added to the call (no exporter path emits this overload)")
    UNREACHABLE["aten::_native_batch_norm_legit.out"] = (
        "no export path emits it (training export keeps _native_batch_norm_legit_functional, which has no out "
        "variant); tested with a rewritten no_stats program")


@family("shape", "views and copies: permute, transpose, expand, squeeze, unsqueeze, select, slice "
        "(steps, negative and out-of-range bounds), split, unbind, cat (promotion, empty inputs), "
        "stack, narrow, diagonal, as_strided, unfold, repeat, flip, roll, tril, padding "
        "(constant/reflection/replication 1-3 d), pixel (un)shuffle, dim-order conversions")
def _shape() -> None:
    S = "shape"
    x = lambda dt=F32: rand_of(dt, 2, 3, 4)  # noqa: E731
    for dt in [F32, F16, BF16, F64, I8, I32, I64, U8, BOOL]:
        add(S, f"permute_{SHORT[dt]}", lambda x: x.permute(2, 0, 1), cases_of(("rand", x(dt))), ["aten::permute_copy.out"], kind="exact")
        add(S, f"cat_{SHORT[dt]}", lambda a, b: torch.cat([a, b], -1), cases_of(("rand", (x(dt), rand_of(dt, 2, 3, 1)))),
            ["aten::cat.out"], kind="exact")
        if dt == F32:
            continue
        add(S, f"to_copy_f32_to_{SHORT[dt]}", lambda x, dt=dt: x.to(dt), cases_of(("edge", edges_of(F32)), ("rand", randn(3, 4, scale=100.0))),
            ["dim_order_ops::_to_dim_order_copy.out"], kind="exact")
        add(S, f"to_copy_{SHORT[dt]}_to_f32", lambda x: x.to(F32), cases_of(("edge", edges_of(dt))),
            ["dim_order_ops::_to_dim_order_copy.out"], kind="exact")
    for src in [F64, F16, BF16]:
        for dst in [I8, U8, I16, I32, I64, BOOL]:
            add(S, f"to_copy_{SHORT[src]}_to_{SHORT[dst]}", lambda x, d=dst: x.to(d),
                cases_of(("edge", edges_of(src)), ("range", T([300.7, -300.7, 3e9, -3e9, 1e20, -1.5, 255.9, 2**31 + 0.5, 70000.0, -129.0, 128.5, 65535.0], src, (3, 4)))),
                ["dim_order_ops::_to_dim_order_copy.out"], kind="exact")
    for dst in [I8, U8, I16, I32, I64]:
        add(S, f"to_copy_f32_range_to_{SHORT[dst]}", lambda x, d=dst: x.to(d),
            cases_of(("range", T([300.7, -300.7, 3e9, -3e9, 1e20, -1.5, 255.9, 2**31 + 0.5, 70000.0, -129.0, 128.5, 65535.0], F32, (3, 4)))),
            ["dim_order_ops::_to_dim_order_copy.out"], kind="exact")
        add(S, f"to_copy_i64_to_{SHORT[dst]}", lambda x, d=dst: x.to(d), cases_of(("edge", edges_of(I64))),
            ["dim_order_ops::_to_dim_order_copy.out"], kind="exact")
    add(S, "to_copy_channels_last", lambda x: x.to(memory_format=torch.channels_last), cases_of(("rand", randn(1, 3, 2, 2))),
        ["dim_order_ops::_to_dim_order_copy.out"], kind="exact")
    add(S, "to_copy_from_channels_last", lambda x: x.to(F16, memory_format=torch.contiguous_format), cases_of(("rand", channels_last(randn(1, 3, 2, 2)))),
        ["dim_order_ops::_to_dim_order_copy.out"], kind="exact")
    add(S, "clone_dim_order_channels_last", lambda x: x.clone(memory_format=torch.channels_last), cases_of(("rand", randn(2, 3, 2, 2))),
        ["dim_order_ops::_clone_dim_order.out"], kind="exact")
    add(S, "clone_dim_order", lambda x: x.clone(), cases_of(("rand", randint(-9, 9, 2, 3, dtype=I16))), ["dim_order_ops::_clone_dim_order.out"], kind="exact")
    add(S, "clone_aten", lambda x: A.clone.default(x), cases_of(("rand", randn(2, 3))), ["aten::clone.out"], kind="exact",
        edge={"_skip_dim_order": True})
    add(S, "to_copy_aten", lambda x: A._to_copy.default(x, dtype=I32), cases_of(("edge", edges_of(F32))), ["aten::_to_copy.out"], kind="exact",
        edge={"_skip_dim_order": True})
    add(S, "to_copy_aten_f16", lambda x: A._to_copy.default(x, dtype=F16), cases_of(("edge", edges_of(F64))), ["aten::_to_copy.out"], kind="exact",
        edge={"_skip_dim_order": True})
    add(S, "empty_dim_order", lambda x: torch.empty(2, 3) * 0 + x, cases_of(("rand", randn(2, 3))),
        ["dim_order_ops::_empty_dim_order.out"], kind="exact", edge={"_check_ir_validity": False})
    add(S, "empty_aten", lambda x: (A.empty.memory_format([2, 3]), x + 1), cases_of(("rand", randn(2, 3))), ["aten::empty.out"],
        kind="exact", edge={"_skip_dim_order": True, "preserve_ops": [A.empty.memory_format]}, shape_only=(0,))
    add(S, "empty_dim_order_raw", lambda x: (torch.empty(3, 2, dtype=I32), x + 1), cases_of(("rand", randn(2, 3))),
        ["dim_order_ops::_empty_dim_order.out"], kind="exact", shape_only=(0,))
    add(S, "permute_channels_last", lambda x: x.permute(0, 2, 3, 1), cases_of(("rand", channels_last(randn(1, 3, 2, 2)))),
        ["aten::permute_copy.out"], kind="exact")
    add(S, "permute_neg", lambda x: x.permute(-1, -3, -2), cases_of(("rand", x())), ["aten::permute_copy.out"], kind="exact")
    add(S, "permute_empty", lambda x: x.permute(1, 0), cases_of(("rand", randn(0, 3))), ["aten::permute_copy.out"], kind="exact")
    add(S, "t_copy", lambda x: A.t_copy(x), cases_of(("rand", randn(2, 3)), ), ["aten::t_copy.out"], kind="exact", edge={"preserve_ops": [A.t_copy.default]})
    add(S, "t_copy_1d", lambda x: A.t_copy(x), cases_of(("rand", randn(3))), ["aten::t_copy.out"], kind="exact", edge={"preserve_ops": [A.t_copy.default]})
    add(S, "transpose_copy", lambda x: A.transpose_copy.int(x, 0, -1), cases_of(("rand", x(I32))), ["aten::transpose_copy.int_out"], kind="exact",
        edge={"preserve_ops": [A.transpose_copy.int]})
    for tag, shape in [("bcast", [2, 2, 3, 4]), ("neg1", [-1, 3, 4]), ("new_dims", [3, 2, 3, 4])]:
        add(S, f"expand_{tag}", lambda x, s=shape: A.expand_copy(x, s), cases_of(("rand", randn(1, 3, 4) if tag != "new_dims" else randn(2, 3, 4))),
            ["aten::expand_copy.out"], kind="exact")
    add(S, "expand_0d", lambda x: A.expand_copy(x, [2, 3]), cases_of(("rand", T(1.5))), ["aten::expand_copy.out"], kind="exact")
    add(S, "squeeze_dims", lambda x: x.squeeze((0, -1)), cases_of(("rand", randn(1, 3, 1))), ["aten::squeeze_copy.dims_out"], kind="exact")
    add(S, "squeeze_all", lambda x: x.squeeze(), cases_of(("rand", randn(1, 3, 1, 2))), ["aten::squeeze_copy.dims_out"], kind="exact")
    add(S, "squeeze_not_one", lambda x: x.squeeze(1), cases_of(("rand", randn(1, 3, 1))), ["aten::squeeze_copy.dims_out"], kind="exact")
    add(S, "squeeze_dim", lambda x: A.squeeze_copy.dim(x, -1), cases_of(("rand", randn(2, 1))), ["aten::squeeze_copy.dim_out"], kind="exact",
        edge={"preserve_ops": [A.squeeze_copy.dim]})
    add(S, "squeeze_0d", lambda x: x.squeeze(0), cases_of(("rand", T(3.0))), ["aten::squeeze_copy.dims_out"], kind="exact")
    for d in (0, -1, 3):
        add(S, f"unsqueeze_{d}".replace("-", "m"), lambda x, d=d: x.unsqueeze(d), cases_of(("rand", x())), ["aten::unsqueeze_copy.out"], kind="exact")
    add(S, "unsqueeze_0d", lambda x: x.unsqueeze(0), cases_of(("rand", T(2, I64))), ["aten::unsqueeze_copy.out"], kind="exact")
    for tag, fn in [("pos", lambda x: x[1]), ("neg", lambda x: x[:, -1]), ("last_dim", lambda x: x[..., 2])]:
        add(S, f"select_{tag}", fn, cases_of(("rand", x())), ["aten::select_copy.int_out"], kind="exact")
    for tag, fn in [("step", lambda x: x[:, ::2]), ("neg_start", lambda x: x[..., -3:]), ("clamp_end", lambda x: A.slice_copy.Tensor(x, 2, 1, 100)),
                    ("neg_end", lambda x: x[:, 0:-1]), ("empty", lambda x: A.slice_copy.Tensor(x, 1, 2, 2)),
                    ("start_past_end", lambda x: A.slice_copy.Tensor(x, 2, 5, 9)), ("step3", lambda x: A.slice_copy.Tensor(x, 2, 0, 4, 3))]:
        add(S, f"slice_{tag}", fn, cases_of(("rand", x())), ["aten::slice_copy.Tensor_out"], kind="exact")
    add(S, "split", lambda x: torch.split(x, 2, -1), cases_of(("rand", x())), ["aten::split_with_sizes_copy.out"], kind="exact")
    add(S, "split_copy", lambda x: A.split_copy.Tensor(x, 3, 2), cases_of(("rand", randn(2, 2, 7))), ["aten::split_copy.Tensor_out"], kind="exact",
        edge={"preserve_ops": [A.split_copy.Tensor]})
    add(S, "split_copy_dim0", lambda x: A.split_copy.Tensor(x, 1, 0), cases_of(("rand", x(I64))), ["aten::split_copy.Tensor_out"], kind="exact",
        edge={"preserve_ops": [A.split_copy.Tensor]})
    add(S, "split_with_sizes", lambda x: torch.split(x, [1, 0, 2], 1), cases_of(("rand", x())), ["aten::split_with_sizes_copy.out"], kind="exact")
    add(S, "unbind", lambda x: A.unbind_copy.int(x, 1), cases_of(("rand", x())), ["aten::unbind_copy.int_out"], kind="exact",
        edge={"preserve_ops": [A.unbind_copy.int]})
    add(S, "unbind_neg", lambda x: A.unbind_copy.int(x, -1), cases_of(("rand", randn(2, 2))), ["aten::unbind_copy.int_out"], kind="exact",
        edge={"preserve_ops": [A.unbind_copy.int]})
    add(S, "cat_dim0", lambda a, b, c: torch.cat([a, b, c]), cases_of(("rand", (randn(1, 3), randn(2, 3), randn(0, 3)))), ["aten::cat.out"], kind="exact")
    add(S, "cat_legacy_empty", lambda a, b: torch.cat([a, b], 1), cases_of(("rand", (randn(0), randn(2, 3)))), ["aten::cat.out"], kind="exact")
    for da, db in [(I32, F32), (I64, F16), (U8, I8), (BOOL, I32), (F16, F32), (BOOL, F32)]:
        add(S, f"cat_{SHORT[da]}_{SHORT[db]}", lambda a, b: torch.cat([a, b]), cases_of(("rand", (rand_of(da, 2, 3), rand_of(db, 1, 3)))),
            ["aten::cat.out"], kind="exact", note="upstream: cat of mixed dtypes (e.g. int32 with float32) converts values wrongly",
            edge={"_check_ir_validity": False})
    add(S, "cat_channels_last", lambda a, b: torch.cat([a, b], 1), cases_of(("rand", (channels_last(randn(1, 2, 2, 2)), channels_last(randn(1, 3, 2, 2))))),
        ["aten::cat.out"], kind="exact")
    add(S, "cat_0d_list", lambda a: torch.cat([a]), cases_of(("rand", randn(3))), ["aten::cat.out"], kind="exact")
    for dim in (0, 1, -1):
        add(S, f"stack_{dim}".replace("-", "m"), lambda a, b, d=dim: torch.stack([a, b], d), cases_of(("rand", (randn(2, 3), randn(2, 3)))),
            ["aten::stack.out"], kind="exact", edge={"preserve_ops": [A.stack.default]})
    add(S, "stack_mixed", lambda a, b: torch.stack([a, b]), cases_of(("rand", (rand_of(I32, 2), randn(2)))), ["aten::stack.out"], kind="exact",
        edge={"preserve_ops": [A.stack.default], "_check_ir_validity": False})
    add(S, "narrow_copy", lambda x: A.narrow_copy(x, -1, 1, 2), cases_of(("rand", x())), ["aten::narrow_copy.out"], kind="exact")
    for tag, fn in [("main", lambda x: torch.diagonal(x)), ("offset", lambda x: torch.diagonal(x, 1)), ("neg_offset", lambda x: torch.diagonal(x, -1, 0, 2)),
                    ("dims", lambda x: torch.diagonal(x, 0, -1, 0)), ("offset_out", lambda x: torch.diagonal(x, 5))]:
        add(S, f"diagonal_{tag}", fn, cases_of(("rand", randn(3, 4) if tag in ("main", "offset", "offset_out") else x())),
            ["aten::diagonal_copy.out"], kind="exact")
    for tag, size, stride, off in [("basic", (2, 2), (1, 2), 0), ("offset", (3,), (2,), 1), ("overlap", (3, 3), (1, 1), 0)]:
        add(S, f"as_strided_{tag}", lambda x, s=size, st=stride, o=off: torch.as_strided(x, s, st, o), cases_of(("rand", randn(3, 4))),
            ["aten::as_strided_copy.out"], kind="exact")
    for tag, args in [("basic", (1, 2, 1)), ("step2", (-1, 2, 2)), ("full", (0, 2, 1))]:
        add(S, f"unfold_{tag}", lambda x, a=args: A.unfold_copy(x, *a), cases_of(("rand", x())), ["aten::unfold_copy.out"], kind="exact",
            edge={"preserve_ops": [A.unfold_copy.default]})
    for tag, reps in [("basic", (2, 1, 1)), ("more_dims", (2, 1, 2, 1)), ("zero", (0, 1, 1))]:
        add(S, f"repeat_{tag}", lambda x, r=reps: x.repeat(*r), cases_of(("rand", x())), ["aten::repeat.out"], kind="exact")
    add(S, "repeat_interleave", lambda r: A.repeat_interleave.Tensor(r, output_size=6), cases_of(("base", T([1, 3, 0, 2], I64))),
        ["aten::repeat_interleave.Tensor_out"], kind="exact", edge={"preserve_ops": [A.repeat_interleave.Tensor]})
    add(S, "repeat_interleave_i32", lambda r: A.repeat_interleave.Tensor(r, output_size=3), cases_of(("base", T([2, 0, 1], I32))),
        ["aten::repeat_interleave.Tensor_out"], kind="exact", edge={"preserve_ops": [A.repeat_interleave.Tensor]})
    for tag, dims in [("0", (0,)), ("neg", (-1,)), ("many", (0, 2))]:
        add(S, f"flip_{tag}", lambda x, d=dims: x.flip(d), cases_of(("rand", x())), ["aten::flip.out"], kind="exact")
    for tag, sh, dims in [("1", 1, 1), ("neg", -2, -1), ("many", (1, 5), (0, 2)), ("flat", 3, None)]:
        add(S, f"roll_{tag}", lambda x, s=sh, d=dims: torch.roll(x, s, d), cases_of(("rand", x())), ["aten::roll.out"], kind="exact",
            edge={"preserve_ops": [A.roll.default]})
    for tag, k in [("0", 0), ("1", 1), ("neg", -1), ("big", 10)]:
        add(S, f"tril_{tag}", lambda x, k=k: x.tril(k), cases_of(("rand", randn(2, 3, 4))), ["aten::tril.out"], kind="exact",
            edge={"preserve_ops": [A.tril.default]})
    add(S, "tril_bool", lambda x: x.tril(), cases_of(("rand", rand_of(BOOL, 3, 3))), ["aten::tril.out"], kind="exact", edge={"preserve_ops": [A.tril.default]})
    for tag, pad, val in [("last", (1, 2), 0.0), ("two", (1, 1, 2, 0), 0.5), ("neg", (-1, 1), 0.0), ("three", (0, 1, 1, 0, 1, 1), -1.0)]:
        add(S, f"constant_pad_{tag}", lambda x, p=pad, v=val: F.pad(x, p, value=v), cases_of(("rand", randn(1, 2, 3, 4))),
            ["aten::constant_pad_nd.out"], kind="exact", note="upstream rejects negative padding")
    add(S, "constant_pad_int", lambda x: F.pad(x, (1, 1), value=3), cases_of(("rand", rand_of(I32, 2, 3))), ["aten::constant_pad_nd.out"], kind="exact")
    for mode in ("reflect", "replicate"):
        for nd, shape, pad in [(1, (1, 2, 5), (2, 1)), (2, (1, 2, 3, 4), (1, 2, 2, 0)), (3, (1, 1, 3, 3, 3), (1, 1, 0, 2, 1, 0))]:
            opname = {"reflect": "reflection", "replicate": "replication"}[mode]
            op = getattr(A, f"{opname}_pad{nd}d")
            add(S, f"{opname}_pad{nd}d", lambda x, p=pad, m=mode: F.pad(x, p, mode=m), cases_of(("rand", randn(*shape))),
                [f"aten::{opname}_pad{nd}d.out"], kind="exact", edge={"preserve_ops": [op.default]})
            add(S, f"{opname}_pad{nd}d_no_batch", lambda x, p=pad, m=mode: F.pad(x, p, mode=m), cases_of(("rand", randn(*shape[1:]))),
                [f"aten::{opname}_pad{nd}d.out"], kind="exact", edge={"preserve_ops": [op.default]})
    for r in (2, 3):
        add(S, f"pixel_shuffle_{r}", lambda x, r=r: F.pixel_shuffle(x, r), cases_of(("rand", randn(1, 2 * r * r, 2, 3))),
            ["aten::pixel_shuffle.out"], kind="exact", edge={"preserve_ops": [A.pixel_shuffle.default]})
        add(S, f"pixel_unshuffle_{r}", lambda x, r=r: F.pixel_unshuffle(x, r), cases_of(("rand", randn(2, 1, 2 * r, 3 * r))),
            ["aten::pixel_unshuffle.out"], kind="exact", edge={"preserve_ops": [A.pixel_unshuffle.default]})
    add(S, "view_copy", lambda x: A.view_copy(x, [3, -1]), cases_of(("rand", x())), ["aten::view_copy.out"], kind="exact")
    add(S, "view_copy_0d", lambda x: A.view_copy(x, []), cases_of(("rand", randn(1, 1))), ["aten::view_copy.out"], kind="exact")
    add(S, "reshape_i64", lambda x: x.reshape(4, 6), cases_of(("rand", x(I64))), ["aten::view_copy.out"], kind="exact")
    add(S, "alias_copy", lambda x: A.alias_copy(x), cases_of(("rand", x())), ["aten::alias_copy.out"], kind="exact")
    add(S, "detach_copy", lambda x: A.detach_copy(x), cases_of(("rand", x(F16))), ["aten::detach_copy.out"], kind="exact")
    add(S, "copy", lambda x, y: A.copy(x, y), cases_of(("rand", (randn(2, 3), rand_of(I32, 3)))), ["aten::copy.out"], kind="exact")

    def rename(old: str, new_name: str, new_overload: str):
        def rewrite(program) -> None:
            for op in program.execution_plan[0].operators:
                if op.name + "." + op.overload == old:
                    op.name, op.overload = new_name, new_overload
        return rewrite

    for name, new in [("lift_fresh_copy", "aten::lift_fresh_copy"), ("h2d_copy", "et_copy::_h2d_copy"), ("d2h_copy", "et_copy::_d2h_copy")]:
        add(S, name, lambda x: A.alias_copy(x), cases_of(("rand", x())), [f"{new}.out"], kind="exact",
            rewrite=rename("aten::alias_copy.out", new, "out"),
            export_path=f"rewritten: alias_copy.out renamed {new}.out (same schema; no exporter path emits it from eager code)")
    UNREACHABLE["aten::lift_fresh_copy.out"] = "export removes lift_fresh_copy; tested by renaming alias_copy.out (same schema)"
    UNREACHABLE["et_copy::_h2d_copy.out"] = ("emitted only around delegates targeting another device; tested by renaming "
                                             "alias_copy.out (same schema)")
    UNREACHABLE["et_copy::_d2h_copy.out"] = UNREACHABLE["et_copy::_h2d_copy.out"]


@family("index", "gather/scatter/index family: negative and repeated indices, bool masks, "
        "broadcast index tensors, accumulate, int32 and int64 indices, empty selections, embedding")
def _index() -> None:
    X = "index"
    x = randn(3, 4)
    for dt in [F32, I64, F16, BOOL]:
        add(X, f"index_select_{SHORT[dt]}", lambda x, i: torch.index_select(x, 1, i), cases_of(("rand", (rand_of(dt, 3, 4), T([3, 0, 3], I64)))),
            ["aten::index_select.out"], kind="exact")
        add(X, f"gather_{SHORT[dt]}", lambda x, i: torch.gather(x, 1, i), cases_of(("rand", (rand_of(dt, 3, 4), T([[0, 3], [1, 1], [2, 0]], I64)))),
            ["aten::gather.out"], kind="exact")
    add(X, "index_select_i32_index", lambda x, i: torch.index_select(x, 0, i), cases_of(("rand", (x, T([2, 2, 0], I32)))), ["aten::index_select.out"], kind="exact")
    add(X, "index_select_empty", lambda x, i: torch.index_select(x, 0, i), cases_of(("rand", (x, T([], I64)))), ["aten::index_select.out"], kind="exact")
    add(X, "index_select_0d", lambda x, i: torch.index_select(x, 0, i), cases_of(("rand", (T(3.0), T([0], I64)))), ["aten::index_select.out"], kind="exact")
    add(X, "gather_dim0_neg", lambda x, i: torch.gather(x, -2, i), cases_of(("rand", (x, T([[2, 0, 1, 1]], I64)))), ["aten::gather.out"], kind="exact")
    add(X, "gather_smaller", lambda x, i: torch.gather(x, 1, i), cases_of(("rand", (x, T([[0], [3]], I64)))), ["aten::gather.out"], kind="exact")
    for tag, fn, args in [
        ("one", lambda x, i: x[i], (x, T([2, -1, 0], I64))),
        ("two", lambda x, i, j: x[i, j], (x, T([0, 2], I64), T([3, -4], I64))),
        ("bcast", lambda x, i, j: x[i, j], (x, T([[0], [2]], I64), T([1, 3], I64))),
        ("middle", lambda x, i: x[:, i], (randn(2, 3, 4), T([2, 0], I64))),
        ("bool", lambda x, m: x[m], (x, T([True, False, True], BOOL))),
        ("bool_2d", lambda x, m: x[m], (x, x > 0)),
        ("i32", lambda x, i: x[i], (x, T([1, 1], I32))),
        ("split_dims", lambda x, i, j: x[i, :, j], (randn(3, 2, 4), T([0, 2], I64), T([1, 3], I64))),
    ]:
        add(X, f"index_{tag}", fn, cases_of(("rand", args)), ["aten::index.Tensor_out"], kind="exact")
    for tag, fn, args, acc in [
        ("basic", lambda x, i, v: torch.index_put(x, (i,), v), (x, T([2, 0], I64), randn(2, 4)), False),
        ("accumulate", lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True), (x, T([1, 1, 2], I64), randn(3, 4)), True),
        ("bcast_value", lambda x, i, v: torch.index_put(x, (i,), v), (x, T([0, -1], I64), randn(4)), False),
        ("two", lambda x, i, j, v: torch.index_put(x, (i, j), v), (x, T([0, 2], I64), T([1, 3], I64), randn(2)), False),
        ("bool", lambda x, m, v: torch.index_put(x, (m,), v), (x, T([True, False, True], BOOL), randn(2, 4)), False),
        ("int", lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True), (rand_of(I32, 3, 4), T([0, 0], I64), rand_of(I32, 2, 4)), True),
    ]:
        add(X, f"index_put_{tag}", fn, cases_of(("rand", args)), ["aten::index_put.out"], kind="reduction" if acc else "exact")
    for dt in [F32, I32]:
        add(X, f"scatter_src_{SHORT[dt]}", lambda x, i, s: torch.scatter(x, 1, i, s),
            cases_of(("rand", (rand_of(dt, 3, 4), T([[0, 3], [2, 1], [1, 0]], I64), rand_of(dt, 3, 2)))), ["aten::scatter.src_out"], kind="exact")
        add(X, f"scatter_value_{SHORT[dt]}", lambda x, i: torch.scatter(x, 0, i, 7),
            cases_of(("rand", (rand_of(dt, 3, 4), T([[2, 0, 1, 0]], I64)))), ["aten::scatter.value_out"], kind="exact")
        add(X, f"scatter_add_{SHORT[dt]}", lambda x, i, s: torch.scatter_add(x, 1, i, s),
            cases_of(("rand", (rand_of(dt, 3, 4), T([[0, 0, 3], [1, 1, 1], [2, 3, 2]], I64), rand_of(dt, 3, 3)))), ["aten::scatter_add.out"],
            kind="reduction")
    add(X, "scatter_add_neg_dim", lambda x, i, s: torch.scatter_add(x, -2, i, s), cases_of(("rand", (x, T([[0, 2, 2, 0]], I64), randn(1, 4)))),
        ["aten::scatter_add.out"], kind="reduction")
    add(X, "select_scatter", lambda x, s: torch.select_scatter(x, s, 0, -1), cases_of(("rand", (x, randn(4)))), ["aten::select_scatter.out"],
        kind="exact", edge={"preserve_ops": [A.select_scatter.default]})
    add(X, "select_scatter_dim1", lambda x, s: torch.select_scatter(x, s, 1, 2), cases_of(("rand", (rand_of(I64, 3, 4), rand_of(I64, 3)))),
        ["aten::select_scatter.out"], kind="exact", edge={"preserve_ops": [A.select_scatter.default]})
    for tag, args in [("basic", (1, 0, 2, 1)), ("step", (1, 0, 4, 2)), ("neg", (0, -2, None, 1))]:
        d, st, en, sp = args
        shape = list(x.shape)
        shape[d] = len(range(*slice(st, en, sp).indices(shape[d])))
        add(X, f"slice_scatter_{tag}", lambda x, s, a=args: torch.slice_scatter(x, s, *a), cases_of(("rand", (x, randn(*shape)))),
            ["aten::slice_scatter.out"], kind="exact")
    add(X, "masked_scatter", lambda x, m, s: x.masked_scatter(m, s), cases_of(("rand", (x, x > 0, randn(12)))), ["aten::masked_scatter.out"], kind="exact")
    add(X, "masked_scatter_bcast", lambda x, m, s: x.masked_scatter(m, s), cases_of(("rand", (x, T([True, False, False, True], BOOL), randn(8)))),
        ["aten::masked_scatter.out"], kind="exact")
    for dt in [F32, I32, BOOL]:
        add(X, f"masked_select_{SHORT[dt]}", lambda x, m: torch.masked_select(x, m), cases_of(("rand", (rand_of(dt, 3, 4), x > 0))),
            ["aten::masked_select.out"], kind="exact", edge={"preserve_ops": [A.masked_select.default]})
    add(X, "masked_select_bcast", lambda x, m: torch.masked_select(x, m), cases_of(("rand", (x, T([True, False, True], BOOL).reshape(3, 1)))),
        ["aten::masked_select.out"], kind="exact", edge={"preserve_ops": [A.masked_select.default]})
    for tag, inp in [("1d", T([0, 1.5, 0, -2, nan], F32)), ("2d", randint(0, 2, 3, 4, dtype=I32)), ("3d", rand_of(BOOL, 2, 2, 3)),
                     ("none", torch.zeros(2, 3)), ("0d", T(5, I64))]:
        add(X, f"nonzero_{tag}", torch.nonzero, cases_of(("rand", inp)), ["aten::nonzero.out"], kind="exact",
            note="upstream: nonzero on 2-d and 3-d inputs returns wrong coordinates")
    for dt in [F32, F16, I64]:
        add(X, f"embedding_{SHORT[dt]}", lambda w, i: F.embedding(i, w), cases_of(("rand", (rand_of(dt, 5, 3), T([[0, 4], [2, 2]], I64)))),
            ["aten::embedding.out"], kind="exact")
    add(X, "embedding_i32_index", lambda w, i: F.embedding(i, w), cases_of(("rand", (randn(5, 3), T([4, 0, 1], I32)))), ["aten::embedding.out"], kind="exact")
    add(X, "embedding_0d_index", lambda w, i: F.embedding(i, w), cases_of(("rand", (randn(5, 3), T(3, I64)))), ["aten::embedding.out"], kind="exact")
    # float16/bfloat16 scatter_add sums in float32 and rounds once (300 ones reach 300 in bfloat16).
    for dt in [F16, BF16]:
        add(X, f"scatter_add_many_{SHORT[dt]}", lambda x, i, s: torch.scatter_add(x, 1, i, s),
            cases_of(("ones", (torch.zeros(2, 3, dtype=dt), torch.zeros(2, 300, dtype=I64), torch.ones(2, 300, dtype=dt)))),
            ["aten::scatter_add.out"], kind="exact")
        add(X, f"scatter_add_many_rand_{SHORT[dt]}", lambda x, i, s: torch.scatter_add(x, 1, i, s),
            cases_of(("rand", (rand_of(dt, 2, 3), randint(0, 3, 2, 40), rand_of(dt, 2, 40)))), ["aten::scatter_add.out"], kind="exact")


@family("create", "tensor creation: full/zeros/ones/empty/arange/scalar_tensor/fill with dtypes, "
        "negative and fractional steps")
def _create() -> None:
    C = "create"
    z = randn(2)
    for dt in [F32, I32, I64, BOOL, F16, U8]:
        v = {F32: 2.5, I32: -3, I64: 7, BOOL: True, F16: 0.1, U8: 200}[dt]
        add(C, f"full_{SHORT[dt]}", lambda x, v=v, dt=dt: (torch.full((2, 3), v, dtype=dt), x + 1), cases_of(("base", z)), ["aten::full.out"], kind="exact")
        add(C, f"full_like_{SHORT[dt]}", lambda x, v=v, dt=dt: torch.full_like(x, v, dtype=dt), cases_of(("base", randn(2, 3))),
            ["aten::full_like.out"], kind="exact")
        add(C, f"zeros_{SHORT[dt]}", lambda x, dt=dt: (A.zeros.default([2, 2], dtype=dt), x + 1), cases_of(("base", z)), ["aten::zeros.out"],
            kind="exact", edge={"preserve_ops": [A.zeros.default]})
        add(C, f"ones_{SHORT[dt]}", lambda x, dt=dt: (A.ones.default([3], dtype=dt), x + 1), cases_of(("base", z)), ["aten::ones.out"],
            kind="exact", edge={"preserve_ops": [A.ones.default]})
        add(C, f"scalar_tensor_{SHORT[dt]}", lambda x, v=v, dt=dt: (torch.scalar_tensor(v, dtype=dt), x + 1), cases_of(("base", z)),
            ["aten::scalar_tensor.out"], kind="exact")
    add(C, "full_like_channels_last", lambda x: torch.full_like(x, 3.0), cases_of(("base", channels_last(randn(1, 2, 2, 2)))),
        ["aten::full_like.out"], kind="exact")
    add(C, "full_empty", lambda x: (torch.full((0, 3), 1.0), x + 1), cases_of(("base", z)), ["aten::full.out"], kind="exact")
    for tag, args, dt in [("int", (5,), None), ("float_end", (4.5,), None), ("f64", (3,), F64), ("i32", (7,), I32)]:
        add(C, f"arange_{tag}", lambda x, a=args, dt=dt: (A.arange.default(*a, dtype=dt), x + 1), cases_of(("base", z)), ["aten::arange.out"],
            kind="exact", edge={"preserve_ops": [A.arange.default]})
    for tag, args, dt in [("int", (2, 9, 3), None), ("neg_step", (5, -3, -2), None), ("float", (0.0, 1.0, 0.3), None),
                          ("float_neg", (1.0, -1.0, -0.25), F64), ("empty", (3, 3, 1), None), ("f16", (0, 2, 0.5), F16)]:
        add(C, f"arange_start_{tag}", lambda x, a=args, dt=dt: (torch.arange(*a, dtype=dt), x + 1), cases_of(("base", z)), ["aten::arange.start_out"],
            kind="exact")
    for dt in [F32, I32, BOOL]:
        add(C, f"fill_scalar_{SHORT[dt]}", lambda x: A.fill.Scalar(x, 3), cases_of(("base", rand_of(dt, 2, 3))), ["aten::fill.Scalar_out"],
            kind="exact", edge={"preserve_ops": [A.fill.Scalar]})
        add(C, f"fill_tensor_{SHORT[dt]}", lambda x, v: A.fill.Tensor(x, v), cases_of(("base", (rand_of(dt, 2, 3), T(2.5, F64)))),
            ["aten::fill.Tensor_out"], kind="exact", edge={"preserve_ops": [A.fill.Tensor]})
    add(C, "empty_like_values_unspecified", lambda x: (torch.empty(2, 2), x * 2), cases_of(("base", z)), ["dim_order_ops::_empty_dim_order.out"],
        kind="exact", shape_only=(0,))


@family("upsample", "nearest and bilinear upsampling (align_corners, scales, sizes, antialias), "
        "grid_sampler_2d (modes, padding modes), channels-last")
def _upsample() -> None:
    U = "upsample"
    x = randn(1, 2, 3, 4)
    for tag, kw in [("scale2", dict(scale_factor=2)), ("size", dict(size=(5, 7))), ("scale1p5", dict(scale_factor=1.5)),
                    ("down", dict(size=(2, 3)))]:
        add(U, f"nearest_{tag}", lambda x, kw=kw: F.interpolate(x, mode="nearest", **kw), cases_of(("rand", x)),
            ["aten::upsample_nearest2d.vec_out"], kind="exact")
        for ac in (False, True):
            add(U, f"bilinear_{tag}_ac{int(ac)}", lambda x, kw=kw, ac=ac: F.interpolate(x, mode="bilinear", align_corners=ac, **kw),
                cases_of(("rand", x)), ["aten::upsample_bilinear2d.vec_out"], kind="reduction")
    add(U, "nearest_channels_last", lambda x: F.interpolate(x, scale_factor=2), cases_of(("rand", channels_last(x))),
        ["aten::upsample_nearest2d.vec_out"], kind="exact")
    add(U, "bilinear_channels_last", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), cases_of(("rand", channels_last(x))),
        ["aten::upsample_bilinear2d.vec_out"], kind="reduction")
    for dt in [F64, F16, U8]:
        add(U, f"nearest_{SHORT[dt]}", lambda x: F.interpolate(x, scale_factor=2), cases_of(("rand", rand_of(dt, 1, 1, 2, 3, lo=0, hi=200))),
            ["aten::upsample_nearest2d.vec_out"], kind="exact")
    add(U, "bilinear_f16", lambda x: F.interpolate(x, size=(4, 5), mode="bilinear"), cases_of(("rand", randn(1, 1, 2, 3, dtype=F16))),
        ["aten::upsample_bilinear2d.vec_out"], kind="reduction")
    for tag, kw in [("down", dict(size=(2, 2))), ("down_ac", dict(size=(2, 3), align_corners=True)), ("up", dict(scale_factor=1.5))]:
        add(U, f"bilinear_aa_{tag}", lambda x, kw=kw: F.interpolate(x, mode="bilinear", antialias=True, **kw), cases_of(("rand", randn(1, 2, 5, 6))),
            ["aten::_upsample_bilinear2d_aa.out"], kind="reduction")
    grid = uniform(-1.2, 1.2, 1, 3, 2, 2)
    for mode in ("bilinear", "nearest", "bicubic"):
        for pad in ("zeros", "border", "reflection"):
            for ac in (False, True):
                add(U, f"grid_sample_{mode}_{pad}_ac{int(ac)}",
                    lambda x, g, m=mode, p=pad, ac=ac: F.grid_sample(x, g, mode=m, padding_mode=p, align_corners=ac),
                    cases_of(("rand", (randn(1, 2, 3, 4), grid))), ["aten::grid_sampler_2d.out"], kind="reduction")


def channels_last_3d(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last_3d)


@family("layout", "non-default dim orders (channels-last 4-d, channels-last-3d 5-d) for the ops upstream "
        "accepts them in: elementwise (unary, binary with broadcasting and mixed dim orders, activations), "
        "copies and views, reductions, convolution, pooling, normalization, upsampling")
def _layout() -> None:
    L = "layout"
    cl = lambda *s, dt=F32, **kw: channels_last(rand_of(dt, *s, **kw))  # noqa: E731
    x = lambda dt=F32: cl(2, 3, 2, 3, dt=dt)  # noqa: E731
    # Elementwise, one input.
    for name, fn, op, kind in [
        ("gelu", F.gelu, "aten::gelu.out", "transcendental"),
        ("elu", lambda x: F.elu(x, 0.7), "aten::elu.out", "transcendental"),
        ("leaky_relu", lambda x: F.leaky_relu(x, 0.2), "aten::leaky_relu.out", "elementwise"),
        ("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.5), "aten::hardtanh.out", "exact"),
        ("clamp", lambda x: torch.clamp(x, -0.3, 0.8), "aten::clamp.out", "exact"),
        ("pow_scalar", lambda x: x ** 2, "aten::pow.Tensor_Scalar_out", "elementwise"),
        ("add_scalar", lambda x: A.add.Scalar(x, 1.5), "aten::add.Scalar_out", "elementwise"),
        ("mul_scalar", lambda x: A.mul.Scalar(x, -2.0), "aten::mul.Scalar_out", "elementwise"),
        ("gt_scalar", lambda x: A.gt.Scalar(x, 0.1), "aten::gt.Scalar_out", "exact"),
        ("sigmoid", torch.sigmoid, "aten::sigmoid.out", "transcendental"),
    ]:
        add(L, f"{name}_channels_last", fn, cases_of(("rand", x())), [op], kind=kind)
    add(L, "logit_channels_last", torch.logit, cases_of(("rand", channels_last(uniform(0.05, 0.95, 2, 3, 2, 3)))), ["aten::logit.out"],
        kind="transcendental", edge={"preserve_ops": [A.logit.default]})
    add(L, "bitwise_not_channels_last", torch.bitwise_not, cases_of(("rand", x(I32))), ["aten::bitwise_not.out"], kind="exact")
    add(L, "logical_not_channels_last", torch.logical_not, cases_of(("rand", x(BOOL))), ["aten::logical_not.out"], kind="exact")
    add(L, "to_copy_i32_channels_last", lambda x: x.to(I32), cases_of(("rand", cl(2, 3, 2, 3, scale=50.0))),
        ["dim_order_ops::_to_dim_order_copy.out"], kind="exact")
    # Elementwise, two or three inputs: same dim order, mixed, broadcast against a
    # per-channel tensor (a convolution's output plus a bias), 0-d, integers.
    add(L, "add_bias_channels_last", lambda a, b: a + b, cases_of(("rand", (x(), randn(3, 1, 1)))), ["aten::add.out"])
    add(L, "mul_row_channels_last", lambda a, b: a * b, cases_of(("rand", (x(), randn(3)))), ["aten::mul.out"])
    add(L, "sub_0d_channels_last", lambda a, b: a - b, cases_of(("rand", (x(), T(0.25)))), ["aten::sub.out"])
    add(L, "add_bcast_batch_channels_last", lambda a, b: a + b, cases_of(("rand", (x(), cl(1, 3, 2, 3)))), ["aten::add.out"])
    add(L, "mul_contiguous_channels_last", lambda a, b: a * b, cases_of(("rand", (randn(2, 3, 2, 3), x()))), ["aten::mul.out"])
    add(L, "add_i32_channels_last", lambda a, b: a + b, cases_of(("rand", (x(I32), x(I32)))), ["aten::add.out"], kind="exact")
    add(L, "add_i32_f32_channels_last", lambda a, b: a + b, cases_of(("rand", (x(I32), x()))), ["aten::add.out"])
    add(L, "minimum_channels_last", torch.minimum, cases_of(("rand", (x(), x()))), ["aten::minimum.out"], kind="exact")
    add(L, "floor_divide_channels_last", torch.floor_divide, cases_of(("rand", (x(), x())),), ["aten::floor_divide.out"],
        edge={"preserve_ops": [A.floor_divide.default]})
    add(L, "rsub_channels_last", lambda a: A.rsub.Scalar(a, 1.0), cases_of(("rand", x())), ["aten::rsub.Scalar_out"],
        edge={"preserve_ops": [A.rsub.Scalar]})
    add(L, "where_channels_last", torch.where, cases_of(("rand", (x(BOOL), x(), x()))), ["aten::where.self_out"], kind="exact")
    add(L, "masked_fill_channels_last", lambda a, m: a.masked_fill(m, -1.0), cases_of(("rand", (x(), x(BOOL)))),
        ["aten::masked_fill.Scalar_out"], kind="exact", edge={"preserve_ops": [A.masked_fill.Scalar]})
    add(L, "eq_bias_channels_last", lambda a, b: a > b, cases_of(("rand", (x(), randn(3, 1, 1)))), ["aten::gt.Tensor_out"], kind="exact")
    add(L, "add_channels_last_3d", lambda a, b: a + b, cases_of(("rand", (channels_last_3d(randn(2, 3, 2, 2, 3)), channels_last_3d(randn(2, 3, 2, 2, 3))))),
        ["aten::add.out"])
    add(L, "mul_channels_last_3d_bias", lambda a, b: a * b, cases_of(("rand", (channels_last_3d(randn(1, 3, 2, 2, 3)), randn(3, 1, 1, 1)))),
        ["aten::mul.out"])
    # Copies and views.
    for name, fn, op, kw in [
        ("clone", lambda x: A.clone.default(x), "aten::clone.out", dict(edge={"_skip_dim_order": True})),
        ("alias_copy", lambda x: A.alias_copy(x), "aten::alias_copy.out", {}),
        ("detach_copy", lambda x: A.detach_copy(x), "aten::detach_copy.out", {}),
        ("slice", lambda x: x[:, :, :, 1:], "aten::slice_copy.Tensor_out", {}),
        ("slice_channels", lambda x: x[:, 1:], "aten::slice_copy.Tensor_out", {}),
        ("select", lambda x: x[:, 1], "aten::select_copy.int_out", {}),
        ("select_batch", lambda x: x[1], "aten::select_copy.int_out", {}),
        ("transpose", lambda x: A.transpose_copy.int(x, 1, 3), "aten::transpose_copy.int_out", dict(edge={"preserve_ops": [A.transpose_copy.int]})),
        ("view", lambda x: A.view_copy(x, [2, -1]), "aten::view_copy.out", {}),
        ("unsqueeze", lambda x: x.unsqueeze(2), "aten::unsqueeze_copy.out", {}),
        ("expand", lambda x: A.expand_copy(x[:1], [3, 3, 2, 3]), "aten::expand_copy.out", {}),
        ("flip", lambda x: x.flip((1, 3)), "aten::flip.out", {}),
        ("roll", lambda x: torch.roll(x, (1, 2), (1, 3)), "aten::roll.out", dict(edge={"preserve_ops": [A.roll.default]})),
        ("repeat", lambda x: x.repeat(1, 2, 1, 2), "aten::repeat.out", {}),
        ("constant_pad", lambda x: F.pad(x, (1, 0, 0, 2), value=0.5), "aten::constant_pad_nd.out", {}),
        ("reflection_pad2d", lambda x: F.pad(x, (1, 1, 1, 0), mode="reflect"), "aten::reflection_pad2d.out",
         dict(edge={"preserve_ops": [A.reflection_pad2d.default]})),
        ("replication_pad2d", lambda x: F.pad(x, (2, 0, 1, 1), mode="replicate"), "aten::replication_pad2d.out",
         dict(edge={"preserve_ops": [A.replication_pad2d.default]})),
        ("split", lambda x: torch.split(x, [1, 2], 1), "aten::split_with_sizes_copy.out", {}),
        ("unbind", lambda x: A.unbind_copy.int(x, 1), "aten::unbind_copy.int_out", dict(edge={"preserve_ops": [A.unbind_copy.int]})),
        ("tril", lambda x: x.tril(), "aten::tril.out", dict(edge={"preserve_ops": [A.tril.default]})),
        ("narrow", lambda x: A.narrow_copy(x, 1, 1, 2), "aten::narrow_copy.out", {}),
        ("index_select", lambda x: torch.index_select(x, 1, T([2, 0], I64)), "aten::index_select.out", {}),
        ("cumsum", lambda x: torch.cumsum(x, 1), "aten::cumsum.out", {}),
        ("to_contiguous", lambda x: x.contiguous(), "dim_order_ops::_clone_dim_order.out", {}),
    ]:
        add(L, f"{name}_channels_last", fn, cases_of(("rand", x())), [op], kind="exact" if op != "aten::cumsum.out" else "reduction", **kw)
    add(L, "pixel_shuffle_channels_last", lambda x: F.pixel_shuffle(x, 2), cases_of(("rand", cl(1, 8, 2, 3))), ["aten::pixel_shuffle.out"],
        kind="exact", edge={"preserve_ops": [A.pixel_shuffle.default]})
    add(L, "cat_mixed_channels_last", lambda a, b: torch.cat([a, b], 1), cases_of(("rand", (x(), randn(2, 1, 2, 3)))), ["aten::cat.out"], kind="exact")
    add(L, "select_scatter_channels_last", lambda a, b: torch.select_scatter(a, b, 1, 0), cases_of(("rand", (x(), randn(2, 2, 3)))),
        ["aten::select_scatter.out"], kind="exact", edge={"preserve_ops": [A.select_scatter.default]})
    add(L, "slice_scatter_channels_last", lambda a, b: torch.slice_scatter(a, b, 3, 1, 3), cases_of(("rand", (x(), cl(2, 3, 2, 2)))),
        ["aten::slice_scatter.out"], kind="exact")
    # Reductions.
    for name, fn, op, kind in [
        ("sum_hw", lambda x: x.sum((2, 3)), "aten::sum.IntList_out", "reduction"),
        ("mean_c", lambda x: x.mean(1), "aten::mean.out", "reduction"),
        ("var", lambda x: x.var(1, keepdim=True), "aten::var.correction_out", "reduction"),
        ("amin", lambda x: x.amin(3), "aten::amin.out", "exact"),
        ("argmax", lambda x: x.argmax(1), "aten::argmax.out", "exact"),
        ("max_dim", lambda x: x.max(2), "aten::max.dim_max", "exact"),
        ("softmax_last", lambda x: F.softmax(x, -1), "aten::_softmax.out", "transcendental"),
    ]:
        add(L, f"{name}_channels_last", fn, cases_of(("rand", x())), [op], kind=kind)
    add(L, "any_channels_last", lambda x: x.any(1), cases_of(("rand", x(BOOL))), ["aten::any.out"], kind="exact")
    # Convolution: weights in channels-last too (a model converted with
    # .to(memory_format=torch.channels_last)), float64, transposed with groups.
    add(L, "conv2d_weight_channels_last", lambda x, w, b: F.conv2d(x, w, b, padding=1),
        cases_of(("rand", (cl(2, 3, 4, 5), cl(4, 3, 3, 3), randn(4)))), ["aten::convolution.out"], kind="reduction")
    add(L, "conv2d_f64_channels_last", lambda x, w: F.conv2d(x, w, stride=2),
        cases_of(("rand", (cl(1, 2, 5, 5, dt=F64), randn(3, 2, 3, 3, dtype=F64)))), ["aten::convolution.out"], kind="reduction")
    add(L, "conv_transpose2d_groups_channels_last", lambda x, w: F.conv_transpose2d(x, w, stride=2, groups=2, padding=1, output_padding=1),
        cases_of(("rand", (cl(1, 4, 3, 3), randn(4, 1, 3, 3)))), ["aten::convolution.out"], kind="reduction")
    # Pooling.
    add(L, "max_pool2d_s2_p1_channels_last", lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), cases_of(("rand", cl(2, 3, 5, 4))),
        ["aten::max_pool2d_with_indices.out"], kind="exact")
    add(L, "max_pool2d_i32_channels_last", lambda x: F.max_pool2d(x, 2, return_indices=True), cases_of(("rand", cl(1, 3, 4, 4, dt=I32, lo=-50, hi=50))),
        ["aten::max_pool2d_with_indices.out"], kind="exact")
    add(L, "avg_pool2d_ceil_pad_channels_last", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        cases_of(("rand", cl(2, 3, 5, 6))), ["aten::avg_pool2d.out"], kind="reduction")
    add(L, "adaptive_avg_pool2d_odd_channels_last", lambda x: F.adaptive_avg_pool2d(x, (2, 3)), cases_of(("rand", cl(2, 3, 5, 7))),
        ["aten::_adaptive_avg_pool2d.out"], kind="reduction")
    xp = randn(1, 2, 4, 4)
    _, idx = F.max_pool2d(xp, 2, return_indices=True)

    def mpb(g, x):
        _, i = A.max_pool2d_with_indices(x, [2, 2], [2, 2], [0, 0])
        return A.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, i)

    add(L, "max_pool2d_backward_channels_last", mpb, cases_of(("rand", (channels_last(randn(*idx.shape)), channels_last(xp)))),
        ["aten::max_pool2d_with_indices_backward.grad_input"], kind="reduction",
        note="upstream: max_pool2d_with_indices_backward accumulates into its output without clearing it first")
    # Normalization.
    add(L, "layer_norm_channels_last", lambda x, w, b: F.layer_norm(x, (2, 3), w, b), cases_of(("rand", (x(), randn(2, 3), randn(2, 3)))),
        ["aten::native_layer_norm.out"], kind="reduction")
    add(L, "group_norm_affine_channels_last", lambda x, w, b: F.group_norm(x, 3, w, b), cases_of(("rand", (cl(2, 6, 2, 3), randn(6), randn(6)))),
        ["aten::native_group_norm.out"], kind="reduction")
    add(L, "batch_norm_eval_affine_channels_last", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b),
        cases_of(("rand", (x(), randn(3), uniform(0.5, 2, 3), randn(3), randn(3)))),
        ["aten::_native_batch_norm_legit_no_training.out"], kind="reduction")
    add(L, "batch_norm_train_channels_last", lambda x: F.batch_norm(x, None, None, training=True), cases_of(("rand", x())),
        ["aten::_native_batch_norm_legit.no_stats_out"], kind="reduction")
    # Upsampling and sampling.
    add(L, "bilinear_ac_channels_last", lambda x: F.interpolate(x, size=(4, 5), mode="bilinear", align_corners=True), cases_of(("rand", x())),
        ["aten::upsample_bilinear2d.vec_out"], kind="reduction")
    add(L, "bilinear_aa_channels_last", lambda x: F.interpolate(x, size=(2, 2), mode="bilinear", antialias=True), cases_of(("rand", cl(2, 3, 5, 6))),
        ["aten::_upsample_bilinear2d_aa.out"], kind="reduction")
    add(L, "nearest_size_channels_last", lambda x: F.interpolate(x, size=(3, 5)), cases_of(("rand", x())),
        ["aten::upsample_nearest2d.vec_out"], kind="exact")
    add(L, "grid_sample_channels_last", lambda x, g: F.grid_sample(x, g, align_corners=False), cases_of(("rand", (x(), uniform(-1.1, 1.1, 2, 2, 3, 2)))),
        ["aten::grid_sampler_2d.out"], kind="reduction")
    # Dynamic sizes: outputs resized each call keep their dim order.
    d = Dim("n", min=2, max=8)
    add(L, "dynamic_conv_channels_last", lambda x, w: F.conv2d(x, w, padding=1),
        [("n2", (cl(2, 2, 4, 5), randn(3, 2, 3, 3))), ("n3", (cl(3, 2, 4, 5), randn(3, 2, 3, 3)))],
        ["aten::convolution.out"], kind="reduction", dynamic=({0: d}, None))
    add(L, "dynamic_pool_bias_channels_last", lambda x, b: F.max_pool2d(x + b, 2),
        [("h4", (cl(1, 3, 4, 4), randn(3, 1, 1))), ("h6", (cl(1, 3, 6, 4), randn(3, 1, 1)))],
        ["aten::add.out", "aten::max_pool2d_with_indices.out"], kind="exact", dynamic=({2: Dim("h2", min=1, max=8) * 2}, None))


@family("complex", "complex tensors: FFT (rfft/irfft, norms, sizes), conj_physical, view_as_real, "
        "arithmetic (add, sub, mul, div, abs), sum, bmm, cat, conversions")
def _complex() -> None:
    X = "complex"
    for tag, kw in [("basic", {}), ("ortho", dict(norm="ortho")), ("n", dict(n=6)), ("dim0", dict(dim=0))]:
        add(X, f"rfft_{tag}", lambda x, kw=kw: torch.fft.rfft(x, **kw), cases_of(("rand", randn(4, 8))), ["aten::_fft_r2c.out"], kind="reduction")
        add(X, f"irfft_{tag}", lambda x, kw=kw: torch.fft.irfft(x, **kw), cases_of(("rand", randn(4, 5, dtype=torch.complex64))),
            ["aten::_fft_c2r.out"], kind="reduction")
    add(X, "rfft2", lambda x: torch.fft.rfft2(x), cases_of(("rand", randn(4, 6))), ["aten::_fft_r2c.out"], kind="reduction")
    # Complex arithmetic where upstream supports it: add/sub (alpha), mul, div, abs, sum,
    # bmm, cat, to_copy between complex and real types.
    c64, c128 = torch.complex64, torch.complex128
    # The edge dialect's verifier has no complex dtypes for these operators.
    nocheck = {"_check_ir_validity": False}
    for dt in [c64, c128]:
        s = SHORT[dt]
        pair = (randn(2, 3, dtype=dt), randn(2, 3, dtype=dt))
        for name, fn, op in [("add", lambda a, b: a + b, "aten::add.out"), ("add_alpha", lambda a, b: torch.add(a, b, alpha=2), "aten::add.out"),
                             ("sub", lambda a, b: a - b, "aten::sub.out"), ("mul", lambda a, b: a * b, "aten::mul.out"),
                             ("div", lambda a, b: a / b, "aten::div.out")]:
            add(X, f"{name}_{s}", fn, cases_of(("rand", pair)), [op], kind="elementwise", edge=nocheck)
        add(X, f"mul_bcast_{s}", lambda a, b: a * b, cases_of(("rand", (randn(2, 1, 3, dtype=dt), randn(4, 1, dtype=dt)))), ["aten::mul.out"],
            kind="elementwise", edge=nocheck)
        add(X, f"abs_{s}", torch.abs, cases_of(("rand", randn(2, 3, dtype=dt))), ["aten::abs.out"], kind="elementwise", edge=nocheck)
        add(X, f"sum_{s}", lambda x: x.sum(1), cases_of(("rand", randn(3, 4, dtype=dt))), ["aten::sum.IntList_out"], kind="reduction", edge=nocheck)
        add(X, f"sum_all_{s}", lambda x: x.sum(), cases_of(("rand", randn(3, 4, dtype=dt))), ["aten::sum.IntList_out"], kind="reduction", edge=nocheck)
        add(X, f"bmm_{s}", torch.bmm, cases_of(("rand", (randn(2, 3, 4, dtype=dt), randn(2, 4, 2, dtype=dt)))), ["aten::bmm.out"],
            kind="reduction", edge=nocheck)
        add(X, f"cat_{s}", lambda a, b: torch.cat([a, b], 1), cases_of(("rand", (randn(2, 3, dtype=dt), randn(2, 1, dtype=dt)))),
            ["aten::cat.out"], kind="exact", edge=nocheck)
    add(X, "to_copy_c64_c128", lambda x: x.to(c128), cases_of(("rand", randn(2, 3, dtype=c64))), ["dim_order_ops::_to_dim_order_copy.out"],
        kind="exact", edge=nocheck)
    add(X, "to_copy_f32_c64", lambda x: x.to(c64), cases_of(("rand", randn(2, 3))), ["dim_order_ops::_to_dim_order_copy.out"], kind="exact", edge=nocheck)
    add(X, "add_c64_f32", lambda a, b: a + b, cases_of(("rand", (randn(2, 3, dtype=c64), randn(2, 3)))), ["aten::add.out"], kind="elementwise", edge=nocheck)
    add(X, "mul_scalar_c64", lambda a: a * 2.5, cases_of(("rand", (randn(2, 3, dtype=c64),))), ["aten::mul.out"], kind="elementwise", edge=nocheck)
    for dt in [torch.complex64, torch.complex128]:
        add(X, f"conj_physical_{SHORT[dt]}", lambda x: A._conj_physical(x), cases_of(("rand", randn(2, 3, dtype=dt))), ["aten::_conj_physical.out"],
            kind="exact", edge={"preserve_ops": [A._conj_physical.default]})
        add(X, f"view_as_real_{SHORT[dt]}", lambda x: torch.view_as_real(x), cases_of(("rand", randn(2, 3, dtype=dt))),
            ["aten::view_as_real_copy.out"], kind="exact", edge={"_check_ir_validity": False})
    # Views and copies move complex elements whole (16 bytes for complex128).
    for dt in [c64, c128]:
        s = SHORT[dt]
        for name, fn, op in [("permute", lambda x: x.permute(2, 0, 1), "aten::permute_copy.out"),
                             ("view", lambda x: A.view_copy(x, [4, -1]), "aten::view_copy.out"),
                             ("select", lambda x: x[:, 1], "aten::select_copy.int_out"),
                             ("slice", lambda x: x[..., ::2], "aten::slice_copy.Tensor_out"),
                             ("expand", lambda x: A.expand_copy(x[:1], [3, 3, 4]), "aten::expand_copy.out"),
                             ("unsqueeze", lambda x: x.unsqueeze(1), "aten::unsqueeze_copy.out"),
                             ("clone", lambda x: x.clone(), "dim_order_ops::_clone_dim_order.out")]:
            add(X, f"{name}_{s}", fn, cases_of(("rand", randn(2, 3, 4, dtype=dt))), [op], kind="exact", edge=nocheck)
    add(X, "transpose_c64", lambda x: A.transpose_copy.int(x, 0, 1), cases_of(("rand", randn(2, 3, dtype=c64))), ["aten::transpose_copy.int_out"],
        kind="exact", edge={"_check_ir_validity": False, "preserve_ops": [A.transpose_copy.int]})
    add(X, "sub_alpha_c128_channels_last", lambda a, b: torch.sub(a, b, alpha=3),
        cases_of(("rand", (channels_last(randn(1, 2, 2, 3, dtype=c128)), channels_last(randn(1, 2, 2, 3, dtype=c128))))), ["aten::sub.out"],
        kind="elementwise", edge=nocheck)
    add(X, "mean_c64", lambda x: x.mean(0), cases_of(("rand", randn(3, 4, dtype=c64))), ["aten::mean.out"], kind="reduction", edge=nocheck)
    add(X, "mm_c64", torch.mm, cases_of(("rand", (randn(2, 3, dtype=c64), randn(3, 2, dtype=c64)))), ["aten::mm.out"], kind="reduction", edge=nocheck)
    add(X, "abs_empty_c64", torch.abs, cases_of(("rand", randn(0, 3, dtype=c64))), ["aten::abs.out"], kind="elementwise", edge=nocheck)


def _rename_op(old: str, new_name: str, new_overload: str):
    """A program rewrite renaming one operator (for overloads with the same arguments)."""

    def rewrite(program) -> None:
        for op in program.execution_plan[0].operators:
            if op.name + ("." + op.overload if op.overload else "") == old:
                op.name, op.overload = new_name, new_overload

    return rewrite


def _prim_item(fn, dt_out):
    return lambda *xs: torch.scalar_tensor(fn(*[x.item() for x in xs]), dtype=dt_out)


@family("prim", "symbolic scalars (executorch_prim::*) on values read with item() "
        "(_local_scalar_dense) and on dynamic sizes: Python semantics on exact values "
        "(true and floor division, modulo signs, rounding half to even), sym_size/sym_numel, "
        "et_view, et_copy_index (torch map)")
def _prim() -> None:
    P = "prim"
    ints = [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 5), (2**40, 3), (-1, 3), (9, 9)]
    flts = [(7.5, 2.0), (-7.5, 2.0), (0.5, -2.0), (-0.0, 3.0), (1e300, 1e-10), (2.5, 0.5)]
    I = lambda v: torch.tensor(v)  # noqa: E731
    icases = [(f"{a}_{b}".replace("-", "m"), (I(a), I(b))) for a, b in ints]
    fcases = [(f"{a}_{b}".replace("-", "m").replace(".", "p").replace("+", ""), (I(a), I(b))) for a, b in flts]
    nocheck = {"_check_ir_validity": False}
    for name, fn, op in [("add", lambda a, b: a + b, "add"), ("sub", lambda a, b: a - b, "sub"), ("mul", lambda a, b: a * b, "mul"),
                         ("floordiv", lambda a, b: a // b, "floordiv"), ("mod", lambda a, b: a % b, "mod"),
                         ("truediv", lambda a, b: a / b, "truediv")]:
        out = F64 if name == "truediv" else I64
        add(P, f"{name}_int", _prim_item(fn, out), icases if name not in ("floordiv", "mod") else [c for c in icases if c[1][1] != 0],
            [f"executorch_prim::{op}.Scalar", "aten::_local_scalar_dense"], kind="exact",
            note={"mod": "upstream: executorch_prim::mod.Scalar truncates (C remainder); Python takes the divisor's sign"}.get(name))
        if name in ("add", "sub", "mul", "truediv", "floordiv", "mod"):
            add(P, f"{name}_float", _prim_item(fn, F64), fcases, [f"executorch_prim::{op}.Scalar", "aten::_local_scalar_dense"],
                kind="exact", edge=nocheck)
    for name, fn, op in [("eq", lambda a, b: a == b, "eq"), ("lt", lambda a, b: a < b, "lt"), ("le", lambda a, b: a <= b, "le"),
                         ("gt", lambda a, b: a > b, "gt"), ("ge", lambda a, b: a >= b, "ge")]:
        add(P, f"{name}_int", _prim_item(fn, BOOL), icases[:5], [f"executorch_prim::{op}.Scalar"], kind="exact")
        add(P, f"{name}_float", _prim_item(fn, BOOL), fcases[:4], [f"executorch_prim::{op}.Scalar"], kind="exact")
    one_f = [(f"{v}".replace("-", "m").replace(".", "p"), (I(v),)) for v in [2.5, 3.5, -2.5, -0.5, 0.5, 7.0, -7.9, 1e15 + 0.5]]
    one_i = [(f"{v}".replace("-", "m"), (I(v),)) for v in [3, -3, 0, 2**50]]
    add(P, "neg_int", _prim_item(lambda a: -a, I64), one_i, ["executorch_prim::neg.Scalar"], kind="exact")
    add(P, "neg_float", _prim_item(lambda a: -a, F64), one_f, ["executorch_prim::neg.Scalar"], kind="exact", signed_zeros=True)
    add(P, "ceil", _prim_item(math.ceil, I64), one_f, ["executorch_prim::ceil.Scalar"], kind="exact")
    add(P, "round", _prim_item(round, I64), one_f, ["executorch_prim::round.Scalar"], kind="exact",
        note="upstream: executorch_prim::round rounds halves away from zero; Python rounds half to even")
    add(P, "trunc", _prim_item(math.trunc, I64), one_f, ["executorch_prim::trunc.Scalar"], kind="exact")
    add(P, "sym_int", _prim_item(torch.sym_int, I64), one_f, ["executorch_prim::trunc.Scalar"], kind="exact")
    add(P, "sym_float", _prim_item(lambda a: torch.sym_float(a) / 3, F64), one_i, ["executorch_prim::sym_float.Scalar"], kind="exact", edge=nocheck)
    add(P, "sym_max", _prim_item(torch.sym_max, I64), icases[:5], ["executorch_prim::sym_max.Scalar"], kind="exact", edge=nocheck)
    add(P, "sym_min", _prim_item(torch.sym_min, I64), icases[:5], ["executorch_prim::sym_min.Scalar"], kind="exact", edge=nocheck)
    add(P, "sym_max_float", _prim_item(torch.sym_max, F64), fcases[:4], ["executorch_prim::sym_max.Scalar"], kind="exact", edge=nocheck)
    add(P, "sym_not", _prim_item(lambda a, b: torch.sym_not(a > b), BOOL), icases[:4], ["executorch_prim::sym_not.Scalar"], kind="exact", edge=nocheck)
    add(P, "sym_ite", _prim_item(lambda a, b: torch.sym_ite(a > b, a * 2, b), I64), icases[:5], ["executorch_prim::sym_ite.Scalar"],
        kind="exact", edge=nocheck)
    add(P, "local_scalar_dense_f32", _prim_item(lambda a: a * 2.0, F32), [("a", (T(1.5),)), ("b", (T(-3e38),))],
        ["aten::_local_scalar_dense", "executorch_prim::mul.Scalar"], kind="exact")
    add(P, "local_scalar_dense_bool", _prim_item(lambda a: a, BOOL), [("t", (T(True, BOOL),)), ("f", (T(False, BOOL),))],
        ["aten::_local_scalar_dense"], kind="exact")
    add(P, "local_scalar_dense_u8_to_f32", _prim_item(lambda a: a + 1, F32), [("a", (T(255, U8),))],
        ["aten::_local_scalar_dense"], kind="exact")

    # executorch_prim::floordiv.int and mod.int: no exporter path emits the .int overloads;
    # the programs are the .Scalar programs with the overload renamed (same arguments).
    def overload_to_int(program) -> None:
        for op in program.execution_plan[0].operators:
            if op.name in ("executorch_prim::floordiv", "executorch_prim::mod") and op.overload == "Scalar":
                op.overload = "int"

    for name, fn in [("floordiv", lambda a, b: a // b), ("mod", lambda a, b: a % b)]:
        add(P, f"{name}_int_overload", _prim_item(fn, I64), [c for c in icases if c[1][1] != 0], [f"executorch_prim::{name}.int"], kind="exact",
            rewrite=overload_to_int, export_path=f"rewritten: executorch_prim::{name}.Scalar renamed {name}.int (no exporter path emits it)",
            note={"mod": "upstream: executorch_prim::mod truncates (C remainder); Python takes the divisor's sign"}.get(name))
        UNREACHABLE[f"executorch_prim::{name}.int"] = f"no exporter path emits it; tested by renaming {name}.Scalar"

    # Three names no exporter path emits from eager code: torch.sym_int of a symbolic float
    # traces to math.trunc (trunc.Scalar), x.numel() and aten.sym_numel trace to products
    # of sym_size.int, and var(unbiased=...) is canonicalized to var.correction.  The
    # programs below are the nearest exported programs with the call rewritten to the
    # missing overload (same arguments, or the argument converted).
    add(P, "sym_int_overload", _prim_item(math.trunc, I64), one_f, ["executorch_prim::sym_int.Scalar"], kind="exact",
        rewrite=_rename_op("executorch_prim::trunc.Scalar", "executorch_prim::sym_int", "Scalar"),
        export_path="rewritten: executorch_prim::trunc.Scalar renamed sym_int.Scalar (torch.sym_int traces to trunc)")
    UNREACHABLE["executorch_prim::sym_int.Scalar"] = "torch.sym_int and int() of a symbolic float trace to trunc.Scalar; tested by renaming it"

    def size_to_numel(program) -> None:
        plan = program.execution_plan[0]
        for i, op in enumerate(plan.operators):
            if op.name == "aten::sym_size" and op.overload == "int":
                op.name, op.overload = "aten::sym_numel", ""
                for ins in plan.chains[0].instructions:
                    a = ins.instr_args
                    if getattr(a, "op_index", None) == i:
                        a.args = [a.args[0], a.args[-1]]

    # x is [n, 1], so numel(x) equals size(x, 0) and the planned bound still holds.
    add(P, "sym_numel", lambda x: x.new_zeros(x.shape[0] * 3) + 1, [("n2", (randn(2, 1),)), ("n5", (randn(5, 1),))], ["aten::sym_numel"],
        kind="exact", dynamic=({0: Dim("d", min=2, max=12)},), rewrite=size_to_numel, eager=lambda x: x.new_zeros(x.numel() * 3) + 1,
        export_path="rewritten: sym_size.int(x, 0) replaced by sym_numel(x) (x.numel() traces to sym_size products)")
    UNREACHABLE["aten::sym_numel"] = "x.numel() and aten.sym_numel trace to sym_size.int products; tested by rewriting sym_size.int"

    d = Dim("d", min=2, max=12)
    add(P, "sym_size", lambda x: x.new_zeros(x.shape[0] * 2) + 1, [("n3", (randn(3),)), ("n7", (randn(7),))],
        ["aten::sym_size.int", "executorch_prim::mul.Scalar"], kind="exact", dynamic=({0: d},))
    add(P, "sym_size_truediv", lambda x: torch.full((2,), x.shape[0] / 4), [("n3", (randn(3),)), ("n10", (randn(10),))],
        ["executorch_prim::truediv.Scalar", "aten::sym_size.int"], kind="exact", dynamic=({0: d},))
    add(P, "sym_size_floordiv", lambda x: torch.zeros(x.shape[0] // 2 + 1), [("n3", (randn(3),)), ("n10", (randn(10),))],
        ["executorch_prim::floordiv.Scalar", "aten::sym_size.int"], kind="exact", dynamic=({0: d},))
    add(P, "et_view", lambda x: x.view(-1, 2) + 1, [("n3", (randn(3, 4),)), ("n5", (randn(5, 4),))], ["executorch_prim::et_view.default"],
        dynamic=({0: d},))
    add(P, "et_view_reshape", lambda x: x.reshape(2, -1) * 2, [("n4", (randn(4, 3),)), ("n6", (randn(6, 3),))], ["executorch_prim::et_view.default"],
        dynamic=({0: d},))
    from functorch.experimental import control_flow

    class MapM(nn.Module):
        def forward(self, xs, y):
            return control_flow.map(lambda x, y: x * y + 1, xs, y)

    add(P, "map_et_copy_index", MapM(), [("a", (randn(3, 2), randn(2))), ("b", (randn(3, 2), T([0.0, -1.0])))],
        ["executorch_prim::et_copy_index.tensor", "executorch_prim::eq.Scalar", "executorch_prim::add.Scalar", "executorch_prim::sub.Scalar"])
    add(P, "map_et_copy_index_int", MapM(), [("a", (rand_of(I32, 4, 3), rand_of(I32, 3)))], ["executorch_prim::et_copy_index.tensor"], kind="exact")

    class Cond(nn.Module):
        def forward(self, p, x):
            return torch.cond(p, lambda x: x + 1, lambda x: x * 2, (x,))

    add(P, "cond", Cond(), [("true", (T(True, BOOL), randn(3))), ("false", (T(False, BOOL), randn(3)))], ["aten::add.out", "aten::mul.out"])
    # Dynamic shapes through ordinary kernels.
    for name, fn, ops in [("add", lambda a, b: a + b, ["aten::add.out"]), ("cat", lambda a, b: torch.cat([a, b]), ["aten::cat.out"]),
                          ("sum", lambda a, b: (a * b).sum(0), ["aten::sum.IntList_out"]), ("mm", lambda a, b: a @ b.t(), ["aten::mm.out"])]:
        add(P, f"dynamic_{name}", fn, [("n2", (randn(2, 3), randn(2, 3))), ("n5", (randn(5, 3), randn(5, 3)))], ops,
            kind="reduction" if name in ("sum", "mm") else "elementwise", dynamic=({0: d}, {0: d}))
    add(P, "dynamic_softmax", lambda a: a.softmax(-1), [("n2", (randn(3, 2),)), ("n9", (randn(3, 9),))], ["aten::_softmax.out"],
        kind="transcendental", dynamic=({1: d},))
    add(P, "dynamic_conv", lambda x, w: F.conv2d(x, w), [("n1", (randn(2, 2, 4, 4), randn(3, 2, 3, 3))), ("n4", (randn(4, 2, 4, 4), randn(3, 2, 3, 3)))],
        ["aten::convolution.out"], kind="reduction", dynamic=({0: d}, None))


def _register_quant_fakes() -> None:
    """Shape functions for the quantized ops that have only a schema (upstream binds them to
    patterns), so that they can be exported directly."""
    lib = "quantized_decomposed::"

    @torch.library.register_fake(lib + "mixed_mm")
    def _(x, w, s, z):
        return x.new_empty(x.shape[0], w.shape[1])

    @torch.library.register_fake(lib + "mixed_linear")
    def _(x, w, s, z, dtype=None):
        return x.new_empty(*x.shape[:-1], w.shape[0], dtype=dtype or x.dtype)

    @torch.library.register_fake(lib + "add")
    def _(a, *rest):
        return torch.empty_like(a)


def _mixed_mm_eager(x, w, s, z):
    # Reference: the int8 weight [k, n] dequantized per row k, then x @ w.
    wf = w.to(x.dtype) * s.to(x.dtype)[:, None]
    if z is not None:
        wf = (w.to(x.dtype) - z.to(x.dtype)[:, None]) * s.to(x.dtype)[:, None]
    return x @ wf


def _mixed_linear_eager(x, w, s, z, dtype=None):
    # Reference: weight [n, k] dequantized per output row (or per group of columns), x @ w.T.
    sc = s if s.dim() == 2 else s[:, None]
    group = w.shape[1] // sc.shape[1]
    sc = sc.repeat_interleave(group, dim=1).to(torch.float32)
    wf = w.to(torch.float32) * sc
    if z is not None:
        zz = (z if z.dim() == 2 else z[:, None]).repeat_interleave(group, dim=1).to(torch.float32)
        wf = (w.to(torch.float32) - zz) * sc
    return (x.to(torch.float32) @ wf.t()).to(dtype or x.dtype)


def _qadd_eager(a, sa, za, qa0, qa1, b, sb, zb, qb0, qb1, so, zo, qo0, qo1):
    x = Q.dequantize_per_tensor(a, sa, za, qa0, qa1, torch.uint8)
    y = Q.dequantize_per_tensor(b, sb, zb, qb0, qb1, torch.uint8)
    return Q.quantize_per_tensor(x + y, so, zo, qo0, qo1, torch.uint8)


@family("quant", "quantized_decomposed kernels against the reference formulas of upstream's "
        "Python definitions: rounding half to even, clamping, per-tensor/channel/token, "
        "choose_qparams, 2/4/8-bit embeddings, mixed-precision matmul, quantized add")
def _quant() -> None:
    _register_quant_fakes()
    Z = "quant"
    halves = T([[-1.25, -0.75, -0.25, 0.25], [0.75, 1.25, 100.0, -100.0], [0.05, 0.15, 0.0, -0.0]], F32)
    for dt, qmin, qmax in [(I8, -128, 127), (U8, 0, 255), (I16, -32768, 32767)]:
        add(Z, f"quantize_per_tensor_{SHORT[dt]}", lambda x, dt=dt, a=qmin, b=qmax: Q.quantize_per_tensor(x, 0.5, 3, a, b, dt),
            cases_of(("halves", halves), ("rand", randn(3, 4, scale=40.0))), ["quantized_decomposed::quantize_per_tensor.out"], kind="exact")
        add(Z, f"quantize_per_tensor_tensor_{SHORT[dt]}", lambda x, s, z, dt=dt, a=qmin, b=qmax: Q.quantize_per_tensor.tensor(x, s, z, a, b, dt),
            cases_of(("halves", (halves, T([0.5], F64), T([-2], I64)))), ["quantized_decomposed::quantize_per_tensor.Tensor_out"], kind="exact")
        add(Z, f"dequantize_per_tensor_{SHORT[dt]}", lambda q, dt=dt, a=qmin, b=qmax: Q.dequantize_per_tensor(q, 0.25, -3, a, b, dt),
            cases_of(("edge", rand_of(dt, 3, 4, lo=qmin, hi=qmax + 1))), ["quantized_decomposed::dequantize_per_tensor.out"], kind="quant")
        add(Z, f"dequantize_per_tensor_tensor_{SHORT[dt]}", lambda q, s, z, dt=dt, a=qmin, b=qmax: Q.dequantize_per_tensor.tensor(q, s, z, a, b, dt),
            cases_of(("edge", (rand_of(dt, 3, 4, lo=qmin, hi=qmax + 1), T([0.125], F64), T([5], I64)))),
            ["quantized_decomposed::dequantize_per_tensor.Tensor_out"], kind="quant")
    add(Z, "quantize_per_tensor_clamp_range", lambda x: Q.quantize_per_tensor(x, 0.1, 0, -10, 10, I8), cases_of(("halves", halves)),
        ["quantized_decomposed::quantize_per_tensor.out"], kind="exact")
    add(Z, "quantize_per_tensor_f16_input", lambda x: Q.quantize_per_tensor(x, 0.5, 1, -128, 127, I8), cases_of(("halves", halves.to(F16))),
        ["quantized_decomposed::quantize_per_tensor.out"], kind="exact")
    add(Z, "dequantize_per_tensor_out_f16", lambda q: Q.dequantize_per_tensor(q, 0.5, 1, -128, 127, I8, out_dtype=F16),
        cases_of(("edge", rand_of(I8, 3, 4, lo=-128, hi=128))), ["quantized_decomposed::dequantize_per_tensor.out"], kind="quant")
    for axis in (0, 1, -1):
        add(Z, f"quantize_per_channel_axis{axis}".replace("-", "m"),
            lambda x, s, z, ax=axis: Q.quantize_per_channel(x, s, z, ax, -128, 127, I8),
            cases_of(("rand", (randn(3, 4, scale=10.0), uniform(0.05, 0.5, 3 if axis == 0 else 4, dtype=F64),
                                randint(-3, 4, 3 if axis == 0 else 4, dtype=I64)))),
            ["quantized_decomposed::quantize_per_channel.out"], kind="exact")
        add(Z, f"dequantize_per_channel_axis{axis}".replace("-", "m"),
            lambda q, s, z, ax=axis: Q.dequantize_per_channel(q, s, z, ax, -128, 127, I8),
            cases_of(("rand", (rand_of(I8, 3, 4, lo=-128, hi=128), uniform(0.05, 0.5, 3 if axis == 0 else 4, dtype=F64),
                                randint(-3, 4, 3 if axis == 0 else 4, dtype=I64)))),
            ["quantized_decomposed::dequantize_per_channel.out"], kind="quant")
    add(Z, "dequantize_per_channel_no_zero_point", lambda q, s: Q.dequantize_per_channel(q, s, None, 0, -128, 127, I8),
        cases_of(("rand", (rand_of(I8, 3, 4, lo=-128, hi=128), uniform(0.05, 0.5, 3, dtype=F64)))),
        ["quantized_decomposed::dequantize_per_channel.out"], kind="quant")
    add(Z, "quantize_per_channel_3d", lambda x, s, z: Q.quantize_per_channel(x, s, z, 1, 0, 255, U8),
        cases_of(("rand", (randn(2, 3, 4, scale=5.0), uniform(0.05, 0.5, 3, dtype=F64), randint(100, 140, 3, dtype=I64)))),
        ["quantized_decomposed::quantize_per_channel.out"], kind="exact")
    for dt, qmin, qmax in [(I8, -128, 127), (U8, 0, 255)]:
        add(Z, f"choose_qparams_{SHORT[dt]}", lambda x, dt=dt, a=qmin, b=qmax: Q.choose_qparams.tensor(x, a, b, 1e-7, dt),
            cases_of(("rand", randn(3, 4, scale=3.0)), ("positive", uniform(0.5, 2.0, 3, 4)), ("zeros", torch.zeros(3, 4))),
            ["quantized_decomposed::choose_qparams.Tensor_out"], kind="quant",
            note="upstream: choose_qparams of an all-zero input gives scale 0.1 instead of eps")
    # One program per input rank (programs are exported with static shapes).
    add(Z, "choose_qparams_per_token_asymmetric", lambda x: Q.choose_qparams_per_token_asymmetric(x, I8),
        cases_of(("rand", randn(2, 3, 8, scale=3.0))),
        ["quantized_decomposed::choose_qparams_per_token_asymmetric.out"], kind="quant")
    add(Z, "choose_qparams_per_token_asymmetric_2d", lambda x: Q.choose_qparams_per_token_asymmetric(x, I8),
        cases_of(("const_row", T([[1.0] * 4, [-2.0, 0.0, 2.0, 4.0]], F32))),
        ["quantized_decomposed::choose_qparams_per_token_asymmetric.out"], kind="quant")
    add(Z, "quantize_per_token", lambda x, s, z: Q.quantize_per_token(x, s, z, -128, 127, I8),
        cases_of(("rand", (randn(2, 3, 4, scale=5.0), uniform(0.01, 0.1, 2, 3, 1, dtype=F32), randint(-5, 5, 2, 3, 1, dtype=I64)))),
        ["quantized_decomposed::quantize_per_token.out"], kind="exact")
    add(Z, "dequantize_per_token", lambda q, s, z: Q.dequantize_per_token(q, s, z, -128, 127, I8, F32),
        cases_of(("rand", (rand_of(I8, 2, 3, 4, lo=-128, hi=128), uniform(0.01, 0.1, 2, 3, 1, dtype=F32), randint(-5, 5, 2, 3, 1, dtype=I64)))),
        ["quantized_decomposed::dequantize_per_token.out"], kind="quant")
    idx = T([[0, 4], [2, 2]], I64)
    for bits, (qmin, qmax), packed in [(8, (-128, 127), 8), (4, (-8, 7), 4), (2, (-2, 1), 2)]:
        op = {8: Q.embedding_byte, 4: Q.embedding_4bit, 2: Q.embedding_2bit}[bits]
        name = {8: "embedding_byte", 4: "embedding_4bit", 2: "embedding_2bit"}[bits]
        cols = 8 * packed // 8
        w = randint(0, 256, 5, cols, dtype=U8) if bits != 8 else randint(-128, 128, 5, 8, dtype=I8)
        for tag, scales, zps in [("per_row", uniform(0.1, 1.0, 5), randint(-2, 3, 5).float()),
                                 ("groups", uniform(0.1, 1.0, 5, 2), None)]:
            add(Z, f"{name}_{tag}", lambda w, s, i, z=zps, op=op, a=qmin, b=qmax: op(w, s, z, a, b, i),
                cases_of(("rand", (w, scales, idx))), [f"quantized_decomposed::{name}.out"], kind="quant")
        add(Z, f"{name}_dtype_f16", lambda w, s, i, op=op, a=qmin, b=qmax: op.dtype(w, s, None, a, b, i, dtype=F16),
            cases_of(("rand", (w, uniform(0.1, 1.0, 5, dtype=F16), idx))), [f"quantized_decomposed::{name}.dtype_out"], kind="quant")
        add(Z, f"{name}_dtype_f32", lambda w, s, i, op=op, a=qmin, b=qmax: op.dtype(w, s, None, a, b, i, dtype=F32),
            cases_of(("rand", (w, uniform(0.1, 1.0, 5), T([3, 0, 1], I64)))), [f"quantized_decomposed::{name}.dtype_out"], kind="quant")
    add(Z, "mixed_mm", lambda x, w, s: Q.mixed_mm(x, w, s, None), cases_of(("rand", (randn(2, 4), rand_of(I8, 4, 3, lo=-128, hi=128), uniform(0.01, 0.1, 4)))),
        ["quantized_decomposed::mixed_mm.out"], kind="reduction", eager=lambda x, w, s: _mixed_mm_eager(x, w, s, None))
    add(Z, "mixed_linear", lambda x, w, s: Q.mixed_linear(x, w, s, None), cases_of(("rand", (randn(2, 4), rand_of(I8, 3, 4, lo=-128, hi=128), uniform(0.01, 0.1, 3)))),
        ["quantized_decomposed::mixed_linear.out"], kind="reduction", eager=lambda x, w, s: _mixed_linear_eager(x, w, s, None))
    add(Z, "mixed_linear_groups", lambda x, w, s: Q.mixed_linear(x, w, s, None), cases_of(("rand", (randn(2, 4), rand_of(I8, 3, 4, lo=-128, hi=128), uniform(0.01, 0.1, 3, 2)))),
        ["quantized_decomposed::mixed_linear.out"], kind="reduction", eager=lambda x, w, s: _mixed_linear_eager(x, w, s, None))
    qargs = (0.1, 3, 0, 255, randint(0, 256, 3, 4, dtype=U8), 0.05, 128, 0, 255, 0.2, 10, 0, 255)
    add(Z, "add", lambda a, b: Q.add(a, 0.1, 3, 0, 255, b, 0.05, 128, 0, 255, 0.2, 10, 0, 255),
        cases_of(("rand", (randint(0, 256, 3, 4, dtype=U8), randint(0, 256, 3, 4, dtype=U8)))), ["quantized_decomposed::add.out"], kind="exact",
        eager=lambda a, b: _qadd_eager(a, 0.1, 3, 0, 255, b, 0.05, 128, 0, 255, 0.2, 10, 0, 255))
    del qargs


@family("random", "rand, randn and native_dropout checked by statistics: range, mean, standard "
        "deviation, kept fraction and exact 1/(1-p) scaling of kept values")
def _random() -> None:
    R = "random"
    for dt in [F32, F64, F16]:
        add(R, f"rand_{SHORT[dt]}", lambda x, dt=dt: (torch.rand(40, 50, dtype=dt), x + 1), cases_of(("base", randn(2))), ["aten::rand.out"],
            random=[{"uniform": [0.0, 1.0]}, None])
        add(R, f"randn_{SHORT[dt]}", lambda x, dt=dt: (torch.randn(40, 50, dtype=dt), x + 1), cases_of(("base", randn(2))), ["aten::randn.out"],
            random=[{"normal": [0.0, 1.0]}, None])
    x = uniform(1.0, 2.0, 30, 30)
    for p in (0.3, 0.5, 0.9):
        tag = str(p).replace(".", "p")
        add(R, f"native_dropout_p{tag}", lambda x, p=p: A.native_dropout(x, p, True), cases_of(("base", x)), ["aten::native_dropout.out"],
            random=[{"dropout": p, "input": 0, "mask_output": 1}, {"dropout": p, "input": 0, "mask_output": 1}],
            note="upstream: native_dropout does not scale kept values by 1/(1-p)")
    add(R, "native_dropout_p1", lambda x: A.native_dropout(x, 1.0, True), cases_of(("base", randn(4, 5))), ["aten::native_dropout.out"])
    add(R, "native_dropout_p0", lambda x: A.native_dropout(x, 0.0, True), cases_of(("base", randn(4, 5))), ["aten::native_dropout.out"])
    add(R, "native_dropout_eval", lambda x: A.native_dropout(x, 0.5, False), cases_of(("base", randn(4, 5))), ["aten::native_dropout.out"])
    add(R, "dropout_training_export", lambda x: F.dropout(x, 0.25, training=True), cases_of(("base", x)), ["aten::native_dropout.out"],
        random=[{"dropout": 0.25, "input": 0, "mask_output": None}], note="upstream: native_dropout does not scale kept values by 1/(1-p)")
    add(R, "dropout_f64", lambda x: A.native_dropout(x, 0.5, True), cases_of(("base", x.double())), ["aten::native_dropout.out"],
        random=[{"dropout": 0.5, "input": 0, "mask_output": 1}, {"dropout": 0.5, "input": 0, "mask_output": 1}],
        note="upstream: native_dropout does not scale kept values by 1/(1-p)")


class _Buffer(nn.Module):
    def __init__(self, init, op):
        super().__init__()
        self.register_buffer("state", init.clone())
        self.op = op

    def forward(self, x):
        return self.op(self.state, x)


class _Cache(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3))

    def forward(self, pos, v):
        self.cache.index_put_((pos,), v)
        return self.cache * 1


@family("state", "mutable state across calls: buffers with an initial value (copy_), in-place "
        "index_put_ on a cache, in-place updates of inputs")
def _state() -> None:
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    S = "state"
    init = {"passes": [InitializedMutableBufferPass(["state"])]}
    add(S, "buffer_add", _Buffer(T([5.0, -1.0, 0.5]), lambda s, x: s.add_(x) * 1),
        [("step0", (randn(3),)), ("step1", (randn(3),)), ("step2", (randn(3),))], ["aten::copy_"], sequential=True, backend=init)
    add(S, "buffer_int", _Buffer(T([7, -3], I64), lambda s, x: s.mul_(x) + 0),
        [("step0", (T([2, 3], I64),)), ("step1", (T([-1, 2], I64),))], ["aten::copy_"], kind="exact", sequential=True, backend=init)
    add(S, "buffer_copy", _Buffer(T([1.0, 2.0]), lambda s, x: (s * 2, s.copy_(x))[0]),
        [("step0", (randn(2),)), ("step1", (randn(2),)), ("step2", (randn(2),))], ["aten::copy_"], sequential=True, backend=init)
    add(S, "cache_index_put_", _Cache(), [("step0", (T([1], I64), randn(1, 3))), ("step1", (T([3], I64), randn(1, 3))),
                                          ("step2", (T([1], I64), randn(1, 3)))],
        ["aten::index_put_"], sequential=True, backend={"run_reinplace_pass": True})


@family("errors", "arguments PyTorch rejects (integer division by zero, indices out of range, "
        "negative integer powers, reductions over empty dims): pte must return an error, "
        "never abort or return garbage")
def _errors() -> None:
    E = "errors"
    zero = T([[1, 2], [0, 4]], I64)
    for name, fn, op in [("div_trunc_int_zero", lambda a, b: torch.div(a, b, rounding_mode="trunc"), "aten::div.out_mode"),
                         ("div_floor_int_zero", lambda a, b: torch.div(a, b, rounding_mode="floor"), "aten::div.out_mode"),
                         ("remainder_int_zero", torch.remainder, "aten::remainder.Tensor_out"),
                         ("fmod_int_zero", torch.fmod, "aten::fmod.Tensor_out")]:
        for dt in [I32, I64]:
            add(E, f"{name}_{SHORT[dt]}", fn, cases_of(("zero", (T([[5, 6], [7, 8]], dt), zero.to(dt)))), [op], expect_error=True,
                example=(T([[5, 6], [7, 8]], dt), T([[1, 2], [3, 4]], dt)))
    add(E, "floor_divide_int_zero", lambda a, b: A.floor_divide(a, b), cases_of(("zero", (T([5, 6], I64), T([0, 1], I64)))), ["aten::floor_divide.out"],
        expect_error=True, example=(T([5, 6], I64), T([1, 1], I64)), edge={"preserve_ops": [A.floor_divide.default]})
    add(E, "remainder_scalar_int_zero", lambda a: A.remainder.Scalar(a, 0), cases_of(("zero", T([5, 6], I64))),
        ["aten::remainder.Scalar_out"], expect_error=True)
    good3 = T([0, 1, 2], I64)
    x = randn(3, 4)
    for name, fn, op, bad in [
        ("index_select_out_of_range", lambda x, i: torch.index_select(x, 0, i), "aten::index_select.out", T([0, 3, 1], I64)),
        ("index_select_negative", lambda x, i: torch.index_select(x, 0, i), "aten::index_select.out", T([0, -1, 1], I64)),
        ("index_out_of_range", lambda x, i: x[i], "aten::index.Tensor_out", T([0, 5, 1], I64)),
        ("index_too_negative", lambda x, i: x[i], "aten::index.Tensor_out", T([0, -4, 1], I64)),
        ("embedding_out_of_range", lambda x, i: F.embedding(i, x), "aten::embedding.out", T([0, 3, 1], I64)),
        ("index_put_out_of_range", lambda x, i: torch.index_put(x, (i,), torch.ones(3, 4)), "aten::index_put.out", T([0, 7, 1], I64)),
    ]:
        add(E, name, fn, cases_of(("bad", (x, bad))), [op], expect_error=True, example=(x, good3))
    for name, fn, op in [("gather_out_of_range", lambda x, i: torch.gather(x, 1, i), "aten::gather.out"),
                         ("scatter_out_of_range", lambda x, i: torch.scatter(x, 1, i, torch.ones(3, 1)), "aten::scatter.src_out"),
                         ("scatter_add_out_of_range", lambda x, i: torch.scatter_add(x, 1, i, torch.ones(3, 1)), "aten::scatter_add.out")]:
        add(E, name, fn, cases_of(("bad", (x, T([[0], [4], [1]], I64)))), [op], expect_error=True, example=(x, T([[0], [3], [1]], I64)))
    add(E, "repeat_interleave_negative", lambda r: A.repeat_interleave.Tensor(r, output_size=3), cases_of(("bad", T([2, -1, 2], I64))),
        ["aten::repeat_interleave.Tensor_out"], expect_error=True, example=(T([1, 1, 1], I64),),
        edge={"preserve_ops": [A.repeat_interleave.Tensor]})
    add(E, "masked_scatter_short_source", lambda x, m, s: x.masked_scatter(m, s), cases_of(("bad", (randn(2, 2), T([[True, True], [True, False]], BOOL), randn(2)))),
        ["aten::masked_scatter.out"], expect_error=True, example=(randn(2, 2), T([[True, False], [False, False]], BOOL), randn(2)))
    for name, fn, op in [("max_dim_empty", lambda x: x.max(0), "aten::max.dim_max"), ("max_all_empty", lambda x: x.max(), "aten::max.unary_out")]:
        add(E, name, fn, cases_of(("empty", randn(0, 3))), [op], expect_error=True)


# --------------------------------------------------------------------------------------
# Export, run, compare, write
# --------------------------------------------------------------------------------------

from torch.export.graph_signature import InputKind, OutputKind  # noqa: E402


def seed_for(name: str) -> int:
    return zlib.crc32(name.encode())


def program_operators(pte: bytes) -> List[str]:
    program = deserialize_pte_binary(pte).program
    names = set()
    for plan in program.execution_plan:
        names |= {o.name + ("." + o.overload if o.overload else "") for o in plan.operators}
    return sorted(names)


def export(p: Prog):
    example = p.example if p.example is not None else p.cases[0][1]
    ep = torch.export.export(copy.deepcopy(p.module), example, dynamic_shapes=p.dynamic, strict=False)
    edge = to_edge(ep, compile_config=EdgeCompileConfig(**p.edge))
    et = edge.to_executorch(ExecutorchBackendConfig(**p.backend))
    pte = bytes(et.buffer)
    if p.rewrite is not None:
        f = deserialize_pte_binary(pte)
        p.rewrite(f.program)
        pte = bytes(serialize_pte_binary(f, extract_delegate_segments=True))
    return ep, pte


def eager_run(p: Prog, ep, module: nn.Module, inputs: tuple) -> List[Any]:
    """Eager outputs in the program's output order (mutated user inputs first)."""
    ins = tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)
    with torch.no_grad():
        out = (p.eager or module)(*ins)
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    sig = ep.graph_signature
    users = [s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
    mutated = [ins[users.index(s.target)] for s in sig.output_specs if s.kind == OutputKind.USER_INPUT_MUTATION]
    return mutated + list(leaves)


def kind_of(v) -> str:
    if isinstance(v, torch.Tensor):
        return "tensor"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    raise TypeError(f"unsupported value {type(v)}: {v!r}")


def dtype_name(v) -> str:
    if isinstance(v, torch.Tensor):
        return str(v.dtype).replace("torch.", "")
    return {"int": "int64", "float": "float64", "bool": "bool"}[kind_of(v)]


def to_numpy(v) -> np.ndarray:
    if not isinstance(v, torch.Tensor):
        return np.array(v, dtype={"bool": np.bool_, "int": np.int64, "float": np.float64}[kind_of(v)])
    t = v.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy().copy()  # bits; the manifest says bfloat16
    if t.dtype in (torch.uint16, torch.uint32, torch.uint64):
        return t.view({torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}[t.dtype]).numpy().view(
            {torch.uint16: np.uint16, torch.uint32: np.uint32, torch.uint64: np.uint64}[t.dtype]).copy()
    return t.numpy().copy()


def as_f64(v) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.is_complex():
            return torch.view_as_real(t.contiguous()).to(torch.float64).numpy()
        return t.to(torch.float64).numpy()
    return np.array(float(v))


def first_difference(got, want, rtol: float, atol: float, signed_zeros: bool) -> Optional[str]:
    """The rule the Rust harness applies: kinds, dtypes and shapes exactly; floats within
    tolerance (NaN matches NaN, infinities equal; signs of zeros when asked); the rest
    exactly."""
    if kind_of(got) != kind_of(want):
        return f"a {kind_of(got)}, expected a {kind_of(want)}"
    if dtype_name(got) != dtype_name(want):
        return f"dtype {dtype_name(got)}, expected {dtype_name(want)}"
    gs = tuple(got.shape) if isinstance(got, torch.Tensor) else ()
    ws = tuple(want.shape) if isinstance(want, torch.Tensor) else ()
    if gs != ws:
        return f"shape {list(gs)}, expected {list(ws)}"
    floating = isinstance(want, float) or (isinstance(want, torch.Tensor) and (want.is_floating_point() or want.is_complex()))
    if not floating:
        a, b = to_numpy(got).reshape(-1), to_numpy(want).reshape(-1)
        bad = np.nonzero(a != b)[0]
        return f"element {bad[0]}: {a[bad[0]]}, expected {b[bad[0]]}" if len(bad) else None
    a, b = as_f64(got).reshape(-1), as_f64(want).reshape(-1)
    with np.errstate(invalid="ignore"):
        close = np.abs(a - b) <= atol + rtol * np.abs(b)
    both_nan = np.isnan(a) & np.isnan(b)
    inf_either = np.isinf(a) | np.isinf(b)
    ok = both_nan | (~np.isnan(a) & ~np.isnan(b) & np.where(inf_either, a == b, close))
    if signed_zeros:
        ok &= ~((a == 0) & (b == 0) & (np.signbit(a) != np.signbit(b)))
    bad = np.nonzero(~ok)[0]
    return f"element {bad[0]}: {float(a[bad[0]])!r}, expected {float(b[bad[0]])!r}" if len(bad) else None


def level_for(p: Prog, outputs: List[Any]) -> str:
    levels = ["exact"]
    for o in outputs:
        if not isinstance(o, (torch.Tensor, float)):
            continue
        dt = o.dtype if isinstance(o, torch.Tensor) else torch.float64
        if not (dt.is_floating_point or dt.is_complex) or p.kind == "exact":
            continue
        base = FLOAT_LEVEL[dt]
        if p.kind == "reduction":
            levels.append(base + ".reduction")
        elif p.kind == "transcendental" and base == "f32":
            levels.append("f32.transcendental")
        elif p.kind == "quant" and base in ("f32", "f64"):
            levels.append("quant")
        else:
            levels.append(base)
    return max(levels, key=LEVEL_ORDER.index)


# ---- random operators: statistics instead of values ----------------------------------


def random_checks(spec: dict, out: torch.Tensor, inputs: tuple, outputs: List[Any]) -> dict:
    """Turns a catalogue spec into the concrete bounds the manifest records."""
    n = out.numel()
    if "uniform" in spec:
        lo, hi = spec["uniform"]
        sd = (hi - lo) / math.sqrt(12)
        m = (lo + hi) / 2
        return {"range": [lo, hi], "mean": [m - 6 * sd / math.sqrt(n), m + 6 * sd / math.sqrt(n)],
                "std": [sd * (1 - 6 / math.sqrt(2 * n)), sd * (1 + 6 / math.sqrt(2 * n))]}
    if "normal" in spec:
        m, sd = spec["normal"]
        return {"mean": [m - 6 * sd / math.sqrt(n), m + 6 * sd / math.sqrt(n)],
                "std": [sd * (1 - 6 / math.sqrt(2 * n)), sd * (1 + 6 / math.sqrt(2 * n))]}
    if "dropout" in spec:
        prob = spec["dropout"]
        keep = 1 - prob
        sd = math.sqrt(prob * keep / n)
        scale = 0.0 if keep == 0 else 1.0 / keep
        return {"dropout": {"input": spec.get("input", 0), "mask_output": spec.get("mask_output"), "scale": scale,
                            "kept_fraction": [max(0.0, keep - 6 * sd), min(1.0, keep + 6 * sd)]}}
    raise ValueError(spec)


def check_random(check: dict, k: int, outputs: List[Any], inputs: tuple) -> Optional[str]:
    """The statistical checks of the harness, in Python (to judge upstream)."""
    out = outputs[k]
    x = as_f64(out).reshape(-1)
    if "range" in check:
        lo, hi = check["range"]
        if x.size and (x.min() < lo or x.max() >= hi):
            return f"values outside [{lo}, {hi}): min {x.min()}, max {x.max()}"
    for stat, val in (("mean", x.mean() if x.size else 0.0), ("std", x.std() if x.size else 0.0)):
        if stat in check and not (check[stat][0] <= val <= check[stat][1]):
            return f"{stat} {val} outside {check[stat]}"
    if "dropout" in check:
        d = check["dropout"]
        src = as_f64(inputs[d["input"]]).reshape(-1)
        kept = x != 0
        if d["mask_output"] is not None:
            mask = as_f64(outputs[d["mask_output"]]).reshape(-1) != 0
            if np.any(kept & ~mask):
                return "a dropped element (mask false) is not zero"
            kept = mask
        scaled = (torch.tensor(src, dtype=torch.float64).to(out.dtype) * d["scale"]).to(torch.float64).numpy()
        bad = kept & (np.abs(x - scaled) > 1e-6 * np.abs(scaled))
        if np.any(bad):
            i = np.nonzero(bad)[0][0]
            return f"kept element {i} is {x[i]}, expected input * {d['scale']} = {scaled[i]}"
        frac = kept.mean() if kept.size else 1.0
        lo, hi = d["kept_fraction"]
        if not (lo <= frac <= hi):
            return f"kept fraction {frac} outside [{lo}, {hi}]"
    return None


# ---- writing --------------------------------------------------------------------------


class Store:
    """Content-addressed .npy files under tests/conformance/data/."""

    def __init__(self, root: Path):
        self.root = root
        self.used: set = set()

    def put(self, v) -> Dict[str, Any]:
        arr = to_numpy(v)
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(arr) if arr.ndim else arr, allow_pickle=False)
        data = buf.getvalue()
        name = hashlib.sha256(data).hexdigest()[:16] + ".npy"
        path = self.root / "data" / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        self.used.add(name)
        entry = {"kind": kind_of(v), "dtype": dtype_name(v), "path": f"data/{name}"}
        return entry


def describe(v) -> Dict[str, Any]:
    d = {"kind": kind_of(v), "dtype": dtype_name(v)}
    if isinstance(v, torch.Tensor):
        d["shape"] = list(v.shape)
    return d


@dataclass
class Step:
    """One call: its manifest entry and what it says about upstream."""

    entry: Dict[str, Any]
    level: str = "exact"
    eager_error: Optional[str] = None
    upstream_error: Optional[str] = None
    difference: Optional[str] = None


def judge_outputs(p: Prog, outs: List[Dict[str, Any]], up: List[Any], want: List[Any], inputs: tuple,
                  rtol: float, atol: float) -> Optional[str]:
    if len(up) != len(want):
        return f"{len(up)} outputs, eager has {len(want)}"
    for k, (u, w) in enumerate(zip(up, want)):
        o = outs[k]
        if "random" in o or o.get("values") == "unspecified":
            problem = first_difference(u, w, 0.0, 0.0, False) if kind_of(w) != "tensor" else None
            if problem is None and (kind_of(u) != "tensor" or u.dtype != w.dtype or u.shape != w.shape):
                problem = f"{describe(u)}, expected {describe(w)}"
            if problem is None and "random" in o:
                problem = check_random(o["random"], k, up, inputs)
        else:
            problem = first_difference(u, w, rtol, atol, p.signed_zeros)
        if problem:
            return f"output {k}: {problem}"
    return None


def make_step(p: Prog, ep, module: nn.Module, inputs: tuple, status: str, up: Any, store: Store) -> Step:
    step = Step({"inputs": [store.put(v) for v in inputs]})
    try:
        want = eager_run(p, ep, module, inputs)
    except Exception as e:  # noqa: BLE001 - PyTorch's refusals are data here
        step.eager_error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
        step.entry["expect_error"] = step.eager_error
        step.upstream_error = up if status == "error" else "upstream returns outputs instead of an error"
        return step
    step.level = level_for(p, want)
    rtol, atol, _ = TOLERANCES[step.level]
    outs = []
    for k, w in enumerate(want):
        if p.random and k < len(p.random) and p.random[k] is not None:
            d = describe(w)
            d["random"] = random_checks(p.random[k], w, inputs, want)
            outs.append(d)
        elif k in p.shape_only:
            d = describe(w)
            d["values"] = "unspecified"
            outs.append(d)
        else:
            outs.append(store.put(w))
    step.entry["outputs"] = outs
    if status == "error":
        step.upstream_error = up
        return step
    step.difference = judge_outputs(p, outs, up, want, inputs, rtol, atol)
    if step.difference and not p.random:
        # (Upstream's random generator is unseeded: its samples would change every run.)
        step.entry["upstream"] = [store.put(u) for u in up]
    return step


def finish_case(p: Prog, case: Dict[str, Any], steps: List[Step]) -> Optional[str]:
    """Fills tolerance and `follows`; returns why the case must be dropped, if it must."""
    errors = [s.eager_error for s in steps if s.eager_error]
    if errors and not p.expect_error:
        return f"eager PyTorch raised {errors[0]}"
    if p.expect_error and not errors:
        return "expected an eager error, got outputs"
    level = max((s.level for s in steps), key=LEVEL_ORDER.index)
    rtol, atol, _ = TOLERANCES[level]
    case["tolerance"] = {"level": level, "rtol": rtol, "atol": atol}
    if p.signed_zeros:
        case["signed_zeros"] = True
    case["steps"] = [s.entry for s in steps]
    rejected = [s.upstream_error for s in steps if s.upstream_error]
    differs = [s.difference for s in steps if s.difference]
    if p.expect_error:
        case["follows"] = "pytorch"
        case["note"] = p.note or "PyTorch rejects these arguments; pte must return an error"
        case["upstream_error"] = rejected[0]
    elif rejected:
        case["follows"] = "upstream_rejects"
        case["upstream_error"] = rejected[0]
    elif differs:
        if not p.note:
            print(f"  WARNING {p.full} {case['name']}: upstream differs, no note: {differs[0]}", file=sys.stderr)
        case["follows"] = "pytorch"
        case["note"] = p.note or "upstream differs from PyTorch"
        case["difference"] = differs[0]
    return None


@dataclass
class Built:
    program: Dict[str, Any]
    cases: List[Dict[str, Any]]
    dropped: List[str]


def build(p: Prog, upstream: Upstream, store: Store) -> Built:
    torch.manual_seed(seed_for(p.full))
    eager_module = copy.deepcopy(p.module)
    ep, pte = export(p)
    ops = program_operators(pte)
    missing = [o for o in p.ops if o not in ops]
    if missing:
        raise RuntimeError(f"the program does not call {missing}; it calls {ops}")
    rel = f"programs/{p.family}/{p.name}.pte"
    (store.root / rel).parent.mkdir(parents=True, exist_ok=True)
    (store.root / rel).write_bytes(pte)
    program = {"path": rel, "family": p.family, "operators": ops, "export": p.export_path,
               "sha256": hashlib.sha256(pte).hexdigest()}
    ups = upstream.run(pte, "forward", [c[1] for c in p.cases], p.sequential)
    base = {"family": p.family, "operators": p.ops, "program": rel, "method": "forward", "export": p.export_path}
    cases, dropped = [], []
    if p.sequential:
        module = copy.deepcopy(eager_module)
        steps = [make_step(p, ep, module, inputs, st, up, store) for (_, inputs), (st, up) in zip(p.cases, ups)]
        case = dict(base, name=p.name, sequential=True)
        why = finish_case(p, case, steps)
        (dropped.append(f"{p.full}: {why}") if why else cases.append(case))
        return Built(program, cases, dropped)
    for (variant, inputs), (st, up) in zip(p.cases, ups):
        step = make_step(p, ep, copy.deepcopy(eager_module), inputs, st, up, store)
        case = dict(base, name=f"{p.name}.{variant}")
        why = finish_case(p, case, [step])
        (dropped.append(f"{p.full}.{variant}: {why}") if why else cases.append(case))
    return Built(program, cases, dropped)


# ---- manifest and summary -------------------------------------------------------------


def dumps_lines(items: List[Dict[str, Any]]) -> str:
    return "[\n" + ",\n".join("  " + json.dumps(x, sort_keys=True) for x in items) + "\n ]"


def write_manifest(path: Path, programs: List[Dict[str, Any]], cases: List[Dict[str, Any]], upstream_names: List[str]) -> None:
    head = {
        "generator": "tools/gen_conformance.py",
        "executorch": EXPECTED_VERSIONS["executorch"],
        "torch": EXPECTED_VERSIONS["torch"],
        "tolerances": {k: {"rtol": r, "atol": a, "why": w} for k, (r, a, w) in TOLERANCES.items()},
        "upstream_operators": upstream_names,
        "unreachable": UNREACHABLE,
    }
    text = json.dumps(head, indent=1, sort_keys=True)[:-2]
    text += ',\n "programs": ' + dumps_lines(programs) + ',\n "cases": ' + dumps_lines(cases) + "\n}\n"
    path.write_text(text)


def read_known_failures(path: Path) -> Dict[str, str]:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, reason = line.partition(" ")
                out[name] = reason.strip().lstrip("#").strip()
    return out


def summary(cases: List[Dict[str, Any]], programs: List[Dict[str, Any]], upstream_names: List[str], root: Path) -> str:
    per_family = Counter(c["family"] for c in cases)
    per_op: Dict[str, int] = Counter()
    for c in cases:
        for o in c["operators"]:
            per_op[o] += 1
    incidental = {o for p in programs for o in p["operators"]}
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and f.name != "README.md")
    lines = [
        "# Operator conformance suite",
        "",
        "Generated by `tools/gen_conformance.py` (do not edit by hand; see DEVELOPERS.md). "
        "Each case runs one program of `programs/` on inputs from `data/` and compares with "
        "eager PyTorch's outputs, under the tolerance `manifest.json` names. "
        "`crates/pte-kernels/tests/conformance.rs` makes every case a test named `family::case`.",
        "",
        f"**{len(cases)} cases**, {len(programs)} programs, {size / 1e6:.2f} MB committed.",
        "",
        "## Cases per family",
        "",
        "| family | cases | what it covers |",
        "|---|---|---|",
    ]
    for fam, _ in FAMILIES:
        if per_family[fam]:
            lines.append(f"| {fam} | {per_family[fam]} | {FAMILY_DOCS[fam]} |")
    covered = [o for o in upstream_names if per_op[o]]
    lines += ["", f"## Upstream operators ({len(covered)} of {len(upstream_names)} tested directly)", "",
              "| operator | cases |", "|---|---|"]
    for o in upstream_names:
        mark = str(per_op[o]) if per_op[o] else ("only inside other programs" if o in incidental else "**none**")
        if o in UNREACHABLE and not per_op[o]:
            mark += f" ({UNREACHABLE[o]})"
        lines.append(f"| `{o}` | {mark} |")
    extra = sorted(o for o in per_op if o not in upstream_names)
    if extra:
        lines += ["", "Also tested (not in upstream's registry): " + ", ".join(f"`{o}`" for o in extra)]
    lines += ["", "## Where pte follows PyTorch instead of upstream", "",
              "Upstream's outputs differ from eager PyTorch beyond tolerance (`follows: pytorch`), or "
              "upstream refuses arguments PyTorch accepts (`follows: upstream_rejects`):", ""]
    notes: Dict[Tuple[str, str], List[Dict[str, Any]]] = defaultdict(list)
    for c in cases:
        if c.get("follows") == "pytorch" and "expect_error" not in c["steps"][0]:
            notes[(", ".join(c["operators"]), c["note"])].append(c)
    for (ops, note), cs in sorted(notes.items()):
        ex = cs[0]
        lines.append(f"- `{ops}`: {note} ({len(cs)} cases; e.g. `{ex['family']}::{ex['name']}`: {ex.get('difference', '')})")
    rej: Dict[str, List[str]] = defaultdict(list)
    for c in cases:
        if c.get("follows") == "upstream_rejects":
            rej[", ".join(c["operators"])].append(f"{c['family']}::{c['name']}")
    lines += ["", "Upstream refuses (error or abort) where PyTorch computes a result:", ""]
    for ops, names in sorted(rej.items()):
        lines.append(f"- `{ops}`: {len(names)} cases, e.g. `{names[0]}`")
    errs = [c for c in cases if "expect_error" in c["steps"][0]]
    lines += ["", f"PyTorch rejects the arguments and pte must return an error ({len(errs)} cases); "
              "upstream's behaviour:", ""]
    for c in errs:
        lines.append(f"- `{c['family']}::{c['name']}`: {c['upstream_error']}")
    known = read_known_failures(root / "known_failures.txt")
    if known:
        by_op: Dict[str, int] = Counter()
        names = {f"{c['family']}::{c['name']}": c for c in cases}
        for n in known:
            if n in names:
                for o in names[n]["operators"]:
                    by_op[o] += 1
        lines += ["", f"## Known failures today ({len(known)} cases, `known_failures.txt`)", "",
                  "| operator | failing cases |", "|---|---|"]
        for o, k in sorted(by_op.items(), key=lambda x: (-x[1], x[0])):
            lines.append(f"| `{o}` | {k} |")
    return "\n".join(lines) + "\n"


# ---- main -------------------------------------------------------------------------------


def build_catalogue() -> None:
    for name, fn in FAMILIES:
        torch.manual_seed(seed_for(name))
        fn()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", metavar="PAT[,PAT]", help="regenerate programs whose family::name contains a pattern")
    ap.add_argument("--list", action="store_true", help="print the catalogue and exit")
    ap.add_argument("--summary", action="store_true",
                    help="only rewrite README.md from manifest.json and known_failures.txt")
    ap.add_argument("--out", default=str(OUT_DIR), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    build_catalogue()
    if args.list:
        for p in CATALOGUE:
            print(f"{p.full}: {len(p.cases)} cases, {', '.join(p.ops)}")
        print(f"{len(CATALOGUE)} programs, {sum(len(p.cases) for p in CATALOGUE)} input sets")
        return 0
    root = Path(args.out).resolve()
    if args.summary:
        m = json.loads((root / "manifest.json").read_text())
        (root / "README.md").write_text(summary(m["cases"], m["programs"], m["upstream_operators"], root))
        return 0
    pats = [s.strip() for s in args.only.split(",")] if args.only else None
    selected = [p for p in CATALOGUE if pats is None or any(s in p.full for s in pats)]
    manifest_path = root / "manifest.json"
    old_programs: Dict[str, Any] = {}
    old_cases: Dict[str, List[Any]] = defaultdict(list)
    if pats is not None and manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        old_programs = {p["path"]: p for p in old["programs"]}
        for c in old["cases"]:
            old_cases[c["program"]].append(c)
    elif root.exists():
        for sub in ("programs", "data"):
            shutil.rmtree(root / sub, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)

    upstream = Upstream()
    store = Store(root)
    upstream_names = upstream.operator_names()

    t0 = time.time()
    failed, dropped = [], []
    new_programs: Dict[str, Any] = {}
    new_cases: Dict[str, List[Any]] = {}
    for i, p in enumerate(selected):
        rel = f"programs/{p.family}/{p.name}.pte"
        try:
            b = build(p, upstream, store)
        except Exception as e:  # noqa: BLE001 - report every failure, then exit nonzero
            failed.append(f"{p.full}: {type(e).__name__}: {str(e).strip()[:400]}")
            print(f"  FAILED {failed[-1]}", file=sys.stderr)
            old_programs.pop(rel, None)
            old_cases.pop(rel, None)
            continue
        dropped += b.dropped
        new_programs[rel] = b.program
        new_cases[rel] = b.cases
        if (i + 1) % 25 == 0:
            print(f"  {i + 1}/{len(selected)} programs, {time.time() - t0:.0f}s", file=sys.stderr)
    upstream.close()

    order = [f"programs/{p.family}/{p.name}.pte" for p in CATALOGUE]
    programs = [new_programs.get(r) or old_programs.get(r) for r in order]
    programs = [p for p in programs if p]
    cases = [c for r in order for c in (new_cases[r] if r in new_cases else old_cases.get(r, []))]
    write_manifest(manifest_path, programs, cases, upstream_names)

    # Remove files nothing refers to any more.
    keep = {p["path"] for p in programs}
    for c in cases:
        for s in c["steps"]:
            for v in s["inputs"] + s.get("outputs", []) + s.get("upstream", []):
                if v and "path" in v:
                    keep.add(v["path"])
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root).as_posix()
        if f.is_file() and rel.startswith(("programs/", "data/")) and rel not in keep:
            f.unlink()
    for d in sorted((root / "programs").glob("*"), reverse=True):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()

    text = summary(cases, programs, upstream_names, root)
    (root / "README.md").write_text(text)
    print(text.split("## Upstream operators")[0], file=sys.stderr)
    for d in dropped:
        print(f"  DROPPED {d}", file=sys.stderr)
    print(f"wrote {len(cases)} cases from {len(programs)} programs in {time.time() - t0:.0f}s; "
          f"{len(failed)} programs failed, {len(dropped)} cases dropped", file=sys.stderr)
    for f in failed:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
