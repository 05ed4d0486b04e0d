"""The interpreter: a graph compiled once into a flat list of steps over numbered slots.

Compilation resolves every node to a kernel (hand kernel, custom op, or the ``onnx.reference``
fallback), evaluates nodes whose inputs are all constant, computes liveness once (the step after
which each intermediate is dead, STYLE habit 8) and precomputes everything a step needs, so that
running a node costs one list comprehension and one call.

Values are held in a list indexed by slot. Slot 0 is always None (a missing optional input), and
constants sit in a template list copied at the start of each run. Intermediates enter the store in
exactly one place, :meth:`Program.run`, which is where a memory pool would hand out and take back
buffers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from hybrid.backends.reference import registry
from hybrid.backends.reference.fallback import fallback_kernel, onnx_reference_has
from hybrid.backends.reference.fusion import fuse_steps
from hybrid.backends.reference.step import Step  # re-exported: the interpreter's steps
from hybrid.errors import BackendError, HybridError, RunError, first_line
from hybrid.hal import memory

__all__ = ["Program", "Step", "compile_graph", "convert_attr", "free_names", "node_runner"]

logger = logging.getLogger("hybrid")


def convert_attr(attr: ir.Attr) -> Any:
    """An onnx-ir attribute as the Python value kernels take (tuples for lists, numpy for tensors)."""
    t = attr.type
    value = attr.value
    if t is ir.AttributeType.TENSOR:
        return value.numpy()
    if t is ir.AttributeType.TENSORS:
        return [v.numpy() for v in value]
    if t in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return tuple(value)
    return value


def free_names(graph: ir.Graph) -> list[str]:
    """Names a (sub)graph reads from enclosing scopes, in first-use order."""
    defined = {v.name for v in graph.inputs} | set(graph.initializers)
    used: dict[str, None] = {}

    def visit(g: ir.Graph, local: set[str]) -> None:
        for node in g:
            for v in node.inputs:
                if v is not None and v.name and v.name not in local:
                    used.setdefault(v.name)
            for attr in node.attributes.values():
                for sub in _subgraphs(attr):
                    inner = local | {v.name for v in sub.inputs} | set(sub.initializers)
                    inner |= {o.name for n in sub for o in n.outputs}
                    visit(sub, inner)
            local.update(o.name for o in node.outputs)

    visit(graph, set(defined))
    return list(used)


def _subgraphs(attr: ir.Attr) -> list[ir.Graph]:
    if attr.type is ir.AttributeType.GRAPH:
        return [attr.value]
    if attr.type is ir.AttributeType.GRAPHS:
        return list(attr.value)
    return []


def _label(node: ir.Node, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


def node_runner(node: ir.Node, opsets: Mapping[str, int], options: Mapping[str, Any],
                consts: Sequence[Any], captures: Sequence[str],
                compile_sub: Callable[[ir.Graph], Program] | None = None
                ) -> tuple[Callable[..., tuple], str, registry.NodeContext | None]:
    """Resolve ``node`` to its run-time callable.

    Returns:
        (run, kernel kind: 'hand' | 'custom' | 'onnx.reference', the NodeContext for hand kernels).

    Raises:
        BackendError: HYB-305 when neither a kernel nor ``onnx.reference`` has the operator.
    """
    version = opsets.get(node.domain, 1)
    attrs = {k: convert_attr(a) for k, a in node.attributes.items()}
    kd = registry.find_kernel(node.domain, node.op_type, version)
    ctx = None
    if kd is not None:
        kind = "hand" if kd.prepare is not None or kd.params is not None else "custom"
        if kd.prepare is not None:
            ctx = registry.NodeContext(node.op_type, node.domain, version, node.name or node.op_type, attrs,
                                       tuple(consts), tuple(v is not None for v in node.inputs),
                                       len(node.outputs), options, tuple(captures), compile_sub)
            run = kd.prepare(ctx)
            if run is not None:
                return run, kind, ctx
        elif kd.params is None or set(attrs) <= kd.params:
            assert kd.run is not None
            return (functools.partial(kd.run, **attrs) if attrs else kd.run), kind, None
    if not onnx_reference_has(node.domain, node.op_type, version):
        raise BackendError("HYB-305", f"no reference kernel for node {node.name or node.op_type!r}: operator "
                           f"{node.domain or 'ai.onnx'}::{node.op_type} (opset {version}) has no hand kernel, "
                           "custom op or onnx.reference implementation",
                           "register one with @hybrid.custom_op(op_type, domain=...)")
    return fallback_kernel(node, opsets, captures), "onnx.reference", None


class Program:
    """A compiled graph: ``run(inputs) -> outputs`` with inputs and outputs in graph order."""

    __slots__ = ("_const_outputs", "_input_slots", "_output_slots", "_steps", "_template", "input_names",
                 "output_names", "steps")

    def __init__(self, steps: list[Step], template: list[Any], input_names: list[str], input_slots: list[int],
                 output_names: list[str], output_slots: list[int]) -> None:
        self.steps = steps
        self.input_names = input_names
        self.output_names = output_names
        self._template = template
        self._input_slots = input_slots
        self._output_slots = output_slots
        self._const_outputs = [template[s] is not None for s in output_slots]
        # the hot loop unpacks plain tuples: attribute reads on Step cost more than the small ops
        self._steps = [(s.run, s.inputs, s.outputs, s.free) for s in steps]

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """Run every step; ``inputs`` follow ``input_names`` (None for an absent optional).

        With a cpu memory pool configured (``hybrid.init({'memory_pool': {'cpu': ...}})``) every
        intermediate lives in a pool block, given back as soon as liveness says it is dead.
        """
        values = self._template.copy()
        for slot, value in zip(self._input_slots, inputs):
            values[slot] = value
        workspace = memory.Workspace("cpu") if memory.get_pool("cpu") is not None else None
        index = 0
        try:
            if workspace is None:
                for index, (run, ins, outs, free) in enumerate(self._steps):  # noqa: B007 - read by except
                    results = run(*[values[i] for i in ins])
                    for slot, value in zip(outs, results):
                        values[slot] = value
                    # liveness computed at compile time says these are dead now
                    for slot in free:
                        values[slot] = None
            else:
                adopt, release = workspace.adopt, workspace.release
                for index, (run, ins, outs, free) in enumerate(self._steps):  # noqa: B007 - read by except
                    results = run(*[values[i] for i in ins])
                    for slot, value in zip(outs, results):
                        values[slot] = adopt(value)
                    for slot in free:
                        release(values[slot])
                        values[slot] = None
        except HybridError:
            if workspace is not None:
                workspace.release_all()
            raise
        except Exception as e:
            step = self.steps[index]
            described = _describe([values[i] for i in step.inputs])
            if workspace is not None:
                workspace.release_all()
            raise RunError("HYB-409", f"node {step.label!r} ({step.op_type}) rejected its inputs "
                           f"{described}: {first_line(e)}",
                           "check the input shapes and dtypes against the operator's definition") from e
        out = [values[s] for s in self._output_slots]
        if workspace is not None:
            out = [workspace.detach(v) for v in out]  # outputs leave the pool
            workspace.release_all()
        for i, is_const in enumerate(self._const_outputs):
            if is_const and isinstance(out[i], np.ndarray):
                out[i] = out[i].copy()  # never hand the caller the compiled constant itself
            elif isinstance(out[i], np.generic):
                out[i] = np.asarray(out[i])  # numpy turns 0-d results into scalars; outputs are arrays
        return out




def _describe(values: list[Any]) -> str:
    parts = []
    for v in values[:6]:
        if isinstance(v, np.ndarray):
            parts.append(f"{v.dtype}{list(v.shape)}")
        else:
            parts.append(type(v).__name__ if v is not None else "None")
    return "(" + ", ".join(parts) + ")"


def _fold(run: Callable[..., tuple], consts: list[Any], node: ir.Node) -> tuple | None:
    """Evaluate a node whose inputs are all constant; None if it fails (it then fails at run time)."""
    try:
        out = run(*consts)
    except Exception as e:  # the error is reported with the node's name when the model runs
        logger.debug("not folding %s (%s): %s", node.name, node.op_type, e)
        return None
    return tuple(out)


def compile_graph(graph: ir.Graph, opsets: Mapping[str, int], options: Mapping[str, Any],
                  input_names: Sequence[str] | None = None, fold: bool = True) -> Program:
    """Compile ``graph`` into a :class:`Program`.

    Args:
        graph: The (sub)graph.
        opsets: Opset version per domain (subgraphs inherit the model's).
        options: Backend options (``conv_algorithm``, ``fuse``).
        input_names: The program's inputs in order; default: the graph inputs that have no
            initializer, followed by the outer-scope names the graph reads (for subgraphs).
        fold: Evaluate constant nodes at compile time.
    """
    slots: dict[str, int] = {"": 0}
    template: list[Any] = [None]

    def slot(name: str) -> int:
        if name not in slots:
            slots[name] = len(template)
            template.append(None)
        return slots[name]

    for name, value in graph.initializers.items():
        if value.const_value is not None:
            template[slot(name)] = value.const_value.numpy()
    if input_names is None:
        input_names = [v.name for v in graph.inputs if v.name not in graph.initializers] + free_names(graph)
    input_slots = [slot(n) for n in input_names]
    for s in input_slots:
        template[s] = None  # a feed overrides an initializer of the same name

    def compile_sub(sub: ir.Graph) -> Program:
        names = [v.name for v in sub.inputs] + free_names(sub)
        return compile_graph(sub, opsets, options, names, fold)

    steps: list[Step] = []
    for index, node in enumerate(graph):
        captures = [n for a in node.attributes.values() for g in _subgraphs(a) for n in free_names(g)]
        captures = list(dict.fromkeys(captures))
        in_slots = [0 if v is None else slot(v.name) for v in node.inputs] + [slot(n) for n in captures]
        consts = [template[s] for s in in_slots]
        run, kind, ctx = node_runner(node, opsets, options, consts[:len(node.inputs)], captures, compile_sub)
        out_slots = tuple(slot(v.name) if v.name else slot(f"\x00dead{index}_{i}")
                          for i, v in enumerate(node.outputs))
        has_subgraph = any(_subgraphs(a) for a in node.attributes.values())
        foldable = (fold and not has_subgraph and node.op_type not in registry.NONDETERMINISTIC
                    and all(c is not None or s == 0 for c, s in zip(consts, in_slots)))
        if foldable:
            folded = _fold(run, consts, node)
            if folded is not None:
                for s, v in zip(out_slots, folded):
                    template[s] = v
                continue
        steps.append(Step(run, tuple(in_slots), out_slots, (), _label(node, index), node.op_type, kind,
                          tuple(consts), ctx))

    output_slots = [slot(v.name) for v in graph.outputs]
    if options.get("fuse", True):
        steps = fuse_steps(steps, output_slots)
    # constants no step reads any more (folded into others, fused into Conv weights) are let go
    for step in steps:
        step.consts, step.ctx = (), None
    read = {s for step in steps for s in step.inputs} | set(output_slots)
    for s, value in enumerate(template):
        if value is not None and s not in read:
            template[s] = None
    _liveness(steps, set(output_slots) | set(input_slots), template)
    return Program(steps, template, list(input_names), input_slots, [v.name for v in graph.outputs],
                   output_slots)


def _liveness(steps: list[Step], keep: set[int], template: list[Any]) -> None:
    """Set each step's ``free``: slots whose last reader (or, if never read, producer) it is."""
    last: dict[int, int] = {}
    for i, step in enumerate(steps):
        for s in step.outputs:
            last[s] = i
        for s in step.inputs:
            last[s] = i
    dead: dict[int, list[int]] = {}
    for s, i in last.items():
        if s == 0 or s in keep or template[s] is not None:
            continue
        dead.setdefault(i, []).append(s)
    for i, step in enumerate(steps):
        step.free = tuple(sorted(dead.get(i, ())))
