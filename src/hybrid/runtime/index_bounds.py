"""Which integer inputs of a model index a table, and the table's size: found once, from the graph.

An input is bounded when it feeds the indices of a main-graph ``Gather`` whose data is a constant of the
model (an initializer no caller can override, or a ``Constant``) with a static size N along the gathered
axis, directly or through ops that keep every value as it is (Identity, Reshape, Squeeze, Unsqueeze,
Flatten, Transpose, and a Cast to an integer type that holds every value of its source). Every value of
such an input is then read as an index, and ONNX defines only ``[-N, N)``. An op that drops values (Slice,
a Gather of the indices themselves) ends the walk, so no value a model never reads is judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

if TYPE_CHECKING:
    from hybrid.ir import Model

__all__ = ["IndexBound", "index_bounds"]

# ops whose output holds exactly the values of their first input (a reshuffle, never a drop or a change)
_KEEP_VALUES = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"})
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True, slots=True)
class IndexBound:
    """The range one input's values must lie in: ``[-size, size)``.

    Attributes:
        size: Rows (along the gathered axis) of the smallest table the input indexes.
        table: That table and the node reading it, for messages ("'word_embeddings' (Gather 'g0', axis 0)").
    """

    size: int
    table: str


def index_bounds(model: Model) -> dict[str, IndexBound]:
    """The model's integer inputs that index a constant table, by name, with the smallest table's size.

    Inputs whose values reach no such table, or reach one only through ops that may drop values, are absent.
    """
    graph = model.graph
    found: dict[str, IndexBound] = {}
    for value in graph.inputs:
        if value.is_initializer() or value.name is None:  # a default the caller may override: not an index
            continue
        dtype = _np_dtype(value.dtype)
        if dtype is None or dtype.kind not in "iu":
            continue
        bound = _smallest_table(graph, value, dtype)
        if bound is not None:
            found[value.name] = bound
    return found


def _smallest_table(graph: ir.Graph, start: ir.Value, dtype: np.dtype) -> IndexBound | None:
    best: IndexBound | None = None
    todo = [(start, dtype)]
    seen: set[int] = set()
    while todo:
        value, src = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        for node, index in value.uses():
            if node.graph is not graph or node.domain not in _DEFAULT_DOMAINS:
                continue  # a subgraph's node may never run; a custom op's meaning is unknown
            op = node.op_type
            if op == "Gather" and index == 1:
                bound = _table_of(node)
                if bound is not None and (best is None or bound.size < best.size):
                    best = bound
            elif index == 0 and op in _KEEP_VALUES and node.outputs:
                todo.append((node.outputs[0], src))
            elif index == 0 and op == "Cast":
                to = _np_dtype(ir.DataType(_int_attr(node, "to", 0)))
                if to is not None and to.kind in "iu" and np.can_cast(src, to, "safe"):
                    todo.append((node.outputs[0], to))
    return best


def _table_of(gather: ir.Node) -> IndexBound | None:
    """The size of a Gather's data along its axis, when the data is a constant of static shape."""
    data = gather.inputs[0]
    if data is None:
        return None
    shape: tuple[int, ...] | None = None
    if data.is_initializer() and not data.is_graph_input() and data.const_value is not None:
        shape = tuple(data.const_value.shape)
    else:
        producer = data.producer()
        if producer is not None and producer.op_type == "Constant" and producer.domain in _DEFAULT_DOMAINS:
            attr = producer.attributes.get("value")
            if attr is not None and isinstance(attr.value, ir.TensorProtocol):
                shape = tuple(attr.value.shape)
    if not shape or not all(isinstance(d, int) for d in shape):
        return None
    axis = _int_attr(gather, "axis", 0)
    if not -len(shape) <= axis < len(shape):
        return None
    size = shape[axis]
    where = f"{gather.op_type} {gather.name!r}, axis {axis}" if gather.name else f"{gather.op_type}, axis {axis}"
    return IndexBound(int(size), f"{data.name!r} ({where})")


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.value)


def _np_dtype(dtype: ir.DataType | None) -> np.dtype | None:
    if dtype is None:
        return None
    try:
        return np.dtype(dtype.numpy())
    except (TypeError, ValueError):  # strings, float4 and other types numpy has no integer view of
        return None
