"""The quantization config: the seed's keys, validated once into a frozen record (HYB-601)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hybrid.errors import QuantizationError

__all__ = ["MODES", "Budget", "QuantConfig", "auto_activation", "parse_config"]

MODES = ("dynamic", "static", "fp16", "bf16")
INT_DTYPES = ("int8", "uint8")
ACTIVATION_DTYPES = ("auto", *INT_DTYPES)
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
CALIBRATION_CHOICES = ("auto", *CALIBRATION_METHODS)
FORMATS = ("qdq", "qoperator")
BUDGET_LIMITS = ("min_cosine", "min_snr_db", "min_top1_agreement", "max_abs_error")
BUDGET_KEYS = (*BUDGET_LIMITS, "outputs", "on_unmet")
ON_UNMET = ("float", "raise")


@dataclass(frozen=True, slots=True)
class Budget:
    """The accuracy a quantized model must keep against fp32 (``quant_config['accuracy']``).

    Attributes:
        min_cosine: Lowest per-sample cosine similarity allowed, over every checked output.
        min_snr_db: Lowest signal-to-noise ratio (dB) allowed.
        min_top1_agreement: Lowest share of samples whose top-1 class matches fp32 (classifiers).
        max_abs_error: Largest absolute difference allowed.
        outputs: Outputs the budget applies to (None: all).
        on_unmet: When no int8 model meets the budget (only float does): 'float' returns the float
            model (the report says so, with the best int8 figures), 'raise' raises HYB-605.
    """

    min_cosine: float | None = None
    min_snr_db: float | None = None
    min_top1_agreement: float | None = None
    max_abs_error: float | None = None
    outputs: tuple[str, ...] | None = None
    on_unmet: str = "float"


@dataclass(frozen=True, slots=True)
class QuantConfig:
    """A validated quantization config. See :func:`hybrid.quantize` for what each key does."""

    quant_mode: str
    activation_dtype: str = "auto"
    weight_dtype: str = "int8"
    per_channel: bool = True
    calibration_dataset: Any = None
    calibration_method: str = "auto"
    num_calibration_samples: int = 64
    num_eval_samples: int = 16
    quant_format: str = "qdq"
    reduce_range: bool = False
    op_types: tuple[str, ...] | None = None
    nodes_to_exclude: tuple[str, ...] = ()
    accuracy: Budget | None = None
    preprocess: bool = True
    progress: bool | None = None
    speed_check: bool = False
    extra_options: dict[str, Any] = field(default_factory=dict)


def _err(key: str, expected: str, got: Any) -> QuantizationError:
    return QuantizationError("HYB-601", f"quant_config[{key!r}]: expected {expected}, got {got!r}"[:400],
                             "see hybrid.quantize's docstring or docs/torch-and-quantization.md for the keys")


def _choice(cfg: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = cfg.get(key, default)
    if not isinstance(value, str) or value.lower() not in choices:
        raise _err(key, f"one of {list(choices)}", value)
    return value.lower()


def _flag(cfg: Mapping[str, Any], key: str, default: bool | None) -> bool | None:
    value = cfg.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise _err(key, "True or False", value)
    return value


def _count(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _err(key, "an int >= 1", value)
    return value


def _names(cfg: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise _err(key, "a list of names", value)
    return tuple(value)


def _budget(value: Any) -> Budget | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _err("accuracy", "a mapping such as {'min_cosine': 0.99}", value)
    unknown = sorted(set(value) - set(BUDGET_KEYS))
    if unknown:
        raise QuantizationError("HYB-601", f"quant_config['accuracy']: unknown keys {unknown}; valid keys: "
                                f"{list(BUDGET_KEYS)}", "e.g. {'accuracy': {'min_cosine': 0.99}}")
    nums: dict[str, float] = {}
    for key in BUDGET_LIMITS:
        if key in value:
            v = value[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise _err(f"accuracy.{key}", "a number", v)
            nums[key] = float(v)
    if not nums:
        raise QuantizationError("HYB-601", "quant_config['accuracy'] sets no limit", "give min_cosine, min_snr_db, "
                                "min_top1_agreement or max_abs_error")
    outputs = value.get("outputs")
    if outputs is not None and (isinstance(outputs, str) or not all(isinstance(o, str) for o in outputs)):
        raise _err("accuracy.outputs", "a list of output names", outputs)
    on_unmet = value.get("on_unmet", "float")
    if on_unmet not in ON_UNMET:
        raise _err("accuracy.on_unmet", f"one of {list(ON_UNMET)}", on_unmet)
    return Budget(**nums, outputs=tuple(outputs) if outputs is not None else None, on_unmet=on_unmet)


def _check_dtypes(mode: str, activation: str, weight: str) -> None:
    """Refuse activation dtypes ONNX Runtime's quantizer cannot give, rather than quietly use another."""
    if mode == "dynamic" and activation == "int8":
        # quantize_dynamic hard-codes uint8 (DynamicQuantizeLinear has no int8 form); its int8 path
        # through ONNXQuantizer outputs zeros on ORT 1.32 and OpenVINO alike
        raise QuantizationError("HYB-601", "quant_config['activation_dtype']: 'int8' cannot be honoured with "
                                "quant_mode 'dynamic': activations quantized at run time are uint8 "
                                "(ONNX's DynamicQuantizeLinear)",
                                "for int8 activations use quant_mode 'static' with a calibration_dataset (calibrated "
                                "ranges); to stay dynamic, leave activation_dtype out (or 'uint8')")
    if mode in ("static", "dynamic") and activation == "int8" and weight == "uint8":
        raise QuantizationError("HYB-601", "quant_config: activation_dtype 'int8' with weight_dtype 'uint8' is not a "
                                "combination ONNX Runtime's quantizer supports",
                                "use weight_dtype 'int8' (the default), or activation_dtype 'uint8' with uint8 weights")


