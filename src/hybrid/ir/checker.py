"""The load-time model check: ``onnx.checker`` (with shape inference where the model is small enough),
and a precise message for the most common broken graph, a node that reads a value nothing defines.

Custom domains are not checked (``check_custom_domain=False``): a node of an unregistered domain is
accepted as it is, so models with custom ops (``@hybrid.custom_op``, contrib ops) load as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import onnx

from hybrid.errors import ModelError

__all__ = ["check_graph", "undefined_inputs"]

logger = logging.getLogger("hybrid")

# shape inference over every node costs about as much as parsing; above this size only the structure
# (names, topological order, attributes, opsets) is checked
FULL_CHECK_MAX_BYTES = 256 << 20


def _graph_names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    names |= {t.values.name for t in graph.sparse_initializer}
    for node in graph.node:
        names.update(o for o in node.output if o)
    return names


def undefined_inputs(graph: onnx.GraphProto, outer: frozenset[str] = frozenset()) -> Iterator[tuple[str, str, str]]:
    """(node name, op type, value name) for every node input that no graph input, initializer, node
    output or enclosing graph defines; subgraphs (If, Loop, Scan bodies) are searched too."""
    defined = outer | _graph_names(graph)
    for i, node in enumerate(graph.node):
        for value in node.input:
            if value and value not in defined:
                yield node.name or f"#{i}", node.op_type, value
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                yield from undefined_inputs(sub, frozenset(defined))
    for out in graph.output:
        if out.name and out.name not in defined:
            yield "<graph output>", "", out.name


def check_graph(proto: onnx.ModelProto, data: bytes | None, where: str) -> None:
    """Check a freshly parsed model; raise a coded ModelError when it is broken.

    Args:
        proto: The parsed model.
        data: Its serialized bytes when at hand (saves serializing again), else None.
        where: The model's path or '<bytes>', for messages.

    Raises:
        ModelError: HYB-205 naming the node and the undefined value, or carrying onnx.checker's reason.
    """
    missing = next(undefined_inputs(proto.graph), None)
    if missing is not None:
        node, op, value = missing
        what = "the graph output" if op == "" else f"node {node!r} ({op}) reads"
        raise ModelError("HYB-205", f"{where}: {what} value {value!r}, which no graph input, initializer or "
                         "earlier node defines", "fix the exporter or the graph edit that dropped the producer of "
                         f"{value!r} (onnx.checker.check_model reports the same)")
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        return  # the checker resolves external files against the working folder; Model.load checks them
    blob = data if data is not None else proto.SerializeToString()
    if len(blob) > onnx.checker.MAXIMUM_PROTOBUF:
        return
    try:
        onnx.checker.check_model(blob, full_check=len(blob) <= FULL_CHECK_MAX_BYTES)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        raise ModelError("HYB-205", f"{where}: the model breaks an ONNX rule: {' '.join(lines)[:600]}",
                         "onnx.checker.check_model(model, full_check=True) shows the same; fix the exporter "
                         "or the graph edit that produced it") from e
