"""Graph invariants checked after every pass in debug and test runs (``HYBRID_VERIFY_PASSES=1``).

The checks are the ones a rewrite most easily breaks (torch.fx's ``lint`` checks the same): nodes in
topological order, every input defined before use (in the graph or an enclosing one), use lists that agree
with the inputs, every value name unique across the model and its subgraphs, every graph output defined.
"""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["GraphInvalid", "verify_model"]


class GraphInvalid(Exception):
    """The graph breaks an invariant; the message names the node and value."""


def verify_model(model: ir.Model) -> None:
    """Check the model's main graph, its subgraphs and its functions.

    Raises:
        GraphInvalid: on the first broken invariant.
    """
    _verify_graph(model.graph, set(), {})
    for function in model.functions.values():
        _verify_graph(function, set(), {})


def _describe(node: ir.Node) -> str:
    return f"node {node.name or '<unnamed>'!r} ({node.op_type})"


def _claim(names: dict[str, ir.Value], value: ir.Value, where: str) -> None:
    name = value.name
    if not name:
        raise GraphInvalid(f"{where} has a value without a name")
    seen = names.get(name)
    if seen is not None and seen is not value:
        raise GraphInvalid(f"{where}: value name {name!r} is used by two different values")
    names[name] = value


def _verify_graph(graph: ir.Graph | ir.Function, outer: set[ir.Value], names: dict[str, ir.Value]) -> None:
    defined = set(outer)
    for value in graph.inputs:
        _claim(names, value, f"graph {graph.name!r} input")
        defined.add(value)
    initializers = graph.initializers.values() if isinstance(graph, ir.Graph) else ()
    for value in initializers:
        _claim(names, value, f"graph {graph.name!r} initializer")
        defined.add(value)
    for node in graph:
        where = _describe(node)
        if node.graph is not graph:
            raise GraphInvalid(f"{where} is listed in graph {graph.name!r} but belongs to another graph")
        for index, value in enumerate(node.inputs):
            if value is None:
                continue
            if value not in defined:
                producer = value.producer()
                origin = "is never defined" if producer is None or producer.graph is None else \
                    f"is produced later by {_describe(producer)}"
                raise GraphInvalid(f"{where} input {index} {value.name!r} {origin} (not in topological order)")
            if (node, index) not in {(use.node, use.idx) for use in value.uses()}:
                raise GraphInvalid(f"{where} input {index} {value.name!r}: the value's use list misses it")
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                _verify_graph(attr.as_graph(), defined, names)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.as_graphs():
                    _verify_graph(sub, defined, names)
        for value in node.outputs:
            if value.producer() is not node:
                raise GraphInvalid(f"{where} output {value.name!r} names another producer")
            if value.name:  # an optional output left out has an empty name
                _claim(names, value, where)
            defined.add(value)
    for value in graph.outputs:
        if value not in defined:
            raise GraphInvalid(f"graph {graph.name!r} output {value.name!r} is not produced by any node, "
                               "input or initializer")
