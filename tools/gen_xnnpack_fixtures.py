#!/usr/bin/env python3
"""Generate the XNNPACK-delegated fixtures: programs lowered with upstream's
XnnpackPartitioner (float, fp16, statically and dynamically quantized, 4-bit
groupwise, weights in a .ptd), run in upstream's runtime, with their inputs and
upstream's outputs, written to ``tests/xnnpack/`` with a ``manifest.json`` in the
layout of ``tests/fixtures/`` (see ``tools/README.md``).

    .venv-ref/bin/python tools/gen_xnnpack_fixtures.py              # all
    .venv-ref/bin/python tools/gen_xnnpack_fixtures.py --only xnn_convnet,xnn_int8_static
    .venv-ref/bin/python tools/gen_xnnpack_fixtures.py --models DIR  # large models, not committed

``--models DIR`` writes mobilenet_v2, resnet18 and the transformer encoder of the
benchmark set, lowered to XNNPACK in float and statically quantized to int8, in the
same layout; ``PTE_XNNPACK_MODELS=DIR cargo test --release -p pte-xnnpack --test
fixtures`` runs them. The other architectures of ``gen_fixtures.EXTRA_BENCH``
(``regnet_y_400mf_xnnpack_fp32``, ``..._int8``, ...) are written only when named
with ``--only``: a check on models the default set does not name.

Same reference environment and seeding as ``tools/gen_fixtures.py`` (whose helpers
this script uses): every fixture seeds torch and numpy with crc32(name) before
building its module and inputs; nothing is downloaded.

Tolerances: float programs rtol 1e-4 / atol 1e-5 (XNNPACK sums in another order);
fp16 programs rtol and atol 1e-2 (one fp16 rounding per node); statically quantized
programs one quantization step of the output (its dequantization scale, recorded as
``atol``); dynamically quantized ones rtol / atol 1e-2 (an input that lands on
another rounding step of the dynamic quantization moves an output by a weight's
step).
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_fixtures as gf  # noqa: E402  (checks the pinned versions on import)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.export import Dim  # noqa: E402

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: E402
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "xnnpack"


@dataclass
class XSpec:
    description: str
    module: nn.Module
    example: Tuple[Any, ...]
    # More inputs to run (same shapes unless dynamic_shapes allows others).
    extra: List[Tuple[Any, ...]] = field(default_factory=list)
    dynamic_shapes: Any = None
    # None | "static" (PT2E, XNNPACKQuantizer, per channel) | "dynamic" (PT2E, dynamic
    # per-channel linear) | "int4" (torchao 8-bit dynamic activations, 4-bit groupwise)
    quant: Optional[str] = None
    # Convert module and float inputs to this dtype first.
    dtype: torch.dtype = torch.float32
    # Tag delegated constants to a .ptd file.
    ptd: bool = False
    # Statically quantized outputs must equal upstream's quantized values (half a step)
    # instead of coming within one step.
    exact: bool = False
    rtol: float = 1e-4
    atol: float = 1e-5


REGISTRY: Dict[str, Callable[[], XSpec]] = {}
MODELS: Dict[str, Callable[[], XSpec]] = {}


def fixture(name: str, registry=REGISTRY):
    def deco(fn):
        registry[name] = fn
        return fn

    return deco


# --------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------


def quantize_pt2e(module: nn.Module, example, dynamic: bool, dynamic_shapes) -> nn.Module:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    )
    graph = torch.export.export(module, example, dynamic_shapes=dynamic_shapes, strict=False).module()
    prepared = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        prepared(*example)  # calibration
    return convert_pt2e(prepared)


def quantize_int4(module: nn.Module) -> nn.Module:
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup, quantize_
    from torchao.utils import unwrap_tensor_subclass

    with torch.no_grad():
        quantize_(
            module,
            Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)),
            filter_fn=lambda m, fqn: isinstance(m, nn.Linear),
        )
    return unwrap_tensor_subclass(module)


def output_steps(graph: torch.fx.GraphModule) -> List[float]:
    """Scales of the dequantizations that produce the graph's outputs."""
    steps = []
    out = next(n for n in graph.graph.nodes if n.op == "output")
    for arg in torch.utils._pytree.tree_flatten(out.args[0])[0]:
        if isinstance(arg, torch.fx.Node) and "dequantize_per_tensor" in str(arg.target):
            steps.append(float(arg.args[1]))
    return steps


