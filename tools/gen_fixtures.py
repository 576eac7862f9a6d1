#!/usr/bin/env python3
"""Generate the ExecuTorch conformance fixtures used by the Rust tests.

Every fixture is exported with *upstream* ExecuTorch (torch.export.export ->
executorch.exir.to_edge / to_edge_transform_and_lower -> to_executorch), written to
``tests/fixtures/<name>/``, and executed in the *upstream* runtime
(``executorch.extension.pybindings.portable_lib``).  The inputs and the upstream
runtime outputs (not eager PyTorch outputs) are stored as ``.npy`` files and
described in ``tests/fixtures/manifest.json``.  See ``tools/README.md``.

Reference environment (pinned; the script refuses to run with other versions):

    python3 -m venv .venv-ref && .venv-ref/bin/pip install executorch==1.5.1 torch==2.15.0
    .venv-ref/bin/pip install --no-deps torchvision==0.29.2 && .venv-ref/bin/pip install pillow

Usage (from the repository root):

    .venv-ref/bin/python tools/gen_fixtures.py                 # committed fixtures
    .venv-ref/bin/python tools/gen_fixtures.py --only cond,op_add
    .venv-ref/bin/python tools/gen_fixtures.py --bench bench-models   # large, NOT committed
    .venv-ref/bin/python tools/gen_fixtures.py --bench bench-models --only regnet_y_400mf_portable,regnet_y_400mf_xnnpack
        # one of the other architectures (EXTRA_BENCH), also not committed

Everything is seeded (torch.manual_seed(crc32(fixture name)) before a fixture's
modules and inputs are built; numpy is seeded too) and no weights are downloaded,
so running the script twice gives byte-identical files.

Variants that upstream rejected and were therefore dropped are listed in the
comments next to the fixture that would have contained them (search "DROPPED").
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import json
import logging
import shutil
import sys
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

EXPECTED_VERSIONS = {"executorch": "1.5.1", "torch": "2.15.0"}


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

from executorch.exir import (  # noqa: E402
    EdgeCompileConfig,
    ExecutorchBackendConfig,
    to_edge,
    to_edge_transform_and_lower,
)
from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass  # noqa: E402
from executorch.extension.pybindings.portable_lib import (  # noqa: E402
    _load_bundled_program_from_buffer,
    _load_for_executorch,
    _load_for_executorch_from_bundled_program,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_DIR = ROOT / "tests" / "fixtures"

# --------------------------------------------------------------------------------------
# Fixture description
# --------------------------------------------------------------------------------------


@dataclass
class Method:
    module: nn.Module
    example: Tuple[Any, ...]
    dynamic_shapes: Any = None


@dataclass
class Spec:
    description: str
    methods: Dict[str, Method]
    # (method name, positional inputs).  Tensors and Python int/float/bool.
    cases: List[Tuple[str, Tuple[Any, ...]]]
    sequential: bool = False
    lower: str = "portable"  # "portable" | "xnnpack"
    backend_config: Dict[str, Any] = field(default_factory=dict)
    edge_config: Dict[str, Any] = field(default_factory=dict)
    bundled: bool = False
    rtol: float = 1e-5
    atol: float = 1e-6


REGISTRY: Dict[str, Callable[[], Spec]] = {}
BENCH_REGISTRY: Dict[str, Callable[[], Spec]] = {}


def fixture(name: str, bench: bool = False):
    def deco(fn):
        (BENCH_REGISTRY if bench else REGISTRY)[name] = fn
        return fn

    return deco


class Fn(nn.Module):
    """Wraps a pure function of its inputs into a module (for the op fixtures)."""

    def __init__(self, fn: Callable[..., Any]):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def single(module: nn.Module, *example, dynamic_shapes=None, extra_cases=()) -> Tuple[
    Dict[str, Method], List[Tuple[str, Tuple[Any, ...]]]
]:
    methods = {"forward": Method(module, tuple(example), dynamic_shapes)}
    cases = [("forward", tuple(example))] + [("forward", tuple(c)) for c in extra_cases]
    return methods, cases


def op_spec(description: str, fn: Callable[..., Any], *example, extra_cases=(), **kw) -> Spec:
    methods, cases = single(Fn(fn), *example, extra_cases=extra_cases)
    return Spec(description=description, methods=methods, cases=cases, **kw)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def randint(lo, hi, *shape, dtype=torch.int64):
    return torch.randint(lo, hi, shape, dtype=dtype)


def nonzero_int(*shape, dtype=torch.int64, hi=6):
    mag = torch.randint(1, hi, shape)
    sign = torch.where(torch.rand(shape) < 0.5, -1, 1)
    return (mag * sign).to(dtype)


def away_from_zero(*shape, lo=0.5):
    x = torch.rand(*shape) + lo
    return torch.where(torch.rand(*shape) < 0.5, -x, x)


def positive(*shape, lo=0.1):
    return torch.rand(*shape) * 3.0 + lo


# --------------------------------------------------------------------------------------
# Structural fixtures
# --------------------------------------------------------------------------------------


class LinearClamp(nn.Module):
    def __init__(self):
        super().__init__()
        self.param = nn.Parameter(torch.rand(3, 4))
        self.linear = nn.Linear(4, 5)

    def forward(self, x):
        return self.linear(x + self.param).clamp(min=0.0, max=1.0)


@fixture("linear_clamp")
def _linear_clamp():
    m = LinearClamp().eval()
    methods, cases = single(m, torch.randn(3, 4), extra_cases=[(torch.randn(3, 4),)])
    return Spec(
        "Seed module from the export docs: linear(x + param).clamp(0, 1). model.pte is "
        "exactly the upstream et_program.buffer.",
        methods,
        cases,
    )


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=4)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.randn(8) * 0.5)
            self.bn.running_var.copy_(torch.rand(8) + 0.5)
            self.bn.weight.copy_(torch.rand(8) + 0.5)
            self.bn.bias.copy_(torch.randn(8) * 0.1)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv1(x))))
        x = F.relu(self.conv2(x))
        x = torch.flatten(self.gap(x), 1)
        return self.fc(x)


@fixture("convnet")
def _convnet():
    methods, cases = single(ConvNet().eval(), torch.randn(1, 3, 16, 16), extra_cases=[(torch.randn(1, 3, 16, 16),)])
    return Spec(
        "Conv2d + BatchNorm2d(eval, explicit running stats) + ReLU + MaxPool2d + grouped "
        "strided padded Conv2d + AdaptiveAvgPool2d(1) + flatten + Linear, input 1x3x16x16.",
        methods,
        cases,
        rtol=1e-4,
        atol=1e-5,
    )


class InvertedResiduals(nn.Module):
    """Mobile blocks (expand 1x1, depthwise 3x3 or 5x5, project 1x1, residual; ReLU6, or
    SiLU with squeeze-and-excitation): where the exporter's memory plan puts a block's
    activation over the convolution input it no longer needs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)

        def bn(c):
            b = nn.BatchNorm2d(c)
            with torch.no_grad():
                b.running_mean.copy_(torch.randn(c) * 0.2)
                b.running_var.copy_(torch.rand(c) + 0.5)
                b.weight.copy_(torch.rand(c) + 0.5)
                b.bias.copy_(torch.randn(c) * 0.1)
            return b

        def block(cin, mid, cout, k, stride, act):
            return nn.ModuleList([
                nn.Conv2d(cin, mid, 1, bias=False), bn(mid), act(),
                nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False), bn(mid), act(),
                nn.Conv2d(mid, cout, 1, bias=False), bn(cout),
            ])

        self.stem = nn.Conv2d(3, 16, 3, 2, 1)
        self.blocks = nn.ModuleList([
            block(16, 48, 16, 3, 1, nn.ReLU6),
            block(16, 64, 24, 3, 2, nn.ReLU6),
            block(24, 72, 24, 5, 1, nn.SiLU),
            block(24, 96, 32, 5, 2, nn.SiLU),
        ])
        self.se = nn.ModuleList([nn.Conv2d(96, 8, 1), nn.Conv2d(8, 96, 1)])

    def forward(self, x):
        x = F.relu6(self.stem(x))
        for i, b in enumerate(self.blocks):
            y = x
            for j, layer in enumerate(b):
                y = layer(y)
                if i == 3 and j == 5:
                    s = F.adaptive_avg_pool2d(y, 1)
                    s = torch.sigmoid(self.se[1](F.silu(self.se[0](s))))
                    y = y * s
            x = x + y if y.shape == x.shape else y
        return x


@fixture("inverted_residuals")
def _inverted_residuals():
    m = InvertedResiduals().eval()
    methods, cases = single(m, torch.randn(1, 3, 32, 32), extra_cases=[(torch.randn(1, 3, 32, 32),)])
    return Spec(
        "Four mobile blocks (1x1 expand, depthwise 3x3/5x5 stride 1/2, 1x1 project, "
        "residual; ReLU6, SiLU, squeeze-and-excitation), input 1x3x32x32: activations "
        "the memory plan places over a dead convolution input.",
        methods,
        cases,
        rtol=1e-4,
        atol=1e-5,
    )


