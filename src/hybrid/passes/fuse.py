"""Operator fusion: rule rows that merge a node into its producer.

Each row is ``(pattern, fn)``; ``fn`` returns the replacement or None (see :mod:`hybrid.passes.rewrite`).
Weight arithmetic is done in float64 and rounded once to the weight's dtype, so a fused model agrees
with the original to within float32 rounding (1e-5 relative is checked on every light model).

- Conv + BatchNormalization -> Conv with scaled weights and a bias (inference-mode BN only).
- Conv + Mul / Div / Add / Sub by a per-output-channel constant -> Conv.
- BatchNormalization + Mul / Add by a per-channel constant -> BatchNormalization (DenseNet writes its
  "scale" layers this way).
- MatMul + Add -> Gemm when both MatMul operands are matrices and the addend broadcasts one way.

The first three rows (:data:`WEIGHT_FOLDING_RULES`) are also what the reference backend folds when it
compiles a model (:func:`fold_into_weights`); it keeps only kernel-level epilogues of its own (a
residual Add and a Relu applied in a Conv's output buffer).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveInitializersFromInputsPass

from hybrid.passes.rewrite import Context, Rewrite, Rule, RuleRewritePass, per_channel, rank_of, static_shape

__all__ = ["FUSION_RULES", "WEIGHT_FOLDING_RULES", "fold_into_weights", "fuse_operators"]

_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def _attr(node: ir.Node, name: str, default: float | int) -> float | int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _other_input(node: ir.Node, value: ir.Value) -> tuple[ir.Value | None, int]:
    """The operand of binary ``node`` that is not ``value``, and ``value``'s position."""
    if node.inputs[0] is value:
        return node.inputs[1], 0
    return node.inputs[0], 1


