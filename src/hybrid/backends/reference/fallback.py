"""Per-node fallback to ``onnx.reference``: coverage is never lower than ONNX's own evaluator.

A node without a hand kernel runs through a one-node ``ReferenceEvaluator`` built once at compile
time; outer-scope values that its subgraphs read are passed as extra graph inputs, so operators
such as SequenceMap keep working inside hybrid's interpreter.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

__all__ = ["fallback_kernel", "onnx_reference_has"]


@functools.lru_cache(maxsize=4096)
def onnx_reference_has(domain: str, op_type: str, version: int) -> bool:
    """Whether ``onnx.reference`` implements ``(domain, op_type)`` at ``version`` (nothing is run)."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import RuntimeContextError
    from onnx.reference.ops import load_op

    loaders = {"": load_op}
    try:
        if domain == "ai.onnx.ml":
            from onnx.reference.ops.aionnxml import load_op as ml_load

            loaders[domain] = ml_load
        elif domain == "ai.onnx.preview.training":
            from onnx.reference.ops.aionnx_preview_training import load_op as tr_load

            loaders[domain] = tr_load
        elif domain == "ai.onnx.preview":
            from onnx.reference.ops.aionnx_preview import load_op as pv_load

            loaders[domain] = pv_load
        elif domain == "experimental":
            from onnx.reference.ops.experimental import load_op as ex_load

            loaders[domain] = ex_load
    except ImportError:
        return False
    loader = loaders.get(domain)
    if loader is None:
        return False
    try:
        if domain == "":
            cls = loader(domain, op_type, version, evaluator_cls=ReferenceEvaluator)
        else:
            cls = loader(domain, op_type, version)
    except RuntimeContextError:
        return True  # a context-dependent function body: resolved from input types at run time
    except Exception:
        return False
    return cls is not None


def _value_info(name: str, value: Any = None) -> onnx.ValueInfoProto:
    if isinstance(value, np.ndarray) and value.dtype != object:
        try:
            elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        except (KeyError, ValueError, TypeError):
            elem = None
        if elem is not None:
            return onnx.helper.make_tensor_value_info(name, elem, value.shape)
    vi = onnx.ValueInfoProto()
    vi.name = name
    return vi


def _context_dependent(domain: str, op_type: str, version: int) -> bool:
    """Whether the op is a function whose body onnx builds from its input types."""
    if domain != "":
        return False
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return False
    from onnx.reference.ops._op_list import _registered_operators

    known = _registered_operators or {}
    return schema.has_context_dependent_function and not schema.has_function and op_type not in known


def fallback_kernel(node: ir.Node, opsets: Mapping[str, int], captures: Sequence[str]) -> Any:
    """Build the run-time callable for ``node`` from ``onnx.reference``.

    Returns:
        ``run(*inputs, *captured) -> tuple``: the node's outputs in order (None where the node
        leaves an optional output unnamed).
    """
    from onnx.reference import ReferenceEvaluator

    proto = ir.serde.serialize_node(node)
    in_names = [i for i in proto.input if i]
    out_names = list(proto.output)
    graph_inputs = list(dict.fromkeys([*in_names, *captures]))
    named_outs = [n for n in out_names if n]

    def build(feeds: dict[str, Any]) -> Any:
        graph = onnx.helper.make_graph([proto], f"fallback_{node.op_type}",
                                       [_value_info(n, feeds.get(n)) for n in graph_inputs],
                                       [_value_info(n) for n in named_outs])
        return ReferenceEvaluator(graph, opsets=dict(opsets))

    # a context-dependent function's body depends on its input types: one evaluator per type signature
    typed = _context_dependent(node.domain, node.op_type, opsets.get(node.domain, 1))
    evaluators: dict[Any, Any] = {} if typed else {None: build({})}
    positions = list(proto.input)
    n_own = len(positions)

    def call(*args: Any) -> tuple:
        feeds = {name: value for name, value in zip(positions, args[:n_own]) if name}
        feeds.update(zip(captures, args[n_own:]))
        key = tuple((getattr(v, "dtype", None), getattr(v, "shape", None)) for v in feeds.values()) if typed else None
        evaluator = evaluators.get(key)
        if evaluator is None:
            evaluator = evaluators[key] = build(feeds)
        got = dict(zip(named_outs, evaluator.run(named_outs, feeds)))
        return tuple(got.get(n) if n else None for n in out_names)

    call.__name__ = f"onnx_reference_{node.op_type}"
    return call