class DenseBlock(nn.Module):
    """DenseNet's pattern: every layer reads the concatenation of all earlier outputs."""

    def __init__(self, layers=6, growth=8, width=16):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.layers = nn.ModuleList()
        c = width
        for _ in range(layers):
            self.layers.append(
                nn.Sequential(
                    nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, 2 * growth, 1, bias=False),
                    nn.BatchNorm2d(2 * growth), nn.ReLU(), nn.Conv2d(2 * growth, growth, 3, padding=1, bias=False),
                )
            )
            c += growth
        self.transition = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1), nn.AvgPool2d(2))

    def forward(self, x):
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return self.transition(torch.cat(features, 1))


@fixture("dense_block")
def _dense_block():
    m = _calibrate_bn(DenseBlock()).eval()
    methods, cases = single(m, torch.randn(1, 3, 16, 16))
    return Spec(
        "A DenseNet block: six layers (batch norm, ReLU, 1x1, batch norm, ReLU, 3x3), each "
        "reading the concatenation of every earlier output, and a transition, input "
        "1x3x16x16: a channels-last region with many inputs.",
        methods,
        cases,
        rtol=1e-4,
        atol=1e-5,
    )


class DynBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        return torch.softmax(self.fc2(h), dim=-1) + x.sum(dim=-1, keepdim=True)


@fixture("dynamic_batch")
def _dynamic_batch():
    batch = Dim("batch", min=1, max=8)
    m = DynBatch().eval()
    ex = torch.randn(4, 6)
    methods = {"forward": Method(m, (ex,), ({0: batch},))}
    cases = [("forward", (torch.randn(b, 6),)) for b in (1, 3, 8)]
    return Spec(
        "Dynamic batch dimension (Dim('batch', min=1, max=8)); exported with batch 4, "
        "cases at batch 1, 3 and 8 (upper bound). Tensors are DYNAMIC_BOUND.",
        methods,
        cases,
    )


class ScalarIO(nn.Module):
    def forward(self, x, n: int, s: float, flag: bool):
        y = x * n + s
        if flag:
            y = y.relu()
        return y, x.shape[0], x.shape[0] * 2 + 1


@fixture("scalar_io")
def _scalar_io():
    batch = Dim("batch", min=1, max=6)
    ex = (torch.randn(4, 3), 3, 0.5, True)
    methods = {"forward": Method(ScalarIO(), ex, ({0: batch}, None, None, None))}
    cases = [("forward", ex), ("forward", (torch.randn(2, 3), 3, 0.5, True))]
    return Spec(
        "Non-tensor inputs (int, float, bool; specialised at export, the runtime requires "
        "the baked-in values) and non-tensor (SymInt) outputs derived from a dynamic dim.",
        methods,
        cases,
    )


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(2, 3))

    def forward(self, x):
        self.count.add_(x)
        return self.count * 2


@fixture("mutable_buffer")
def _mutable_buffer():
    m = Counter()
    cases = [("forward", (torch.randn(2, 3),)) for _ in range(4)]
    methods = {"forward": Method(m, cases[0][1])}
    return Spec(
        "Mutable buffer `count` (2x3, zeros) updated in place each call: count += x; "
        "return count * 2. No initial state is stored: the buffer lives in planned memory, "
        "which upstream zero-initialises. Run the cases in order on one loaded method.",
        methods,
        cases,
        sequential=True,
    )


class InitState(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 + 1.0)
        self.register_buffer("steps", torch.tensor([10], dtype=torch.int64))

    def forward(self, x):
        self.state.mul_(0.5).add_(x)
        self.steps.add_(1)
        return self.state + 0.0, self.steps + 0


@fixture("mutable_buffer_init")
def _mutable_buffer_init():
    m = InitState()
    cases = [("forward", (torch.randn(2, 3),)) for _ in range(3)]
    methods = {"forward": Method(m, cases[0][1])}
    return Spec(
        "Mutable buffers with an exported initial state (InitializedMutableBufferPass"
        "(['state', 'steps'])): state = arange(6)*0.5+1 (f32 2x3), steps = [10] (i64). "
        "Each call: state = state*0.5 + x; steps += 1; returns (state, steps). Initial "
        "values come from Program.mutable_data_segments. Sequential.",
        methods,
        cases,
        sequential=True,
        backend_config={"passes": [InitializedMutableBufferPass(["state", "steps"])]},
    )


class CondModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        def true_fn(x):
            return self.lin(x).relu() + 1.0

        def false_fn(x):
            return x * 2.0 - 1.0

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


@fixture("cond")
def _cond():
    pos = torch.rand(2, 4) + 0.1
    neg = -torch.rand(2, 4) - 0.1
    methods = {"forward": Method(CondModel().eval(), (pos,))}
    cases = [("forward", (pos,)), ("forward", (neg,)), ("forward", (torch.randn(2, 4),))]
    return Spec(
        "torch.cond(x.sum() > 0, relu(lin(x)) + 1, x*2 - 1): case0 takes the true branch, "
        "case1 the false branch, case2 random.",
        methods,
        cases,
    )


class MultiOut(nn.Module):
    def forward(self, x):
        a = x.relu()
        b = x.sum(dim=-1)
        c = x.argmax(dim=-1)
        d = x > 0
        return a, (b, c), d


@fixture("multi_output")
def _multi_output():
    methods, cases = single(MultiOut(), torch.randn(3, 5), extra_cases=[(torch.randn(3, 5),)])
    return Spec(
        "Several outputs of different shapes/dtypes, nested (a, (b, c), d): relu f32[3,5], "
        "sum f32[3], argmax i64[3], x>0 bool[3,5]. Outputs are the flattened list.",
        methods,
        cases,
    )


class ExtConst(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)
        self.register_buffer("offset", torch.randn(4))

    def forward(self, x):
        return torch.sigmoid(self.lin(x)) + self.offset


@fixture("external_constants")
def _external_constants():
    methods, cases = single(ExtConst().eval(), torch.randn(2, 6), extra_cases=[(torch.randn(2, 6),)])
    return Spec(
        "ExecutorchBackendConfig(external_constants=True): all constants (lin.weight, "
        "lin.bias, offset) live in _default_external_constant.ptd; loading the method "
        "without the .ptd must fail.",
        methods,
        cases,
        backend_config={"external_constants": True},
    )


class XnnModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.lin = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        h = F.relu(self.conv(x))
        h = F.max_pool2d(h, 2)
        h = h.flatten(1)
        return self.lin(h)


@fixture("xnnpack_linear_conv")
def _xnnpack():
    methods, cases = single(XnnModel().eval(), torch.randn(1, 3, 8, 8), extra_cases=[(torch.randn(1, 3, 8, 8),)])
    return Spec(
        "Conv2d+ReLU+MaxPool+flatten+Linear lowered with XnnpackPartitioner via "
        "to_edge_transform_and_lower; weights in the PTE named_data.",
        methods,
        cases,
        lower="xnnpack",
        rtol=1e-4,
        atol=1e-5,
    )


class XnnPartial(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(6, 8)
        self.l2 = nn.Linear(8, 4)

    def forward(self, x):
        h = F.relu(self.l1(x))
        h = torch.cumsum(h, dim=-1)  # not supported by XNNPACK: stays a portable kernel
        return self.l2(h)


@fixture("xnnpack_partial")
def _xnnpack_partial():
    methods, cases = single(XnnPartial().eval(), torch.randn(3, 6), extra_cases=[(torch.randn(3, 6),)])
    return Spec(
        "Partially delegated: Linear+ReLU (XNNPACK) -> cumsum (portable kernel) -> Linear "
        "(XNNPACK); two DelegateCalls around one KernelCall.",
        methods,
        cases,
        lower="xnnpack",
        rtol=1e-4,
        atol=1e-5,
    )


class BundledModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, y):
        return self.lin(x) * y, x.mean()


@fixture("bundled")
def _bundled():
    m = BundledModel().eval()
    ex = (torch.randn(2, 4), torch.randn(2, 3))
    methods = {"forward": Method(m, ex)}
    cases = [("forward", ex), ("forward", (torch.randn(2, 4), torch.randn(2, 3)))]
    return Spec(
        "BundledProgram (.bpte, BP08) wrapping a 2-input/2-output program with 2 test "
        "cases for 'forward'; expected outputs are the upstream runtime outputs; the "
        "manifest cases repeat the bundled test cases.",
        methods,
        cases,
        bundled=True,
    )


class TwoMethods(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 6)
        self.dec = nn.Linear(6, 4)

    def encode(self, x):
        return torch.relu(self.enc(x))

    def decode(self, z):
        return torch.tanh(self.dec(z)) + self.dec.bias


class MethodView(nn.Module):
    def __init__(self, m: nn.Module, name: str):
        super().__init__()
        self.m = m
        self.name = name

    def forward(self, *args):
        return getattr(self.m, self.name)(*args)


@fixture("two_methods")
def _two_methods():
    m = TwoMethods().eval()
    x = torch.randn(3, 4)
    z = torch.randn(3, 6)
    methods = {
        "forward": Method(MethodView(m, "encode"), (x,)),
        "decode": Method(MethodView(m, "decode"), (z,)),
    }
    cases = [
        ("forward", (x,)),
        ("decode", (z,)),
        ("forward", (torch.randn(3, 4),)),
        ("decode", (torch.randn(3, 6),)),
    ]
    return Spec(
        "One program with two methods from two exported programs: forward = relu(enc(x)), "
        "decode = tanh(dec(z)) + dec.bias (dec.bias is shared, deduplicated constant).",
        methods,
        cases,
    )


