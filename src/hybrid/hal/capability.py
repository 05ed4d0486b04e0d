"""Helpers behind ``Backend.supports(node)``: op signatures, captured values, one-node probe models.

A backend answers ``supports(node)`` once per *op signature* (domain, op type, opset, input types,
attributes) and caches the answer, so a graph of a thousand nodes costs a handful of probes. The
probe model holds the node alone, its inputs declared with their types and ranks but no static sizes,
so one answer holds for every shape of that signature.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import onnx
import onnx_ir as ir

__all__ = ["captured_values", "node_opset", "one_node_model", "op_signature"]

_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
_PROBE_IR_VERSION = min(onnx.IR_VERSION, 10)


def node_opset(node: ir.Node) -> int:
    """The opset version that governs ``node``: its own, else its graph's import for its domain."""
    if node.version is not None:
        return node.version
    graph = node.graph
    opsets = graph.opset_imports if graph is not None else {}
    domain = "" if node.domain == "ai.onnx" else node.domain
    return opsets.get(domain, onnx.defs.onnx_opset_version() if domain == "" else 1)


def _subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.value
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.value


def captured_values(node: ir.Node) -> list[ir.Value]:
    """Values of an outer scope that the subgraphs of ``node`` (If/Loop/Scan bodies) read.

    They are implicit inputs of the node: a partition boundary or a probe model must provide them.
    """
    inner: set[int] = set()
    reads: list[ir.Value] = []

    def walk(graph: ir.Graph) -> None:
        inner.add(id(graph))
        for n in graph:
            reads.extend(v for v in n.inputs if v is not None)
            for sub in _subgraphs(n):
                walk(sub)

    for sub in _subgraphs(node):
        walk(sub)
    seen: set[str] = set()
    out = []
    for v in reads:
        owner = v.graph
        if owner is not None and id(owner) in inner:
            continue
        if v.name and v.name not in seen:
            seen.add(v.name)
            out.append(v)
    return out


def _attr_key(attr: ir.Attr) -> tuple:
    if attr.type in _GRAPH_ATTRS:
        graphs = [attr.value] if attr.type == ir.AttributeType.GRAPH else list(attr.value)
        digest = hashlib.sha1()
        for g in graphs:
            digest.update(ir.serde.serialize_graph(g).SerializeToString())
        return (attr.name, "graph", digest.hexdigest())
    if attr.type == ir.AttributeType.TENSOR:
        # a Constant's value does not change whether a kernel exists: only its type does
        return (attr.name, "tensor", str(attr.value.dtype))
    if attr.type == ir.AttributeType.TENSORS:
        return (attr.name, "tensors", tuple(str(t.dtype) for t in attr.value))
    value = attr.value
    if isinstance(value, (list, tuple)):
        value = tuple(value)
    return (attr.name, int(attr.type), repr(value))


def op_signature(node: ir.Node) -> tuple:
    """What a capability answer depends on: op, opset, input types, output count, attributes."""
    types = tuple(None if v is None else (str(v.type) if v.type is not None else "?") for v in node.inputs)
    captures = tuple((v.name, str(v.type)) for v in captured_values(node))
    attrs = tuple(sorted(_attr_key(a) for a in node.attributes.values()))
    return (node.domain, node.op_type, node_opset(node), types, len(node.outputs), attrs, captures)


def _rank_only(info: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    tensor = info.type.tensor_type if info.type.HasField("tensor_type") else None
    if tensor is not None and tensor.HasField("shape"):
        for i, dim in enumerate(tensor.shape.dim):
            dim.dim_param = f"d{i}"
    return info


def one_node_model(node: ir.Node) -> onnx.ModelProto | None:
    """A model holding ``node`` alone, its inputs (and captured values) as typed graph inputs.

    Returns None when an input's type is unknown: no probe can then answer for the node.
    """
    inputs: list[onnx.ValueInfoProto] = []
    seen: set[str] = set()
    for v in [*node.inputs, *captured_values(node)]:
        if v is None or not v.name or v.name in seen:
            continue
        if v.type is None:
            return None
        seen.add(v.name)
        inputs.append(_rank_only(ir.serde.serialize_value(v)))
    outputs = []
    for v in node.outputs:
        if not v.name:
            continue
        info = ir.serde.serialize_value(v) if v.type is not None else onnx.helper.make_empty_tensor_value_info(v.name)
        outputs.append(_rank_only(info))
    graph = node.graph
    opsets = dict(graph.opset_imports) if graph is not None else {}
    domain = "" if node.domain == "ai.onnx" else node.domain
    opsets[domain] = node_opset(node)
    proto = onnx.helper.make_graph([ir.serde.serialize_node(node)], "probe", inputs, outputs)
    return onnx.helper.make_model(proto, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()],
                                  ir_version=_PROBE_IR_VERSION)
