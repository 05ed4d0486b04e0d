"""Decoding YOLO detection outputs into boxes, scores and classes per image.

Both layouts are the ones the Ultralytics exporters write, with the detect head's own decoding
already in the graph (boxes in input pixels, scores as probabilities):

- ``yolov5``: [batch, boxes, 5 + classes] = cx, cy, w, h, objectness, class scores; a box's score
  for a class is objectness x class score.
- ``yolov8`` (also YOLOv11): [batch, 4 + classes, boxes] = cx, cy, w, h, class scores.

Each box takes its best class; boxes under ``conf_threshold`` are dropped, the best ``max_nms``
candidates go through :func:`hybrid.vision.nms.nms`, and the best ``max_det`` survivors remain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybrid.errors import BundleError, RunError
from hybrid.vision.nms import nms
from hybrid.vision.spec import DetectionPostprocess

__all__ = ["OTHER_FORMAT", "SCORE_SLACK", "RawDetections", "candidates", "check_scores", "decode", "num_classes"]


@dataclass(frozen=True, slots=True)
class RawDetections:
    """One image's detections in model-input pixels: boxes (K, 4) xyxy, scores (K,), class_ids (K,)."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray


def num_classes(shape: tuple[int | str, ...] | None, fmt: str) -> int | None:
    """Classes implied by a static output shape (None when the dimension is dynamic or unknown)."""
    if shape is None or len(shape) != 3:
        return None
    dim = shape[2] if fmt == "yolov5" else shape[1]
    if not isinstance(dim, int):
        return None
    return dim - (5 if fmt == "yolov5" else 4)


SCORE_SLACK = 1e-3
"""How far outside [0, 1] a score may read (float rounding of a sigmoid) before the format is called wrong."""

OTHER_FORMAT = {"yolov5": "yolov8", "yolov8": "yolov5"}
"""The format a YOLO output may be when it is not the declared one (what an error's hint suggests)."""


def check_scores(scores: np.ndarray, output_shape: tuple[int, ...], fmt: str) -> None:
    """Refuse scores that are not probabilities: the output is not in the declared format.

    Read in the wrong layout, a YOLO output's box coordinates (input pixels) land where the scores
    should be: a yolov8 output read as yolov5 answers class '754' with score 13804. Both layouts hold
    probabilities there, so one min and max over the scores tells.

    Raises:
        BundleError: HYB-502 naming the range found and the format to declare.
    """
    if scores.size == 0:
        return
    low, high = float(np.nanmin(scores)), float(np.nanmax(scores))
    if low >= -SCORE_SLACK and high <= 1.0 + SCORE_SLACK:
        return
    raise BundleError("HYB-502", f"output of shape {tuple(output_shape)} read as {fmt} gives scores from {low:.4g} "
                      f"to {high:.4g}; {fmt} scores are probabilities in [0, 1]: this is not a {fmt} output",
                      f"declare the output's format (--format {OTHER_FORMAT.get(fmt, fmt)}?), and export the detect "
                      "head with its sigmoid and box decoding (Ultralytics' ONNX export does both)")


def _rows(output: np.ndarray, fmt: str) -> np.ndarray:
    """The output as [batch, boxes, fields], checked."""
    out = np.asarray(output)
    if out.ndim != 3:
        raise RunError("HYB-408", f"{fmt} output: expected rank 3 [batch, ...], got shape {out.shape}",
                       "check the bundle's declared format and output")
    rows = out if fmt == "yolov5" else out.transpose(0, 2, 1)
    need = 6 if fmt == "yolov5" else 5
    if rows.shape[2] < need:
        raise RunError("HYB-408", f"{fmt} output of shape {out.shape} has {rows.shape[2]} fields per box, "
                       f"expected at least {need}", "check the bundle's declared format (yolov5 or yolov8)")
    return rows


def candidates(output: np.ndarray, fmt: str, conf_threshold: float) -> list[RawDetections]:
    """Per image: boxes above ``conf_threshold`` with their best class (before suppression)."""
    rows = _rows(output, fmt)
    xywh = rows[..., :4].astype(np.float32)
    if fmt == "yolov5":
        obj = rows[..., 4].astype(np.float32)
        cls = rows[..., 5:]
        best = cls.argmax(axis=-1)
        score = obj * np.take_along_axis(cls, best[..., None], axis=-1)[..., 0].astype(np.float32)
    else:
        cls = rows[..., 4:]
        best = cls.argmax(axis=-1)
        score = np.take_along_axis(cls, best[..., None], axis=-1)[..., 0].astype(np.float32)
    check_scores(score, np.shape(output), fmt)
    keep = score > conf_threshold
    out = []
    for i in range(rows.shape[0]):
        k = keep[i]
        c = xywh[i][k]
        half = c[:, 2:4] / 2
        boxes = np.concatenate([c[:, 0:2] - half, c[:, 0:2] + half], axis=1)
        out.append(RawDetections(boxes, score[i][k], best[i][k].astype(np.int64)))
    return out


def decode(output: np.ndarray, post: DetectionPostprocess) -> list[RawDetections]:
    """Detections per image of a batch output: threshold, best class, suppression, ``max_det``."""
    result = []
    for raw in candidates(output, post.format, post.conf_threshold):
        if len(raw.scores) > post.max_nms:
            top = np.argsort(-raw.scores, kind="stable")[:post.max_nms]
            raw = RawDetections(raw.boxes[top], raw.scores[top], raw.class_ids[top])
        keep = nms(raw.boxes, raw.scores, post.iou_threshold, None if post.agnostic else raw.class_ids,
                   post.max_det)
        result.append(RawDetections(raw.boxes[keep], raw.scores[keep], raw.class_ids[keep]))
    return result
