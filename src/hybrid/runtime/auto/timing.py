"""Timing candidates fairly on a shared machine: interleaved blocks, short pauses, medians (DESIGN 4)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["BLOCKS", "TIME_BUDGET_S", "time_candidates", "warm_estimate"]

TIME_BUDGET_S = 1.0  # measuring time per candidate, at most
BLOCKS = 5

def warm_estimate(fn: Callable[[], Any], calls: int = 3, within_s: float = 0.3) -> float:
    """Seconds of the least of up to ``calls`` calls of ``fn`` (fewer once ``within_s`` is spent): one call can be
    a hiccup, and the calls right after a first run can still pay for lazy initialisation."""
    spent: list[float] = []
    while len(spent) < calls and sum(spent) < within_s:
        t0 = time.perf_counter()
        fn()
        spent.append(time.perf_counter() - t0)
    return min(spent)


def time_candidates(runs: Mapping[str, Callable[[], Any]], budget_s: float | None = None,
                    blocks: int = BLOCKS) -> dict[str, float]:
    """Median seconds per call of each candidate, measured interleaved in blocks.

    Each candidate is first called up to 3 times (within 0.3 s) and the least call is its estimate: the
    calls right after a first run still pay for lazy initialisation (OpenVINO compiles kernels for a new
    shape of a dynamic model over its first few calls: 15, 0.6, then 0.3 ms). One more than 3x slower
    than the best estimate is not measured further (it cannot win) and reports its estimate. The
    rest run ``blocks`` rounds in rotated order, each round for about ``budget_s / blocks`` seconds
    per candidate, with a pause between candidates so that ONNX Runtime's spinning threads settle.
    """
    budget_s = TIME_BUDGET_S if budget_s is None else budget_s
    est = {name: warm_estimate(fn) for name, fn in runs.items()}
    best = min(est.values())
    alive = [n for n in runs if est[n] <= 3 * best]
    pause = min(0.02, max(0.001, 2 * best))
    per_block = {n: int(min(50, max(1, budget_s / blocks / max(est[n], 1e-6)))) for n in alive}
    samples: dict[str, list[float]] = {n: [] for n in alive}
    for b in range(blocks):
        order = alive[b % len(alive):] + alive[:b % len(alive)]
        for name in order:
            fn = runs[name]
            for _ in range(per_block[name]):
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
            time.sleep(pause)
    return {n: (statistics.median(samples[n]) if n in samples else est[n]) for n in runs}
