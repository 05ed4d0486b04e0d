"""The task declarations a bundle's manifest carries: ``preprocess`` and ``postprocess``.

A vision bundle says how frames become the model's input (``Preprocess``) and how its output becomes
answers (``DetectionPostprocess`` or ``ClassificationPostprocess``, told apart by ``task``). Both are
plain JSON in ``manifest.json``, validated strictly here. Users write them as one flat set of keys —
``pyasc bundle create --task detection --format yolov8 --classes classes.txt`` or
``create_bundle(..., task='detection', task_options={'format': 'yolov8', 'classes': 'classes.txt'})`` —
which :func:`declare` splits into the two sections and checks against the model's signature.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hybrid.errors import BundleError

__all__ = [
    "TASKS",
    "ClassificationPostprocess",
    "DetectionPostprocess",
    "Postprocess",
    "Preprocess",
    "declare",
    "flat_options",
    "read_classes",
]

TASKS = ("detection", "classification")
MAX_CLASSES = 100_000
_HINT = "see docs/vision.md for the keys a vision bundle declares"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Preprocess(_Strict):
    """How frames (H x W x C pixels, any size) become the model's input tensor.

    Attributes:
        resize: 'resize' stretches the frame to the input size; 'letterbox' keeps its aspect ratio
            and pads the rest with ``pad_value`` (centered).
        size: Input [height, width]; None: the model input's static size.
        pad_value: Pixel value of the letterbox padding (before scaling).
        color: Channel order the model expects, 'rgb' or 'bgr'.
        scale, mean, std: ``(pixel * scale - mean) / std`` per channel.
        layout: 'NCHW' or 'NHWC'; None: read from the input shape (channels of 1 or 3).
        dtype: 'float32', 'float16' or 'uint8'; None: the model input's dtype.
        max_batch: Most frames in one run; None: a static batch dimension, else 16.
    """

    resize: Literal["resize", "letterbox"] = "resize"
    size: list[int] | None = Field(default=None, min_length=2, max_length=2)
    pad_value: float = Field(default=114.0, ge=0.0, le=65535.0)
    color: Literal["rgb", "bgr"] = "rgb"
    scale: float = Field(default=1.0 / 255.0, gt=0.0)
    mean: list[float] = Field(default_factory=lambda: [0.0, 0.0, 0.0], min_length=1, max_length=4)
    std: list[float] = Field(default_factory=lambda: [1.0, 1.0, 1.0], min_length=1, max_length=4)
    layout: Literal["NCHW", "NHWC"] | None = None
    dtype: Literal["float32", "float16", "uint8"] | None = None
    max_batch: int | None = Field(default=None, ge=1, le=4096)

    @field_validator("size")
    @classmethod
    def _check_size(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and not all(1 <= v <= 16384 for v in value):
            raise ValueError(f"size must be [height, width] between 1 and 16384, got {value}")
        return value

    @field_validator("std")
    @classmethod
    def _check_std(cls, value: list[float]) -> list[float]:
        if not all(v > 0 for v in value):
            raise ValueError(f"std must be positive, got {value}")
        return value


class DetectionPostprocess(_Strict):
    """Boxes from a YOLO-style output, filtered and suppressed.

    Attributes:
        format: 'yolov5': output [batch, boxes, 5 + classes] (cx, cy, w, h, objectness, class
            scores); 'yolov8': output [batch, 4 + classes, boxes] (cx, cy, w, h, class scores).
            Scores are probabilities (the exported heads end in a sigmoid), boxes in input pixels.
        conf_threshold: Lowest score kept (objectness times class score for yolov5).
        iou_threshold: Boxes overlapping a better one by more than this are suppressed.
        max_det: Most detections per frame.
        agnostic: Suppress across classes (True) or within each class only (False).
        class_names: Names by class id; None: the ids as text.
        max_nms: Most candidates (best first) that enter suppression.
        output: The output holding the predictions; None: the first.
    """

    task: Literal["detection"] = "detection"
    format: Literal["yolov5", "yolov8"]
    conf_threshold: float = Field(default=0.25, ge=0.0, le=1.0)
    iou_threshold: float = Field(default=0.45, ge=0.0, le=1.0)
    max_det: int = Field(default=300, ge=1, le=100_000)
    agnostic: bool = False
    class_names: list[Annotated[str, Field(max_length=256)]] | None = Field(default=None, min_length=1,
                                                                            max_length=MAX_CLASSES)
    max_nms: int = Field(default=30_000, ge=1, le=1_000_000)
    output: str | None = Field(default=None, max_length=4096)


class ClassificationPostprocess(_Strict):
    """Top-k labels from a [batch, classes] output (logits or probabilities).

    Attributes:
        class_names: Names by class id; None: the ids as text.
        top_k: How many labels each answer carries (a call may ask for another number); None: 5, or
            every class when the model has fewer.
        softmax: Apply a softmax to the output (it holds logits); False: it holds scores already. None
            (the default): read from the graph, applied unless the output comes out of a Softmax or a
            Sigmoid (:func:`hybrid.vision.checks.scores_activation`), so probabilities are never
            softmaxed twice.
        output: The output holding the scores; None: the first.
    """

    task: Literal["classification"] = "classification"
    class_names: list[Annotated[str, Field(max_length=256)]] | None = Field(default=None, min_length=1,
                                                                            max_length=MAX_CLASSES)
    top_k: int | None = Field(default=None, ge=1, le=MAX_CLASSES)
    softmax: bool | None = None
    output: str | None = Field(default=None, max_length=4096)

    @model_validator(mode="after")
    def _top_k_fits(self) -> ClassificationPostprocess:
        if self.class_names is not None and self.top_k is not None and self.top_k > len(self.class_names):
            raise ValueError(f"top_k {self.top_k} exceeds the {len(self.class_names)} class names")
        return self


Postprocess = Annotated[DetectionPostprocess | ClassificationPostprocess, Field(discriminator="task")]

_PRE_KEYS = tuple(Preprocess.model_fields)
_POST_KEYS = {"detection": tuple(k for k in DetectionPostprocess.model_fields if k != "task"),
              "classification": tuple(k for k in ClassificationPostprocess.model_fields if k != "task")}


def read_classes(path: str | os.PathLike) -> list[str]:
    """Class names from a text file, one per line (blank lines skipped).

    Raises:
        BundleError: HYB-502 when the file is missing, unreadable or empty.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BundleError("HYB-502", f"classes: cannot read {str(p)!r} ({type(e).__name__})",
                          "pass a UTF-8 text file with one class name per line") from e
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise BundleError("HYB-502", f"classes: {str(p)!r} holds no class names",
                          "pass a UTF-8 text file with one class name per line")
    return names


