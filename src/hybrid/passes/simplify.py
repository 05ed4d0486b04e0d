"""Precision-preserving algebraic rewrites (level O3): every row gives bit-for-bit the same values.

- ``x * 1``, ``x / 1``, ``x + 0``, ``x - 0``, ``x ** 1`` -> ``x`` when the constant does not broadcast ``x``
  to a larger shape;
- idempotent operators applied twice (Relu, Abs, Floor, Ceil, Round, Sign) -> once; ``Neg(Neg(x))``
  and ``Not(Not(x))`` -> ``x``;
- ``Squeeze(Unsqueeze(x, a), a)`` and ``Unsqueeze(Squeeze(x, a), a)`` -> ``x``;
- a Concat feeding a Concat on the same axis -> one Concat.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from hybrid.passes.rewrite import Context, Rewrite, Rule, RuleRewritePass, rank_of

__all__ = ["SIMPLIFY_RULES", "simplify"]

_IDEMPOTENT = frozenset({"Relu", "Abs", "Floor", "Ceil", "Round", "Sign"})
_INVOLUTION = frozenset({"Neg", "Not"})
_NEUTRAL = {"Mul": 1, "Div": 1, "Pow": 1, "Add": 0, "Sub": 0}


def _neutral_operand(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    node = match[0]
    if len(node.inputs) != 2 or node.inputs[0] is None:
        return None
    x, c = node.inputs
    if node.op_type in ("Mul", "Add") and ctx.const(x) is not None and ctx.const(c) is None:
        x, c = c, x  # commutative: the constant may come first
    array = ctx.const(c)
    rank = rank_of(x)
    if array is None or rank is None or array.ndim > rank or x.dtype is None:
        return None
    if array.size != 1 and (x.shape is None or not _fits(array.shape, tuple(x.shape))):
        return None  # the constant might widen x through broadcasting
    if not np.all(array == _NEUTRAL[node.op_type]) or array.dtype != x.dtype.numpy():
        return None
    return ctx.identity(x, node)


def _fits(const_shape: tuple[int, ...], shape: tuple) -> bool:
    aligned = (1,) * (len(shape) - len(const_shape)) + const_shape
    return all(c == 1 or (isinstance(d, int) and c == d) for c, d in zip(aligned, shape))


def _twice(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    first, second = match
    if first.op_type != second.op_type:
        return None
    if first.op_type in _INVOLUTION:
        return ctx.identity(first.inputs[0], second)
    node = ctx.node(first.op_type, [first.inputs[0]], like=second, attributes=first.attributes.values())
    return Rewrite([node], node.outputs)


def _axes(ctx: Context, node: ir.Node) -> tuple[int, ...] | None:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        array = ctx.const(node.inputs[1])
        return None if array is None else tuple(int(a) for a in array.reshape(-1))
    attr = node.attributes.get("axes")
    return None if attr is None else tuple(attr.as_ints())


def _squeeze_pair(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    first, second = match
    if {first.op_type, second.op_type} != {"Squeeze", "Unsqueeze"}:
        return None
    a, b = _axes(ctx, first), _axes(ctx, second)
    if a is None or b is None or any(axis < 0 for axis in a + b) or sorted(a) != sorted(b):
        return None  # negative axes count from different ranks on the two sides
    return ctx.identity(first.inputs[0], second)


def _concat_concat(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    inner, outer = match
    rank = rank_of(outer.outputs[0]) or rank_of(inner.inputs[0])
    axes = [n.attributes["axis"].as_int() if "axis" in n.attributes else None for n in (inner, outer)]
    if None in axes or rank is None or axes[0] % rank != axes[1] % rank:
        return None
    inputs: list[ir.Value | None] = []
    for value in outer.inputs:
        inputs.extend(inner.inputs if value is inner.outputs[0] else [value])
    node = ctx.node("Concat", inputs, like=outer, attributes=outer.attributes.values())
    return Rewrite([node], node.outputs)


SIMPLIFY_RULES: tuple[Rule, ...] = (
    ((frozenset(_NEUTRAL),), _neutral_operand),
    ((_IDEMPOTENT | _INVOLUTION, _IDEMPOTENT | _INVOLUTION), _twice),
    ((frozenset({"Squeeze", "Unsqueeze"}), frozenset({"Squeeze", "Unsqueeze"})), _squeeze_pair),
    (("Concat", "Concat"), _concat_concat),
)


def simplify() -> RuleRewritePass:
    """The precision-preserving rule table as one pass."""
    return RuleRewritePass("simplify", SIMPLIFY_RULES)
