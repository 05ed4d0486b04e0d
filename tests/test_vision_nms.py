"""NMS against a brute-force reference (class-aware and agnostic), and IoU edge cases."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid.vision import box_iou, nms


def iou_ref(a, b) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1]) + max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def nms_ref(boxes, scores, thr, classes=None, max_det=None) -> list[int]:
    """Visit boxes best first (ties: lower index); keep one unless a kept box of its class overlaps it > thr."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    keep: list[int] = []
    for i in order:
        if max_det is not None and len(keep) == max_det:
            break
        if any((classes is None or classes[j] == classes[i]) and iou_ref(boxes[i], boxes[j]) > thr for j in keep):
            continue
        keep.append(i)
    return keep


@st.composite
def box_sets(draw):
    n = draw(st.integers(0, 40))
    coord = st.integers(0, 24).map(float)
    side = st.integers(0, 12).map(float)  # zero-area boxes included
    boxes = []
    for _ in range(n):
        x, y, w, h = draw(coord), draw(coord), draw(side), draw(side)
        boxes.append([x, y, x + w, y + h])
    scores = draw(st.lists(st.sampled_from([0.1, 0.3, 0.5, 0.7, 0.9, 0.95]), min_size=n, max_size=n))  # ties
    classes = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    return boxes, scores, classes


@settings(max_examples=300, deadline=None)
@given(data=box_sets(), thr=st.sampled_from([0.0, 0.1, 0.3, 0.45, 0.5, 0.7, 1.0]),
       max_det=st.one_of(st.none(), st.integers(1, 8)))
def test_nms_equals_brute_force(data, thr, max_det):
    boxes, scores, classes = data
    b, s, c = np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(scores), np.asarray(classes)
    assert nms(b, s, thr, None, max_det).tolist() == nms_ref(boxes, scores, thr, None, max_det)
    assert nms(b, s, thr, c, max_det).tolist() == nms_ref(boxes, scores, thr, classes, max_det)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(*[st.floats(-1e3, 1e3, allow_nan=False)] * 4), min_size=1, max_size=20))
def test_box_iou_matches_reference_on_any_floats(raw):
    boxes = np.asarray(raw, np.float64)
    got = box_iou(boxes[0], boxes)
    assert got.tolist() == [iou_ref(boxes[0], b) for b in boxes]
    assert np.all((got >= 0) & (got <= 1))


def test_nms_known_cases():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 10]], np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.95])
    # agnostic: box 3 (best) suppresses 0 (IoU 1) and 1 (IoU 81/119 = 0.68); 2 is apart
    assert nms(boxes, scores, 0.5).tolist() == [3, 2]
    # class-aware: box 1 has its own class and survives
    assert nms(boxes, scores, 0.5, np.array([0, 1, 0, 0])).tolist() == [3, 1, 2]
    # IoU exactly at the threshold is kept (suppression needs IoU above it)
    assert nms(boxes[:2], scores[:2], 81 / 119).tolist() == [0, 1]
    assert nms(boxes, scores, 0.5, max_det=1).tolist() == [3]
    assert nms(np.zeros((0, 4)), np.zeros(0), 0.5).tolist() == []
