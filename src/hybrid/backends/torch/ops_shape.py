"""Shape and indexing lowerings: reshape, slice, gather/scatter, pad, tile, concat/split, ..."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from onnx_ir import DataType

from hybrid.backends.torch.lowering import ALL, COMMON, ints, lowering, torch_dtype

ANY = ALL  # pure data movement works for every dtype torch stores


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _broadcast_shape(a: list[int], b: list[int]) -> list[int]:
    return list(torch.broadcast_shapes(tuple(a), tuple(b)))


# ------------------------------------------------------------------ shapes
@lowering("Shape", dtypes=ANY, shape_only=True)
def shape(x, *, start=0, end=None):
    """ONNX Shape: the dims of ``x`` as an int64 tensor, cut to ``[start, end)`` (negative bounds from the end)."""
    dims = list(x.shape)
    n = len(dims)
    lo = max(0, min(n, _axis(start, n)))
    hi = n if end is None else max(0, min(n, _axis(end, n)))
    return torch.tensor(dims[lo:hi], dtype=torch.int64)


@lowering("Size", dtypes=ANY, shape_only=True)
def size(x):
    """ONNX Size: the element count of ``x`` as an int64 scalar."""
    return torch.tensor(x.numel(), dtype=torch.int64)


@lowering("Reshape", since=5, host_inputs=(1,), dtypes=ANY)
def reshape(x, shape, *, allowzero=0):
    """ONNX Reshape; a 0 in ``shape`` copies the input's dim unless ``allowzero`` is set."""
    dims = ints(shape)
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@lowering("Flatten", dtypes=ANY)
def flatten(x, *, axis=1):
    """ONNX Flatten: a 2-D reshape, the dims before ``axis`` folded into rows and the rest into columns."""
    axis = _axis(axis, x.dim())
    lead = 1
    for d in x.shape[:axis]:
        lead *= d
    return x.reshape(lead, -1) if x.numel() else x.reshape(lead, _prod(x.shape[axis:]))


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


@lowering("Squeeze", dtypes=ANY)
def squeeze_attr(x, *, axes=None):
    """ONNX Squeeze before opset 13: ``axes`` is an attribute."""
    return squeeze(x, axes)


@lowering("Squeeze", since=13, host_inputs=(1,), dtypes=ANY)
def squeeze(x, axes=None):
    """ONNX Squeeze from opset 13: drops the ``axes`` input's dims, or every size-1 dim when it is absent."""
    dims = ints(axes)
    if dims is None:
        return x.squeeze()
    return x.squeeze(tuple(_axis(a, x.dim()) for a in dims)) if dims else x


@lowering("Unsqueeze", dtypes=ANY)
def unsqueeze_attr(x, *, axes):
    """ONNX Unsqueeze before opset 13: ``axes`` is an attribute."""
    return unsqueeze(x, axes)


@lowering("Unsqueeze", since=13, host_inputs=(1,), dtypes=ANY)
def unsqueeze(x, axes):
    """ONNX Unsqueeze from opset 13: inserts size-1 dims at ``axes``, counted in the output's rank."""
    dims = ints(axes)
    rank = x.dim() + len(dims)
    for a in sorted(_axis(a, rank) for a in dims):
        x = x.unsqueeze(a)
    return x


@lowering("Transpose", dtypes=ANY)
def transpose(x, *, perm=None):
    """ONNX Transpose; without ``perm`` the dims are reversed."""
    if perm is None:
        perm = list(range(x.dim()))[::-1]
    return x.permute(perm)


@lowering("Expand", since=8, host_inputs=(1,), dtypes=ANY)
def expand(x, shape):
    """ONNX Expand: broadcasts ``x`` against ``shape`` (numpy rules, so a target dim of 1 keeps the input's dim)."""
    target = _broadcast_shape(list(x.shape), ints(shape))
    return x.expand(target)


@lowering("Tile", since=6, host_inputs=(1,), dtypes=ANY)
def tile(x, repeats):
    """ONNX Tile: repeats ``x`` ``repeats[i]`` times along each dim."""
    return x.repeat(ints(repeats))


@lowering("Identity", dtypes=ANY)
def identity(x):
    """ONNX Identity: returns ``x`` itself, with no copy."""
    return x


# ------------------------------------------------------------------ concat and split
@lowering("Concat", dtypes=ANY)
def concat(*xs, axis=0):
    """ONNX Concat along ``axis``."""
    # ONNX allows empty inputs next to non-empty ones of another rank only when numel == 0
    return torch.cat(list(xs), dim=axis)


