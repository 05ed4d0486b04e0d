"""Timing candidates fairly on a shared machine: interleaved blocks, short pauses, medians (DESIGN 4)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["BLOCKS", "TIME_BUDGET_S", "time_candidates"]

TIME_BUDGET_S = 1.0  # measuring time per candidate, at most
BLOCKS = 5

def time_candidates(runs: Mapping[str, Callable[[], Any]], budget_s: float | None = None,
                    blocks: int = BLOCKS, first_runs: Mapping[str, float] | None = None) -> dict[str, float]:
    """Median seconds per call of each candidate, measured interleaved in blocks.

    A candidate whose first run (``first_runs``, e.g. the check) took over 10x the fastest one's is
    called once more (a first run also pays for lazy initialisation: torch, OpenVINO) and that warm
    call is its estimate; the others are called up to 3 times to estimate their cost. One more than 3x
    slower than the best estimate is not measured further (it cannot win) and reports its estimate. The
    rest run ``blocks`` rounds in rotated order, each round for about ``budget_s / blocks`` seconds
    per candidate, with a pause between candidates so that ONNX Runtime's spinning threads settle.
    """
    budget_s = TIME_BUDGET_S if budget_s is None else budget_s
    est: dict[str, float] = {}
    first = dict(first_runs or {})
    fastest_first = min((first[n] for n in runs if n in first), default=None)
    for name, fn in runs.items():
        slow_start = fastest_first is not None and name in first and first[name] > 10 * fastest_first
        calls: list[float] = []
        while len(calls) < (1 if slow_start else 3) and sum(calls) < 0.3:  # the least of a few: one can be a hiccup
            t0 = time.perf_counter()
            fn()
            calls.append(time.perf_counter() - t0)
        est[name] = min(calls)
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
