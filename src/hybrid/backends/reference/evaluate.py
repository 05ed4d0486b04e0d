"""``evaluate_node``: one node run by the reference kernels, alone (constant folding in the graph optimizer).

Its own module, apart from :mod:`.backend`: the graph optimizer's folding (``hybrid.passes.fold``) evaluates
nodes here, and the backend, which compiles with the optimizer's rules (``hybrid.passes.fuse``), stays out
of that import chain.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnx_ir as ir

from hybrid.backends.reference.interpreter import Program, _describe, compile_graph, free_names, node_runner
from hybrid.backends.reference.step import Step
from hybrid.errors import BackendError, HybridError, RunError, first_line

__all__ = ["evaluate_node"]


def evaluate_node(node: ir.Node, inputs: list[np.ndarray | None],
                  opsets: Mapping[str, int] | None = None) -> list[np.ndarray]:
    """Evaluate one node on given inputs (constant folding in the graph optimizer).

    Args:
        node: The node; its opset comes from ``opsets``, else ``node.version``, else its graph's
            imports, else the newest opset onnx knows.
        inputs: One value per node input (None for a missing optional one).
        opsets: Opset version per domain.

    Raises:
        BackendError: HYB-305 when no kernel exists for the node.
        RunError: HYB-409 when the kernel rejects the inputs.
    """
    if opsets is None:
        graph = node.graph
        opsets = dict(graph.opset_imports) if graph is not None else {}
        if node.version is not None:
            opsets[node.domain] = node.version
    opsets = dict(opsets)
    opsets.setdefault("", onnx.defs.onnx_opset_version())
    subgraphs = [a.value for a in node.attributes.values() if a.type is ir.AttributeType.GRAPH]
    outer = [n for g in subgraphs for n in free_names(g)]
    if outer:
        raise BackendError("HYB-305", f"node {node.name or node.op_type!r} ({node.op_type}): its subgraph reads "
                           f"outer-scope values {outer[:5]}, which a single-node evaluation cannot supply",
                           "evaluate the node as part of its graph (compile the model)")

    def compile_sub(graph: ir.Graph) -> Program:
        return compile_graph(graph, opsets, {}, [v.name for v in graph.inputs])

    run, kind, _ = node_runner(node, opsets, {}, list(inputs), [], compile_sub)
    try:
        out = run(*inputs)
    except HybridError:
        raise
    except Exception as e:
        step = Step(run, (), (), (), node.name or node.op_type, node.op_type, kind)
        raise RunError("HYB-409", f"node {step.label!r} ({node.op_type}) rejected its inputs "
                       f"{_describe(list(inputs))}: {first_line(e)}",
                       "check the input shapes and dtypes against the operator's definition") from e
    return [np.asarray(v) if isinstance(v, np.generic) else v for v in out]
