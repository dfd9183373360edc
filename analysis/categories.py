"""The one table that puts operators into categories.

Five categories; four are named, the fifth is the remainder:

==============  ====================================================================
Convolution     XNNPACK ``Convolution (...)`` (IGEMM, DWConv, ...), ``Deconvolution``;
                aten convolution / conv1d/2d/3d / conv_transpose*.
GEMM            XNNPACK ``Fully Connected``, ``Batch Matrix Multiply`` (and dynamic
                variants); aten mm, bmm, addmm, linear, matmul, baddbmm, mv, dot, einsum.
                (XNNPACK rewrites 1x1 convolutions as Fully Connected: they land here.)
Data Movement   XNNPACK ``Transpose``, ``Copy``, ``Convert`` (a dtype conversion, *not* a
                convolution), ``Static Reshape``, ``Constant Pad``, ``Slice``,
                ``Concatenate``, ``Even Split``, depth/space rearrangements, channel
                shuffle, expand/broadcast; aten permute, transpose, view, reshape, clone,
                copy, _to_copy, _to_dim_order_copy, cat, slice, select, pad, expand,
                squeeze/unsqueeze, split, stack, flatten, pixel_(un)shuffle, repeat, flip,
                index_select, gather.
Elementwise     unary and binary element-wise ops: Add, Multiply, Subtract, Divide,
                Maximum, Minimum, Clamp, HardSwish, Sigmoid, Tanh, ELU, GELU, Leaky ReLU,
                PReLU, Square, Square Root, Negate, Abs, Exp, Log, rounding, reciprocal
                square root, relu, ...; for aten also comparisons (eq ne lt le gt ge),
                logical_*, bitwise_*, where, masked_fill.
LLM custom ops  ExecuTorch's ``llama::custom_sdpa`` (attention) into GEMM, ``llama::update_cache``
                (the KV-cache update) into Data Movement (:data:`LLM_CUSTOM_OPS`); the report's
                kernel hint says which.
Other           everything else: softmax, pooling, reductions (sum, mean, any, all,
                amax), cumsum, topk, sort, layer/batch/group norm, attention, quantize
                ops, and all time spent outside categorised operators (runtime overhead,
                DELEGATE_CALL / OPERATOR_CALL bookkeeping).  Other = E2E - the four.
==============  ====================================================================

How a name is looked up (no substring matching: ``Convert`` must never hit ``conv``):

* XNNPACK type strings ``"<Base> (<layout, dtypes>) <variant> #<n>"``: the instance suffix
  is dropped, then ``<Base>`` (text before `` (``) is looked up, lower-cased, in
  :data:`XNNPACK_TABLE`; if absent, its first word is tried.
* aten / portable kernel names (``native_call_<op>.<overload>``, ``aten::<op>.<overload>``,
  ``aten.<op>.default``): the op name is extracted (prefix and overload removed, a trailing
  in-place ``_`` removed) and looked up in :data:`ATEN_TABLE`.
"""

from __future__ import annotations

import re

CONV, GEMM, DATA, ELEM, OTHER = "Convolution", "GEMM", "Data Movement", "Elementwise", "Other"
CATEGORIES: tuple[str, ...] = (CONV, GEMM, DATA, ELEM, OTHER)
NAMED: tuple[str, ...] = CATEGORIES[:4]


