"""Frames to an image model's input: resize or letterbox, color order, scale, mean/std, layout, dtype.

Sampling is bilinear with half-pixel centers (as OpenCV's INTER_LINEAR and torch's
``interpolate(align_corners=False)``): output pixel ``j`` of a source interval ``[s0, s1)`` placed at
``[d0, d1)`` reads the source at ``s0 + (j - d0 + 0.5) * (s1 - s0) / (d1 - d0) - 0.5``. Every frame
keeps a :class:`Placement` of that mapping, so boxes found in the input map back to the frame exactly.

Work is vectorized over frames: frames of one size go through one separable resize together; crops
(any rectangles of any frames) go through one gather per frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid.errors import BundleError, RunError
from hybrid.vision.spec import Preprocess

__all__ = ["ImageInput", "Placement", "as_frames", "image_input", "input_shape", "prepare", "prepare_crops"]

_DEFAULT_MAX_BATCH = 16
_FRAME_DTYPES = (np.uint8, np.uint16, np.float16, np.float32, np.float64)


@dataclass(frozen=True, slots=True)
class ImageInput:
    """An image input resolved against the model: what :func:`prepare` produces.

    Attributes:
        name: The model input's name.
        height, width, channels: Input image size and channels (1 or 3).
        layout: 'NCHW' or 'NHWC'.
        dtype: numpy dtype of the input.
        resize: 'resize' or 'letterbox'.
        pad_value: Letterbox padding, in pixel units.
        color: Channel order the model expects.
        gain, offset: Per-channel ``x * gain + offset`` (scale, mean and std folded together).
        static_batch: The input's batch size when it is fixed, else None.
        max_batch: Most frames per run.
    """

    name: str
    height: int
    width: int
    channels: int
    layout: str
    dtype: np.dtype
    resize: str
    pad_value: float
    color: str
    gain: np.ndarray
    offset: np.ndarray
    static_batch: int | None
    max_batch: int


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a rectangle of a frame landed in the model input.

    Attributes:
        src: (x1, y1, x2, y2) in frame pixels, continuous coordinates (pixel i spans [i, i + 1)).
        dst: (x1, y1, x2, y2) in input pixels, integers.
        frame_size: (height, width) of the frame.
    """

    src: tuple[float, float, float, float]
    dst: tuple[int, int, int, int]
    frame_size: tuple[int, int]

    def to_frame(self, boxes: np.ndarray) -> np.ndarray:
        """Map xyxy boxes from input pixels to frame pixels, clipped to the frame."""
        sx1, sy1, sx2, sy2 = self.src
        dx1, dy1, dx2, dy2 = self.dst
        kx, ky = (sx2 - sx1) / (dx2 - dx1), (sy2 - sy1) / (dy2 - dy1)
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        out = np.empty_like(b)
        out[:, 0::2] = sx1 + (b[:, 0::2] - dx1) * kx
        out[:, 1::2] = sy1 + (b[:, 1::2] - dy1) * ky
        h, w = self.frame_size
        np.clip(out[:, 0::2], 0.0, w, out=out[:, 0::2])
        np.clip(out[:, 1::2], 0.0, h, out=out[:, 1::2])
        return out.astype(np.float32)


def _bad(code: str, message: str, hint: str) -> BundleError:
    return BundleError(code, message, hint)


