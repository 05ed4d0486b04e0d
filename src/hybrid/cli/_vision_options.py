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

Format = Annotated[str | None, typer.Option("--format", help="Detection output layout: yolov5 or yolov8.",
                                            rich_help_panel=_P)]
Classes = Annotated[Path | None, typer.Option("--classes", help="Text file of class names, one per line.",
                                              rich_help_panel=_P)]
ConfThreshold = Annotated[float | None, typer.Option("--conf-threshold", help="Lowest detection score kept "
                                                     "(default 0.25).", rich_help_panel=_P)]
IouThreshold = Annotated[float | None, typer.Option("--iou-threshold", help="NMS IoU threshold (default 0.45).",
                                                    rich_help_panel=_P)]
MaxDet = Annotated[int | None, typer.Option("--max-det", help="Most detections per frame (default 300).",
                                            rich_help_panel=_P)]
Agnostic = Annotated[bool, typer.Option("--agnostic", help="Class-agnostic NMS.", rich_help_panel=_P)]
Resize = Annotated[str | None, typer.Option("--resize", help="resize (stretch) or letterbox (keep aspect, pad).",
                                            rich_help_panel=_P)]
InputSize = Annotated[str | None, typer.Option("--input-size", help="HEIGHTxWIDTH (or one number) for a model "
                                               "with a dynamic image size.", rich_help_panel=_P)]
Color = Annotated[str | None, typer.Option("--color", help="Channel order the model expects: rgb or bgr.",
                                           rich_help_panel=_P)]
Scale = Annotated[float | None, typer.Option("--scale", help="Pixel scale before mean/std (default 1/255).",
                                             rich_help_panel=_P)]
Mean = Annotated[str | None, typer.Option("--mean", help="Per-channel mean, e.g. 0.485,0.456,0.406.",
                                          rich_help_panel=_P)]
Std = Annotated[str | None, typer.Option("--std", help="Per-channel std, e.g. 0.229,0.224,0.225.",
                                         rich_help_panel=_P)]
TaskOption = Annotated[list[str] | None, typer.Option("--task-option", help="KEY=VALUE for any other task key "
                                                      "(VALUE as JSON, else text); repeatable.",
                                                      rich_help_panel=_P)]


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