def export(spec: XSpec):
    module = spec.module.eval()
    example = spec.example
    steps: List[float] = []
    if spec.quant in ("static", "dynamic"):
        module = quantize_pt2e(module, example, spec.quant == "dynamic", spec.dynamic_shapes)
        if spec.quant == "static":
            steps = output_steps(module)
    elif spec.quant == "int4":
        module = quantize_int4(module)
    # Tags on constants survive re-export only in strict mode.
    ep = torch.export.export(module, example, dynamic_shapes=spec.dynamic_shapes, strict=spec.ptd)
    if spec.ptd:
        from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted

        tagged = ep.module()
        delegate_external_constants_pass_unlifted(module=tagged, gen_tag_fn=lambda _: "model")
        ep = torch.export.export(tagged, example, dynamic_shapes=spec.dynamic_shapes, strict=True)
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    return edge.to_executorch(ExecutorchBackendConfig()), module, steps


def cast(v, dtype):
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.to(dtype)
    return v


def build(name: str, make: Callable[[], XSpec], out_root: Path) -> Dict[str, Any]:
    t0 = time.time()
    torch.manual_seed(gf.seed_for(name))
    np.random.seed(gf.seed_for(name) % (2**32))
    spec = make()
    if spec.dtype != torch.float32:
        spec.module = spec.module.to(spec.dtype)
        spec.example = tuple(cast(v, spec.dtype) for v in spec.example)
        spec.extra = [tuple(cast(v, spec.dtype) for v in e) for e in spec.extra]
    eager = copy.deepcopy(spec.module).eval()
    et, _, steps = export(spec)

    fdir = out_root / name
    if fdir.exists():
        shutil.rmtree(fdir)
    fdir.mkdir(parents=True)
    pte_path = fdir / "model.pte"
    pte_path.write_bytes(et.buffer)
    data_files: List[str] = []
    if spec.ptd:
        et.write_tensor_data_to_file(str(fdir))
        data_files = sorted(p.name for p in fdir.glob("*.ptd"))
        assert data_files, "no .ptd written"
    plan = et.executorch_program.execution_plan[0]
    operators = sorted({o.name + ("." + o.overload if o.overload else "") for o in plan.operators})
    delegates = [d.id for d in plan.delegates]
    assert "XnnpackBackend" in delegates, f"{name}: nothing was delegated"
    data_paths = [str(fdir / d) for d in data_files]
    module = gf._load_for_executorch(str(pte_path), data_paths[0] if data_paths else None)

    cases = []
    for ci, inputs in enumerate([spec.example] + spec.extra):
        outs = list(module.run_method("forward", [gf.to_runtime_input(v) for v in inputs]))
        with torch.no_grad():
            eager_outs = gf.flatten_eager(eager(*inputs))
        cdir = fdir / f"case{ci}"
        cdir.mkdir()
        in_paths, out_paths = [], []
        for ii, v in enumerate(inputs):
            gf.save_npy(cdir / f"input_{ii}.npy", gf.to_numpy(v))
            in_paths.append(f"{name}/case{ci}/input_{ii}.npy")
        for oi, v in enumerate(outs):
            gf.save_npy(cdir / f"output_{oi}.npy", gf.to_numpy(v))
            out_paths.append(f"{name}/case{ci}/output_{oi}.npy")
        for oi, (u, e) in enumerate(zip(outs, eager_outs)):
            d = gf.compare(u, e, 1e-2, 1e-2)
            if d is not None and spec.quant is None:
                print(f"  note {name} case{ci} output {oi}: max|upstream-eager| = {d}", file=sys.stderr)
        cases.append({"method": "forward", "inputs": in_paths, "outputs": out_paths})

    rtol, atol = spec.rtol, spec.atol
    if spec.quant == "static" and steps:
        rtol, atol = 0.0, max(steps) * (0.5 if spec.exact else 1.001)
    elif spec.quant == "static":
        # The outputs come from float nodes after the last dequantization (a
        # transformer's final layer norm): the spec's float tolerances.
        print(f"  note {name}: outputs are not dequantized; rtol {rtol}, atol {atol}", file=sys.stderr)
    entry = {
        "name": name,
        "program": f"{name}/model.pte",
        "data": [f"{name}/{d}" for d in data_files],
        "description": spec.description,
        "methods": ["forward"],
        "lowering": "xnnpack",
        "quantization": spec.quant or ("fp16" if spec.dtype == torch.float16 else "none"),
        "delegates": {"forward": delegates},
        "operators": {"forward": operators},
        "cases": cases,
        "sequential": False,
        "expect_error_without_data": bool(data_files),
        "bundled": False,
        "tolerance": {"rtol": rtol, "atol": atol},
        "sha256": {rel: gf.sha256_file(out_root / rel) for rel in [f"{name}/model.pte"] + [f"{name}/{d}" for d in data_files]},
    }
    print(f"  {name}: {len(cases)} cases, {time.time() - t0:.1f}s", file=sys.stderr)
    return entry


