"""Indexing lowerings: gather/scatter, and ops whose output shape depends on the data.

The data-dependent ones are NonZero, Compress, TopK and Unique.
"""

from __future__ import annotations

import torch
from onnx_ir import DataType

from hybrid.backends.torch.lowering import ALL, COMMON, ints, lowering

ANY = ALL


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


# ------------------------------------------------------------------ gather and scatter
def _wrap(indices: torch.Tensor, n: int) -> torch.Tensor:
    return torch.where(indices < 0, indices + n, indices).to(torch.int64)


@lowering("Gather", dtypes=ANY)
def gather(x, indices, *, axis=0):
    """ONNX Gather: picks slices of ``x`` along ``axis``; the output takes the indices' shape in place of that dim."""
    axis = _axis(axis, x.dim())
    idx = _wrap(indices, x.shape[axis])
    out = torch.index_select(x, axis, idx.reshape(-1))
    return out.reshape(list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:]))


@lowering("GatherElements", dtypes=ANY)
def gather_elements(x, indices, *, axis=0):
    """ONNX GatherElements: ``torch.gather`` along ``axis``, with negative indices wrapped."""
    axis = _axis(axis, x.dim())
    return torch.gather(x, axis, _wrap(indices, x.shape[axis]))


@lowering("GatherND", dtypes=ANY)
def gather_nd(x, indices, *, batch_dims=0):
    """ONNX GatherND: each row of the last index dim addresses a slice of ``x``, after ``batch_dims`` shared dims."""
    idx = indices.to(torch.int64)
    b = batch_dims
    batch_shape = list(x.shape[:b])
    nb = _prod(batch_shape)
    k = idx.shape[-1]
    data = x.reshape([nb, *list(x.shape[b:])])
    flat_idx = idx.reshape(nb, -1, k)
    dims = torch.tensor(x.shape[b:b + k], dtype=torch.int64, device=x.device)
    flat_idx = torch.where(flat_idx < 0, flat_idx + dims, flat_idx)
    batch = torch.arange(nb, device=x.device).reshape(nb, 1).expand(nb, flat_idx.shape[1])
    out = data[(batch, *flat_idx.unbind(-1))]
    return out.reshape(list(idx.shape[:-1]) + list(x.shape[b + k:]))


