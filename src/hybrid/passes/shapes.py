"""Shape inference and the folding of shape computations whose answer is known.

``infer_shapes`` is onnx-ir's ``ShapeInferencePass`` (ONNX's C++ inference, large initializers left out
of the round trip); it only annotates values, so it never keeps the fixpoint loop going. ``fold_shapes``
is a rule table over those annotations:

- ``Shape(x)`` / ``Size(x)`` become constants when the dimensions they read are static;
- ``Gather`` and ``Slice`` of a ``Shape`` become constants when the dimensions they pick are static, even
  if others are symbolic (the batch of a dynamic model stays computed);
- a ``Reshape`` to the shape its input already has disappears, and two Reshapes in a row become one.

Whatever consumes the new constants (Concat, Unsqueeze, arithmetic) is then folded by ``fold_constants``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from hybrid.passes.base import OnnxIrPass
from hybrid.passes.rewrite import Context, Rewrite, Rule, RuleRewritePass, static_shape

__all__ = ["SHAPE_RULES", "fold_shapes", "infer_shapes", "resolve_reshape"]


def infer_shapes() -> OnnxIrPass:
    """onnx-ir's ``ShapeInferencePass`` (lenient: a model ONNX cannot fully infer is left as it is)."""
    return OnnxIrPass("infer_shapes", ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True),
                      counts=False)


def _dims(value: ir.Value | None) -> list[int | None] | None:
    if value is None or value.shape is None:
        return None
    return [d if isinstance(d, int) else None for d in value.shape]


def _shape_vector(node: ir.Node) -> list[int | None] | None:
    """The dimensions a Shape node reads (None where unknown), honouring start/end (opset 15)."""
    dims = _dims(node.inputs[0])
    if dims is None:
        return None
    rank = len(dims)
    start_attr, end_attr = node.attributes.get("start"), node.attributes.get("end")
    start = start_attr.as_int() if start_attr is not None else 0
    end = end_attr.as_int() if end_attr is not None else rank
    start, end = (min(max(i + rank if i < 0 else i, 0), rank) for i in (start, end))
    return dims[start:end]


def _as_constant(dims: Sequence[int | None] | np.ndarray) -> np.ndarray | None:
    values = np.asarray(dims, dtype=object)
    if any(d is None for d in values.reshape(-1)):
        return None
    return values.astype(np.int64)


def _shape(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    vector = _shape_vector(match[0])
    constant = None if vector is None else _as_constant(vector)
    return None if constant is None else Rewrite(outputs=[constant])


def _size(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    shape = static_shape(match[0].inputs[0])
    return None if shape is None else Rewrite(outputs=[np.array(int(np.prod(shape)), dtype=np.int64)])


def _picked_from_shape(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    """Gather or Slice reading a Shape node's output."""
    node = match[0]
    producer = node.inputs[0].producer() if node.inputs[0] is not None else None
    if producer is None or producer.op_type != "Shape" or producer.domain not in ("", "ai.onnx"):
        return None
    vector = _shape_vector(producer)
    if vector is None:
        return None
    dims = np.asarray(vector, dtype=object)
    try:
        picked = _gather(ctx, node, dims) if node.op_type == "Gather" else _slice(ctx, node, dims)
    except (IndexError, ValueError, TypeError):
        return None  # out-of-range indices: the runtime reports them
    constant = None if picked is None else _as_constant(picked)
    return None if constant is None else Rewrite(outputs=[constant])


def _gather(ctx: Context, node: ir.Node, dims: np.ndarray) -> np.ndarray | None:
    indices = ctx.const(node.inputs[1])
    axis = node.attributes.get("axis")
    if indices is None or (axis is not None and axis.as_int() not in (0, -1)):
        return None
    return dims[indices.astype(np.int64)]


def _slice(ctx: Context, node: ir.Node, dims: np.ndarray) -> np.ndarray | None:
    if ctx.opset < 10:
        starts = node.attributes.get("starts")
        ends = node.attributes.get("ends")
        if starts is None or ends is None:
            return None
        start_list, end_list, steps = starts.as_ints(), ends.as_ints(), [1]
    else:
        arrays = [ctx.const(v) if v is not None else None for v in node.inputs[1:]]
        if len(arrays) < 2 or arrays[0] is None or arrays[1] is None:
            return None
        if any(v is not None and a is None for v, a in zip(node.inputs[1:], arrays)):
            return None
        start_list, end_list = arrays[0].tolist(), arrays[1].tolist()
        steps = arrays[3].tolist() if len(arrays) > 3 and arrays[3] is not None else [1]
    if len(start_list) != 1 or len(end_list) != 1 or len(steps) != 1 or steps[0] == 0:
        return None  # a shape vector has one axis
    return dims[slice(int(start_list[0]), int(end_list[0]), int(steps[0]))]


def resolve_reshape(source: Sequence[int], target: Sequence[int], allowzero: bool) -> tuple[int, ...] | None:
    """The shape a Reshape of a ``source``-shaped tensor to ``target`` produces (0 and -1 resolved)."""
    dims = [source[i] if d == 0 and not allowzero and i < len(source) else int(d) for i, d in enumerate(target)]
    if dims.count(-1) > 1:
        return None
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1]))
        if known == 0:
            return None
        dims[dims.index(-1)] = int(np.prod(source)) // known
    return tuple(dims) if int(np.prod(dims)) == int(np.prod(source)) else None


def _noop_reshape(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    node = match[0]
    source = static_shape(node.inputs[0])
    target = ctx.const(node.inputs[1]) if len(node.inputs) > 1 else None
    if source is None or target is None:
        return None
    allowzero = bool(node.attributes["allowzero"].as_int()) if "allowzero" in node.attributes else False
    if resolve_reshape(source, target.tolist(), allowzero) != tuple(source):
        return None
    return ctx.identity(node.inputs[0], node)


def _reshape_reshape(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    first, second = match
    target = ctx.const(second.inputs[1])
    if target is None:
        return None
    allowzero = bool(second.attributes["allowzero"].as_int()) if "allowzero" in second.attributes else False
    if not allowzero and 0 in target.tolist():
        middle = static_shape(first.outputs[0])
        if middle is None:
            return None  # a 0 copies a dimension of the middle tensor, which is not known
        target = np.array([middle[i] if d == 0 else d for i, d in enumerate(target.tolist())], dtype=np.int64)
    shape = ctx.initializer(target.astype(np.int64), f"{second.outputs[0].name}_shape")
    node = ctx.node("Reshape", [first.inputs[0], shape], like=second, attributes=second.attributes.values())
    return Rewrite([node], node.outputs)


SHAPE_RULES: tuple[Rule, ...] = (
    (("Shape",), _shape),
    (("Size",), _size),
    ((frozenset({"Gather", "Slice"}),), _picked_from_shape),
    (("Reshape", "Reshape"), _reshape_reshape),
    (("Reshape",), _noop_reshape),
)


def fold_shapes() -> RuleRewritePass:
    """The shape rule table as one pass (run after ``infer_shapes``)."""
    return RuleRewritePass("fold_shapes", SHAPE_RULES)