# --------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------


class ConvNet(nn.Module):
    """Convolutions of every kind the partitioner lowers, with fused activations, pooling,
    a residual add and a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16), nn.ReLU6())
        self.dw2 = nn.Conv2d(16, 32, 3, padding=1, groups=16)  # channel multiplier 2
        self.pw = nn.Sequential(nn.Conv2d(32, 32, 1), nn.Hardswish())
        self.grouped = nn.Conv2d(32, 32, 3, padding=2, dilation=2, groups=4)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.up = nn.ConvTranspose2d(32, 8, 3, stride=2, padding=1, output_padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = self.stem(x)
        x = self.dw(x)
        x = self.pw(self.dw2(x))
        x = x + torch.relu(self.grouped(x))
        x = self.avg(self.pool(x))
        x = self.up(x)
        x = x.mean(dim=[2, 3], keepdim=True).flatten(1)
        return torch.sigmoid(self.head(x))


def _calibrate(m: nn.Module, *inputs) -> nn.Module:
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
            mod.momentum = None
    m.train()
    with torch.no_grad():
        for x in inputs:
            m(x)
    return m.eval()


@fixture("xnn_convnet")
def _convnet():
    m = _calibrate(ConvNet(), torch.randn(4, 3, 32, 32))
    return XSpec(
        "fp32 conv net: conv+BN+ReLU, depthwise (multiplier 1 and 2), pointwise+hardswish, "
        "dilated grouped conv, residual add, max and average pooling, transposed conv, mean, "
        "linear+sigmoid.",
        m,
        (torch.randn(1, 3, 32, 32),),
        extra=[(torch.randn(1, 3, 32, 32) * 3,)],
    )


@fixture("xnn_convnet_f16")
def _convnet_f16():
    m = _calibrate(ConvNet(), torch.randn(4, 3, 32, 32))
    return XSpec(
        "The fp32 conv net's layers in fp16 (model and inputs converted).",
        m,
        (torch.randn(1, 3, 32, 32),),
        dtype=torch.float16,
        rtol=1e-2,
        atol=1e-2,
    )


class LinearClamp(nn.Module):
    """The seed program of ExecuTorch's export tutorial."""

    def __init__(self):
        super().__init__()
        self.param = nn.Parameter(torch.rand(3, 4))
        self.linear = nn.Linear(4, 5)

    def forward(self, x):
        return self.linear(x + self.param).clamp(min=0.0, max=1.0)


@fixture("xnn_linear_clamp")
def _linear_clamp():
    return XSpec(
        "The seed module linear(x + param).clamp(0, 1) lowered to XNNPACK.",
        LinearClamp(),
        (torch.randn(3, 4),),
        extra=[(torch.randn(3, 4) * 2,)],
    )


