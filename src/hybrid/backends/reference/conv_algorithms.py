"""Convolution algorithms over NCHW arrays, and the rule that picks one per shape.

Four algorithms compute the same ONNX Conv (cross-correlation with pads, strides, dilations and
groups); the property tests check each against im2col:

- ``im2col``: copy the receptive fields into a (C/G*kH*kW, oH*oW) matrix, one BLAS GEMM per group.
  Any rank, any attributes. A 1x1 stride-1 unpadded conv needs no copy at all.
- ``winograd``: F(2x2, 3x3) for 3x3, stride 1, dilation 1, group 1: 16 GEMMs on transformed 4x4
  tiles do the work of 36 multiply-adds per output pair with 16 (2.25x fewer multiplications).
- ``depthwise``: per-channel GEMMs of each channel's filters with its receptive fields, for
  group == C_in (channel multiplier any).
- ``direct``: one GEMM per filter tap accumulated into the output (no im2col buffer); 2-D only.

Selection rule (:func:`select_algorithm`, 'auto'):
1. group == C_in > 1 (depthwise, any multiplier)               -> ``depthwise``
2. 3x3, stride 1, dilation 1, group 1, C_in >= 64, M >= 64 and
   at least 36 output tiles (2x2 each, batch included)         -> ``winograd``
3. everything else                                             -> ``im2col``
An explicit ``conv_algorithm`` in the config is used where it applies; where it does not (Winograd
on a 5x5 filter, depthwise on a dense conv, direct on a 3-D conv) that conv uses ``im2col``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from hybrid.backends.reference.parallel import for_blocks

# ``post(y, image, lo, hi)``: finishes output channels lo:hi of one image in place (bias, residual,
# Relu); the algorithms call it block by block, on the thread that computed the block
Post = Callable[[np.ndarray, int, int, int], None]

__all__ = [
    "ALGORITHMS",
    "ConvGeometry",
    "Post",
    "applicable",
    "conv_depthwise",
    "conv_direct",
    "conv_im2col",
    "conv_winograd",
    "geometry",
    "select_algorithm",
    "winograd_filter",
]

ALGORITHMS = ("im2col", "winograd", "depthwise", "direct")

# Winograd F(2x2, 3x3) matrices (Lavin & Gray, 2015)
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class ConvGeometry:
    """Pads (begin, end per spatial axis), output spatial shape and the conv attributes."""

    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    group: int


def geometry(x_shape: Sequence[int], w_shape: Sequence[int], *, strides: Sequence[int] | None = None,
             dilations: Sequence[int] | None = None, pads: Sequence[int] | None = None,
             auto_pad: str = "NOTSET", group: int = 1, kernel_shape: Sequence[int] | None = None
             ) -> ConvGeometry:
    """Resolve ONNX Conv attributes for an input shape (auto_pad included).

    Raises:
        ValueError: when the shapes break the operator's rules (channels, groups, ranks, sizes).
    """
    nd = len(x_shape) - 2
    if nd < 1 or len(w_shape) != nd + 2:
        raise ValueError(f"expected X of rank >= 3 and W of the same rank, got X{list(x_shape)} "
                         f"W{list(w_shape)}")
    k = tuple(kernel_shape) if kernel_shape else tuple(w_shape[2:])
    if k != tuple(w_shape[2:]):
        raise ValueError(f"kernel_shape {list(k)} differs from W's spatial shape {list(w_shape[2:])}")
    if group < 1 or x_shape[1] != w_shape[1] * group or w_shape[0] % group:
        raise ValueError(f"expected X channels = W.shape[1] * group ({w_shape[1]} * {group}) and W.shape[0] "
                         f"divisible by group, got X channels {x_shape[1]}, W{list(w_shape)}")
    s = tuple(strides) if strides else (1,) * nd
    d = tuple(dilations) if dilations else (1,) * nd
    span = tuple((k[i] - 1) * d[i] + 1 for i in range(nd))
    sp = tuple(x_shape[2:])
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(-(-sp[i] // s[i]) for i in range(nd))
        total = tuple(max(0, (out[i] - 1) * s[i] + span[i] - sp[i]) for i in range(nd))
        small = tuple(t // 2 for t in total)
        big = tuple(t - t // 2 for t in total)
        pb, pe = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pb = pe = (0,) * nd
    else:
        p = tuple(pads) if pads else (0,) * (2 * nd)
        pb, pe = p[:nd], p[nd:]
    out = tuple((sp[i] + pb[i] + pe[i] - span[i]) // s[i] + 1 for i in range(nd))
    if any(o < 1 for o in out):
        raise ValueError(f"the kernel {list(k)} (dilations {list(d)}) does not fit the padded input "
                         f"{[sp[i] + pb[i] + pe[i] for i in range(nd)]}")
    return ConvGeometry(tuple(pb), tuple(pe), out, k, s, d, group)


def select_algorithm(x_shape: Sequence[int], w_shape: Sequence[int], g: ConvGeometry) -> str:
    """The 'auto' rule of the module docstring."""
    cin, m = x_shape[1], w_shape[0]
    if g.group > 1 and g.group == cin:
        return "depthwise"
    if (len(g.kernel) == 2 and g.kernel == (3, 3) and g.strides == (1, 1) and g.dilations == (1, 1)
            and g.group == 1 and cin >= 64 and m >= 64
            and x_shape[0] * ((g.out[0] + 1) // 2) * ((g.out[1] + 1) // 2) >= 36):
        return "winograd"
    return "im2col"


def applicable(algorithm: str, x_shape: Sequence[int], g: ConvGeometry) -> bool:
    """Whether ``algorithm`` can compute this conv (else im2col is used)."""
    if algorithm == "im2col":
        return True
    if algorithm == "winograd":
        return g.kernel == (3, 3) and g.strides == (1, 1) and g.dilations == (1, 1) and g.group == 1
    if algorithm == "depthwise":
        return len(g.kernel) in (1, 2) and g.group == x_shape[1]
    if algorithm == "direct":
        return len(g.kernel) in (1, 2)
    return False


def pad_input(x: np.ndarray, g: ConvGeometry, extra_end: Sequence[int] | None = None) -> np.ndarray:
    """``x`` with zero padding on the spatial axes (no copy when there is none)."""
    extra = tuple(extra_end) if extra_end else (0,) * len(g.out)
    if not any(g.pads_begin) and not any(g.pads_end) and not any(extra):
        return x
    sp = x.shape[2:]
    shape = x.shape[:2] + tuple(sp[i] + g.pads_begin[i] + g.pads_end[i] + extra[i] for i in range(len(sp)))
    xp = np.zeros(shape, dtype=x.dtype)
    xp[(slice(None), slice(None), *(slice(b, b + n) for b, n in zip(g.pads_begin, sp)))] = x
    return xp


def im2col_matrix(w: np.ndarray, group: int) -> np.ndarray:
    """W (M, C/G, *k) as the (G, M/G, C/G*prod(k)) GEMM operand."""
    m = w.shape[0]
    return np.ascontiguousarray(w.reshape(group, m // group, -1))


def conv_im2col(x: np.ndarray, wmat: np.ndarray, g: ConvGeometry, post: Post | None = None) -> np.ndarray:
    """im2col + GEMM. ``wmat`` comes from :func:`im2col_matrix`. Returns (N, M, *out)."""
    n, c = x.shape[:2]
    groups, mg, kg = wmat.shape
    nd = len(g.out)
    length = int(np.prod(g.out))
    pointwise = all(k == 1 for k in g.kernel) and not any(g.pads_begin) and not any(g.pads_end)
    if pointwise and all(s == 1 for s in g.strides):
        cols = x.reshape(n, groups, c // groups, length)
    elif pointwise:
        sub = x[(slice(None), slice(None), *(slice(None, o * s, s) for o, s in zip(g.out, g.strides)))]
        cols = np.empty((n, c, *g.out), dtype=x.dtype)

        def copy_channels(lo: int, hi: int) -> None:
            cols[:, lo:hi] = sub[:, lo:hi]

        for_blocks(c, copy_channels, cols.size)
        cols = cols.reshape(n, groups, c // groups, length)
    else:
        xp = pad_input(x, g)
        st = xp.strides
        shape = (n, c, *g.kernel, *g.out)
        strides = (st[0], st[1], *(st[2 + i] * g.dilations[i] for i in range(nd)),
                   *(st[2 + i] * g.strides[i] for i in range(nd)))
        windows = as_strided(xp, shape, strides, writeable=False)
        cols = np.empty(shape, dtype=x.dtype)

        def copy_windows(lo: int, hi: int) -> None:
            cols[:, lo:hi] = windows[:, lo:hi]

        for_blocks(c, copy_windows, cols.size)
        cols = cols.reshape(n, groups, -1, length)
    if n == 1 and groups == 1:
        w2, c2 = wmat[0], cols[0, 0]
        out = np.empty((mg, length), dtype=np.result_type(w2, c2))

        def rows(lo: int, hi: int) -> None:
            np.matmul(w2[lo:hi], c2, out=out[lo:hi])
            if post is not None:
                post(out[lo:hi], 0, lo, hi)

        for_blocks(mg, rows, mg * kg * length, align=16)
        return out.reshape(1, mg, *g.out)
    out = np.matmul(wmat, cols).reshape(n, groups * mg, length)
    if post is not None:
        for i in range(n):
            post(out[i], i, 0, groups * mg)
    return out.reshape(n, groups * mg, *g.out)


def winograd_filter(w: np.ndarray) -> np.ndarray:
    """U = G g G^T for every (M, C) 3x3 filter, as (16, M, C) in the filter's dtype."""
    u = np.einsum("ai,mcij,bj->abmc", _G, w.astype(np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]).astype(w.dtype))


