"""One bucket's race: rounds of paired turns, paced by the tax budget and judged by the rule (docs/auto.md).

A :class:`Race` is the controller's record of the candidates racing for one bucket: the one serving (the
incumbent), each challenger's paired log-ratios against it, the tax the rounds have paid, the round under way.
The functions here plan a round (:func:`plan`), judge it when it is over (:func:`judge`) and conclude at the
bound in time (:func:`conclude`); they decide nothing but the race's own bookkeeping, and the controller
publishes what follows (a route, a decision).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from dataclasses import dataclass, field

from hybrid.runtime.auto import rule
from hybrid.runtime.auto.policy import TuningPolicy
from hybrid.runtime.auto.router import Lane, Probe
from hybrid.runtime.auto.status import CandidateResult

__all__ = ["CONCLUDE", "DISPLACED_AT_BOUND", "NOT_TIMED", "NOT_TIMED_TWICE", "Race", "challengers_of", "check_ratio",
           "conclude", "estimates", "excess", "gains", "judge", "plan", "precharge_cost", "round_cost", "unaffordable"]

logger = logging.getLogger("hybrid")

CONCLUDE = -1.0  # what plan() returns when no round fits before the bound: the race ends now
NOT_TIMED = ("not timed: the tax budget could not pay for its turns before the time bound (its ratio is the check's "
             "estimate); it races at the re-check")
NOT_TIMED_TWICE = ("not timed in two races: the tax budget cannot pay for a round of its turns at its estimated ratio "
                   "within the time bound")
DISPLACED_AT_BOUND = ("replaced at the time bound on the point estimate of its rival's turns, not by the test: "
                      "it races again at the re-check")


@dataclass(slots=True)
class Race:
    """The candidates racing for one bucket, and what their turns measured."""

    incumbent: str
    lanes: dict[str, Lane]  # the incumbent and every challenger
    started: float  # the first call (or the re-check's start): the bound and the tax count from here
    logs: dict[str, list[float]] = field(default_factory=dict)  # challenger -> paired log-ratios vs the incumbent
    estimate: dict[str, float] = field(default_factory=dict)  # challenger -> speed ratio before any pair
    results: dict[str, CandidateResult] = field(default_factory=dict)
    runners: list[str] = field(default_factory=list)  # tied, untimed or replaced at the bound: they race again at
    # the next re-check
    spent: float = 0.0  # seconds tuning added to the calls so far (the tax paid; a faster challenger's turns pay it
    # back: the calls' mean is what the budget bounds)
    rounds_net: float = 0.0  # what the rounds alone added to the calls, in net (their gains subtracted): a round
    # planned to make the calls faster starts at once only while this is not above 0 (:func:`plan`)
    calls_from: int = 0  # the bucket's call count when the race began: the budget accrues with the calls since
    base_s: float | None = None  # the serving candidate's own call seconds (the baseline turn, each round's first)
    probe: Probe | None = None
    precharge: tuple[float, int] | None = None  # (seconds, calls) the serving candidate answered before the race,
    # beside the check and the compiles: charged to ``spent`` once a baseline turn has measured its own speed
    pace: dict[str, float] = field(default_factory=dict)  # challenger -> its warm-up here over the serving speed:
    # a floor on the ratio that paces its first round (never a verdict: lazy initialisation inflates it)
    deferred: frozenset[str] = frozenset()  # challengers a race before this one left untimed (:func:`_defer`)
    untimed: dict[str, float | None] = field(default_factory=dict)  # challengers this race left untimed, for the
    # first time: label -> the check's estimate of its ratio (they race at the re-check)

    @classmethod
    def between(cls, incumbent: str, lanes: dict[str, Lane], started: float, estimates: dict[str, float],
                precharge: tuple[float, int] | None = None, calls_from: int = 0,
                deferred: frozenset[str] = frozenset()) -> Race:
        """A race of every lane against ``incumbent``, each challenger starting from its estimated ratio.

        ``precharge``: the seconds and count of the calls served while the check and the compiles ran; what they
        cost beyond the serving candidate's own speed is charged to the tax before the first round (:func:`plan`).
        ``calls_from``: the bucket's call count at ``started`` (the calls after it pay for the tuning).
        ``deferred``: challengers an earlier race left untimed (a second time untimed, they leave).
        """
        challengers = [lb for lb in lanes if lb != incumbent]
        return cls(incumbent, dict(lanes), started, {lb: [] for lb in challengers},
                   {lb: estimates.get(lb, 1.0) for lb in challengers},
                   precharge=precharge if challengers else None, calls_from=calls_from, deferred=deferred)

    def ratio(self, label: str) -> float:
        """A challenger's call time over the incumbent's: from its paired turns, else its estimate."""
        logs = self.logs.get(label)
        return math.exp(statistics.fmean(logs)) if logs else self.estimate.get(label, 1.0)

    def cost_ratio(self, label: str) -> float:
        """The ratio a round's cost is planned at: :meth:`ratio`, before any pair at least the warm-up's (``pace``)."""
        return self.ratio(label) if self.logs.get(label) else max(self.ratio(label), self.pace.get(label, 0.0))

    def drop(self, label: str, incumbent: str, incumbent_lane: Lane) -> None:
        """``label`` failed a real call: it leaves the race, ``incumbent`` serves, the next round is planned anew."""
        self.logs.pop(label, None)
        self.lanes.pop(label, None)
        self.results.pop(label, None)
        self.runners = [lb for lb in self.runners if lb != label]
        self.incumbent, self.probe = incumbent, None
        self.lanes.setdefault(incumbent, incumbent_lane)

    def stop(self) -> None:
        """End the race where it stands (a freeze, a failed step): no round follows and nobody races again later."""
        self.runners = []
        self.probe = None

    def join(self, label: str, lane: Lane, estimate: float) -> None:
        """A challenger joins from the next round on (a layout, once the calls were seen to overlap)."""
        self.lanes[label] = lane
        self.logs.setdefault(label, [])
        self.estimate[label] = estimate

    @property
    def over(self) -> bool:
        """No challenger is left."""
        return not self.logs


def check_ratio(warm: dict[str, float | None], label: str, incumbent: str) -> float | None:
    """A candidate's warm run in the check over the serving one's (both in the check process's CPU time)."""
    mine, base = warm.get(label), warm.get(incumbent)
    return mine / base if mine and base else None


def unaffordable(policy: TuningPolicy, ratio: float | None, turn_s: float, started: float, deadline: float) -> str:
    """Why a candidate at ``ratio`` cannot take even one round of turns before ``deadline`` ('' when it can).

    The tax budget would need longer than the time left.
    """
    if ratio is None or started + policy.round_extra_s(turn_s, [ratio]) / policy.max_tax <= deadline:
        return ""
    return (f"not tried: {ratio:.3g}x the serving candidate in the check, so one round of its turns costs more than "
            "the tax budget allows within the time bound")


def estimates(lanes: dict[str, Lane], warm: dict[str, float | None], incumbent: str,
              serving_s: float | None) -> dict[str, float]:
    """Each challenger's call time over the serving one's before any turn (it paces the first round).

    From the check process's warm runs (both measured alike there), else from its warm-up here over the serving
    candidate's calls (a pessimistic guess: right after a compile, beside the callers), else none (1).
    """
    out = {}
    for label, lane in lanes.items():
        ratio = check_ratio(warm, label, incumbent)
        if ratio is None and lane.warm_s and serving_s:
            ratio = lane.warm_s / serving_s
        if ratio is not None:
            out[label] = ratio
    return out


def plan(race: Race, policy: TuningPolicy, now: float, turn_s: float, deadline: float, calls: int,
         call_s: float) -> Probe | float:
    """The next round as a probe starting now, or the time it may start (the tax budget), or :data:`CONCLUDE`.

    ``calls`` is the bucket's call count now and ``call_s`` the serving candidate's last call (its speed until a
    turn has measured it). The budget accrues with the calls since the race began (:meth:`.TuningPolicy.next_round_at`)
    and a round is planned to cost its challengers' turns at their ratios, times the load those calls put on the
    model. A round that cannot end before ``deadline`` is not started: the challenger whose turns cost the most
    leaves (when it is slower: its turns are what the budget cannot pay), and the others race on; when none can,
    the race concludes. A race with a precharge first runs a baseline turn: the serving candidate alone, with
    nothing else at work, so that :func:`judge` can charge what the calls before the race paid beside the check and
    the compiles.

    A round of the challengers faster than the serving one beyond the tie band (by their turns, else by the check's
    estimate) starts at once, whatever the balance, while the rounds so far have not cost the calls in net: it
    lowers the calls' mean latency, so waiting for the budget would only keep the slower candidate serving
    longer (on a MiniLM-sized encoder under ``precision='auto'`` the check and the compiles overdrew the budget and
    OpenVINO bf16, 0.45x the serving time, waited for the re-check). A round that cost in net (lead-ins, an estimate
    that was wrong) ends the privilege: the race is paced by the budget again.
    """
    if race.precharge is not None:
        return Probe(now, turn_s, (race.lanes[race.incumbent],))
    gaining = [lb for lb in race.logs if gains(policy, race.ratio(lb))]
    if gaining and race.rounds_net <= 0.0 and now + turn_s * (1 + 3 * len(gaining)) <= deadline:
        return _round(race, now, turn_s, gaining)  # it lowers the calls' mean latency: waiting would not
    base = race.base_s or call_s
    served = max(0, calls - race.calls_from)
    rate = served / (now - race.started) if now > race.started else 0.0
    while True:
        round_s = turn_s * (1 + 3 * len(race.logs))
        extra = rate * base * policy.round_extra_s(turn_s, [race.cost_ratio(lb) for lb in race.logs])
        start = policy.next_round_at(now, race.spent, extra, round_s, served, rate, base)
        if start + round_s <= deadline:
            break
        costly = max(race.logs, key=race.ratio)
        if len(race.logs) == 1 or race.ratio(costly) <= 1.0 + policy.tie_rel:
            return CONCLUDE
        logs = race.logs.pop(costly)  # the others' turns fit the budget without its
        if not logs:
            _defer(race, costly, race.estimate.get(costly))
            continue
        race.results[costly] = CandidateResult(
            costly, math.exp(statistics.fmean(logs)), rule.Outcome.SLOWER.value,
            "its turns, at this ratio, cost more than the tax budget allows within the time bound")
    if now < start:
        return start
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("auto (online): a round of %s planned to add %.4g s (%.4g s spent, %d calls of %.3g ms since the "
                     "race began)", ", ".join(f"{lb} at {race.cost_ratio(lb):.3g}x" for lb in race.logs), extra,
                     race.spent, served, 1e3 * base)
    return _round(race, now, turn_s, list(race.logs))


def _round(race: Race, now: float, turn_s: float, challengers: list[str]) -> Probe:
    """A round of paired turns A X X A for each of ``challengers`` (A: the serving candidate), starting ``now``."""
    lanes = [race.lanes[race.incumbent]]
    for label in challengers:
        lanes += [race.lanes[label], race.lanes[label], race.lanes[race.incumbent]]
    return Probe(now, turn_s, tuple(lanes))


def gains(policy: TuningPolicy, ratio: float | None) -> bool:
    """A candidate at ``ratio`` of the serving one's call time is faster beyond the tie band (its turns pay)."""
    return ratio is not None and ratio < 1.0 - policy.tie_rel


def challengers_of(probe: Probe) -> list[str]:
    """The challengers a round's probe gives turns to, in its order (none for a baseline turn)."""
    return [probe.lanes[1 + 3 * j].label for j in range((len(probe.lanes) - 1) // 3)]


def judge(race: Race, probe: Probe, policy: TuningPolicy) -> str | None:
    """Add the round's paired log-ratios, charge the tax it paid, and apply the rule to each challenger.

    Returns the new incumbent when one was found faster (None: the incumbent stays). A baseline turn (the race's
    first probe when it has a precharge) judges nothing: it charges the precharge (:func:`precharge_cost`) and
    records each challenger's warm-up time over the serving candidate's measured speed, which paces its first round
    (a floor on the planned cost, never a verdict).
    """
    if race.precharge is not None:
        own = probe.timed(0, policy.lead_share)
        race.spent += precharge_cost(race.precharge, own)
        race.precharge = None
        if own:
            race.base_s = serving_s = statistics.fmean(own)
            for label in race.logs:
                warm = race.lanes[label].warm_s
                if warm:
                    race.pace[label] = warm / serving_s
        return None
    for j, label in enumerate(challengers_of(probe)):
        a0, x1, x2, a3 = (probe.timed(3 * j + k, policy.lead_share) for k in range(4))
        pairs = [v for v in (rule.log_ratio(x1, a0), rule.log_ratio(x2, a3)) if v is not None]
        if label in race.logs:
            race.logs[label] += pairs
    cost = round_cost(race, probe, policy)
    race.spent += cost
    race.rounds_net += cost
    if logger.isEnabledFor(logging.DEBUG):
        turns = ", ".join(f"{lane.label} {_ms(probe.timed(i, policy.lead_share))}"
                          for i, lane in enumerate(probe.lanes))
        logger.debug("auto (online): round of %.3g s turns (timed mean ms, calls): %s; it cost %.4g s, %.4g s in all",
                     probe.turn_s, turns, cost, race.spent)
    return _apply(race, {lb: rule.compare(v, policy.confidence, policy.tie_rel) for lb, v in race.logs.items()})


def _ms(seconds: list[float]) -> str:
    return f"{1e3 * statistics.fmean(seconds):.3g} ({len(seconds)})" if seconds else "- (0)"


def round_cost(race: Race, probe: Probe, policy: TuningPolicy) -> float:
    """What a round's calls paid beyond the serving candidate's own speed, as they felt it (negative: they gained).

    That speed is the timed part of the round's first turn: the serving candidate after its rest, before any
    challenger ran (it becomes the race's ``base_s``). Every call of the round counts, lead-ins included, and so does
    the serving candidate's own slowness in its later turns (a runtime that ran before may still spin its threads):
    what the paired ratios leave out on purpose is a cost all the same. The turns of a challenger faster than the
    serving candidate pay back: the budget bounds the calls' mean latency, which they lower. A round without a timed
    first turn is measured against the last speed known.
    """
    first = probe.timed(0, policy.lead_share)
    if first:
        race.base_s = statistics.fmean(first)
    records = list(probe.records)
    if race.base_s is None or not records:
        return 0.0
    return sum(s for _, _, s in records) - len(records) * race.base_s


def precharge_cost(precharge: tuple[float, int], own: list[float]) -> float:
    """What the calls served beside the check and the compiles paid beyond the serving candidate's own speed.

    ``precharge`` is their (seconds, count); ``own`` the seconds of its calls in a baseline turn, with nothing else
    at work. Their excess over the count times the baseline's mean is the tax those phases took: the other work on
    the machine's cores (the check process, the compiles, their interpreter lock) counted where the callers felt
    it, whatever the cores, the load or the model. No baseline call (an idle model): nothing to charge.
    """
    return excess(*precharge, statistics.fmean(own)) if own else 0.0


def excess(seconds: float, calls: int, call_s: float) -> float:
    """What ``calls`` calls that took ``seconds`` paid beyond ``call_s`` each (never below 0).

    Beside the check and the compiles the serving candidate cannot have been faster than alone: a lower mean there
    is the machine's noise, not a gain to bank (a round's turns bank theirs: :func:`round_cost`).
    """
    return max(0.0, seconds - calls * call_s) if calls > 0 else 0.0


def conclude(race: Race, policy: TuningPolicy) -> str | None:
    """The bound in time: the point estimate of each challenger still open decides (:func:`.rule.settle`).

    One never timed (its turns would have cost more than the budget allows before the bound) is not judged: its
    estimate comes from the check, not from real calls, so it races at the re-check (:func:`_defer`). A switch made
    here rests on a point estimate, not on the test, so the candidate it replaces races again at the re-check, by
    the same rule: a wrong switch is undone there, where one the test had made would stand. Returns the new
    incumbent, if any.
    """
    untimed = {lb: race.estimate.get(lb) for lb, v in race.logs.items() if not v}
    verdicts = {lb: rule.settle(v, policy.tie_rel) for lb, v in race.logs.items() if v}
    was = race.incumbent
    switched = _apply(race, verdicts)
    if switched is not None:
        race.results[was] = dataclasses.replace(race.results[was], reason=DISPLACED_AT_BOUND)
        if was not in race.runners:
            race.runners.append(was)
    for label, estimate in untimed.items():
        _defer(race, label, estimate)
    race.logs.clear()
    return switched


def _defer(race: Race, label: str, estimate: float | None) -> None:
    """``label`` leaves the race untimed: not judged on the check's estimate, it races at the re-check.

    The check times candidates in another process, paced, on one input: an estimate, not a measurement of the
    serving configuration (on the zoo's unet it read OpenVINO bf16 at 1.03x ONNX Runtime's time, real calls at
    0.85x), and the first race's budget also pays for the check and the compiles. So the re-check, with a budget
    of its own, gives it turns. One that a re-check leaves untimed too (the budget cannot pay for a round of its
    turns within any bound) leaves, as slower by its estimate.
    """
    if label in race.deferred:
        race.results[label] = CandidateResult(label, estimate, rule.Outcome.SLOWER.value, NOT_TIMED_TWICE)
        return
    race.results[label] = CandidateResult(label, estimate, rule.Outcome.OPEN.value, NOT_TIMED)
    race.untimed[label] = estimate
    if label not in race.runners:
        race.runners.append(label)


def _apply(race: Race, verdicts: dict[str, rule.Outcome]) -> str | None:
    faster = {lb: statistics.fmean(race.logs[lb]) for lb, v in verdicts.items() if v is rule.Outcome.FASTER}
    for label, verdict in verdicts.items():
        logs = race.logs[label]
        race.results[label] = CandidateResult(label, math.exp(statistics.fmean(logs)) if logs else None,
                                              verdict.value)
        if verdict in (rule.Outcome.SLOWER, rule.Outcome.TIE):
            del race.logs[label]
            if verdict is rule.Outcome.TIE:
                race.runners.append(label)
    if not faster:
        return None
    best = min(faster, key=faster.__getitem__)
    was = race.incumbent
    race.results[was] = CandidateResult(was, math.exp(-faster[best]), rule.Outcome.SLOWER.value)
    race.incumbent = best
    race.pace.clear()  # warm-ups over the old serving speed
    if race.base_s is not None:
        race.base_s *= math.exp(faster[best])  # the new one's speed, until its first turn measures it
    race.logs.pop(best, None)
    for label in race.logs:  # they were compared with the one before: compare them with the new one afresh
        logs = race.logs[label]
        race.estimate[label] = math.exp(statistics.fmean(logs) - faster[best]) if logs else 1.0
        race.logs[label] = []
    race.runners = [lb for lb in race.runners if lb != best]
    logger.info("auto (online): %s is faster than %s (%.3gx); it serves", best, was, math.exp(faster[best]))
    return best
