"""Frames in and out: :class:`VideoSource` (a video file or any iterable of frames) and :func:`write_video`.

Video files are decoded with PyAV (``pip install pyasc[vision]``), whose wheels carry their own
FFmpeg; it is imported only when a file is opened. Frames are H x W x 3 uint8 arrays, RGB unless
``color='bgr'`` is asked for (the order OpenCV uses).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.errors import ConfigError, ModelError, RunError

__all__ = ["VideoInfo", "VideoSource", "write_video"]

_INSTALL = "pip install 'pyasc[vision]' (PyAV, with its own FFmpeg)"


def _av() -> Any:
    try:
        import av
    except ImportError as e:
        raise ModelError("HYB-207", "reading or writing video files needs PyAV (module 'av'), which is not "
                         "installed", _INSTALL) from e
    return av


@dataclass(frozen=True, slots=True)
class VideoInfo:
    """A video file's first video stream: size, frame rate, frame count (0 when the file does not say), codec."""

    width: int
    height: int
    fps: float
    frames: int
    codec: str


class VideoSource:
    """Frames from a video file or from any iterable of frames, one at a time or in batches.

    Args:
        source: A video file path, or an iterable of H x W x C arrays (a list, a generator, a camera
            reader...). A file can be iterated many times; an iterator once.
        color: Channel order of the frames a file yields, 'rgb' or 'bgr'.
        limit: Stop after this many frames.

    Raises:
        RunError: HYB-406 for a path that is not a file or a source that is not iterable.
        ConfigError: HYB-102 for a bad color or limit.
    """

    def __init__(self, source: str | os.PathLike | Iterable[Any], *, color: str = "rgb",
                 limit: int | None = None) -> None:
        if color not in ("rgb", "bgr"):
            raise ConfigError("HYB-102", f"VideoSource color: expected 'rgb' or 'bgr', got {color!r}")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise ConfigError("HYB-102", f"VideoSource limit: expected a non-negative int, got {limit!r}")
        self.color = color
        self.limit = limit
        self.path: Path | None = None
        self._frames: Iterable[Any] | None = None
        if isinstance(source, (str, os.PathLike)):
            self.path = Path(source)
            if not self.path.is_file():
                raise RunError("HYB-406", f"VideoSource: video file {str(self.path)!r} not found",
                               "pass an existing video file or an iterable of frames")
        elif (isinstance(source, np.ndarray) and source.ndim == 4) or \
                (isinstance(source, Iterable) and not isinstance(source, (bytes, np.ndarray))):
            self._frames = source
        else:
            raise RunError("HYB-406", f"VideoSource: expected a video file path or an iterable of frames, got "
                           f"{type(source).__name__}", "pass a path, a list of frames or a frame generator")

    def info(self) -> VideoInfo:
        """The video file's properties (files only).

        Raises:
            RunError: HYB-406 when this source is not a file or the file has no video stream.
        """
        if self.path is None:
            raise RunError("HYB-406", "VideoSource.info: this source is an iterable of frames, not a file")
        with self._open() as container:
            stream = self._video_stream(container)
            rate = stream.average_rate or stream.guessed_rate or Fraction(0)
            return VideoInfo(stream.codec_context.width, stream.codec_context.height, float(rate),
                             int(stream.frames or 0), stream.codec_context.name)

    def _open(self) -> Any:
        av = _av()
        try:
            return av.open(str(self.path))
        except (av.error.FFmpegError, OSError) as e:
            raise RunError("HYB-406", f"VideoSource: {str(self.path)!r} is not a readable video ({e})",
                           "check the file; any format FFmpeg reads works") from e

    def _video_stream(self, container: Any) -> Any:
        if not container.streams.video:
            raise RunError("HYB-406", f"VideoSource: {str(self.path)!r} has no video stream",
                           "pass a video file")
        return container.streams.video[0]

    def _decode(self) -> Iterator[np.ndarray]:
        av = _av()
        fmt = "rgb24" if self.color == "rgb" else "bgr24"
        with self._open() as container:
            stream = self._video_stream(container)
            stream.thread_type = "AUTO"  # FFmpeg's own frame/slice threads
            try:
                for frame in container.decode(stream):
                    yield frame.to_ndarray(format=fmt)
            except av.error.FFmpegError as e:
                raise RunError("HYB-406", f"VideoSource: decoding {str(self.path)!r} failed ({e})",
                               "the file is damaged or truncated") from e

    def __iter__(self) -> Iterator[np.ndarray]:
        frames = self._decode() if self.path is not None else iter(self._frames)  # type: ignore[arg-type]
        for i, frame in enumerate(frames):
            if self.limit is not None and i >= self.limit:
                break
            yield frame

    def batches(self, n: int) -> Iterator[list[np.ndarray]]:
        """Lists of ``n`` consecutive frames (the last one may be shorter).

        Raises:
            ConfigError: HYB-102 when ``n`` is not a positive int.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError("HYB-102", f"batches: expected a positive int, got {n!r}")
        batch: list[np.ndarray] = []
        for frame in self:
            batch.append(frame)
            if len(batch) == n:
                yield batch
                batch = []
        if batch:
            yield batch

    def __repr__(self) -> str:
        what = str(self.path) if self.path is not None else type(self._frames).__name__
        return f"<hybrid.vision.VideoSource {what} ({self.color})>"


def write_video(path: str | os.PathLike, frames: Iterable[np.ndarray], fps: int = 25, *, codec: str = "mpeg4",
                bit_rate: int = 8_000_000, color: str = "rgb") -> int:
    """Encode H x W x 3 uint8 frames into a video file (atomically: a temp file, then a rename).

    Args:
        path: Output file; its extension picks the container ('.mp4', '.mkv', '.avi').
        frames: The frames, all of one size with even width and height (yuv420p).
        fps: Frame rate.
        codec: An FFmpeg encoder PyAV has ('mpeg4' always; 'libx264', 'h264' where built in).
        bit_rate: Target bits per second (high keeps colors close to the input).
        color: Channel order of the frames.

    Returns:
        The number of frames written.

    Raises:
        RunError: HYB-404 / HYB-406 for frames that are not even-sized H x W x 3 uint8 of one size.
    """
    av = _av()
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent or ".")
    os.close(fd)
    count = 0
    try:
        with av.open(tmp, mode="w") as container:
            stream = None
            for frame in frames:
                a = np.asarray(frame)
                if a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8:
                    raise RunError("HYB-404", f"write_video: frame {count} must be H x W x 3 uint8, got "
                                   f"{a.dtype}{list(a.shape)}", "convert the frame first")
                if stream is None:
                    if a.shape[0] % 2 or a.shape[1] % 2:
                        raise RunError("HYB-404", f"write_video: frame size {a.shape[1]}x{a.shape[0]} is odd",
                                       "yuv420p video needs even width and height")
                    stream = container.add_stream(codec, rate=fps)
                    stream.width, stream.height, stream.pix_fmt = a.shape[1], a.shape[0], "yuv420p"
                    stream.bit_rate = bit_rate
                elif a.shape[:2] != (stream.height, stream.width):
                    raise RunError("HYB-404", f"write_video: frame {count} is {a.shape[1]}x{a.shape[0]}, the "
                                   f"video {stream.width}x{stream.height}", "all frames of a video have one size")
                vf = av.VideoFrame.from_ndarray(a, format="rgb24" if color == "rgb" else "bgr24")
                container.mux(stream.encode(vf))
                count += 1
            if stream is not None:
                container.mux(stream.encode(None))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return count