def auto_activation(cfg: QuantConfig) -> str:
    """The activation dtype of a plain quantization: the one asked for, else int8 (uint8 with uint8 weights)."""
    if cfg.activation_dtype != "auto":
        return cfg.activation_dtype
    return "uint8" if cfg.weight_dtype == "uint8" else "int8"


_KEYS = ("quant_mode", "activation_dtype", "weight_dtype", "per_channel", "calibration_dataset",
         "calibration_method", "num_calibration_samples", "num_eval_samples", "quant_format", "reduce_range",
         "op_types", "nodes_to_exclude", "accuracy", "preprocess", "progress", "extra_options", "speed_check")


def parse_config(config: Mapping[str, Any] | None) -> QuantConfig:
    """Validate a ``quant_config`` mapping.

    ``quant_mode`` defaults to 'static' when a calibration dataset is given, else 'dynamic'.

    Raises:
        QuantizationError: HYB-601 naming the key, what it accepts and what was given.
    """
    if not isinstance(config, (Mapping, type(None))):
        raise QuantizationError("HYB-601", f"quant_config: expected a mapping, got {type(config).__name__}",
                                "e.g. hybrid.quantize(model, {'quant_mode': 'dynamic'})")
    cfg = dict(config or {})
    unknown = sorted(set(cfg) - set(_KEYS))
    if unknown:
        raise QuantizationError("HYB-601", f"quant_config: unknown keys {unknown}; valid keys: {list(_KEYS)}",
                                "check the spelling")
    data = cfg.get("calibration_dataset")
    mode = _choice(cfg, "quant_mode", MODES, "static" if data is not None else "dynamic")
    if data is not None and (isinstance(data, (str, bytes)) or not hasattr(data, "__iter__")):
        raise _err("calibration_dataset", "an iterable of arrays, dicts or tensors (a DataLoader works)",
                   type(data).__name__)
    extra = cfg.get("extra_options") or {}
    if not isinstance(extra, Mapping):
        raise _err("extra_options", "a mapping passed to onnxruntime.quantization", extra)
    budget = _budget(cfg.get("accuracy"))
    activation = _choice(cfg, "activation_dtype", ACTIVATION_DTYPES, "auto")
    weight = _choice(cfg, "weight_dtype", INT_DTYPES, "int8")
    _check_dtypes(mode, activation, weight)
    return QuantConfig(
        quant_mode=mode,
        activation_dtype=activation,
        weight_dtype=weight,
        per_channel=bool(_flag(cfg, "per_channel", True)),
        calibration_dataset=data,
        calibration_method=_choice(cfg, "calibration_method", CALIBRATION_CHOICES, "auto"),
        num_calibration_samples=_count(cfg, "num_calibration_samples", 64),
        num_eval_samples=_count(cfg, "num_eval_samples", 16),
        quant_format=_choice(cfg, "quant_format", FORMATS, "qdq"),
        reduce_range=bool(_flag(cfg, "reduce_range", False)),
        op_types=_names(cfg, "op_types"),
        nodes_to_exclude=_names(cfg, "nodes_to_exclude") or (),
        accuracy=budget,
        preprocess=bool(_flag(cfg, "preprocess", True)),
        progress=_flag(cfg, "progress", None),
        speed_check=bool(_flag(cfg, "speed_check", budget is not None and mode in ("static", "dynamic"))),
        extra_options=dict(extra),
    )