def image_input(decl: Preprocess, spec: Any) -> ImageInput:
    """Resolve a ``preprocess`` declaration against the model's image input (a TensorSpec).

    Raises:
        BundleError: HYB-502 when the declaration and the input disagree or leave something open.
    """
    shape = spec.shape
    where = f"preprocess for input {spec.name!r} ({spec})"
    if shape is None or len(shape) != 4:
        raise _bad("HYB-502", f"{where}: an image input must have rank 4 (N, C, H, W or N, H, W, C)",
                   "declare the task on a model whose only input is a batch of images")
    layout = decl.layout
    if layout is None:
        if shape[1] in (1, 3):
            layout = "NCHW"
        elif shape[3] in (1, 3):
            layout = "NHWC"
        else:
            raise _bad("HYB-502", f"{where}: cannot tell the layout (no dimension of 1 or 3 channels)",
                       "declare layout='NCHW' or 'NHWC'")
    c, h, w = (shape[1], shape[2], shape[3]) if layout == "NCHW" else (shape[3], shape[1], shape[2])
    if c not in (1, 3):
        raise _bad("HYB-502", f"{where}: layout {layout} puts {c} channels, expected 1 or 3",
                   "declare the right layout")
    if decl.size is not None:
        height, width = decl.size
        for got, want, axis in ((h, height, "height"), (w, width, "width")):
            if isinstance(got, int) and got != want:
                raise _bad("HYB-502", f"{where}: declared size {decl.size} but the input's {axis} is {got}",
                           "leave size out or match the model")
    elif isinstance(h, int) and isinstance(w, int):
        height, width = h, w
    else:
        raise _bad("HYB-502", f"{where}: the input's height and width are dynamic and no size is declared",
                   "declare size=[height, width]")
    dtype = np.dtype(decl.dtype) if decl.dtype else spec.dtype
    if dtype is None or dtype not in (np.float32, np.float16, np.uint8):
        raise _bad("HYB-502", f"{where}: input dtype {dtype} is not float32, float16 or uint8",
                   "declare dtype, or export the model with a float32 input")
    mean = np.broadcast_to(np.asarray(decl.mean, np.float64), (c,)) if len(decl.mean) in (1, c) else None
    std = np.broadcast_to(np.asarray(decl.std, np.float64), (c,)) if len(decl.std) in (1, c) else None
    if mean is None or std is None:
        raise _bad("HYB-502", f"{where}: mean {decl.mean} and std {decl.std} must have 1 or {c} values",
                   "one value per channel")
    gain = (decl.scale / std).astype(np.float32)
    offset = (-mean / std).astype(np.float32)
    if dtype == np.uint8 and not (np.allclose(gain, 1) and np.allclose(offset, 0)):
        raise _bad("HYB-502", f"{where}: a uint8 input takes raw pixels, but scale/mean/std would change them",
                   "declare scale=1, mean=[0], std=[1] for a uint8 input")
    static_batch = shape[0] if isinstance(shape[0], int) else None
    max_batch = static_batch or decl.max_batch or _DEFAULT_MAX_BATCH
    if static_batch is not None and decl.max_batch is not None and decl.max_batch != static_batch:
        raise _bad("HYB-502", f"{where}: max_batch {decl.max_batch} but the input's batch is fixed at "
                   f"{static_batch}", "leave max_batch out or export the model with a dynamic batch")
    return ImageInput(spec.name, int(height), int(width), int(c), layout, np.dtype(dtype), decl.resize,
                      float(decl.pad_value), decl.color, gain, offset, static_batch, int(max_batch))


# ------------------------------------------------------------------ frames
def _frame(value: Any, i: int) -> np.ndarray:
    try:
        a = np.asarray(value)
    except Exception as e:
        raise RunError("HYB-406", f"frame {i}: expected an H x W x C array, got {type(value).__name__}",
                       "pass numpy arrays (H x W x 3 uint8, as a video decoder gives them)") from e
    if a.dtype == object or a.dtype.kind not in "uif":
        raise RunError("HYB-406", f"frame {i}: expected an H x W x C array of numbers, got {type(value).__name__} "
                       f"of dtype {a.dtype}", "pass numpy arrays (H x W x 3 uint8)")
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3 or a.shape[2] not in (1, 3, 4) or a.shape[0] < 1 or a.shape[1] < 1:
        raise RunError("HYB-404", f"frame {i}: expected H x W x C with 1, 3 or 4 channels, got shape {a.shape}",
                       "a batch of frames is a list of H x W x C arrays or one N x H x W x C array")
    if a.dtype not in _FRAME_DTYPES:
        raise RunError("HYB-403", f"frame {i}: dtype {a.dtype} is not one of uint8, uint16, float16/32/64",
                       "convert it, e.g. frame.astype(np.uint8)")
    return a


def as_frames(frames: Any) -> tuple[list[np.ndarray], bool]:
    """Frames as a list of H x W x C arrays, and whether one frame (not a batch) was given.

    Accepts one frame (H x W or H x W x C), an N x H x W x C array, or a sequence of frames.

    Raises:
        RunError: HYB-406 / HYB-404 / HYB-403 naming the frame that is not an image.
    """
    if isinstance(frames, np.ndarray) or hasattr(frames, "__array__"):
        a = np.asarray(frames)
        if a.ndim == 4:
            return [_frame(f, i) for i, f in enumerate(a)], False
        return [_frame(a, 0)], True
    if isinstance(frames, Sequence) and not isinstance(frames, (str, bytes)):
        return [_frame(f, i) for i, f in enumerate(frames)], False
    raise RunError("HYB-406", f"expected a frame, an N x H x W x C array or a list of frames, got "
                   f"{type(frames).__name__}", "pass numpy arrays (H x W x 3 uint8)")


# ------------------------------------------------------------------ geometry
def _dst_rect(src_w: float, src_h: float, inp: ImageInput) -> tuple[int, int, int, int]:
    if inp.resize == "resize":
        return 0, 0, inp.width, inp.height
    r = min(inp.width / src_w, inp.height / src_h)
    nw = min(inp.width, max(1, round(src_w * r)))
    nh = min(inp.height, max(1, round(src_h * r)))
    left, top = (inp.width - nw) // 2, (inp.height - nh) // 2
    return left, top, left + nw, top + nh


