"""Signal lowerings: DFT, STFT and the window functions."""

from __future__ import annotations

import math

import torch
from onnx_ir import DataType

from hybrid.backends.torch.lowering import FLOATS, INTS, ints, lowering, torch_dtype

_SIGNAL_TYPES = frozenset({DataType.FLOAT, DataType.DOUBLE, DataType.INT32, DataType.INT64})


def _signal(x):
    """The complex (or real) signal of an ONNX [..., 1] real or [..., 2] (real, imaginary) tensor."""
    work = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    if work.shape[-1] == 1:
        return work[..., 0]
    return torch.complex(work[..., 0], work[..., 1])


def _pair(c, dtype):
    return torch.stack([c.real, c.imag], dim=-1).to(dtype)


def _dft(x, n, axis, inverse, onesided):
    axis = axis % x.dim()
    if n is None:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    sig = _signal(x)
    if inverse:
        if onesided:
            return torch.fft.irfft(sig, n=n, dim=axis).unsqueeze(-1).to(x.dtype)
        return _pair(torch.fft.ifft(sig, n=n, dim=axis), x.dtype)
    out = torch.fft.fft(sig, n=n, dim=axis)
    if onesided:
        out = out.narrow(axis, 0, n // 2 + 1)
    return _pair(out, x.dtype)


@lowering("DFT", since=17, host_inputs=(1,), dtypes=_SIGNAL_TYPES)
def dft_17(x, dft_length=None, *, axis=1, inverse=0, onesided=0):
    """ONNX DFT at opset 17: ``axis`` is an attribute; the input is [..., 1] real or [..., 2] complex.

    Output is [..., 2] (real, imaginary); the inverse one-sided transform is real and keeps [..., 1].
    """
    return _dft(x, ints(dft_length)[0] if dft_length is not None else None, axis, inverse, onesided)


@lowering("DFT", since=20, host_inputs=(1, 2), dtypes=_SIGNAL_TYPES)
def dft(x, dft_length=None, axis=None, *, inverse=0, onesided=0):
    """ONNX DFT from opset 20: ``axis`` is an input (default -2, the last signal dim), otherwise as at opset 17."""
    n = ints(dft_length)[0] if dft_length is not None else None
    return _dft(x, n, ints(axis)[0] if axis is not None else -2, inverse, onesided)


@lowering("STFT", since=17, host_inputs=(1, 3), dtypes=_SIGNAL_TYPES)
def stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    """ONNX STFT: frames of ``frame_length`` every ``frame_step`` samples, windowed, then a DFT of each frame."""
    step = ints(frame_step)[0]
    length = ints(frame_length)[0] if frame_length is not None else (
        window.shape[0] if window is not None else signal.shape[-2])
    frames = _signal(signal).unfold(1, length, step)  # (batch, frames, length)
    if window is not None:
        frames = frames * window.to(frames.real.dtype)
    out = torch.fft.fft(frames, n=length, dim=-1)
    if onesided:
        out = out[..., : length // 2 + 1]
    return _pair(out, signal.dtype)


# ------------------------------------------------------------------ windows
def _window(size, periodic, output_datatype, terms):
    n = ints(size)[0]
    denom = n if periodic else n - 1
    k = torch.arange(n, dtype=torch.float64)
    y = torch.zeros(n, dtype=torch.float64)
    for scale, freq in terms:
        y = y + scale * torch.cos(k * (2 * math.pi * freq) / denom)
    return y.to(torch_dtype(output_datatype))


_WINDOW_TYPES = FLOATS | INTS


@lowering("HannWindow", since=17, host_inputs=(0,), dtypes=_WINDOW_TYPES)
def hann_window(size, *, output_datatype=1, periodic=1):
    """ONNX HannWindow of ``size`` samples, periodic or symmetric, in ``output_datatype``."""
    return _window(size, periodic, output_datatype, [(0.5, 0), (-0.5, 1)])


@lowering("HammingWindow", since=17, host_inputs=(0,), dtypes=_WINDOW_TYPES)
def hamming_window(size, *, output_datatype=1, periodic=1):
    """ONNX HammingWindow (alpha 25/46) of ``size`` samples, periodic or symmetric, in ``output_datatype``."""
    alpha = 25.0 / 46.0
    return _window(size, periodic, output_datatype, [(alpha, 0), (-(1 - alpha), 1)])


@lowering("BlackmanWindow", since=17, host_inputs=(0,), dtypes=_WINDOW_TYPES)
def blackman_window(size, *, output_datatype=1, periodic=1):
    """ONNX BlackmanWindow of ``size`` samples, periodic or symmetric, in ``output_datatype``."""
    return _window(size, periodic, output_datatype, [(0.42, 0), (-0.5, 1), (0.08, 2)])
