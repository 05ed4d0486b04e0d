"""Image lowerings: Resize/Upsample, GridSample, AffineGrid, Col2Im, NonMaxSuppression.

Resize applies one dense interpolation matrix per resized axis (separable), built on the host and cached.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from onnx_ir import DataType

from hybrid.backends.torch.lowering import COMMON, FLOATS, ints, lowering

NUMERIC = COMMON - {DataType.BOOL}


# ------------------------------------------------------------------ resize
def _nearest_fn(mode):
    def coeffs(ratio, scale):
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        if mode == "round_prefer_floor":
            return np.array([ratio <= 0.5, ratio > 0.5], dtype=np.float64)
        if mode == "round_prefer_ceil":
            return np.array([ratio < 0.5, ratio >= 0.5], dtype=np.float64)
        if mode == "floor":
            return np.array([1.0, 0.0])
        return np.array([0.0, 1.0])

    return coeffs


def _linear(ratio, scale):
    return np.array([1 - ratio, ratio])


def _linear_aa(ratio, scale):
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    footprint = 2 - 2 * start
    args = (np.arange(start, start + footprint) - ratio) * scale
    c = np.clip(1 - np.abs(args), 0, 1)
    return c / c.sum()


def _cubic_fn(a, antialias):
    def plain(ratio, scale):
        r = ratio
        return np.array([
            ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
            ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a,
        ])

    def smooth(ratio, scale):
        scale = min(scale, 1.0)

        def k(x):
            x = abs(x)
            if x <= 1:
                return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
            if x < 2:
                return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a
            return 0.0

        i_start = int(np.floor(-2 / scale) + 1)
        c = np.array([k(scale * (i - ratio)) for i in range(i_start, 2 - i_start)])
        return c / c.sum()

    return smooth if antialias else plain


def _source_coords(mode, y, scale, n_in, n_out_f, n_out, roi):
    extrapolated = None
    if mode == "align_corners":
        x = np.zeros(n_out) if n_out_f == 1 else y * (n_in - 1) / (n_out_f - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if n_out_f == 1 else \
            y * (hi - lo) * (n_in - 1) / (n_out_f - 1)
        x = x + lo * (n_in - 1)
        extrapolated = (x < 0) | (x > n_in - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if n_out_f == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / n_out_f)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")
    return x, extrapolated


@lru_cache(maxsize=256)
def _resize_matrix(n_in, n_out, scale, key):
    """Dense (n_out, n_in) interpolation matrix for one axis, and the extrapolated output rows.

    The per-axis computation is the same as in ONNX's reference Resize.
    """
    mode, coord, nearest_mode, cubic_a, exclude_outside, antialias, roi = key
    if mode == "nearest":
        fn = _nearest_fn(nearest_mode)
    elif mode == "linear":
        fn = _linear_aa if antialias else _linear
    else:
        fn = _cubic_fn(cubic_a, antialias)
    y = np.arange(n_out, dtype=np.float64)
    x, extrapolated = _source_coords(coord, y, scale, n_in, scale * n_in, n_out, roi)
    base = np.floor(x).astype(np.int64)
    ratios = np.where(x == base, 1.0, x - base)
    coeffs = np.stack([fn(float(r), scale) for r in ratios]) if n_out else np.zeros((0, 2))
    n = coeffs.shape[1]
    pad = int(np.ceil(n / 2))
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        b = -((n - 1) // 2)
        offset = np.where(frac <= 0.5, b, b + 1)
    idx = (p + offset)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= n_in), 0.0, coeffs)
        total = coeffs.sum(axis=-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    matrix = np.zeros((n_out, n_in))
    np.add.at(matrix, (np.repeat(np.arange(n_out), n), np.clip(idx, 0, n_in - 1).reshape(-1)),
              coeffs.reshape(-1))
    return matrix, extrapolated


def _resize(x, roi, scales, sizes, *, antialias, axes, coord, cubic_a, exclude_outside, extrapolation,
            policy, mode, nearest_mode):
    rank = x.dim()
    axes = [a + rank if a < 0 else a for a in (axes or range(rank))]
    roi_vals = [float(v) for v in (roi.reshape(-1).tolist() if isinstance(roi, torch.Tensor) else (roi or []))]
    scales = [float(v) for v in (scales.reshape(-1).tolist() if isinstance(scales, torch.Tensor)
                                 else (scales or []))]
    sizes = ints(sizes) or []
    in_shape = list(x.shape)
    if sizes:
        scale_of = {a: sizes[i] / in_shape[a] for i, a in enumerate(axes)}
        out_of = {a: sizes[i] for i, a in enumerate(axes)}
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scale_of.values())
            scale_of = dict.fromkeys(axes, s)
            out_of = {a: int(s * in_shape[a] + 0.5) for a in axes}
    else:
        scale_of = {a: scales[i] for i, a in enumerate(axes)}
        out_of = {a: int(scales[i] * in_shape[a]) for i, a in enumerate(axes)}
    n_axes = len(axes)
    work = x if x.is_floating_point() and x.dtype != torch.float16 else x.to(torch.float32)
    if x.dtype == torch.float64:
        work = x
    outside = None
    for i, a in enumerate(axes):
        s, n_out = scale_of[a], out_of[a]
        roi_a = (roi_vals[i], roi_vals[n_axes + i]) if roi_vals else (0.0, 1.0)
        if math.isclose(s, 1.0) and n_out == in_shape[a] and roi_a == (0.0, 1.0):
            continue
        key = (mode, coord, nearest_mode, cubic_a, exclude_outside, antialias, roi_a)
        matrix, extrap = _resize_matrix(in_shape[a], n_out, s, key)
        w = torch.from_numpy(matrix).to(work.dtype).to(work.device)
        work = torch.tensordot(work.movedim(a, -1), w, dims=([-1], [1])).movedim(-1, a)
        if extrap is not None and extrap.any():
            shape = [1] * rank
            shape[a] = n_out
            mask = torch.from_numpy(extrap).reshape(shape).to(work.device)
            outside = mask if outside is None else (outside | mask)
    if outside is not None:
        work = torch.where(outside, torch.tensor(extrapolation, dtype=work.dtype, device=work.device), work)
    if x.is_floating_point():
        return work.to(x.dtype)
    info = torch.iinfo(x.dtype)
    return torch.clamp(torch.round(work), info.min, info.max).to(x.dtype)


@lowering("Resize", since=11, host_inputs=(1, 2, 3), dtypes=NUMERIC | FLOATS)
def resize(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    """ONNX Resize from opset 11: nearest, linear or cubic interpolation, one separable matrix per resized axis.

    The output size comes from ``sizes`` (under ``keep_aspect_ratio_policy``) or ``scales``; empty
    inputs count as absent. Integer inputs are interpolated in float32 and rounded back, saturating.
    """
    if isinstance(scales, torch.Tensor) and scales.numel() == 0:
        scales = None
    if isinstance(sizes, (list, torch.Tensor)) and len(sizes) == 0:
        sizes = None
    if isinstance(roi, torch.Tensor) and roi.numel() == 0:
        roi = None
    return _resize(x, roi, scales, sizes, antialias=antialias, axes=axes, coord=coordinate_transformation_mode,
                   cubic_a=cubic_coeff_a, exclude_outside=exclude_outside, extrapolation=extrapolation_value,
                   policy=keep_aspect_ratio_policy, mode=mode, nearest_mode=nearest_mode)


@lowering("Resize", since=10, host_inputs=(1,), dtypes=NUMERIC | FLOATS)
def resize_10(x, scales, *, mode="nearest"):
    """ONNX Resize at opset 10: ``scales`` only, asymmetric coordinates and floor rounding for nearest."""
    return _resize(x, None, scales, None, antialias=0, axes=None, coord="asymmetric", cubic_a=-0.75,
                   exclude_outside=0, extrapolation=0.0, policy="stretch", mode=mode, nearest_mode="floor")


@lowering("Upsample", since=9, host_inputs=(1,), dtypes=NUMERIC | FLOATS)
def upsample(x, scales, *, mode="nearest"):
    """ONNX Upsample at opset 9: the opset-10 Resize, with ``scales`` as an input."""
    return resize_10(x, scales, mode=mode)


@lowering("Upsample", since=7, dtypes=NUMERIC | FLOATS)
def upsample_7(x, *, mode="nearest", scales):
    """ONNX Upsample at opset 7: the opset-10 Resize, with ``scales`` as an attribute."""
    return resize_10(x, scales, mode=mode)


# ------------------------------------------------------------------ sampling grids
_GRID_MODES = {"linear": "bilinear", "bilinear": "bilinear", "nearest": "nearest", "cubic": "bicubic",
               "bicubic": "bicubic"}


def _grid_check(node):
    mode = node.attributes.get("mode")
    x = node.inputs[0]
    if x is not None and x.shape is not None and len(x.shape) == 5 and mode is not None \
            and mode.value in ("cubic", "bicubic"):
        return "torch grid_sample has no bicubic mode in 3-D"
    if x is not None and x.shape is not None and len(x.shape) not in (4, 5):
        return "torch grid_sample handles 2-D and 3-D images"
    return None


@lowering("GridSample", since=16, dtypes=FLOATS, check=_grid_check)
def grid_sample(x, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    """ONNX GridSample on 2-D or 3-D images through ``F.grid_sample`` (no bicubic mode in 3-D)."""
    return F.grid_sample(x, grid.to(x.dtype), mode=_GRID_MODES[mode], padding_mode=padding_mode,
                         align_corners=bool(align_corners))


@lowering("AffineGrid", since=20, host_inputs=(1,), dtypes=FLOATS | {DataType.INT64})
def affine_grid(theta, size, *, align_corners=0):
    """ONNX AffineGrid: the sampling grid of the affine matrices ``theta`` for an output of ``size``."""
    return F.affine_grid(theta, ints(size), align_corners=bool(align_corners))


def _col2im_check(node):
    x = node.inputs[1]
    if x is not None and x.const_value is not None and x.const_value.numpy().size != 2:
        return "torch fold handles 2-D images only"
    return None


@lowering("Col2Im", since=18, host_inputs=(1, 2), dtypes=FLOATS | {DataType.INT64}, check=_col2im_check)
def col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """ONNX Col2Im on 2-D images through ``F.fold``; asymmetric pads raise ValueError, as fold has none."""
    size, block = ints(image_shape), ints(block_shape)
    if len(size) != 2:
        raise ValueError("Col2Im is lowered for 2-D images only")
    pads = pads or [0, 0, 0, 0]
    if pads[0] != pads[2] or pads[1] != pads[3]:
        raise ValueError("Col2Im with asymmetric pads is not lowered")
    return F.fold(x, size, block, dilation=dilations or 1, padding=pads[:2], stride=strides or 1)


# ------------------------------------------------------------------ detection
@lowering("NonMaxSuppression", since=10, host_inputs=(2, 3, 4), dtypes=FLOATS | {DataType.INT64},
          foldable=True)
def non_max_suppression(boxes, scores, max_output=None, iou_threshold=None, score_threshold=None, *,
                        center_point_box=0):
    """ONNX NonMaxSuppression: greedy per-class suppression by IoU, highest score first.

    Returns the ``[batch, class, box]`` rows kept, at most ``max_output`` per class; boxes at or below
    ``score_threshold`` are skipped, and a ``max_output`` of 0 keeps none.
    """
    limit = ints(max_output)[0] if max_output is not None else 0
    iou_t = float(iou_threshold[0] if isinstance(iou_threshold, list) else iou_threshold.reshape(-1)[0]) \
        if iou_threshold is not None else 0.0
    score_t = float(score_threshold[0] if isinstance(score_threshold, list)
                    else score_threshold.reshape(-1)[0]) if score_threshold is not None else None
    b = boxes.to(torch.float32)
    if center_point_box:
        cx, cy, w, h = b.unbind(-1)
        b = torch.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], dim=-1)
    y1 = torch.minimum(b[..., 0], b[..., 2])
    x1 = torch.minimum(b[..., 1], b[..., 3])
    y2 = torch.maximum(b[..., 0], b[..., 2])
    x2 = torch.maximum(b[..., 1], b[..., 3])
    area = (y2 - y1) * (x2 - x1)
    picked: list[list[int]] = []
    for n in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[n, c]
            order = torch.sort(s, descending=True, stable=True).indices.tolist()
            keep: list[int] = []
            for i in order:
                if limit and len(keep) >= limit:
                    break
                if score_t is not None and float(s[i]) <= score_t:
                    continue
                ok = True
                for j in keep:
                    iy1, ix1 = max(float(y1[n, i]), float(y1[n, j])), max(float(x1[n, i]), float(x1[n, j]))
                    iy2, ix2 = min(float(y2[n, i]), float(y2[n, j])), min(float(x2[n, i]), float(x2[n, j]))
                    inter = max(0.0, iy2 - iy1) * max(0.0, ix2 - ix1)
                    union = float(area[n, i]) + float(area[n, j]) - inter
                    if union > 0 and inter / union > iou_t:
                        ok = False
                        break
                if ok:
                    keep.append(i)
            picked += [[n, c, i] for i in keep]
    if not limit and max_output is not None:
        picked = []
    return torch.tensor(picked, dtype=torch.int64, device=boxes.device).reshape(-1, 3)
