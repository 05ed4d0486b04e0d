"""Conv and ConvTranspose.

Conv specializes at compile time: constant weights are laid out once per algorithm (GEMM matrix, Winograd-transformed
filters), and the algorithm is chosen per input shape by :func:`conv_algorithms.select_algorithm` unless the
``conv_algorithm`` option fixes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hybrid.backends.reference import conv_algorithms as ca
from hybrid.backends.reference.registry import NodeContext, prepared

__all__ = ["ConvKernel"]

_CONV_ATTRS = {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}


class ConvKernel:
    """A Conv node ready to run: ``kernel(x, w, b=None) -> (y,)``.

    Attributes:
        algorithm: 'auto' or a fixed algorithm from :data:`conv_algorithms.ALGORITHMS`.
        relu: Apply Relu to the output in place (set by the fusion pass).
        residual: The call takes one more input, added to the output in place (fusion pass).
    """

    def __init__(self, attrs: dict[str, Any], w: np.ndarray | None, b: np.ndarray | None,
                 algorithm: str = "auto") -> None:
        self.attrs = {k: attrs[k] for k in _CONV_ATTRS if k in attrs}
        self.attrs.setdefault("group", 1)
        self.algorithm = algorithm
        self.w = w
        self.b = b
        self.relu = False
        self.residual = False
        self._plans: dict[tuple, tuple] = {}
        self._weights: dict[str, np.ndarray] = {}

    def with_weights(self, w: np.ndarray, b: np.ndarray | None) -> ConvKernel:
        """A copy computing with new constant weights (BatchNormalization folded in)."""
        k = ConvKernel(self.attrs, w, b, self.algorithm)
        k.relu, k.residual = self.relu, self.residual
        return k

    def plan(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> tuple[ca.ConvGeometry, str]:
        """Geometry and algorithm for an input shape (cached per shape)."""
        key = (x_shape, w_shape)
        got = self._plans.get(key)
        if got is None:
            g = ca.geometry(x_shape, w_shape, **self.attrs)
            if len(g.kernel) == 1:  # 1-D runs as 2-D with a height of one
                g = ca.ConvGeometry((0, *g.pads_begin), (0, *g.pads_end), (1, *g.out), (1, *g.kernel),
                                    (1, *g.strides), (1, *g.dilations), g.group)
                x_shape = (*x_shape[:2], 1, *x_shape[2:])
            alg = self.algorithm
            if alg == "auto":
                alg = ca.select_algorithm(x_shape, w_shape, g)
            elif not ca.applicable(alg, x_shape, g):
                alg = "im2col"
            got = self._plans[key] = (g, alg)
        return got

    def _layout(self, alg: str, w: np.ndarray, group: int, const: bool) -> np.ndarray:
        if const and alg in self._weights:
            return self._weights[alg]
        if alg == "im2col":
            lay = ca.im2col_matrix(w, group)
        elif alg == "winograd":
            lay = ca.winograd_filter(w)
        else:
            lay = w
        if const:
            self._weights[alg] = lay
        return lay

    def __call__(self, x: np.ndarray, w: np.ndarray | None = None, b: np.ndarray | None = None,
                 residual: np.ndarray | None = None) -> tuple[np.ndarray]:
        """Convolve ``x`` (with ``w``/``b`` when the kernel holds none); add ``residual`` and apply Relu when fused."""
        const = self.w is not None
        if const:
            w, b = self.w, self.b
        if x.ndim != w.ndim:
            raise ValueError(f"expected X and W of the same rank, got X{list(x.shape)} W{list(w.shape)}")
        g, alg = self.plan(x.shape, w.shape)
        shape, dtype = x.shape, x.dtype
        if dtype not in (np.float32, np.float64):
            # half types accumulate in float32, as onnx.reference does, and round once at the end
            x, w = x.astype(np.float32), w.astype(np.float32)
        if x.ndim == 3:
            x = x.reshape(shape[0], shape[1], 1, shape[2])
            w4 = w.reshape(w.shape[0], w.shape[1], 1, w.shape[2])
        else:
            w4 = w
        out_shape = (shape[0], w.shape[0], *g.out[-(len(shape) - 2):])
        late = residual is not None and residual.shape != out_shape  # Add broadcasts to a larger result
        post = _epilogue(b, None if late else residual, self.relu and not late)
        lay = self._layout(alg, w4, g.group, const)
        if alg == "winograd":
            y = ca.conv_winograd(x, lay, g, post)
        elif alg == "depthwise":
            y = ca.conv_depthwise(x, lay, g, post)
        elif alg == "direct":
            y = ca.conv_direct(x, lay, g, post)
        else:
            y = ca.conv_im2col(x, lay, g, post)
        y = y.reshape(out_shape)
        if y.dtype != dtype:
            y = y.astype(dtype)
        if late:
            y = y + residual
            if self.relu:
                np.maximum(y, 0, out=y)
        return (y,)


def _epilogue(b: np.ndarray | None, residual: np.ndarray | None, relu: bool) -> ca.Post | None:
    """Bias, residual and Relu for a block of output channels of one image, in place."""
    if b is None and residual is None and not relu:
        return None

    def post(y: np.ndarray, image: int, lo: int, hi: int) -> None:
        if b is not None:
            y += b[lo:hi].reshape(-1, *([1] * (y.ndim - 1)))
        if residual is not None:
            y += residual[image, lo:hi].reshape(y.shape)
        if relu:
            np.maximum(y, 0, out=y)

    return post


@prepared("Conv", since=1)
def _conv(ctx: NodeContext):
    if set(ctx.attrs) - _CONV_ATTRS:
        return None
    w = ctx.consts[1]
    b = ctx.consts[2] if len(ctx.consts) > 2 else None
    if w is None or (len(ctx.consts) > 2 and ctx.present[2] and b is None):
        w = b = None  # weights known only at run time
    return ConvKernel(dict(ctx.attrs), w, b, ctx.options.get("conv_algorithm", "auto"))


# ------------------------------------------------------------------ ConvTranspose
def _deconv_geometry(x_shape, w_shape, attrs):
    nd = len(x_shape) - 2
    group = attrs.get("group", 1)
    k = tuple(attrs.get("kernel_shape") or w_shape[2:])
    s = tuple(attrs.get("strides") or (1,) * nd)
    d = tuple(attrs.get("dilations") or (1,) * nd)
    op = tuple(attrs.get("output_padding") or (0,) * nd)
    pads = tuple(attrs.get("pads") or (0,) * (2 * nd))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    sp = x_shape[2:]
    if x_shape[1] != w_shape[0] or w_shape[0] % group:
        raise ValueError(f"expected X channels = W.shape[0] divisible by group {group}, got X{list(x_shape)} "
                         f"W{list(w_shape)}")
    full = tuple(s[i] * (sp[i] - 1) + op[i] + (k[i] - 1) * d[i] + 1 for i in range(nd))
    out_shape = tuple(attrs["output_shape"])[-nd:] if attrs.get("output_shape") else None
    if "pads" not in attrs and (out_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER")):
        # pads follow from the requested output size (onnx.reference: the odd pixel goes first
        # unless auto_pad is SAME_UPPER)
        target = out_shape or tuple(sp[i] * s[i] for i in range(nd))
        total = tuple(full[i] - target[i] for i in range(nd))
        pb = tuple(t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total)
        out = target
    else:
        pb = pads[:nd]
        out = out_shape or tuple(full[i] - pb[i] - pads[nd + i] for i in range(nd))
    return k, s, d, pb, out, group


@prepared("ConvTranspose", since=1)
def _conv_transpose(ctx: NodeContext):
    allowed = {"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads",
               "strides"}
    if set(ctx.attrs) - allowed:
        return None
    attrs = dict(ctx.attrs)

    def run(x, w, b=None):
        k, s, d, pb, out, group = _deconv_geometry(x.shape, w.shape, attrs)
        n, c = x.shape[:2]
        nd = len(k)
        mg = w.shape[1]
        cg = c // group
        spatial = x.shape[2:]
        length = int(np.prod(spatial))
        # cols[n, g, mg*prod(k), L] = W_g^T @ X_g, then scattered (col2im) into the full output
        wg = w.reshape(group, cg, mg * int(np.prod(k)))
        cols = np.matmul(wg.transpose(0, 2, 1), x.reshape(n, group, cg, length))
        cols = cols.reshape(n, group * mg, *k, *spatial)
        full = tuple(s[i] * (spatial[i] - 1) + (k[i] - 1) * d[i] + 1 for i in range(nd))
        acc = np.zeros((n, group * mg, *full), dtype=np.result_type(x, w))
        for tap in np.ndindex(*k):
            idx = tuple(slice(tap[i] * d[i], tap[i] * d[i] + s[i] * (spatial[i] - 1) + 1, s[i])
                        for i in range(nd))
            acc[(slice(None), slice(None), *idx)] += cols[(slice(None), slice(None), *tap)]
        # output pixel j is full-size pixel j + pb (zero where that falls outside)
        y = np.zeros((n, group * mg, *out), dtype=x.dtype)
        lo = [max(pb[i], 0) for i in range(nd)]
        hi = [min(full[i], pb[i] + out[i]) for i in range(nd)]
        if all(h > lo_ for lo_, h in zip(lo, hi)):
            y[(slice(None), slice(None), *(slice(lo[i] - pb[i], hi[i] - pb[i]) for i in range(nd)))] = \
                acc[(slice(None), slice(None), *(slice(lo[i], hi[i]) for i in range(nd)))]
        if b is not None:
            y += b.reshape(-1, *([1] * nd))
        return (y,)

    return run
