"""Model signatures: the inputs and outputs a model takes, with symbolic dimensions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

__all__ = ["Signature", "TensorSpec", "signature_of"]

UNKNOWN_DIM = "?"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output.

    Attributes:
        name: The value's name in the graph.
        dtype: Element dtype (ml_dtypes dtypes for bfloat16, float8, int4...; object for strings).
        shape: Dimensions: an int for a static dim, a str for a symbolic one ('batch'; '?' when the
            model names none, is named '?', or stores the dim as a negative number such as -1). None
            when the rank is unknown.
        kind: 'tensor', 'sequence', 'optional' or 'map'. For sequences and optionals, dtype and shape
            describe the element tensor when the model says.
    """

    name: str
    dtype: np.dtype | None
    shape: tuple[int | str, ...] | None
    kind: str = "tensor"

    @property
    def rank(self) -> int | None:
        """The number of dims, or None when the rank is unknown."""
        return None if self.shape is None else len(self.shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join(str(d) for d in self.shape) or "scalar"
        dtype = "?" if self.dtype is None else str(self.dtype)
        prefix = "" if self.kind == "tensor" else f"{self.kind} of "
        return f"{self.name}: {prefix}{dtype}[{dims}]"


@dataclass(frozen=True, slots=True)
class Signature:
    """The inputs (without initializer-backed ones) and outputs of a model, in graph order."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        """The input names, in graph order."""
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        """The output names, in graph order."""
        return [s.name for s in self.outputs]

    def input(self, name: str) -> TensorSpec:
        """The spec of the input called ``name``.

        Raises:
            KeyError: when the model has no input of that name.
        """
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def __str__(self) -> str:
        ins = ", ".join(str(s) for s in self.inputs)
        outs = ", ".join(str(s) for s in self.outputs)
        return f"({ins}) -> ({outs})"


def _dtype(dt: ir.DataType | None) -> np.dtype | None:
    if dt is None or dt == ir.DataType.UNDEFINED:
        return None
    try:
        return dt.numpy()
    except (TypeError, ValueError, NotImplementedError):
        return None


def _spec_from_type(name: str, typ: ir.TypeProtocol | None, shape: ir.Shape | None) -> TensorSpec:
    if typ is None:
        return TensorSpec(name, None, _dims(shape))
    if isinstance(typ, ir.TensorType):
        return TensorSpec(name, _dtype(typ.dtype), _dims(shape))
    kind = "sequence" if isinstance(typ, ir.SequenceType) else "optional" if isinstance(
        typ, ir.OptionalType) else "map"
    elem = getattr(typ, "elem_type", None)
    if isinstance(elem, ir.TensorType):
        return TensorSpec(name, _dtype(elem.dtype), None, kind)
    if isinstance(elem, (ir.SequenceType, ir.OptionalType)):
        inner = elem.elem_type
        inner_dtype = _dtype(inner.dtype) if isinstance(inner, ir.TensorType) else None
        return TensorSpec(name, inner_dtype, None, kind)
    return TensorSpec(name, None, None, kind)


def _dims(shape: ir.Shape | None) -> tuple[int | str, ...] | None:
    if shape is None:
        return None
    dims: list[int | str] = []
    for d in shape.dims:
        if isinstance(d, int):
            dims.append(d if d >= 0 else UNKNOWN_DIM)  # dim_value -1: dynamic, as ONNX Runtime reads it
        else:
            dims.append(d.value if getattr(d, "value", None) is not None else UNKNOWN_DIM)
    return tuple(dims)


def signature_of(graph: ir.Graph) -> Signature:
    """Read the signature of an onnx-ir graph; inputs that have an initializer are left out."""
    inits = graph.initializers
    inputs = tuple(_spec_from_type(v.name, v.type, v.shape) for v in graph.inputs if v.name not in inits)
    outputs = tuple(_spec_from_type(v.name, v.type, v.shape) for v in graph.outputs)
    return Signature(inputs, outputs)