class TinyBlock(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):  # x: [B, S, D]
        b, s, d = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(d, dim=-1)
        hd = d // self.heads
        q = q.reshape(b, s, self.heads, hd).transpose(1, 2).reshape(b * self.heads, s, hd)
        k = k.reshape(b, s, self.heads, hd).transpose(1, 2).reshape(b * self.heads, s, hd)
        v = v.reshape(b, s, self.heads, hd).transpose(1, 2).reshape(b * self.heads, s, hd)
        att = torch.bmm(q, k.transpose(1, 2)) * (hd ** -0.5)
        att = torch.softmax(att, dim=-1)
        o = torch.matmul(att, v).reshape(b, self.heads, s, hd).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(o)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x


@fixture("transformer_block")
def _transformer_block():
    methods, cases = single(TinyBlock().eval(), torch.randn(1, 8, 16), extra_cases=[(torch.randn(1, 8, 16),)])
    return Spec(
        "Pre-LN transformer block: LayerNorm, fused qkv Linear, 2-head softmax attention "
        "with bmm/matmul, output projection, GELU MLP, residuals; seq 8, d 16.",
        methods,
        cases,
        rtol=1e-4,
        atol=1e-5,
    )


# --------------------------------------------------------------------------------------
# Op fixtures: one fixture per op (or small natural group), each returning a tuple of
# variants.  Inputs are small.
# --------------------------------------------------------------------------------------


@fixture("op_add")
def _op_add():
    a, b = randn(2, 3, 4), randn(3, 1)
    ia, ib = randint(-50, 50, 2, 3), randint(-50, 50, 3)
    ja, jb = randint(-50, 50, 4, dtype=torch.int32), randint(-50, 50, 4, dtype=torch.int32)
    return op_spec(
        "add: broadcasting, alpha, scalar other, int64+int64 broadcast, int32, int64+float "
        "promotion.",
        lambda a, b, ia, ib, ja, jb: (
            a + b,
            torch.add(a, b, alpha=2.0),
            a + 1.5,
            ia + ib,
            torch.add(ia, ib, alpha=3),
            ja + jb,
            ia + a[0, :, 0],
        ),
        a, b, ia, ib, ja, jb,
    )


@fixture("op_sub_rsub")
def _op_sub():
    a, b = randn(2, 3, 4), randn(4)
    ia, ib = randint(-50, 50, 2, 3), randint(-50, 50, 2, 1)
    return op_spec(
        "sub and rsub: broadcast, alpha, scalar, int; rsub tensor and scalar (1 - x). "
        "to_edge decomposes rsub into sub, so only aten::sub.out is emitted.",
        lambda a, b, ia, ib: (
            a - b,
            torch.sub(a, b, alpha=0.5),
            a - 2.0,
            ia - ib,
            torch.rsub(a, b),
            torch.rsub(a, 2.0),
            1.0 - a,
            torch.rsub(ia, ib, alpha=2),
        ),
        a, b, ia, ib,
    )


@fixture("op_mul")
def _op_mul():
    a, b = randn(2, 1, 4), randn(3, 1)
    ia, ib = randint(-20, 20, 3, 4), randint(-20, 20, 4)
    m = torch.rand(3, 4) > 0.5
    return op_spec(
        "mul: broadcast both sides, scalar, int64, float*int promotion, float*bool.",
        lambda a, b, ia, ib, m: (a * b, a * 2.5, ia * ib, b * ia, ia.float() * m, ia * 3),
        a, b, ia, ib, m,
    )


@fixture("op_div")
def _op_div():
    a, b = randn(3, 4) * 5.0, away_from_zero(4)
    ia, ib = randint(-30, 30, 3, 4), nonzero_int(3, 4)
    return op_spec(
        "div: true division (broadcast), rounding_mode floor and trunc on float and int64 "
        "inputs (negative operands), int/int true division -> float, divide by scalar, "
        "floor_divide.",
        lambda a, b, ia, ib: (
            a / b,
            torch.div(a, b, rounding_mode="floor"),
            torch.div(a, b, rounding_mode="trunc"),
            ia / ib,
            torch.div(ia, ib, rounding_mode="floor"),
            torch.div(ia, ib, rounding_mode="trunc"),
            a / 4.0,
            torch.div(a, 3.0, rounding_mode="floor"),
            torch.floor_divide(ia, ib),
        ),
        a, b, ia, ib,
    )


@fixture("op_int_arith")
def _op_int_arith():
    a, b = randint(-1000, 1000, 2, 5), nonzero_int(2, 5, hi=30)
    c, d = randint(-1000, 1000, 5, dtype=torch.int32), nonzero_int(5, dtype=torch.int32, hi=30)
    return op_spec(
        "int64/int32 arithmetic: mul+sub, neg/abs, int32 add, int32*int64 promotion, "
        "sum of int32 -> int64, clamp on int64.",
        lambda a, b, c, d: (
            a * b - a,
            torch.abs(-a),
            c + d,
            c * a,
            c.sum(),
            torch.clamp(a, -100, 100),
        ),
        a, b, c, d,
    )


@fixture("op_remainder")
def _op_remainder():
    # Integer operands of one sign: upstream's integer remainder takes the dividend's
    # sign where PyTorch takes the divisor's (the conformance suite covers that).
    a, b = randint(0, 1000, 2, 5), nonzero_int(2, 5, hi=30).abs()
    x, y = randn(2, 5) * 10, away_from_zero(2, 5) * 3
    return op_spec(
        "remainder (Python semantics: result has the sign of the divisor) and fmod (sign "
        "of the dividend) on int64 (non-negative) and float32 (negative operands too), "
        "scalar divisor.",
        lambda a, b, x, y: (
            torch.remainder(a, b),
            torch.remainder(x, y),
            torch.remainder(x, 3.0),
            torch.fmod(a, b),
            torch.fmod(x, y),
        ),
        a, b, x, y,
        atol=1e-5,
    )


@fixture("op_matmul")
def _op_matmul():
    bias, m1, m2 = randn(5), randn(3, 4), randn(4, 5)
    bias2 = randn(3, 5)
    x, y = randn(2, 3, 4), randn(2, 4, 5)
    return op_spec(
        "addmm (beta/alpha, 1-D and 2-D bias), mm, bmm, matmul 3-D x 2-D.",
        lambda bias, m1, m2, bias2, x, y: (
            torch.addmm(bias, m1, m2, beta=0.5, alpha=2.0),
            torch.addmm(bias2, m1, m2),
            torch.mm(m1, m2),
            torch.bmm(x, y),
            torch.matmul(x, m2),
        ),
        bias, m1, m2, bias2, x, y,
        rtol=1e-5,
        atol=1e-5,
    )


class Conv1dOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 6, 3, stride=2, padding=1)
        self.c2 = nn.Conv1d(4, 6, 3, dilation=2, groups=2, bias=False)

    def forward(self, x):
        return self.c1(x), self.c2(x)


@fixture("op_conv1d")
def _op_conv1d():
    methods, cases = single(Conv1dOps().eval(), randn(2, 4, 15))
    return Spec("conv1d: stride 2 + padding 1 with bias; dilation 2, groups 2, no bias.", methods, cases, rtol=1e-4, atol=1e-5)


class Conv2dOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2, bias=False)
        self.c3 = nn.Conv2d(4, 8, (3, 2), stride=(1, 2), padding=(1, 0), groups=4)
        self.c4 = nn.Conv2d(4, 3, 1)

    def forward(self, x):
        return self.c1(x), self.c2(x), self.c3(x), self.c4(x)


@fixture("op_conv2d")
def _op_conv2d():
    methods, cases = single(Conv2dOps().eval(), randn(2, 4, 9, 9))
    return Spec(
        "conv2d: stride 2/pad 1; dilation 2/pad 2/groups 2/no bias; non-square kernel "
        "(3,2) with stride (1,2), padding (1,0), depthwise-multiplier groups 4; 1x1. Batch 2, odd size.",
        methods,
        cases,
        rtol=1e-4,
        atol=1e-5,
    )


@fixture("op_max_pool2d")
def _op_max_pool2d():
    x = randn(1, 2, 9, 9)
    return op_spec(
        "max_pool2d: k3 s2 p1; k2 (stride defaults to kernel); k3 s2 ceil_mode; "
        "return_indices (int64 indices).",
        lambda x: (
            F.max_pool2d(x, 3, stride=2, padding=1),
            F.max_pool2d(x, 2),
            F.max_pool2d(x, 3, stride=2, ceil_mode=True),
            *F.max_pool2d(x, 2, stride=2, padding=1, return_indices=True),
        ),
        x,
    )


