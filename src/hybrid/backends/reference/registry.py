"""The kernel table: hand kernels and custom ops, by (domain, op type, opset).

A kernel is one small function from arrays (+ attributes) to a tuple of arrays (STYLE habit 7),
registered with :func:`kernel` for the opset it first describes. Ops whose meaning depends on
constants or needs work done once (Conv weight layouts, subgraphs) register a *prepare* function
with :func:`prepared` instead: it receives a :class:`NodeContext` at compile time and returns the
run-time callable, or ``None`` to decline (the node then falls back to ``onnx.reference``).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "NONDETERMINISTIC",
    "KernelDef",
    "NodeContext",
    "custom_op",
    "find_kernel",
    "kernel",
    "prepared",
    "registered_ops",
]

# Ops whose output is random: never folded at compile time.
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Bernoulli", "Multinomial"})

Run = Callable[..., tuple]


@dataclass(frozen=True, slots=True)
class NodeContext:
    """What a prepare function knows about its node at compile time.

    Attributes:
        op_type: The operator type.
        domain: The operator domain ('' for ONNX).
        version: The opset version the model imports for that domain.
        name: The node name (for messages).
        attrs: Attribute values as Python/numpy values (graphs stay ``onnx_ir.Graph``).
        consts: Per input, the constant array known at compile time, else None.
        present: Per input, whether the input is given (optional inputs may be missing).
        n_outputs: How many outputs the node declares.
        options: The backend options (``conv_algorithm``, ...).
        captures: Names of outer-scope values the node's subgraphs read; they follow the node's own
            inputs in the run-time call.
        compile_graph: Compiles a subgraph into a program (for If/Loop/Scan).
    """

    op_type: str
    domain: str
    version: int
    name: str
    attrs: Mapping[str, Any]
    consts: tuple[Any, ...]
    present: tuple[bool, ...]
    n_outputs: int
    options: Mapping[str, Any] = field(default_factory=dict)
    captures: tuple[str, ...] = ()
    compile_graph: Callable[[Any], Any] | None = None


@dataclass(frozen=True, slots=True)
class KernelDef:
    """One registered kernel.

    Attributes:
        op_type: Operator type.
        domain: Operator domain.
        since: First opset version whose meaning this kernel implements.
        run: ``_run(*inputs, **attrs) -> tuple`` (None for prepared kernels).
        prepare: ``prepare(ctx) -> run | None`` for kernels that specialize at compile time.
        params: Attribute names ``run`` accepts (None: any).
    """

    op_type: str
    domain: str
    since: int
    run: Run | None = None
    prepare: Callable[[NodeContext], Run | None] | None = None
    params: frozenset[str] | None = None


_LOCK = threading.Lock()
_TABLE: dict[tuple[str, str], list[KernelDef]] = {}
_CUSTOM: dict[tuple[str, str], list[KernelDef]] = {}


def _attr_params(fn: Callable) -> frozenset[str] | None:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY)


def _add(table: dict[tuple[str, str], list[KernelDef]], kd: KernelDef) -> None:
    with _LOCK:
        entries = [k for k in table.get((kd.domain, kd.op_type), []) if k.since != kd.since]
        entries.append(kd)
        entries.sort(key=lambda k: k.since)
        table[(kd.domain, kd.op_type)] = entries


def kernel(*op_types: str, since: int = 1, domain: str = "") -> Callable[[Run], Run]:
    """Register ``_run(*inputs, **attrs) -> tuple`` for op types from opset ``since`` on.

    Attributes are keyword-only parameters of ``_run``; a node carrying an attribute the kernel
    does not name falls back to ``onnx.reference`` rather than being run with a meaning ignored.
    """

    def deco(fn: Run) -> Run:
        for op in op_types:
            _add(_TABLE, KernelDef(op, domain, since, run=fn, params=_attr_params(fn)))
        return fn

    return deco


def prepared(*op_types: str, since: int = 1, domain: str = "") -> Callable:
    """Register ``prepare(ctx: NodeContext) -> run | None`` for op types from opset ``since`` on."""

    def deco(fn: Callable[[NodeContext], Run | None]) -> Callable[[NodeContext], Run | None]:
        for op in op_types:
            _add(_TABLE, KernelDef(op, domain, since, prepare=fn))
        return fn

    return deco


def custom_op(op_type: str, domain: str = "com.example", since: int = 1) -> Callable[[Callable], Callable]:
    """Register a numpy kernel for a custom operator; models using it run on the reference backend.

    The function takes the node's inputs as arrays (None for a missing optional input) and its
    attributes as keyword arguments, and returns one array or a tuple of arrays::

        @hybrid.custom_op('Swish', domain='com.example')
        def swish(x, *, beta=1.0):
            return x / (1 + np.exp(-beta * x))
    """
    if not op_type or not isinstance(op_type, str):
        raise ValueError(f"custom_op: expected an operator type name, got {op_type!r}")

    def deco(fn: Callable) -> Callable:
        def run(*inputs: Any, **attrs: Any) -> tuple:
            out = fn(*inputs, **attrs)
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)

        run.__name__ = getattr(fn, "__name__", op_type)
        _add(_CUSTOM, KernelDef(op_type, domain, since, run=run, params=None))
        return fn

    return deco


def find_kernel(domain: str, op_type: str, version: int) -> KernelDef | None:
    """The custom or hand kernel for ``(domain, op_type)`` at opset ``version``, if any.

    Custom ops win over hand kernels so that a user can replace an op's definition.
    """
    for table in (_CUSTOM, _TABLE):
        best = None
        for kd in table.get((domain, op_type), ()):
            if kd.since <= version:
                best = kd
        if best is not None:
            return best
    return None


def registered_ops() -> dict[tuple[str, str], list[int]]:
    """Every (domain, op_type) with a hand kernel or custom op, and the opsets they start at."""
    with _LOCK:
        out: dict[tuple[str, str], list[int]] = {}
        for table in (_TABLE, _CUSTOM):
            for key, defs in table.items():
                out.setdefault(key, []).extend(k.since for k in defs)
        return out
