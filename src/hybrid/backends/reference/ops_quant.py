"""Casts and quantization.

Cast, CastLike, QuantizeLinear, DequantizeLinear, QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger.

Exotic types (bfloat16, the float8 variants, int4/uint4, float4) are ml_dtypes types, as
``onnx.numpy_helper`` returns them. Integer products run as float64 BLAS GEMMs: every product and
partial sum of 8-bit (or 16-bit) operands is an integer far below 2**53, so the result is exact.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto
from onnx.helper import np_dtype_to_tensor_dtype, tensor_dtype_to_np_dtype

from hybrid.backends.reference.ops_conv import ConvKernel
from hybrid.backends.reference.registry import NodeContext, kernel, prepared

__all__: list[str] = []

_FLOAT8 = {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
           TensorProto.FLOAT8E5M2FNUZ}
_E8M0 = getattr(TensorProto, "FLOAT8E8M0", -1)
_SMALL_FLOATS = {getattr(TensorProto, n) for n in ("FLOAT4E2M1", "FLOAT6E2M3", "FLOAT6E3M2") if hasattr(TensorProto, n)}
_INT_RANGES = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127), TensorProto.UINT16: (0, 65535),
               TensorProto.INT16: (-32768, 32767), TensorProto.UINT4: (0, 15), TensorProto.INT4: (-8, 7)}
for _name, _range in (("UINT2", (0, 3)), ("INT2", (-2, 1))):
    if hasattr(TensorProto, _name):
        _INT_RANGES[getattr(TensorProto, _name)] = _range


def _cast(x: np.ndarray, to: int, saturate: bool, round_mode: str = "up") -> np.ndarray:
    if to == TensorProto.STRING:
        return x.astype(np.str_)
    dtype = tensor_dtype_to_np_dtype(to)
    if to == _E8M0:
        from onnx.numpy_helper import to_float8e8m0

        return to_float8e8m0(x, saturate, round_mode).astype(dtype)
    if to in _FLOAT8 and saturate:
        info = ml_dtypes.finfo(dtype)
        return np.clip(x, info.min, info.max).astype(dtype)  # NaN stays NaN, +-inf saturate
    return x.astype(dtype)


@kernel("Cast", since=6)
def _cast_op(x, *, to, saturate=1, round_mode="up"):
    return (_cast(x, to, bool(saturate), round_mode),)


@kernel("CastLike", since=15)
def _cast_like(x, like, *, saturate=1, round_mode="up"):
    return (_cast(x, np_dtype_to_tensor_dtype(like.dtype), bool(saturate), round_mode),)


def _per_axis(value: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int = 0) -> np.ndarray:
    """Broadcast a scale or zero point: scalar, per-axis (1-D) or blocked along ``axis``."""
    if value.ndim == 0:
        return value
    if value.size == 1:
        return value.reshape(())
    axis = axis % len(shape)
    if not block_size:
        if value.ndim != 1 or value.shape[0] != shape[axis]:
            raise ValueError(f"expected a scalar or {shape[axis]} values along axis {axis}, got shape "
                             f"{list(value.shape)}")
        dims = [1] * len(shape)
        dims[axis] = value.size
        return value.reshape(dims)
    full = np.repeat(value, block_size, axis=axis)
    full = full.take(range(shape[axis]), axis=axis)
    if full.shape != tuple(shape):
        raise ValueError(f"blocked quantization: scale shape {list(value.shape)} does not match input "
                         f"{list(shape)} with block_size {block_size} on axis {axis}")
    return full


@kernel("QuantizeLinear", since=10)
def _quantize(x, scale, zero_point=None, *, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0):
    to = output_dtype or TensorProto.UINT8
    if zero_point is not None:
        to = np_dtype_to_tensor_dtype(zero_point.dtype)
        zero_point = _per_axis(zero_point, x.shape, axis, block_size)
    scale = _per_axis(scale, x.shape, axis, block_size)
    if precision:
        wide = tensor_dtype_to_np_dtype(precision)
        q = x.astype(wide) / scale.astype(wide)
    else:
        q = x / scale
    if to in _INT_RANGES:
        qi = np.rint(q).astype(np.int32)  # round half to even
        if zero_point is not None:
            qi += zero_point.astype(np.int32)
        lo, hi = _INT_RANGES[to]
        return (np.clip(qi, lo, hi).astype(tensor_dtype_to_np_dtype(to)),)
    if to in _FLOAT8:
        return (_cast(q, to, bool(saturate)),)
    if to in _SMALL_FLOATS:
        if zero_point is not None:
            q = q + zero_point
        return (q.astype(tensor_dtype_to_np_dtype(to)),)
    raise ValueError(f"QuantizeLinear: output type {TensorProto.DataType.Name(to)} is not a quantized type")


@kernel("DequantizeLinear", since=10)
def _dequantize(x, scale, zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    to = np_dtype_to_tensor_dtype(x.dtype)
    dx = x.astype(np.float32)
    if zero_point is not None and to not in _FLOAT8 and to not in _SMALL_FLOATS:
        if zero_point.dtype != x.dtype:
            raise ValueError(f"zero point type {zero_point.dtype} differs from input type {x.dtype}")
        dx = dx - _per_axis(zero_point, x.shape, axis, block_size)
    y = dx * _per_axis(scale, x.shape, axis, block_size)
    return (y.astype(tensor_dtype_to_np_dtype(output_dtype) if output_dtype else scale.dtype),)


# ------------------------------------------------------------------ integer GEMM and conv
def _exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.rint(np.matmul(a.astype(np.float64), b.astype(np.float64))).astype(np.int32)


@kernel("MatMulInteger", since=10)
def _matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    a32 = a.astype(np.int32)
    if a_zero_point is not None:
        a32 = a32 - (a_zero_point.reshape(-1, 1) if a_zero_point.ndim == 1 and a_zero_point.size > 1
                     else a_zero_point.astype(np.int32))
    b32 = b.astype(np.int32)
    if b_zero_point is not None:
        b32 = b32 - b_zero_point.astype(np.int32)
    return (_exact_matmul(a32, b32),)


@kernel("QLinearMatMul", since=10)
def _qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    a32 = a.astype(np.int32) - (0 if a_zero_point is None else a_zero_point.astype(np.int32))
    b32 = b.astype(np.int32) - (0 if b_zero_point is None else b_zero_point.astype(np.int32))
    d = _exact_matmul(a32, b32) * (a_scale * b_scale / y_scale)
    dtype = a.dtype if y_zero_point is None else y_zero_point.dtype
    if y_zero_point is not None:
        d += y_zero_point
    info = np.iinfo(dtype)
    return (np.clip(np.rint(d), info.min, info.max).astype(dtype),)


_CONV_ATTRS = {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}


def _zero_shifted_weights(w: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    w32 = w.astype(np.int32)
    if zero_point is None:
        return w32
    zp = zero_point.astype(np.int32)
    if zp.ndim == 1 and zp.size == w.shape[0] and zp.size > 1:
        return w32 - zp.reshape(-1, *([1] * (w.ndim - 1)))
    return w32 - zp.reshape(())


@prepared("ConvInteger", since=10)
def _conv_integer(ctx: NodeContext):
    if set(ctx.attrs) - _CONV_ATTRS:
        return None
    conv = ConvKernel(dict(ctx.attrs), None, None, ctx.options.get("conv_algorithm", "auto"))

    def run(x, w, x_zero_point=None, w_zero_point=None):
        if x.ndim < 3:
            raise ValueError(f"expected X of rank >= 3, got shape {list(x.shape)}")
        xf = x.astype(np.float64) - (0 if x_zero_point is None else x_zero_point.astype(np.float64))
        wf = _zero_shifted_weights(w, w_zero_point).astype(np.float64)
        return (np.rint(conv(xf, wf)[0]).astype(np.int32),)

    return run


@prepared("QLinearConv", since=10)
def _qlinear_conv(ctx: NodeContext):
    if set(ctx.attrs) - _CONV_ATTRS:
        return None
    conv = ConvKernel(dict(ctx.attrs), None, None, ctx.options.get("conv_algorithm", "auto"))

    def run(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, bias=None):
        xf = x.astype(np.float64) - (0 if x_zero_point is None else x_zero_point.astype(np.float64))
        wf = _zero_shifted_weights(w, w_zero_point).astype(np.float64)
        acc = np.rint(conv(xf, wf)[0]).astype(np.int32)
        if bias is not None:
            acc += bias.astype(np.int32).reshape(-1, *([1] * (acc.ndim - 2)))
        if np.size(w_scale) > 1:
            if np.ndim(w_scale) != 1 or np.size(w_scale) != w.shape[0]:
                raise ValueError(f"w_scale must be a scalar or one value per output channel ({w.shape[0]}), "
                                 f"got shape {list(np.shape(w_scale))}")
            w_scale = w_scale.reshape(1, -1, *([1] * (acc.ndim - 2)))
        r = acc * (x_scale * w_scale / y_scale)
        dtype = x.dtype if y_zero_point is None else y_zero_point.dtype
        if y_zero_point is not None:
            r += y_zero_point
        info = np.iinfo(dtype)
        return (np.round(np.clip(r, info.min, info.max)).astype(dtype),)

    return run
