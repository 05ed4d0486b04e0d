"""Resize (opset 11+): separable per-axis interpolation, nearest / linear / cubic.

Each resized axis maps output index ``y`` to a source coordinate ``x`` by the coordinate
transformation mode, takes the ``n`` source pixels nearest to ``x`` (edge pixels repeat past the
border; n = 2 for nearest and linear, 4 for cubic), and weights them by the mode's coefficients of
``ratio = x - floor(x)`` (1 when ``x`` is whole). Nearest is a pure gather and keeps the input type;
linear and cubic accumulate in float64 and round once, saturating to the input type. The
antialiasing filters (opset 18) run on onnx.reference.
"""

from __future__ import annotations

import math

import numpy as np

from hybrid.backends.reference.registry import NodeContext, prepared

__all__: list[str] = []


def _source_coords(mode: str, y: np.ndarray, scale: float, in_w: int, out_w_int: int, roi):
    out_w = scale * in_w
    extrapolated = None
    if mode == "align_corners":
        x = np.zeros_like(y) if out_w == 1 else y * (in_w - 1) / (out_w - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "pytorch_half_pixel":
        x = np.full_like(y, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = (in_w / 2) * (1 - out_w_int / out_w)
        x = offset + (y + 0.5) / scale - 0.5
    elif mode == "tf_crop_and_resize":
        lo, hi = roi
        if out_w == 1:
            x = np.full_like(y, (hi - lo) * (in_w - 1) / 2)
        else:
            x = y * (hi - lo) * (in_w - 1) / (out_w - 1)
        x = x + lo * (in_w - 1)
        extrapolated = (x < 0) | (x > in_w - 1)
    else:
        raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")
    return x, extrapolated


def _coefficients(kind: str, ratio: np.ndarray, nearest_mode: str, a: float) -> np.ndarray:
    """(out_w, n) weights for ratios in (0, 1]."""
    if kind == "nearest":
        whole = ratio == 1.0
        if nearest_mode == "round_prefer_floor":
            up = ratio > 0.5
        elif nearest_mode == "round_prefer_ceil":
            up = ratio >= 0.5
        elif nearest_mode == "floor":
            up = np.zeros_like(whole)
        elif nearest_mode == "ceil":
            up = np.ones_like(whole)
        else:
            raise ValueError(f"unknown nearest_mode {nearest_mode!r}")
        up = up | whole
        return np.stack([~up, up], axis=1).astype(np.float64)
    if kind == "linear":
        return np.stack([1 - ratio, ratio], axis=1)
    r1, q = ratio + 1, 1 - ratio
    q1 = q + 1
    return np.stack([((a * r1 - 5 * a) * r1 + 8 * a) * r1 - 4 * a,
                     ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1,
                     ((a + 2) * q - (a + 3)) * q * q + 1,
                     ((a * q1 - 5 * a) * q1 + 8 * a) * q1 - 4 * a], axis=1)


def _axis_plan(kind, attrs, in_w, scale, out_w, roi):
    y = np.arange(out_w, dtype=np.float64)
    x, extrapolated = _source_coords(attrs["ctm"], y, scale, in_w, out_w, roi)
    base = np.floor(x).astype(np.int64)
    ratio = np.where(x == base, 1.0, x - base)
    coeffs = _coefficients(kind, ratio, attrs["nearest_mode"], attrs["a"])
    n = coeffs.shape[1]
    # the n pixels nearest to x, the lower ones first on ties (onnx.reference's neighbour rule)
    pad = (n + 1) // 2
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    start = p + np.where(xp - p == 0, -(n // 2), -(n // 2) + 1) - pad
    idx = start[:, None] + np.arange(n)[None, :]
    if attrs["exclude_outside"]:
        coeffs = np.where((idx < 0) | (idx >= in_w), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_w - 1), coeffs, extrapolated


def _saturate(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.round(x), info.min, info.max).astype(dtype)
    return x.astype(dtype)


@prepared("Resize", since=11)
def _resize(ctx: NodeContext):
    known = {"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
             "extrapolation_value", "keep_aspect_ratio_policy", "mode", "nearest_mode"}
    if set(ctx.attrs) - known or ctx.attrs.get("antialias", 0):
        return None
    kind = ctx.attrs.get("mode", "nearest")
    if kind not in ("nearest", "linear", "cubic"):
        return None
    attrs = {"ctm": ctx.attrs.get("coordinate_transformation_mode", "half_pixel"),
             "nearest_mode": ctx.attrs.get("nearest_mode", "round_prefer_floor"),
             "a": ctx.attrs.get("cubic_coeff_a", -0.75),
             "exclude_outside": bool(ctx.attrs.get("exclude_outside", 0))}
    axes_attr = ctx.attrs.get("axes")
    policy = ctx.attrs.get("keep_aspect_ratio_policy", "stretch")
    extrapolation = ctx.attrs.get("extrapolation_value", 0.0)

    def run(x, roi=None, scales=None, sizes=None):
        r = x.ndim
        axes = list(range(r)) if axes_attr is None else [a % r for a in axes_attr]
        roi = None if roi is None or roi.size == 0 else [float(v) for v in roi]
        if roi is not None and len(roi) == 2 * len(axes) and axes_attr is not None:
            full = [0.0] * r + [1.0] * r
            for i, a in enumerate(axes):
                full[a], full[r + a] = roi[i], roi[len(axes) + i]
            roi = full
        factors = [1.0] * r
        out = list(x.shape)
        if sizes is not None and sizes.size:
            for a, s in zip(axes, sizes):
                out[a] = int(s)
                factors[a] = int(s) / x.shape[a]
            if policy != "stretch":
                pick = min if policy == "not_larger" else max
                common = pick(factors[a] for a in axes)
                for a in axes:
                    factors[a] = common
                    out[a] = int(common * x.shape[a] + 0.5)
        elif scales is not None and scales.size:
            for a, s in zip(axes, scales):
                factors[a] = float(s)
                out[a] = int(float(s) * x.shape[a])
        else:
            raise ValueError("Resize needs scales or sizes")
        y = x
        for a in axes:
            if math.isclose(factors[a], 1.0) and out[a] == x.shape[a] and \
                    (roi is None or (math.isclose(roi[a], 0.0) and math.isclose(roi[a + r], 1.0))):
                continue
            axis_roi = None if roi is None else (roi[a], roi[a + r])
            idx, coeffs, extrapolated = _axis_plan(kind, attrs, y.shape[a], factors[a], out[a], axis_roi)
            shape = (1,) * a + (out[a],) + (1,) * (r - a - 1)
            if kind == "nearest" and extrapolated is None:
                y = np.take(y, idx[np.arange(out[a]), coeffs.argmax(axis=1)], axis=a)
                continue
            acc = None
            for k in range(coeffs.shape[1]):
                term = np.take(y, idx[:, k], axis=a).astype(np.float64) * coeffs[:, k].reshape(shape)
                acc = term if acc is None else acc + term
            if extrapolated is not None and extrapolated.any():
                acc = np.where(extrapolated.reshape(shape), extrapolation, acc)
            y = acc
        return (_saturate(y, x.dtype) if y.dtype != x.dtype else y,)

    return run
