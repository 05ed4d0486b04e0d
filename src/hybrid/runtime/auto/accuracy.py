"""The accuracy budget of reduced precisions: what ``compile(precision='auto', accuracy={...})`` holds them to.

A reduced precision (bf16, fp16, int8) passes when every float output keeps ``min_cosine`` and/or
``max_rel_error`` (max |error| over the output's largest magnitude) against fp32, and every other output is
exact. ``accuracy=`` also carries the fp32 check's model-level ``rtol`` and per-output rules (:mod:`.tolerance`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hybrid.errors import ConfigError
from hybrid.runtime.auto.tolerance import OutputRule, cosine_of, float_pairs, output_rules, validated

__all__ = ["ACCURACY_KEYS", "DEFAULT_BUDGET", "Accuracy", "accuracy_failure", "cosine", "parse_accuracy",
           "validate_accuracy"]

ACCURACY_KEYS = ("min_cosine", "max_rel_error")  # the budget of reduced precisions
DEFAULT_BUDGET = {"min_cosine": 0.999}


class _Budget(BaseModel):
    """The accuracy budget of reduced precisions (``compile(precision='auto', accuracy={...})``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    min_cosine: float | None = Field(None, ge=-1.0, le=1.0, description="a number in [-1, 1]", examples=[0.995])
    max_rel_error: float | None = Field(None, ge=0.0, description="a number >= 0", examples=[0.01])


class _AccuracySpec(_Budget):
    """Everything ``compile(accuracy=...)`` takes: the budget, and the fp32 check's ``rtol`` and rules."""

    rtol: float | None = Field(None, ge=0.0, lt=1.0, description="a number in [0, 1)", examples=[1e-2])
    outputs: Any = None  # output name -> rule: checked by output_rules against the model's outputs


@dataclass(frozen=True, slots=True)
class Accuracy:
    """``compile(accuracy=...)`` validated.

    Attributes:
        budget: What a reduced precision must keep against fp32 (None at precision='fp32').
        rtol: The model-level relative tolerance of the fp32 check (None: the configured one).
        rules: Per-output rules of the fp32 check.
    """

    budget: dict[str, float] | None
    rtol: float | None
    rules: dict[str, OutputRule]


def parse_accuracy(accuracy: Mapping[str, Any] | None, precision: str, names: list[str]) -> Accuracy:
    """Validate ``compile(accuracy=...)``.

    The budget keys (``min_cosine``, ``max_rel_error``, reduced precisions only), ``rtol`` (model-level fp32 tolerance)
    and ``outputs`` (per-output rules).

    Raises:
        ConfigError: HYB-101 for an unknown key, HYB-102 for a bad value or a budget at fp32.
    """
    spec = _AccuracySpec() if accuracy is None else validated(_AccuracySpec, accuracy, "accuracy")
    rules = output_rules(spec.outputs, names)
    budget = spec.model_dump(include=set(ACCURACY_KEYS), exclude_none=True)
    if budget and precision == "fp32":
        raise ConfigError("HYB-102", f"accuracy={budget!r} applies to reduced precisions (precision='auto', 'fp16', "
                          "'bf16'), got precision='fp32'",
                          "pass precision='auto' to search reduced precisions within it")
    return Accuracy((budget or dict(DEFAULT_BUDGET)) if precision != "fp32" else None, spec.rtol, rules)


def validate_accuracy(accuracy: Mapping[str, Any] | None) -> dict[str, float]:
    """Check an accuracy budget; return it with floats (the default budget for None).

    Raises:
        ConfigError: HYB-101 for an unknown key, HYB-102 for a value outside its range or an empty budget.
    """
    if accuracy is None:
        return dict(DEFAULT_BUDGET)
    budget = validated(_Budget, accuracy, "accuracy").model_dump(exclude_none=True)
    if not budget:
        raise ConfigError("HYB-102", f"accuracy: expected a budget such as {{'min_cosine': 0.995}}, got {accuracy!r}",
                          "give min_cosine and/or max_rel_error")
    return budget


def accuracy_failure(budget: Mapping[str, float], expected: list[Any], got: list[Any],
                     names: list[str]) -> str | None:
    """Why ``got`` misses the budget against ``expected`` (None: within it).

    Non-float outputs must match exactly; float outputs are held to ``min_cosine`` and ``max_rel_error``.
    """
    if len(got) != len(expected):
        return f"returned {len(got)} outputs, expected {len(expected)}"
    for name, e, g in float_pairs(expected, got, names):
        if e.shape != g.shape:
            return f"output {name!r} has shape {g.shape}, expected {e.shape}"
        if e.dtype.kind not in "fcV":
            if not np.array_equal(e, g):
                return f"output {name!r} ({e.dtype}) differs at {int(np.sum(e != g))} of {e.size} elements"
            continue
        a, b = e.astype(np.float64).ravel(), g.astype(np.float64).ravel()
        if not (np.isfinite(b).all() or np.array_equal(np.isfinite(a), np.isfinite(b))):
            return f"output {name!r} has non-finite values where fp32 has none"
        fin = np.isfinite(a) & np.isfinite(b)
        a, b = a[fin], b[fin]
        if "min_cosine" in budget:
            cos = cosine_of(a, b)
            if cos < budget["min_cosine"]:
                return f"output {name!r} cosine similarity {cos:.6f} < {budget['min_cosine']}"
        if "max_rel_error" in budget:
            scale = float(np.max(np.abs(a))) if a.size else 0.0
            rel = float(np.max(np.abs(a - b))) / max(scale, 1e-30) if a.size else 0.0
            if rel > budget["max_rel_error"]:
                return f"output {name!r} relative error {rel:.3g} > {budget['max_rel_error']}"
    return None


def cosine(expected: list[Any], got: list[Any], names: list[str]) -> float:
    """The smallest cosine similarity over the float outputs (1.0 when there are none)."""
    worst = 1.0
    for _, e, g in float_pairs(expected, got, names):
        if e.dtype.kind in "fcV" and e.shape == g.shape:
            worst = min(worst, cosine_of(e, g))
    return worst
