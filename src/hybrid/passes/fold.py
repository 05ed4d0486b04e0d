"""Constant folding: nodes whose inputs are all constants become initializers.

Each such node is evaluated once, at optimize time, by :func:`evaluate_node`. Chains fold in one sweep
because a folded output is a constant for the nodes after it. A node is left alone when its result
would be larger than ``size_limit`` bytes (folding a ``ConstantOfShape`` that generates a 400 MB weight
would only make the model file 400 MB larger), when it is random, a quantization boundary
(``QuantizeLinear``/``DequantizeLinear`` mark where a quantized model computes in int8), carries a
subgraph, or produces a graph output.

Two small normalizations run before folding, so that constants are recognized as such:
:class:`NormalizeInitializers` (models of IR version < 4 list every initializer as a graph input too;
hybrid's signature never offers those as inputs, so they become plain initializers) and
``lift_constants`` (onnx-ir's ``LiftConstantsToInitializersPass``: Constant nodes become initializers).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import LiftConstantsToInitializersPass, RemoveInitializersFromInputsPass

from hybrid import providers
from hybrid.errors import BackendError
from hybrid.passes.base import HybridPass, OnnxIrPass, PassResult
from hybrid.passes.rewrite import const_array, static_shape

__all__ = ["DEFAULT_FOLD_SIZE_LIMIT", "FoldConstants", "NormalizeInitializers", "evaluate_node",
           "lift_constants"]

logger = logging.getLogger("hybrid.passes")

DEFAULT_FOLD_SIZE_LIMIT = 64 << 20  # bytes of one folded node's outputs

# never folded: results differ per run, mark quantized regions, or are not plain tensors
_NEVER_FOLD = frozenset({
    "Constant", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
    "Bernoulli", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "If", "Loop", "Scan",
    "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SequenceAt", "SequenceLength",
    "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalGetElement", "OptionalHasElement",
})


def evaluate_node(node: ir.Node, inputs: list[np.ndarray | None]) -> list[np.ndarray | None]:
    """Compute one node's outputs from constant inputs (None for an omitted optional input).

    This is the one place that chooses the evaluator: hybrid's reference backend (the numpy definition of
    every op hybrid runs, custom ops included). Backends sit above passes, so it is called through
    :func:`hybrid.providers.evaluate_node`, which the facade installs; :func:`_evaluate_with_onnx_reference`
    (ONNX's ``onnx.reference`` on a one-node graph) is the stand-in kept for a node the reference backend has
    no kernel for.
    """
    try:
        return list(providers.evaluate_node(node, inputs))
    except BackendError:  # HYB-305: no kernel for this node
        return _evaluate_with_onnx_reference(node, inputs)


def _evaluate_with_onnx_reference(node: ir.Node, inputs: list[np.ndarray | None]) -> list[np.ndarray | None]:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    proto = ir.serde.serialize_node(node)
    feeds = {name: array for name, array in zip(proto.input, inputs) if name and array is not None}
    graph_inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                    for name, a in feeds.items()]
    wanted = list(dict.fromkeys(name for name in proto.output if name))
    graph_outputs = [helper.make_empty_tensor_value_info(name) for name in wanted]
    # a one-node graph under the model's opsets (a bare NodeProto would run at the newest opset)
    opsets = dict(node.graph.opset_imports) if node.graph is not None else {}
    opsets.setdefault(node.domain, node.version or opsets.get("", 21))
    evaluator = ReferenceEvaluator(helper.make_graph([proto], "fold", graph_inputs, graph_outputs), opsets=opsets)
    results = dict(zip(wanted, evaluator.run(wanted, feeds)))
    return [np.asarray(results[name]) if name else None for name in proto.output]


class NormalizeInitializers(HybridPass):
    """Initializers listed as graph inputs (IR version < 4) become plain initializers (IR version >= 4).

    Uses onnx-ir's ``RemoveInitializersFromInputsPass``; the IR version rises to 4 because before it an
    initializer had to be listed among the inputs.
    """

    name = "normalize_initializers"

    def call(self, model: ir.Model) -> PassResult:
        """Drop initializers from the graph inputs."""
        modified = RemoveInitializersFromInputsPass()(model).modified
        if modified and model.ir_version < 4:
            model.ir_version = 4
        return PassResult(model, modified)


def lift_constants() -> OnnxIrPass:
    """onnx-ir's ``LiftConstantsToInitializersPass``, for every Constant node whatever its size."""
    return OnnxIrPass("lift_constants", LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0))


