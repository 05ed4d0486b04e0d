"""YOLOv5 / YOLOv8 output decoding on constructed tensors with known boxes."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid.errors import RunError
from hybrid.vision import DetectionPostprocess, decode
from hybrid.vision.yolo import candidates, num_classes

# (x1, y1, x2, y2, class, score): what the decoded output must contain, best first
OBJECTS = [(10, 20, 50, 80, 2, 0.9), (100, 100, 140, 120, 0, 0.8), (60, 10, 90, 30, 1, 0.6)]
NC = 3


def _row(x1, y1, x2, y2, cls, score, fmt, obj=1.0):
    probs = np.full(NC, 0.05, np.float32)
    probs[cls] = score / obj
    xywh = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
    return np.array(xywh + ([obj] if fmt == "yolov5" else []) + probs.tolist(), np.float32)


def _output(rows_per_image, fmt):
    """[batch, boxes, fields] rows -> the format's output tensor."""
    out = np.stack([np.stack(rows) for rows in rows_per_image])
    return out if fmt == "yolov5" else out.transpose(0, 2, 1)


def _scene(fmt, rng):
    """The known objects, near-duplicates NMS must remove, and noise under the threshold, shuffled."""
    rows = [_row(*o, fmt) for o in OBJECTS]
    for x1, y1, x2, y2, c, s in OBJECTS:  # shifted copies, same class, lower score: IoU > 0.45
        rows.append(_row(x1 + 2, y1 + 1, x2 + 2, y2 + 1, c, s - 0.1, fmt))
    for _ in range(20):
        x, y = rng.uniform(0, 200, 2)
        rows.append(_row(x, y, x + 10, y + 10, int(rng.integers(NC)), 0.1, fmt))
    return [rows[i] for i in rng.permutation(len(rows))]


@pytest.mark.parametrize("fmt", ["yolov5", "yolov8"])
def test_decode_finds_the_known_boxes(fmt, rng):
    post = DetectionPostprocess(format=fmt, conf_threshold=0.25, iou_threshold=0.45)
    empty = np.zeros(4 + NC + (fmt == "yolov5"), np.float32)  # zero scores: never detected
    out = _output([_scene(fmt, rng), [_row(0, 0, 8, 8, 1, 0.5, fmt)] + [empty] * 25], fmt)
    assert out.shape == ((2, 26, 5 + NC) if fmt == "yolov5" else (2, 4 + NC, 26))
    first, second = decode(out, post)
    np.testing.assert_allclose(first.boxes, [o[:4] for o in OBJECTS], atol=1e-4)
    np.testing.assert_allclose(first.scores, [o[5] for o in OBJECTS], atol=1e-6)
    assert first.class_ids.tolist() == [o[4] for o in OBJECTS]
    assert first.boxes.dtype == np.float32 and first.class_ids.dtype == np.int64
    assert second.class_ids.tolist() == [1] and second.boxes.tolist() == [[0, 0, 8, 8]]  # decoded on its own


def test_yolov5_score_is_objectness_times_class():
    row = _row(0, 0, 10, 10, 1, 0.45, "yolov5", obj=0.5)  # class prob 0.9, objectness 0.5
    out = _output([[row]], "yolov5")
    assert decode(out, DetectionPostprocess(format="yolov5", conf_threshold=0.4))[0].scores.tolist() == \
        pytest.approx([0.45])
    assert len(decode(out, DetectionPostprocess(format="yolov5", conf_threshold=0.5))[0].scores) == 0


@pytest.mark.parametrize("fmt", ["yolov5", "yolov8"])
def test_class_aware_and_agnostic(fmt):
    rows = [_row(0, 0, 10, 10, 0, 0.9, fmt), _row(1, 0, 11, 10, 1, 0.8, fmt)]  # IoU 0.82, other class
    out = _output([rows], fmt)
    assert decode(out, DetectionPostprocess(format=fmt))[0].class_ids.tolist() == [0, 1]
    assert decode(out, DetectionPostprocess(format=fmt, agnostic=True))[0].class_ids.tolist() == [0]


def test_max_det_and_max_nms(rng):
    rows = [_row(i * 20, 0, i * 20 + 10, 10, 0, 0.3 + i * 0.01, "yolov8") for i in range(30)]  # disjoint
    out = _output([rows], "yolov8")
    got = decode(out, DetectionPostprocess(format="yolov8", max_det=5))[0]
    assert got.scores.tolist() == pytest.approx([0.59, 0.58, 0.57, 0.56, 0.55])
    got = decode(out, DetectionPostprocess(format="yolov8", max_nms=3))[0]
    assert len(got.scores) == 3 and got.scores[0] == pytest.approx(0.59)


def test_candidates_keep_best_class_and_threshold():
    rows = [_row(0, 0, 4, 4, 2, 0.7, "yolov8"), _row(0, 0, 4, 4, 1, 0.2, "yolov8")]
    c = candidates(_output([rows], "yolov8"), "yolov8", 0.25)[0]
    assert c.class_ids.tolist() == [2] and c.boxes.tolist() == [[0, 0, 4, 4]]


def test_bad_outputs_are_named():
    post = DetectionPostprocess(format="yolov5")
    with pytest.raises(RunError) as info:
        decode(np.zeros((2, 10), np.float32), post)
    assert info.value.code == "HYB-408" and "rank 3" in info.value.message
    with pytest.raises(RunError) as info:
        decode(np.zeros((1, 3, 100), np.float32), DetectionPostprocess(format="yolov8"))
    assert info.value.code == "HYB-408" and "yolov8" in info.value.message


def test_num_classes_from_shapes():
    assert num_classes((1, 25200, 85), "yolov5") == 80
    assert num_classes(("N", 84, 8400), "yolov8") == 80
    assert num_classes(("N", "C", 8400), "yolov8") is None
    assert num_classes(None, "yolov5") is None
