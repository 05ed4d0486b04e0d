"""The control plane of online tuning: one controller decides every bucket, by one rule (docs/auto.md).

Per shape bucket the controller walks an explicit lifecycle (:mod:`.lifecycle`: :class:`Phase`,
:data:`TRANSITIONS`): ``new`` -> ``checking`` -> ``compiling`` -> ``racing`` -> ``decided``, ``new`` ->
``installing`` -> ``decided`` for a cached decision, ``decided`` -> ``racing`` for a re-check.

Only the controller writes a bucket's state, and only through :func:`.lifecycle.enter`; the router reads the
routes it publishes. :meth:`Controller.step` does what is due at the clock's time and returns when to call it
again: the production tuner calls it from one background thread; tests call it on scripted time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import statistics
import threading
from typing import Any

from hybrid.errors import first_line
from hybrid.hal.layout import split_layout
from hybrid.runtime.auto import race
from hybrid.runtime.auto.lab import CheckResult, Lab
from hybrid.runtime.auto.lifecycle import BucketRecord, Phase, enter
from hybrid.runtime.auto.policy import Clock, TuningPolicy
from hybrid.runtime.auto.race import Race
from hybrid.runtime.auto.router import Event, Lane, Probe, Route, Router
from hybrid.runtime.auto.status import Bucket, BucketTuning, CandidateResult, bucket_label, shapes_label

__all__ = ["Controller"]

logger = logging.getLogger("hybrid")

class Controller:
    """Decides every shape bucket of one model (module doc).

    Args:
        router: The data plane it publishes routes to.
        lab: Checks, compiles, releases, caches.
        policy: Every threshold it decides by.
        clock: Its time (the router's clock).
        start: The candidate that serves a bucket until it is decided.
        model_name: For the log and the notes.
        confirm: A bucket that starts racing at once, and its candidates (a decision made at compile whose near
            rivals confirm it on real calls).
    """

    def __init__(self, router: Router, lab: Lab, policy: TuningPolicy, clock: Clock, start: Lane, model_name: str,
                 confirm: tuple[Bucket, tuple[Lane, ...]] | None = None) -> None:
        self._router = router
        self._lab = lab
        self._policy = policy
        self._clock = clock
        self._start = start
        self._name = model_name
        self._confirm = confirm
        self._inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._buckets: dict[Bucket, BucketRecord] = {}
        self._lanes: dict[str, Lane] = {start.label: start}
        self._releases: list[tuple[float, str]] = []
        self._status: dict[Bucket, BucketTuning] = {}  # replaced per key: read by any thread
        self._notes: dict[Bucket, str] = {}
        self.closing = False
        self.frozen = threading.Event()  # set once a freeze() is applied: no check, race or re-check from then on
        self._freezing = False  # asked (from any thread); the controller's thread applies it
        self._applied_freeze = False
        self._order = lab.order()
        router.set_lanes(self._lanes, self._order)

    # ------------------------------------------------------------------ what other threads call
    def notify(self, event: Event) -> None:
        """The router's inbox (never blocks)."""
        self._inbox.put(event)

    def freeze(self) -> None:
        """Stop tuning, from any thread (``cm.freeze()``): applied at the controller's next step.

        Every bucket keeps what serves it (one under a race is decided as it stands), no re-check follows, and a
        bucket first called later is served by its cached decision or the start, unchecked. A check in progress ends
        after the candidate it is on.
        """
        self.frozen.clear()  # set again once this request is applied, to the buckets called before it too
        self._freezing = True
        self._inbox.put(Event("freeze", ()))

    def recheck_now(self, key: Bucket) -> None:
        """Race bucket ``key``'s runners-up now rather than at their re-check (``cm.tune()``: nothing left untimed)."""
        self._inbox.put(Event("recheck", key))

    def status(self) -> tuple[BucketTuning, ...]:
        """Where every bucket seen stands.

        The controller's last record of each, with the router's call count and serving candidate as of now
        (each read is one reference: no lock, no torn record).
        """
        known = dict(self._status)
        out = []
        for key, route in self._router.routes().items():
            status = known.get(key)
            if status is None:  # called, not yet seen by the controller
                status = BucketTuning(bucket_label(key), key, "tuning", Phase.NEW.value, route.serving.label, 0,
                                      None, None)
            out.append(dataclasses.replace(status, calls=route.tally.calls, serving=route.serving.label))
        return tuple(out)

    def notes(self) -> list[str]:
        """One plan note per bucket that was checked or decided."""
        return list(self._notes.values())

    # ------------------------------------------------------------------ the loop
    def step(self) -> float:
        """Do what is due now; return the clock time at which something falls due next (inf: only an event)."""
        while True:
            try:
                self._receive(self._inbox.get_nowait())
            except queue.Empty:
                break
        wake = math.inf
        for b in list(self._buckets.values()):
            if self.closing:
                return math.inf
            wake = min(wake, self._advance(b))
            self._refresh(b)
        now = self._clock()
        due = [lb for t, lb in self._releases if t <= now]
        self._releases = [(t, lb) for t, lb in self._releases if t > now]
        for label in due:
            if not self._wanted(label):
                self._lanes.pop(label, None)
                self._router.set_lanes(self._lanes, self._order)
                self._lab.release(label)
        if self._releases:
            wake = min(wake, min(t for t, _ in self._releases))
        if self._applied_freeze:
            self._applied_freeze = False
            self.frozen.set()
        return wake

    def _receive(self, event: Event) -> None:
        if event.kind == "freeze":
            for b in self._buckets.values():
                self._freeze(b)
            self._applied_freeze = True  # acknowledged at the end of the step: new buckets are decided by then
            return
        if event.kind == "new":
            record = BucketRecord(event.key, event.sample, incumbent=self._start.label,
                                  first_shapes=shapes_label(event.sample or {}))
            self._buckets.setdefault(event.key, record)
            return
        b = self._buckets.get(event.key)
        if b is None:
            return
        if event.kind == "recheck":
            if b.phase is Phase.DECIDED and b.runners and not self._freezing:
                b.recheck_at = self._clock()
            return
        b.results[event.label] = CandidateResult(event.label, None, "failed", event.why)
        b.lanes.pop(event.label, None)
        if event.label in b.runners:
            b.runners.remove(event.label)
        if b.incumbent == event.label:
            b.incumbent = event.answered_by
            b.lanes.setdefault(event.answered_by, self._lane(event.answered_by, None) or self._start)
        if b.race is not None:  # the round's turns may name the candidate that fails: the next round is planned anew
            b.race.drop(event.label, b.incumbent, b.lanes[b.incumbent])
        self._note(b, f"{event.answered_by} serves ({event.label} failed on a real call: {event.why})")

    def _advance(self, b: BucketRecord) -> float:
        """Move one bucket on as far as it can go now; the clock time it next needs attention."""
        try:
            if b.phase is Phase.NEW:
                self._begin(b)
            if b.phase is Phase.RACING:
                wake = self._race(b)
                if b.phase is Phase.RACING:
                    return wake
            if b.phase is Phase.DECIDED and b.recheck_at is not None:  # a re-check due at once starts at once
                if self._clock() >= b.recheck_at or self._load_arrived(b):
                    self._recheck(b)
                    return self._race(b) if b.phase is Phase.RACING else math.inf
                return min(b.recheck_at, self._clock() + self._policy.idle_poll_s) if self._layouts_pending(b) \
                    else b.recheck_at
        except Exception as e:  # tuning never takes the model down: the bucket keeps what serves it
            logger.warning("auto (online): tuning bucket %s of %r failed: %s", bucket_label(b.key), self._name,
                           first_line(e))
            if b.phase is not Phase.DECIDED:
                if b.race is not None:
                    b.race.stop()
                b.runners = []
                self._decide(b, f"as it stood when tuning failed ({first_line(e)})")
        return math.inf

    # ------------------------------------------------------------------ check and compile
    def _freeze(self, b: BucketRecord) -> None:
        """Decide ``b`` as it stands, with nothing to re-check (:meth:`freeze`)."""
        if b.phase is Phase.DECIDED:
            b.recheck_at, b.runners = None, []
            self._publish(b)
        elif b.phase is not Phase.NEW:  # a race: its probe ends, the one serving keeps the bucket
            if b.race is not None:
                b.race.stop()
            b.runners = []
            self._decide(b, "as it stood when tuning was frozen (cm.freeze())")

    def _begin(self, b: BucketRecord) -> None:
        b.race_from = self._route(b).tally.first_call
        cached = self._lab.cached(b.key)
        if self._freezing and cached is None:  # frozen: the start serves, unchecked
            self._decide(b, "unchecked: tuning was frozen (cm.freeze()) before its first call")
            return
        if cached is not None:
            enter(b, Phase.INSTALLING)
            lane = self._lane(cached, None)
            if lane is not None:
                b.incumbent, b.lanes = cached, {cached: lane}
                measured = self._lab.accuracy_of(b.key)
                if measured:
                    b.accuracy[cached] = measured
                self._decide(b, f"{cached} (decision read from the autotune cache)")
                return
        elif self._confirm is not None and b.key == self._confirm[0]:
            b.lanes = {lane.label: lane for lane in (self._start, *self._confirm[1])}
            for lane in self._confirm[1]:
                self._lanes[lane.label] = lane
            self._router.set_lanes(self._lanes, self._order)
            enter(b, Phase.RACING)
            self._start_race(b, {})
            return
        enter(b, Phase.CHECKING)
        self._refresh(b)
        paced_for_s = max(0.0, self._policy.check_paced_until(b.race_from) - self._clock())
        result = self._lab.check(b.sample or {}, lambda: self.closing or self._freezing, paced_for_s=paced_for_s)
        if self.closing:  # stopping (online.stop_all): no compile starts, nothing is decided or cached
            return
        if self._freezing:
            self._decide(b, "as it stood when tuning was frozen (cm.freeze()), during its check")
            return
        self._compile(b, result)

    def _compile(self, b: BucketRecord, result: CheckResult) -> None:
        for label, cosine in result.accuracy:
            b.accuracy[label] = f"min cosine vs fp32 {cosine} on the bucket's first real input"
        for label, why in result.rejected:
            b.results[label] = CandidateResult(label, None, "rejected", why)
        passed = [lb for lb, _ in result.passed]
        if not passed:
            self._decide(b, "no candidate passed the check on a real input; "
                         + "; ".join(f"rejected {lb}: {why}" for lb, why in result.rejected))
            return
        warm = dict(result.passed)
        if b.incumbent not in passed:  # the start failed the check on the real input: replaced at once, by the first
            b.lanes.pop(b.incumbent, None)  # candidate that passed and compiles (before the others are compiled)
            for label in passed:
                if self.closing:
                    return
                lane = self._lane(label, b.sample)
                if lane is None:
                    b.results[label] = CandidateResult(label, None, "failed", "could not compile in this process")
                    continue
                was, b.incumbent, b.lanes[label] = b.incumbent, label, lane
                logger.warning("auto (online): %s for %r failed the check on a real input; %s serves", was,
                               self._name, label)
                self._publish(b)
                break
            else:
                self._decide(b, "no candidate that passed the check compiled here")
                return
        enter(b, Phase.COMPILING)
        self._refresh(b)
        if self._overlapping(b):
            layouts = self._layouts(b, passed)
            passed += layouts
            warm.update({lb: warm.get(split_layout(lb)[0]) for lb in layouts})  # the same kernels as their default
        fastest = min((w for w in warm.values() if w), default=None)
        for label in passed:
            if self.closing:  # each compile is a native call the stop waits for: none starts once it is asked
                return
            if label in b.lanes or label in b.results:
                continue
            # the check's warm runs are CPU seconds: spread over every core, this one's wall time is at least its CPU
            # time over the cores, the fastest's at most its CPU time (it ran on at least one core while it ran)
            floor = warm[label] / fastest / result.cores if warm.get(label) and fastest else 0.0
            if label != b.incumbent and floor >= self._policy.prune_ratio:
                b.results[label] = CandidateResult(label, race.check_ratio(warm, label, b.incumbent), "slower",
                                                   f"pruned: at least {floor:.3g}x the fastest candidate's time by "
                                                   f"the check (prune_ratio {self._policy.prune_ratio:g})")
                continue
            ratio = race.check_ratio(warm, label, b.incumbent)
            why = race.unaffordable(self._policy, ratio, self._turn_s(b), b.race_from, self._deadline(b))
            if why and label != b.incumbent:  # not compiled: compiling costs the callers too, for nothing
                b.results[label] = CandidateResult(label, ratio, "slower", why)
                continue
            lane = self._lane(label, b.sample)
            if lane is None:
                b.results[label] = CandidateResult(label, None, "failed", "could not compile in this process")
            else:
                b.lanes[label] = lane
        if b.incumbent not in b.lanes:
            self._decide(b, "no candidate that passed the check compiled here")
            return
        b.sample = None
        enter(b, Phase.RACING)
        tally = self._route(b).tally
        serving_s = tally.last_s or b.lanes[b.incumbent].warm_s
        self._start_race(b, race.estimates(b.lanes, warm, b.incumbent, serving_s), (tally.served_s, tally.served))

    def _join_layouts(self, b: BucketRecord, r: Race) -> None:
        """The layouts of the racing candidates join the race: its turns showed calls in flight together."""
        for label in self._layouts(b, list(r.lanes)):
            if self.closing:
                return
            lane = self._lane(label, None)
            if lane is None:
                b.results[label] = CandidateResult(label, None, "failed", "could not compile in this process")
                continue
            b.lanes[label] = lane
            base = split_layout(label)[0]
            r.join(label, lane, 1.0 if base == r.incumbent else r.ratio(base))

    def _layouts(self, b: BucketRecord, labels: list[str]) -> list[str]:
        """The layouts of ``labels`` not yet tried for bucket ``b`` (calls overlap: see ``concurrent_calls``)."""
        out = [v for lb in labels for v in self._lab.layouts(lb) if v not in labels and v not in b.results]
        if out:
            self._note(b, f"calls overlap (about {self._load(b):.2g} in flight): the layouts {', '.join(out)} race too")
        b.layouts_tried = True
        return out

    def _overlapping(self, b: BucketRecord) -> bool:
        """Whether the model's calls overlap enough for the layouts to race (:meth:`TuningPolicy.concurrent`)."""
        return self._policy.concurrent(*self._busy(b))

    def _load(self, b: BucketRecord) -> float:
        """The model's calls in flight on average since the bucket's mark (Little's law, :meth:`_busy`)."""
        busy, elapsed = self._busy(b)
        return busy / elapsed if elapsed > 0 else 0.0

    def _busy(self, b: BucketRecord) -> tuple[float, float]:
        """The seconds the model's calls were in flight since the bucket's mark, and the clock's seconds since it.

        Every bucket's calls and race turns count: a server's load spreads over its batch sizes, and a candidate's
        replicas serve every bucket it serves, so one bucket's calls alone may never overlap while the model's do.
        (0, 0) before the model's first call.
        """
        since, busy = b.load_mark or (self._router.first_call, 0.0)
        if since is None:
            return 0.0, 0.0
        return self._router.busy_s - busy, self._clock() - since

    def _lane(self, label: str, sample: dict[str, Any] | None) -> Lane | None:
        lane = self._lanes.get(label) or self._lab.lane(label, sample)
        if lane is not None and label not in self._lanes:
            self._lanes[label] = lane
            self._router.set_lanes(self._lanes, self._order)
        return lane

    # ------------------------------------------------------------------ the race
    def _start_race(self, b: BucketRecord, estimates: dict[str, float], precharge: tuple[float, int] | None = None,
                    calls_from: int = 0) -> None:
        # a check that ran past its paced share of the bound (a loaded machine, a large model) does not eat the turns:
        # its overrun counts as a pause, so the race has the rest of the bound from its start (issue 51: decided on
        # real turns, not at a bound the check used up)
        overrun = self._clock() - self._policy.check_paced_until(b.race_from)
        b.paused_s, b.seen = max(0.0, overrun), None
        b.race = Race.between(b.incumbent, b.lanes, b.race_from, estimates, precharge, calls_from,
                              frozenset(b.untimed))
        if b.race.over:
            self._decide(b, "as the only candidate left after the check")
            return
        logger.info("auto (online): %s bucket %s: racing %s against %s (estimated ratios %s)", self._name,
                    bucket_label(b.key), ", ".join(b.race.logs), b.incumbent,
                    ", ".join(f"{lb} {r:.3g}" for lb, r in b.race.estimate.items()))

    def _race(self, b: BucketRecord) -> float:
        """Run the rounds of turns and judge each round when it is over.

        The rounds are :func:`.race.plan`'s: paced by the tax budget, the last ending before the bound.
        """
        r = b.race
        assert r is not None
        now = self._clock()
        self._count_pause(b, now)
        if r.probe is not None:
            if now < r.probe.end:
                return r.probe.end
            probe, r.probe = r.probe, None
            race.judge(r, probe, self._policy)
            self._sync(b)
            in_flight_s = sum(s for *_, s in probe.records)  # the turns' calls' seconds: calls in flight by Little
            if not b.layouts_tried and (self._policy.concurrent(in_flight_s, probe.end - probe.start)
                                        or self._overlapping(b)):  # or the model's calls
                self._join_layouts(b, r)
            if r.over:
                self._decide(b, "by the paired turns")
                return math.inf
            self._publish(b)
        tally = self._route(b).tally
        planned = race.plan(r, self._policy, now, self._turn_s(b), self._deadline(b), tally.calls, tally.last_s)
        self._sync(b)
        if isinstance(planned, Probe):
            r.probe = planned
            self._publish(b)
            return planned.end
        if planned == race.CONCLUDE:
            out_of_time = now + 4 * self._turn_s(b) > self._deadline(b)
            race.conclude(r, self._policy)
            self._sync(b)
            self._decide(b, "at the time bound" if out_of_time else
                         "by the paired turns (the tax budget cannot pay for the remaining candidates' turns)")
            return math.inf
        return planned

    def _sync(self, b: BucketRecord) -> None:
        """What the race found becomes the bucket's: who serves, and each candidate's result."""
        r = b.race
        if r is not None:
            b.incumbent = r.incumbent
            b.results.update(r.results)
            b.runners = list(r.runners)
            b.untimed = dict(r.untimed)

    def _turn_s(self, b: BucketRecord) -> float:
        return self._policy.turn_s(self._route(b).tally.last_s)

    def _deadline(self, b: BucketRecord) -> float:
        """The bound of the bucket's race: ``decide_within_s`` of its own traffic (pauses do not count)."""
        tally = self._route(b).tally
        since = tally.calls - (b.race.calls_from if b.race is not None else 0)  # the calls of this race
        return self._policy.deadline(b.race_from + b.paused_s, tally.last_s, since, self._clock())

    def _count_pause(self, b: BucketRecord, now: float) -> None:
        """Time in which the bucket had no call is a pause: the race waits for calls and its bound moves with it.

        Read between the controller's looks at the race (every turn's end, each planned round, the idle poll): an
        interval without a call counts whole. So a race that falls in a pause is not concluded with its candidates
        untimed, and a bucket that sees traffic only in bursts is decided after a bounded amount of its traffic.
        """
        calls = self._route(b).tally.calls
        if b.seen is not None and calls == b.seen[0]:
            b.paused_s += now - b.seen[1]
        b.seen = (calls, now)

    def _decide(self, b: BucketRecord, why: str) -> None:
        now = self._clock()
        self._sync(b)
        b.race = None
        enter(b, Phase.DECIDED)
        took, calls = now - b.race_from, self._route(b).tally.calls
        again = b.decided_at is not None
        if not again:  # a re-check's decision keeps the first one's time and calls (cm.tuning)
            b.decided_at, b.decided_calls = took, calls
        b.results[b.incumbent] = CandidateResult(b.incumbent, 1.0, "serving")
        b.runners = [lb for lb in b.runners if lb in b.lanes and lb != b.incumbent]
        b.load_mark = (now, self._router.busy_s)  # the load a re-check sees is counted from here
        if self._freezing:
            b.runners, b.recheck_at = [], None
        elif any(race.gains(self._policy, b.untimed.get(lb)) for lb in b.runners):
            b.recheck_at = now  # an untimed runner the check put faster: its turns pay for themselves (race.plan)
        elif b.runners or self._layouts_pending(b):  # load that comes later gets its layouts at a re-check
            b.recheck_every = b.recheck_every * 2 if b.recheck_every else self._policy.recheck_after_s
            b.recheck_at = now + b.recheck_every
        else:
            b.recheck_at = None
        self._publish(b)
        ratios = ", ".join(f"{r.label} {r.ratio:.3f}" for r in b.results.values() if r.ratio is not None)
        self._note(b, f"{b.incumbent} serves, {'re-' if again else ''}decided {why} after {took:.3g} s"
                   + (" of re-check" if again else f" and {calls} calls")
                   + (f" (time relative to it: {ratios})" if ratios else "")
                   + (f"; its accuracy: {b.accuracy[b.incumbent]}" if b.incumbent in b.accuracy else ""))
        for label in list(self._lanes):
            if not self._wanted(label):
                self._releases.append((now + self._policy.release_grace_s, label))
        try:
            self._lab.persist(b.key, b.incumbent, b.accuracy.get(b.incumbent))
        except Exception as e:  # a cache that cannot be written costs the next compile its turns, nothing more
            logger.info("auto (online): decision of bucket %s not cached: %s", bucket_label(b.key), first_line(e))

    def _load_arrived(self, b: BucketRecord) -> bool:
        """Whether the calls of a decided bucket whose layouts never raced overlap now: its re-check starts at once.

        The load is read over windows of at least ``idle_poll_s`` (the controller looks that often), restarted after
        four of them, so load that comes long after the decision is seen within seconds, not diluted by the quiet.
        """
        if b.load_mark is None or not self._layouts_pending(b):
            return False
        elapsed = self._clock() - b.load_mark[0]
        if elapsed < self._policy.idle_poll_s:
            return False
        if self._overlapping(b):
            return True
        if elapsed >= 4 * self._policy.idle_poll_s:
            b.load_mark = (self._clock(), self._router.busy_s)
        return False

    def _layouts_pending(self, b: BucketRecord) -> bool:
        """Whether the serving candidate has layouts that never raced here (the calls did not overlap)."""
        return self._policy.concurrent_calls > 0.0 and not b.layouts_tried and bool(self._lab.layouts(b.incumbent))

    def _recheck(self, b: BucketRecord) -> None:
        """Let the runners-up take turns with the bucket's candidate again, by the same rule.

        Where the calls overlap now and the serving candidate's layouts never raced, they join the runners.
        """
        runners = [lb for lb in b.runners if lb in self._lanes]
        b.runners = []
        if self._layouts_pending(b) and self._overlapping(b):
            for label in self._layouts(b, [b.incumbent]):
                if self.closing:
                    return
                lane = self._lane(label, None)
                if lane is not None:
                    runners.append(label)
                else:
                    b.results[label] = CandidateResult(label, None, "failed", "could not compile in this process")
        if not runners:
            if self._layouts_pending(b):  # still a lone caller: look again later
                b.recheck_every *= 2
                b.recheck_at = self._clock() + b.recheck_every
                b.load_mark = (self._clock(), self._router.busy_s)
            else:
                b.recheck_at = None
            return
        b.lanes = {lb: self._lanes[lb] for lb in (b.incumbent, *runners)}
        b.race_from = self._clock()
        enter(b, Phase.RACING)
        self._start_race(b, {lb: (b.results[lb].ratio or 1.0) if lb in b.results else 1.0 for lb in runners},
                         calls_from=self._route(b).tally.calls)

    # ------------------------------------------------------------------ publishing
    def _route(self, b: BucketRecord) -> Route:
        route = self._router.route(b.key)
        assert route is not None, "a bucket the router never opened"
        return route

    def _publish(self, b: BucketRecord) -> None:
        self._router.publish(b.key, Route(b.lanes.get(b.incumbent) or self._lanes[b.incumbent], self._route(b).tally,
                                          b.race.probe if b.race is not None else None))

    def _wanted(self, label: str) -> bool:
        return label == self._start.label or any(
            label == b.incumbent or label in b.runners or (b.race is not None and label in b.race.logs)
            or (b.phase is not Phase.DECIDED and label in b.lanes) for b in self._buckets.values())

    def _note(self, b: BucketRecord, text: str) -> None:
        seen = f" (first call {b.first_shapes})" if b.first_shapes and b.first_shapes != bucket_label(b.key) else ""
        self._notes[b.key] = f"bucket {bucket_label(b.key)}{seen}: {text}"
        logger.info("auto (online): %s: %s", self._name, self._notes[b.key])

    def _refresh(self, b: BucketRecord) -> BucketTuning:
        route = self._router.route(b.key)
        calls = route.tally.calls if route is not None else 0
        serving = route.serving.label if route is not None else b.incumbent
        results = dict(b.results)
        for label, logs in (b.race.logs if b.race is not None else {}).items():
            results[label] = CandidateResult(label, math.exp(statistics.fmean(logs)) if logs else None, "open")
        if b.phase is not Phase.DECIDED:
            results[serving] = CandidateResult(serving, 1.0, "serving")
        status = BucketTuning(
            bucket_label(b.key), b.key, "decided" if b.phase is Phase.DECIDED else "tuning", b.phase.value, serving,
            calls, b.decided_calls, b.decided_at, tuple(results.values()),
            None if b.recheck_at is None or route is None else b.recheck_at - route.tally.first_call, b.first_shapes)
        self._status[b.key] = status
        return status