def conv_winograd(x: np.ndarray, u: np.ndarray, g: ConvGeometry, post: Post | None = None) -> np.ndarray:
    """F(2x2, 3x3). ``u`` comes from :func:`winograd_filter`. Returns (N, M, oH, oW).

    Two parallel phases: the input transform by blocks of input channels, then per block of output
    channels the 16 GEMMs, the output transform and ``post``.
    """
    n, c = x.shape[:2]
    m = u.shape[1]
    oh, ow = g.out
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    # pad so that the tiles (4x4, step 2) cover the output exactly
    xp = pad_input(x, g, (2 * th + 2 - (x.shape[2] + g.pads_begin[0] + g.pads_end[0]),
                          2 * tw + 2 - (x.shape[3] + g.pads_begin[1] + g.pads_end[1])))
    xp = xp.transpose(1, 0, 2, 3) if n > 1 else xp.reshape(c, 1, *xp.shape[2:])
    v = np.empty((4, 4, c, n, th, tw), dtype=x.dtype)

    def transform_in(lo: int, hi: int) -> None:
        # B^T d B for every tile: rows first (row k of tile i is row 2i + k), then columns
        r = [xp[lo:hi, :, k:k + 2 * th:2, :] for k in range(4)]
        for a, t in enumerate((r[0] - r[2], r[1] + r[2], r[2] - r[1], r[1] - r[3])):
            cc = [t[..., k:k + 2 * tw:2] for k in range(4)]
            np.subtract(cc[0], cc[2], out=v[a, 0, lo:hi])
            np.add(cc[1], cc[2], out=v[a, 1, lo:hi])
            np.subtract(cc[2], cc[1], out=v[a, 2, lo:hi])
            np.subtract(cc[1], cc[3], out=v[a, 3, lo:hi])

    for_blocks(c, transform_in, v.size)
    v2 = v.reshape(16, c, n * th * tw)
    full = np.empty((n, m, 2 * th, 2 * tw), dtype=x.dtype)
    cropped = (2 * th, 2 * tw) != (oh, ow)
    out = np.empty((n, m, oh, ow), dtype=x.dtype) if cropped else full

    def transform_out(lo: int, hi: int) -> None:
        prod = np.matmul(u[:, lo:hi], v2).reshape(4, 4, hi - lo, n, th, tw)
        # A^T m A: two outputs per tile along each axis
        s0 = prod[0] + prod[1] + prod[2]
        s1 = prod[1] - prod[2] - prod[3]
        view = full[:, lo:hi].transpose(1, 0, 2, 3)
        for i, s in enumerate((s0, s1)):
            np.add(s[0] + s[1], s[2], out=view[:, :, i::2, 0::2])
            np.subtract(s[1] - s[2], s[3], out=view[:, :, i::2, 1::2])
        if cropped:
            out[:, lo:hi] = full[:, lo:hi, :oh, :ow]
        if post is not None:
            for image in range(n):
                post(out[image, lo:hi], image, lo, hi)

    for_blocks(m, transform_out, 16 * m * c * n * th * tw, align=8)
    return out


