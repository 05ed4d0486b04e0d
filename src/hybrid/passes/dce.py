"""Dead-code and identity elimination.

``remove_noops`` is a rule table that turns operators which compute nothing at inference into Identity
nodes (Dropout, single-input Sum/Max/Min/Mean/Concat, a Cast to the type the value already has, an
Expand or Pad that changes nothing); ``eliminate_identity`` (onnx-ir's ``IdentityEliminationPass``) then
removes every Identity it can, keeping graph input and output names; ``remove_dead_code`` (onnx-ir's
``RemoveUnusedNodesPass``, ``RemoveUnusedFunctionsPass`` and ``RemoveUnusedOpsetsPass``) drops nodes,
initializers, functions and opset imports nothing uses, and unused optional outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import (
    IdentityEliminationPass,
    RemoveUnusedFunctionsPass,
    RemoveUnusedNodesPass,
    RemoveUnusedOpsetsPass,
)

from hybrid.passes.base import OnnxIrPass
from hybrid.passes.rewrite import Context, Rewrite, Rule, RuleRewritePass, static_shape

__all__ = ["NOOP_RULES", "eliminate_identity", "remove_dead_code", "remove_noops"]


def _dropout(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    node = match[0]
    if len(node.inputs) >= 3 and node.inputs[2] is not None:  # opset 12+: training_mode input
        training = ctx.const(node.inputs[2])
        if training is None or bool(training):
            return None
    return ctx.identity(node.inputs[0], node)


def _single_input(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    node = match[0]
    if len(node.inputs) != 1 or node.inputs[0] is None:
        return None
    return ctx.identity(node.inputs[0], node)


def _same_type_cast(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    node = match[0]
    source = node.inputs[0]
    if source is None or source.dtype is None:
        return None
    if node.op_type == "Cast":
        to = node.attributes.get("to")
        target = None if to is None else ir.DataType(to.as_int())
    else:  # CastLike
        target = node.inputs[1].dtype if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if target is None or target != source.dtype:
        return None
    return ctx.identity(source, node)


def _noop_expand(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    node = match[0]
    shape = static_shape(node.inputs[0])
    target = ctx.const(node.inputs[1])
    if shape is None or target is None:
        return None
    try:
        result = np.broadcast_shapes(shape, tuple(int(d) for d in target))
    except ValueError:
        return None
    return ctx.identity(node.inputs[0], node) if tuple(result) == shape else None


def _noop_pad(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    node = match[0]
    if len(node.inputs) >= 2 and node.inputs[1] is not None:
        pads = ctx.const(node.inputs[1])
    else:
        attr = node.attributes.get("pads")
        pads = None if attr is None else np.asarray(attr.as_ints())
    if pads is None or np.any(pads != 0):
        return None
    return ctx.identity(node.inputs[0], node)


NOOP_RULES: tuple[Rule, ...] = (
    (("Dropout",), _dropout),
    ((frozenset({"Sum", "Max", "Min", "Mean", "Concat"}),), _single_input),
    ((frozenset({"Cast", "CastLike"}),), _same_type_cast),
    (("Expand",), _noop_expand),
    (("Pad",), _noop_pad),
)


def remove_noops() -> RuleRewritePass:
    """Operators that compute nothing at inference become Identity (removed by ``eliminate_identity``)."""
    return RuleRewritePass("remove_noops", NOOP_RULES)


def eliminate_identity() -> OnnxIrPass:
    """onnx-ir's ``IdentityEliminationPass``."""
    return OnnxIrPass("eliminate_identity", IdentityEliminationPass())


def remove_dead_code() -> OnnxIrPass:
    """onnx-ir's unused node / initializer, function and opset-import removal, in one pass."""
    return OnnxIrPass("remove_dead_code", ir.passes.Sequential(
        RemoveUnusedNodesPass(), RemoveUnusedFunctionsPass(), RemoveUnusedOpsetsPass()))
