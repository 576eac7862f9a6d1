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
    "quant": (1e-6, 1e-6, "dequantized float32 results of exact integer arithmetic"),
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
    exec(f"def forward(self, {names}):\n    return self.fn({names})\n", ns)
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
    return (torch.randn(*shape, dtype=torch.float64) * scale).to(dtype)


def uniform(lo, hi, *shape, dtype=F32):
    return (torch.rand(*shape, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def randint(lo, hi, *shape, dtype=I64):
    if dtype == BOOL:
        return torch.rand(*shape) < 0.5
    return torch.randint(lo, hi, shape, dtype=torch.int64).to(dtype)


def rand_of(dtype, *shape, lo=-5, hi=6, scale=2.0):
    if dtype == BOOL:
        return torch.rand(*shape) < 0.5
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
                    note={"sign": "upstream: sign(NaN) is NaN; PyTorch: 0", "abs": "upstream: abs(-0.0) is -0.0; PyTorch: 0.0"}.get(name))
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
    return f"element {bad[0]}: {a[bad[0]]!r}, expected {b[bad[0]]!r}" if len(bad) else None


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
        elif p.kind == "quant" and base == "f32":
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
    if step.difference:
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
    notes: Dict[Tuple[str, str], List[str]] = defaultdict(list)
    for c in cases:
        if c.get("follows") == "pytorch" and "expect_error" not in c["steps"][0]:
            notes[(c["note"], "differs")].append(f"{c['family']}::{c['name']}")
    for (note, _), names in sorted(notes.items()):
        lines.append(f"- {note} ({len(names)} cases, e.g. `{names[0]}`)")
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
    ap.add_argument("--out", default=str(OUT_DIR), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    build_catalogue()
    if args.list:
        for p in CATALOGUE:
            print(f"{p.full}: {len(p.cases)} cases, {', '.join(p.ops)}")
        print(f"{len(CATALOGUE)} programs, {sum(len(p.cases) for p in CATALOGUE)} input sets")
        return 0
    root = Path(args.out).resolve()
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
