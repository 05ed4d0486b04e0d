"""Rule-table rewriting: ``(pattern, fn)`` pairs, where ``fn`` returns the replacement or None.

A pattern is a chain of operator types read producer first, anchor last: ``("Conv",
"BatchNormalization")`` matches a BatchNormalization whose data comes from a Conv. An element may be a
set of operator types. Matching walks back from the anchor through the node's inputs; every matched node
but the anchor must feed only the next node of the chain (the rewrite removes it), so rules never have to
check single use themselves. ``fn(ctx, match)`` looks at the matched nodes and returns a
:class:`Rewrite` (new nodes and the values that replace the anchor's outputs, or constant arrays) or None
when the rule does not apply. Adding a fusion is adding a row to a table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from hybrid.passes.base import HybridPass, PassResult

__all__ = ["Context", "Rewrite", "Rule", "RuleRewritePass", "const_array", "per_channel", "rank_of"]

logger = logging.getLogger("hybrid.passes")

OpPattern = str | frozenset[str]
RuleFn = Callable[["Context", Sequence[ir.Node]], "Rewrite | None"]
Rule = tuple[tuple[OpPattern, ...], RuleFn]


@dataclass(frozen=True, slots=True)
class Rewrite:
    """A rule's answer: insert ``nodes`` and let ``outputs`` replace the anchor's outputs, in order.

    An entry of ``outputs`` is a value (an output of one of ``nodes``) or a numpy array, which becomes an
    initializer. Anchor outputs past ``len(outputs)`` must be unused (optional outputs such as a Dropout
    mask); the engine checks it.
    """

    nodes: Sequence[ir.Node] = ()
    outputs: Sequence[ir.Value | np.ndarray] = ()


@dataclass(slots=True)
class Context:
    """What a rule may use: the graph, the opset, constants, fresh names, new nodes and initializers."""

    graph: ir.Graph
    opset: int
    names: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, model: ir.Model) -> Context:
        """The context of ``model``'s main graph (every name in use recorded)."""
        names = {v.name for v in model.graph.inputs if v.name}
        names.update(model.graph.initializers)
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            names.update(v.name for v in node.outputs if v.name)
            if node.name:
                names.add(node.name)
        return cls(model.graph, model.opset_imports.get("", 1), names)

    def fresh(self, base: str) -> str:
        """A value or node name not used anywhere in the model."""
        name, n = base, 0
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return name

    def const(self, value: ir.Value | None) -> np.ndarray | None:
        """The value's constant array, or None (see :func:`const_array`)."""
        return const_array(value)

    def initializer(self, array: np.ndarray, base: str) -> ir.Value:
        """Register ``array`` as a new initializer and return its value."""
        name = self.fresh(base)
        tensor = ir.tensor(np.asarray(array, order="C"), name=name)
        value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype),
                         const_value=tensor)
        self.graph.register_initializer(value)
        return value

    def node(self, op_type: str, inputs: Sequence[ir.Value | None], *, like: ir.Node,
             attributes: Iterable[ir.Attr] | dict[str, Any] = (), num_outputs: int = 1) -> ir.Node:
        """A new default-domain node named after ``like`` (the node it replaces)."""
        if isinstance(attributes, dict):
            attributes = [ir.convenience.convert_attribute(k, v) for k, v in attributes.items()]
        attrs = [_copy_attr(a) for a in attributes]
        name = self.fresh(f"{like.name or op_type}_{op_type.lower()}")
        outputs = [ir.Value(name=self.fresh(f"{name}_out{i}")) for i in range(num_outputs)]
        return ir.Node("", op_type, inputs, attributes=attrs, outputs=outputs, name=name)

    def identity(self, value: ir.Value, like: ir.Node) -> Rewrite:
        """Replace the anchor by ``value`` (through an Identity node that identity elimination removes)."""
        node = self.node("Identity", [value], like=like)
        return Rewrite([node], node.outputs)


def _copy_attr(attr: ir.Attr) -> ir.Attr:
    return ir.Attr(attr.name, attr.type, attr.value, doc_string=attr.doc_string)


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's constant array, or None when it is computed or can be fed (a graph input)."""
    if value is None or value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    try:
        return tensor.numpy()
    except Exception:  # an external tensor whose file is gone, a string tensor without numpy form
        return None


def rank_of(value: ir.Value | None) -> int | None:
    """The value's rank when shape inference or the model says it."""
    if value is None:
        return None
    if value.shape is not None:
        return len(value.shape)
    array = const_array(value)
    return None if array is None else array.ndim


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The value's shape when every dimension is a known int."""
    if value is None or value.shape is None:
        return None
    dims = tuple(value.shape)
    if all(isinstance(d, int) for d in dims):
        return dims  # type: ignore[return-value]
    return None


