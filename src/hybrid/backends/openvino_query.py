"""Per-node capability for OpenVINO, from ``Core.query_model`` on a whole graph.

``query_model`` answers per model and by OpenVINO op names, while the partitioner asks per ONNX
node. So the graph is converted once with every node renamed ``hybrid_node_<index>``; the ops that
the ONNX frontend cannot convert are cut out (their outputs become typed inputs) until the rest
converts; ``query_model`` then names the supported ops, and each op is traced back to its ONNX node by
its name (``hybrid_node_3`` or ``hybrid_node_3/...``) or by the tensor names of its outputs.
"""

from __future__ import annotations

import io
import logging
import re
import threading
import weakref
from typing import Any

import onnx
import onnx_ir as ir

__all__ = ["graph_support"]

logger = logging.getLogger("hybrid")

_UNCONVERTED = {"NotSupportedONNXNode", "ONNXFrameworkNode", "FrameworkNode"}
_PLUMBING = {"Parameter", "Result", "Constant"}
_NAME_RE = re.compile(r"^hybrid_node_(\d+)(?:/|$)")
_MAX_ROUNDS = 8

_LOCK = threading.Lock()
_CACHE: weakref.WeakKeyDictionary[ir.Graph, dict[str, dict[int, bool]]] = weakref.WeakKeyDictionary()


def graph_support(core: Any, graph: ir.Graph, native: str) -> dict[int, bool]:
    """Map ``id(node)`` -> supported for every top-level node of ``graph`` on OpenVINO device ``native``.

    Computed once per (graph, device); valid while the graph lives and is not edited.
    """
    with _LOCK:
        table = _CACHE.get(graph, {}).get(native)
    if table is None:
        table = _query(core, graph, native)
        with _LOCK:
            _CACHE.setdefault(graph, {})[native] = table
    return table


def _owner(op: Any, producers: dict[str, int]) -> int | None:
    m = _NAME_RE.match(op.get_friendly_name())
    if m:
        return int(m.group(1))
    for port in op.outputs():
        for name in port.get_names():
            if name in producers:
                return producers[name]
    return None


def _model_without(graph_proto: onnx.GraphProto, opsets: list[onnx.OperatorSetIdProto], cut: set[int],
                   typed: dict[str, onnx.ValueInfoProto]) -> bytes:
    g = onnx.GraphProto()
    g.CopyFrom(graph_proto)
    del g.node[:]
    g.node.extend(n for i, n in enumerate(graph_proto.node) if i not in cut)
    declared = {v.name for v in g.input}
    for i in sorted(cut):
        for name in graph_proto.node[i].output:
            if name and name in typed and name not in declared:
                g.input.append(typed[name])
                declared.add(name)
    return onnx.helper.make_model(g, opset_imports=opsets).SerializeToString()


def _convert(data: bytes) -> Any:
    from openvino.frontend import FrontEndManager

    fe = FrontEndManager().load_by_framework("onnx")
    return fe.convert_partially(fe.load(io.BytesIO(data)))


def _query(core: Any, graph: ir.Graph, native: str) -> dict[int, bool]:
    nodes = list(graph)
    gp = ir.serde.serialize_graph(graph)
    for i, n in enumerate(gp.node):
        n.name = f"hybrid_node_{i}"
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in graph.opset_imports.items()]
    producers = {v.name: i for i, n in enumerate(nodes) for v in n.outputs if v.name}
    typed = {v.name: ir.serde.serialize_value(v) for n in nodes for v in n.outputs
             if v.name and v.type is not None}
    cut: set[int] = set()
    for round_ in range(_MAX_ROUNDS + 1):
        try:
            converted = _convert(_model_without(gp, opsets, cut, typed))
        except Exception as e:
            logger.debug("openvino could not read graph %r: %s", graph.name, str(e).strip()[:200])
            return {id(n): False for n in nodes}
        failed = [op for op in converted.get_ordered_ops() if op.get_type_name() in _UNCONVERTED]
        if not failed:
            break
        # cut the first failures only: the nodes after them may fail merely for lack of input types
        names = {op.get_friendly_name() for op in failed}
        frontier = [op for op in failed
                    if not any(op.input_value(k).get_node().get_friendly_name() in names
                               for k in range(op.get_input_size()))]
        owners = {_owner(op, producers) for op in frontier} - {None} - cut
        if not owners or round_ == _MAX_ROUNDS - 1:
            owners = {_owner(op, producers) for op in failed} - {None} - cut
        if not owners:  # failures we cannot trace to a node: trust nothing
            return {id(n): False for n in nodes}
        cut |= owners  # type: ignore[arg-type]
    else:
        return {id(n): False for n in nodes}
    try:
        supported = set(core.query_model(converted, native))
    except Exception as e:
        logger.debug("openvino query_model failed on %r: %s", graph.name, str(e).strip()[:200])
        return {id(n): False for n in nodes}
    ok = [i not in cut for i in range(len(nodes))]
    for op in converted.get_ordered_ops():
        if op.get_type_name() in _PLUMBING:
            continue
        i = _owner(op, producers)
        if i is not None and op.get_friendly_name() not in supported:
            ok[i] = False
    return {id(n): ok[i] for i, n in enumerate(nodes)}
