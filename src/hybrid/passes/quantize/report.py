"""The accuracy report every quantization returns: the quantized model against fp32 on held-back samples.

Both models run on ONNX Runtime's CPU provider (the quantizer's own runtime, present wherever hybrid
is). Metrics per output: per-sample cosine similarity (a sample is one row along axis 0), SNR in dB,
the largest absolute error, and for classifier-shaped outputs (``[N, classes]``) the share of samples
whose top-1 class agrees with fp32.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hybrid.errors import QuantizationError
from hybrid.passes.quantize.config import Budget
from hybrid.passes.quantize.opset import failure_hint

__all__ = ["Evaluator", "FloatGroup", "OutputAccuracy", "QuantizationReport", "Trial", "budget_failures",
           "worst_cosine"]


@dataclass(frozen=True, slots=True)
class OutputAccuracy:
    """How one output of the quantized model compares with fp32."""

    name: str
    cosine_min: float
    cosine_mean: float
    snr_db: float
    max_abs_error: float
    top1_agreement: float | None = None

    def line(self) -> str:
        """One line of the report for this output."""
        top1 = "" if self.top1_agreement is None else f", top-1 agreement {self.top1_agreement:.1%}"
        return (f"{self.name}: cosine min {self.cosine_min:.5f} mean {self.cosine_mean:.5f}, SNR {self.snr_db:.1f} dB, "
                f"max abs error {self.max_abs_error:.3g}{top1}")


@dataclass(frozen=True, slots=True)
class FloatGroup:
    """Ops the quantizer would put in int8 that the returned model keeps in float, and why.

    Attributes:
        label: The group's name (its first Conv/Gemm/MatMul, else its first node).
        nodes: Its node names.
        kind: 'se' (a squeeze-excitation block) or its op types joined with '+' ('Conv+HardSwish').
        reason: 'budget' (among the most sensitive groups, needed to meet the accuracy budget),
            'region' (joined a float region so as not to leave an int8 island or a lone int8 Add/pool),
            'float' (the float model was returned: see the report's ``note``).
        sensitivity: ``1 - min cosine`` when this group alone is quantized.
        speed_cost: Measured slowdown of keeping it in float: run time of the returned model over the
            same model with this group quantized (1.10: 10% slower); None when not measured.
    """

    label: str
    nodes: tuple[str, ...]
    kind: str
    reason: str
    sensitivity: float
    speed_cost: float | None = None

    def line(self) -> str:
        """One line of the report for this candidate."""
        cost = "" if self.speed_cost is None else f", costs {self.speed_cost:.2f}x time"
        return (f"{self.label} ({self.kind}, {len(self.nodes)} ops): {self.reason}, "
                f"sensitivity {self.sensitivity:.2e}{cost}")


@dataclass(frozen=True, slots=True)
class QuantizationReport:
    """What a quantization did and what accuracy it kept (``model.metadata['quantization_report']``).

    Attributes:
        mode: 'dynamic', 'static', 'fp16' or 'bf16'.
        scheme: What was applied, in words (dtypes, format, calibration).
        eval_samples: How many samples the comparison used.
        eval_source: 'held-out', 'calibration', 'dataset' or 'synthetic' (see ``data.Samples``).
        outputs: Accuracy per output.
        kept_float: Nodes left in float to meet the budget (accuracy-aware mode), most sensitive first.
        sensitivity: ``(node, 1 - min cosine when only that node is quantized)``, most sensitive first;
            empty unless the sensitivity analysis ran.
        budget: The accuracy budget asked for, if any.
        budget_met: Whether the returned model meets it (None without a budget).
        fp32_bytes: Serialized size of the float model.
        quantized_bytes: Serialized size of the quantized model.
        result: 'quantized', or 'float' when the float model was returned (no int8 model met the
            budget, or none was faster than fp32: ``note`` says which, with the figures).
        note: Why the result is what it is, in words (empty when nothing needs saying).
        opset_conversion: What was done to the model's opset before quantizing (an upgrade to 13 with
            onnx.version_converter, or why it was kept and what that changed); empty when nothing was.
        float_groups: The quantizable op groups kept in float, with the reason and speed cost of each.
        recipes: ``(recipe, min cosine of the fully quantized model)`` for each recipe measured
            (calibration method, symmetric or not), best first; the search starts from the first.
        speedup: Measured speed of the returned model over fp32 on ONNX Runtime's CPU provider
            (None when the speed check did not run).
        trials: Quantizations tried.
    """

    mode: str
    scheme: str
    eval_samples: int
    eval_source: str
    outputs: tuple[OutputAccuracy, ...]
    kept_float: tuple[str, ...] = ()
    sensitivity: tuple[tuple[str, float], ...] = ()
    budget: Budget | None = None
    budget_met: bool | None = None
    fp32_bytes: int = 0
    quantized_bytes: int = 0
    result: str = "quantized"
    note: str = ""
    float_groups: tuple[FloatGroup, ...] = ()
    recipes: tuple[tuple[str, float], ...] = ()
    speedup: float | None = None
    trials: int = 0
    opset_conversion: str = ""

    @property
    def cosine_min(self) -> float:
        """The lowest per-sample cosine over every output."""
        return min((o.cosine_min for o in self.outputs), default=float("nan"))

    def output(self, name: str) -> OutputAccuracy:
        """The accuracy of output ``name``."""
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (JSON-ready)."""
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"quantization: {self.mode} ({self.scheme}); size {self.fp32_bytes / 1e6:.2f} MB -> "
                 f"{self.quantized_bytes / 1e6:.2f} MB",
                 *([self.opset_conversion] if self.opset_conversion else []),
                 f"accuracy against fp32 on {self.eval_samples} {self.eval_source} samples:"]
        lines += [f"  {o.line()}" for o in self.outputs]
        if self.budget is not None:
            lines.append(f"budget {_budget_text(self.budget)}: {'met' if self.budget_met else 'NOT met'}")
        if self.kept_float:
            lines.append(f"kept in float ({len(self.kept_float)}): {', '.join(self.kept_float)}")
        lines += [f"  {g.line()}" for g in self.float_groups]
        if self.speedup is not None:
            lines.append(f"speed vs fp32 (ONNX Runtime CPU): {self.speedup:.2f}x")
        if self.result != "quantized":
            lines.append(f"returned the {self.result} model")
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