class Block(nn.Module):
    """A pre-norm transformer block: attention with a causal mask, GELU MLP."""

    def __init__(self, d=32, heads=4, ff=64):
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


@fixture("xnn_transformer_block")
def _transformer_block():
    return XSpec(
        "Pre-norm transformer block (causal attention, GELU MLP), d=32, 4 heads, 1x8 tokens.",
        Block(),
        (torch.randn(1, 8, 32),),
        extra=[(torch.randn(1, 8, 32),)],
    )


class QuantNet(nn.Module):
    """What XNNPACKQuantizer quantizes: convolutions, linear, add, mul, pooling, cat,
    hardtanh/relu."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.c3 = nn.Conv2d(16, 16, 1)
        self.fc1 = nn.Linear(32, 24)
        self.fc2 = nn.Linear(24, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        y = F.hardtanh(self.c2(x), 0.0, 6.0)
        x = x + self.c3(y)
        x = F.max_pool2d(x, 2)
        x = torch.cat([x, F.avg_pool2d(x, 1)], dim=1)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


@fixture("xnn_int8_static")
def _int8_static():
    return XSpec(
        "PT2E static int8 (XNNPACKQuantizer, per-channel weights): conv, depthwise conv, "
        "relu/hardtanh, add, max pool, cat, mean, linear.",
        QuantNet(),
        (torch.randn(1, 3, 16, 16),),
        extra=[(torch.randn(1, 3, 16, 16),)],
        quant="static",
    )


class Means(nn.Module):
    """Global means of 8-bit values on four scales, as pooling and as mean."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(8, 128, 1) for _ in range(4))
        with torch.no_grad():
            for c, f in zip(self.convs, (0.3, 1.0, 3.1, 9.7)):
                c.weight.mul_(f)

    def forward(self, x):
        ys = [F.relu(c(x)) for c in self.convs]
        pooled = [F.adaptive_avg_pool2d(y, 1) for y in ys[:2]]
        means = [y.mean(dim=(2, 3), keepdim=True) for y in ys[2:]]
        return torch.cat(pooled + means, dim=1)


@fixture("xnn_int8_means")
def _int8_means():
    return XSpec(
        "PT2E static int8 global means (adaptive_avg_pool2d and mean over 14x14) on four "
        "scales; quantized outputs must equal upstream's exactly: a mean halfway between "
        "two steps rounds as XNNPACK's sum reduction does.",
        Means(),
        (torch.randn(1, 8, 14, 14),),
        extra=[(torch.randn(1, 8, 14, 14),) for _ in range(5)],
        quant="static",
        exact=True,
    )


class Gates(nn.Module):
    """Per-channel terms repeated over 8-bit pixels: a squeeze-excitation gate (mean,
    two 1x1 convolutions, sigmoid, product with the pixels), a transformed channel
    mean added back (on its own scale), and a product with the row second."""

    def __init__(self):
        super().__init__()
        from torchvision.ops.misc import SqueezeExcitation

        self.conv = nn.Conv2d(3, 24, 3, padding=1)
        self.se = SqueezeExcitation(24, 8)
        self.p1, self.p2, self.p3 = (nn.Conv2d(24, 16, 1) for _ in range(3))
        self.p4 = nn.Conv2d(24, 24, 1)

    def forward(self, x):
        y = F.relu(self.conv(x))
        y = self.se(y)
        g = y.mean(dim=(2, 3), keepdim=True)
        return self.p1(self.p4(g) + y) + self.p2(y) * self.p3(g)


@fixture("xnn_int8_gates")
def _int8_gates():
    m = _calibrate(Gates(), torch.randn(4, 3, 12, 12))
    return XSpec(
        "PT2E static int8 products and sums of 24-channel pixels with a per-channel "
        "row (squeeze-excitation gate, channel mean added), the row as either operand; "
        "quantized outputs must equal upstream's exactly.",
        m,
        (torch.randn(1, 3, 12, 12),),
        extra=[(torch.randn(1, 3, 12, 12) * 2,)],
        quant="static",
        exact=True,
    )