def _conv_params(ctx: Context, conv: ir.Node) -> tuple[np.ndarray, np.ndarray] | None:
    weight = ctx.const(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if weight is None or weight.dtype.kind != "f" or weight.ndim < 3:
        return None
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        bias = ctx.const(conv.inputs[2])
        if bias is None or bias.shape != (weight.shape[0],):
            return None
    else:
        bias = np.zeros(weight.shape[0], dtype=weight.dtype)
    return weight, bias


def _new_conv(ctx: Context, conv: ir.Node, like: ir.Node, weight: np.ndarray, bias: np.ndarray,
              dtype: np.dtype) -> Rewrite:
    w = ctx.initializer(weight.astype(dtype), f"{conv.inputs[1].name}_fused")
    b = ctx.initializer(bias.astype(dtype), f"{like.outputs[0].name}_bias")
    node = ctx.node("Conv", [conv.inputs[0], w, b], like=like, attributes=conv.attributes.values())
    return Rewrite([node], node.outputs)


def _bn_params(ctx: Context, bn: ir.Node) -> tuple[np.ndarray, ...] | None:
    if len(bn.inputs) < 5 or int(_attr(bn, "training_mode", 0)) != 0:
        return None
    params = [ctx.const(v) for v in bn.inputs[1:5]]
    if any(p is None or p.ndim != 1 for p in params):
        return None
    return tuple(params)  # type: ignore[arg-type]


def _conv_bn(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    conv, bn = match
    conv_params, bn_params = _conv_params(ctx, conv), _bn_params(ctx, bn)
    if conv_params is None or bn_params is None or bn.inputs[0] is not conv.outputs[0]:
        return None
    weight, bias = conv_params
    scale, beta, mean, var = (p.astype(np.float64) for p in bn_params)
    if any(p.shape != (weight.shape[0],) for p in (scale, beta, mean, var)):
        return None
    factor = scale / np.sqrt(var + float(_attr(bn, "epsilon", 1e-5)))
    new_weight = weight.astype(np.float64) * factor.reshape((-1,) + (1,) * (weight.ndim - 1))
    new_bias = (bias.astype(np.float64) - mean) * factor + beta
    return _new_conv(ctx, conv, bn, new_weight, new_bias, weight.dtype)


def _conv_affine(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    conv, op = match
    params = _conv_params(ctx, conv)
    if params is None:
        return None
    weight, bias = params
    other, position = _other_input(op, conv.outputs[0])
    array = ctx.const(other)
    if array is None or array.dtype != weight.dtype:
        return None
    if op.op_type in ("Sub", "Div") and position != 0:
        return None  # c - conv(x) and c / conv(x) are not affine in the weights
    vector = per_channel(array, weight.ndim, weight.shape[0])
    if vector is None:
        return None
    c = vector.astype(np.float64)
    w, b = weight.astype(np.float64), bias.astype(np.float64)
    expand = (-1,) + (1,) * (weight.ndim - 1)
    if op.op_type == "Mul":
        w, b = w * c.reshape(expand), b * c
    elif op.op_type == "Div":
        w, b = w / c.reshape(expand), b / c
    elif op.op_type == "Add":
        b = b + c
    else:
        b = b - c
    return _new_conv(ctx, conv, op, w, b, weight.dtype)


def _bn_affine(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    bn, op = match
    params = _bn_params(ctx, bn)
    rank = rank_of(bn.inputs[0])
    if params is None or rank is None or rank < 2:
        return None
    scale, beta = params[0], params[1]
    other, _ = _other_input(op, bn.outputs[0])
    array = ctx.const(other)
    if array is None or array.dtype != scale.dtype:
        return None
    vector = per_channel(array, rank, scale.shape[0])
    if vector is None:
        return None
    c = vector.astype(np.float64)
    new_scale, new_beta = scale.astype(np.float64), beta.astype(np.float64)
    if op.op_type == "Mul":
        new_scale, new_beta = new_scale * c, new_beta * c
    else:
        new_beta = new_beta + c
    s = ctx.initializer(new_scale.astype(scale.dtype), f"{op.outputs[0].name}_scale")
    b = ctx.initializer(new_beta.astype(beta.dtype), f"{op.outputs[0].name}_bias")
    node = ctx.node("BatchNormalization", [bn.inputs[0], s, b, bn.inputs[3], bn.inputs[4]], like=op,
                    attributes=bn.attributes.values())
    return Rewrite([node], node.outputs)


def _matmul_add(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    matmul, add = match
    if ctx.opset < 7:
        return None  # Gemm broadcasts C one way only from opset 7
    a, b = matmul.inputs
    if rank_of(a) != 2 or rank_of(b) != 2 or a.dtype not in _FLOATS:
        return None
    addend, _ = _other_input(add, matmul.outputs[0])
    if addend is None or addend.dtype != a.dtype:
        return None
    shape = static_shape(addend)
    if shape is None or len(shape) > 2:
        return None
    rows, cols = a.shape[0], b.shape[1]
    aligned = (1,) * (2 - len(shape)) + shape
    if aligned[0] not in (1, rows) or aligned[1] not in (1, cols):
        return None  # the addend would widen the result: Add broadcasts both ways, Gemm's C one way
    node = ctx.node("Gemm", [a, b, addend], like=add)
    return Rewrite([node], node.outputs)


# the rows that fold constants into a producer's weights: what a backend may do at compile time as well
WEIGHT_FOLDING_RULES: tuple[Rule, ...] = (
    (("Conv", "BatchNormalization"), _conv_bn),
    (("Conv", frozenset({"Mul", "Div", "Add", "Sub"})), _conv_affine),
    (("BatchNormalization", frozenset({"Mul", "Add"})), _bn_affine),
)
FUSION_RULES: tuple[Rule, ...] = (*WEIGHT_FOLDING_RULES, (("MatMul", "Add"), _matmul_add))
_MAX_SWEEPS = 8  # a chain Conv -> BN -> Mul -> Add folds in one sweep; more is a safeguard


def fuse_operators() -> RuleRewritePass:
    """The fusion rule table as one pass."""
    return RuleRewritePass("fuse_operators", FUSION_RULES)


def fold_into_weights(model: ir.Model, *, fold_constants: bool = True) -> ir.Model:
    """A copy of ``model`` with :data:`WEIGHT_FOLDING_RULES` applied until nothing changes.

    The reference backend compiles this copy (its ``fuse`` option), so a model that was never optimized
    runs with the same folded weights as one that was: one definition of the folding, this table. The
    copy shares the model's tensors (``ir.Model.clone``); only folded weights are new. Top-level graph only.

    Args:
        model: The model (not changed).
        fold_constants: Evaluate constant nodes first, without a size limit (weights computed by a
            ``ConstantOfShape`` or a ``Reshape`` of an initializer fold too, as the backend's own
            compile-time folding would evaluate them anyway).
    """
    work = model.clone()
    RemoveInitializersFromInputsPass()(work)  # old models list weights as inputs; hybrid never feeds those
    if fold_constants:
        from hybrid.passes.fold import FoldConstants  # (evaluates with the reference kernels)

        FoldConstants(size_limit=1 << 62).call(work)
    folding = RuleRewritePass("fold_into_weights", WEIGHT_FOLDING_RULES)
    for _ in range(_MAX_SWEEPS):
        if not folding.call(work).modified:
            break
    _drop_unread_initializers(work.graph)
    return work


def _drop_unread_initializers(graph: ir.Graph) -> None:
    """Unregister the initializers nothing reads any more (weights a fold replaced, inputs of folded nodes).

    Not only tidiness: the copy is a web of reference cycles (nodes, values, graph), so it is freed by the
    cyclic collector, not when the backend drops it; until a full collection, which a steady inference
    loop may not trigger for a long time, the copy would keep these arrays alive in the heap (megabytes:
    the unfused weights constant folding computed). With that memory held, a run's temporaries move the
    heap's top up and glibc trims it back after every run, so each run page-faults its scratch memory in
    again (issue 27: shufflenet 1.3x slower on the reference backend).
    """
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_output():
            graph.initializers.pop(name)