@fixture("op_avg_pool2d")
def _op_avg_pool2d():
    x = randn(1, 2, 9, 9)
    return op_spec(
        "avg_pool2d: k3 s2 p1 (count_include_pad default True), same with "
        "count_include_pad=False, ceil_mode=True, divisor_override.",
        lambda x: (
            F.avg_pool2d(x, 3, stride=2, padding=1),
            F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
            F.avg_pool2d(x, 2, stride=2, ceil_mode=True),
            F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
            F.avg_pool2d(x, 2, divisor_override=3),
        ),
        x,
    )


@fixture("op_adaptive_avg_pool2d")
def _op_adaptive_avg_pool2d():
    x = randn(1, 2, 7, 11)
    return op_spec(
        "adaptive_avg_pool2d with non-divisible output sizes (7x11 -> 3x5, -> 4x4), "
        "and output (1,1).",
        lambda x: (
            F.adaptive_avg_pool2d(x, (3, 5)),
            F.adaptive_avg_pool2d(x, 4),
            F.adaptive_avg_pool2d(x, 1),
        ),
        x,
    )


@fixture("op_reduce")
def _op_reduce():
    x = randn(2, 3, 4)
    ix = randint(-10, 10, 3, 4, dtype=torch.int32)
    return op_spec(
        "mean/sum/amax with negative dims, multiple dims, keepdim, full reductions, "
        "sum of int32 (-> int64), amax of int.",
        lambda x, ix: (
            x.mean(dim=-1, keepdim=True),
            x.mean(dim=(0, 2)),
            x.mean(),
            x.sum(dim=1),
            x.sum(dim=(-1, -2), keepdim=True),
            x.sum(),
            torch.amax(x, dim=-2),
            torch.amax(x, dim=(0, 2), keepdim=True),
            ix.sum(dim=0),
            torch.amax(ix, dim=1),
        ),
        x, ix,
    )


@fixture("op_relu_clamp")
def _op_relu_clamp():
    x = randn(3, 5) * 2
    lo, hi = randn(5) - 1.0, randn(3, 1) + 1.0
    ix = randint(-10, 10, 3, 5)
    return op_spec(
        "relu, hardtanh (default and custom bounds), clamp with scalar min/max, min only, "
        "max only, tensor min/max (broadcast), clamp on int64.",
        lambda x, lo, hi, ix: (
            F.relu(x),
            F.hardtanh(x),
            F.hardtanh(x, -0.5, 0.25),
            x.clamp(min=-0.5, max=0.5),
            x.clamp(min=0.1),
            x.clamp(max=-0.1),
            torch.clamp(x, min=lo, max=hi),
            ix.clamp(-3, 4),
            F.relu(ix),
        ),
        x, lo, hi, ix,
    )


@fixture("op_activation")
def _op_activation():
    x = randn(4, 6) * 3
    return op_spec(
        "gelu (approximate none and tanh), sigmoid, tanh, hardswish, silu. to_edge "
        "decomposes hardswish (add/clamp/div/mul) and silu (sigmoid*x).",
        lambda x: (
            F.gelu(x),
            F.gelu(x, approximate="tanh"),
            torch.sigmoid(x),
            torch.tanh(x),
            F.hardswish(x),
            F.silu(x),
        ),
        x,
        atol=1e-5,
    )


@fixture("op_unary_math")
def _op_unary_math():
    x = randn(3, 4)
    p = positive(3, 4)
    e = torch.rand(4) * 2
    return op_spec(
        "exp, log, sqrt, rsqrt, neg, abs, pow tensor-scalar (2, 0.5, -1, 3 on signed), "
        "pow tensor-tensor (broadcast), pow scalar-tensor.",
        lambda x, p, e: (
            torch.exp(x),
            torch.log(p),
            torch.sqrt(p),
            torch.rsqrt(p),
            -x,
            torch.abs(x),
            torch.pow(x, 2),
            torch.pow(p, 0.5),
            torch.pow(p, -1.0),
            x ** 3,
            torch.pow(p, e),
            torch.pow(2.0, x),
        ),
        x, p, e,
        atol=1e-5,
    )


@fixture("op_softmax")
def _op_softmax():
    x = randn(2, 3, 5) * 3
    return op_spec(
        "softmax over dim -1 and 0, log_softmax over dim 1 and -1.",
        lambda x: (
            torch.softmax(x, dim=-1),
            torch.softmax(x, dim=0),
            torch.log_softmax(x, dim=1),
            F.log_softmax(x, dim=-1),
        ),
        x,
    )


class NormOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.bn2 = nn.BatchNorm2d(3)
        self.bn1 = nn.BatchNorm1d(4)
        with torch.no_grad():
            self.ln.weight.copy_(torch.rand(8) + 0.5)
            self.ln.bias.copy_(torch.randn(8))
            for bn, c in ((self.bn2, 3), (self.bn1, 4)):
                bn.running_mean.copy_(torch.randn(c))
                bn.running_var.copy_(torch.rand(c) + 0.2)
                bn.weight.copy_(torch.rand(c) + 0.5)
                bn.bias.copy_(torch.randn(c))

    def forward(self, x, img, seq):
        return (
            self.ln(x),
            F.layer_norm(x, (3, 8)),
            F.layer_norm(x, (8,), eps=1e-2),
            self.bn2(img),
            self.bn1(seq),
        )


@fixture("op_norm")
def _op_norm():
    methods, cases = single(NormOps().eval(), randn(2, 3, 8) * 2 + 1, randn(2, 3, 4, 5), randn(2, 4, 6))
    return Spec(
        "layer_norm (affine over last dim; no affine over last 2 dims; eps 1e-2) and "
        "batch_norm in eval mode (BatchNorm2d, BatchNorm1d on N,C,L) with non-trivial stats.",
        methods,
        cases,
        atol=1e-5,
    )


@fixture("op_shape")
def _op_shape():
    x = randn(2, 3, 4)
    y = randn(3, 1)
    return op_spec(
        "permute, transpose, view/reshape (incl. -1), flatten, expand (incl. -1 and new "
        "leading dim), contiguous after permute, t().",
        lambda x, y: (
            x.permute(2, 0, 1),
            x.transpose(-1, -2) + 0.0,
            x.view(6, 4),
            x.reshape(-1, 12),
            x.permute(1, 0, 2).reshape(3, 8),
            torch.flatten(x, 1),
            y.expand(3, 5),
            y.expand(2, -1, 4),
            y.t() * 1.0,
        ),
        x, y,
    )


@fixture("op_cat_stack")
def _op_cat_stack():
    a, b, c = randn(2, 3), randn(1, 3), randn(2, 5)
    ia, ib = randint(0, 9, 2, 2), randint(0, 9, 2, 1)
    return op_spec(
        "cat along dim 0 and -1 (different sizes), int64 cat, stack along a new dim 1.",
        lambda a, b, c, ia, ib: (
            torch.cat([a, b], dim=0),
            torch.cat([a, c, a], dim=-1),
            torch.cat((ia, ib), dim=1),
            torch.stack([a, a * 2], dim=1),
        ),
        a, b, c, ia, ib,
    )


@fixture("op_slice_select")
def _op_slice_select():
    x = randn(4, 6, 5)
    return op_spec(
        "slice with step, negative start, slice to end; select with positive and "
        "negative index/dim; narrow.",
        lambda x: (
            x[:, 1:5:2],
            x[..., -3:],
            x[1:, :, ::3],
            x[1],
            x.select(-1, 2),
            x[:, -1],
            x.narrow(1, 2, 3),
        ),
        x,
    )


@fixture("op_split")
def _op_split():
    x = randn(4, 6, 5)
    return op_spec(
        "split_with_sizes [2,3,1] on dim 1, chunk(3, dim=-1) (uneven: 2,2,1), split(3, dim=0), "
        "unbind(0).",
        lambda x: (
            *torch.split(x, [2, 3, 1], dim=1),
            *torch.chunk(x, 3, dim=-1),
            *torch.split(x, 3, dim=0),
            *torch.unbind(x[:, :2], dim=1),
        ),
        x,
    )


@fixture("op_squeeze_unsqueeze")
def _op_squeeze():
    x = randn(1, 3, 1, 4)
    return op_spec(
        "squeeze(dim), squeeze(-2), squeeze() all size-1 dims, unsqueeze(0), unsqueeze(-1).",
        lambda x: (
            x.squeeze(0),
            x.squeeze(-2),
            x.squeeze(),
            x.unsqueeze(0),
            x.unsqueeze(-1),
        ),
        x,
    )


@fixture("op_clone_convert")
def _op_clone_convert():
    x = randn(3, 4) * 5
    ix = randint(-3, 4, 3, 4)
    b = torch.rand(3, 4) > 0.5
    return op_spec(
        "clone and dtype conversions: f32->i32/i64 (truncation), i64->f32, f32->bool, "
        "i64->bool, bool->f32, bool->i64, f32->f16, f32->f64, i64->i32.",
        lambda x, ix, b: (
            x.clone(),
            x.to(torch.int32),
            x.to(torch.int64),
            ix.to(torch.float32),
            x.to(torch.bool),
            ix.to(torch.bool),
            b.to(torch.float32),
            b.long(),
            x.half(),
            x.double(),
            ix.int(),
        ),
        x, ix, b,
    )


