"""``hybrid.quantize``: int8, fp16 and bf16 models that report (and keep) the accuracy they have.

The quantizers are ONNX Runtime's (``onnxruntime.quantization``, ``onnxruntime.transformers.float16``);
what hybrid adds is checked calibration data, an accuracy report against fp32 on samples held back
from calibration, and accuracy-aware quantization that keeps the most sensitive layers in float.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from hybrid.errors import QuantizationError
from hybrid.ir import Model
from hybrid.passes.quantize import speed
from hybrid.passes.quantize.config import Budget, QuantConfig, parse_config
from hybrid.passes.quantize.data import Samples, collect, synthetic
from hybrid.passes.quantize.engine import Engine, workdir
from hybrid.passes.quantize.report import (
    Evaluator,
    FloatGroup,
    OutputAccuracy,
    QuantizationReport,
    budget_failures,
)
from hybrid.passes.quantize.search import Outcome, Recipe, search
from hybrid.passes.quantize.sensitivity import rank_layers, smallest_exclusion

__all__ = ["Budget", "FloatGroup", "OutputAccuracy", "QuantConfig", "QuantizationReport", "quantize"]

logger = logging.getLogger("hybrid")

_SYNTHETIC_SAMPLES = 4


def quantize(model_or_path: Any, quant_config: Mapping[str, Any] | None = None, **overrides: Any) -> Model:
    """Quantize a model and measure what it kept (DESIGN 2.6).

    ``hybrid.quantize(model, {'quant_mode': 'static', 'calibration_dataset': loader,
    'accuracy': {'min_cosine': 0.99}})``

    Keys of ``quant_config`` (keyword arguments override them):
        quant_mode: 'dynamic' (int8 weights, activations quantized at run time), 'static' (int8 with
            calibrated activation ranges), 'fp16' or 'bf16'. Default: 'static' with a
            calibration_dataset, else 'dynamic'.
        activation_dtype / weight_dtype: 'int8' (default) or 'uint8'; activation_dtype 'auto' (the
            default) is int8 (uint8 with uint8 weights), except with an accuracy budget in static QDQ
            mode, where uint8 and int8 (asymmetric and symmetric) are measured. Dynamic mode's
            run-time activations are uint8 (ONNX's DynamicQuantizeLinear): activation_dtype 'int8'
            with quant_mode 'dynamic' is refused (HYB-601), as is int8 activations with uint8 weights.
        per_channel: Per-output-channel weight scales (default True: more accurate, slightly slower).
        calibration_dataset: Any iterable of samples (dicts ``{input: array}``, arrays, torch tensors,
            tuples with one array per input; a torch DataLoader works, trailing labels are dropped).
        calibration_method: 'minmax', 'entropy', 'percentile' or 'auto' (the default: minmax, except
            with an accuracy budget in static QDQ mode, where all three are measured).
        num_calibration_samples: Samples to calibrate on (default 64); the next ``num_eval_samples``
            (default 16) are held back for the accuracy report.
        accuracy: A budget such as ``{'min_cosine': 0.99}`` (also ``min_snr_db``,
            ``min_top1_agreement``, ``max_abs_error``, ``outputs``): the most sensitive op groups are
            kept in float until it is met; ``on_unmet`` ('float', default, or 'raise') says what to
            do when only the float model meets it.
        speed_check: Time the result against fp32 on ONNX Runtime's CPU provider and return fp32
            when int8 is not faster; with a budget, the fastest model that meets it is returned.
            Default: on with an accuracy budget in int8 modes, else off.
        quant_format: 'qdq' (default; standard ONNX, fastest on ORT's CPU kernels, runs on OpenVINO)
            or 'qoperator'.
        op_types, nodes_to_exclude, reduce_range, extra_options: passed to onnxruntime.quantization.
        preprocess: Run ORT's quantization pre-processing first (default True).
        progress: Progress bars (default: only on a terminal).

    A model below opset 13 (the article exports at 11) is upgraded to 13 with ONNX's version converter
    for int8 and bf16 (per-channel Q/DQ and bfloat16 need it), checked against the original; when the
    converter fails, static QDQ falls back to per-tensor weights. The report's ``opset_conversion``
    says which.

    Returns:
        A new model; its report is ``model.metadata['quantization_report']`` (a
        :class:`QuantizationReport`) and, as JSON, the ONNX metadata entry ``hybrid.quantization``.

    Raises:
        QuantizationError: HYB-601 (config), 602 (no samples), 603 (a sample does not fit the model),
            604 (NaN/Inf in a sample), 605 (budget not met), 606 (the quantizer failed).
    """
    cfg = parse_config({**(quant_config or {}), **overrides})
    model = Model.load(model_or_path)
    samples = _samples(cfg, model)
    fp32 = model.to_bytes()
    budget = cfg.accuracy
    with workdir() as scratch:
        check_feed = next(iter((*samples.calibration, *samples.evaluation)), None)
        engine = Engine(model.to_onnx(), cfg, samples.calibration, scratch, check_feed)
        cfg = engine.cfg  # per-tensor after an opset fallback (engine.opset_note says why)
        evaluator = _evaluator(model, samples)
        if budget is not None and evaluator is None:
            raise QuantizationError("HYB-601", "quant_config['accuracy'] needs samples to measure against, and none "
                                    "could be made for this model", "pass a calibration_dataset")
        if budget is not None and cfg.quant_mode == "static" and cfg.quant_format == "qdq":
            assert evaluator is not None
            outcome = search(engine, evaluator, cfg, fp32)
        else:
            outcome = _plain(engine, evaluator, cfg, fp32)
    data = outcome.model if outcome.model is not None else fp32
    outputs = outcome.outputs
    if outcome.model is None and evaluator is not None and not outputs:
        outputs = evaluator.evaluate(fp32)
    report = QuantizationReport(
        mode=cfg.quant_mode, scheme=_scheme(cfg, samples, outcome.recipe),
        eval_samples=len(samples.evaluation) if evaluator else 0,
        eval_source=samples.source if evaluator else "none", outputs=outputs, kept_float=outcome.kept,
        sensitivity=outcome.sensitivity, budget=budget,
        budget_met=None if budget is None else not budget_failures(outputs, budget),
        fp32_bytes=len(fp32), quantized_bytes=len(data), result="quantized" if outcome.model is not None else "float",
        note=outcome.note, float_groups=outcome.float_groups, recipes=outcome.recipes, speedup=outcome.speedup,
        trials=outcome.trials, opset_conversion=engine.opset_note)
    result = Model.load(data)
    result.name = f"{model.name}-{cfg.quant_mode if outcome.model is not None else 'float'}"
    _annotate(result, report)
    logger.info("%s", report)
    return result


def _plain(engine: Engine, evaluator: Evaluator | None, cfg: QuantConfig, fp32: bytes) -> Outcome:
    """One quantization (the configured recipe).

    With a budget (modes other than static QDQ), the most sensitive layers are kept in float; with the speed check, fp32
    is returned if it is faster.
    """
    recipe = Recipe(engine.method, engine.activation, dict(cfg.extra_options))
    data = engine.run()
    outputs = evaluator.evaluate(data) if evaluator else ()
    kept: tuple[str, ...] = ()
    sensitivity: tuple[tuple[str, float], ...] = ()
    budget = cfg.accuracy
    if budget is not None and evaluator is not None and budget_failures(outputs, budget):
        ranked = rank_layers(engine, evaluator, engine.candidates(), budget, cfg.progress)
        sensitivity = tuple(ranked)
        try:
            best = smallest_exclusion(engine, evaluator, [n for n, _ in ranked], budget, cfg.progress)
        except QuantizationError as e:
            if budget.on_unmet == "raise" or e.code != "HYB-605":
                raise
            logger.warning("%s; returning the float model", e.message)
            return Outcome(None, (), recipe, sensitivity=sensitivity, note=f"only float meets the budget: {e.message}")
        data, outputs, kept = best.model, best.outputs, best.excluded
    speedup = None
    if cfg.speed_check and evaluator is not None:
        times = speed.TIMER({"fp32": fp32, "int8": data}, evaluator.samples[0])
        speedup = times["fp32"] / times["int8"]
        if speedup < speed.MIN_SPEEDUP:
            note = (f"returned fp32: the quantized model runs at {speedup:.2f}x fp32 on ONNX Runtime's CPU provider "
                    f"(int8 is returned from {speed.MIN_SPEEDUP:.2f}x; speed_check=False returns it anyway)")
            logger.warning("%s", note)
            return Outcome(None, (), recipe, kept=kept, sensitivity=sensitivity, speedup=1.0, note=note)
    return Outcome(data, outputs, recipe, kept=kept, sensitivity=sensitivity, speedup=speedup)


def _samples(cfg: QuantConfig, model: Model) -> Samples:
    need = cfg.quant_mode == "static"
    if cfg.calibration_dataset is None:
        if need:
            raise QuantizationError("HYB-602", "static quantization needs calibration samples; calibration_dataset "
                                    "is missing", "pass quant_config['calibration_dataset'], or use quant_mode "
                                    "'dynamic'")
        return Samples((), synthetic(model.signature, _SYNTHETIC_SAMPLES), "synthetic")
    return collect(cfg.calibration_dataset, model.signature, n_calibration=cfg.num_calibration_samples,
                   n_eval=cfg.num_eval_samples, need_calibration=need)


def _evaluator(model: Model, samples: Samples) -> Evaluator | None:
    if not samples.evaluation:
        return None
    try:
        return Evaluator(model.to_bytes(), samples.evaluation)
    except QuantizationError:
        if samples.source != "synthetic":
            raise
        # made-up inputs can be out of range for the model (token ids, indices): no report then
        logger.info("the accuracy report needs a calibration_dataset for %s", model.name)
        return None


def _scheme(cfg: QuantConfig, samples: Samples, recipe: Recipe) -> str:
    if cfg.quant_mode in ("fp16", "bf16"):
        return ("float16 weights and compute, float32 inputs/outputs" if cfg.quant_mode == "fp16"
                else "bfloat16 weights (Cast to float32 before use)")
    per = "per-channel" if cfg.per_channel else "per-tensor"
    if cfg.quant_mode == "dynamic":
        return f"{cfg.weight_dtype} {per} weights, uint8 activations quantized at run time"
    return (f"{cfg.quant_format.upper()}, {cfg.weight_dtype} {per} weights, {recipe.activations}, "
            f"{recipe.method} calibration on {len(samples.calibration)} samples")


def _annotate(model: Model, report: QuantizationReport) -> None:
    model.metadata["quantization_report"] = report
    summary = {"mode": report.mode, "scheme": report.scheme, "eval_samples": report.eval_samples,
               "eval_source": report.eval_source, "kept_float": list(report.kept_float), "result": report.result,
               "speedup": report.speedup, "note": report.note, "opset_conversion": report.opset_conversion,
               "outputs": [{"name": o.name, "cosine_min": o.cosine_min, "snr_db": o.snr_db,
                            "max_abs_error": o.max_abs_error, "top1_agreement": o.top1_agreement}
                           for o in report.outputs]}
    proto = model.to_onnx()
    prop = proto.metadata_props.add()
    prop.key, prop.value = "hybrid.quantization", json.dumps(summary, allow_nan=True)
