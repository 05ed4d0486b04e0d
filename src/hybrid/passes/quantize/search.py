"""Accuracy- and speed-aware static int8 (QDQ): the fastest model that meets the budget.

1. Recipes: the fully quantized model under each calibration method (minmax, entropy, percentile;
   only the configured one unless ``calibration_method='auto'``) with uint8 activations and int8 ones,
   asymmetric and symmetric (zero point 0); only the configured dtype unless
   ``activation_dtype='auto'``. A method calibrates once; the dtypes share its ranges. Each recipe is
   measured on the held-back samples (and timed, with the speed check on: on x86 ORT runs uint8
   activations in fused QLinearConv kernels where int8 ones at a branch point stay in float Convs);
   the search starts from the most accurate recipe and, when another one is faster, from that too.
2. When none meets the budget, every op the quantizer put in int8 is grouped (``groups``), each group
   is quantized alone to score its sensitivity (``1 - min cosine``), and the fewest most sensitive
   groups whose exclusion meets the budget are found (doubling, then bisecting). The same set grown
   into contiguous float regions (``groups.smooth``) is tried too. Excluding every group is float, so
   a budget can always be met; when only float meets it, ``on_unmet`` decides: return the float model
   or raise HYB-605, with the figures either way.
3. With the speed check on, every candidate that meets the budget is timed against fp32 on ONNX
   Runtime's CPU provider (interleaved); the fastest is returned, or fp32 when no int8 candidate beats
   it. The speed each kept-float group costs is measured against the same model with it quantized.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from hybrid.errors import QuantizationError
from hybrid.passes.quantize import report, speed
from hybrid.passes.quantize.config import CALIBRATION_METHODS, QuantConfig, auto_activation
from hybrid.passes.quantize.data import progress
from hybrid.passes.quantize.engine import Engine
from hybrid.passes.quantize.groups import Group, group_nodes, neighbours, quantized_nodes, smooth
from hybrid.passes.quantize.report import Evaluator, FloatGroup, OutputAccuracy, budget_failures, worst_cosine

__all__ = ["Outcome", "Recipe", "search"]

logger = logging.getLogger("hybrid")

_COSTED_GROUPS = 6  # kept-float groups whose speed cost is measured one by one


@dataclass(frozen=True, slots=True)
class Recipe:
    """A plain quantization recipe: calibration method, activation dtype and extra options."""

    method: str
    activation: str = "int8"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def activations(self) -> str:
        """How activations are quantized, in words."""
        sym = self.activation == "int8" and self.extra.get("ActivationSymmetric", False)
        return f"{self.activation}{' symmetric' if sym else ''} activations"

    @property
    def name(self) -> str:
        """The configuration's name in reports."""
        return f"{self.method}, {self.activations}"


