"""Reduction lowerings: Reduce*, ArgMax/ArgMin, CumSum/CumProd."""

from __future__ import annotations

import math

import torch
from onnx_ir import DataType

from hybrid.backends.torch.lowering import COMMON, ints, lowering

NUMERIC = COMMON - {DataType.BOOL}


def _dims(x, axes, noop):
    axes = ints(axes)
    if not axes:
        return None if noop else tuple(range(x.dim()))
    return tuple(sorted({a + x.dim() if a < 0 else a for a in axes}))


def _empty_result(x, dims, keepdim, value, dtype=None):
    shape = [1 if i in dims else n for i, n in enumerate(x.shape)] if keepdim else \
        [n for i, n in enumerate(x.shape) if i not in dims]
    return torch.full(shape, value, dtype=dtype or x.dtype, device=x.device)


def _extreme(x, largest):
    if x.is_floating_point():
        return -math.inf if largest else math.inf
    if x.dtype == torch.bool:
        return not largest
    info = torch.iinfo(x.dtype)
    return info.min if largest else info.max


def _float(x):
    return x if x.is_floating_point() else x.to(torch.float64)


# kind -> (compute over dims, value over an empty set)
def _sum(x, dims, keep):
    return torch.sum(x, dim=dims, keepdim=keep, dtype=x.dtype)


def _prod(x, dims, keep):
    out = x
    for d in sorted(dims, reverse=True):
        out = torch.prod(out, dim=d, keepdim=keep, dtype=x.dtype)
    return out


_KINDS = {
    "ReduceSum": (_sum, 0),
    "ReduceProd": (_prod, 1),
    "ReduceMax": (lambda x, d, k: torch.amax(x, dim=d, keepdim=k), "max"),
    "ReduceMin": (lambda x, d, k: torch.amin(x, dim=d, keepdim=k), "min"),
    "ReduceMean": (lambda x, d, k: torch.mean(_float(x), dim=d, keepdim=k), math.nan),
    "ReduceL1": (lambda x, d, k: torch.sum(torch.abs(x), dim=d, keepdim=k, dtype=x.dtype), 0),
    "ReduceL2": (lambda x, d, k: torch.sqrt(torch.sum(_float(x) ** 2, dim=d, keepdim=k)), 0),
    "ReduceSumSquare": (lambda x, d, k: torch.sum(x * x, dim=d, keepdim=k, dtype=x.dtype), 0),
    "ReduceLogSum": (lambda x, d, k: torch.log(torch.sum(_float(x), dim=d, keepdim=k)), -math.inf),
    "ReduceLogSumExp": (lambda x, d, k: torch.logsumexp(_float(x), dim=d, keepdim=k), -math.inf),
}
# the opset in which each reduction's axes moved from an attribute to an input
_AXES_INPUT_SINCE = {name: (13 if name == "ReduceSum" else 18) for name in _KINDS}


def _reduce(kind, x, axes, keepdims, noop):
    fn, empty = _KINDS[kind]
    dims = _dims(x, axes, noop)
    if dims is None:
        return x
    if x.dim() == 0:
        return fn(x.reshape(1), (0,), False).reshape(()).to(x.dtype)
    if any(x.shape[d] == 0 for d in dims):
        if empty in ("max", "min"):
            empty = _extreme(x, empty == "max")
        return _empty_result(x, dims, bool(keepdims), empty)
    out = fn(x, dims, bool(keepdims))
    if out.dtype != x.dtype:
        out = out.trunc().to(x.dtype) if not x.is_floating_point() and x.dtype != torch.bool else out.to(x.dtype)
    return out


def _make(kind):
    def with_attr(x, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        return _reduce(kind, x, axes, keepdims, noop_with_empty_axes)

    def with_input(x, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _reduce(kind, x, axes, keepdims, noop_with_empty_axes)

    stem = kind[6:].lower()
    with_attr.__name__ = with_attr.__qualname__ = f"reduce_{stem}_attr"
    with_input.__name__ = with_input.__qualname__ = f"reduce_{stem}"
    return with_attr, with_input


for _kind in _KINDS:
    _attr_fn, _input_fn = _make(_kind)
    _types = COMMON if _kind in ("ReduceMax", "ReduceMin") else NUMERIC
    lowering(_kind, dtypes=_types)(_attr_fn)
    lowering(_kind, since=_AXES_INPUT_SINCE[_kind], host_inputs=(1,), dtypes=_types)(_input_fn)


# ------------------------------------------------------------------ arg reductions
def _arg(fn, x, axis, keepdims, select_last_index):
    axis = axis + x.dim() if axis < 0 else axis
    if select_last_index:
        idx = fn(x.flip(axis), dim=axis, keepdim=bool(keepdims))
        return x.shape[axis] - 1 - idx
    return fn(x, dim=axis, keepdim=bool(keepdims))


@lowering("ArgMax", dtypes=NUMERIC)
def arg_max(x, *, axis=0, keepdims=1, select_last_index=0):
    """ONNX ArgMax along ``axis``; ties go to the first index, or the last with ``select_last_index``."""
    return _arg(torch.argmax, x, axis, keepdims, select_last_index)


@lowering("ArgMin", dtypes=NUMERIC)
def arg_min(x, *, axis=0, keepdims=1, select_last_index=0):
    """ONNX ArgMin along ``axis``; ties go to the first index, or the last with ``select_last_index``."""
    return _arg(torch.argmin, x, axis, keepdims, select_last_index)


# ------------------------------------------------------------------ scans
def _scan(fn, identity, x, axis, exclusive, reverse):
    a = ints(axis)[0]
    a = a + x.dim() if a < 0 else a
    work = x.flip(a) if reverse else x
    out = fn(work, dim=a, dtype=x.dtype)
    if exclusive:
        first = torch.full_like(out.narrow(a, 0, 1), identity)
        out = torch.cat([first, out.narrow(a, 0, out.shape[a] - 1)], dim=a)
    return out.flip(a) if reverse else out


@lowering("CumSum", host_inputs=(1,), dtypes=NUMERIC)
def cum_sum(x, axis, *, exclusive=0, reverse=0):
    """ONNX CumSum along ``axis``, optionally exclusive (shifted by one, starting at 0) and/or reversed."""
    return _scan(torch.cumsum, 0, x, axis, exclusive, reverse)


@lowering("CumProd", host_inputs=(1,), dtypes=NUMERIC)
def cum_prod(x, axis, *, exclusive=0, reverse=0):
    """ONNX CumProd along ``axis``, optionally exclusive (shifted by one, starting at 1) and/or reversed."""
    return _scan(torch.cumprod, 1, x, axis, exclusive, reverse)
