"""Element-wise lowerings: math, activations, comparisons, logic and bit operations."""

from __future__ import annotations

from functools import reduce

import torch
import torch.nn.functional as F
from onnx_ir import DataType

from hybrid.backends.torch.lowering import COMMON, FLOATS, INTS, WIDE_UINTS, lowering

DT_BOOL = frozenset({DataType.BOOL})
NUMERIC = COMMON - DT_BOOL
WIDE = NUMERIC | WIDE_UINTS
_NARROW_UINTS = {torch.uint16: 16, torch.uint32: 32}
_SIGN = -(1 << 63)


def _no_uint64(node):
    for v in node.inputs:
        if v is not None and v.dtype == DataType.UINT64:
            return f"{node.op_type} on uint64 has no exact torch form"
    return None


def _widened(fn, ordered: bool):
    """Run ``fn`` on uint16/32/64 tensors, which torch stores but has few kernels for.

    uint16/32 compute in int64 and wrap back to their width; uint64 is reinterpreted as int64, which
    is exact for wrapping arithmetic and bit operations, and, with the sign bit flipped, for order.
    """

    def run(a, b):
        bits = _NARROW_UINTS.get(a.dtype)
        if bits is not None:
            out = fn(a.to(torch.int64), b.to(torch.int64))
            return out if out.dtype == torch.bool else torch.bitwise_and(out, (1 << bits) - 1).to(a.dtype)
        if a.dtype == torch.uint64:
            ai, bi = a.view(torch.int64), b.view(torch.int64)
            if ordered:
                ai, bi = torch.bitwise_xor(ai, _SIGN), torch.bitwise_xor(bi, _SIGN)
            out = fn(ai, bi)
            if out.dtype == torch.bool:
                return out
            return (torch.bitwise_xor(out, _SIGN) if ordered else out).view(torch.uint64)
        return fn(a, b)

    return run

# ------------------------------------------------------------------ unary math
_UNARY = {
    "Abs": torch.abs, "Neg": torch.neg, "Floor": torch.floor, "Ceil": torch.ceil, "Round": torch.round,
    "Sqrt": torch.sqrt, "Reciprocal": torch.reciprocal, "Exp": torch.exp, "Log": torch.log,
    "Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan, "Asin": torch.asin, "Acos": torch.acos,
    "Atan": torch.atan, "Sinh": torch.sinh, "Cosh": torch.cosh, "Asinh": torch.asinh,
    "Acosh": torch.acosh, "Atanh": torch.atanh, "Tanh": torch.tanh, "Sigmoid": torch.sigmoid,
    "Erf": torch.erf, "Sign": torch.sign, "Relu": torch.relu, "Softsign": F.softsign,
}


def _make_unary(fn):
    def unary(x):
        return fn(x)

    unary.__name__ = unary.__qualname__ = f"onnx_{fn.__name__}"
    return unary


for _name, _fn in _UNARY.items():
    lowering(_name, dtypes=NUMERIC)(_make_unary(_fn))


@lowering("Softplus", dtypes=FLOATS)
def softplus(x):
    """ONNX Softplus: ``log(1 + exp(x))``."""
    return F.softplus(x)


@lowering("Not", dtypes=DT_BOOL)
def logical_not(x):
    """ONNX Not on a bool tensor."""
    return torch.logical_not(x)


@lowering("BitwiseNot", dtypes=INTS | WIDE_UINTS)
def bitwise_not(x):
    """ONNX BitwiseNot; uint16/32 flip their own bits through int64, uint64 through an int64 view."""
    bits = _NARROW_UINTS.get(x.dtype)
    if bits is not None:
        return torch.bitwise_xor(x.to(torch.int64), (1 << bits) - 1).to(x.dtype)
    if x.dtype == torch.uint64:
        return torch.bitwise_not(x.view(torch.int64)).view(torch.uint64)
    return torch.bitwise_not(x)


@lowering("IsNaN", dtypes=FLOATS | DT_BOOL)
def isnan(x):
    """ONNX IsNaN: a bool mask of the NaN elements."""
    return torch.isnan(x)


@lowering("IsInf", dtypes=FLOATS | DT_BOOL)
def isinf(x, *, detect_negative=1, detect_positive=1):
    """ONNX IsInf: a bool mask of the infinities of the signs that ``detect_negative``/``detect_positive`` ask for."""
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_negative:
        return torch.isneginf(x)
    if detect_positive:
        return torch.isposinf(x)
    return torch.zeros_like(x, dtype=torch.bool)


# ------------------------------------------------------------------ activations
@lowering("Elu", dtypes=FLOATS)
def elu(x, *, alpha=1.0):
    """ONNX Elu: ``x`` above 0, ``alpha * (exp(x) - 1)`` below."""
    return F.elu(x, alpha)


