"""VideoSource over files written with write_video (PyAV) and over frame iterables; errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from hybrid.errors import ConfigError, ModelError, RunError
from hybrid.vision import VideoSource, write_video

COLORS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 40)]


def _frames(n=10, w=64, h=48):
    for i in range(n):
        f = np.zeros((h, w, 3), np.uint8)
        f[:] = COLORS[i % len(COLORS)]
        yield f


def test_write_then_read_a_video(tmp_path):
    path = tmp_path / "clip.mp4"
    assert write_video(path, _frames(), fps=10) == 10
    assert not [p for p in tmp_path.iterdir() if p.name != "clip.mp4"]  # no temp file left behind
    src = VideoSource(path)
    info = src.info()
    assert (info.width, info.height, info.fps, info.codec) == (64, 48, 10.0, "mpeg4")
    frames = list(src)
    assert len(frames) == 10 and all(f.shape == (48, 64, 3) and f.dtype == np.uint8 for f in frames)
    for i, f in enumerate(frames):  # lossy, but each frame keeps its color
        assert np.abs(f.reshape(-1, 3).mean(0) - COLORS[i % len(COLORS)]).max() < 12
    assert len(list(src)) == 10  # a file can be read again
    bgr = next(iter(VideoSource(path, color="bgr")))
    np.testing.assert_array_equal(bgr, frames[0][..., ::-1])
    assert [len(b) for b in src.batches(4)] == [4, 4, 2]
    assert len(list(VideoSource(path, limit=3))) == 3


def test_frame_iterables():
    frames = list(_frames(5))
    assert [len(b) for b in VideoSource(frames).batches(2)] == [2, 2, 1]
    gen = VideoSource(_frames(5))
    assert len(list(gen)) == 5 and list(gen) == []  # an iterator is read once
    stacked = VideoSource(np.stack(frames), limit=4)
    assert [len(b) for b in stacked.batches(3)] == [3, 1]
    with pytest.raises(RunError) as info:
        VideoSource(42)
    assert info.value.code == "HYB-406"


def test_bad_sources_and_arguments(tmp_path):
    with pytest.raises(RunError) as info:
        VideoSource(tmp_path / "missing.mp4")
    assert info.value.code == "HYB-406" and "not found" in info.value.message
    (tmp_path / "notes.mp4").write_text("not a video")
    with pytest.raises(RunError) as info:
        list(VideoSource(tmp_path / "notes.mp4"))
    assert info.value.code == "HYB-406"
    with pytest.raises(ConfigError):
        VideoSource([], color="rgba")
    with pytest.raises(ConfigError):
        VideoSource([], limit=-1)
    with pytest.raises(ConfigError) as info:
        next(VideoSource([]).batches(0))
    assert info.value.code == "HYB-102"
    with pytest.raises(RunError) as info:
        VideoSource([]).info()
    assert info.value.code == "HYB-406"


@pytest.mark.parametrize(("frames", "words"), [
    ([np.zeros((47, 64, 3), np.uint8)], "odd"),
    ([np.zeros((48, 64, 3), np.uint8), np.zeros((48, 32, 3), np.uint8)], "the video 64x48"),
    ([np.zeros((48, 64, 3), np.float32)], "uint8"),
    ([np.zeros((48, 64), np.uint8)], "uint8"),
])
def test_write_video_refuses_bad_frames(tmp_path, frames, words):
    with pytest.raises(RunError) as info:
        write_video(tmp_path / "bad.mp4", frames)
    assert info.value.code == "HYB-404" and words in info.value.message
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_missing_pyav_is_named(tmp_path, monkeypatch):
    write_video(tmp_path / "v.mp4", _frames(2))
    monkeypatch.setitem(sys.modules, "av", None)  # import av now raises ImportError
    with pytest.raises(ModelError) as info:
        list(VideoSource(tmp_path / "v.mp4"))
    assert info.value.code == "HYB-207" and "pyasc[vision]" in info.value.hint
