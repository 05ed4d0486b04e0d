"""Indexing and ordering kernels.

TopK, CumSum, NonZero, Trilu, GatherND, ScatterND, OneHot, Compress, DepthToSpace, SpaceToDepth, EyeLike, Einsum,
Hardmax, InstanceNormalization.
"""

from __future__ import annotations

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from hybrid.backends.reference.registry import kernel

__all__: list[str] = []


@kernel("TopK", since=10)
def _topk(x, k, *, axis=-1, largest=1, sorted=1):  # "sorted" is the ONNX attribute name
    axis = axis % x.ndim
    k = int(np.asarray(k).reshape(-1)[0])
    position = np.indices(x.shape)[axis]
    # ties keep the lower index first, in both directions
    order = np.lexsort((-position if largest else position, x), axis=axis)
    if largest:
        order = np.flip(order, axis=axis)
    idx = np.take(order, np.arange(k), axis=axis)
    return (np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64))


@kernel("CumSum", since=11)
def _cumsum(x, axis, *, exclusive=0, reverse=0):
    axis = int(np.asarray(axis).reshape(-1)[0]) % x.ndim
    y = np.flip(x, axis) if reverse else x
    out = np.cumsum(y, axis=axis, dtype=x.dtype)
    if exclusive:
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=axis)),
                              np.take(out, np.arange(out.shape[axis] - 1), axis=axis)], axis=axis)
    return (np.flip(out, axis) if reverse else out,)


@kernel("NonZero", since=9)
def _nonzero(x):
    return (np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1),)


@kernel("Trilu", since=14)
def _trilu(x, k=None, *, upper=1):
    k = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return (np.triu(x, k) if upper else np.tril(x, k),)


@kernel("GatherND", since=12)
def _gather_nd(data, indices, *, batch_dims=0):
    b = batch_dims
    idx = np.where(indices < 0, indices + np.array(data.shape[b:b + indices.shape[-1]]), indices)
    batch_shape = data.shape[:b]
    nb = int(np.prod(batch_shape)) if b else 1
    d = data.reshape(nb, *data.shape[b:])
    i = idx.reshape(nb, -1, idx.shape[-1])
    rows = np.arange(nb)[:, None]
    picked = d[(rows, *np.moveaxis(i, -1, 0))]
    return (picked.reshape(*indices.shape[:-1], *data.shape[b + indices.shape[-1]:]),)


_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@kernel("ScatterND", since=11)
def _scatter_nd(data, indices, updates, *, reduction="none"):
    out = data.copy()
    idx = indices.reshape(-1, indices.shape[-1])
    upd = updates.reshape(idx.shape[0], *data.shape[indices.shape[-1]:])
    for row, value in zip(idx, upd):  # in order: later updates win, as the spec's loop does
        key = tuple(int(v) for v in row)
        out[key] = value if reduction == "none" else _REDUCE[reduction](out[key], value)
    return (out,)


@kernel("OneHot", since=9)
def _one_hot(indices, depth, values, *, axis=-1):
    depth = int(np.asarray(depth).reshape(-1)[0])
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    rank = idx.ndim + 1
    axis = axis % rank
    hot = np.arange(depth).reshape([depth if i == axis else 1 for i in range(rank)])
    mask = np.expand_dims(idx, axis) == hot
    off, on = values[0], values[1]
    return (np.where(mask, on, off).astype(values.dtype),)


@kernel("Compress", since=9)
def _compress(x, condition, *, axis=None):
    return (np.compress(condition, x, axis=axis),)


@kernel("DepthToSpace", since=11)
def _depth_to_space(x, *, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return (t.reshape(n, c // (b * b), h * b, w * b),)


@kernel("SpaceToDepth", since=1)
def _space_to_depth(x, *, blocksize):
    n, c, h, w = x.shape
    b = blocksize
    t = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return (t.reshape(n, c * b * b, h // b, w // b),)


@kernel("EyeLike", since=9)
def _eye_like(x, *, dtype=0, k=0):
    out_dtype = tensor_dtype_to_np_dtype(dtype) if dtype else x.dtype
    return (np.eye(x.shape[0], x.shape[1], k=k, dtype=out_dtype),)


@kernel("Einsum", since=12)
def _einsum(*xs, equation):
    dtype = xs[0].dtype
    if dtype.kind == "V":  # ml_dtypes (bfloat16, ...): numpy's einsum computes them in float32
        xs = tuple(x.astype(np.float32) for x in xs)
    out = np.asarray(np.einsum(equation, *xs, optimize=len(xs) > 2))
    return (out.astype(dtype) if out.dtype != dtype else out,)


@kernel("Hardmax", since=13)
def _hardmax(x, *, axis=-1):
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    out = np.zeros_like(x)
    np.put_along_axis(out, idx, 1, axis=axis)
    return (out,)


@kernel("InstanceNormalization", since=6)
def _instance_norm(x, scale, bias, *, epsilon=1e-5):
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean) / np.sqrt(var + epsilon) * scale.reshape(shape) + bias.reshape(shape)
    return (y.astype(x.dtype),)
