"""The lowering table: one small torch function per ONNX op, registered by op type and opset.

A lowering takes the node's inputs as torch tensors (``None`` for an absent optional input),
positionally, and its attributes as keyword-only arguments with the ONNX defaults, and returns one
tensor or a tuple of outputs. Inputs listed in ``host_inputs`` (shapes, axes, pads, repeats) arrive
as Python ints when they are constants, and as host tensors otherwise; :func:`ints` reads both.

``supports`` answers from this table alone: op type, domain, opset, attribute names, dtypes and an
optional static ``check`` on the node. Nothing is run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir
import torch

__all__ = [
    "ALL",
    "COMMON",
    "FLOATS",
    "INTS",
    "Lowering",
    "dtype_of",
    "ints",
    "lookup",
    "lowering",
    "op_types",
    "torch_dtype",
]

DT = ir.DataType
FLOATS = frozenset({DT.FLOAT, DT.DOUBLE, DT.FLOAT16, DT.BFLOAT16})
INTS = frozenset({DT.INT8, DT.INT16, DT.INT32, DT.INT64, DT.UINT8})
COMMON = FLOATS | INTS | {DT.BOOL}
FLOAT8 = frozenset({DT.FLOAT8E4M3FN, DT.FLOAT8E4M3FNUZ, DT.FLOAT8E5M2, DT.FLOAT8E5M2FNUZ})
WIDE_UINTS = frozenset({DT.UINT16, DT.UINT32, DT.UINT64})
# every ONNX dtype that has a torch dtype (element-wise math on the last two groups is limited)
ALL = COMMON | FLOAT8 | WIDE_UINTS

_TORCH_DTYPES: dict[int, torch.dtype] = {
    DT.FLOAT: torch.float32, DT.DOUBLE: torch.float64, DT.FLOAT16: torch.float16,
    DT.BFLOAT16: torch.bfloat16, DT.INT8: torch.int8, DT.INT16: torch.int16, DT.INT32: torch.int32,
    DT.INT64: torch.int64, DT.UINT8: torch.uint8, DT.BOOL: torch.bool, DT.UINT16: torch.uint16,
    DT.UINT32: torch.uint32, DT.UINT64: torch.uint64, DT.COMPLEX64: torch.complex64,
    DT.COMPLEX128: torch.complex128, DT.FLOAT8E4M3FN: torch.float8_e4m3fn,
    DT.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz, DT.FLOAT8E5M2: torch.float8_e5m2,
    DT.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
}
_ONNX_DTYPES = {v: k for k, v in _TORCH_DTYPES.items()}


def torch_dtype(onnx_type: int) -> torch.dtype:
    """The torch dtype of an ONNX ``TensorProto`` data type (raises KeyError when torch has none)."""
    return _TORCH_DTYPES[onnx_type]


def dtype_of(t: torch.dtype) -> int:
    """The ONNX data type of a torch dtype."""
    return _ONNX_DTYPES[t]


def ints(value: Any) -> list[int] | None:
    """Read a host-side shape/axes input: a Python list, a scalar, a host tensor or None."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


@dataclass(frozen=True, slots=True)
class Lowering:
    """One row of the table.

    Attributes:
        op_type: ONNX op type.
        domain: ONNX domain ('' for the default one).
        since: First opset version this lowering implements (until the next row's ``since``).
        fn: The torch function.
        attrs: Attribute names ``fn`` accepts.
        host_inputs: Input positions read as Python ints on the host.
        dtypes: ONNX dtypes allowed on every input and output whose type the graph declares.
        check: Static test of a node; returns why it is unsupported, or None.
        n_outputs: ``fn`` takes ``n_outputs=`` (how many outputs the node declares).
        foldable: Deterministic: may run at build time when every input is a constant.
        shape_only: Reads only its inputs' shapes; its outputs live on the host.
    """

    op_type: str
    domain: str
    since: int
    fn: Callable[..., Any]
    attrs: frozenset[str]
    host_inputs: tuple[int, ...] = ()
    dtypes: frozenset[int] = COMMON
    check: Callable[[ir.Node], str | None] | None = None
    n_outputs: bool = False
    foldable: bool = True
    shape_only: bool = False


_TABLE: dict[tuple[str, str], list[Lowering]] = {}
_LOADED = False
# one module per op family; each registers its rows when imported
_MODULES = ("elementwise", "nn", "linalg", "shape", "index", "reduce", "convert", "image", "loss", "rnn",
            "signal", "sequence", "control")


def lowering(op_types: str | Iterable[str], *, since: int = 1, domain: str = "",
             host_inputs: tuple[int, ...] = (), dtypes: Iterable[int] | None = None,
             check: Callable[[ir.Node], str | None] | None = None, n_outputs: bool = False,
             foldable: bool = True, shape_only: bool = False) -> Callable[[Callable], Callable]:
    """Register the decorated function as the lowering of ``op_types`` from opset ``since`` on."""
    names = [op_types] if isinstance(op_types, str) else list(op_types)

    def register(fn: Callable) -> Callable:
        params = inspect.signature(fn).parameters.values()
        attrs = frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY
                          and p.name != "n_outputs")
        for name in names:
            row = Lowering(name, domain, since, fn, attrs, tuple(host_inputs),
                           frozenset(dtypes) if dtypes is not None else COMMON, check, n_outputs,
                           foldable, shape_only)
            rows = _TABLE.setdefault((domain, name), [])
            rows[:] = sorted([r for r in rows if r.since != since] + [row], key=lambda r: r.since)
        return fn

    return register


def _load() -> None:
    global _LOADED
    if not _LOADED:
        import importlib

        for mod in _MODULES:
            importlib.import_module(f"hybrid.backends.torch.ops_{mod}")
        _LOADED = True


def lookup(domain: str, op_type: str, opset: int | None) -> Lowering | None:
    """The lowering of ``op_type`` for ``opset`` (the newest row when opset is unknown), or None."""
    _load()
    rows = _TABLE.get(("" if domain == "ai.onnx" else domain, op_type))
    if not rows:
        return None
    if opset is None:
        return rows[-1]
    found = None
    for row in rows:
        if row.since <= opset:
            found = row
    return found


def op_types() -> list[tuple[str, str]]:
    """Every (domain, op_type) the table lowers."""
    _load()
    return sorted(_TABLE)