def conv_depthwise(x: np.ndarray, w: np.ndarray, g: ConvGeometry, post: Post | None = None) -> np.ndarray:
    """Per-channel GEMMs; group == C_in, W (C*mult, 1, kH, kW). Returns (N, M, oH, oW).

    Each channel's receptive fields are copied into a (kH*kW, oH*oW) matrix and multiplied by that
    channel's (mult, kH*kW) filters: one batched matmul over the channels, split over the intra-op
    threads by channel blocks.
    """
    n, c = x.shape[:2]
    mult = w.shape[0] // c
    oh, ow = g.out
    kh, kw = g.kernel
    (sh, sw), (dh, dw) = g.strides, g.dilations
    xp = pad_input(x, g)
    st = xp.strides
    windows = as_strided(xp, (n, c, kh, kw, oh, ow), (st[0], st[1], st[2] * dh, st[3] * dw, st[2] * sh, st[3] * sw),
                         writeable=False)
    taps = w.reshape(c, mult, kh * kw)
    out = np.empty((n, c * mult, oh * ow), dtype=np.result_type(x, w))

    def channels(lo: int, hi: int) -> None:
        for image in range(n):
            cols = np.ascontiguousarray(windows[image, lo:hi]).reshape(hi - lo, kh * kw, oh * ow)
            block = out[image, lo * mult:hi * mult].reshape(hi - lo, mult, oh * ow)
            np.matmul(taps[lo:hi], cols, out=block)
            if post is not None:
                post(out[image, lo * mult:hi * mult], image, lo * mult, hi * mult)

    for_blocks(c, channels, n * c * mult * kh * kw * oh * ow)
    return out.reshape(n, c * mult, oh, ow)


def conv_direct(x: np.ndarray, w: np.ndarray, g: ConvGeometry, post: Post | None = None) -> np.ndarray:
    """Accumulate one GEMM per filter tap (no im2col buffer). Returns (N, M, oH, oW)."""
    n, c = x.shape[:2]
    m = w.shape[0]
    groups = g.group
    cg, mg = c // groups, m // groups
    oh, ow = g.out
    xp = pad_input(x, g)
    (sh, sw), (dh, dw) = g.strides, g.dilations
    wt = w.reshape(groups, mg, cg, *g.kernel)
    out = np.zeros((n, groups, mg, oh * ow), dtype=np.result_type(x, w))
    for i in range(g.kernel[0]):
        for j in range(g.kernel[1]):
            xs = xp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            cols = np.ascontiguousarray(xs).reshape(n, groups, cg, oh * ow)
            out += np.matmul(np.ascontiguousarray(wt[:, :, :, i, j]), cols)
    return _finish(out.reshape(n, m, oh, ow), post)


def _finish(y: np.ndarray, post: Post | None) -> np.ndarray:
    if post is not None:
        for image in range(y.shape[0]):
            post(y[image], image, 0, y.shape[1])
    return y