class Mlp(nn.Module):
    def __init__(self, dims=(64, 128, 96, 32)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


@fixture("xnn_int8_dynamic")
def _int8_dynamic():
    return XSpec(
        "Linear layers dynamically quantized (int8 activations per row, per-channel int8 "
        "weights) by XNNPACKQuantizer through PT2E.",
        Mlp(),
        (torch.randn(4, 64),),
        extra=[(torch.randn(4, 64) * 4,)],
        quant="dynamic",
        rtol=1e-2,
        atol=1e-2,
    )


@fixture("xnn_int4_groupwise")
def _int4():
    return XSpec(
        "Linear layers with int8 dynamic activations and 4-bit weights in groups of 32 "
        "(torchao Int8DynamicActivationIntxWeightConfig).",
        Mlp((64, 128, 64)),
        (torch.randn(3, 64),),
        extra=[(torch.randn(3, 64),)],
        quant="int4",
        rtol=1e-2,
        atol=1e-2,
    )


@fixture("xnn_ptd")
def _ptd():
    return XSpec(
        "Conv and linear with the delegate's weights in a .ptd file (delegate_constant_tag).",
        nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5)),
        (torch.randn(1, 3, 8, 8),),
        ptd=True,
    )


@fixture("xnn_dynamic_batch")
def _dynamic_batch():
    batch = Dim("batch", min=1, max=8)
    return XSpec(
        "Linear + relu + linear with a dynamic batch dimension (upper bound 8), run at 2, 5 "
        "and 8 rows.",
        Mlp((16, 24, 8)),
        (torch.randn(2, 16),),
        extra=[(torch.randn(5, 16),), (torch.randn(8, 16),)],
        dynamic_shapes=({0: batch},),
    )