def _axis(n_out: int, d0: np.ndarray, d1: np.ndarray, s0: np.ndarray, s1: np.ndarray,
          size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear taps along one axis for K placements: (i0, i1, weight, inside), each (K, n_out).

    Taps stay within the source interval (its first and last pixel centers), so a crop samples as
    if it had been cut out of the frame first: nothing outside a box leaks into its edges.
    """
    j = np.arange(n_out, dtype=np.float64)[None, :]
    pos = s0[:, None] + (j - d0[:, None] + 0.5) * ((s1 - s0) / (d1 - d0))[:, None] - 0.5
    lo = np.clip(s0, 0.0, size - 1)[:, None]
    pos = np.clip(pos, lo, np.maximum(lo, np.clip(s1 - 1, 0.0, size - 1)[:, None]))
    i0 = np.floor(pos).astype(np.intp)
    i1 = np.minimum(i0 + 1, size - 1)
    return i0, i1, (pos - i0).astype(np.float32), (j >= d0[:, None]) & (j < d1[:, None])


def _lerp(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    a = a.astype(np.float32)
    return a + (b.astype(np.float32) - a) * w


def _resize(x: np.ndarray, nh: int, nw: int) -> np.ndarray:
    """Resize (N, h, w, C) frames to (N, nh, nw, C), separably; unchanged axes are not touched.

    The column pass runs on (N, nh, w * C) rows with weights repeated per channel: numpy broadcasts
    along outer axes fast and along a size-3 inner axis slowly.
    """
    n, h, w, c = x.shape
    one = np.zeros(1)
    if nh != h:
        i0, i1, wy, _ = _axis(nh, one, one + nh, one, one + h, h)
        x = _lerp(np.take(x, i0[0], axis=1), np.take(x, i1[0], axis=1), wy[0][None, :, None, None])
    if nw != w:
        i0, i1, wx, _ = _axis(nw, one, one + nw, one, one + w, w)
        wx = np.repeat(wx[0], c)[None, None, :]
        x = _lerp(np.take(x, i0[0], axis=2).reshape(n, nh, nw * c),
                  np.take(x, i1[0], axis=2).reshape(n, nh, nw * c), wx).reshape(n, nh, nw, c)
    return x


def _channels(x: np.ndarray, channels: int) -> np.ndarray:
    c = x.shape[-1]
    if c == 4:
        x, c = x[..., :3], 3
    if c == channels:
        return x
    if channels == 3:  # gray frames for a color model
        return np.repeat(x, 3, axis=-1)
    luma = np.asarray([0.299, 0.587, 0.114], np.float32)
    return (x.astype(np.float32) @ luma)[..., None]


class _Output:
    """The input batch being filled, one channel plane at a time.

    Contiguous writes are several times faster than writing all channels through a strided view.
    """

    def __init__(self, n: int, inp: ImageInput, color: str, buffer: np.ndarray | None = None) -> None:
        self.inp = inp
        shape = input_shape(n, inp)
        ok = buffer is not None and buffer.shape == shape and buffer.dtype == np.float32
        self.array = buffer if ok else np.empty(shape, np.float32)
        reverse = inp.channels == 3 and color != inp.color
        self.source = [inp.channels - 1 - c if reverse else c for c in range(inp.channels)]
        self.pad = inp.pad_value * inp.gain + inp.offset

    def store(self, items: slice, pixels: np.ndarray, dst: tuple[int, int, int, int]) -> None:
        """Write (n, h, w, C) pixels of the ``items`` at ``dst``; pad the rest; normalize."""
        x1, y1, x2, y2 = dst
        for c, s in enumerate(self.source):
            plane = self.array[items, c] if self.inp.layout == "NCHW" else self.array[items, :, :, c]
            if (x1, y1, x2, y2) != (0, 0, self.inp.width, self.inp.height):
                plane[:, :y1] = plane[:, y2:] = self.pad[c]
                plane[:, y1:y2, :x1] = plane[:, y1:y2, x2:] = self.pad[c]
            region = plane[:, y1:y2, x1:x2]
            np.multiply(pixels[..., s], self.inp.gain[c], out=region, casting="unsafe")
            region += self.inp.offset[c]

    def result(self) -> np.ndarray:
        if self.inp.dtype == np.uint8:
            np.clip(self.array, 0, 255, out=self.array)
            return np.rint(self.array, out=self.array).astype(np.uint8)
        return self.array if self.inp.dtype == np.float32 else self.array.astype(self.inp.dtype)


def input_shape(n: int, inp: ImageInput) -> tuple[int, int, int, int]:
    """The shape of an input batch of ``n`` images."""
    if inp.layout == "NCHW":
        return n, inp.channels, inp.height, inp.width
    return n, inp.height, inp.width, inp.channels


def prepare(frames: list[np.ndarray], inp: ImageInput, color: str = "rgb",
            buffer: np.ndarray | None = None) -> tuple[np.ndarray, list[Placement]]:
    """Whole frames (any sizes) to one input batch, with each frame's placement.

    Args:
        frames: H x W x C arrays (see :func:`as_frames`).
        inp: The resolved input.
        color: Channel order of the frames, 'rgb' or 'bgr'.
        buffer: A float32 array of :func:`input_shape` to fill (overwritten; returned for float32
            inputs) instead of a new one.
    """
    out = _Output(len(frames), inp, color, buffer)
    placements: list[Placement | None] = [None] * len(frames)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, f in enumerate(frames):
        groups.setdefault(f.shape, []).append(i)
    for (h, w, _), idx in groups.items():
        pl = Placement((0.0, 0.0, float(w), float(h)), _dst_rect(w, h, inp), (h, w))
        x = _channels(np.stack([frames[i] for i in idx]) if len(idx) > 1 else frames[idx[0]][None], inp.channels)
        dx1, dy1, dx2, dy2 = pl.dst
        pixels = _resize(x, dy2 - dy1, dx2 - dx1)
        if len(idx) == len(frames):
            out.store(slice(None), pixels, pl.dst)
        else:  # frames of several sizes: one store per frame keeps the writes in place (views)
            for j, i in enumerate(idx):
                out.store(slice(i, i + 1), pixels[j:j + 1], pl.dst)
        for i in idx:
            placements[i] = pl
    return out.result(), placements  # type: ignore[return-value]


def _tap(flat: np.ndarray, w: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Pixels (K, H, W * C) at rows (K, H) x cols (K, W) of a frame flattened to (h * w, C): one gather."""
    k, height = rows.shape
    index = (rows * w)[:, :, None] + cols[:, None, :]
    return np.take(flat, index, axis=0).reshape(k, height, -1)


def prepare_crops(frames: list[np.ndarray], frame_ids: np.ndarray, rects: np.ndarray, inp: ImageInput,
                  color: str = "rgb") -> tuple[np.ndarray, list[Placement]]:
    """Rectangles of frames to one input batch (crops resized or letterboxed as the input declares).

    Args:
        frames: The frames the rectangles come from.
        frame_ids: (K,) index into ``frames`` per rectangle.
        rects: (K, 4) xyxy rectangles in frame pixels (continuous), inside the frame, non-empty.
        inp: The resolved input.
        color: Channel order of the frames.
    """
    k, c, height, width = len(rects), inp.channels, inp.height, inp.width
    pixels = np.empty((k, height, width * c), np.float32)
    rects = np.asarray(rects, np.float64).reshape(k, 4)
    dst = np.asarray([_dst_rect(r[2] - r[0], r[3] - r[1], inp) for r in rects], np.float64).reshape(k, 4)
    frame_ids = np.asarray(frame_ids, np.intp)
    for fid in np.unique(frame_ids):
        sel = np.flatnonzero(frame_ids == fid)
        frame = _channels(frames[fid], c)
        h, w = frame.shape[:2]
        flat = np.ascontiguousarray(frame).reshape(h * w, c)
        r, d = rects[sel], dst[sel]
        y0, y1, wy, iny = _axis(height, d[:, 1], d[:, 3], r[:, 1], r[:, 3], h)
        x0, x1, wx, inx = _axis(width, d[:, 0], d[:, 2], r[:, 0], r[:, 2], w)
        wxc = np.repeat(wx, c, axis=1)[:, None, :]
        top = _lerp(_tap(flat, w, y0, x0), _tap(flat, w, y0, x1), wxc)
        bottom = _lerp(_tap(flat, w, y1, x0), _tap(flat, w, y1, x1), wxc)
        value = top + (bottom - top) * wy[:, :, None]
        if inp.resize == "letterbox":
            inside = iny[:, :, None] & np.repeat(inx, c, axis=1)[:, None, :]
            value = np.where(inside, value, np.float32(inp.pad_value))
        pixels[sel] = value
    out = _Output(k, inp, color)
    out.store(slice(None), pixels.reshape(k, height, width, c), (0, 0, width, height))
    placements = [Placement(tuple(map(float, r)), tuple(int(v) for v in d), frames[f].shape[:2])
                  for r, d, f in zip(rects, dst, frame_ids)]
    return out.result(), placements
