"""Elementwise kernels: arithmetic, comparisons, logic, activations.

ONNX broadcasting is numpy broadcasting, and ONNX requires both operands of a binary op to have
one type, so most kernels are one numpy call. Results are cast back to the input type where numpy
would promote (integer Div, Pow, Sum of small ints).
"""

from __future__ import annotations

import numpy as np

from hybrid.backends.reference.registry import kernel

__all__: list[str] = []


def _same(x: np.ndarray, like: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x if x.dtype == like.dtype else x.astype(like.dtype)


# ------------------------------------------------------------------ binary arithmetic
@kernel("Add", since=7)
def _add(a, b):
    return (np.add(a, b),)


@kernel("Sub", since=7)
def _sub(a, b):
    return (np.subtract(a, b),)


@kernel("Mul", since=7)
def _mul(a, b):
    return (np.multiply(a, b),)


@kernel("Div", since=7)
def _div(a, b):
    if a.dtype.kind in "iu":
        # C-style division: truncate toward zero
        q = np.floor_divide(a, b)
        fix = (np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))
        return (_same(q + fix.astype(q.dtype), a),)
    return (_same(np.divide(a, b), a),)


@kernel("Pow", since=7)
def _pow(a, b):
    with np.errstate(all="ignore"):
        return (_same(np.power(a, b), a),)


