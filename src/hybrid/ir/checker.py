"""The load-time model check: ``onnx.checker`` with shape inference (``full_check``).

It gives a precise message for the most common broken graph, a node that reads a value nothing defines.

Big models (and models with external data) are checked without their weights: each initializer becomes
a graph input of the same type and shape, so the checker sees the same graph and shapes without parsing
hundreds of megabytes again.

Custom domains are not checked (``check_custom_domain=False``): a node of an unregistered domain is
accepted as it is, so models with custom ops (``@hybrid.custom_op``, contrib ops) load as before.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import onnx

from hybrid.errors import ModelError

__all__ = ["check_graph", "undefined_inputs"]

logger = logging.getLogger("hybrid")

# models above this many bytes are not handed to onnx.checker whole: it would parse and walk the
# weights (about 3 ms per MB); the graph is checked with each initializer declared as a graph input of
# the same type and shape instead, which checks the same structure and shapes at the cost of the graph
SKELETON_ABOVE_BYTES = 16 << 20

def _graph_names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    names |= {t.values.name for t in graph.sparse_initializer}
    for node in graph.node:
        names.update(o for o in node.output if o)
    return names


def undefined_inputs(graph: onnx.GraphProto, outer: frozenset[str] = frozenset()) -> Iterator[tuple[str, str, str]]:
    """(node name, op type, value name) for every node input that nothing defines.

    Defined means by a graph input, an initializer, a node output or an enclosing graph; subgraphs (If,
    Loop, Scan bodies) are searched too. An undefined graph output comes as ``("<graph output>", "", name)``.
    """
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


def _skeleton(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` without its top-level initializers' data: each becomes a graph input of its type and shape."""
    out = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(out, field, getattr(proto, field))
    out.opset_import.extend(proto.opset_import)
    out.functions.extend(proto.functions)
    src, graph = proto.graph, out.graph
    graph.name = src.name
    graph.node.extend(src.node)
    graph.input.extend(src.input)
    graph.output.extend(src.output)
    graph.value_info.extend(src.value_info)
    declared = {v.name for v in src.input}
    for t in src.initializer:
        if t.name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    for t in src.sparse_initializer:
        if t.values.name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(t.values.name, t.values.data_type, list(t.dims)))
    return out


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
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
    if external or data is None or len(data) > SKELETON_ABOVE_BYTES:
        blob = _skeleton(proto).SerializeToString()
    else:
        blob = data
    try:
        onnx.checker.check_model(blob, full_check=True)
    except onnx.shape_inference.InferenceError as e:
        if not _DECLARED_SHAPE_WRONG.search(str(e)):
            raise _broken(where, e) from e
        # a declared shape that disagrees with what the graph computes: common in exported models and run
        # by every runtime (ONNX Runtime warns); the structure must still be valid
        logger.warning("%s: a declared shape is wrong (%s); the shapes the model computes are used", where,
                       " ".join(str(e).split())[:300])
        try:
            onnx.checker.check_model(blob, full_check=False)
        except onnx.checker.ValidationError as e2:
            raise _broken(where, e2) from e2
    except onnx.checker.ValidationError as e:
        raise _broken(where, e) from e


_DECLARED_SHAPE_WRONG = re.compile(r"Inferred shape and existing shape differ|Inferred elem type differs")


def _broken(where: str, e: Exception) -> ModelError:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return ModelError("HYB-205", f"{where}: the model breaks an ONNX rule: {' '.join(lines)[:600]}",
                      "onnx.checker.check_model(model, full_check=True) shows the same; fix the exporter "
                      "or the graph edit that produced it")