def _table(spec: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for cat, names in spec.items():
        for n in names.split(","):
            n = n.strip().lower()
            if n:
                out[n] = cat
    return out


# XNNPACK operator type base names (xnn_operator_type_to_string), lower-cased.
XNNPACK_TABLE: dict[str, str] = _table({
    CONV: "convolution, deconvolution, depthwise convolution",
    GEMM: "fully connected, dynamic fully connected, batch matrix multiply, "
          "batch matrix multiply dynamic, gemm, igemm",
    DATA: "transpose, static transpose, copy, convert, static reshape, reshape, "
          "constant pad, static constant pad, slice, static slice, concatenate, "
          "concatenate2, concatenate3, concatenate4, concatenate5, even split, even split2, "
          "even split3, even split4, split, depth to space, space to depth, channel shuffle, "
          "static expand dims, expand dims, broadcast, static broadcast, unpooling, "
          "pack lh, fp32 to fp16, fp16 to fp32",
    ELEM: "add, multiply, subtract, divide, maximum, minimum, squared difference, copysign, "
          "power, modulus, binary elementwise, unary elementwise, clamp, hardswish, "
          "hard swish, sigmoid, tanh, elu, gelu, approxgelu, approximate gelu, leaky relu, "
          "prelu, relu, square, square root, reciprocal square root, negate, abs, "
          "absolute value, exp, log, sine, cosine, sign, bankers rounding, "
          "round to nearest even, ceiling, round up, floor, round down, truncation, "
          "round toward zero, cube root, swish",
})

# aten op names (overload and namespace stripped), lower-cased.
ATEN_TABLE: dict[str, str] = _table({
    CONV: "convolution, _convolution, conv1d, conv2d, conv3d, conv_transpose1d, "
          "conv_transpose2d, conv_transpose3d, convolution_overrideable, "
          "_conv_depthwise2d, mkldnn_convolution, conv_depthwise2d",
    GEMM: "mm, bmm, addmm, linear, matmul, baddbmm, addbmm, addmv, mv, dot, vdot, einsum, "
          "_weight_int8pack_mm, _int_mm, linear_q4gsw, quantized_linear",
    DATA: "permute, permute_copy, transpose, transpose_copy, t, t_copy, view, view_copy, "
          "_unsafe_view, reshape, clone, _clone_dim_order, copy, _to_copy, "
          "_to_dim_order_copy, to, contiguous, cat, concat, concatenate, slice, slice_copy, "
          "slice_scatter, select, select_copy, select_scatter, narrow, narrow_copy, pad, "
          "constant_pad_nd, reflection_pad1d, reflection_pad2d, reflection_pad3d, "
          "replication_pad1d, replication_pad2d, replication_pad3d, expand, expand_copy, "
          "expand_as, squeeze, squeeze_copy, unsqueeze, unsqueeze_copy, split, split_copy, "
          "split_with_sizes, split_with_sizes_copy, unbind, unbind_copy, chunk, stack, "
          "flatten, unflatten, pixel_shuffle, pixel_unshuffle, repeat, tile, flip, roll, "
          "index_select, gather, index, alias, alias_copy, as_strided, as_strided_copy, "
          "detach_copy, lift_fresh_copy, _copy_from, unfold, unfold_copy, diagonal_copy",
    ELEM: "add, sub, rsub, mul, div, remainder, fmod, pow, maximum, minimum, fmax, fmin, "
          "clamp, clamp_min, clamp_max, clip, hardtanh, hardswish, hardsigmoid, sigmoid, "
          "tanh, elu, gelu, leaky_relu, relu, relu6, prelu, _prelu_kernel, silu, mish, "
          "softplus, square, sqrt, rsqrt, reciprocal, neg, abs, exp, exp2, expm1, log, log2, "
          "log10, log1p, round, floor, ceil, trunc, frac, sign, sgn, sin, cos, tan, asin, "
          "acos, atan, atan2, sinh, cosh, asinh, acosh, atanh, erf, erfc, eq, ne, lt, le, "
          "gt, ge, logical_and, logical_or, logical_not, logical_xor, bitwise_and, "
          "bitwise_or, bitwise_not, bitwise_xor, bitwise_left_shift, bitwise_right_shift, "
          "where, masked_fill, fill, isnan, isinf, floor_divide, lerp, addcmul, addcdiv, "
          "glu, heaviside, hypot, xlogy, copysign, nan_to_num, logit, threshold",
})

# ExecuTorch's LLM custom ops (extension/llm/custom_ops, registered with EXECUTORCH_LIBRARY: the
# ETDump names their kernel events "llama::<op>.<overload>"), by what they are. Attention is
# GEMM work (Q K^T and P V around a softmax, on cpublas); the KV-cache update copies the call's
# keys and values into the cache: Data Movement. The words go into the report's kernel hint.
LLM_CUSTOM_OPS: dict[str, tuple[str, str]] = {
    "llama::custom_sdpa": (GEMM, "attention: scaled dot-product over the KV cache (ExecuTorch LLM custom op)"),
    "llama::sdpa_with_kv_cache": (GEMM, "attention with its KV-cache update (ExecuTorch LLM custom op)"),
    "llama::custom_quantized_sdpa": (GEMM, "attention over a quantized KV cache (ExecuTorch LLM custom op)"),
    "llama::update_cache": (DATA, "KV-cache update: the call's keys/values written into the cache "
                                  "(ExecuTorch LLM custom op)"),
    "llama::update_cache_with_indices": (DATA, "KV-cache update at given indices (ExecuTorch LLM custom op)"),
}
LLM_CUSTOM_PREFIX = "llama::"


def llm_custom_op(name: str) -> tuple[str, str] | None:
    """(category, what it is) of an ExecuTorch LLM custom op's kernel event name
    (``llama::custom_sdpa.out``), None for any other name."""
    name = name.strip()
    if not name.startswith(LLM_CUSTOM_PREFIX):
        return None
    return LLM_CUSTOM_OPS.get(name.split(".", 1)[0], (OTHER, "an ExecuTorch LLM custom op"))


_INSTANCE = re.compile(r"\s+#\d+$")
_ATEN_PREFIX = re.compile(r"^(?:native_call_|aten::|aten\.|torch\.ops\.aten\.)")


def operator_type(name: str) -> str:
    """``"Transpose (ND, X32) #2"`` -> ``"Transpose (ND, X32)"``: the instance suffix removed."""
    return _INSTANCE.sub("", name)


def is_aten_name(name: str) -> bool:
    return bool(_ATEN_PREFIX.match(name))


def aten_op(name: str) -> str:
    """``native_call_cumsum.out`` -> ``cumsum``; ``aten::add_.Tensor`` -> ``add``;
    ``native_call__to_dim_order_copy.out`` -> ``_to_dim_order_copy``."""
    s = _ATEN_PREFIX.sub("", name.strip())
    s = s.split(".", 1)[0]
    if s.endswith("_") and not s.endswith("__") and len(s) > 1:
        s = s[:-1]  # in-place variant: add_ is add
    return s.lower()


def category_of(name: str) -> str:
    """Category of one event/operator name (instance suffix allowed)."""
    name = operator_type(name.strip())
    if not name:
        return OTHER
    if (custom := llm_custom_op(name)) is not None:
        return custom[0]
    if is_aten_name(name):
        return ATEN_TABLE.get(aten_op(name), OTHER)
    base = name.split(" (", 1)[0].strip().lower()
    cat = XNNPACK_TABLE.get(base)
    if cat is not None:
        return cat
    # bare aten names without a prefix (e.g. "cumsum.out", "aten_add") from other tools
    op = aten_op(name)
    if op in ATEN_TABLE and (" " not in name):
        return ATEN_TABLE[op]
    first = base.split(" ", 1)[0]
    return XNNPACK_TABLE.get(first, OTHER)