@fixture("op_creation")
def _op_creation():
    x = randn(2, 3)
    ix = randint(0, 5, 4)
    return op_spec(
        "full, full_like (float and int), zeros, ones, zeros_like, ones_like, arange (int "
        "end-only, int start/end/step, float step) combined with the inputs.",
        lambda x, ix: (
            x + torch.full((2, 3), 1.5),
            torch.full_like(x, 7.0),
            torch.full_like(ix, -2),
            x * torch.zeros(2, 3) + torch.ones(3),
            torch.zeros_like(ix) + ix,
            torch.ones_like(x) - x,
            ix + torch.arange(4),
            torch.arange(1, 10, 3),
            torch.arange(0.5, 3.0, 0.5),
            torch.full((2,), True),
        ),
        x, ix,
    )


@fixture("op_where")
def _op_where():
    c = torch.rand(3, 4) > 0.5
    a, b = randn(3, 4), randn(4)
    ia, ib = randint(-5, 5, 3, 4), randint(-5, 5, 3, 4)
    return op_spec(
        "where: broadcasting, scalar other, condition computed from input, int64 operands.",
        lambda c, a, b, ia, ib: (
            torch.where(c, a, b),
            torch.where(a > 0, a, 0.0),
            torch.where(c, ia, ib),
            torch.where(b < 0, 1.0, a),
        ),
        c, a, b, ia, ib,
    )


@fixture("op_compare")
def _op_compare():
    a = torch.round(randn(3, 4) * 2) / 2
    b = torch.round(randn(4) * 2) / 2
    ia, ib = randint(-3, 3, 3, 4), randint(-3, 3, 3, 4, dtype=torch.int32)
    return op_spec(
        "eq/ne/gt/ge/lt/le: tensor-tensor (broadcast, with ties), tensor-scalar, int64 vs "
        "int32, int vs float scalar.",
        lambda a, b, ia, ib: (
            a == b,
            a != b,
            a > b,
            a >= b,
            a < b,
            a <= b,
            a == 0.5,
            a != 0.0,
            a > -0.5,
            a >= 0.0,
            a < 1.0,
            a <= 0.5,
            ia == ib,
            ia > ib,
            ia <= 1,
            ia < 0.5,
        ),
        a, b, ia, ib,
    )


@fixture("op_logical_any")
def _op_logical_any():
    b = torch.rand(3, 4) > 0.7
    x = torch.round(randn(3, 4))
    z = torch.zeros(2, 3, dtype=torch.bool)
    return op_spec(
        "logical_not on bool and float, any() full, any(dim) with keepdim, any on float "
        "and on all-false input, logical_and/or.",
        lambda b, x, z: (
            torch.logical_not(b),
            torch.logical_not(x),
            torch.any(b),
            torch.any(b, dim=1),
            torch.any(b, dim=-2, keepdim=True),
            torch.any(x),
            torch.any(z),
            torch.logical_and(b, x > 0),
            torch.logical_or(b, z[:1, :1]),
        ),
        b, x, z,
    )


@fixture("op_cumsum")
def _op_cumsum():
    x = randn(3, 5)
    ix = randint(-5, 5, 3, 5, dtype=torch.int32)
    return op_spec(
        "cumsum along dim 1, dim -2, on int32 (-> int64 by default), with dtype=float64.",
        lambda x, ix: (
            torch.cumsum(x, dim=1),
            torch.cumsum(x, dim=-2),
            torch.cumsum(ix, dim=1),
            torch.cumsum(ix, dim=0, dtype=torch.float64),
        ),
        x, ix,
    )


@fixture("op_topk")
def _op_topk():
    x = torch.randperm(24).reshape(4, 6).float() / 4.0
    return op_spec(
        "topk: k=3 dim -1 largest, k=2 dim 0 smallest, unsorted-ties-free input (values and "
        "int64 indices).",
        lambda x: (
            *torch.topk(x, 3, dim=-1),
            *torch.topk(x, 2, dim=0, largest=False),
        ),
        x,
    )


@fixture("op_max_argmax")
def _op_max_argmax():
    x = randn(3, 5)
    ix = randint(-100, 100, 3, 5)
    return op_spec(
        "max.dim (values + indices) with keepdim, min.dim, argmax over dim -1, keepdim, "
        "full argmax (flattened), argmax on int64, argmin, max() full reduction.",
        lambda x, ix: (
            *torch.max(x, dim=1),
            *torch.max(x, dim=0, keepdim=True),
            *torch.min(x, dim=-1),
            torch.argmax(x, dim=-1),
            torch.argmax(x, dim=0, keepdim=True),
            torch.argmax(x),
            torch.argmax(ix, dim=1),
            torch.argmin(x, dim=1),
            torch.max(x),
        ),
        x, ix,
    )


class EmbeddingOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, idx, idx32):
        return self.emb(idx), self.emb(idx32)


@fixture("op_embedding")
def _op_embedding():
    methods, cases = single(EmbeddingOp().eval(), randint(0, 10, 2, 3), randint(0, 10, 5, dtype=torch.int32))
    return Spec("embedding with int64 [2,3] and int32 [5] indices.", methods, cases)


@fixture("op_index")
def _op_index():
    x = randn(5, 4, 3)
    i = torch.tensor([4, 0, 2, 2], dtype=torch.int64)
    j = torch.tensor([[1, 3], [0, -1]], dtype=torch.int64)
    return op_spec(
        "index.Tensor (advanced indexing): x[i], x[:, j] (2-D index, negative entry), "
        "x[i, i % 4] (two broadcast indices), gather-like index_select.",
        lambda x, i, j: (
            x[i],
            x[:, j],
            x[i, i % 4],
            torch.index_select(x, 1, i % 4),
        ),
        x, i, j,
    )


@fixture("op_index_put_copy")
def _op_index_put_copy():
    x = randn(5, 3)
    idx = torch.tensor([3, 0, 1], dtype=torch.int64)
    v = randn(3, 3)
    r = randn(5, 2)
    return op_spec(
        "index_put (y[idx] = v), index_put with accumulate=True and repeated indices, "
        "copy_ into a slice (slice_scatter), select assignment, masked_fill.",
        lambda x, idx, v, r: _index_put_body(x, idx, v, r),
        x, idx, v, r,
    )


def _index_put_body(x, idx, v, r):
    a = x.clone()
    a[idx] = v
    b = torch.index_put(x, (torch.tensor([1, 1, 4]),), v, accumulate=True)
    c = x.clone()
    c[:, 1:3].copy_(r)
    d = x.clone()
    d[2] = 0.0
    e = x.masked_fill(x > 0.5, -1.0)
    return a, b, c, d, e


@fixture("op_pad")
def _op_pad():
    x = randn(1, 2, 3, 4)
    return op_spec(
        "constant_pad_nd via F.pad: last dim (1,2); last two dims (1,1,2,0) with value 0.5.",
        # DROPPED: negative padding F.pad(x, (-1, 1)) exports but the upstream portable
        # constant_pad_nd kernel rejects it at run time (error 0x12 InvalidArgument).
        lambda x: (
            F.pad(x, (1, 2)),
            F.pad(x, (1, 1, 2, 0), value=0.5),
        ),
        x,
    )


@fixture("op_upsample_nearest")
def _op_upsample():
    x = randn(1, 2, 3, 4)
    return op_spec(
        "upsample_nearest2d via F.interpolate: scale_factor 2 and explicit size (5, 7).",
        lambda x: (
            F.interpolate(x, scale_factor=2, mode="nearest"),
            F.interpolate(x, size=(5, 7), mode="nearest"),
        ),
        x,
    )


@fixture("op_half")
def _op_half():
    a, b = randn(3, 4, dtype=torch.float16), randn(4, dtype=torch.float16)
    return op_spec(
        "float16 add/mul/relu (broadcast) and f16 -> f32 conversion.",
        lambda a, b: (a + b, a * b, F.relu(a), (a + b).float()),
        a, b,
        rtol=1e-3,
        atol=1e-3,
    )


@fixture("op_empty")
def _op_empty():
    e = randn(0, 4)
    x = randn(2, 4)
    return op_spec(
        "tensors with a zero-size dim: elementwise add on [0,4], sum over the empty dim "
        "(-> zeros [4]), cat of [0,4] with [2,4], mean over the non-empty dim.",
        lambda e, x: (e + 1.0, e.sum(dim=0), torch.cat([e, x], dim=0), e.mean(dim=1)),
        e, x,
    )


# --------------------------------------------------------------------------------------
# Bench models (not committed)
# --------------------------------------------------------------------------------------


# Bench model builders by name, for tools/bench_side_by_side.py (which exports the same
# models, with the same seed, to ONNX).
BENCH_MODELS: Dict[str, Callable[[], Tuple[nn.Module, torch.Tensor]]] = {}


def _bench_pair(register_name: str, build: Callable[[], Tuple[nn.Module, torch.Tensor]], desc: str):
    BENCH_MODELS[register_name] = build
    for lower in ("portable", "xnnpack"):

        def make(lower=lower):
            # Same seed for both versions: identical weights and inputs.
            torch.manual_seed(seed_for(register_name))
            m, x = build()
            methods, cases = single(m, x)
            return Spec(f"{desc} ({lower}).", methods, cases, lower=lower, rtol=1e-3, atol=1e-3)

        BENCH_REGISTRY[f"{register_name}_{lower}"] = make