@dataclass(frozen=True, slots=True)
class Trial(report.Trial):
    """A report trial under a recipe, keeping op groups (by label) in float."""

    excluded: frozenset[str]
    recipe: Recipe


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the search returns: ``model`` None means the float model."""

    model: bytes | None
    outputs: tuple[OutputAccuracy, ...]
    recipe: Recipe
    kept: tuple[str, ...] = ()
    float_groups: tuple[FloatGroup, ...] = ()
    sensitivity: tuple[tuple[str, float], ...] = ()
    recipes: tuple[tuple[str, float], ...] = ()
    speedup: float | None = None
    note: str = ""
    trials: int = 0


class _Search:
    def __init__(self, engine: Engine, evaluator: Evaluator, cfg: QuantConfig) -> None:
        assert cfg.accuracy is not None
        self.engine, self.evaluator, self.cfg, self.budget = engine, evaluator, cfg, cfg.accuracy
        self.groups: dict[str, Group] = {}
        self._tried: dict[tuple[str, frozenset[str]], Trial] = {}
        self.runs = 0

    def trial(self, recipe: Recipe, excluded: Iterable[str] = ()) -> Trial:
        key = (recipe.name, frozenset(excluded))
        if key not in self._tried:
            nodes = [n for label in key[1] for n in self.groups[label].nodes]
            data = self.engine.run(exclude=nodes, method=recipe.method, extra=recipe.extra,
                                   activation=recipe.activation)
            self.runs += 1
            outputs = self.evaluator.evaluate(data)
            self._tried[key] = Trial(key[1], data, outputs, tuple(budget_failures(outputs, self.budget)), recipe)
        return self._tried[key]

    def sensitivity(self, recipe: Recipe, group: Group) -> float:
        data = self.engine.run(only=list(group.nodes), method=recipe.method, extra=recipe.extra,
                               activation=recipe.activation)
        self.runs += 1
        return max(0.0, 1.0 - worst_cosine(self.evaluator.evaluate(data), self.budget))

    def tried(self) -> list[Trial]:
        return list(self._tried.values())


def recipes(cfg: QuantConfig) -> list[Recipe]:
    """The plain recipes to measure first (see the module docstring)."""
    methods = CALIBRATION_METHODS if cfg.calibration_method == "auto" else (cfg.calibration_method,)
    # uint8 weights pair with uint8 activations only (ONNX Runtime's quantizer refuses int8 with them)
    both = cfg.activation_dtype == "auto" and cfg.weight_dtype == "int8"
    dtypes = ("uint8", "int8") if both else (auto_activation(cfg),)
    out = []
    for method in methods:
        for dtype in dtypes:
            fixed = "ActivationSymmetric" in cfg.extra_options or dtype != "int8"
            for sym in (None,) if fixed else (False, True):
                extra = dict(cfg.extra_options)
                if sym is not None:
                    extra["ActivationSymmetric"] = sym
                out.append(Recipe(method, dtype, extra))
    return out


def search(engine: Engine, evaluator: Evaluator, cfg: QuantConfig, fp32: bytes) -> Outcome:
    """Find the fastest int8 model meeting ``cfg.accuracy`` (see the module docstring).

    Raises:
        QuantizationError: HYB-605 when only float meets the budget and ``on_unmet`` is 'raise'.
    """
    s = _Search(engine, evaluator, cfg)
    full: list[Trial] = []
    failed: list[QuantizationError] = []
    for r in recipes(cfg):
        try:
            full.append(s.trial(r))
        except QuantizationError as e:  # e.g. a histogram calibrator with no tensor to calibrate
            logger.info("recipe %s failed: %s", r.name, e.message)
            failed.append(e)
    if not full:
        raise failed[0]
    full.sort(key=lambda t: worst_cosine(t.outputs, s.budget), reverse=True)
    measured = tuple((t.recipe.name, worst_cosine(t.outputs, s.budget)) for t in full)
    best = full[0]
    bases = [best]
    if cfg.speed_check and len(full) > 1:
        times = speed.TIMER({str(i): t.model for i, t in enumerate(full)}, evaluator.samples[0])
        fastest = full[min(range(len(full)), key=lambda i: times[str(i)])]
        logger.info("recipes (min cosine, ms): %s", "; ".join(f"{t.recipe.name} ({worst_cosine(t.outputs):.5f}, "
                                                              f"{times[str(i)]:.2f})" for i, t in enumerate(full)))
        if fastest is not best:
            bases.append(fastest)
    finalists = [t for t in full if t.ok]
    ranked: list[tuple[str, float]] = []
    all_groups: list[Group] = []
    for base in bases:
        if base.ok:
            continue
        groups, scored = _search_from(s, base, cfg, finalists)
        if base is best:
            all_groups, ranked = groups, scored
    scores = dict(ranked)
    if not finalists:
        return _unmet(s, best, measured, tuple(ranked), len(all_groups))
    if not cfg.speed_check:
        chosen = min(finalists, key=lambda t: len(t.excluded))
        return _outcome(s, chosen, measured, tuple(ranked), scores, None, {})
    times = speed.TIMER({"fp32": fp32, **{str(i): t.model for i, t in enumerate(finalists)}}, evaluator.samples[0])
    i_best = min(range(len(finalists)), key=lambda i: times[str(i)])
    chosen = finalists[i_best]
    ratio = times["fp32"] / times[str(i_best)]
    if ratio < speed.MIN_SPEEDUP:
        note = (f"returned fp32: the fastest int8 model that meets the budget ({chosen.recipe.name}, "
                f"{len(chosen.excluded)} groups in float, cosine {worst_cosine(chosen.outputs, s.budget):.5f}) "
                f"runs at {ratio:.2f}x fp32 on ONNX Runtime's CPU provider (int8 is returned from "
                f"{speed.MIN_SPEEDUP:.2f}x)")
        logger.warning("%s", note)
        return Outcome(None, evaluator.evaluate(fp32), chosen.recipe, recipes=measured, sensitivity=tuple(ranked),
                       speedup=1.0, note=note, trials=s.runs,
                       float_groups=_float_groups(s, chosen, scores, "float", {}))
    costs = _costs(s, chosen, scores, evaluator) if chosen.excluded else {}
    return _outcome(s, chosen, measured, tuple(ranked), scores, ratio, costs)


def _search_from(s: _Search, base: Trial, cfg: QuantConfig,
                 finalists: list[Trial]) -> tuple[list[Group], list[tuple[str, float]]]:
    """Rank the op groups of ``base`` by sensitivity and add the fewest kept in float to ``finalists``.

    The fewest most sensitive groups kept in float that meet the budget, and the same grown into
    contiguous regions.
    """
    groups = group_nodes(s.engine.proto, quantized_nodes(s.engine.proto, onnx.load_from_string(base.model)))
    s.groups.update({g.label: g for g in groups})
    ranked = []
    with progress(f"measuring sensitivity ({base.recipe.name})", len(groups), cfg.progress) as bar:
        for g in groups:
            ranked.append((g.label, s.sensitivity(base.recipe, g)))
            bar.advance()
    ranked.sort(key=lambda r: r[1], reverse=True)
    logger.info("most sensitive groups: %s", ", ".join(f"{n} ({v:.2e})" for n, v in ranked[:5]))
    k = _smallest_k(s, base.recipe, [n for n, _ in ranked])
    if k is not None:
        top = s.trial(base.recipe, [n for n, _ in ranked[:k]])
        finalists.append(top)
        grown = smooth(groups, neighbours(s.engine.proto, groups), top.excluded)
        if grown != top.excluded and len(grown) < len(groups):
            region = s.trial(base.recipe, grown)
            if region.ok:
                finalists.append(region)
    return groups, ranked


def _smallest_k(s: _Search, recipe: Recipe, ranked: Sequence[str]) -> int | None:
    """The fewest most sensitive groups to keep in float that meet the budget (< all of them), or None."""
    n = len(ranked)
    lo, k = 0, 1
    while k < n and not s.trial(recipe, ranked[:k]).ok:
        lo, k = k, k * 2
    k = min(k, n)
    if k >= n or not s.trial(recipe, ranked[:k]).ok:
        # every group in float is the float model: only say int8 works when fewer do
        if n > 1 and s.trial(recipe, ranked[: n - 1]).ok:
            lo, k = max(lo, 0), n - 1
        else:
            return None
    hi = k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if s.trial(recipe, ranked[:mid]).ok:
            hi = mid
        else:
            lo = mid
    return hi


def _costs(s: _Search, chosen: Trial, scores: dict[str, float], evaluator: Evaluator) -> dict[str, float]:
    """Speed cost of each of the most sensitive kept groups.

    The returned model against itself with that group quantized (timed together, interleaved).
    """
    kept = sorted(chosen.excluded, key=lambda g: scores.get(g, 0.0), reverse=True)[:_COSTED_GROUPS]
    variants = {g: s.trial(chosen.recipe, chosen.excluded - {g}).model for g in kept}
    times = speed.TIMER({"chosen": chosen.model, **variants}, evaluator.samples[0])
    return {g: times["chosen"] / times[g] for g in kept}


def _float_groups(s: _Search, trial: Trial, scores: dict[str, float], reason: str | None,
                  costs: dict[str, float]) -> tuple[FloatGroup, ...]:
    labels = trial.excluded if reason != "float" else set(s.groups)
    ordered = sorted(labels, key=lambda g: scores.get(g, 0.0), reverse=True)
    budget_set = _top_set(trial, scores)
    out = []
    for label in ordered:
        g = s.groups[label]
        why = reason or ("budget" if label in budget_set else "region")
        out.append(FloatGroup(label, g.nodes, g.kind, why, scores.get(label, 0.0), costs.get(label)))
    return tuple(out)


def _top_set(trial: Trial, scores: dict[str, float]) -> set[str]:
    # the groups of a grown region that are also among the most sensitive ones
    ranked = sorted(scores, key=scores.__getitem__, reverse=True)
    k = 0
    while k < len(ranked) and ranked[k] in trial.excluded:
        k += 1
    return set(ranked[:k])


def _outcome(s: _Search, chosen: Trial, measured: tuple[tuple[str, float], ...],
             ranked: tuple[tuple[str, float], ...], scores: dict[str, float], ratio: float | None,
             costs: dict[str, float]) -> Outcome:
    groups = _float_groups(s, chosen, scores, None, costs)
    return Outcome(chosen.model, chosen.outputs, chosen.recipe, kept=tuple(g.label for g in groups),
                   float_groups=groups, sensitivity=ranked, recipes=measured, speedup=ratio, trials=s.runs)


def _unmet(s: _Search, best: Trial, measured: tuple[tuple[str, float], ...], ranked: tuple[tuple[str, float], ...],
           n_groups: int) -> Outcome:
    partial = [t for t in s.tried() if len(t.excluded) < max(n_groups, 1)]
    closest = max(partial, key=lambda t: worst_cosine(t.outputs, s.budget), default=best)
    figures = (f"fully quantized ({best.recipe.name}): {'; '.join(best.failures)}; closest int8 model "
               f"({len(closest.excluded)} of {n_groups} op groups in float): "
               f"{'; '.join(closest.failures) or 'met'}")
    note = f"only float meets the accuracy budget: {figures}"
    if s.budget.on_unmet == "raise":
        raise QuantizationError("HYB-605", note[:900], "relax the budget, or pass accuracy={'on_unmet': 'float'} to "
                                "get the float model back, or use quant_mode 'fp16'")
    logger.warning("%s; returning the float model", note)
    scores = dict(ranked)
    groups = tuple(FloatGroup(g.label, g.nodes, g.kind, "float", scores.get(g.label, 0.0))
                   for g in sorted(s.groups.values(), key=lambda g: scores.get(g.label, 0.0), reverse=True))
    return Outcome(None, (), best.recipe, kept=tuple(g.label for g in groups), float_groups=groups,
                   sensitivity=ranked, recipes=measured, note=note, trials=s.runs)
