"""What the quantizer put in int8, grouped into the units the accuracy search keeps in float.

The quantized ops are read off a fully quantized QDQ model (every node whose inputs come from a
DequantizeLinear), not guessed from op types: Conv and Gemm, but also the activations, the Mul and
Add of squeeze-excitation and residual blocks, pooling, Concat and reshapes, all of which carry int8
tensors too. They are grouped so that keeping a group in float removes whole Q/DQ transitions:

- a chain: an op with one data input joins its producer's group when it is that producer's only
  consumer (Conv + its activation, Add + ReLU, Conv + pooling);
- a gate ``Mul(x, f(x))`` with ``f`` a short chain of one-input ops: a squeeze-excitation block (``f``
  starts with a global pooling: pool, two 1x1 Convs, their activations and the Mul are one group), or
  an activation exported as a gate (HardSwish as ``x * HardSigmoid(x)``, SiLU as ``x * Sigmoid(x)``:
  they join the group of the op producing ``x``);
- everything else (residual Adds, Concat) is a group of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx

__all__ = ["Group", "group_nodes", "neighbours", "quantized_nodes", "smooth"]

HEAVY_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Attention", "LSTM", "GRU"})
_POOLS = frozenset({"GlobalAveragePool", "ReduceMean", "AveragePool"})
_SE_DEPTH = 8  # nodes between the pooling and the Mul of a squeeze-excitation branch


@dataclass(frozen=True, slots=True)
class Group:
    """Nodes kept in float or quantized together.

    Attributes:
        label: The group's name: its first weighted op (Conv, Gemm, ...), else its first node.
        nodes: Node names, in graph order.
        op_types: Their op types, in the same order.
        kind: 'se' (a squeeze-excitation block), else the op types joined with '+'.
    """

    label: str
    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    kind: str = ""


def quantized_nodes(float_model: onnx.ModelProto, quantized: onnx.ModelProto) -> list[str]:
    """Names of the float model's nodes that read int8 tensors (a DequantizeLinear output) in ``quantized``."""
    dq = {n.output[0] for n in quantized.graph.node if n.op_type == "DequantizeLinear"}
    hit = {n.name for n in quantized.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
           and any(i in dq for i in n.input)}
    return [n.name for n in float_model.graph.node if n.name in hit]


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        inits = {t.name for t in model.graph.initializer}
        self.nodes = {n.name: n for n in model.graph.node}
        self.order = {n.name: i for i, n in enumerate(model.graph.node)}
        self.producer: dict[str, str] = {}
        self.consumers: dict[str, list[str]] = {}
        for n in model.graph.node:
            for o in n.output:
                self.producer[o] = n.name
            for i in n.input:
                self.consumers.setdefault(i, []).append(n.name)
        self.data_inputs = {n.name: [i for i in n.input if i and i not in inits and
                                     (i in self.producer or i in {g.name for g in model.graph.input})]
                            for n in model.graph.node}

    def parents(self, name: str) -> list[str]:
        return [self.producer[i] for i in self.data_inputs[name] if i in self.producer]

    def children(self, name: str) -> list[str]:
        return [c for o in self.nodes[name].output for c in self.consumers.get(o, [])]


def group_nodes(model: onnx.ModelProto, quantized: Sequence[str]) -> list[Group]:
    """Group the quantized nodes of ``model`` (see the module docstring), in graph order."""
    g = _Graph(model)
    members = [n for n in quantized if n in g.nodes]
    inside = set(members)
    parent = {n: n for n in members}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            first, second = sorted((ra, rb), key=g.order.__getitem__)
            parent[second] = first

    for name in members:
        if g.nodes[name].op_type in HEAVY_OPS:
            continue
        ins = g.data_inputs[name]
        if len(ins) == 1 and ins[0] in g.producer:
            p = g.producer[ins[0]]
            if p in inside and g.children(p) == [name]:
                union(name, p)
    excite: set[str] = set()  # the Mul of each squeeze-excitation block
    for name in members:  # gates: Mul(x, f(x))
        node = g.nodes[name]
        if node.op_type != "Mul" or len(g.data_inputs[name]) != 2:
            continue
        for x, scale in (g.data_inputs[name], g.data_inputs[name][::-1]):
            path = _branch_to(g, scale, x)
            if path is None:
                continue
            for p in path:
                if p in inside:
                    union(name, p)
            pooled = any(g.nodes[p].op_type in _POOLS for p in path)
            if pooled:
                excite.add(name)
            source = g.producer.get(x)
            if not pooled and source in inside and set(g.consumers.get(x, [])) <= {name, *path}:
                union(name, source)
            break
    groups: dict[str, list[str]] = {}
    for name in members:
        groups.setdefault(find(name), []).append(name)
    out = []
    for nodes in sorted(groups.values(), key=lambda ns: g.order[ns[0]]):
        nodes.sort(key=g.order.__getitem__)
        ops = tuple(g.nodes[n].op_type for n in nodes)
        label = next((n for n, op in zip(nodes, ops) if op in HEAVY_OPS), nodes[0])
        kind = "se" if excite & set(nodes) else "+".join(dict.fromkeys(ops))
        out.append(Group(label, tuple(nodes), ops, kind))
    return out


def _branch_to(g: _Graph, tensor: str, source: str) -> list[str] | None:
    """The chain of one-input ops (a pooling may have more: axes) producing ``tensor`` from ``source``."""
    path = []
    for _ in range(_SE_DEPTH):
        node = g.producer.get(tensor)
        if node is None:
            return None
        path.append(node)
        ins = g.data_inputs[node]
        if not ins or (len(ins) != 1 and g.nodes[node].op_type not in _POOLS):
            return None
        if ins[0] == source:
            return path
        tensor = ins[0]
    return None


def neighbours(model: onnx.ModelProto, groups: Sequence[Group]) -> dict[str, set[str]]:
    """Group label -> labels of the groups it exchanges tensors with."""
    g = _Graph(model)
    owner = {n: grp.label for grp in groups for n in grp.nodes}
    out: dict[str, set[str]] = {grp.label: set() for grp in groups}
    for grp in groups:
        for n in grp.nodes:
            for other in g.parents(n) + g.children(n):
                if other in owner and owner[other] != grp.label:
                    out[grp.label].add(owner[other])
    return out


def smooth(groups: Sequence[Group], links: dict[str, set[str]], excluded: Iterable[str]) -> set[str]:
    """``excluded`` grown into contiguous float regions.

    A quantized group all of whose neighbours stay in float (an int8 island, paying a Quantize and a Dequantize for one
    op), and a group without a weighted op next to a float one (an Add or a pooling alone in int8 saves next to
    nothing), join it.
    """
    out = set(excluded)
    weighted = {grp.label: any(op in HEAVY_OPS for op in grp.op_types) for grp in groups}
    changed = True
    while changed:
        changed = False
        for grp in groups:
            near = links.get(grp.label, set())
            if grp.label in out or not near:
                continue
            if near <= out or (not weighted[grp.label] and near & out):
                out.add(grp.label)
                changed = True
    return out