def per_channel(array: np.ndarray, rank: int, channels: int, axis: int = 1) -> np.ndarray | None:
    """``array`` as a length-``channels`` vector, or None.

    A vector when it broadcasts against a rank-``rank`` tensor along ``axis`` only, without changing that
    tensor's shape; None otherwise.
    """
    if array.ndim > rank:
        return None
    aligned = (1,) * (rank - array.ndim) + tuple(array.shape)
    if any(d != 1 for i, d in enumerate(aligned) if i != axis) or aligned[axis] not in (1, channels):
        return None
    return np.broadcast_to(array.reshape(-1), (channels,)) if array.size == 1 else array.reshape(channels)


class RuleRewritePass(HybridPass):
    """Apply a rule table once over the graph (the pass manager repeats passes to a fixpoint).

    Args:
        name: The pass name.
        rules: ``(pattern, fn)`` rows, tried in order for each node; the first that returns a rewrite wins.
    """

    def __init__(self, name: str, rules: Sequence[Rule]) -> None:
        super().__init__()
        self.name = name
        self.rules = tuple(rules)
        self._by_anchor: dict[str, list[Rule]] = {}
        for rule in self.rules:
            for op in _ops(rule[0][-1]):
                self._by_anchor.setdefault(op, []).append(rule)

    def call(self, model: ir.Model) -> PassResult:
        """Apply the rule table once over the graph's nodes."""
        ctx = Context.of(model)
        count = 0
        for node in list(model.graph):
            if node.graph is None or node.domain not in ("", "ai.onnx"):
                continue  # removed by an earlier rewrite in this sweep, or a custom op
            for pattern, fn in self._by_anchor.get(node.op_type, ()):
                match = _match(node, pattern)
                if match is None:
                    continue
                rewrite = fn(ctx, match)
                if rewrite is not None and _apply(ctx, match, rewrite):
                    count += 1
                    logger.debug("%s: %s rewrote %s", self.name, fn.__name__, [n.name for n in match])
                    break
        return PassResult(model, count > 0)


def _ops(element: OpPattern) -> frozenset[str]:
    return frozenset([element]) if isinstance(element, str) else element


def _match(anchor: ir.Node, pattern: tuple[OpPattern, ...]) -> list[ir.Node] | None:
    matched = [anchor]
    current = anchor
    for element in reversed(pattern[:-1]):
        ops = _ops(element)
        found = None
        for value in current.inputs:
            producer = value.producer() if value is not None else None
            if (producer is not None and producer.op_type in ops and producer.domain in ("", "ai.onnx")
                    and producer.graph is anchor.graph and _feeds_only(producer, current)):
                found = producer
                break
        if found is None:
            return None
        matched.append(found)
        current = found
    matched.reverse()
    return matched


def _feeds_only(producer: ir.Node, consumer: ir.Node) -> bool:
    for out in producer.outputs:
        if out.is_graph_output():
            return False
        if any(use.node is not consumer for use in out.uses()):
            return False
    return True


def _apply(ctx: Context, match: list[ir.Node], rewrite: Rewrite) -> bool:
    anchor = match[-1]
    outputs = list(rewrite.outputs)
    if len(outputs) > len(anchor.outputs):
        raise ValueError(f"rule gave {len(outputs)} outputs for {anchor.op_type} with {len(anchor.outputs)}")
    for extra in anchor.outputs[len(outputs):]:
        if extra.uses() or extra.is_graph_output():
            return False  # an optional output the rewrite drops is still used
    if any(isinstance(new, np.ndarray) and old.is_graph_output() for old, new in zip(anchor.outputs, outputs)):
        return False  # graph outputs stay produced by nodes: an initializer cannot stand in for one everywhere
    old_values, new_values, constants = [], [], []
    for old, new in zip(anchor.outputs, outputs):
        if isinstance(new, np.ndarray):
            new = _constant_named(ctx, old, new)
            constants.append(new)
        old_values.append(old)
        new_values.append(new)
    ir.convenience.replace_nodes_and_values(ctx.graph, anchor, match, list(rewrite.nodes),
                                            old_values, new_values)
    for value in constants:  # replace_nodes_and_values copied the old (possibly symbolic) shape over
        value.shape = ir.Shape(value.const_value.shape)
    return True


def _constant_named(ctx: Context, old: ir.Value, array: np.ndarray) -> ir.Value:
    """A new initializer that takes over ``old``'s name (``old`` leaves the graph with its node)."""
    name = old.name or ctx.fresh("folded")
    tensor = ir.tensor(np.asarray(array, order="C"), name=name)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    old.name = None  # free the name before the initializer registry takes it
    ctx.graph.register_initializer(value)
    return value
