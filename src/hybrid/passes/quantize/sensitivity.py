"""Accuracy-aware quantization: measure each layer's sensitivity, keep the worst ones in float.

Sensitivity is measured, not guessed: each candidate layer is quantized on its own (everything else
float) and compared with fp32 on the held-back samples; its score is ``1 - min cosine``. Then the
smallest number k of most sensitive layers whose exclusion meets the budget is found by doubling k
and bisecting (each try is one quantization and one evaluation).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hybrid.errors import QuantizationError
from hybrid.passes.quantize.config import Budget
from hybrid.passes.quantize.data import progress
from hybrid.passes.quantize.engine import Engine
from hybrid.passes.quantize.report import Evaluator, Trial, budget_failures, worst_cosine

__all__ = ["rank_layers", "smallest_exclusion"]

logger = logging.getLogger("hybrid")


def rank_layers(engine: Engine, evaluator: Evaluator, candidates: Sequence[str], budget: Budget | None,
                show: bool | None) -> list[tuple[str, float]]:
    """Score every candidate by quantizing it alone; most sensitive first."""
    scores = []
    with progress("measuring layer sensitivity", len(candidates), show) as bar:
        for name in candidates:
            outputs = evaluator.evaluate(engine.run(only=[name]))
            scores.append((name, max(0.0, 1.0 - worst_cosine(outputs, budget))))
            bar.advance()
    scores.sort(key=lambda s: s[1], reverse=True)
    logger.info("most sensitive layers: %s", ", ".join(f"{n} ({s:.2e})" for n, s in scores[:5]))
    return scores


def smallest_exclusion(engine: Engine, evaluator: Evaluator, ranked: Sequence[str], budget: Budget,
                       show: bool | None) -> Trial:
    """The quantization that keeps the fewest most-sensitive layers in float and meets the budget.

    Raises:
        QuantizationError: HYB-605 when even keeping every ranked layer in float misses the budget.
    """
    tried: dict[int, Trial] = {}

    def attempt(k: int) -> Trial:
        if k not in tried:
            excluded = tuple(ranked[:k])
            data = engine.run(exclude=excluded)
            outputs = evaluator.evaluate(data)
            tried[k] = Trial(excluded, data, outputs, tuple(budget_failures(outputs, budget)))
            bar.advance()
        return tried[k]

    n = len(ranked)
    with progress("searching layers to keep in float", max(1, n.bit_length() * 2), show) as bar:
        lo, k = 0, 1
        while k < n and not attempt(k).ok:
            lo, k = k, k * 2
        k = min(k, n)
        if not attempt(k).ok:
            last = attempt(k)
            raise QuantizationError("HYB-605", f"accuracy budget not met even with all {n} measured layers kept in "
                                    f"float: {'; '.join(last.failures)}",
                                    "relax the budget, use per_channel=True, another calibration_method, or a "
                                    "higher precision (quant_mode 'fp16')")
        hi = k
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if attempt(mid).ok:
                hi = mid
            else:
                lo = mid
    return tried[hi]
