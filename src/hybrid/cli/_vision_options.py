"""The task options of ``pyasc bundle create`` (``--format``, ``--classes``, ...), turned into ``task_options``.

They declare a vision bundle's pre- and postprocessing (see ``hybrid.vision.spec`` and docs/vision.md);
``--task-option KEY=VALUE`` reaches every other key (``--task-option top_k=3``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from hybrid.errors import BundleError

__all__ = ["task_options"]

_P = "Task options (--task detection|classification)"


def _option(flag: str, text: str) -> Any:
    """A task option of ``flag``, shown under the task options' panel of ``--help``."""
    return typer.Option(flag, help=text, rich_help_panel=_P)


Format = Annotated[str | None, _option("--format", "Detection output layout: yolov5 or yolov8.")]
Classes = Annotated[Path | None, _option("--classes", "Text file of class names, one per line.")]
ConfThreshold = Annotated[float | None, _option("--conf-threshold", "Lowest detection score kept (default 0.25).")]
IouThreshold = Annotated[float | None, _option("--iou-threshold", "NMS IoU threshold (default 0.45).")]
MaxDet = Annotated[int | None, _option("--max-det", "Most detections per frame (default 300).")]
Agnostic = Annotated[bool, _option("--agnostic", "Class-agnostic NMS.")]
Resize = Annotated[str | None, _option("--resize", "resize (stretch) or letterbox (keep aspect, pad).")]
InputSize = Annotated[str | None, _option("--input-size", "HEIGHTxWIDTH (or one number) for a model with a dynamic "
                                          "image size.")]
Color = Annotated[str | None, _option("--color", "Channel order the model expects: rgb or bgr.")]
Scale = Annotated[float | None, _option("--scale", "Pixel scale before mean/std (default 1/255).")]
Mean = Annotated[str | None, _option("--mean", "Per-channel mean, e.g. 0.485,0.456,0.406.")]
Std = Annotated[str | None, _option("--std", "Per-channel std, e.g. 0.229,0.224,0.225.")]
TaskOption = Annotated[list[str] | None, _option("--task-option", "KEY=VALUE for any other task key (VALUE as JSON, "
                                                 "else text); repeatable.")]


def _bad(what: str, value: str, hint: str) -> BundleError:
    return BundleError("HYB-502", f"{what}: cannot read {value!r}", hint)


def _floats(what: str, text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise _bad(what, text, "give numbers separated by commas, e.g. 0.485,0.456,0.406") from e


def _size(text: str) -> list[int]:
    if not re.fullmatch(r"\d+([xX,]\d+)?", text.strip()):
        raise _bad("--input-size", text, "give HEIGHTxWIDTH (480x640) or one number (640)")
    values = [int(p) for p in re.split(r"[xX,]", text.strip())]
    return values * 2 if len(values) == 1 else values


def task_options(fmt: str | None = None, classes: Path | None = None, conf_threshold: float | None = None,
                 iou_threshold: float | None = None, max_det: int | None = None, agnostic: bool = False,
                 resize: str | None = None, input_size: str | None = None, color: str | None = None,
                 scale: float | None = None, mean: str | None = None, std: str | None = None,
                 extra: list[str] | None = None) -> dict[str, Any]:
    """The options given on the command line as ``create_bundle(task_options=...)`` (only those given).

    Raises:
        BundleError: HYB-502 for a value that does not parse; the keys are checked by create_bundle.
    """
    out: dict[str, Any] = {}
    for key, value in (("format", fmt), ("classes", classes), ("conf_threshold", conf_threshold),
                       ("iou_threshold", iou_threshold), ("max_det", max_det), ("resize", resize),
                       ("color", color), ("scale", scale)):
        if value is not None:
            out[key] = str(value) if isinstance(value, Path) else value
    if agnostic:
        out["agnostic"] = True
    if input_size is not None:
        out["size"] = _size(input_size)
    if mean is not None:
        out["mean"] = _floats("--mean", mean)
    if std is not None:
        out["std"] = _floats("--std", std)
    for item in extra or ():
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise _bad("--task-option", item, "write KEY=VALUE, e.g. --task-option top_k=3")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out[key.strip().replace("-", "_")] = value
    return out
