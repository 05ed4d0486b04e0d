"""Non-maximum suppression: greedy, best score first, class-aware or class-agnostic.

The definition (what the tests compare against a brute-force reference): boxes are visited in
descending score order (ties: lower index first); a box is kept unless a kept box of the same class
(any class when agnostic) overlaps it with IoU strictly above the threshold. IoU of two boxes whose
union has no area is 0. Each kept box suppresses the rest in one vectorized step, so the cost is
one row of IoUs per kept box, never a full N x N matrix.
"""

from __future__ import annotations

import numpy as np

__all__ = ["box_iou", "nms"]


def box_iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one xyxy box with each of ``boxes`` (K, 4), in float64."""
    iw = np.maximum(0.0, np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]))
    ih = np.maximum(0.0, np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]))
    inter = iw * ih
    area = max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])
    areas = np.maximum(0.0, boxes[:, 2] - boxes[:, 0]) * np.maximum(0.0, boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    out = np.zeros(len(boxes), np.float64)
    np.divide(inter, union, out=out, where=union > 0)
    return out


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, class_ids: np.ndarray | None = None,
        max_det: int | None = None) -> np.ndarray:
    """Indices of the boxes that survive suppression, best score first.

    Args:
        boxes: (N, 4) xyxy.
        scores: (N,).
        iou_threshold: Suppress a box whose IoU with a kept one is above this.
        class_ids: (N,) class per box for class-aware suppression; None: agnostic.
        max_det: Stop after this many kept boxes.
    """
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    scores = np.asarray(scores, np.float64).reshape(-1)
    order = np.argsort(-scores, kind="stable")
    boxes = boxes[order]
    classes = None if class_ids is None else np.asarray(class_ids).reshape(-1)[order]
    suppressed = np.zeros(len(order), bool)
    keep: list[int] = []
    limit = len(order) if max_det is None else max_det
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(i)
        if len(keep) >= limit:
            break
        hit = box_iou(boxes[i], boxes[i + 1:]) > iou_threshold
        if classes is not None:
            hit &= classes[i + 1:] == classes[i]
        suppressed[i + 1:] |= hit
    return order[np.asarray(keep, np.intp)]
