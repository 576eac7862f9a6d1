#!/usr/bin/env python3
"""Write the operator schema table the Rust compiler (crates/pte-compiler) reads.

For every operator the compiler may meet in a torch.export archive or produce itself, the
table holds PyTorch's schema string (argument names, types, defaults, keyword-only marker,
aliasing annotations), and for functional operators the schema of the `.out` variant that
upstream ExecuTorch's `to_out_variant` picks. Nothing else: which operators are decomposed,
and how, lives in Rust.

Reference environment (pinned; the script refuses other versions):
    .venv-ref/bin/python tools/gen_op_schemas.py      # rewrites crates/pte-compiler/src/{schemas,kernels}.txt

Output format, one operator per line, sorted:
    <schema>                        an operator with no out variant (views, in-place, out)
    <schema> => <out schema>        a functional operator and its out variant
"""

import importlib.metadata
import sys
import warnings
import logging
from pathlib import Path

import torch

EXPECTED = {"executorch": "1.5.1", "torch": "2.15.0"}
found = {
    "executorch": importlib.metadata.version("executorch").split("+")[0],
    "torch": torch.__version__.split("+")[0],
}
assert found == EXPECTED, f"need {EXPECTED}, found {found}"
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import executorch.exir.passes.executorch_prim_ops_registry  # noqa: E402,F401  (registers executorch_prim)
import executorch.exir.passes.dim_order_ops_registry  # noqa: E402,F401
from executorch.exir.operator.convert import to_out_variant  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "pte-compiler" / "src" / "schemas.txt"
KERNELS = ROOT / "crates" / "pte-compiler" / "src" / "kernels.txt"

# Operator base names (without a trailing `_`): upstream's portable kernels, and the
# non-core operators torch.export leaves that the compiler decomposes.
BASE = """
_adaptive_avg_pool2d _cdist_forward _conj_physical _log_softmax _native_batch_norm_legit
_native_batch_norm_legit_no_training _pdist_forward _softmax _to_copy abs acos acosh add
addmm alias_copy amax amin any arange argmax argmin as_strided_copy asin asinh atan atan2
atanh avg_pool2d bitwise_and bitwise_or bitwise_xor bitwise_not bitwise_left_shift
bitwise_right_shift bmm cat ceil clamp clone constant_pad_nd convolution copy cos cosh
cumsum detach_copy diagonal_copy div embedding empty eq elu erf exp expand_copy expm1 fill
flip floor floor_divide fmod full full_like gather ge gelu glu grid_sampler_2d gt hardtanh
index index_put index_select isinf isnan le leaky_relu lift_fresh_copy log log10 log1p log2
logical_and logical_not logical_or logical_xor logit lt masked_fill masked_scatter
masked_select max maximum max_pool2d_with_indices mean min minimum mm mul narrow_copy
native_dropout native_group_norm native_layer_norm ne neg nonzero ones permute_copy
pixel_shuffle pixel_unshuffle pow prod rand randn reciprocal relu remainder repeat
repeat_interleave reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d
replication_pad2d replication_pad3d roll round rsqrt rsub scalar_tensor scatter scatter_add
select_copy select_scatter sigmoid sign sin sinh slice_copy slice_scatter split_copy
split_with_sizes_copy sqrt squeeze_copy stack sub sum t_copy tan tanh topk transpose_copy
tril trunc unbind_copy unfold_copy unsqueeze_copy upsample_bilinear2d _upsample_bilinear2d_aa
upsample_nearest2d var var_mean view_as_real_copy view_copy where zeros silu hardswish
hardsigmoid softplus linear sym_size sym_numel _local_scalar_dense
adaptive_avg_pool1d adaptive_avg_pool2d adaptive_max_pool1d adaptive_max_pool2d alias
avg_pool1d batch_norm chunk contiguous conv1d conv2d conv3d conv_transpose1d
conv_transpose2d detach dropout feature_dropout alpha_dropout expand expand_as flatten group_norm gru
gru_cell instance_norm layer_norm log_softmax lstm lstm_cell matmul max_pool1d max_pool2d
narrow new_empty new_full new_ones new_zeros ones_like permute relu6 reshape rnn_tanh rnn_relu
rnn_tanh_cell rnn_relu_cell scaled_dot_product_attention select slice softmax split
split_with_sizes squeeze t transpose type_as unbind unflatten unsqueeze view zeros_like
empty_like full_like rand_like randn_like lift_fresh mish selu celu elu gelu erfc square
upsample_nearest1d upsample_linear1d upsample_bicubic2d _assert_tensor_metadata
_assert_scalar sym_constrain_range sym_constrain_range_for_size _assert_async
linalg_vector_norm norm frobenius_norm std std_mean var_mean cumprod einsum baddbmm addbmm
addcmul addcdiv addmv outer dot vdot triu one_hot bernoulli numel sym_stride sym_storage_offset
item scalar_tensor lerp hypot clamp_min clamp_max logsumexp all argsort sort cosine_similarity
pairwise_distance dist cross mv linalg_norm special_expm1 exp2 sinc
_scaled_dot_product_flash_attention_for_cpu _safe_softmax upsample_nearest2d _unsafe_view
pad slice_inverse _unsafe_index index_add index_copy masked_fill le view_as expm1 relu
hardshrink softshrink tanhshrink threshold prelu _prelu_kernel logaddexp max_unpool2d
avg_pool3d max_pool3d adaptive_avg_pool3d bucketize clip clamp_ full diagonal movedim
swapaxes swapdims moveaxis flip rot90 reflection_pad1d tile repeat stack hstack vstack
cat concat concatenate any all where
""".split()
PRIM_NAMESPACES = ("executorch_prim::", "dim_order_ops::")


def base_name(qualified: str) -> str:
    name = qualified.split("::", 1)[1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def overload_packet(qualified: str, overload: str):
    ns, name = qualified.split("::", 1)
    packet = getattr(getattr(torch.ops, ns), name)
    return getattr(packet, overload or "default")


def main() -> None:
    wanted = set(BASE)
    lines = set()
    for s in torch._C._jit_get_all_schemas():
        q = s.name
        if q.startswith("aten::"):
            if base_name(q) not in wanted:
                continue
        elif not q.startswith(PRIM_NAMESPACES):
            continue
        text = str(s)
        try:
            op = overload_packet(q, s.overload_name)
        except AttributeError:
            lines.add(text)
            continue
        out = None
        mutable = any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments)
        if not mutable and s.returns and all(
            isinstance(r.type, (torch.TensorType, torch.ListType)) for r in s.returns
        ):
            try:
                out_op, _ = to_out_variant(op)
                if out_op is not op:
                    out = str(out_op._schema)
            except Exception:  # noqa: BLE001  (no out variant: recorded as none)
                out = None
        lines.add(f"{text} => {out}" if out else text)
    OUT.write_text("".join(f"{l}\n" for l in sorted(lines)))
    print(f"wrote {len(lines)} schemas to {OUT.relative_to(ROOT)}", file=sys.stderr)
    # The operators upstream's runtime (the pip wheel) registers: what compiled programs
    # may call so that they load there.
    from executorch.extension.pybindings.portable_lib import _get_operator_names

    names = sorted(set(_get_operator_names()))
    KERNELS.write_text("".join(f"{n}\n" for n in names))
    print(f"wrote {len(names)} kernel names to {KERNELS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
