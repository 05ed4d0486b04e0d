"""Judging checked trials: the vote against the reference, and the choice among the fast ones.

- When no accelerated candidate agrees with the reference but independent backends agree with each
  other, the reference is outvoted (:func:`outvote`).
- Timings within noise of the fastest tie, and the tie goes to the answer closest to the reference
  (:func:`fastest_or_most_exact`), unless the fastest's is within ``deviation_floor`` of it too; the
  bounds are ``hybrid.init({'autotune': {'tie_rel', 'tie_us'}})``.
  A candidate exact to the dtype's tolerance also wins over a faster one that is only within the
  model-level tolerance when it is within 3 % (``exact_premium_rel``, at most 0.2 ms) of it.
  Every number is the :class:`~.policy.TimingPolicy`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from hybrid.hal import is_fallback
from hybrid.runtime.auto import tolerance as checks
from hybrid.runtime.auto.policy import TimingPolicy
from hybrid.runtime.auto.timing import timing_policy
from hybrid.runtime.auto.trials import Search, Trial

__all__ = ["close_all", "deviation", "fastest_or_most_exact", "outvote"]

logger = logging.getLogger("hybrid")

def outvote(trials: list[Trial], search: Search, name: str) -> None:
    """Let independent backends outvote the reference on an output they agree on and it does not.

    When no accelerated fp32 candidate agrees with the reference, but candidates of two or more
    backends, rejected for values alone, agree with each other on every sample, the output is one
    where rounding decides the answer (equal logits near 1e10 before a Softmax, say) and the
    reference's own rounding is one opinion among several: those candidates are reinstated and the
    reference trial is rejected instead. A candidate that differs from every other opinion stays out.
    """
    if any(t.rejected is None and t.precision == "fp32" and not is_fallback(t.backend) for t in trials):
        return
    disputed = [t for t in trials if t.disputed]
    best: list[Trial] = []
    for t in disputed:
        group = [u for u in disputed if u is t or search.verifier.agree(t.answers, u.answers)]
        consistent = all(search.verifier.agree(u.answers, v.answers) for u in group for v in group if u is not v)
        if consistent and len({u.backend for u in group}) >= 2 and len(group) > len(best):
            best = group
    if not best:
        return
    labels = ", ".join(t.label for t in best)
    note = f"the reference backend was outvoted: {labels} agree with each other on every sample but not with it"
    logger.warning("auto: %s for %r", note, name)
    search.notes.append(note)
    for t in best:
        t.rejected = None
    for t in trials:
        if is_fallback(t.backend) and t.rejected is None:
            t.rejected = "outvoted"


def deviation(trial: Trial, search: Search) -> float:
    """How far ``trial``'s answers are from the reference's.

    In the units of :func:`hybrid.runtime.auto.tolerance.deviation`: 0.0 for the reference itself, infinity
    when nothing was compared.
    """
    verifier = search.verifier
    if verifier.reference is not None and trial.executable is verifier.reference:
        return 0.0
    cases, names = verifier.cases, verifier.names
    if trial.answers and len(trial.answers) == len(cases):
        return max(checks.deviation(c.expected, a, names) for c, a in zip(cases, trial.answers))
    if trial.outputs is not None and cases:
        return checks.deviation(cases[0].expected, trial.outputs, names)
    return float("inf")


def fastest_or_most_exact(survivors: list[Trial], times: Mapping[str, float],
                          search: Search, policy: TimingPolicy | None = None) -> tuple[Trial, str]:
    """The fastest survivor, unless others are as fast within the policy's tie bounds.

    Then, of those, the one closest to the reference (the reference itself when it is among them).
    """
    policy = policy or timing_policy()
    fastest = min(survivors, key=lambda t: times[t.label])
    best = times[fastest.label]
    slack = policy.tie_slack(best)
    reason = f"fastest of {len(survivors)} checked candidates"
    exact = _exact_within_premium(survivors, fastest, times, search, policy)
    if exact is not None:
        return exact, "exact to the dtype's tolerance and within 0.2 ms of the fastest"
    ties = [t for t in survivors if times[t.label] <= best + slack]
    if len(ties) < 2:
        return fastest, reason
    dev = {t.label: deviation(t, search) for t in ties}
    exact = min(ties, key=lambda t: (dev[t.label], times[t.label]))
    if exact is fastest or dev[exact.label] >= dev[fastest.label] or dev[fastest.label] < policy.deviation_floor:
        return fastest, reason
    search.notes.append(
        f"{exact.label} is as fast as {fastest.label} (within {slack * 1e6:.3g} us, the tie bound) and closer "
        f"to the reference: deviation {dev[exact.label]:.3g} vs {dev[fastest.label]:.3g} tolerance units")
    return exact, f"closest to the reference of {len(ties)} candidates as fast as the fastest"


def _exact_within_premium(survivors: list[Trial], fastest: Trial, times: Mapping[str, float],
                          search: Search, policy: TimingPolicy) -> Trial | None:
    """The fastest candidate exact to the dtype's tolerance, when the fastest passed only the model's.

    That is, when the fastest's answer is further from the reference than the dtype's own tolerance: the exact one is
    chosen if it is within ``exact_premium_rel`` (at most ``exact_premium_s``) or ``tie_rel`` of the fastest:
    timing on a shared machine cannot rank candidates that close, but exactness still can.
    """
    dev = {t.label: deviation(t, search) for t in survivors}
    if dev[fastest.label] <= 1.0:
        return None
    exact = [t for t in survivors if dev[t.label] <= 1.0]
    if not exact:
        return None
    best_exact = min(exact, key=lambda t: times[t.label])
    gap = times[best_exact.label] - times[fastest.label]
    premium = min(policy.exact_premium_s, policy.exact_premium_rel * times[fastest.label])
    if gap > max(policy.tie_rel * times[best_exact.label], premium):
        return None
    search.notes.append(
        f"{best_exact.label} is exact to the dtype's tolerance and {gap * 1e6:.0f} us slower than {fastest.label}, "
        f"whose answer is {dev[fastest.label]:.3g} tolerance units from the reference: the exact one wins")
    return best_exact


def close_all(trials: list[Trial], keep: Trial | None, search: Search, also: Sequence[Trial] = ()) -> None:
    """Release every trial's executable except ``keep``'s and ``also``'s (and the reference unless it is kept)."""
    keep_exe = keep.executable if keep else None
    closed = {id(t.executable) for t in also}
    for t in trials:
        if t.executable is not keep_exe and id(t.executable) not in closed:
            closed.add(id(t.executable))
            t.executable.close()
    if id(search.verifier.reference) not in closed:
        search.verifier.close(keep_exe)