def _size(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value, value]
    if isinstance(value, tuple):
        return list(value)
    return value


def _normalized(options: Mapping[str, Any]) -> dict[str, Any]:
    """Flat options with the conveniences resolved: 'classes' (file or list), an int or tuple size."""
    out = dict(options)
    if "classes" in out:
        if "class_names" in out:
            raise BundleError("HYB-502", "task options: both 'classes' and 'class_names' were given",
                              "give one of them")
        classes = out.pop("classes")
        out["class_names"] = read_classes(classes) if isinstance(classes, (str, os.PathLike)) else classes
    if isinstance(out.get("class_names"), tuple):
        out["class_names"] = list(out["class_names"])
    if "size" in out:
        out["size"] = _size(out["size"])
    for key in ("mean", "std"):
        if isinstance(out.get(key), (tuple, int, float)) and not isinstance(out.get(key), bool):
            value = out[key]
            out[key] = list(value) if isinstance(value, tuple) else [value]
    return out


def declare(task: str | None, options: Mapping[str, Any] | None) -> tuple[Preprocess, Postprocess] | None:
    """Validate flat task options and split them into the manifest's two sections.

    Args:
        task: The bundle's task; 'detection' and 'classification' get declarations, any other
            label (or None) gets none and must come without options.
        options: Flat keys of :class:`Preprocess` and the task's postprocess, plus 'classes' (a
            text file or a list of names).

    Returns:
        (preprocess, postprocess), or None for a task that is not a vision task.

    Raises:
        BundleError: HYB-502 naming the key that is unknown or invalid.
    """
    options = dict(options or {})
    if task not in TASKS:
        if options:
            raise BundleError("HYB-502", f"task options {sorted(options)} were given for task {task!r}, which "
                              f"declares no processing", f"use task='detection' or 'classification'; {_HINT}")
        return None
    opts = _normalized(options)
    known = (*_PRE_KEYS, *_POST_KEYS[task])
    unknown = sorted(k for k in opts if k not in known)
    if unknown:
        raise BundleError("HYB-502", f"task options for {task!r}: unknown key(s) {unknown}; valid keys: "
                          f"{sorted([*known, 'classes'])}", _HINT)
    pre = {k: v for k, v in opts.items() if k in _PRE_KEYS}
    post = {k: v for k, v in opts.items() if k not in _PRE_KEYS}
    if task == "detection" and "format" not in post:
        raise BundleError("HYB-502", "task 'detection' needs format='yolov5' or 'yolov8' (the layout of the "
                          "model's output)", "pass --format yolov5|yolov8 (task_options={'format': ...})")
    try:
        post_model: Postprocess = (DetectionPostprocess if task == "detection"
                                   else ClassificationPostprocess).model_validate({"task": task, **post})
        return Preprocess.model_validate(pre), post_model
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or task
        raise BundleError("HYB-502", f"task option {loc!r} for {task!r}: {str(first.get('msg', 'invalid'))[:300]} "
                          f"(got {str(first.get('input'))[:100]})", _HINT) from e


def flat_options(preprocess: Preprocess, postprocess: Postprocess) -> dict[str, Any]:
    """The flat options that :func:`declare` turns back into these two sections."""
    out = preprocess.model_dump(mode="json", exclude_defaults=True)
    out.update(postprocess.model_dump(mode="json", exclude_defaults=True, exclude={"task"}))
    return out