class FoldConstants(HybridPass):
    """Replace each node whose inputs are all constants by initializers holding its outputs.

    Args:
        size_limit: Largest total size in bytes of one node's folded outputs.
    """

    name = "fold_constants"

    def __init__(self, size_limit: int = DEFAULT_FOLD_SIZE_LIMIT) -> None:
        super().__init__()
        self.size_limit = size_limit

    def call(self, model: ir.Model) -> PassResult:
        """Fold every node whose inputs are all constant (one sweep, in graph order)."""
        graph = model.graph
        folded = 0
        for node in list(graph):
            if not _foldable(node):
                continue
            inputs = [None if v is None else const_array(v) for v in node.inputs]
            if any(v is not None and a is None for v, a in zip(node.inputs, inputs)):
                continue
            estimate = _estimated_nbytes(node, inputs)
            if estimate is not None and estimate > self.size_limit:
                logger.debug("fold_constants: %s would be %d bytes, over the limit", node.name, estimate)
                continue
            try:
                outputs = evaluate_node(node, inputs)
            except Exception as e:  # the runtime evaluates the node instead; nothing is lost
                logger.debug("fold_constants: cannot evaluate %s (%s): %s", node.name, node.op_type, e)
                continue
            if sum(a.nbytes for a in outputs if a is not None) > self.size_limit:
                continue
            if any(a is not None and a.dtype.kind in "OSU" for a in outputs):
                continue  # string tensors stay computed: they have no fixed-size buffer to store
            if _replace_with_constants(graph, node, outputs):
                folded += 1
        if folded:
            logger.debug("fold_constants: folded %d nodes", folded)
        return PassResult(model, folded > 0)


def _foldable(node: ir.Node) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLD:
        return False
    if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
        return False
    return not any(out.is_graph_output() for out in node.outputs)


def _itemsize(value: ir.Value, default: int = 4) -> int:
    dtype = value.dtype
    return default if dtype is None or dtype.itemsize is None else int(np.ceil(dtype.itemsize))


def _estimated_nbytes(node: ir.Node, inputs: list[np.ndarray | None]) -> int | None:
    """The folded size known before evaluating, for the ops whose output dwarfs their inputs."""
    shapes = [static_shape(out) for out in node.outputs if out.name]
    if shapes and all(s is not None for s in shapes):
        return sum(int(np.prod(s)) * _itemsize(out) for s, out in zip(shapes, node.outputs))
    try:
        if node.op_type == "ConstantOfShape" and inputs[0] is not None:
            attr = node.attributes.get("value")
            itemsize = attr.as_tensor().numpy().itemsize if attr is not None else 4
            return int(np.prod(inputs[0], dtype=np.int64)) * itemsize
        if node.op_type == "Expand" and inputs[0] is not None and inputs[1] is not None:
            shape = np.broadcast_shapes(inputs[0].shape, tuple(int(d) for d in inputs[1]))
            return int(np.prod(shape, dtype=np.int64)) * inputs[0].itemsize
        if node.op_type == "Tile" and inputs[0] is not None and inputs[1] is not None:
            return int(inputs[0].size * np.prod(inputs[1], dtype=np.int64)) * inputs[0].itemsize
    except (ValueError, TypeError):
        return None  # shapes that do not broadcast: evaluation will fail and the node stays
    return None


def _replace_with_constants(graph: ir.Graph, node: ir.Node, outputs: list[np.ndarray | None]) -> bool:
    for out, array in zip(node.outputs, outputs):
        if array is None and (out.uses() or out.is_graph_output()):
            return False
    for out, array in zip(node.outputs, outputs):
        if array is None:
            continue
        name = out.name
        tensor = ir.tensor(np.asarray(array, order="C"), name=name)
        const = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype),
                         const_value=tensor)
        out.name = None  # the initializer takes the name over
        graph.register_initializer(const)
        out.replace_all_uses_with(const)
    graph.remove(node, safe=True)
    return True