def _budget_text(b: Budget) -> str:
    parts = [f"{k}={v}" for k, v in (("min_cosine", b.min_cosine), ("min_snr_db", b.min_snr_db),
                                      ("min_top1_agreement", b.min_top1_agreement),
                                      ("max_abs_error", b.max_abs_error)) if v is not None]
    return ", ".join(parts)


def budget_failures(outputs: Sequence[OutputAccuracy], budget: Budget) -> list[str]:
    """The budget limits these results break, in words (empty: the budget is met)."""
    fails = []
    for o in outputs:
        if budget.outputs is not None and o.name not in budget.outputs:
            continue
        if budget.min_cosine is not None and o.cosine_min < budget.min_cosine:
            fails.append(f"{o.name} cosine {o.cosine_min:.5f} < {budget.min_cosine}")
        if budget.min_snr_db is not None and o.snr_db < budget.min_snr_db:
            fails.append(f"{o.name} SNR {o.snr_db:.1f} dB < {budget.min_snr_db}")
        if (budget.min_top1_agreement is not None and o.top1_agreement is not None
                and o.top1_agreement < budget.min_top1_agreement):
            fails.append(f"{o.name} top-1 agreement {o.top1_agreement:.3f} < {budget.min_top1_agreement}")
        if budget.max_abs_error is not None and o.max_abs_error > budget.max_abs_error:
            fails.append(f"{o.name} max abs error {o.max_abs_error:.3g} > {budget.max_abs_error}")
    return fails


def worst_cosine(outputs: Sequence[OutputAccuracy], budget: Budget | None = None) -> float:
    """The lowest per-sample cosine over the outputs the budget checks."""
    names = budget.outputs if budget is not None else None
    vals = [o.cosine_min for o in outputs if names is None or o.name in names]
    return min(vals, default=1.0)


@dataclass(frozen=True, slots=True)
class Trial:
    """One quantization tried: what it kept in float, the quantized model, and how it compares with fp32.

    Attributes:
        excluded: The nodes or op groups kept in float (the sensitivity search keeps them most sensitive first).
        model: The quantized model, serialized.
        outputs: Its accuracy per output.
        failures: The budget limits it breaks, in words (empty: it meets the budget).
    """

    excluded: Collection[str]
    model: bytes
    outputs: tuple[OutputAccuracy, ...]
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Whether it meets the budget."""
        return not self.failures


class Evaluator:
    """Runs fp32 once on the evaluation samples, then compares candidate models against it."""

    def __init__(self, fp32_bytes: bytes, samples: Sequence[dict[str, np.ndarray]]) -> None:
        self.samples = list(samples)
        session = self._session(fp32_bytes, "the float model")
        self.output_names = [o.name for o in session.get_outputs()]
        self.reference = [session.run(None, feed) for feed in self.samples]

    @staticmethod
    def _session(model_bytes: bytes, what: str) -> Any:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        try:
            return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
        except Exception as e:
            first = str(e).strip().splitlines()[0][:400] if str(e).strip() else type(e).__name__
            raise QuantizationError("HYB-606", f"onnxruntime cannot load {what} for the accuracy check: {first}",
                                    failure_hint(first, "report this model; try another quant_mode meanwhile")) from e

    def evaluate(self, model_bytes: bytes) -> tuple[OutputAccuracy, ...]:
        """Compare a candidate with fp32 on every evaluation sample."""
        if not self.samples:
            return ()
        session = self._session(model_bytes, "the quantized model")
        got = [session.run(None, feed) for feed in self.samples]
        return tuple(_compare(name, [r[i] for r in self.reference], [g[i] for g in got])
                     for i, name in enumerate(self.output_names))


def _rows(arrays: Sequence[np.ndarray]) -> np.ndarray:
    rows = [a.reshape(a.shape[0], -1) if a.ndim >= 2 else a.reshape(1, -1) for a in arrays]
    return np.concatenate(rows).astype(np.float64)


def _compare(name: str, ref: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> OutputAccuracy:
    if not ref or np.asarray(ref[0]).dtype.kind not in "fc":
        return OutputAccuracy(name, 1.0, 1.0, math.inf, 0.0)
    r, g = _rows(ref), _rows(got)
    dot = (r * g).sum(axis=1)
    norms = np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1)
    both_zero = norms == 0
    cos = np.where(both_zero, np.where(np.abs(r - g).max(axis=1) == 0, 1.0, 0.0), dot / np.where(both_zero, 1, norms))
    cos = np.where((r == g).all(axis=1), 1.0, np.minimum(cos, 1.0))  # identical rows: exactly 1, not 1 - 1 ulp
    noise = float(((r - g) ** 2).sum())
    signal = float((r**2).sum())
    snr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal > 0 else -math.inf)
    top1 = None
    if ref[0].ndim == 2 and ref[0].shape[1] > 1:
        top1 = float(np.mean(r.argmax(axis=1) == g.argmax(axis=1)))
    return OutputAccuracy(name, float(cos.min()), float(cos.mean()), snr, float(np.abs(r - g).max()), top1)
