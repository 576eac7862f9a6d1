#!/usr/bin/env python3
"""Generate the torch.export archives (.pt2) that `pte compile` is tested on.

Every fixture is a small module exported with plain PyTorch (`torch.export.export`, then
`torch.export.save`, or `package_pt2` for several methods), written to
``tests/fixtures/pt2/<name>/model.pt2`` with inputs and *eager PyTorch* outputs as .npy
files, and described in ``tests/fixtures/pt2/manifest.json`` (the layout of
``tests/fixtures/manifest.json``). Nothing here uses ExecuTorch: the archives are what a
user without it would have. `crates/pte-compiler/tests/fixtures.rs` compiles each archive
and compares pte's outputs with the recorded ones; `tools/check_pt2_upstream.py` runs the
compiled programs in upstream's runtime.

Reference environment (pinned; the script refuses other versions): see
tools/gen_fixtures.py.

    .venv-ref/bin/python tools/gen_pt2_fixtures.py                  # committed fixtures
    .venv-ref/bin/python tools/gen_pt2_fixtures.py --only lstm,cond
    .venv-ref/bin/python tools/gen_pt2_fixtures.py --models DIR     # torchvision models and a
                                                                    # transformer encoder, not committed
    .venv-ref/bin/python tools/gen_pt2_fixtures.py --models DIR --only resnet18

Everything is seeded (torch.manual_seed(crc32(name)) before a fixture is built) and no
weights are downloaded, so the outputs are reproducible.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import sys
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

EXPECTED_VERSIONS = {"torch": "2.15.0"}
found = {"torch": torch.__version__.split("+")[0]}
assert found == EXPECTED_VERSIONS, f"need {EXPECTED_VERSIONS}, found {found}"
warnings.filterwarnings("ignore")
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "pt2"

FIXTURES = {}
MODELS = {}


def fixture(name, registry=FIXTURES):
    def deco(fn):
        registry[name] = fn
        return fn

    return deco


# ----------------------------------------------------------------------------------------
# Committed fixtures (small)
# ----------------------------------------------------------------------------------------


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
    return dict(
        description="The seed module of the export tutorial: linear(x + param).clamp(0, 1).",
        methods={"forward": (m, (torch.randn(3, 4),), None)},
        cases=[("forward", (torch.randn(3, 4),)), ("forward", (torch.randn(3, 4),))],
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
    return dict(
        description="Conv2d + BatchNorm2d (eval) + ReLU + MaxPool2d + grouped strided Conv2d + "
        "AdaptiveAvgPool2d + flatten + Linear.",
        methods={"forward": (ConvNet().eval(), (torch.randn(1, 3, 16, 16),), None)},
        cases=[("forward", (torch.randn(1, 3, 16, 16),)), ("forward", (torch.randn(1, 3, 16, 16),))],
        tol=(1e-4, 1e-5),
    )


class DynBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        b = x.shape[0]
        h = torch.tanh(self.fc1(x))
        y = torch.softmax(self.fc2(h), dim=-1) + x.sum(dim=-1, keepdim=True)
        return y, h.reshape(b, 2, 4).mean(dim=1)


@fixture("dynamic_batch")
def _dynamic_batch():
    batch = Dim("batch", min=1, max=8)
    return dict(
        description="Dynamic batch (Dim('batch', min=1, max=8)), exported at 4, run at 1, 3 and 8: "
        "DYNAMIC_BOUND tensors, a reshape with a symbolic size.",
        methods={"forward": (DynBatch().eval(), (torch.randn(4, 6),), ({0: batch},))},
        cases=[("forward", (torch.randn(b, 6),)) for b in (1, 3, 8)],
    )


@fixture("dynamic_convnet")
def _dynamic_convnet():
    batch = Dim("batch", min=1, max=4)
    height = Dim("height", min=8, max=24)
    return dict(
        description="The conv net with a dynamic batch (1..4) and height (8..24): symbolic sizes "
        "through convolution, pooling and flatten.",
        methods={"forward": (ConvNet().eval(), (torch.randn(2, 3, 16, 16),), ({0: batch, 2: height},))},
        cases=[("forward", (torch.randn(b, 3, h, 16),)) for b, h in ((1, 8), (3, 16), (4, 24), (2, 13))],
        tol=(1e-4, 1e-5),
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
    return dict(
        description="Non-tensor inputs (int, float, bool: specialised at export, the runtime "
        "requires the same values) and symbolic-integer outputs of a dynamic size.",
        methods={"forward": (ScalarIO(), ex, ({0: batch}, None, None, None))},
        cases=[("forward", ex), ("forward", (torch.randn(2, 3), 3, 0.5, True))],
    )


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.arange(6, dtype=torch.float32).reshape(2, 3))
        self.register_buffer("steps", torch.tensor([10]))

    def forward(self, x):
        self.count.add_(x)
        self.steps.add_(1)
        return self.count * 2, self.steps + 0


@fixture("mutable_buffer")
def _mutable_buffer():
    return dict(
        description="Mutable buffers updated in place each call (count += x; steps += 1) with "
        "non-zero initial values; cases run in order on one loaded method.",
        methods={"forward": (Counter(), (torch.randn(2, 3),), None)},
        cases=[("forward", (torch.randn(2, 3),)) for _ in range(3)],
        sequential=True,
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
    return dict(
        description="torch.cond(x.sum() > 0, relu(lin(x)) + 1, x*2 - 1); both branches taken.",
        methods={"forward": (CondModel().eval(), (pos,), None)},
        cases=[("forward", (pos,)), ("forward", (-torch.rand(2, 4) - 0.1,)), ("forward", (torch.randn(2, 4),))],
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
    return dict(
        description="Several nested outputs of different dtypes: (relu, (sum, argmax), x > 0).",
        methods={"forward": (MultiOut(), (torch.randn(3, 5),), None)},
        cases=[("forward", (torch.randn(3, 5),)), ("forward", (torch.randn(3, 5),))],
    )


class LstmModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 8, num_layers=2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1]), h, c


@fixture("lstm")
def _lstm():
    return dict(
        description="Two-layer batch-first LSTM (4 -> 8) over 5 steps, then a Linear on the last step.",
        methods={"forward": (LstmModel().eval(), (torch.randn(2, 5, 4),), None)},
        cases=[("forward", (torch.randn(2, 5, 4),)), ("forward", (torch.randn(2, 5, 4),))],
        tol=(1e-4, 1e-5),
    )


class GruModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 5, bidirectional=True)
        self.cell = nn.GRUCell(10, 4)
        self.lcell = nn.LSTMCell(4, 3)

    def forward(self, x):
        out, h = self.gru(x)
        g = self.cell(out[-1])
        hc, cc = self.lcell(g)
        return out, h, hc, cc


@fixture("gru")
def _gru():
    return dict(
        description="Bidirectional GRU (sequence first), then a GRUCell and an LSTMCell.",
        methods={"forward": (GruModel().eval(), (torch.randn(4, 2, 3),), None)},
        cases=[("forward", (torch.randn(4, 2, 3),))],
        tol=(1e-4, 1e-5),
    )


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x):
        return self.enc(x)


@fixture("transformer_encoder")
def _transformer_encoder():
    return dict(
        description="nn.TransformerEncoder (2 layers, d_model 16, 2 heads, batch first): "
        "scaled_dot_product_attention, layer_norm, dropout (eval), linear on 3-D inputs.",
        methods={"forward": (Encoder().eval(), (torch.randn(2, 5, 16),), None)},
        cases=[("forward", (torch.randn(2, 5, 16),))],
        tol=(1e-4, 1e-5),
    )


class Attention(nn.Module):
    def forward(self, q, k, v, mask):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        c = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.float() * -1.5, scale=0.3)
        return a, b, c


@fixture("attention")
def _attention():
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 5)
    mask = torch.rand(4, 6) > 0.3
    mask[:, 0] = True
    return dict(
        description="scaled_dot_product_attention: causal, with a bool mask, with a float mask "
        "and an explicit scale.",
        methods={"forward": (Attention(), (q, k, v, mask), None)},
        cases=[("forward", (q, k, v, mask))],
        tol=(1e-4, 1e-5),
    )


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 6, 3, padding="same")
        self.gn = nn.GroupNorm(2, 6)
        self.ct = nn.ConvTranspose2d(6, 3, 3, stride=2, padding=1, output_padding=1)
        self.ln = nn.LayerNorm(3)

    def forward(self, x, img):
        y = F.silu(self.gn(self.c1(x)))
        y = F.max_pool1d(y, 2) + F.avg_pool1d(y, 2)
        y = F.adaptive_avg_pool1d(y, 2)
        z = self.ct(F.hardswish(img))
        z = F.hardsigmoid(z) + F.relu6(z * 4) + F.gelu(z)
        z = F.adaptive_max_pool2d(z, 2)
        w = self.ln(z.permute(0, 2, 3, 1)).transpose(1, 3)
        return y, w.flatten(1), torch.cat([z, z.pow(2)], dim=1).unflatten(1, (2, 3))


@fixture("mixed_ops")
def _mixed():
    return dict(
        description="Conv1d (padding='same'), GroupNorm, SiLU, max/avg/adaptive 1-D pooling, "
        "ConvTranspose2d, hardswish, hardsigmoid, relu6, gelu, adaptive max pooling, LayerNorm "
        "over a permuted tensor, transpose, flatten, cat, pow, unflatten.",
        methods={"forward": (Mixed().eval(), (torch.randn(1, 4, 8), torch.randn(1, 6, 4, 4)), None)},
        cases=[("forward", (torch.randn(1, 4, 8), torch.randn(1, 6, 4, 4)))],
        tol=(1e-4, 1e-5),
    )


class InPlace(nn.Module):
    def forward(self, x):
        y = x * 1.0
        y[:, 0] = 3.0
        y.relu_()
        z = y.view(-1)
        z[2:4] += 1.0
        return y, z.sum()


@fixture("inplace_views")
def _inplace():
    return dict(
        description="In-place writes through views (select, slice of a view) and in-place "
        "activations: functionalization.",
        methods={"forward": (InPlace(), (torch.randn(3, 4),), None)},
        cases=[("forward", (torch.randn(3, 4),))],
    )


class TinyGpt(nn.Module):
    def __init__(self, vocab=50, d=32, heads=4, layers=2, ctx=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(
            nn.TransformerDecoderLayer(d, heads, 2 * d, batch_first=True, norm_first=True) for _ in range(layers)
        )
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied weights share one storage in the archive

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t))
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        for b in self.blocks:
            x = b(x, x, tgt_mask=mask, memory_mask=mask)
        return self.head(self.ln(x)).log_softmax(-1)


@fixture("tiny_gpt")
def _tiny_gpt():
    ids = torch.randint(0, 50, (2, 12))
    return dict(
        description="A decoder-only language model: embeddings (tied to the output head), "
        "arange positions, a causal float mask (triu), pre-norm TransformerDecoderLayers, "
        "log_softmax.",
        methods={"forward": (TinyGpt().eval(), (ids,), None)},
        cases=[("forward", (ids,)), ("forward", (torch.randint(0, 50, (2, 12)),))],
        tol=(1e-4, 1e-5),
    )


class Einsum(nn.Module):
    def forward(self, a, b, v):
        return (
            torch.einsum("bij,bjk->bik", a, b),
            torch.einsum("b h i d, b h j d -> b h i j", a.unsqueeze(1), a.unsqueeze(1)),
            torch.einsum("...ij,...kj->...ik", a, a),
            torch.einsum("bij->bji", a),
            torch.einsum("bij,j->bi", a, v),
            torch.einsum("bij,bij->", a, a),
            torch.einsum("i,j->ij", v, v),
            torch.einsum("bij,bkl->bjl", a, b),
        )


@fixture("einsum")
def _einsum():
    args = (torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(4))
    return dict(
        description="einsum: batched products, attention scores, ellipsis, transpose, "
        "matrix-vector, full contraction, outer product, summed-out labels.",
        methods={"forward": (Einsum(), args, None)},
        cases=[("forward", args)],
        tol=(1e-4, 1e-5),
    )


class NormsAndReductions(nn.Module):
    def __init__(self):
        super().__init__()
        self.rms = nn.RMSNorm(8)
        self.rms2 = nn.RMSNorm((4, 8), eps=1e-3, elementwise_affine=False)

    def forward(self, x, i):
        return (
            self.rms(x),
            self.rms2(x),
            torch.logsumexp(x, -1),
            torch.logsumexp(x, (0, 2), keepdim=True),
            torch.logsumexp(i, 1),
        )


@fixture("norms_reductions")
def _norms_reductions():
    x = torch.randn(3, 4, 8) * 4
    x[0, 0, :] = float("-inf")  # a row whose maximum is infinite
    args = (x, torch.randint(-5, 5, (2, 6)))
    return dict(
        description="RMSNorm (with and without weight, default and given eps, over one and "
        "two dimensions), logsumexp (one and two dimensions, keepdim, a row of -inf, an "
        "integer input).",
        methods={"forward": (NormsAndReductions(), args, None)},
        cases=[("forward", args)],
        tol=(1e-5, 1e-6),
    )


class ChannelOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.inorm = nn.InstanceNorm2d(4, affine=True)
        self.inorm_stats = nn.InstanceNorm1d(4, track_running_stats=True)
        self.inorm_stats.running_mean.uniform_(-1, 1)
        self.inorm_stats.running_var.uniform_(0.5, 2)
        self.prelu = nn.PReLU(4)
        self.prelu1 = nn.PReLU()
        with torch.no_grad():
            self.inorm.weight.uniform_(0.5, 2)
            self.inorm.bias.uniform_(-1, 1)
            self.prelu.weight.uniform_(-0.5, 0.5)

    def forward(self, x, v):
        return (
            self.inorm(x),
            self.inorm_stats(v),
            F.instance_norm(x),
            self.prelu(x),
            self.prelu1(v),
            F.mish(x * 8),
            x.std(dim=(2, 3)),
            torch.std(v, dim=-1, correction=0, keepdim=True),
            F.normalize(v, dim=-1),
            torch.linalg.vector_norm(x, ord=1, dim=(1, 2)),
            torch.linalg.vector_norm(x, ord=float("inf")),
            torch.linalg.vector_norm(v, ord=3, dim=0, keepdim=True),
        )


@fixture("channel_ops")
def _channel_ops():
    args = (torch.randn(2, 4, 5, 6), torch.randn(3, 4, 7))
    return dict(
        description="InstanceNorm (affine, running statistics, functional), PReLU (per "
        "channel and single), mish, std (dims, correction), F.normalize and vector norms "
        "(1, 2, 3, infinity).",
        methods={"forward": (ChannelOps().eval(), args, None)},
        cases=[("forward", args)],
        tol=(1e-5, 1e-6),
    )


class TwoMethods(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 6)
        self.dec = nn.Linear(6, 4)


class Enc(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return torch.relu(self.m.enc(x))


class Dec(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, z):
        return torch.tanh(self.m.dec(z)) + self.m.dec.bias


@fixture("two_methods")
def _two_methods():
    m = TwoMethods().eval()
    return dict(
        description="Two exported programs in one archive (package_pt2): methods 'forward' "
        "and 'decode'; the shared decoder bias is stored once.",
        methods={"forward": (Enc(m), (torch.randn(3, 4),), None), "decode": (Dec(m), (torch.randn(3, 6),), None)},
        cases=[("forward", (torch.randn(3, 4),)), ("decode", (torch.randn(3, 6),))],
    )


# ----------------------------------------------------------------------------------------
# On-demand models (not committed)
# ----------------------------------------------------------------------------------------


def torchvision_model(name):
    def build():
        import torchvision.models as tvm

        m = getattr(tvm, name)(weights=None).eval()
        x = torch.randn(1, 3, 224, 224)
        return dict(
            description=f"torchvision {name} (random weights), 1x3x224x224.",
            methods={"forward": (m, (x,), None)},
            cases=[("forward", (torch.randn(1, 3, 224, 224),))],
            tol=(1e-3, 1e-4),
        )

    return build


for _n in [
    "resnet18",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "squeezenet1_0",
    "shufflenet_v2_x0_5",
    "densenet121",
    "regnet_y_400mf",
    "mnasnet0_5",
    "googlenet",
    "alexnet",
    "vgg11",
    "convnext_tiny",
    "vit_b_16",
    "swin_t",
    "mobilenet_v3_large",
    "efficientnet_v2_s",
    "resnext50_32x4d",
    "maxvit_t",
]:
    MODELS[_n] = torchvision_model(_n)


def segmentation_model(name):
    def build():
        import torchvision.models.segmentation as seg

        m = getattr(seg, name)(weights=None, weights_backbone=None, aux_loss=False).eval()
        return dict(
            description=f"torchvision segmentation {name} (random weights), 1x3x128x128.",
            methods={"forward": (m, (torch.randn(1, 3, 128, 128),), None)},
            cases=[("forward", (torch.randn(1, 3, 128, 128),))],
            tol=(1e-3, 1e-4),
        )

    return build


MODELS["deeplabv3_mobilenet_v3_large"] = segmentation_model("deeplabv3_mobilenet_v3_large")
MODELS["fcn_resnet50"] = segmentation_model("fcn_resnet50")


@fixture("transformer_encoder_large", MODELS)
def _big_encoder():
    layer = nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True)
    m = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval()
    return dict(
        description="nn.TransformerEncoder, 4 layers, d_model 256, 8 heads, 1x64 tokens.",
        methods={"forward": (m, (torch.randn(1, 64, 256),), None)},
        cases=[("forward", (torch.randn(1, 64, 256),))],
        tol=(1e-3, 1e-4),
    )


# ----------------------------------------------------------------------------------------


def flatten(out):
    if isinstance(out, (list, tuple)):
        return [y for o in out for y in flatten(o)]
    return [out]


def save(a, path: Path):
    arr = a.detach().numpy() if isinstance(a, torch.Tensor) else np.array(a)
    np.save(path, arr)


def build(name, fn, root: Path):
    torch.manual_seed(zlib.crc32(name.encode()))
    np.random.seed(zlib.crc32(name.encode()) % (2**32))
    spec = fn()
    d = root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    eps = {}
    for method, (module, example, dyn) in spec["methods"].items():
        eps[method] = torch.export.export(module, example, dynamic_shapes=dyn)
    if len(eps) == 1 and "forward" in eps:
        torch.export.save(eps["forward"], d / "model.pt2")
    else:
        from torch.export.pt2_archive._package import package_pt2

        package_pt2(str(d / "model.pt2"), exported_programs=eps)
    cases = []
    for i, (method, inputs) in enumerate(spec["cases"]):
        module = spec["methods"][method][0]
        with torch.no_grad():
            outputs = flatten(module(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]))
        cd = d / f"case{i}"
        cd.mkdir()
        ins, outs, kinds = [], [], []
        for k, t in enumerate(inputs):
            save(t, cd / f"input_{k}.npy")
            ins.append(f"{name}/case{i}/input_{k}.npy")
            kinds.append({bool: "bool", int: "int", float: "float"}.get(type(t), "tensor"))
        for k, t in enumerate(outputs):
            save(t, cd / f"output_{k}.npy")
            outs.append(f"{name}/case{i}/output_{k}.npy")
        case = {"method": method, "inputs": ins, "outputs": outs}
        if any(k != "tensor" for k in kinds):
            case["input_kinds"] = kinds
        cases.append(case)
    rtol, atol = spec.get("tol", (1e-5, 1e-6))
    return {
        "name": name,
        "program": f"{name}/model.pt2",
        "description": spec["description"],
        "methods": list(spec["methods"]),
        "cases": cases,
        "sequential": spec.get("sequential", False),
        "tolerance": {"rtol": rtol, "atol": atol},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--models", type=Path, help="write the on-demand models to this directory")
    args = ap.parse_args()
    registry, root = (MODELS, args.models) if args.models else (FIXTURES, OUT)
    only = [n for n in args.only.split(",") if n]
    manifest_path = root / "manifest.json"
    entries = {}
    if manifest_path.exists():
        entries = {e["name"]: e for e in json.loads(manifest_path.read_text())["fixtures"]}
    for name, fn in registry.items():
        if only and name not in only:
            continue
        print(f"{name} ...", file=sys.stderr)
        entries[name] = build(name, fn, root)
    manifest = {
        "generator": "tools/gen_pt2_fixtures.py",
        "executorch": "",
        "torch": torch.__version__.split("+")[0],
        "fixtures": [entries[n] for n in registry if n in entries],
    }
    root.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