def _split_sizes(total: int, n: int) -> list[int]:
    chunk = -(-total // n)
    sizes = [chunk] * (total // chunk) if chunk else [0] * n
    if sum(sizes) < total:
        sizes.append(total - sum(sizes))
    return sizes + [0] * (n - len(sizes))


@lowering("Split", dtypes=ANY, n_outputs=True)
def split_attr(x, *, axis=0, split=None, n_outputs=1):
    """ONNX Split before opset 13: the part sizes are the ``split`` attribute."""
    return split(x, split, axis=axis, n_outputs=n_outputs)


@lowering("Split", since=13, host_inputs=(1,), dtypes=ANY, n_outputs=True)
def split(x, sizes=None, *, axis=0, num_outputs=None, n_outputs=1):
    """ONNX Split from opset 13: parts of ``sizes``, else ``num_outputs`` (or one per output) equal parts."""
    axis = _axis(axis, x.dim())
    parts = ints(sizes)
    if parts is None:
        parts = _split_sizes(x.shape[axis], num_outputs or n_outputs)
    return tuple(torch.split(x, parts, dim=axis))


# ------------------------------------------------------------------ slicing
@lowering("Slice", dtypes=ANY)
def slice_attrs(x, *, starts, ends, axes=None):
    """ONNX Slice before opset 10: ``starts``/``ends``/``axes`` are attributes and every step is 1."""
    return slice_(x, starts, ends, axes)


@lowering("Slice", since=10, host_inputs=(1, 2, 3, 4), dtypes=ANY)
def slice_(x, starts, ends, axes=None, steps=None):
    """ONNX Slice from opset 10, bounds clamped as ONNX says; a negative step slices the mirrored range and flips."""
    starts, ends = ints(starts), ints(ends)
    axes = ints(axes) or list(range(len(starts)))
    steps = ints(steps) or [1] * len(starts)
    index: list[slice] = [slice(None)] * x.dim()
    flips = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, x.dim())
        n = x.shape[a]
        if st > 0:
            s = max(0, min(n, s + n if s < 0 else s))
            e = max(0, min(n, e + n if e < 0 else e))
            index[a] = slice(s, max(s, e), st)
        else:
            # torch has no negative steps: slice the mirrored range, then flip
            s = max(-1, min(n - 1, s + n if s < 0 else s))
            e = max(-1, min(n - 1, e + n if e < 0 else e))
            if s <= e:
                index[a] = slice(0, 0)
            else:
                count = (s - e - 1) // (-st) + 1
                lo = s - (count - 1) * (-st)
                index[a] = slice(lo, s + 1, -st)
                flips.append(a)
    out = x[tuple(index)]
    return out.flip(flips) if flips else out


# ------------------------------------------------------------------ padding
@lowering("Pad", dtypes=ANY)
def pad_attrs(x, *, pads, mode="constant", value=0.0):
    """ONNX Pad before opset 11: ``pads`` and ``value`` are attributes."""
    return pad(x, pads, value, mode=mode)


@lowering("Pad", since=11, host_inputs=(1, 3), dtypes=ANY)
def pad(x, pads, value=None, axes=None, *, mode="constant"):
    """ONNX Pad from opset 11: constant, reflect, edge or wrap padding of ``axes`` (default all); negative pads crop."""
    pads = ints(pads)
    rank = x.dim()
    axes = [_axis(a, rank) for a in (ints(axes) or range(rank))]
    n = len(axes)
    before = dict(zip(axes, pads[:n]))
    after = dict(zip(axes, pads[n:]))
    # negative pads crop
    index = []
    for d in range(rank):
        lo, hi = min(0, before.get(d, 0)), min(0, after.get(d, 0))
        index.append(slice(-lo, x.shape[d] + hi))
    x = x[tuple(index)]
    torch_pads: list[int] = []
    for d in reversed(range(rank)):
        torch_pads += [max(0, before.get(d, 0)), max(0, after.get(d, 0))]
    if not any(torch_pads):
        return x
    if mode == "constant":
        fill = 0 if value is None else (value.item() if isinstance(value, torch.Tensor) else value)
        if value is not None and isinstance(value, torch.Tensor) and value.numel() == 0:
            fill = 0
        return F.pad(x, torch_pads, value=fill)
    if mode == "wrap":
        return _pad_wrap(x, torch_pads)
    torch_mode = {"reflect": "reflect", "edge": "replicate"}[mode]
    return _pad_nonconstant(x, torch_pads, torch_mode)


def _pad_nonconstant(x: torch.Tensor, torch_pads: list[int], mode: str) -> torch.Tensor:
    # torch pads only the last 1-3 dims in these modes (and wants floats): pad one dim at a time
    rank = x.dim()
    orig = x.dtype
    work = x if x.is_floating_point() else x.to(torch.float64)
    for i in range(rank):
        lo, hi = torch_pads[2 * i], torch_pads[2 * i + 1]
        if not lo and not hi:
            continue
        d = rank - 1 - i
        moved = work.movedim(d, -1)
        shape = moved.shape
        flat = moved.reshape(-1, 1, shape[-1])
        flat = F.pad(flat, [lo, hi], mode=mode)
        work = flat.reshape([*list(shape[:-1]), flat.shape[-1]]).movedim(-1, d)
    return work.to(orig)


def _pad_wrap(x: torch.Tensor, torch_pads: list[int]) -> torch.Tensor:
    rank = x.dim()
    for i in range(rank):
        lo, hi = torch_pads[2 * i], torch_pads[2 * i + 1]
        if not lo and not hi:
            continue
        d = rank - 1 - i
        n = x.shape[d]
        idx = torch.arange(-lo, n + hi, device=x.device) % n
        x = torch.index_select(x, d, idx)
    return x


# ------------------------------------------------------------------ generators
@lowering("ConstantOfShape", host_inputs=(0,), dtypes=ANY)
def constant_of_shape(shape, *, value=None):
    """ONNX ConstantOfShape: a tensor of ``shape`` filled with the one-element ``value`` (float32 zeros without it)."""
    dims = ints(shape)
    if value is None:
        return torch.zeros(dims, dtype=torch.float32)
    return value.reshape(()).expand(dims).clone() if dims else value.reshape(()).clone()


@lowering("Range", dtypes=COMMON - {DataType.BOOL})
def range_(start, limit, delta):
    """ONNX Range: ``ceil((limit - start) / delta)`` values from ``start`` by ``delta``, in the dtype of ``start``."""
    first, last, step = start.item(), limit.item(), delta.item()
    n = max(0, math.ceil((last - first) / step))
    return (start + torch.arange(n, dtype=start.dtype, device=start.device) * delta).to(start.dtype)


@lowering("EyeLike", dtypes=ANY)
def eye_like(x, *, dtype=None, k=0):
    """ONNX EyeLike: ones on diagonal ``k`` of a 2-D tensor shaped like ``x``, in ``dtype`` or the input's dtype."""
    out_dtype = torch_dtype(dtype) if dtype is not None else x.dtype
    n, m = x.shape
    eye = torch.zeros((n, m), dtype=out_dtype, device=x.device)
    i = torch.arange(max(0, min(n, m - k) if k >= 0 else min(n + k, m)), device=x.device)
    rows, cols = (i, i + k) if k >= 0 else (i - k, i)
    eye[rows, cols] = 1
    return eye


@lowering("Trilu", host_inputs=(1,), dtypes=ANY)
def trilu(x, k=None, *, upper=1):
    """ONNX Trilu: the upper (``upper=1``) or lower triangle from diagonal ``k``, zeros elsewhere."""
    diag = ints(k)[0] if k is not None else 0
    return torch.triu(x, diag) if upper else torch.tril(x, diag)


@lowering("OneHot", host_inputs=(1,), dtypes=ANY)
def one_hot(indices, depth, values, *, axis=-1):
    """ONNX OneHot: ``values[1]`` at each index along ``axis``, ``values[0]`` elsewhere; negative indices wrap."""
    d = ints(depth)[0]
    idx = indices.to(torch.int64)
    idx = torch.where(idx < 0, idx + d, idx)
    valid = (idx >= 0) & (idx < d)
    hot = F.one_hot(torch.where(valid, idx, 0), d).bool() & valid.unsqueeze(-1)
    rank = indices.dim() + 1
    hot = hot.movedim(-1, _axis(axis, rank))
    return torch.where(hot, values[1], values[0])


# ------------------------------------------------------------------ layout
@lowering("DepthToSpace", dtypes=ANY)
def depth_to_space(x, *, blocksize, mode="DCR"):
    """ONNX DepthToSpace: moves channel blocks into ``blocksize`` x ``blocksize`` spatial tiles, in DCR or CRD order."""
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@lowering("SpaceToDepth", dtypes=ANY)
def space_to_depth(x, *, blocksize, mode="DCR"):
    """ONNX SpaceToDepth: the inverse of DepthToSpace, spatial tiles of ``blocksize`` moved into channels."""
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.permute(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@lowering("ReverseSequence", dtypes=ANY)
def reverse_sequence(x, lengths, *, batch_axis=1, time_axis=0):
    """ONNX ReverseSequence: reverses the first ``lengths[b]`` steps along ``time_axis`` of each batch entry ``b``."""
    out = x.clone()
    for b in range(x.shape[batch_axis]):
        n = int(lengths[b])
        src = x.select(batch_axis, b).narrow(time_axis if time_axis < batch_axis else time_axis - 1, 0, n)
        dst = out.select(batch_axis, b)
        t = time_axis if time_axis < batch_axis else time_axis - 1
        dst.narrow(t, 0, n).copy_(src.flip(t))
    return out


@lowering("CenterCropPad", host_inputs=(1,), dtypes=ANY)
def center_crop_pad(x, shape, *, axes=None):
    """ONNX CenterCropPad: crops or zero-pads each of ``axes`` to ``shape``, keeping the centre."""
    dims = ints(shape)
    axes = [_axis(a, x.dim()) for a in (axes if axes is not None else range(x.dim()))]
    for a, target in zip(axes, dims):
        n = x.shape[a]
        if target < n:
            start = (n - target) // 2
            x = x.narrow(a, start, target)
        elif target > n:
            before = (target - n) // 2
            shape_new = list(x.shape)
            shape_new[a] = target
            out = torch.zeros(shape_new, dtype=x.dtype, device=x.device)
            out.narrow(a, before, n).copy_(x)
            x = out
    return x

