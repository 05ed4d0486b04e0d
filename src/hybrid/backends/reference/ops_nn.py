"""Neural-network kernels: pooling, normalizations, Softmax, LRN, Dropout, Gemm and MatMul."""

from __future__ import annotations

import numpy as np

from hybrid.backends.reference.parallel import for_blocks
from hybrid.backends.reference.registry import NodeContext, kernel, prepared

__all__: list[str] = []


# ------------------------------------------------------------------ pooling
def _pool_geometry(sp, k, s, d, pads, auto_pad, ceil_mode):
    nd = len(sp)
    span = tuple((k[i] - 1) * d[i] + 1 for i in range(nd))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(-(-sp[i] // s[i]) for i in range(nd))
        total = tuple(max(0, (out[i] - 1) * s[i] + span[i] - sp[i]) for i in range(nd))
        if auto_pad == "SAME_UPPER":
            pb = tuple(t // 2 for t in total)
        else:
            pb = tuple(t - t // 2 for t in total)
        pe = tuple(total[i] - pb[i] for i in range(nd))
        return pb, pe, out
    if auto_pad == "VALID":
        pb = pe = (0,) * nd
    else:
        pb, pe = tuple(pads[:nd]), tuple(pads[nd:])
    out = []
    for i in range(nd):
        room = sp[i] + pb[i] + pe[i] - span[i]
        if room < 0:
            raise ValueError(f"the pooling window {list(k)} does not fit the padded input along axis {i + 2}")
        o = (-(-room // s[i]) if ceil_mode else room // s[i]) + 1
        if ceil_mode and (o - 1) * s[i] >= sp[i] + pb[i]:
            o -= 1  # a window may not start in the end padding
        out.append(o)
    return pb, pe, tuple(out)


def _windows_reduce(xp, k, s, d, out, fn):
    """Reduce over the pooling window, one spatial axis at a time (max and sum are separable).

    One strided view per tap of that axis, so a 3x3 window costs 3 + 3 passes instead of 9.
    """
    nd = len(k)
    acc = xp
    for axis in range(nd):
        dim = acc.ndim - nd + axis
        reduced = None
        for tap in range(k[axis]):
            index = [slice(None)] * acc.ndim
            index[dim] = slice(tap * d[axis], tap * d[axis] + s[axis] * (out[axis] - 1) + 1, s[axis])
            view = acc[tuple(index)]
            reduced = view.copy() if reduced is None else fn(reduced, view, out=reduced)
        acc = reduced
    return acc


class _Pool:
    def __init__(self, kind: str, attrs: dict) -> None:
        self.kind = kind
        self.k = tuple(attrs["kernel_shape"])
        nd = len(self.k)
        self.s = tuple(attrs.get("strides") or (1,) * nd)
        self.d = tuple(attrs.get("dilations") or (1,) * nd)
        self.pads = tuple(attrs.get("pads") or (0,) * (2 * nd))
        self.auto_pad = attrs.get("auto_pad", "NOTSET")
        self.ceil = bool(attrs.get("ceil_mode", 0))
        self.include_pad = bool(attrs.get("count_include_pad", 0))
        self._plans: dict[tuple, tuple] = {}

    def _plan(self, shape):
        got = self._plans.get(shape)
        if got is None:
            sp = shape[2:]
            if len(sp) != len(self.k):
                raise ValueError(f"expected an input of rank {len(self.k) + 2} for kernel_shape {list(self.k)}, "
                                 f"got shape {list(shape)}")
            pb, pe, out = _pool_geometry(sp, self.k, self.s, self.d, self.pads, self.auto_pad, self.ceil)
            nd = len(sp)
            need = tuple((out[i] - 1) * self.s[i] + (self.k[i] - 1) * self.d[i] + 1 for i in range(nd))
            size = tuple(max(need[i], sp[i] + pb[i]) for i in range(nd))
            inner = tuple(slice(pb[i], pb[i] + sp[i]) for i in range(nd))
            counts = None
            if self.kind == "avg":
                mask = np.zeros(size, dtype=np.float64)
                if self.include_pad:
                    mask[tuple(slice(0, min(size[i], sp[i] + pb[i] + pe[i])) for i in range(nd))] = 1
                else:
                    mask[inner] = 1
                counts = _windows_reduce(mask, self.k, self.s, self.d, out, np.add)
            got = self._plans[shape] = (size, inner, out, counts)
        return got

    def __call__(self, x):
        size, inner, out, counts = self._plan(x.shape)
        y = np.empty((*x.shape[:2], *out), dtype=x.dtype)

        def channels(lo: int, hi: int) -> None:
            y[:, lo:hi] = self._pool(x[:, lo:hi], size, inner, out, counts)

        for_blocks(x.shape[1], channels, x.size * int(np.prod(self.k)))
        return (y,)

    def _pool(self, x, size, inner, out, counts):
        if self.kind == "max":
            if size == x.shape[2:] and all(sl.start == 0 for sl in inner):
                xp = x  # no padding and no window past the end: read the input in place
            else:
                fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
                xp = np.full((*x.shape[:2], *size), fill, dtype=x.dtype)
                xp[(slice(None), slice(None), *inner)] = x
            return _windows_reduce(xp, self.k, self.s, self.d, out, np.maximum)
        xp = np.zeros((*x.shape[:2], *size), dtype=x.dtype)
        xp[(slice(None), slice(None), *inner)] = x
        acc = _windows_reduce(xp, self.k, self.s, self.d, out, np.add)
        return acc / counts


@prepared("MaxPool", since=8)
def _max_pool(ctx: NodeContext):
    allowed = {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"}
    if set(ctx.attrs) - allowed or ctx.n_outputs > 1:
        return None  # the Indices output runs on onnx.reference
    return _Pool("max", dict(ctx.attrs))


@prepared("AveragePool", since=7)
def _average_pool(ctx: NodeContext):
    allowed = {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"}
    if set(ctx.attrs) - allowed:
        return None
    return _Pool("avg", dict(ctx.attrs))


@kernel("GlobalAveragePool")
def _global_average_pool(x):
    return (x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype),)


@kernel("GlobalMaxPool")
def _global_max_pool(x):
    return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)


# ------------------------------------------------------------------ normalization
def _channel(v, ndim):
    return v.reshape(-1, *([1] * (ndim - 2)))


class _FoldedBatchNorm:
    """Inference BatchNormalization with constant statistics: ``x * a + shift`` per channel.

    ``scale_shift`` holds the folded per-channel factors; ``relu`` is set when a following Relu is fused.
    """

    def __init__(self, a: np.ndarray, shift: np.ndarray) -> None:
        self.scale_shift = (a, shift)
        self.relu = False
        self._cast: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, x, *_):
        key = (x.dtype, x.ndim)
        ab = self._cast.get(key)
        if ab is None:
            ab = self._cast[key] = tuple(_channel(v, x.ndim).astype(x.dtype) for v in self.scale_shift)
        y = x * ab[0]
        y += ab[1]
        if self.relu:
            np.maximum(y, 0, out=y)
        return (y,)


@prepared("BatchNormalization", since=7)
def _batch_norm(ctx: NodeContext):
    attrs = ctx.attrs
    if set(attrs) - {"epsilon", "momentum", "spatial", "training_mode"} or attrs.get("training_mode", 0) \
            or attrs.get("spatial", 1) != 1 or ctx.n_outputs > 1:
        return None  # training mode (running statistics) runs on onnx.reference
    eps = attrs.get("epsilon", 1e-5)
    scale, bias, mean, var = ctx.consts[1:5]
    if all(v is not None for v in (scale, bias, mean, var)):
        a = scale / np.sqrt(var + np.asarray(eps, dtype=var.dtype))
        shift = bias - mean * a

        return _FoldedBatchNorm(a, shift)

    def run(x, scale, bias, mean, var):
        n = x.ndim
        y = (x - _channel(mean, n)) / np.sqrt(_channel(var, n) + eps) * _channel(scale, n) + _channel(bias, n)
        return (y.astype(x.dtype, copy=False),)

    return run


@kernel("LayerNormalization", since=17)
def _layer_norm(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    axis = axis % x.ndim
    axes = tuple(range(axis, x.ndim))
    xf = x.astype(np.float32) if stash_type == 1 and x.dtype != np.float64 else x
    mean = xf.mean(axis=axes, keepdims=True)
    centered = xf - mean
    inv_std = 1.0 / np.sqrt((centered * centered).mean(axis=axes, keepdims=True) + epsilon)
    y = centered * inv_std * scale
    if bias is not None:
        y = y + bias
    return (y.astype(x.dtype), mean.astype(x.dtype), inv_std.astype(x.dtype))


@kernel("LpNormalization")
def _lp_normalization(x, *, axis=-1, p=2):
    # ||x||_p = (sum |x|^p)^(1/p); onnx.reference drops the |.|, which is wrong for p=1 and negative x
    if p not in (1, 2):
        raise ValueError(f"LpNormalization p must be 1 or 2, got {p}")
    norm = np.power(np.power(np.abs(x), p).sum(axis=axis, keepdims=True), 1.0 / p)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.where(norm == 0, 0, x / norm).astype(x.dtype),)


@kernel("LRN")
def _lrn(x, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    sq = np.square(x.astype(np.float64) if x.dtype != np.float32 else x)
    c = x.shape[1]
    before = (size - 1) // 2  # the window spans floor((size-1)/2) channels before, ceil(...) after
    after = (size - 1) - before
    csum = np.concatenate([np.zeros_like(sq[:, :1]), np.cumsum(sq, axis=1)], axis=1)
    hi = np.minimum(np.arange(c) + after + 1, c)
    lo = np.maximum(np.arange(c) - before, 0)
    window = csum[:, hi] - csum[:, lo]
    return ((x / (bias + (alpha / size) * window) ** beta).astype(x.dtype),)


# ------------------------------------------------------------------ softmax family
def _softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    e = np.exp(x - m)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def _coerced(fn, x, axis):
    axis = axis % x.ndim if x.ndim else 0
    flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
    return fn(flat, 1).reshape(x.shape)


@kernel("Softmax", since=1)
def _softmax_v1(x, *, axis=1):
    return (_coerced(_softmax, x, axis),)


@kernel("Softmax", since=13)
def _softmax_v13(x, *, axis=-1):
    return (_softmax(x, axis),)


def _log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    shifted = x - m
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


@kernel("LogSoftmax", since=1)
def _log_softmax_v1(x, *, axis=1):
    return (_coerced(_log_softmax, x, axis),)


@kernel("LogSoftmax", since=13)
def _log_softmax_v13(x, *, axis=-1):
    return (_log_softmax(x, axis),)


# ------------------------------------------------------------------ dropout (inference)
@prepared("Dropout", since=7)
def _dropout(ctx: NodeContext):
    if set(ctx.attrs) - {"ratio", "seed"}:
        return None
    if len(ctx.present) > 2 and ctx.present[2] and not (ctx.consts[2] is not None and not ctx.consts[2]):
        return None  # training mode draws random masks: onnx.reference

    def run(x, *_):
        return (x, np.ones(x.shape, dtype=bool))

    return run


# ------------------------------------------------------------------ GEMM
@kernel("Gemm", since=7)
def _gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    y = (a.T if transA else a) @ (b.T if transB else b)
    if alpha != 1.0:
        y *= y.dtype.type(alpha) if y.dtype.kind == "f" else alpha
    if c is not None and beta != 0:
        y += c if beta == 1.0 else beta * c
    return (y.astype(a.dtype, copy=False),)


@kernel("MatMul", since=1)
def _matmul(a, b):
    y = np.matmul(a, b)
    return (y if y.dtype == a.dtype else y.astype(a.dtype),)  # numpy computes bfloat16 in float32
