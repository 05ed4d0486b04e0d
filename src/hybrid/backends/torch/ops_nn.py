"""Neural-network lowerings: convolution, pooling, normalization, dropout."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from onnx_ir import DataType

from hybrid.backends.torch.lowering import COMMON, FLOATS, lowering

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _spatial_rank(node) -> str | None:
    for v in node.inputs[:1]:
        if v is not None and v.shape is not None and not 3 <= len(v.shape) <= 5:
            return f"{node.op_type} over {len(v.shape) - 2} spatial dims (torch handles 1 to 3)"
    return None


def _same_pads(sizes, kernel, strides, dilations, auto_pad) -> tuple[list[int], list[int]]:
    begin, end = [], []
    for n, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-n // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
        small = total // 2
        if auto_pad == "SAME_UPPER":
            begin.append(small)
            end.append(total - small)
        else:
            begin.append(total - small)
            end.append(small)
    return begin, end


def _pads(sizes, kernel, strides, dilations, auto_pad, pads) -> tuple[list[int], list[int]]:
    nd = len(sizes)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return _same_pads(sizes, kernel, strides, dilations, auto_pad)
    if auto_pad == "VALID" or not pads:
        return [0] * nd, [0] * nd
    return list(pads[:nd]), list(pads[nd:])


def _torch_pad(begin: list[int], end: list[int]) -> list[int]:
    out: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        out += [b, e]
    return out


# ------------------------------------------------------------------ convolution
@lowering("Conv", dtypes=FLOATS, check=_spatial_rank)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
         strides=None):
    """ONNX Conv over 1 to 3 spatial dims; uneven (or SAME) pads go through ``F.pad`` first, as torch pads evenly."""
    nd = x.dim() - 2
    kernel = list(w.shape[2:])
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    begin, end = _pads(list(x.shape[2:]), kernel, strides, dilations, auto_pad, pads)
    if begin != end:
        x = F.pad(x, _torch_pad(begin, end))
        begin = [0] * nd
    return _CONV[nd](x, w, b, strides, begin, dilations, group)


@lowering("ConvTranspose", dtypes=FLOATS, check=_spatial_rank)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    """ONNX ConvTranspose: the full transposed convolution, then the pads cropped and ``output_padding`` appended.

    With ``output_shape`` (or SAME auto-padding and no ``pads``) the pads are derived from the target size.
    """
    nd = x.dim() - 2
    kernel = list(w.shape[2:])
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    output_padding = output_padding or [0] * nd
    sizes = list(x.shape[2:])
    full = [s * (n - 1) + (k - 1) * d + 1 for n, k, s, d in zip(sizes, kernel, strides, dilations)]
    if output_shape is not None or (auto_pad in ("SAME_UPPER", "SAME_LOWER") and not pads):
        target = list(output_shape[-nd:]) if output_shape is not None else [n * s for n, s in zip(sizes, strides)]
        total = [f + op - t for f, op, t in zip(full, output_padding, target)]
        if auto_pad == "SAME_UPPER":
            begin, end = [t // 2 for t in total], [t - t // 2 for t in total]
        else:
            begin, end = [t - t // 2 for t in total], [t // 2 for t in total]
    elif pads:
        begin, end = list(pads[:nd]), list(pads[nd:])
    else:
        begin, end = [0] * nd, [0] * nd
    y = _CONV_T[nd](x, w, None, strides, 0, 0, group, dilations)
    # crop the pads (F.pad with negative amounts) and append output_padding
    y = F.pad(y, _torch_pad([-p for p in begin], [op - p for op, p in zip(output_padding, end)]))
    if b is not None:
        y = y + b.reshape([1, -1] + [1] * nd)
    return y


# ------------------------------------------------------------------ pooling
def _pool_geometry(sizes, kernel, strides, dilations, begin, end, ceil_mode):
    """Output sizes and the extra end padding that makes floor-mode pooling give them."""
    outs, extra = [], []
    for n, k, s, d, b, e in zip(sizes, kernel, strides, dilations, begin, end):
        span = (k - 1) * d + 1
        num = n + b + e - span
        out = (-(-num // s) if ceil_mode else num // s) + 1
        if ceil_mode and (out - 1) * s >= n + b:  # the last window must start inside input or left pad
            out -= 1
        outs.append(out)
        extra.append(max(0, (out - 1) * s + span - (n + b + e)))
    return outs, extra


def _float_work(x):
    if x.is_floating_point():
        return x
    return x.to(torch.float64)


@lowering("MaxPool", dtypes=COMMON - {DataType.BOOL}, check=_spatial_rank,
          n_outputs=True)
def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None, storage_order=0,
             strides=None, n_outputs=1):
    """ONNX MaxPool, with the optional second output of ONNX-layout indices.

    Pads torch cannot express (uneven, or wider than half the window) are applied up front as ``-inf``.
    """
    nd = x.dim() - 2
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    sizes = list(x.shape[2:])
    begin, end = _pads(sizes, kernel_shape, strides, dilations, auto_pad, pads)
    work = _float_work(x)
    want_idx = n_outputs > 1
    simple = begin == end and all(2 * p <= (k - 1) * d + 1 for p, k, d in zip(begin, kernel_shape, dilations))
    if simple:
        res = _MAX_POOL[nd](work, kernel_shape, strides, begin, dilations, bool(ceil_mode), want_idx)
        padded_sizes, offset = sizes, [0] * nd
    else:
        _, extra = _pool_geometry(sizes, kernel_shape, strides, dilations, begin, end, ceil_mode)
        ends = [e + x_ for e, x_ in zip(end, extra)]
        work = F.pad(work, _torch_pad(begin, ends), value=-math.inf)
        res = _MAX_POOL[nd](work, kernel_shape, strides, 0, dilations, False, want_idx)
        padded_sizes, offset = list(work.shape[2:]), begin
    y, idx = (res if want_idx else (res, None))
    y = y.to(x.dtype)
    if not want_idx:
        return y
    return y, _onnx_pool_indices(idx, x.shape, padded_sizes, offset, storage_order)


def _onnx_pool_indices(idx, shape, padded_sizes, offset, storage_order):
    """Convert torch's max-pool indices to the ONNX layout.

    torch gives indices into each (n, c) plane of the padded input; ONNX wants them into the whole
    unpadded tensor, row- or column-major.
    """
    nd = len(padded_sizes)
    coords = []
    rest = idx
    for size in reversed(padded_sizes):
        coords.append(rest % size)
        rest = rest // size
    coords = [c - o for c, o in zip(reversed(coords), offset)]
    sizes = list(shape[2:])
    flat = torch.zeros_like(idx)
    order = range(nd) if not storage_order else reversed(range(nd))
    for i in order:
        flat = flat * sizes[i] + coords[i]
    n, c = shape[0], shape[1]
    plane = math.prod(sizes)
    base = (torch.arange(n, device=idx.device).reshape(n, 1) * c
            + torch.arange(c, device=idx.device).reshape(1, c)).reshape([n, c] + [1] * nd)
    return flat + base * plane


def _window_sum(x, kernel, strides, dilations):
    """Sum over pooling windows of an already padded input, as a depthwise convolution with ones."""
    nd = x.dim() - 2
    ch = x.shape[1]
    ones = torch.ones([ch, 1, *kernel], dtype=x.dtype, device=x.device)
    return _CONV[nd](x, ones, None, strides, 0, dilations, ch)


@lowering("AveragePool", dtypes=FLOATS, check=_spatial_rank)
def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape,
                 pads=None, strides=None):
    """ONNX AveragePool; what ``F.avg_pool`` cannot express is a window sum divided by a window count.

    That covers dilation, uneven or wide pads and ``ceil_mode``; ``count_include_pad`` picks the cells counted.
    """
    nd = x.dim() - 2
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    sizes = list(x.shape[2:])
    begin, end = _pads(sizes, kernel_shape, strides, dilations, auto_pad, pads)
    plain = all(d == 1 for d in dilations) and begin == end and all(2 * p <= k for p, k in zip(begin, kernel_shape))
    if plain and not ceil_mode:
        return _AVG_POOL[nd](x, kernel_shape, strides, begin, False, bool(count_include_pad))
    _, extra = _pool_geometry(sizes, kernel_shape, strides, dilations, begin, end, ceil_mode)
    ends = [e + x_ for e, x_ in zip(end, extra)]
    summed = _window_sum(F.pad(x, _torch_pad(begin, ends)), kernel_shape, strides, dilations)
    mask = torch.ones([1, 1, *sizes], dtype=x.dtype, device=x.device)
    if count_include_pad:
        mask = F.pad(mask, _torch_pad(begin, end), value=1.0)
        mask = F.pad(mask, _torch_pad([0] * nd, extra))
    else:
        mask = F.pad(mask, _torch_pad(begin, ends))
    counts = _window_sum(mask, kernel_shape, strides, dilations)
    return summed / counts


@lowering("LpPool", dtypes=FLOATS, check=_spatial_rank)
def lp_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, p=2, pads=None, strides=None):
    """ONNX LpPool: ``(sum |x|^p)^(1/p)`` over each window, as a window sum of the padded powers."""
    nd = x.dim() - 2
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    sizes = list(x.shape[2:])
    begin, end = _pads(sizes, kernel_shape, strides, dilations, auto_pad, pads)
    _, extra = _pool_geometry(sizes, kernel_shape, strides, dilations, begin, end, ceil_mode)
    ends = [e + x_ for e, x_ in zip(end, extra)]
    powered = F.pad(x.abs() ** p, _torch_pad(begin, ends))
    return _window_sum(powered, kernel_shape, strides, dilations) ** (1.0 / p)


@lowering("GlobalAveragePool", dtypes=FLOATS)
def global_average_pool(x):
    """ONNX GlobalAveragePool: the mean over all spatial dims, which are kept as size 1."""
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@lowering("GlobalMaxPool", dtypes=FLOATS)
def global_max_pool(x):
    """ONNX GlobalMaxPool: the max over all spatial dims, which are kept as size 1."""
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@lowering("GlobalLpPool", dtypes=FLOATS)
def global_lp_pool(x, *, p=2):
    """ONNX GlobalLpPool: the p-norm over all spatial dims, which are kept as size 1."""
    return (x.abs() ** p).sum(dim=tuple(range(2, x.dim())), keepdim=True) ** (1.0 / p)


@lowering("MaxUnpool", host_inputs=(2,), dtypes=FLOATS | {DataType.INT64})
def max_unpool(x, indices, output_shape=None, *, kernel_shape, pads=None, strides=None):
    """ONNX MaxUnpool: scatters ``x`` into zeros at ``indices``, sized by ``output_shape`` or the pool attributes."""
    nd = x.dim() - 2
    strides = strides or kernel_shape
    pads = pads or [0] * (2 * nd)
    if output_shape is not None:
        out = [int(v) for v in (output_shape.tolist() if isinstance(output_shape, torch.Tensor)
                                else output_shape)]
    else:
        out = list(x.shape[:2]) + [(n - 1) * s - pads[i] - pads[i + nd] + k for i, (n, s, k) in
                                   enumerate(zip(x.shape[2:], strides, kernel_shape))]
    y = torch.zeros(out, dtype=x.dtype, device=x.device).reshape(-1)
    y[indices.reshape(-1).to(torch.int64)] = x.reshape(-1)
    return y.reshape(out)


# ------------------------------------------------------------------ normalization
@lowering("BatchNormalization", dtypes=FLOATS, n_outputs=True)
def batch_norm(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1, is_test=0,
               consumed_inputs=None, training_mode=0, n_outputs=1):
    """ONNX BatchNormalization; training mode normalizes by the batch statistics and can return the running ones."""
    if not training_mode:
        return F.batch_norm(x, mean.to(x.dtype), var.to(x.dtype), scale, bias, False, 0.0, epsilon)
    dims = [0, *range(2, x.dim())]
    batch_mean = x.mean(dim=dims)
    batch_var = x.var(dim=dims, unbiased=False)
    shape = [1, -1] + [1] * (x.dim() - 2)
    y = (x - batch_mean.reshape(shape)) / torch.sqrt(batch_var.reshape(shape) + epsilon)
    y = y * scale.reshape(shape) + bias.reshape(shape)
    running_mean = mean * momentum + batch_mean * (1 - momentum)
    running_var = var * momentum + batch_var * (1 - momentum)
    return y if n_outputs == 1 else (y, running_mean.to(mean.dtype), running_var.to(var.dtype))[:n_outputs]


@lowering("InstanceNormalization", dtypes=FLOATS)
def instance_norm(x, scale, bias, *, epsilon=1e-5):
    """ONNX InstanceNormalization: per-sample, per-channel normalization with ``scale`` and ``bias``."""
    return F.instance_norm(x, weight=scale, bias=bias, eps=epsilon)


def _stash(x, stash_type):
    return x.to(torch.float32) if stash_type == 1 and x.dtype in (torch.float16, torch.bfloat16) else x


@lowering("LayerNormalization", dtypes=FLOATS, n_outputs=True)
def layer_norm(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, n_outputs=1):
    """ONNX LayerNormalization over the dims from ``axis`` on; optional outputs are the mean and inverse std.

    ``stash_type=1`` computes the statistics of float16/bfloat16 inputs in float32.
    """
    axis = axis + x.dim() if axis < 0 else axis
    dims = tuple(range(axis, x.dim()))
    xs = _stash(x, stash_type)
    mean = xs.mean(dim=dims, keepdim=True)
    diff = xs - mean
    var = (diff * diff).mean(dim=dims, keepdim=True)
    inv = 1.0 / torch.sqrt(var + epsilon)
    y = (diff * inv).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y if n_outputs == 1 else (y, mean, inv)[:n_outputs]


@lowering("RMSNormalization", dtypes=FLOATS)
def rms_norm(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """ONNX RMSNormalization: ``x / sqrt(mean(x^2) + epsilon) * scale`` over the dims from ``axis`` on."""
    axis = axis + x.dim() if axis < 0 else axis
    dims = tuple(range(axis, x.dim()))
    xs = _stash(x, stash_type)
    rms = torch.sqrt((xs * xs).mean(dim=dims, keepdim=True) + epsilon)
    return (xs / rms).to(x.dtype) * scale


@lowering("GroupNormalization", since=18, dtypes=FLOATS)
def group_norm_18(x, scale, bias, *, epsilon=1e-5, num_groups):
    """ONNX GroupNormalization at opset 18: ``scale`` and ``bias`` are per group."""
    n, _c = x.shape[:2]
    grouped = x.reshape(n, num_groups, -1)
    mean = grouped.mean(dim=-1, keepdim=True)
    var = grouped.var(dim=-1, unbiased=False, keepdim=True)
    normed = (grouped - mean) / torch.sqrt(var + epsilon)
    normed = normed * scale.reshape(1, -1, 1) + bias.reshape(1, -1, 1)
    return normed.reshape(x.shape)


@lowering("GroupNormalization", since=21, dtypes=FLOATS)
def group_norm(x, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    """ONNX GroupNormalization from opset 21: ``scale`` and ``bias`` per channel, ``stash_type`` as in LayerNorm."""
    n, c = x.shape[:2]
    grouped = _stash(x, stash_type).reshape(n, num_groups, -1)
    mean = grouped.mean(dim=-1, keepdim=True)
    var = grouped.var(dim=-1, unbiased=False, keepdim=True)
    normed = ((grouped - mean) / torch.sqrt(var + epsilon)).to(x.dtype).reshape(x.shape)
    shape = [1, c] + [1] * (x.dim() - 2)
    return normed * scale.reshape(shape) + bias.reshape(shape)


@lowering("LRN", dtypes=FLOATS)
def lrn(x, *, alpha=1e-4, beta=0.75, bias=1.0, size):
    """ONNX LRN: local response normalization across ``size`` neighbouring channels."""
    return F.local_response_norm(x, size, alpha, beta, bias)


@lowering("LpNormalization", dtypes=FLOATS)
def lp_normalization(x, *, axis=-1, p=2):
    """ONNX LpNormalization: ``x`` divided by its L1 or L2 norm along ``axis``, 0 where the norm is 0."""
    norm = x.abs().sum(dim=axis, keepdim=True) if p == 1 else torch.sqrt((x * x).sum(dim=axis, keepdim=True))
    return torch.where(norm == 0, torch.zeros((), dtype=x.dtype, device=x.device), x / norm)


@lowering("MeanVarianceNormalization", dtypes=FLOATS)
def mean_variance_normalization(x, *, axes=(0, 2, 3)):
    """ONNX MeanVarianceNormalization: ``(x - mean) / (std + 1e-9)`` over ``axes``."""
    dims = tuple(axes)
    mean = x.mean(dim=dims, keepdim=True)
    var = (x * x).mean(dim=dims, keepdim=True) - mean * mean
    return (x - mean) / (torch.sqrt(var) + 1e-9)


# ------------------------------------------------------------------ dropout (inference)
@lowering("Dropout", dtypes=FLOATS | {DataType.BOOL}, n_outputs=True)
def dropout_attrs(x, *, ratio=0.5, is_test=0, seed=None, consumed_inputs=None, n_outputs=1):
    """ONNX Dropout before opset 12: inference only, so ``x`` passes through and the mask is all true."""
    if n_outputs == 1:
        return x
    return x, torch.ones_like(x, dtype=torch.bool)


@lowering("Dropout", since=12, dtypes=FLOATS | {DataType.BOOL}, n_outputs=True,
          foldable=False)
def dropout(x, ratio=None, training_mode=None, *, seed=None, n_outputs=1):
    """ONNX Dropout from opset 12: a random mask scaled by ``1 / (1 - ratio)`` in training mode, else ``x`` as is."""
    training = training_mode is not None and bool(training_mode)
    p = 0.5 if ratio is None else float(ratio)
    if training and p > 0:
        mask = torch.rand(x.shape, device=x.device) >= p
        y = torch.where(mask, x / (1 - p), torch.zeros((), dtype=x.dtype, device=x.device))
    else:
        y, mask = x, torch.ones_like(x, dtype=torch.bool)
    return y if n_outputs == 1 else (y, mask)