_REDUCE = {"none": None, "add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@lowering("ScatterElements", dtypes=ANY)
def scatter_elements(x, indices, updates, *, axis=0, reduction="none"):
    """ONNX ScatterElements: writes ``updates`` at ``indices`` along ``axis``, or combines them by ``reduction``."""
    axis = _axis(axis, x.dim())
    idx = _wrap(indices, x.shape[axis])
    mode = _REDUCE[reduction]
    if mode is None:
        return x.scatter(axis, idx, updates)
    return x.scatter_reduce(axis, idx, updates, mode, include_self=True)


@lowering("Scatter", dtypes=ANY)
def scatter(x, indices, updates, *, axis=0):
    """ONNX Scatter, the deprecated name of ScatterElements without ``reduction``."""
    return scatter_elements(x, indices, updates, axis=axis)


@lowering("ScatterND", dtypes=ANY)
def scatter_nd(x, indices, updates, *, reduction="none"):
    """ONNX ScatterND on a copy of ``x``; ``mul``/``max``/``min`` apply the updates one at a time, in order."""
    idx = indices.to(torch.int64)
    k = idx.shape[-1]
    dims = torch.tensor(x.shape[:k], dtype=torch.int64, device=x.device)
    idx = torch.where(idx < 0, idx + dims, idx).reshape(-1, k)
    out = x.clone()
    upd = updates.reshape([idx.shape[0], *list(x.shape[k:])])
    key = tuple(idx.unbind(-1))
    if reduction == "none":
        out[key] = upd
    elif reduction == "add":
        out.index_put_(key, upd, accumulate=True)
    else:
        for i in range(idx.shape[0]):  # mul/max/min: apply updates one by one, in order
            pos = tuple(int(v) for v in idx[i])
            cur = out[pos]
            out[pos] = {"mul": torch.mul, "max": torch.maximum, "min": torch.minimum}[reduction](cur, upd[i])
    return out


@lowering("TensorScatter", dtypes=ANY)
def tensor_scatter(past, update, write_indices=None, *, axis=-2, mode="linear"):
    """ONNX TensorScatter: writes ``update`` into a copy of the cache ``past`` from ``write_indices[b]`` on.

    In ``circular`` mode the positions wrap around the cache length.
    """
    axis = _axis(axis, past.dim())
    out = past.clone()
    seq = update.shape[axis]
    cap = past.shape[axis]
    for b in range(past.shape[0]):
        start = int(write_indices[b]) if write_indices is not None else 0
        for j in range(seq):
            pos = (start + j) % cap if mode == "circular" else start + j
            dst = [b] + [slice(None)] * (past.dim() - 1)
            src = [b] + [slice(None)] * (past.dim() - 1)
            dst[axis], src[axis] = pos, j
            out[tuple(dst)] = update[tuple(src)]
    return out


# ------------------------------------------------------------------ data-dependent shapes
@lowering("NonZero", dtypes=COMMON)
def nonzero(x):
    """ONNX NonZero: the indices of the nonzero elements, one row per dim (shape ``[rank, count]``)."""
    if x.dim() == 0:
        return torch.nonzero(x.reshape(1)).T[:0].reshape(0, int(bool(x)))
    return torch.nonzero(x).T.contiguous()


@lowering("Compress", dtypes=ANY)
def compress(x, condition, *, axis=None):
    """ONNX Compress: the slices along ``axis`` (elements of the flat ``x`` without it) where ``condition`` holds."""
    cond = condition.to(torch.bool)
    if axis is None:
        flat = x.reshape(-1)
        return flat[: cond.shape[0]][cond[: flat.shape[0]]]
    axis = _axis(axis, x.dim())
    n = min(cond.shape[0], x.shape[axis])
    idx = torch.nonzero(cond[:n]).reshape(-1)
    return torch.index_select(x, axis, idx)


@lowering("TopK", since=10, host_inputs=(1,), dtypes=COMMON - {DataType.BOOL})
def top_k(x, k, *, axis=-1, largest=1, sorted=1):
    """ONNX TopK: the ``k`` largest (or smallest) values along ``axis`` and their indices; ties go to the lower one."""
    kk = ints(k)[0]
    axis = _axis(axis, x.dim())
    # ties break to the lower index (ONNX): a stable sort gives that order
    order = torch.sort(x, dim=axis, descending=bool(largest), stable=True)
    values = order.values.narrow(axis, 0, kk)
    indices = order.indices.narrow(axis, 0, kk)
    return values, indices


@lowering("Unique", dtypes=COMMON, n_outputs=True)
def unique(x, *, axis=None, sorted=1, n_outputs=4):
    """ONNX Unique: the unique values, the index of each one's first occurrence, the inverse indices and the counts.

    Without ``sorted`` the values keep the order of their first occurrence.
    """
    if axis is None:
        flat = x.reshape(-1)
        values, inverse, counts = torch.unique(flat, sorted=True, return_inverse=True, return_counts=True)
        first = torch.full((values.shape[0],), flat.shape[0], dtype=torch.int64, device=x.device)
        first = first.scatter_reduce(0, inverse, torch.arange(flat.shape[0], device=x.device), "amin")
    else:
        axis = _axis(axis, x.dim())
        values, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True,
                                               dim=axis)
        n = x.shape[axis]
        first = torch.full((values.shape[axis],), n, dtype=torch.int64, device=x.device)
        first = first.scatter_reduce(0, inverse, torch.arange(n, device=x.device), "amin")
    if not sorted:
        order = torch.argsort(first)
        remap = torch.empty_like(order)
        remap[order] = torch.arange(order.shape[0], device=x.device)
        values = values[order] if axis is None else torch.index_select(values, axis, order)
        first, counts, inverse = first[order], counts[order], remap[inverse]
    return values, first, inverse.reshape(-1), counts
