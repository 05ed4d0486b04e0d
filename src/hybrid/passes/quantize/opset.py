"""The opset a quantized model needs, and converting a model's opset with a check that it still computes the same.

int8 per channel needs ONNX opset 13 (QuantizeLinear/DequantizeLinear gained ``axis`` there) and so does
bfloat16 (the type appeared there); torch's TorchScript exporter, which the article's
``opset_version=11`` selects, writes older opsets. Such a model is upgraded with ONNX's own version
converter before quantizing; when the converter cannot convert it, static QDQ int8 falls back to
per-tensor weights (the one thing opset 11 cannot express), and the report says so either way.

:func:`convert_opset` is also what ``hybrid.export`` uses to honour an opset the dynamo exporter does
not write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from hybrid.errors import QuantizationError, first_line
from hybrid.passes.quantize.config import QuantConfig

__all__ = ["QUANT_MIN_OPSET", "OpsetConversionFailed", "OpsetFit", "convert_opset", "default_opset", "failure_hint",
           "fit_opset"]

QUANT_MIN_OPSET = 13  # QuantizeLinear/DequantizeLinear ``axis`` (per-channel) and the bfloat16 type
# a converted model must compute what the original does: both run on ONNX Runtime's CPU provider, so the
# only differences are an op's kernel changing between opsets (e.g. a decomposed LayerNormalization)
CONVERSION_RTOL = 1e-4  # max |converted - original| relative to max |original|, per output


class OpsetConversionFailed(Exception):
    """The version converter failed, or its model does not check or does not compute the same."""


@dataclass(frozen=True, slots=True)
class OpsetFit:
    """What :func:`fit_opset` did to a model before quantizing it.

    Attributes:
        model: The model to quantize (converted, or the input as it was).
        cfg: The config to quantize with (``per_channel`` off after a failed conversion, static QDQ).
        note: What was done and why, for the report; empty when nothing was needed.
    """

    model: onnx.ModelProto
    cfg: QuantConfig
    note: str = ""


def default_opset(model: onnx.ModelProto) -> int:
    """The default-domain opset version ``model`` imports (0 when it imports none)."""
    return next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)


def fit_opset(model: onnx.ModelProto, cfg: QuantConfig, feed: Mapping[str, np.ndarray] | None) -> OpsetFit:
    """Bring a model below opset 13 up to 13 for int8 and bf16 modes, or fall back (see the module docstring).

    Args:
        model: The float model.
        cfg: The validated config.
        feed: One sample to check the converted model against the original on (None: no numeric check).

    Raises:
        QuantizationError: HYB-606 for bf16 when the conversion fails (bfloat16 has no older form).
    """
    version = default_opset(model)
    if cfg.quant_mode == "fp16" or not 0 < version < QUANT_MIN_OPSET:
        return OpsetFit(model, cfg)
    why = "bfloat16 weights need" if cfg.quant_mode == "bf16" else "per-channel int8 Q/DQ needs"
    try:
        converted = convert_opset(model, QUANT_MIN_OPSET, feed)
    except OpsetConversionFailed as e:
        reason = str(e)
    else:
        return OpsetFit(converted, cfg, f"opset upgraded from {version} to {QUANT_MIN_OPSET} with "
                                        f"onnx.version_converter ({why} opset {QUANT_MIN_OPSET})")
    export_hint = f"export the model at opset_version={QUANT_MIN_OPSET} or newer"
    if cfg.quant_mode == "bf16":
        raise QuantizationError("HYB-606", f"bf16 needs opset {QUANT_MIN_OPSET}; the model is at opset {version} and "
                                f"onnx.version_converter could not upgrade it: {reason}"[:700],
                                f"{export_hint}, or use quant_mode 'fp16'")
    if cfg.quant_mode == "static" and cfg.quant_format == "qdq" and cfg.per_channel:
        note = (f"opset {version} kept and per-tensor weights used: per-channel Q/DQ needs opset {QUANT_MIN_OPSET} "
                f"and onnx.version_converter could not upgrade the model ({reason}); {export_hint} for per-channel")
        return OpsetFit(model, dataclasses.replace(cfg, per_channel=False), note[:700])
    # dynamic int8 and QOperator express per-channel weights without Q/DQ axes: opset 11 serves them
    return OpsetFit(model, cfg, f"opset {version} kept (onnx.version_converter could not upgrade it: {reason})"[:700])


def convert_opset(model: onnx.ModelProto, version: int, feed: Mapping[str, np.ndarray] | None) -> onnx.ModelProto:
    """``model`` converted to the default-domain opset ``version``, checked, and run against the original.

    The converter's output must pass ``onnx.checker`` and, with a ``feed``, give the original's outputs
    on ONNX Runtime within :data:`CONVERSION_RTOL` (skipped when ONNX Runtime cannot run the original).

    Raises:
        OpsetConversionFailed: With the reason (the converter's or the checker's words, or the mismatch).
    """
    from onnx import version_converter  # the module attribute, so tests can stand in a failing converter

    try:
        converted = version_converter.convert_version(model, version)
        onnx.checker.check_model(converted)
    except Exception as e:  # the converter raises RuntimeError/ValidationError with the op it cannot adapt
        raise OpsetConversionFailed(_reason(e)) from e
    if feed is not None:
        _same_outputs(model, converted, feed)
    return converted


def failure_hint(message: str, default: str) -> str:
    """The hint of a HYB-606: the fix for an opset too old for what the quantizer wrote, else ``default``."""
    opset_words = ("Unrecognized attribute: axis", "bfloat16", "opset")
    if any(w in message for w in opset_words):
        return (f"the model's opset is too old for this quantization: export it at opset_version={QUANT_MIN_OPSET} "
                f"or newer (hybrid.export(..., opset_version={QUANT_MIN_OPSET})), or pass per_channel=False")
    return default


def _reason(e: BaseException) -> str:
    # the converter's messages start with the C++ source position: keep what names the op
    text = first_line(e, 400)
    for marker in ("Assertion `false` failed: ", "failed: "):
        if marker in text:
            return text.split(marker, 1)[1]
    return text


def _same_outputs(original: onnx.ModelProto, converted: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        reference = ort.InferenceSession(original.SerializeToString(), so, providers=["CPUExecutionProvider"])
        want = reference.run(None, dict(feed))
    except Exception:  # nothing to compare with (custom ops, a feed it cannot take): the checker's word stands
        return
    try:
        session = ort.InferenceSession(converted.SerializeToString(), so, providers=["CPUExecutionProvider"])
        got = session.run(None, dict(feed))
    except Exception as e:
        raise OpsetConversionFailed(f"the converted model does not run: {first_line(e, 300)}") from e
    for out, w, g in zip(session.get_outputs(), want, got):
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape:
            raise OpsetConversionFailed(f"output {out.name!r} changed shape from {w.shape} to {g.shape}")
        if w.dtype.kind not in "fc":
            if not np.array_equal(w, g):
                raise OpsetConversionFailed(f"output {out.name!r} changed values")
            continue
        if not np.array_equal(np.isnan(w), np.isnan(g)):
            raise OpsetConversionFailed(f"output {out.name!r} has NaN where the original has none, or the reverse")
        w, g = np.nan_to_num(w, nan=0.0), np.nan_to_num(g, nan=0.0)
        scale = float(np.abs(w).max()) if w.size else 0.0
        err = float(np.abs(w.astype(np.float64) - g).max()) if w.size else 0.0
        if not err <= CONVERSION_RTOL * max(scale, 1e-30):
            raise OpsetConversionFailed(f"output {out.name!r} differs from the original by {err:.3g} "
                                        f"(largest value {scale:.3g})")