def _inverted_residual(c: int, e: int, k: int = 3, stride: int = 1, act=nn.ReLU6) -> nn.Sequential:
    h = c * e
    return nn.Sequential(
        nn.Conv2d(c, h, 1), nn.BatchNorm2d(h), act(),
        nn.Conv2d(h, h, k, stride, k // 2, groups=h), nn.BatchNorm2d(h), act(),
    )


class InvertedResiduals(nn.Module):
    """Inverted residual blocks as mobilenet_v2 and efficientnet build them (pointwise
    expansion, depthwise, pointwise projection, residual addition), which pte runs as
    one node band by band: with ReLU6 and SiLU, 3x3 and 5x5, stride 1 and 2, a
    24-row image (split into bands at 2 threads) and a 6-row one (run layer by layer
    at 2 threads), a block without a projection whose depthwise output is read twice
    (a squeeze-excitation gate), and one whose projection is not added."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.e1, self.p1 = _inverted_residual(8, 4), nn.Conv2d(32, 8, 1)
        self.e2, self.p2 = _inverted_residual(8, 3, k=5, act=nn.SiLU), nn.Conv2d(24, 8, 1)
        self.e3, self.p3 = _inverted_residual(8, 3, stride=2), nn.Conv2d(24, 12, 1)
        self.e4 = _inverted_residual(12, 2, stride=2, act=nn.SiLU)
        self.gate = nn.Linear(24, 24)
        self.p4 = nn.Conv2d(24, 12, 1)
        self.e5, self.p5 = _inverted_residual(12, 4), nn.Conv2d(48, 12, 1)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.p1(self.e1(x))
        x = self.p2(self.e2(x)) + x
        x = self.p3(self.e3(x))
        z = self.e4(x)
        z = z * torch.sigmoid(self.gate(z.mean(dim=[2, 3])))[:, :, None, None]
        x = self.p4(z)
        return x + self.p5(self.e5(x))


@fixture("xnn_inverted_residual")
def _inverted_residuals():
    m = _calibrate(InvertedResiduals(), torch.randn(4, 3, 24, 24))
    return XSpec(
        "Inverted residual blocks (expand, depthwise, project, residual add): ReLU6 and "
        "SiLU, 3x3 and 5x5, strides 1 and 2, 24- and 6-row images, a gated block.",
        m,
        (torch.randn(1, 3, 24, 24),),
    )


class SiluNet(nn.Module):
    """SiLU after a convolution, a depthwise convolution and a linear layer (fused into
    their epilogues by pte), on a graph input, and on a value read twice."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 6)

    def forward(self, x):
        y = F.silu(self.conv(x))
        z = self.dw(y)
        z = z * torch.sigmoid(z) + z
        p = F.silu(self.fc(z.mean(dim=[2, 3])))
        return p, x * torch.sigmoid(x)


@fixture("xnn_silu")
def _silu():
    return XSpec(
        "SiLU (as x * sigmoid(x) and F.silu) after conv, depthwise conv and linear, on an "
        "input, and on a value with another reader.",
        SiluNet(),
        (torch.randn(1, 4, 9, 9) * 2,),
    )


class Unary(nn.Module):
    def forward(self, x, p):
        return (
            torch.abs(x),
            torch.neg(x),
            x * x,
            torch.sqrt(p),
            torch.rsqrt(p),
            torch.floor(x),
            torch.ceil(x),
            torch.exp(x),
            torch.log(p),
            torch.sin(x),
            torch.cos(x),
            torch.tanh(x),
            torch.sigmoid(x),
            F.gelu(x),
            F.hardswish(x),
            F.elu(x, alpha=0.7),
            F.leaky_relu(x, 0.1),
            F.relu(x),
            F.hardtanh(x, -0.5, 0.75),
            torch.clamp(x, min=-1.0),
        )


@fixture("xnn_ops_unary")
def _unary():
    return XSpec(
        "Every unary node: abs, negate, square, sqrt, rsqrt, floor, ceil, exp, log, sin, cos, "
        "tanh, sigmoid, gelu, hardswish, elu, leaky relu, relu, hardtanh, clamp.",
        Unary(),
        (torch.randn(2, 3, 17) * 2, torch.rand(2, 3, 17) + 0.05),
    )


@fixture("xnn_ops_unary_f16")
def _unary_f16():
    return XSpec(
        "The unary nodes in fp16.",
        Unary(),
        (torch.randn(2, 3, 17) * 2, torch.rand(2, 3, 17) + 0.05),
        dtype=torch.float16,
        rtol=1e-2,
        atol=1e-2,
    )


class Binary(nn.Module):
    def __init__(self):
        super().__init__()
        self.prelu = nn.PReLU(6)

    def forward(self, a, b, c, d):
        return (
            a + b,
            a - c,
            a * d,
            a / (b.abs() + 0.5),
            torch.minimum(a, c),
            torch.maximum(a, d),
            torch.relu(a + b),
            self.prelu(a),
        )


@fixture("xnn_ops_binary")
def _binary():
    return XSpec(
        "Binary nodes with broadcasting (same shape, per-channel, scalar-like, rank "
        "extension), fused relu, PReLU.",
        Binary(),
        (torch.randn(2, 6, 5, 4), torch.randn(2, 6, 5, 4), torch.randn(6, 1, 1), torch.randn(4)),
    )


class Shapes(nn.Module):
    def forward(self, x, y):
        a = x.permute(0, 2, 3, 1)
        b = x.reshape(2, 4, -1)
        c = x[:, 1:3, :, 2:5]
        d = torch.cat([x, x * 2], dim=1)
        e = torch.cat([x, y, x, y, x], dim=3)
        f = torch.cat([x, y, x], dim=2)
        g = torch.cat([x, y, y, x], dim=0)
        h = F.pad(x, (1, 2, 0, 1), value=0.5)
        i = torch.softmax(x, dim=-1)
        j = torch.bmm(b, b.transpose(1, 2))
        k = torch.matmul(x, y.transpose(2, 3))
        return a, b, c, d, e, f, g, h, i, j, k


@fixture("xnn_ops_shape")
def _shapes():
    return XSpec(
        "Data movement and matrix nodes: permute, reshape, slice, concatenate of 2 to 5 "
        "inputs, constant pad, softmax, batch matmul, matmul of two activations.",
        Shapes(),
        (torch.randn(2, 4, 3, 6), torch.randn(2, 4, 3, 6)),
    )


class Spatial(nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=4)
        self.deconv = nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1)
        self.deconv_g = nn.ConvTranspose2d(4, 4, 3, stride=1, padding=0)

    def forward(self, x):
        return (
            F.max_pool2d(x, 3, stride=2, padding=1),
            F.max_pool2d(x, 2, stride=1, dilation=2),
            F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
            F.interpolate(x, size=(13, 7), mode="bilinear", align_corners=False),
            F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=True),
            torch.amax(x, dim=2, keepdim=True),
            torch.max(x, dim=3, keepdim=True)[0],
            x.mean(dim=[2, 3], keepdim=True),
            self.dw(x),
            self.deconv(x),
            self.deconv_g(x),
        )


