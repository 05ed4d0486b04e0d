"""Timing candidates fairly on a shared machine, at the speed each serves a stream of calls.

Blocks that start once the process is quiet, untimed lead-ins, paired rounds A X X A judged by the sequential rule of
:mod:`.rule` (the rule online tuning applies to real calls; DESIGN 4).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from hybrid.config import autotune_config
from hybrid.runtime.auto import rule
from hybrid.runtime.auto.policy import TimingPolicy

__all__ = ["METHOD", "settle", "steady_calls", "time_candidates", "timing_policy", "warm_estimate"]

METHOD = 3  # part of the decision cache's key: decisions timed by an older method are made again (3: paired
# blocks judged by the sequential rule)


def timing_policy() -> TimingPolicy:
    """The timing policy ``hybrid.init``'s ``autotune`` section asks for (every number of this module)."""
    return TimingPolicy.from_settings(autotune_config())


def settle(max_s: float | None = None, policy: TimingPolicy | None = None) -> float:
    """Wait until this process's threads stop using the CPU (at most ``max_s``); returns the seconds waited.

    A runtime's thread pool keeps working after its run returns: ONNX Runtime's intra-op threads spin on a
    core for 40-50 ms after every run on this kind of machine, and on 2 cores whatever runs next in the process
    is measured with one core fewer. Timing a candidate right after another therefore measures the pair; it is
    timed once the process's CPU time stops advancing (read from the process clock, so it holds for any
    runtime's pool). Where other threads of the process keep working, this waits ``max_s`` (default: the policy's
    ``settle_max_s``).
    """
    policy = policy or timing_policy()
    max_s = policy.settle_max_s if max_s is None else max_s
    start = time.perf_counter()
    while True:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(policy.quiet_poll_s)
        now = time.perf_counter()
        if time.process_time() - cpu < policy.quiet_share * (now - wall) or now - start >= max_s:
            return now - start


def warm_estimate(fn: Callable[[], Any], calls: int = 3, within_s: float = 0.3,
                  clock: Callable[[], float] | None = None) -> float:
    """Seconds of the least of up to ``calls`` calls of ``fn`` (fewer once ``within_s`` is spent).

    One call can be a hiccup, and the calls right after a first run can still pay for lazy initialisation. ``clock``
    measures them (default ``time.perf_counter``; ``time.process_time`` where the process may wait for a core: its CPU
    time is the work alone).
    """
    clock = clock or time.perf_counter
    spent: list[float] = []
    while len(spent) < calls and sum(spent) < within_s:
        t0 = clock()
        fn()
        spent.append(clock() - t0)
    return min(spent)


def time_candidates(runs: Mapping[str, Callable[[], Any]], budget_s: float | None = None,
                    blocks: int | None = None, policy: TimingPolicy | None = None) -> dict[str, float]:
    """Seconds per call of each candidate at its steady state, measured as online tuning measures real calls.

    Paired blocks A X X A judged by the sequential test of :mod:`.rule` (one timing path, docs/auto.md).

    Each candidate is first called up to 3 times (within 0.3 s) and the least call is its estimate: the calls
    right after a first run still pay for lazy initialisation (OpenVINO compiles kernels for a new shape of a
    dynamic model over its first few calls: 15, 0.6, then 0.3 ms). One more than 3x slower than the best
    estimate is not measured further (it cannot win) and reports its estimate. The fastest estimate is the
    incumbent A; each other candidate X runs rounds of four blocks A X X A, each block calling one candidate back
    to back for about ``budget_s / blocks`` seconds (at most ``max_block_calls`` calls). A block starts only
    once the process is quiet (:func:`settle`: the thread pool of the one timed before it may still be spinning),
    and the calls of its first ``lead_s`` (at most ``lead_calls`` calls) are not counted: a runtime whose
    pool idled takes that long to run at the speed it serves a stream of calls with (OpenVINO on a 0.3 ms
    encoder: 0.45 ms over its first 5 calls, 0.28 ms from the 150th on). Each adjacent pair of blocks gives the
    log-ratio of X's block median to A's; X's rounds stop as soon as the rule says faster, slower or tied (a clear
    gap: after one round), or after ``blocks`` rounds. A's time is the median of its block medians, X's that
    times the geometric mean of its ratios. Graphs faster than ``quick_s`` are timed with short pauses and
    blocks instead. Every number is the :class:`~.policy.TimingPolicy`'s (default: :func:`timing_policy`).
    """
    policy = policy or timing_policy()
    budget_s = policy.time_budget_s if budget_s is None else budget_s
    blocks = policy.blocks if blocks is None else blocks
    settings = autotune_config()
    est: dict[str, float] = {}
    for name, fn in runs.items():
        time.sleep(policy.quick_pause_s)
        est[name] = warm_estimate(fn)
    best = min(est.values())
    alive = [n for n in runs if est[n] <= 3 * best]
    block_s = budget_s / blocks
    quick = best < policy.quick_s
    lead_calls, max_kept = ((policy.quick_block_calls, policy.quick_block_calls) if quick else
                            (policy.lead_calls, policy.max_block_calls))
    # a lead-in where there is room for one (slow calls count whole), of at most lead_calls calls
    lead = {n: min(policy.lead_s, lead_calls * est[n]) if est[n] * 4 <= block_s else 0.0 for n in alive}

    def block(name: str) -> float:
        if quick:
            time.sleep(policy.quick_pause_s)
        else:
            settle(policy=policy)
        return statistics.median(steady_calls(runs[name], block_s, lead[name], max_kept))

    incumbent = min(alive, key=est.__getitem__)
    mine: list[float] = []
    logs: dict[str, list[float]] = {n: [] for n in alive if n != incumbent}
    open_ = list(logs)
    for _ in range(blocks):
        if not open_:
            break
        for name in list(open_):
            a0, x1, x2, a3 = block(incumbent), block(name), block(name), block(incumbent)
            mine += [a0, a3]
            logs[name] += [v for v in (rule.log_ratio([x1], [a0]), rule.log_ratio([x2], [a3])) if v is not None]
            if rule.compare(logs[name], settings.confidence, policy.tie_rel) is not rule.Outcome.OPEN:
                open_.remove(name)
    if not mine:  # one candidate alive: its own blocks
        mine = [block(incumbent) for _ in range(min(blocks, 3))]
    base = statistics.median(mine)
    out = {n: est[n] for n in runs}
    out[incumbent] = base
    for name, values in logs.items():
        out[name] = base * math.exp(statistics.fmean(values)) if values else est[name]
    return out


def steady_calls(fn: Callable[[], Any], block_s: float, lead_s: float, max_kept: int = 500) -> list[float]:
    """Seconds of each call of ``fn`` called back to back for about ``block_s``.

    Or until ``max_kept`` calls were kept, leaving out the calls that start within ``lead_s`` of the first (at least one
    call is kept).
    """
    start = time.perf_counter()
    kept: list[float] = []
    while True:
        t0 = time.perf_counter()
        if kept and (t0 - start >= block_s or len(kept) >= max_kept):
            return kept
        fn()
        if t0 - start >= lead_s:
            kept.append(time.perf_counter() - t0)
