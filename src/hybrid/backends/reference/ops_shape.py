"""Shape and data-movement kernels.

Reshape, Transpose, Concat, Split, Gather, Slice, ... and the constant makers (Constant, ConstantOfShape, Shape, Size).
"""

from __future__ import annotations

import numpy as np

from hybrid.backends.reference.registry import NodeContext, kernel, prepared

__all__: list[str] = []


@kernel("Reshape", since=5)
def _reshape(x, shape, *, allowzero=0):
    new = [int(d) for d in shape]
    if not allowzero:
        new = [x.shape[i] if d == 0 else d for i, d in enumerate(new)]
    return (x.reshape(new),)


@kernel("Transpose")
def _transpose(x, *, perm=None):
    return (np.transpose(x, perm),)


@kernel("Concat", since=4)
def _concat(*xs, axis):
    return (np.concatenate(xs, axis=axis),)


@kernel("Flatten", since=1)
def _flatten(x, *, axis=1):
    axis = axis % x.ndim if x.ndim and axis < 0 else axis
    return (x.reshape(int(np.prod(x.shape[:axis])), -1),)


@kernel("Squeeze", since=1)
def _squeeze(x, axes_input=None, *, axes=None):
    axes = axes_input if axes is None else axes
    if axes is None:
        return (np.squeeze(x),)
    return (np.squeeze(x, axis=tuple(int(a) for a in np.atleast_1d(axes))),)


@kernel("Unsqueeze", since=1)
def _unsqueeze(x, axes_input=None, *, axes=None):
    axes = [int(a) for a in np.atleast_1d(axes_input if axes is None else axes)]
    rank = x.ndim + len(axes)
    return (np.expand_dims(x, tuple(sorted(a % rank for a in axes))),)


@kernel("Shape", since=1)
def _shape(x, *, start=0, end=None):
    return (np.array(x.shape[start:end], dtype=np.int64),)


@kernel("Size", since=1)
def _size(x):
    return (np.array(x.size, dtype=np.int64),)


@kernel("Expand", since=8)
def _expand(x, shape):
    target = np.broadcast_shapes(x.shape, tuple(int(d) for d in shape))
    return (np.broadcast_to(x, target).copy(),)


@kernel("Tile", since=6)
def _tile(x, repeats):
    return (np.tile(x, tuple(int(r) for r in repeats)),)


@kernel("Gather", since=1)
def _gather(data, indices, *, axis=0):
    return (np.take(data, indices.astype(np.int64, copy=False), axis=axis),)


@kernel("GatherElements", since=11)
def _gather_elements(data, indices, *, axis=0):
    idx = np.where(indices < 0, indices + data.shape[axis], indices)
    return (np.take_along_axis(data, idx, axis=axis),)


@kernel("Slice", since=10)
def _slice(x, starts, ends, axes=None, steps=None):
    index = [slice(None)] * x.ndim
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis, start, end, step = int(axis) % x.ndim, int(start), int(end), int(step)
        dim = x.shape[axis]
        if step == 0:
            raise ValueError(f"slice step must not be 0 (axis {axis})")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            index[axis] = slice(start, end, step)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            index[axis] = slice(start, end if end >= 0 else None, step)
    return (x[tuple(index)],)


@prepared("Split", since=2)
def _split(ctx: NodeContext):
    if set(ctx.attrs) - {"axis", "split", "num_outputs"}:
        return None
    axis = ctx.attrs.get("axis", 0)
    split_attr = ctx.attrs.get("split")
    n = ctx.n_outputs

    def run(x, split=None):
        sizes = split_attr if split is None else split
        dim = x.shape[axis]
        if sizes is None or len(sizes) == 0:
            chunk = -(-dim // n)
            sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
        if sum(int(s) for s in sizes) != dim or len(sizes) != n:
            raise ValueError(f"expected {n} split sizes summing to {dim}, got {list(sizes)}")
        points = np.cumsum([int(s) for s in sizes])[:-1]
        return tuple(np.split(x, points, axis=axis))

    return run


@kernel("ConstantOfShape", since=9)
def _constant_of_shape(shape, *, value=None):
    fill = np.zeros(1, dtype=np.float32) if value is None else value
    return (np.full(tuple(int(d) for d in shape), fill.reshape(-1)[0], dtype=fill.dtype),)


@prepared("Constant", since=1)
def _constant(ctx: NodeContext):
    if len(ctx.attrs) != 1:
        return None
    (key, value), = ctx.attrs.items()
    if key == "value":
        arr = value
    elif key in ("value_float", "value_floats"):
        arr = np.array(value, dtype=np.float32)
    elif key in ("value_int", "value_ints"):
        arr = np.array(value, dtype=np.int64)
    else:
        return None  # strings and sparse tensors: onnx.reference

    def run():
        return (arr,)

    return run


@kernel("Range", since=11)
def _range(start, limit, delta):
    start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in (start, limit, delta))
    n = max(int(np.ceil((limit - start) / delta)), 0)
    steps = np.arange(n, dtype=np.float64 if start.dtype.kind == "f" else np.int64)
    return ((start + steps * delta).astype(start.dtype),)


@kernel("Pad", since=11)
def _pad(x, pads, constant_value=None, axes=None, *, mode="constant"):
    nd = x.ndim
    axes = list(range(nd)) if axes is None else [int(a) % nd for a in axes]
    width = [(0, 0)] * nd
    k = len(axes)
    for i, a in enumerate(axes):
        width[a] = (int(pads[i]), int(pads[i + k]))
    if any(b < 0 or e < 0 for b, e in width):
        # negative pads crop
        x = x[tuple(slice(-b if b < 0 else None, e if e < 0 else None) for b, e in width)]
        width = [(max(b, 0), max(e, 0)) for b, e in width]
    if mode == "constant":
        cv = 0 if constant_value is None or np.size(constant_value) == 0 else np.asarray(constant_value).item()
        return (np.pad(x, width, mode="constant", constant_values=cv),)
    if mode == "reflect":
        return (np.pad(x, width, mode="reflect"),)
    if mode == "edge":
        return (np.pad(x, width, mode="edge"),)
    if mode == "wrap":
        return (np.pad(x, width, mode="wrap"),)
    raise ValueError(f"Pad mode must be constant, reflect, edge or wrap, got {mode!r}")


_REDUCERS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@kernel("ScatterElements", since=11)
def _scatter_elements(data, indices, updates, *, axis=0, reduction="none"):
    axis = axis % data.ndim
    idx = np.where(indices < 0, indices + data.shape[axis], indices).astype(np.int64)
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    out = data.copy()
    if reduction == "none":
        out[tuple(grid)] = updates
    else:
        _REDUCERS[reduction].at(out, tuple(grid), updates)
    return (out,)


@kernel("Scatter", since=9)
def _scatter(data, indices, updates, *, axis=0):
    """The deprecated Scatter (opsets 9-10) is ScatterElements without reduction."""
    return _scatter_elements(data, indices, updates, axis=axis)
