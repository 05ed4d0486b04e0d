"""Type lowerings: Constant, Cast, CastLike, BitCast, and the quantization ops."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
from onnx_ir import DataType

from hybrid.backends.torch.lowering import ALL, lowering, torch_dtype

_FLOAT8_NUMPY = {
    torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn, torch.float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
    torch.float8_e5m2: ml_dtypes.float8_e5m2, torch.float8_e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
}


def _no_string(node):
    if any(a in node.attributes for a in ("value_string", "value_strings", "sparse_value")):
        return "string and sparse constants have no torch form"
    return None


@lowering("Constant", dtypes=ALL, check=_no_string)
def constant(*, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None):
    """ONNX Constant from its tensor ``value`` or one of the float/int (list) attributes; strings are refused."""
    if value is not None:
        return value
    if value_float is not None:
        return torch.tensor(value_float, dtype=torch.float32)
    if value_floats is not None:
        return torch.tensor(value_floats, dtype=torch.float32)
    if value_int is not None:
        return torch.tensor(value_int, dtype=torch.int64)
    return torch.tensor(value_ints, dtype=torch.int64)


def _to_float8(x: torch.Tensor, dtype: torch.dtype, saturate: bool) -> torch.Tensor:
    # torch's float8 conversions saturate for some formats and not others; ml_dtypes follows the
    # ONNX tables exactly (saturate: clip to the finite range first, NaN stays NaN)
    target = _FLOAT8_NUMPY[dtype]
    host = x.detach().to("cpu", torch.float32).numpy()
    if saturate:
        info = ml_dtypes.finfo(target)
        host = np.clip(host, float(info.min), float(info.max))
    out = torch.from_numpy(host.astype(target).view(np.uint8)).view(dtype)
    return out.to(x.device)


def cast_to(x: torch.Tensor, dtype: torch.dtype, saturate: int = 1) -> torch.Tensor:
    """ONNX Cast semantics on torch tensors."""
    if x.dtype == dtype:
        return x
    if dtype in _FLOAT8_NUMPY:
        return _to_float8(x, dtype, bool(saturate))
    if x.dtype in _FLOAT8_NUMPY:
        x = x.to(torch.float32)
    return x.to(dtype)


def _cast_check(node):
    to = node.attributes.get("to")
    if to is not None:
        try:
            torch_dtype(to.value)
        except KeyError:
            return f"Cast to {DataType(to.value).name} has no torch dtype"
    return None


@lowering("Cast", dtypes=ALL, check=_cast_check)
def cast(x, *, to, saturate=1, round_mode="up"):
    """ONNX Cast to ``to``; float8 targets follow the ONNX saturation tables (see :func:`cast_to`)."""
    return cast_to(x, torch_dtype(to), saturate)


@lowering("CastLike", dtypes=ALL)
def cast_like(x, like, *, saturate=1, round_mode="up"):
    """ONNX CastLike: Cast to the dtype of ``like``."""
    return cast_to(x, like.dtype, saturate)


@lowering("BitCast", dtypes=ALL, check=_cast_check)
def bit_cast(x, *, to):
    """ONNX BitCast: reinterprets the bytes of ``x`` as dtype ``to``, with no conversion."""
    return x.view(torch_dtype(to))


# ------------------------------------------------------------------ quantization
_QTYPES = ALL


def _broadcast_param(p, x, axis, block_size):
    """Scale or zero point shaped to broadcast against ``x`` (per-tensor, per-axis or blocked)."""
    if p.dim() == 0 or (p.numel() == 1 and block_size == 0):
        return p.reshape(())
    axis = axis + x.dim() if axis < 0 else axis
    if block_size:
        return p.repeat_interleave(block_size, dim=axis).narrow(axis, 0, x.shape[axis])
    shape = [1] * x.dim()
    shape[axis] = -1
    return p.reshape(shape)


def _int_range(dtype):
    info = torch.iinfo(dtype)
    return info.min, info.max


@lowering("QuantizeLinear", dtypes=_QTYPES)
def quantize_linear(x, scale, zero_point=None, *, axis=1, saturate=1, block_size=0, output_dtype=0,
                    precision=0):
    """ONNX QuantizeLinear: ``round(x / scale) + zero_point``, saturated to the output integer type.

    Scale and zero point are per tensor, per ``axis`` or per block; the output type is the zero point's,
    else ``output_dtype``, else uint8. Float8 outputs are cast rather than rounded.
    """
    if zero_point is not None:
        out_dtype = zero_point.dtype
    elif output_dtype:
        out_dtype = torch_dtype(output_dtype)
    else:
        out_dtype = torch.uint8
    s = _broadcast_param(scale, x, axis, block_size)
    work = x.to(torch.float32) if x.dtype != torch.float64 else x
    y = work / s.to(work.dtype)
    if out_dtype in _FLOAT8_NUMPY:
        if zero_point is not None:
            y = y + _broadcast_param(zero_point, x, axis, block_size).to(y.dtype)
        return cast_to(y, out_dtype, saturate)
    y = torch.round(y)
    if zero_point is not None:
        y = y + _broadcast_param(zero_point, x, axis, block_size).to(y.dtype)
    lo, hi = _int_range(out_dtype)
    return torch.clamp(y, lo, hi).to(out_dtype)


@lowering("DequantizeLinear", dtypes=_QTYPES)
def dequantize_linear(x, scale, zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    """ONNX DequantizeLinear: ``(x - zero_point) * scale`` in float32, returned in ``output_dtype`` or the scale's."""
    out_dtype = torch_dtype(output_dtype) if output_dtype else scale.dtype
    work = x.to(torch.float32)
    if zero_point is not None:
        work = work - _broadcast_param(zero_point, x, axis, block_size).to(torch.float32)
    s = _broadcast_param(scale, x, axis, block_size)
    return (work * s.to(torch.float32)).to(out_dtype)