@lowering("Selu", dtypes=FLOATS)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    """ONNX Selu: ``gamma * x`` above 0, ``gamma * alpha * (exp(x) - 1)`` below, with the ONNX constants."""
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


@lowering("Celu", dtypes=FLOATS)
def celu(x, *, alpha=1.0):
    """ONNX Celu: ``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    return F.celu(x, alpha)


@lowering("LeakyRelu", dtypes=FLOATS)
def leaky_relu(x, *, alpha=0.01):
    """ONNX LeakyRelu: ``x`` above 0, ``alpha * x`` below."""
    return F.leaky_relu(x, alpha)


@lowering("ThresholdedRelu", dtypes=FLOATS)
def thresholded_relu(x, *, alpha=1.0):
    """ONNX ThresholdedRelu: ``x`` where it is above ``alpha``, 0 elsewhere."""
    return torch.where(x > alpha, x, torch.zeros((), dtype=x.dtype, device=x.device))


@lowering("HardSigmoid", dtypes=FLOATS)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    """ONNX HardSigmoid: ``alpha * x + beta`` clamped to [0, 1]."""
    return torch.clamp(alpha * x + beta, 0, 1)


@lowering("HardSwish", dtypes=FLOATS)
def hard_swish(x):
    """ONNX HardSwish: ``x * clamp(x / 6 + 0.5, 0, 1)``."""
    return x * torch.clamp(x / 6 + 0.5, 0, 1)


@lowering("Mish", dtypes=FLOATS)
def mish(x):
    """ONNX Mish: ``x * tanh(softplus(x))``."""
    return F.mish(x)


@lowering("Swish", dtypes=FLOATS)
def swish(x, *, alpha=1.0):
    """ONNX Swish: ``x * sigmoid(alpha * x)``."""
    return x * torch.sigmoid(alpha * x)


@lowering("Gelu", dtypes=FLOATS)
def gelu(x, *, approximate="none"):
    """ONNX Gelu, exact (``approximate='none'``) or with the tanh approximation."""
    return F.gelu(x, approximate=approximate)


@lowering("SwiGLU", dtypes=FLOATS)
def swiglu(a, b, *, alpha=1.0):
    """SwiGLU: ``a * sigmoid(alpha * a) * b``."""
    return a * torch.sigmoid(alpha * a) * b


@lowering("Shrink", dtypes=NUMERIC)
def shrink(x, *, bias=0.0, lambd=0.5):
    """ONNX Shrink: ``x + bias`` below ``-lambd``, ``x - bias`` above ``lambd``, 0 between; keeps the input dtype."""
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero)).to(x.dtype)


@lowering("PRelu", dtypes=NUMERIC)
def prelu(x, slope):
    """ONNX PRelu: ``x`` where it is not negative, ``x * slope`` (broadcast) where it is."""
    return torch.where(x < 0, x * slope, x).to(x.dtype)


@lowering("Clip", dtypes=NUMERIC)
def clip_attrs(x, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):
    """ONNX Clip before opset 11: the bounds are the ``min``/``max`` attributes."""
    return torch.clamp(x, min, max)


@lowering("Clip", since=11, dtypes=NUMERIC)
def clip(x, lo=None, hi=None):
    """ONNX Clip from opset 11: the optional bounds are inputs, cast to the input's dtype."""
    if lo is not None:
        x = torch.maximum(x, lo.to(x.dtype))
    if hi is not None:
        x = torch.minimum(x, hi.to(x.dtype))
    return x


# ------------------------------------------------------------------ binary arithmetic
_add = _widened(torch.add, False)
_sub = _widened(torch.sub, False)
_mul = _widened(torch.mul, False)
_max = _widened(torch.maximum, True)
_min = _widened(torch.minimum, True)


def _div(a, b):
    if a.is_floating_point():
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # C semantics, as ONNX Runtime and the reference


_div_wide = _widened(_div, True)


@lowering("Add", dtypes=WIDE)
def add(a, b):
    """ONNX Add, wrapping for uint16/32/64 as well."""
    return _add(a, b)


@lowering("Sub", dtypes=WIDE)
def sub(a, b):
    """ONNX Sub, wrapping for uint16/32/64 as well."""
    return _sub(a, b)


@lowering("Mul", dtypes=WIDE)
def mul(a, b):
    """ONNX Mul, wrapping for uint16/32/64 as well."""
    return _mul(a, b)


@lowering("Div", dtypes=WIDE, check=_no_uint64)
def div(a, b):
    """ONNX Div; integers truncate toward zero (C semantics, as ONNX Runtime does)."""
    return _div_wide(a, b)


@lowering("Pow", dtypes=WIDE)
def pow_(a, b):
    """ONNX Pow; the result keeps the base's dtype (wide unsigned exponents go through float64)."""
    if b.dtype in (torch.uint16, torch.uint32, torch.uint64):
        b = b.to(torch.float64)
    return torch.pow(a, b).to(a.dtype)


