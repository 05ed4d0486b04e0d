"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin.

Before opset 18 (13 for ReduceSum) the axes are an attribute; later they are an optional input.
An empty reduction yields the operation's identity (0, 1, -inf for Max, +inf for Min).
"""

from __future__ import annotations

import numpy as np

from hybrid.backends.reference.registry import kernel

__all__: list[str] = []


def _axes(x, axes, noop):
    if axes is None or len(axes) == 0:
        return None if noop else tuple(range(x.ndim))
    return tuple(int(a) % max(x.ndim, 1) for a in np.asarray(axes).reshape(-1))


def _extreme(x, fn, axes, keep, sign):
    if x.size == 0:
        fill = _identity_of_extreme(x.dtype, sign)
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keep else \
            [d for i, d in enumerate(x.shape) if i not in axes]
        return np.full(shape, fill, dtype=x.dtype)
    return fn(x, axis=axes, keepdims=keep)


def _reduction(name, fn):
    def run(x, axes_input=None, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        ax = _axes(x, axes if axes is not None else axes_input, noop_with_empty_axes)
        if ax is None:
            return (x,)
        return (np.asarray(fn(x, ax, bool(keepdims))).astype(x.dtype, copy=False),)

    run.__name__ = f"_{name.lower()}"
    kernel(name, since=1)(run)


def _identity_of_extreme(dtype, sign):
    """The value an empty Max (sign -1) or Min (sign +1) reduces to."""
    if dtype == np.bool_:
        return sign > 0
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if sign < 0 else info.max
    return sign * np.inf  # float, and ml_dtypes floats (kind 'V')


_reduction("ReduceSum", lambda x, a, k: np.sum(x, axis=a, keepdims=k))
_reduction("ReduceMean", lambda x, a, k: np.mean(x, axis=a, keepdims=k))
_reduction("ReduceProd", lambda x, a, k: np.prod(x, axis=a, keepdims=k))
_reduction("ReduceMax", lambda x, a, k: _extreme(x, np.max, a, k, -1))
_reduction("ReduceMin", lambda x, a, k: _extreme(x, np.min, a, k, 1))
_reduction("ReduceL1", lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k))
_reduction("ReduceL2", lambda x, a, k: np.sqrt(np.sum(np.square(x), axis=a, keepdims=k)))
_reduction("ReduceSumSquare", lambda x, a, k: np.sum(np.square(x), axis=a, keepdims=k))


def _log_sum(x, a, k):
    with np.errstate(divide="ignore"):
        return np.log(np.sum(x, axis=a, keepdims=k))


def _log_sum_exp(x, a, k):
    if x.size == 0:
        with np.errstate(divide="ignore"):
            return np.log(np.sum(x, axis=a, keepdims=k))
    m = np.max(x, axis=a, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=a, keepdims=True)) + m
    return out if k else np.squeeze(out, axis=a)


_reduction("ReduceLogSum", _log_sum)
_reduction("ReduceLogSumExp", _log_sum_exp)


def _arg(fn):
    def run(x, *, axis=0, keepdims=1, select_last_index=0):
        axis = axis % x.ndim
        if select_last_index:
            flipped = np.flip(x, axis)
            idx = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            idx = fn(x, axis=axis)
        idx = idx.astype(np.int64)
        return (np.expand_dims(idx, axis) if keepdims else idx,)

    return run


kernel("ArgMax", since=1)(_arg(np.argmax))
kernel("ArgMin", since=1)(_arg(np.argmin))