def _calibrate_bn(model: nn.Module) -> nn.Module:
    # Random init leaves BatchNorm at mean 0 / var 1, which makes activations vanish
    # (mobilenet_v2 outputs ~1e-9).  Estimate running stats from two random batches.
    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
            mod.momentum = None  # cumulative average
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(4, 3, 224, 224))
    return model.eval()


def _mobilenet():
    import torchvision

    return _calibrate_bn(torchvision.models.mobilenet_v2(weights=None)), torch.randn(1, 3, 224, 224)


def _resnet18():
    import torchvision

    return _calibrate_bn(torchvision.models.resnet18(weights=None)), torch.randn(1, 3, 224, 224)


def _transformer_encoder():
    torch.backends.mha.set_fastpath_enabled(False)
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
    enc = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    # TransformerEncoder deep-copies `layer`, so all layers start identical (and their
    # constants would be deduplicated); give every layer its own random weights.
    for mod in enc.modules():
        if isinstance(mod, nn.MultiheadAttention):
            mod._reset_parameters()
        elif isinstance(mod, nn.Linear):
            mod.reset_parameters()
    return enc.eval(), torch.randn(1, 64, 256)


def _efficientnet_b0():
    import torchvision

    return _calibrate_bn(torchvision.models.efficientnet_b0(weights=None)), torch.randn(1, 3, 224, 224)


def _vit_tiny():
    # ViT-Tiny/16 (DeiT-Ti sizes): 12 layers, hidden 192, 3 heads, MLP 768.
    from torchvision.models.vision_transformer import VisionTransformer

    torch.backends.mha.set_fastpath_enabled(False)
    vit = VisionTransformer(
        image_size=224, patch_size=16, num_layers=12, num_heads=3, hidden_dim=192, mlp_dim=768
    )
    # torchvision starts the classifier head at zero, so every output would be 0 and
    # comparing outputs would check nothing: give it random weights too.
    nn.init.normal_(vit.heads.head.weight, std=0.05)
    nn.init.normal_(vit.heads.head.bias, std=0.05)
    return vit.eval(), torch.randn(1, 3, 224, 224)


class _DecoderBlock(nn.Module):
    def __init__(self, d: int, heads: int, ff: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class _DecoderLM(nn.Module):
    """A GPT-style decoder-only language model: token and position embeddings, pre-norm
    blocks with causal attention, a language-model head."""

    def __init__(self, vocab=8192, d=256, heads=4, ff=1024, layers=4, context=128):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(_DecoderBlock(d, heads, ff) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def _decoder_lm():
    return _DecoderLM().eval(), torch.randint(0, 8192, (1, 128))


_bench_pair("mobilenet_v2", _mobilenet, "torchvision mobilenet_v2, random weights, eval, 1x3x224x224")
_bench_pair("resnet18", _resnet18, "torchvision resnet18, random weights, eval, 1x3x224x224")
_bench_pair(
    "transformer_encoder",
    _transformer_encoder,
    "nn.TransformerEncoder d_model=256 nhead=4 4 layers ff=1024 batch_first, eval, 1x64x256",
)
_bench_pair("efficientnet_b0", _efficientnet_b0, "torchvision efficientnet_b0, random weights, eval, 1x3x224x224")
_bench_pair("vit_tiny", _vit_tiny, "ViT-Tiny/16 (torchvision VisionTransformer), random weights, eval, 1x3x224x224")
_bench_pair(
    "decoder_lm",
    _decoder_lm,
    "GPT-style decoder-only LM: vocab 8192, d=256, 4 heads, 4 layers, ff 1024, causal, 1x128 tokens",
)


# Other common architectures, to check that speed is general rather than tuned to the
# six above. Not generated by default: name them with --only (both lowerings), then
# time them with `bench_side_by_side.py --only NAME`.
EXTRA_CLASSIFIERS = [
    "mobilenet_v3_small",
    "mobilenet_v3_large",
    "shufflenet_v2_x1_0",
    "regnet_y_400mf",
    "mnasnet1_0",
    "squeezenet1_1",
    "googlenet",
    "densenet121",
    "resnet50",
    "convnext_tiny",
    "resnext50_32x4d",
    "regnet_x_400mf",
    "efficientnet_v2_s",
    "swin_t",
    "vgg16",
    "alexnet",
    "wide_resnet50_2",
    "inception_v3",
    "maxvit_t",
]


def _torchvision(name: str):
    def build():
        import torchvision

        kwargs = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
        model = getattr(torchvision.models, name)(weights=None, **kwargs)
        return _calibrate_bn(model), torch.randn(1, 3, 224, 224)

    return build


for _name in EXTRA_CLASSIFIERS:
    _bench_pair(_name, _torchvision(_name), f"torchvision {_name}, random weights, eval, 1x3x224x224")


# Segmentation networks: dilated convolutions and bilinear upsampling, which no
# classifier above has. Their dict output is reduced to the "out" tensor.
EXTRA_SEGMENTATION = [
    "lraspp_mobilenet_v3_large",
    "deeplabv3_mobilenet_v3_large",
    "fcn_resnet50",
]


class _SegmentationOut(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


def _segmentation(name: str):
    def build():
        import torchvision

        model = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None)
        return _SegmentationOut(_calibrate_bn(model)), torch.randn(1, 3, 224, 224)

    return build


for _name in EXTRA_SEGMENTATION:
    _bench_pair(_name, _segmentation(_name), f"torchvision segmentation {_name}, random weights, eval, 1x3x224x224")



# Shapes no network above has, after the models upstream's own examples name: 1-D
# convolutions over audio (wav2letter), full-resolution 3x3 convolutions ending in a
# pixel shuffle (EDSR super-resolution) and a recurrent network (LSTM).
class _Wav2Letter(nn.Module):
    """Wav2Letter on raw audio (Collobert et al., 2016), torchaudio's layer sizes."""

    def __init__(self, classes=40):
        super().__init__()
        spec = [(1, 250, 250, 160, 45), (250, 250, 48, 2, 23)] + [(250, 250, 7, 1, 3)] * 7
        spec += [(250, 2000, 32, 1, 16), (2000, 2000, 1, 1, 0), (2000, classes, 1, 1, 0)]
        layers = []
        for cin, cout, k, s, p in spec:
            layers += [nn.Conv1d(cin, cout, k, stride=s, padding=p), nn.ReLU()]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return F.log_softmax(self.net(x), dim=1)


class _EdsrBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return x + self.b(F.relu(self.a(x)))


class _Edsr(nn.Module):
    """EDSR baseline (Lim et al., 2017): 16 residual blocks of 64 channels, x2 upscaling
    by a pixel shuffle."""

    def __init__(self, c=64, blocks=16, scale=2):
        super().__init__()
        self.head = nn.Conv2d(3, c, 3, padding=1)
        self.body = nn.Sequential(*(_EdsrBlock(c) for _ in range(blocks)), nn.Conv2d(c, c, 3, padding=1))
        self.up = nn.Sequential(nn.Conv2d(c, c * scale * scale, 3, padding=1), nn.PixelShuffle(scale))
        self.tail = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x):
        h = self.head(x)
        return self.tail(self.up(h + self.body(h)))


class _Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(input_size=64, hidden_size=128, num_layers=2, batch_first=True)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y)


_bench_pair(
    "wav2letter",
    lambda: (_Wav2Letter().eval(), torch.randn(1, 1, 16000)),
    "Wav2Letter on raw audio (conv1d, torchaudio's sizes), 40 classes, random weights, 1x1x16000",
)
_bench_pair(
    "edsr",
    lambda: (_Edsr().eval(), torch.randn(1, 3, 64, 64)),
    "EDSR baseline x2 (16 blocks, 64 channels, pixel shuffle), random weights, 1x3x64x64",
)
_bench_pair(
    "lstm",
    lambda: (_Lstm().eval(), torch.randn(1, 32, 64)),
    "2-layer LSTM (64 -> 128, batch_first) and a linear head, random weights, 1x32x64",
)
class _MixerBlock(nn.Module):
    def __init__(self, tokens, d):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.t1, self.t2 = nn.Linear(tokens, 2 * tokens), nn.Linear(2 * tokens, tokens)
        self.c1, self.c2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.t2(F.gelu(self.t1(self.n1(x).transpose(1, 2)))).transpose(1, 2)
        return x + self.c2(F.gelu(self.c1(self.n2(x))))


class _MlpMixer(nn.Module):
    """MLP-Mixer-like (Tolstikhin et al., 2021): 16x16 patches, 8 blocks mixing the 196
    tokens and the 256 channels in turn."""

    def __init__(self, d=256, blocks=8):
        super().__init__()
        self.stem = nn.Conv2d(3, d, 16, 16)
        self.blocks = nn.Sequential(*(_MixerBlock(196, d) for _ in range(blocks)))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 1000)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


