"""Judging checked trials: the vote against the reference, and the choice among the fast ones.

- When no accelerated candidate agrees with the reference but independent backends agree with each
  other, the reference is outvoted (:func:`outvote`).
- Timings within noise of the fastest tie, and the tie goes to the answer closest to the reference
  (:func:`fastest_or_most_exact`), unless the fastest's is within :data:`DEVIATION_FLOOR` of it too; the
  bounds are ``hybrid.init({'autotune': {'tie_rel', 'tie_us'}})``.
  A candidate exact to the dtype's tolerance also wins over a faster one that is only within the
  model-level tolerance when it is within 3 % (:data:`EXACT_PREMIUM_REL`, at most 0.2 ms) of it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from hybrid.config import autotune_config
from hybrid.hal import is_fallback
from hybrid.runtime.auto import tolerance as checks
from hybrid.runtime.auto.trials import Search, Trial

__all__ = ["close_all", "deviation", "fastest_or_most_exact", "outvote", "tie_bounds", "tie_slack"]

logger = logging.getLogger("hybrid")

# A candidate exact to the dtype's tolerance wins over a faster one that passed only the model-level
# tolerance when it is at most this much slower (or within the tie bounds): a few per cent is within the
# timing noise of a shared machine, the difference in the answers is not. Relative, so that it stays inside
# the 5 % auto may lose to the best single runtime (an absolute 0.2 ms let a 0.37 ms exact candidate win
# over a 0.33 ms one); capped, so that it never buys more than a fraction of a millisecond.
EXACT_PREMIUM_REL = 0.03
EXACT_PREMIUM_S = 200e-6
# Answers this close to the reference (in tolerance units, see tolerance.deviation) are equally exact: a tie
# between them goes to the fastest. (On the zoo's external-data model ONNX Runtime and OpenVINO were 5.7e-22
# and 9.6e-22 units from the reference, and the tie went to the one 1.5 % slower.)
DEVIATION_FLOOR = 0.01
TINY_S = 1.5e-4  # graphs faster than this tie within tie_us (see tie_slack)


def tie_bounds() -> tuple[float, float]:
    """(relative, absolute seconds) within which a timing ties with the fastest, from the config.

    The defaults: 2 % stays well inside the 5 % slack auto is allowed against the best single
    runtime; 20 us is about the spread of medians between timings of the same 15-40 us graph a few
    seconds apart on a shared 2-core machine (see docs/auto.md). The absolute bound holds only for
    graphs faster than :data:`TINY_S` (:func:`tie_slack`).
    """
    tune = autotune_config()
    return tune.tie_rel, tune.tie_us * 1e-6


def tie_slack(best: float) -> float:
    """Seconds by which a timing may exceed the fastest, ``best``, and still tie with it.

    ``tie_rel`` of it, or ``tie_us`` where the fastest runs under :data:`TINY_S` a call. There the spread between two
    timings of one graph is already up to ~20 us: differences that small cannot be ranked, and exactness decides
    (ONNX's STFT node test: the reference 7 us a call slower than ONNX Runtime, whose answer is 246 tolerance units
    off). On slower graphs 20 us would be more than the 5 % auto may lose (a 0.3 ms encoder: 6.7 %), and only the
    relative bound holds.
    """
    rel, abs_s = tie_bounds()
    return max(rel * best, abs_s if best < TINY_S else 0.0)


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
                          search: Search) -> tuple[Trial, str]:
    """The fastest survivor, unless others are as fast within :func:`tie_bounds`.

    Then, of those, the one closest to the reference (the reference itself when it is among them).
    """
    fastest = min(survivors, key=lambda t: times[t.label])
    best = times[fastest.label]
    slack = tie_slack(best)
    reason = f"fastest of {len(survivors)} checked candidates"
    exact = _exact_within_premium(survivors, fastest, times, search)
    if exact is not None:
        return exact, "exact to the dtype's tolerance and within 0.2 ms of the fastest"
    ties = [t for t in survivors if times[t.label] <= best + slack]
    if len(ties) < 2:
        return fastest, reason
    dev = {t.label: deviation(t, search) for t in ties}
    exact = min(ties, key=lambda t: (dev[t.label], times[t.label]))
    if exact is fastest or dev[exact.label] >= dev[fastest.label] or dev[fastest.label] < DEVIATION_FLOOR:
        return fastest, reason
    search.notes.append(
        f"{exact.label} is as fast as {fastest.label} (within {slack * 1e6:.3g} us, the tie bound) and closer "
        f"to the reference: deviation {dev[exact.label]:.3g} vs {dev[fastest.label]:.3g} tolerance units")
    return exact, f"closest to the reference of {len(ties)} candidates as fast as the fastest"


def _exact_within_premium(survivors: list[Trial], fastest: Trial, times: Mapping[str, float],
                          search: Search) -> Trial | None:
    """The fastest candidate exact to the dtype's tolerance, when the fastest passed only the model's.

    That is, when the fastest's answer is further from the reference than the dtype's own tolerance: the exact one is
    chosen if it is within :data:`EXACT_PREMIUM_REL` (at most :data:`EXACT_PREMIUM_S`) or ``tie_rel`` of the fastest:
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
    premium = min(EXACT_PREMIUM_S, EXACT_PREMIUM_REL * times[fastest.label])
    if gap > max(tie_bounds()[0] * times[best_exact.label], premium):
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
