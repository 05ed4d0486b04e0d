"""Spectral kernels: DFT (opsets 17 and 20) and STFT, vectorized over frames.

Complex values travel as a trailing axis of 2 (real, imaginary) and real signals as a trailing axis
of 1, as ONNX defines. The transforms are numpy's pocketfft in the signal's precision, computed the
way ``onnx.reference`` computes them (same transform, same slicing, same final cast), so the results
are the same numbers; only the framing is done in one strided view instead of a loop over frames.
"""

from __future__ import annotations

import numpy as np

from hybrid.backends.reference.registry import kernel

__all__: list[str] = []


def _as_signal(x: np.ndarray) -> np.ndarray:
    """The signal carried by ``x[..., 1]`` (real) or ``x[..., 2]`` (real, imaginary)."""
    if x.shape[-1] == 1:
        return x[..., 0]
    if x.shape[-1] == 2:
        return x[..., 0] + 1j * x[..., 1]
    raise ValueError(f"a DFT/STFT signal's last axis holds 1 (real) or 2 (real, imaginary) values, "
                     f"got {x.shape[-1]}")


def _interleaved(z: np.ndarray) -> np.ndarray:
    return np.stack((z.real, z.imag), axis=-1)


def _scalar(v, name: str) -> int:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {a.shape}")
    return int(a.reshape(()))


def _dft(x, dft_length, axis: int, inverse: int, onesided: int):
    axis = axis % x.ndim
    if axis == x.ndim - 1:
        raise ValueError(f"DFT axis {axis} is the real/imaginary axis; it must be one of the signal's axes")
    if dft_length is None:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    else:
        n = _scalar(dft_length, "dft_length")
    if n < 1:
        raise ValueError(f"dft_length must be positive, got {n}")
    z = _as_signal(x)
    if inverse:
        y = np.fft.irfft(z, n=n, axis=axis)[..., None] if onesided else _interleaved(np.fft.ifft(z, n=n, axis=axis))
    else:
        spectrum = np.fft.fft(z, n=n, axis=axis)
        if onesided:
            spectrum = spectrum.take(np.arange(spectrum.shape[axis] // 2 + 1), axis=axis)
        y = _interleaved(spectrum)
    return (y.astype(x.dtype),)


@kernel("DFT", since=17)
def _dft_17(x, dft_length=None, *, axis=1, inverse=0, onesided=0):
    return _dft(x, dft_length, axis, inverse, onesided)


@kernel("DFT", since=20)
def _dft_20(x, dft_length=None, axis=None, *, inverse=0, onesided=0):
    return _dft(x, dft_length, -2 if axis is None else _scalar(axis, "axis"), inverse, onesided)


@kernel("STFT", since=17)
def _stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    if signal.ndim != 3:
        raise ValueError(f"STFT signal must be [batch, length, 1 or 2], got shape {signal.shape}")
    step = _scalar(frame_step, "frame_step")
    if frame_length is not None:
        n = _scalar(frame_length, "frame_length")
    else:
        n = signal.shape[1] if window is None else window.shape[0]
    if window is None:
        window = np.ones((n,), dtype=signal.dtype)
    if step < 1 or n < 1:
        raise ValueError(f"STFT frame_step and frame_length must be positive, got {step} and {n}")
    frames = 1 + (signal.shape[1] - n) // step
    if frames < 1:
        raise ValueError(f"STFT signal of length {signal.shape[1]} is shorter than one frame of {n}")
    width = window.shape[0]
    need = (frames - 1) * step + width
    if need > signal.shape[1]:  # the last frames run past the signal: zeros there
        signal = np.pad(signal, ((0, 0), (0, need - signal.shape[1]), (0, 0)))
    s0, s1, s2 = signal.strides  # frames as a read-only strided view [batch, frames, width, channels]
    framed = np.lib.stride_tricks.as_strided(signal, (signal.shape[0], frames, width, signal.shape[2]),
                                             (s0, step * s1, s1, s2), writeable=False)
    weighted = framed * window.reshape(1, 1, width, 1)
    spectrum = np.fft.fft(_as_signal(weighted), n=n, axis=2)
    if onesided:
        spectrum = spectrum[:, :, : n // 2 + 1]
    return (_interleaved(spectrum).astype(signal.dtype),)
