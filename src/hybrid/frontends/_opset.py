"""The opset an export writes: what was asked for, converted down from the dynamo exporter's, or said plainly.

torch's dynamo exporter writes opset 18 and newer; asked for an older one, it tries onnxscript's
version converter and, when that cannot convert the model, writes 18 without a word. Here the model
is then converted with ONNX's own version converter, to the opset asked for or else the lowest one
between it and the written one that converts (LayerNormalization, for one, exists from 17 only), each
candidate checked and run against the exporter's model. What cannot be honoured is refused when the
user chose the dynamo exporter, and announced when hybrid chose it (a fallback).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from hybrid.errors import ModelError
from hybrid.passes.quantize.opset import OpsetConversionFailed, convert_opset, default_opset

__all__ = ["OpsetOutcome", "honour_opset"]

logger = logging.getLogger("hybrid")


@dataclass(frozen=True, slots=True)
class OpsetOutcome:
    """The model to keep and the opset it has.

    Attributes:
        model: The exporter's model, converted when that was needed and possible.
        written: Its default-domain opset.
        reason: Why ``written`` is not the opset asked for (empty when it is).
    """

    model: onnx.ModelProto
    written: int
    reason: str = ""


def honour_opset(proto: onnx.ModelProto, requested: int | None, feed: Mapping[str, np.ndarray], *,
                 strict: bool, name: str) -> OpsetOutcome:
    """Bring a dynamo export to ``requested`` (see the module docstring).

    Args:
        proto: The dynamo exporter's model.
        requested: The opset asked for (None: whatever the exporter wrote).
        feed: The example inputs, to check each converted model against ``proto`` on.
        strict: Refuse when ``requested`` cannot be written (the user chose the dynamo exporter);
            otherwise keep the lowest opset reached and warn.
        name: The model's name, for messages.

    Raises:
        ModelError: HYB-210 when ``strict`` and the opset cannot be honoured.
    """
    written = default_opset(proto)
    if requested is None or written == requested:
        return OpsetOutcome(proto, written)
    if requested > written:
        # the dynamo exporter writes what it was asked for from 18 up; an older one never outranks it
        return OpsetOutcome(proto, written, f"the dynamo exporter wrote opset {written}")
    failure = ""
    for version in range(requested, written):
        try:
            converted = convert_opset(proto, version, _inputs_of(proto, feed))
        except OpsetConversionFailed as e:
            failure = failure or str(e)  # the first failure is the one about the opset asked for
            continue
        if version == requested:
            logger.info("converted %s from opset %d to %d with onnx.version_converter", name, written, version)
            return OpsetOutcome(converted, version)
        return _short(converted, version, requested, written, failure, strict=strict, name=name)
    return _short(proto, written, requested, written, failure, strict=strict, name=name)


def _short(model: onnx.ModelProto, reached: int, requested: int, written: int, failure: str, *, strict: bool,
           name: str) -> OpsetOutcome:
    lowest = f"the lowest it converts to is {reached}" if reached < written else "it converts to no older opset"
    reason = (f"the dynamo exporter writes opset {written} and newer, and onnx.version_converter could not convert "
              f"{name} to opset {requested} ({failure}); {lowest}")
    if strict:
        raise ModelError("HYB-210", f"opset_version={requested} cannot be honoured: {reason}"[:900],
                         f"use exporter='torchscript' (opsets 7-20) or exporter='auto' (which writes opset {reached} "
                         f"with a warning when the TorchScript exporter fails), or opset_version={reached}")
    message = f"exported {name} at opset {reached}, not the opset {requested} asked for: {reason}"[:900]
    logger.warning("%s", message)
    warnings.warn(message, UserWarning, stacklevel=5)
    return OpsetOutcome(model, reached, reason)


def _inputs_of(proto: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    # the exporter may drop an input the graph does not use; a feed that does not fit skips the numeric check
    names = [i.name for i in proto.graph.input]
    if not set(names) <= set(feed):
        return None
    return {n: feed[n] for n in names}
