"""examples/video_analytics.py end to end: torch models exported, bundled with their declarations, chained on video."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import hybrid
from hybrid.vision import TaskModel, VideoSource

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("video_analytics", ROOT / "examples" / "video_analytics.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _saturated(frame: np.ndarray) -> np.ndarray:
    return (frame.max(-1).astype(int) - frame.min(-1)) > 100


def test_example_runs_the_chain_end_to_end(example, tmp_path, capsys):
    summary = example.main(["--frames", "8", "--width", "320", "--height", "240", "--input-size", "320",
                            "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "FPS" in out and "detector run" in out and "classifier preprocess" in out
    assert summary["frames"] == 8 and summary["detections"] >= 8  # three squares per frame, seldom merged
    assert sum(summary["labels"].values()) == summary["detections"]
    assert set(summary["labels"]) <= set(example.CLASSIFIER_CLASSES)
    assert summary["detector"]["run"]["items"] == 8 and summary["detector"]["run"]["calls"] == 2  # batches of 4
    assert summary["classifier"]["run"]["items"] == summary["detections"]
    det = hybrid.load(tmp_path / "detector-yolov5.hybrid")
    cls = hybrid.load(tmp_path / "classifier.hybrid")
    assert isinstance(det, TaskModel) and isinstance(cls, TaskModel)
    assert det.input.resize == "letterbox" and (det.input.height, det.input.width) == (320, 320)
    frames = list(VideoSource(tmp_path / "squares.mp4"))
    for dets in cls.crop_and_classify(det(frames)):
        assert len(dets) >= 1
        for box, label in zip(dets.crops(), dets.labels):  # every box holds part of a colored square
            assert _saturated(box).sum() >= 25 and label.label in example.CLASSIFIER_CLASSES


def test_yolov5_and_yolov8_exports_decode_to_the_same_detections(example, tmp_path):
    """One torch detector exported with both heads: two layouts, two decoders, the same answers."""
    v5, _ = example.bundle_models(tmp_path, "yolov5", 320)
    v8, _ = example.bundle_models(tmp_path, "yolov8", 320)
    frames = list(example.squares_frames(3, 320, 240, seed=3))
    a, b = hybrid.load(v5)(frames), hybrid.load(v8)(frames)
    for x, y in zip(a, b):
        assert len(x) >= 1
        np.testing.assert_allclose(x.boxes, y.boxes, atol=1e-3)
        np.testing.assert_allclose(x.scores, y.scores, atol=1e-5)
        assert x.class_ids.tolist() == y.class_ids.tolist() and x.names == y.names