@fixture("xnn_ops_spatial")
def _spatial():
    return XSpec(
        "Spatial nodes: max pooling (padding, dilation), average pooling (padding "
        "excluded), bilinear resize (half-pixel and align-corners), amax and max over a "
        "dimension (max pooling), mean (global average pooling), depthwise conv with "
        "multiplier 2, transposed convs.",
        Spatial(),
        (torch.randn(1, 4, 10, 9),),
    )


@fixture("xnn_ops_spatial_f16")
def _spatial_f16():
    return XSpec(
        "The spatial nodes in fp16.",
        Spatial(),
        (torch.randn(1, 4, 10, 9),),
        dtype=torch.float16,
        rtol=1e-2,
        atol=1e-2,
    )


# Large models for the on-demand comparison (--models DIR), not committed.


def _bench(name: str, quant: Optional[str]):
    def make():
        torch.manual_seed(gf.seed_for(name))
        m, x = gf.BENCH_MODELS[name]()
        return XSpec(
            f"{name} lowered to XNNPACK ({quant or 'fp32'}).",
            m,
            (x,),
            quant=quant,
            rtol=1e-3,
            atol=1e-3,
        )

    return make


for _n in ("mobilenet_v2", "resnet18", "transformer_encoder", *gf.EXTRA_BENCH):
    MODELS[f"{_n}_xnnpack_fp32"] = _bench(_n, None)
    MODELS[f"{_n}_xnnpack_int8"] = _bench(_n, "static")


def _is_extra(name: str) -> bool:
    """The other architectures of gen_fixtures.EXTRA_BENCH, written only when named."""
    return name.rsplit("_xnnpack_", 1)[0] in gf.EXTRA_BENCH


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated fixture names")
    ap.add_argument("--models", metavar="DIR", help="write the large models into DIR instead")
    args = ap.parse_args()
    registry = MODELS if args.models else REGISTRY
    out_root = Path(args.models).resolve() if args.models else OUT_DIR
    names = list(registry)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in registry]
        if unknown:
            ap.error(f"unknown fixture(s): {unknown}; known: {names}")
        names = [n for n in names if n in wanted]
    else:
        names = [n for n in names if not _is_extra(n)]
    out_root.mkdir(parents=True, exist_ok=True)
    manifest_path = out_root / "manifest.json"
    entries: Dict[str, Any] = {}
    if manifest_path.exists():
        for e in json.loads(manifest_path.read_text())["fixtures"]:
            if e["name"] in registry:
                entries[e["name"]] = e
    if not args.only:
        for p in out_root.iterdir():
            if p.is_dir() and p.name not in registry:
                shutil.rmtree(p)
    failed = []
    for n in names:
        try:
            entries[n] = build(n, registry[n], out_root)
        except Exception as e:  # report all failures, then exit nonzero
            import traceback

            traceback.print_exc(limit=-4)
            print(f"  FAILED {n}: {type(e).__name__}: {str(e)[:2000]}", file=sys.stderr)
            failed.append(n)
    manifest = {
        "generator": "tools/gen_xnnpack_fixtures.py" + (" --models" if args.models else ""),
        "executorch": gf.EXPECTED_VERSIONS["executorch"],
        "torch": gf.EXPECTED_VERSIONS["torch"],
        "fixtures": [entries[n] for n in registry if n in entries],
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    if failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