_fmod = _widened(torch.fmod, True)
_remainder = _widened(torch.remainder, True)


@lowering("Mod", dtypes=WIDE, check=_no_uint64)
def mod(a, b, *, fmod=0):
    """ONNX Mod: ``fmod`` (sign of the dividend) when ``fmod=1``, else Python's remainder (sign of the divisor)."""
    return _fmod(a, b) if fmod else _remainder(a, b)


def _variadic(fn, name):
    def variadic(*xs):
        return reduce(fn, xs)

    variadic.__name__ = variadic.__qualname__ = name
    return variadic


lowering("Max", dtypes=WIDE)(_variadic(_max, "onnx_max"))
lowering("Min", dtypes=WIDE)(_variadic(_min, "onnx_min"))
lowering("Sum", dtypes=WIDE)(_variadic(_add, "onnx_sum"))


@lowering("Mean", dtypes=FLOATS)
def mean(*xs):
    """ONNX Mean: the element-wise mean of the (broadcast) inputs."""
    return reduce(torch.add, xs) / len(xs)


# ------------------------------------------------------------------ comparison and logic
_COMPARE = {"Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt, "LessOrEqual": torch.le,
            "GreaterOrEqual": torch.ge}
_LOGIC = {"And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor}
_BITWISE = {"BitwiseAnd": torch.bitwise_and, "BitwiseOr": torch.bitwise_or,
            "BitwiseXor": torch.bitwise_xor}


def _make_binary(fn, name):
    fn = _widened(fn, True)

    def binary(a, b):
        return fn(a, b)

    binary.__name__ = binary.__qualname__ = name
    return binary


for _name, _fn in _COMPARE.items():
    lowering(_name, dtypes=COMMON | WIDE_UINTS)(_make_binary(_fn, f"onnx_{_name.lower()}"))
for _name, _fn in _LOGIC.items():
    lowering(_name, dtypes=DT_BOOL)(_make_binary(_fn, f"onnx_{_name.lower()}"))
for _name, _fn in _BITWISE.items():
    lowering(_name, dtypes=INTS | WIDE_UINTS)(_make_binary(_fn, f"onnx_{_name.lower()}"))


@lowering("Where", dtypes=COMMON)
def where(cond, a, b):
    """ONNX Where: ``a`` where ``cond`` is true, ``b`` elsewhere."""
    return torch.where(cond, a, b)


# ------------------------------------------------------------------ bit shifts
_BITS = {torch.uint8: 8, torch.uint16: 16, torch.uint32: 32, torch.uint64: 64, torch.int8: 8,
         torch.int16: 16, torch.int32: 32, torch.int64: 64}
_SIGNED = (torch.int8, torch.int16, torch.int32, torch.int64)


@lowering("BitShift", dtypes=INTS | WIDE_UINTS)
def bit_shift(x, y, *, direction="LEFT"):
    """ONNX BitShift, ``LEFT`` or ``RIGHT``, element-wise by the counts in ``y``.

    Shifts by a negative count or by the bit width or more give 0 (-1 for negative signed values
    shifted right), as the reference does; uint16/32/64 shift as int64 and are masked back.
    """
    # out-of-range shifts give 0 (or -1 for negative values shifted right), as in the reference;
    # torch has no shift kernels for uint16/32/64, which shift as int64 and mask back
    bits = _BITS[x.dtype]
    dtype = x.dtype
    if dtype in _NARROW_UINTS:
        a, s = x.to(torch.int64), y.to(torch.int64)
    elif dtype == torch.uint64:
        a, s = x.view(torch.int64), y.view(torch.int64)
    else:
        a, s = x, y
    a, s = torch.broadcast_tensors(a, s)
    count = s.to(torch.int64)
    outside = (count < 0) | (count >= bits)
    safe = torch.where(outside, torch.zeros_like(count), count).to(a.dtype)
    zero = torch.zeros_like(a)
    if direction == "LEFT":
        out = torch.where(outside, zero, torch.bitwise_left_shift(a, safe))
    else:
        out = torch.bitwise_right_shift(a, safe)
        if dtype == torch.uint64:  # int64 shifts are arithmetic: clear the copied sign bits
            high = torch.bitwise_left_shift(torch.full_like(a, -1), (64 - count).clamp(0, 63))
            out = torch.where(count > 0, torch.bitwise_and(out, torch.bitwise_not(high)), out)
        fill = torch.where(a < 0, torch.full_like(a, -1), zero) if dtype in _SIGNED else zero
        out = torch.where(outside, fill, out)
    if dtype == torch.uint64:
        return out.view(dtype)
    if dtype in _NARROW_UINTS:
        return torch.bitwise_and(out, (1 << bits) - 1).to(dtype)
    return out