@kernel("Sum", since=8)
def _sum(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = np.add(out, x)
    return (_same(out, xs[0]),)


@kernel("Mean", since=8)
def _mean(*xs):
    out = xs[0].copy() if len(xs) == 1 else np.add(xs[0], xs[1])
    for x in xs[2:]:
        out = np.add(out, x)
    return (_same(out / len(xs), xs[0]),)


@kernel("Max", since=8)
def _max(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = np.maximum(out, x)
    return (np.asarray(out).copy() if len(xs) == 1 else out,)


@kernel("Min", since=8)
def _min(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = np.minimum(out, x)
    return (np.asarray(out).copy() if len(xs) == 1 else out,)


# ------------------------------------------------------------------ comparisons and logic
@kernel("Equal", since=7)
def _equal(a, b):
    return (np.equal(a, b),)


@kernel("Less", since=7)
def _less(a, b):
    return (np.less(a, b),)


@kernel("Greater", since=7)
def _greater(a, b):
    return (np.greater(a, b),)


@kernel("LessOrEqual", since=12)
def _less_equal(a, b):
    return (np.less_equal(a, b),)


@kernel("GreaterOrEqual", since=12)
def _greater_equal(a, b):
    return (np.greater_equal(a, b),)


@kernel("And", since=7)
def _and(a, b):
    return (np.logical_and(a, b),)


@kernel("Or", since=7)
def _or(a, b):
    return (np.logical_or(a, b),)


@kernel("Xor", since=7)
def _xor(a, b):
    return (np.logical_xor(a, b),)


@kernel("Not")
def _not(x):
    return (np.logical_not(x),)


@kernel("Where", since=9)
def _where(cond, x, y):
    return (np.where(cond, x, y),)


# ------------------------------------------------------------------ unary math
def _unary(op_type: str, fn, since: int = 6) -> None:
    def run(x):
        return (_same(fn(x), x),)

    run.__name__ = f"_{op_type.lower()}"
    kernel(op_type, since=since)(run)


for _op, _fn in {"Abs": np.abs, "Neg": np.negative, "Floor": np.floor, "Ceil": np.ceil,
                 "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log, "Reciprocal": np.reciprocal,
                 "Tanh": np.tanh}.items():
    _unary(_op, _fn)
for _op, _fn in {"Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos,
                 "Atan": np.arctan}.items():
    _unary(_op, _fn, since=7)
for _op, _fn in {"Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh, "Acosh": np.arccosh,
                 "Atanh": np.arctanh, "Sign": np.sign}.items():
    _unary(_op, _fn, since=9)
_unary("Round", np.round, since=11)


@kernel("IsNaN", since=9)
def _isnan(x):
    return (np.isnan(x),)


@kernel("Identity")
def _identity(x):
    return (x,)


# ------------------------------------------------------------------ activations
@kernel("Relu", since=6)
def _relu(x):
    return (np.maximum(x, x.dtype.type(0)),)


@kernel("Sigmoid", since=6)
def _sigmoid(x):
    with np.errstate(over="ignore"):
        return (_same(1.0 / (1.0 + np.exp(-x)), x),)


@kernel("LeakyRelu", since=6)
def _leaky_relu(x, *, alpha=0.01):
    return (_same(np.where(x >= 0, x, x * x.dtype.type(alpha)), x),)


@kernel("PRelu", since=9)
def _prelu(x, slope):
    return (_same(np.where(x >= 0, x, x * slope), x),)


@kernel("Elu", since=6)
def _elu(x, *, alpha=1.0):
    with np.errstate(over="ignore"):
        return (_same(np.where(x > 0, x, alpha * np.expm1(x)), x),)


@kernel("Selu", since=6)
def _selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    with np.errstate(over="ignore"):
        return (_same(np.where(x > 0, gamma * x, gamma * alpha * (np.exp(x) - 1)), x),)


@kernel("HardSigmoid", since=6)
def _hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    return (_same(np.clip(alpha * x + beta, 0, 1), x),)


@kernel("HardSwish", since=14)
def _hard_swish(x):
    return (_same(x * np.clip(x / 6.0 + 0.5, 0, 1), x),)


@kernel("Softplus", since=1)
def _softplus(x):
    with np.errstate(over="ignore"):
        return (_same(np.logaddexp(0, x), x),)


@kernel("Clip", since=11)
def _clip(x, lo=None, hi=None):
    if lo is None and hi is None:
        return (x.copy(),)
    out = x
    if lo is not None:
        out = np.maximum(out, lo)
    if hi is not None:
        out = np.minimum(out, hi)
    return (_same(out, x),)


def _erf_function():
    try:
        from scipy.special import erf  # fast where scipy is installed; hybrid does not require it
    except ImportError:
        import math

        return np.vectorize(math.erf, otypes=[np.float64])
    return erf


_ERF = None


@kernel("Erf", since=9)
def _erf(x):
    global _ERF
    if _ERF is None:
        _ERF = _erf_function()
    return (np.asarray(_ERF(x)).astype(x.dtype),)


@kernel("Gelu", since=20)
def _gelu(x, *, approximate="none"):
    if approximate == "tanh":
        inner = np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)
        return (_same(0.5 * x * (1 + np.tanh(inner)), x),)
    return (_same(0.5 * x * (1 + _erf(x / np.sqrt(2).astype(x.dtype))[0]), x),)


@kernel("Mod", since=10)
def _mod(a, b, *, fmod=0):
    with np.errstate(all="ignore"):
        return (np.fmod(a, b) if fmod else np.mod(a, b),)


@kernel("IsInf", since=10)
def _isinf(x, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return (np.isinf(x),)
    if detect_negative:
        return (np.isneginf(x),)
    if detect_positive:
        return (np.isposinf(x),)
    return (np.zeros(x.shape, dtype=bool),)


@kernel("Softsign", since=1)
def _softsign(x):
    return (_same(x / (1 + np.abs(x)), x),)


@kernel("ThresholdedRelu", since=10)
def _thresholded_relu(x, *, alpha=1.0):
    return (_same(np.where(x > alpha, x, 0), x),)


@kernel("Celu", since=12)
def _celu(x, *, alpha=1.0):
    return (_same(np.maximum(0, x) + np.minimum(0, alpha * np.expm1(x / alpha)), x),)


@kernel("Shrink", since=9)
def _shrink(x, *, bias=0.0, lambd=0.5):
    return (_same(np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)), x),)


@kernel("Mish", since=18)
def _mish(x):
    with np.errstate(over="ignore"):
        return (_same(x * np.tanh(np.log1p(np.exp(x))), x),)


@kernel("BitShift", since=11)
def _bit_shift(x, y, *, direction):
    return ((np.left_shift(x, y) if direction == "LEFT" else np.right_shift(x, y)).astype(x.dtype),)


@kernel("BitwiseAnd", since=18)
def _bitwise_and(a, b):
    return (np.bitwise_and(a, b),)


@kernel("BitwiseOr", since=18)
def _bitwise_or(a, b):
    return (np.bitwise_or(a, b),)


@kernel("BitwiseXor", since=18)
def _bitwise_xor(a, b):
    return (np.bitwise_xor(a, b),)


@kernel("BitwiseNot", since=18)
def _bitwise_not(x):
    return (np.bitwise_not(x),)