class _ConformerBlock(nn.Module):
    def __init__(self, d=256, heads=4, k=31):
        super().__init__()

        def ff():
            return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))

        self.ff1, self.ff2 = ff(), ff()
        self.norm_att, self.att = nn.LayerNorm(d), nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm_conv, self.pw1 = nn.LayerNorm(d), nn.Conv1d(d, 2 * d, 1)
        self.dw, self.bn = nn.Conv1d(d, d, k, padding=k // 2, groups=d), nn.BatchNorm1d(d)
        self.pw2, self.norm_out = nn.Conv1d(d, d, 1), nn.LayerNorm(d)

    def forward(self, x):
        x = x + 0.5 * self.ff1(x)
        y = self.norm_att(x)
        x = x + self.att(y, y, y, need_weights=False)[0]
        y = F.glu(self.pw1(self.norm_conv(x).transpose(1, 2)), dim=1)
        x = x + self.pw2(F.silu(self.bn(self.dw(y)))).transpose(1, 2)
        return self.norm_out(x + 0.5 * self.ff2(x))


class _Conformer(nn.Module):
    """Conformer-like speech encoder (Gulati et al., 2020): two strided 3x3 convolutions
    over 80 mel bins, then 4 blocks (feed-forward halves, attention, a GLU and a
    depthwise 1-d convolution of 31 taps)."""

    def __init__(self):
        super().__init__()
        self.sub = nn.Sequential(nn.Conv2d(1, 64, 3, 2), nn.ReLU(), nn.Conv2d(64, 64, 3, 2), nn.ReLU())
        self.proj = nn.Linear(64 * 19, 256)
        self.blocks = nn.Sequential(*(_ConformerBlock() for _ in range(4)))

    def forward(self, x):
        y = self.sub(x)
        b, c, t, f = y.shape
        return self.blocks(self.proj(y.transpose(1, 2).reshape(b, t, c * f)))


class _Gru(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(80, 256, num_layers=2, batch_first=True)
        self.head = nn.Linear(256, 30)

    def forward(self, x):
        return self.head(self.gru(x)[0])


class _Tcn(nn.Module):
    """Temporal convolutional network (Bai et al., 2018): causal 1-d convolutions (zeros
    padded on the left), dilations 1, 2, 4, 8 twice, residual additions."""

    def __init__(self, c=128, blocks=8):
        super().__init__()
        self.inp = nn.Conv1d(40, c, 1)
        self.convs = nn.ModuleList(nn.Conv1d(c, c, 3, dilation=2 ** (i % 4)) for i in range(blocks))
        self.out = nn.Conv1d(c, 10, 1)

    def forward(self, x):
        x = self.inp(x)
        for i, conv in enumerate(self.convs):
            x = x + F.relu(conv(F.pad(x, (2 * 2 ** (i % 4), 0))))
        return self.out(x)


class _UNet(nn.Module):
    """UNet (Ronneberger et al., 2015) of three levels, 32 channels at the top: 3x3
    convolutions with batch normalization, max pooling down, 2x2 transposed
    convolutions up, the encoder's maps concatenated in."""

    def __init__(self, c=32):
        super().__init__()

        def block(i, o):
            return nn.Sequential(
                nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
                nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
            )

        self.e1, self.e2, self.e3, self.mid = block(3, c), block(c, 2 * c), block(2 * c, 4 * c), block(4 * c, 8 * c)
        self.u3, self.d3 = nn.ConvTranspose2d(8 * c, 4 * c, 2, 2), block(8 * c, 4 * c)
        self.u2, self.d2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, 2), block(4 * c, 2 * c)
        self.u1, self.d1 = nn.ConvTranspose2d(2 * c, c, 2, 2), block(2 * c, c)
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(F.max_pool2d(a, 2))
        c = self.e3(F.max_pool2d(b, 2))
        m = self.mid(F.max_pool2d(c, 2))
        c = self.d3(torch.cat([self.u3(m), c], 1))
        b = self.d2(torch.cat([self.u2(c), b], 1))
        return self.out(self.d1(torch.cat([self.u1(b), a], 1)))


class _MobileVitBlock(nn.Module):
    def __init__(self, c, d, layers, p=2):
        super().__init__()
        self.p = p
        self.local1, self.local2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, d, 1)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, batch_first=True, activation="gelu", norm_first=True)
        self.transformer = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.fuse1, self.fuse2 = nn.Conv2d(d, c, 1), nn.Conv2d(2 * c, c, 3, padding=1)

    def forward(self, x):
        y = self.local2(F.silu(self.local1(x)))
        b, d, h, w = y.shape
        p = self.p
        # Patches of p x p: the transformer runs over the p*p pixel positions as a batch.
        y = y.reshape(b, d, h // p, p, w // p, p).permute(0, 3, 5, 2, 4, 1).reshape(b * p * p, -1, d)
        y = self.transformer(y)
        y = y.reshape(b, p, p, h // p, w // p, d).permute(0, 5, 3, 1, 4, 2).reshape(b, d, h, w)
        return self.fuse2(torch.cat([x, F.silu(self.fuse1(y))], 1))


class _MobileVit(nn.Module):
    """MobileViT-like (Mehta and Rastegari, 2022): a convolutional stem, then two blocks
    that run transformers over 2x2-patch positions (a batch of 4 sequences)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1), nn.SiLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.SiLU(),
            nn.Conv2d(64, 96, 3, 2, 1), nn.SiLU(),
        )
        self.vit1 = _MobileVitBlock(96, 144, 2)
        self.down = nn.Sequential(nn.Conv2d(96, 128, 3, 2, 1), nn.SiLU())
        self.vit2 = _MobileVitBlock(128, 192, 4)
        self.head = nn.Linear(128, 1000)

    def forward(self, x):
        return self.head(self.vit2(self.down(self.vit1(self.stem(x)))).mean((2, 3)))


class _GptPrefill(nn.Module):
    """GPT-like prompt processing: 4 pre-norm layers (d=512, 8 heads, causal mask) over 128
    tokens, the next-token logits of the last one (vocabulary 8000)."""

    def __init__(self, d=512, heads=8, layers=4, vocab=8000, t=128):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(t, d) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True, activation="gelu", norm_first=True)
            for _ in range(layers)
        )
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((t, t), float("-inf")), 1))

    def forward(self, tokens):
        x = self.emb(tokens) + self.pos
        for layer in self.layers:
            x = layer(x, src_mask=self.mask)
        return self.head(self.norm(x[:, -1]))


_bench_pair("mlp_mixer", lambda: (_MlpMixer().eval(), torch.randn(1, 3, 224, 224)),
            "MLP-Mixer-like (8 blocks, d=256, 196 tokens), random weights, 1x3x224x224")
_bench_pair("conformer", lambda: (_Conformer().eval(), torch.randn(1, 1, 400, 80)),
            "Conformer-like encoder (4 blocks, d=256), random weights, 1x1x400x80 (mel bins last)")
_bench_pair("gru", lambda: (_Gru().eval(), torch.randn(1, 50, 80)),
            "2-layer GRU (80 -> 256, batch_first) and a linear head, random weights, 1x50x80")
_bench_pair("tcn", lambda: (_Tcn().eval(), torch.randn(1, 40, 1000)),
            "TCN (8 causal dilated blocks of 128 channels), random weights, 1x40x1000")
_bench_pair("unet", lambda: (_UNet().eval(), torch.randn(1, 3, 128, 128)),
            "UNet of three levels (32-256 channels), random weights, eval, 1x3x128x128")
_bench_pair("mobilevit", lambda: (_MobileVit().eval(), torch.randn(1, 3, 256, 256)),
            "MobileViT-like (conv stem, two transformer blocks over 2x2 patches), random weights, 1x3x256x256")
_bench_pair("gpt_prefill", lambda: (_GptPrefill().eval(), torch.randint(0, 8000, (1, 128))),
            "GPT-like prompt of 128 tokens (4 layers, d=512, causal), random weights, logits of the last")
EXTRA_OTHER = ["wav2letter", "edsr", "lstm", "mlp_mixer", "conformer", "gru", "tcn", "unet", "mobilevit",
               "gpt_prefill"]

EXTRA_BENCH = EXTRA_CLASSIFIERS + EXTRA_SEGMENTATION + EXTRA_OTHER


# --------------------------------------------------------------------------------------
# Export, run upstream, write
# --------------------------------------------------------------------------------------


def seed_for(name: str) -> int:
    return zlib.crc32(name.encode())


def export_program(spec: Spec):
    eps = {}
    for mname, m in spec.methods.items():
        eps[mname] = torch.export.export(m.module, m.example, dynamic_shapes=m.dynamic_shapes, strict=False)
    ep_arg = eps if len(eps) > 1 or "forward" not in eps else eps["forward"]
    edge_cfg = EdgeCompileConfig(**spec.edge_config)
    if spec.lower == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        edge = to_edge_transform_and_lower(ep_arg, partitioner=[XnnpackPartitioner()], compile_config=edge_cfg)
    else:
        edge = to_edge(ep_arg, compile_config=edge_cfg)
    return edge.to_executorch(ExecutorchBackendConfig(**spec.backend_config))


def to_runtime_input(v):
    if isinstance(v, torch.Tensor):
        return v.contiguous()
    return v


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


def to_numpy(v) -> np.ndarray:
    k = kind_of(v)
    if k == "tensor":
        return v.detach().cpu().contiguous().numpy().copy(order="C")  # keeps 0-d shape
    return np.array(v, dtype={"bool": np.bool_, "int": np.int64, "float": np.float64}[k])


def flatten_eager(out) -> List[Any]:
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return leaves


def compare(a, b, rtol, atol) -> Optional[float]:
    """Max abs diff if `a` (upstream) and `b` (eager) disagree, else None."""
    na, nb = to_numpy(a), to_numpy(b)
    if na.shape != nb.shape or na.dtype != nb.dtype:
        return float("inf")
    if na.dtype.kind in "fc":
        na64, nb64 = na.astype(np.float64), nb.astype(np.float64)
        if np.allclose(na64, nb64, rtol=rtol * 10, atol=atol * 10, equal_nan=True):
            return None
        return float(np.nanmax(np.abs(na64 - nb64))) if na.size else 0.0
    return None if np.array_equal(na, nb) else float("nan")


def sha256_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def save_npy(path: Path, arr: np.ndarray) -> None:
    arr = arr.copy(order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    with open(path, "wb") as f:
        np.save(f, arr, allow_pickle=False)


def build_fixture(name: str, make: Callable[[], Spec], out_root: Path) -> Dict[str, Any]:
    t0 = time.time()
    torch.manual_seed(seed_for(name))
    np.random.seed(seed_for(name) % (2**32))
    spec = make()
    # Eager reference copies before export touches anything.
    eager = {k: copy.deepcopy(m.module) for k, m in spec.methods.items()}

    et = export_program(spec)
    fdir = out_root / name
    if fdir.exists():
        shutil.rmtree(fdir)
    fdir.mkdir(parents=True)

    data_files: List[str] = []
    pte_path = fdir / "model.pte"
    with open(pte_path, "wb") as f:
        f.write(et.buffer)
    if spec.backend_config.get("external_constants"):
        et.write_tensor_data_to_file(str(fdir))
        data_files = sorted(p.name for p in fdir.glob("*.ptd"))
        assert data_files, "external_constants produced no .ptd"

    plan_ops: Dict[str, List[str]] = {}
    plan_delegates: Dict[str, List[str]] = {}
    for plan in et.executorch_program.execution_plan:
        plan_ops[plan.name] = sorted(
            {o.name + ("." + o.overload if o.overload else "") for o in plan.operators}
        )
        plan_delegates[plan.name] = [d.id for d in plan.delegates]

    data_paths = [fdir / d for d in data_files]
    module = _load_for_executorch(str(pte_path), str(data_paths[0]) if data_paths else None)
    assert len(data_paths) <= 1

    expect_error_without_data = False
    if data_paths:
        try:
            m2 = _load_for_executorch(str(pte_path))
            m2.run_method("forward", [to_runtime_input(v) for v in spec.cases[0][1]])
        except Exception:
            expect_error_without_data = True
        assert expect_error_without_data, "program with external data ran without the .ptd"

    cases_json = []
    mismatches = []
    for ci, (mname, inputs) in enumerate(spec.cases):
        outs = module.run_method(mname, [to_runtime_input(v) for v in inputs])
        outs = list(outs)
        with torch.no_grad():
            eager_outs = flatten_eager(eager[mname](*inputs))
        case_mismatch = False
        if len(eager_outs) != len(outs):
            mismatches.append(f"case{ci}: {len(outs)} outputs vs eager {len(eager_outs)}")
        else:
            for oi, (u, e) in enumerate(zip(outs, eager_outs)):
                d = compare(u, e, spec.rtol, spec.atol)
                if d is not None:
                    case_mismatch = True
                    mismatches.append(f"case{ci} output {oi}: max|upstream-eager|={d}")

        cdir = fdir / f"case{ci}"
        cdir.mkdir()
        eager_paths = []
        if case_mismatch:
            # Upstream disagrees with eager PyTorch: keep the eager result too.
            for oi, v in enumerate(eager_outs):
                save_npy(cdir / f"eager_output_{oi}.npy", to_numpy(v))
                eager_paths.append(f"{name}/case{ci}/eager_output_{oi}.npy")
        in_paths, out_paths = [], []
        for ii, v in enumerate(inputs):
            p = cdir / f"input_{ii}.npy"
            save_npy(p, to_numpy(v))
            in_paths.append(f"{name}/case{ci}/input_{ii}.npy")
        for oi, v in enumerate(outs):
            p = cdir / f"output_{oi}.npy"
            save_npy(p, to_numpy(v))
            out_paths.append(f"{name}/case{ci}/output_{oi}.npy")
        case = {"method": mname, "inputs": in_paths, "outputs": out_paths}
        if eager_paths:
            case["eager_outputs"] = eager_paths
        ik = [kind_of(v) for v in inputs]
        ok = [kind_of(v) for v in outs]
        if any(k != "tensor" for k in ik):
            case["input_kinds"] = ik
        if any(k != "tensor" for k in ok):
            case["output_kinds"] = ok
        cases_json.append(case)

    program_rel = f"{name}/model.pte"
    if spec.bundled:
        program_rel = f"{name}/model.bpte"
        write_bundled(et, spec, fdir, cases_json, out_root)
        pte_path.unlink()

    for msg in mismatches:
        print(f"  WARNING {name}: upstream differs from eager: {msg}", file=sys.stderr)

    entry = {
        "name": name,
        "program": program_rel,
        "data": [f"{name}/{d}" for d in data_files],
        "description": spec.description,
        "methods": list(spec.methods.keys()),
        "lowering": spec.lower,
        "delegates": plan_delegates,
        "operators": plan_ops,
        "cases": cases_json,
        "sequential": spec.sequential,
        "expect_error_without_data": expect_error_without_data,
        "bundled": spec.bundled,
        "tolerance": {"rtol": spec.rtol, "atol": spec.atol},
        "sha256": {
            rel: sha256_file(out_root / rel) for rel in [program_rel] + [f"{name}/{d}" for d in data_files]
        },
    }
    if mismatches:
        entry["upstream_differs_from_eager"] = mismatches
    print(f"  {name}: {len(spec.cases)} cases, {time.time() - t0:.1f}s", file=sys.stderr)
    return entry


def write_bundled(et, spec: Spec, fdir: Path, cases_json, out_root: Path) -> None:
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    suites: Dict[str, List[MethodTestCase]] = {}
    for (mname, inputs), case in zip(spec.cases, cases_json):
        expected = [torch.from_numpy(np.load(out_root / p)) for p in case["outputs"]]
        suites.setdefault(mname, []).append(MethodTestCase(inputs=list(inputs), expected_outputs=expected))
    bp = BundledProgram(et, [MethodTestSuite(method_name=k, test_cases=v) for k, v in suites.items()])
    data = serialize_from_bundled_program_to_flatbuffer(bp)
    (fdir / "model.bpte").write_bytes(data)
    # Verify in the upstream runtime.
    bundle = _load_bundled_program_from_buffer(data)
    mod = _load_for_executorch_from_bundled_program(bundle)
    assert set(mod.method_names()) == set(spec.methods)
    for mname, tcs in suites.items():
        for i in range(len(tcs)):
            # Loads the bundled inputs, executes, and raises on mismatch.
            bundle.verify_result_with_bundled_expected_output(mname, i)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", metavar="DIR", help="generate the large, not committed bench models into DIR")
    ap.add_argument("--only", metavar="NAME[,NAME]", help="regenerate only these fixtures")
    args = ap.parse_args(argv)

    registry = BENCH_REGISTRY if args.bench else REGISTRY
    out_root = Path(args.bench).resolve() if args.bench else FIXTURE_DIR
    names = list(registry)
    if args.bench and not args.only:
        names = [n for n in names if n.rsplit("_", 1)[0] not in EXTRA_BENCH]
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in registry]
        if unknown:
            ap.error(f"unknown fixture(s): {unknown}; known: {names}")
        names = [n for n in names if n in wanted]

    out_root.mkdir(parents=True, exist_ok=True)
    manifest_path = out_root / "manifest.json"
    entries: Dict[str, Any] = {}
    if args.only and manifest_path.exists():
        for e in json.loads(manifest_path.read_text())["fixtures"]:
            entries[e["name"]] = e
    else:
        # Full regeneration: drop fixture directories that are no longer registered.
        for p in out_root.iterdir():
            if p.is_dir() and p.name not in registry:
                shutil.rmtree(p)

    t0 = time.time()
    failed = []
    for n in names:
        try:
            entries[n] = build_fixture(n, registry[n], out_root)
        except Exception as e:  # report all failures, then exit nonzero
            import traceback

            traceback.print_exc(limit=-3)
            print(f"  FAILED {n}: {type(e).__name__}: {str(e)[:2000]}", file=sys.stderr)
            failed.append(n)
            entries.pop(n, None)

    manifest = {
        "generator": "tools/gen_fixtures.py" + (" --bench" if args.bench else ""),
        "executorch": EXPECTED_VERSIONS["executorch"],
        "torch": EXPECTED_VERSIONS["torch"],
        "fixtures": [entries[n] for n in registry if n in entries],
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(names) - len(failed)} fixture(s) to {out_root} in {time.time() - t0:.1f}s", file=sys.stderr)
    if failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