@lowering("DynamicQuantizeLinear", dtypes=_QTYPES)
def dynamic_quantize_linear(x):
    """ONNX DynamicQuantizeLinear: uint8 ``x`` with the scale and zero point of its range (widened to hold 0)."""
    hi = torch.clamp(x.max(), min=0).to(torch.float32)
    lo = torch.clamp(x.min(), max=0).to(torch.float32)
    scale = torch.where(hi == lo, torch.ones_like(hi), hi - lo) / 255.0
    zp = torch.round(torch.clamp(0.0 - lo / scale, 0, 255))
    y = torch.clamp(torch.round(x.to(torch.float32) / scale) + zp, 0, 255)
    return y.to(torch.uint8), scale.to(x.dtype), zp.to(torch.uint8)


def _centered(x, zp):
    out = x.to(torch.int32)
    if zp is not None:
        out = out - zp.to(torch.int32)
    return out


def _int_matmul(a, b):
    # exact for int8 operands with the reduction sizes ONNX models use (well below 2**53 / 2**14)
    return torch.matmul(a.to(torch.float64), b.to(torch.float64)).round().to(torch.int32)


@lowering("MatMulInteger", dtypes=_QTYPES)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """ONNX MatMulInteger: the int32 product of ``a`` and ``b`` after their zero points are subtracted."""
    azp = a_zero_point
    bzp = b_zero_point
    if azp is not None and azp.dim() == 1 and azp.numel() > 1:
        azp = azp.reshape(-1, 1)
    return _int_matmul(_centered(a, azp), _centered(b, bzp))


@lowering("QLinearMatMul", dtypes=_QTYPES)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """ONNX QLinearMatMul: the integer product scaled by ``a_scale * b_scale / y_scale`` and requantized for ``y``."""
    c = _int_matmul(_centered(a, a_zero_point), _centered(b, b_zero_point)).to(torch.float64)
    d = c * (a_scale.to(torch.float64) * b_scale.to(torch.float64) / y_scale.to(torch.float64))
    out_dtype = y_zero_point.dtype if y_zero_point is not None else a.dtype
    if y_zero_point is not None:
        d = d + y_zero_point.to(torch.float64)
    lo, hi = _int_range(out_dtype)
    return torch.clamp(torch.round(d), lo, hi).to(out_dtype)

