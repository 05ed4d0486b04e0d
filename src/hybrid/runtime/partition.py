"""Capability-based partitioning: every node to a backend that supports it, in the fewest subgraphs.

The partitioner knows backends only through ``supports(node)`` (STYLE habit 9, like torch.fx's
CapabilityBasedPartitioner). It walks the graph in a topological order that stays on one backend as
long as that backend supports a ready node, so each partition is the largest contiguous run of
nodes one backend can take; partitions are emitted in dependency order, so merging never creates a
cycle. When no partition can continue, the next one goes to the accelerated backend that can absorb
the most nodes from there (ties: priority); the reference backend only takes what nobody else runs.

Each partition becomes a standalone ONNX model whose inputs and outputs are the boundary values.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnx
import onnx_ir as ir

from hybrid.errors import BackendError
from hybrid.hal import Candidate, fallback_backend, get_backend, is_fallback
from hybrid.hal.capability import captured_values, node_opset
from hybrid.ir import Model
from hybrid.runtime.plan import Placement, Segment

__all__ = ["Part", "Partition", "node_label", "partition_graph", "submodel", "supporters", "typed_model"]

logger = logging.getLogger("hybrid")

_ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


@dataclass(frozen=True, slots=True)
class Part:
    """One partition: a candidate and the indices of the top-level nodes it runs, in order."""

    label: Candidate
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Partition:
    """The partitions in execution order, and where each node went and why."""

    parts: tuple[Part, ...]
    placements: tuple[Placement, ...]

    @property
    def assignment(self) -> list[str]:
        """The candidate of every node, by node index (what the decision cache stores)."""
        out = [""] * len(self.placements)
        for part in self.parts:
            for i in part.nodes:
                out[i] = str(part.label)
        return out

    def segments(self, node_names: list[str]) -> tuple[Segment, ...]:
        """The parts as plan :class:`~hybrid.runtime.plan.Segment` records, with ``node_names`` naming the nodes."""
        return tuple(Segment(p.label.backend, p.label.device, tuple(node_names[i] for i in p.nodes), p.inputs,
                             p.outputs, p.reason) for p in self.parts)


def node_label(node: ir.Node, index: int) -> str:
    """How plans name a node: its name, or 'op_type#index' when it has none."""
    return node.name or f"{node.op_type}#{index}"


def _op_name(node: ir.Node) -> str:
    return node.op_type if node.domain in _ONNX_DOMAINS else f"{node.domain}.{node.op_type}"


# ---------------------------------------------------------------------------------------- typing
def typed_model(model: Model, samples: Mapping[str, Any] | None = None) -> ir.Model:
    """A copy of ``model`` with local functions inlined and, where possible, every value typed.

    ONNX shape inference types what it can; values it leaves untyped (outputs of custom ops and
    everything after them) are typed by running the reference backend on ``samples``. Their shapes
    keep only the rank, so partitions stay valid for every input size.
    """
    proto = model.to_onnx()
    if len(proto.functions):
        from onnx import inliner

        proto = inliner.inline_local_functions(proto)
    try:
        proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as e:  # inference is a help, not a requirement
        logger.debug("shape inference failed on %r: %s", model.name, e)
    typed = ir.serde.deserialize_model(proto)
    untyped = [v for n in typed.graph for v in n.outputs if v.name and v.type is None]
    if untyped and samples is not None:
        _type_by_running(typed, proto, untyped, samples)
    return typed


def _type_by_running(typed: ir.Model, proto: onnx.ModelProto, untyped: list[ir.Value],
                     samples: Mapping[str, Any]) -> None:
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(v.name) for v in untyped)
    model = Model(proto=probe, name="typing")
    try:
        exe = get_backend(fallback_backend()).compile(model, "cpu")
        first = dict(zip(exe.output_names, exe.run(dict(samples))))
    except Exception as e:
        logger.debug("could not type %d values by running the reference backend: %s", len(untyped), e)
        return
    # a second run with other sizes for the symbolic input dims tells static dims from dynamic ones
    second: dict[str, Any] = {}
    if any(isinstance(d, str) for s in model.signature.inputs for d in (s.shape or ())):
        from hybrid.runtime.auto.samples import make_samples

        other = make_samples(model, symbolic_size=3)
        try:
            second = dict(zip(exe.output_names, exe.run(other))) if other is not None else {}
        except Exception as e:
            logger.debug("second typing run failed (%s): keeping only ranks", e)
            second = {v.name: None for v in untyped}
    for v in untyped:
        _set_type(v, first.get(v.name), second.get(v.name, first.get(v.name)))
    exe.close()


def _set_type(value: ir.Value, array: Any, again: Any) -> None:
    import numpy as np

    if isinstance(array, (list, tuple)):
        if array and isinstance(array[0], np.ndarray):
            value.type = ir.SequenceType(ir.TensorType(ir.DataType.from_numpy(array[0].dtype)))
        return
    if isinstance(array, np.ndarray):
        try:
            value.dtype = ir.DataType.from_numpy(array.dtype)
        except TypeError:
            return
        same = isinstance(again, np.ndarray) and again.ndim == array.ndim
        value.shape = ir.Shape([d if same and d == again.shape[k] else None for k, d in enumerate(array.shape)])


# ---------------------------------------------------------------------------------------- capability
def supporters(nodes: list[ir.Node], candidates: list[Candidate]) -> list[tuple[Candidate, ...]]:
    """Per node, the candidates whose backend supports it, in candidate (priority) order."""
    backends = {c.backend: get_backend(c.backend) for c in candidates}
    out = []
    for node in nodes:
        ok = []
        for c in candidates:
            try:
                if backends[c.backend].supports(node, c.device):
                    ok.append(c)
            except Exception as e:  # a broken capability check must not break compile
                logger.debug("%s.supports(%s) raised %s", c.backend, node.op_type, e)
        out.append(tuple(ok))
    return out


# ---------------------------------------------------------------------------------------- grouping
def _dependencies(nodes: list[ir.Node]) -> tuple[list[set[int]], list[list[int]]]:
    producer = {v.name: i for i, n in enumerate(nodes) for v in n.outputs if v.name}
    preds: list[set[int]] = []
    for node in nodes:
        reads = [v.name for v in node.inputs if v is not None and v.name]
        reads += [v.name for v in captured_values(node)]
        preds.append({producer[r] for r in reads if r in producer})
    succs: list[list[int]] = [[] for _ in nodes]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    return preds, succs


def _absorb(label: Candidate, ready: set[int], indeg: list[int], succs: list[list[int]],
            able: list[tuple[Candidate, ...]]) -> list[int]:
    """Take every node ``label`` may run that becomes ready, smallest index first (mutates)."""
    fallback = is_fallback(label.backend)

    def fits(i: int) -> bool:
        # the fallback backend runs anything, so it takes only what no other backend can
        return label in able[i] and (not fallback or all(is_fallback(c.backend) for c in able[i]))

    heap = [i for i in ready if fits(i)]
    heapq.heapify(heap)
    taken = []
    while heap:
        i = heapq.heappop(heap)
        ready.discard(i)
        taken.append(i)
        for s in succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.add(s)
                if fits(s):
                    heapq.heappush(heap, s)
    return taken


def _choose(ready: set[int], indeg: list[int], succs: list[list[int]], able: list[tuple[Candidate, ...]],
            order: list[Candidate]) -> Candidate:
    labels = {c for i in ready for c in able[i]}
    rank = {c: k for k, c in enumerate(order)}

    def score(c: Candidate) -> tuple[bool, int, int]:
        taken = _absorb(c, set(ready), list(indeg), succs, able)
        return (is_fallback(c.backend), -len(taken), rank[c])

    return min(labels, key=score)


def _group(able: list[tuple[Candidate, ...]], succs: list[list[int]], preds: list[set[int]],
           order: list[Candidate]) -> list[tuple[Candidate, list[int]]]:
    indeg = [len(p) for p in preds]
    ready = {i for i, d in enumerate(indeg) if d == 0}
    groups: list[tuple[Candidate, list[int]]] = []
    while ready:
        label = _choose(ready, indeg, succs, able, order)
        groups.append((label, _absorb(label, ready, indeg, succs, able)))
    return groups


# ---------------------------------------------------------------------------------------- reasons
def _node_reason(label: Candidate, able: tuple[Candidate, ...], order: list[Candidate], node: ir.Node) -> str:
    before = order[:order.index(label)]
    lacking = [str(c) for c in before if c not in able]
    also = [str(c) for c in before if c in able]
    parts = []
    if is_fallback(label.backend) and node.domain not in _ONNX_DOMAINS and not also:
        parts.append("custom op: only the reference backend has a kernel")
    elif lacking:
        parts.append(f"not supported by {', '.join(lacking)}")
    if also:
        parts.append(f"kept with its neighbours (also runs on {', '.join(also)})")
    return "; ".join(parts) or "first backend by priority that supports it"


def _part_reason(label: Candidate, members: list[int], able: list[tuple[Candidate, ...]], order: list[Candidate],
                 nodes: list[ir.Node]) -> str:
    before = order[:order.index(label)]
    lacking: dict[str, set[str]] = {}
    for i in members:
        missing = {str(c) for c in before if c not in able[i]}
        if missing:
            lacking.setdefault(_op_name(nodes[i]), set()).update(missing)
    if not lacking:
        return "first backend by priority for all its nodes"
    items = [f"{op} (not on {', '.join(sorted(who))})" for op, who in sorted(lacking.items())]
    return "runs " + ", ".join(items[:6]) + (", ..." if len(items) > 6 else "")


# ---------------------------------------------------------------------------------------- partition
def partition_graph(graph: ir.Graph, able: list[tuple[Candidate, ...]], order: list[Candidate]) -> Partition:
    """Assign the top-level nodes of ``graph`` to candidates and cut the graph into partitions.

    Args:
        graph: A typed graph (see :func:`typed_model`).
        able: Per node, the candidates that support it (see :func:`supporters`).
        order: Every candidate, in priority order.

    Raises:
        BackendError: HYB-305 naming the first node no candidate supports.
    """
    nodes = list(graph)
    for i, (node, ok) in enumerate(zip(nodes, able)):
        if not ok:
            raise BackendError("HYB-305", f"no backend of {', '.join(map(str, order))} supports node "
                               f"{node_label(node, i)!r} ({_op_name(node)}, opset {node_opset(node)})",
                               "register it with @hybrid.custom_op, or install a backend that has it")
    preds, succs = _dependencies(nodes)
    groups = _group(able, succs, preds, order)
    names = [node_label(n, i) for i, n in enumerate(nodes)]
    graph_outputs = {v.name for v in graph.outputs}
    consumers: dict[str, set[int]] = {}
    for k, (_, members) in enumerate(groups):
        for i in members:
            node = nodes[i]
            reads = [v.name for v in node.inputs if v is not None and v.name]
            reads += [v.name for v in captured_values(node)]
            for r in reads:
                consumers.setdefault(r, set()).add(k)
    parts = []
    placements: list[Placement | None] = [None] * len(nodes)
    for k, (label, members) in enumerate(groups):
        members = sorted(members)
        produced = [v.name for i in members for v in nodes[i].outputs if v.name]
        produced_set = set(produced)
        inputs: list[str] = []
        for i in members:
            node = nodes[i]
            for v in [*node.inputs, *captured_values(node)]:
                if v is None or not v.name or v.name in produced_set or v.name in inputs:
                    continue
                if v.name in graph.initializers:
                    continue  # constants travel inside the partition's model
                inputs.append(v.name)
        outputs = [n for n in produced if n in graph_outputs or (consumers.get(n, set()) - {k})]
        parts.append(Part(label, tuple(members), tuple(inputs), tuple(outputs),
                          _part_reason(label, members, able, order, nodes)))
        for i in members:
            placements[i] = Placement(names[i], _op_name(nodes[i]), label.backend, label.device,
                                      _node_reason(label, able[i], order, nodes[i]))
    return Partition(tuple(parts), tuple(p for p in placements if p is not None))


def submodel(model_proto: onnx.ModelProto, graph: ir.Graph, part: Part, name: str) -> Model:
    """The standalone ONNX model of one partition: its boundary values become inputs and outputs.

    Args:
        model_proto: The typed model serialized (its top-level nodes in the order of ``graph``).
        graph: The typed graph the partition was computed on.
        part: The partition.
        name: The name of the new model.
    """
    values = {v.name: v for n in graph for v in (*n.inputs, *n.outputs) if v is not None and v.name}
    values.update({v.name: v for v in graph.inputs})
    nodes = list(graph)
    reads = set(part.inputs)
    for i in part.nodes:
        reads.update(v.name for v in nodes[i].inputs if v is not None and v.name)
        reads.update(v.name for v in captured_values(nodes[i]))
    inits = [t for t in model_proto.graph.initializer if t.name in reads]
    g = onnx.helper.make_graph([model_proto.graph.node[i] for i in part.nodes], name,
                               [ir.serde.serialize_value(values[n]) for n in part.inputs],
                               [ir.serde.serialize_value(values[n]) for n in part.outputs], initializer=inits)
    sub = onnx.helper.make_model(g, opset_imports=list(model_proto.opset_import),
                                 ir_version=model_proto.ir_version)
    return Model(proto=sub, name=name)
