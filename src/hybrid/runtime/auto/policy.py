"""The policy of online tuning: every number the tuner decides by, in one frozen record (docs/auto.md).

The tuner's data plane (:mod:`.router`) only routes and records; its controller (:mod:`.controller`) reads
every threshold from a :class:`TuningPolicy` and the time from an injected clock, so the same rule holds on
another machine and is tested on scripted time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hybrid.config import AutotuneSettings

__all__ = ["STOP_WAIT_S", "Clock", "TimingPolicy", "TuningPolicy", "monotonic"]

Clock = Callable[[], float]  # seconds, monotonic: time.perf_counter in production, a script in tests

STOP_WAIT_S = 30.0  # at interpreter exit and on ``cm.close()``, a controller's thread gets this long to end the native
# call it is in (a candidate's compile, a check in its own thread) before the interpreter goes on without it. A daemon
# thread that comes back from ONNX Runtime's or OpenVINO's C++ once the interpreter finalizes is ended by
# ``pthread_exit`` through their frames, and libstdc++ aborts the process (issue 54): so the order is
# :func:`hybrid.runtime.auto.online.stop_all`'s, the only place it is written


monotonic: Clock = time.perf_counter  # the production clock (itself, not a wrapper: the router reads it twice a call)


@dataclass(frozen=True, slots=True)
class TuningPolicy:
    """How a shape bucket is decided on real calls. Each field is a statistical or a cost bound.

    Attributes:
        decide_within_s: A bucket is decided at most this long after its first call (the check and the
            compiles included), or after ``decide_within_calls`` calls of the serving candidate where that is
            longer. Until then the sequential test runs; at the bound the point estimate decides.
        decide_within_calls: See ``decide_within_s``: the bound for slow models, in calls.
        max_tax: The mean latency tuning may add while a bucket is tuned, as a share of the serving candidate's
            (0.1: the calls are on average at most 10 % slower). Charged as the callers felt it: each round's calls
            beyond the serving candidate's speed in the round's first turn (lead-ins and a runtime's lingering
            threads included), and the check and the compiles after a baseline turn
            (:func:`.race.precharge_cost`); paid for by the calls' own time, not the clock's
            (:meth:`next_round_at`). A slower candidate under test is given its turns only as often as this
            allows: rounds of turns are spaced by a rest in which the serving candidate answers every call. A
            faster one's turns pay the tax back, and its rounds are not held back (:func:`.race.plan`).
        confidence: Confidence of the interval of the mean log-ratio of paired turns (Student's t). A candidate
            is faster or slower only when the whole interval lies beyond the tie band, tied when it lies inside.
        tie_rel: Half-width of the tie band: candidates whose speed ratio to the serving one lies within
            ``1 +/- tie_rel`` tie, and the serving one keeps the bucket.
        calls_per_turn: Calls a turn should time at the serving candidate's speed (its length follows).
        min_turn_s: A turn lasts at least this long: a runtime's thread pool needs tens of milliseconds to reach
            the speed at which it serves a stream of calls, and the one before it may still spin that long.
        lead_share: The first share of every turn is served but not timed (that warm-up, and the spinning of the
            candidate before).
        recheck_after_s: After a decision, candidates that were not clearly slower take turns again this long
            later, by the same rule (then twice as long after each re-check); one that does not win leaves.
        check_share: The share of the wall time the background check may run, in CPU time (it is paced to it).
            By default ``max_tax``, whatever the cores: while it runs, a runtime whose operators fork and join
            across every core waits at each join for the thread the check delays (a 30 us model's calls took
            2.3x as long beside the unpaced check on 2 cores, where the check's share of the cores predicts
            1.5x), so the callers pay for the check's running time, not for its share of the cores; at about
            twice their time while it runs, ``max_tax`` of it keeps their tax near ``max_tax``. Paced for the
            first half of the bound at most (``check_paced_share``); what it cost the callers is measured and
            charged all the same (``max_tax``).
        check_idle_s: The check process ends once it has had no request for this long, and starts again when a check
            needs it (its start-up, the imports of the candidates' libraries, costs about a second of CPU). It holds
            every candidate's runtime and what their checks allocated (hundreds of MB for a MiniLM-sized model); a
            bucket is decided within ``decide_within_s`` of its first call, so a process idle that long has seen its
            burst of checks end, and a new shape's check pays the start-up once.
        concurrent_calls: The mean number of calls in flight (the callers' seconds per second of the clock, by
            Little's law) at which the layouts made for concurrent callers (:meth:`hybrid.hal.Backend.layouts`) race
            too. A lone caller in a loop keeps at most one call in flight, whatever its speed or the machine's: 1.5
            is half-way to the least concurrency a layout of replicas can use. 0 turns layouts off.
        replica_bytes: The weights (bytes) a layout's extra replicas may hold in all: one whose replicas would hold
            more is not tried (``replica_memory_mb``).
        check_paced_share: The check is paced to ``check_share`` for at most this share of ``decide_within_s`` from
            the first call, then runs unpaced: a check that needs more CPU than the pace allows (a large model's
            reference run, a new process's imports) must leave the turns the rest of the bound.
        idle_window_s: While the check is paced, the machine's idle CPU is read over windows this long; once a window
            shows at least ``check_share`` of a core idle, the check process's threads move to the idle class
            (Linux ``SCHED_IDLE``: they run only on a core nothing else wants and give it up at once) and are neither
            paced nor run unpaced at the callers' expense any more. Callers that leave a core idle that long (an open
            loop below capacity, a pause) have their share to spare, and the idle class then gets the check at least
            the pace's CPU without the stalls a paced process in the normal class causes them (it holds a core for
            the scheduler's slice when a caller's operator wakes a thread there); callers that leave none (a closed
            loop, a saturated server) are paced and charged as before. Under calls due at a fixed rate at 50 % load
            the unpaced half of the bound was where the calls queued (benchmarks/RESULTS.md
            "check_cost_idle_class"). Long enough to hold over a hundred of the scheduler's ticks (4 ms), short against
            the paced half of the bound. 0: never.
        release_grace_s: A candidate that serves no bucket any more is closed this much later (a call it was
            answering when the route changed has ended by then).
        idle_poll_s: The controller's thread wakes this often with nothing due (to notice a model collected).
        prune_ratio: A candidate the check shows at least this many times slower than the fastest is not compiled or
            timed on real calls (its reason says so in ``cm.tuning``; torch on an ONNX CNN measured 2.6-31x). The check
            keeps each candidate's least warm run, side by side in one process (a burst of load slows a run and never
            speeds one up), in CPU seconds; its wall time is at least those over the cores it could spread them on,
            the fastest's at most its own. So the bound is read from that floor, which holds whatever the threading,
            and a gap this wide leaves no turn of the race a chance to reverse it.
    """

    decide_within_s: float = 30.0
    decide_within_calls: int = 200
    max_tax: float = 0.10
    confidence: float = 0.90
    tie_rel: float = 0.02
    calls_per_turn: int = 8
    min_turn_s: float = 0.2
    lead_share: float = 0.25
    recheck_after_s: float = 60.0
    check_share: float = 0.1
    check_idle_s: float = 30.0
    concurrent_calls: float = 1.5
    replica_bytes: float = 2048e6
    prune_ratio: float = 2.5
    check_paced_share: float = 0.5
    idle_window_s: float = 0.5
    release_grace_s: float = 2.0
    idle_poll_s: float = 5.0

    @classmethod
    def from_settings(cls, settings: AutotuneSettings) -> TuningPolicy:
        """The policy that ``hybrid.init({'autotune': {...}})`` asks for."""
        share = settings.overhead_cap
        if share is None:
            share = min(1.0, settings.max_tax)
        return cls(decide_within_s=settings.decide_within_s, max_tax=settings.max_tax,
                   confidence=settings.confidence, tie_rel=settings.tie_rel,
                   calls_per_turn=settings.calls_per_bucket, recheck_after_s=settings.recheck_after_s,
                   check_share=share, replica_bytes=settings.replica_memory_mb * 1e6,
                   **({} if settings.layouts else {"concurrent_calls": 0.0}))

    def concurrent(self, busy_s: float, elapsed_s: float) -> bool:
        """Whether calls overlap enough for the concurrent layouts to race (``concurrent_calls``).

        ``busy_s``: the seconds the calls were in flight, summed over the calls, during ``elapsed_s`` of the clock.
        """
        return self.concurrent_calls > 0.0 and elapsed_s > 0.0 and busy_s / elapsed_s >= self.concurrent_calls

    def check_paced_until(self, first_call: float) -> float:
        """When the check of a bucket first called at ``first_call`` runs unpaced (``check_paced_share``)."""
        return first_call + self.check_paced_share * self.decide_within_s

    def deadline(self, first_call: float, call_s: float, calls: int = 0, now: float | None = None) -> float:
        """When a bucket whose first call came at ``first_call`` is decided.

        ``decide_within_s`` later, or when its ``decide_within_calls``-th call is due where that is later: the
        ``calls`` made by ``now`` (default: none, at the first call) and the rest at ``call_s`` each. Counted, not
        assumed from one call's time: a call slowed 2x beside the check would otherwise push the bound of a model
        that has made its 200 calls long ago.
        """
        bound = first_call + self.decide_within_s
        if calls >= self.decide_within_calls:
            return bound
        return max(bound, (first_call if now is None else now) + (self.decide_within_calls - calls) * call_s)

    def turn_s(self, call_s: float) -> float:
        """How long a turn lasts for calls of ``call_s``: ``calls_per_turn`` timed calls after the lead-in."""
        return max(self.min_turn_s, self.calls_per_turn * call_s / (1.0 - self.lead_share))

    def round_extra_s(self, turn_s: float, ratios: list[float]) -> float:
        """The seconds a round of turns adds for candidates under test at ``ratios`` of the serving one's call time.

        Where one call after another keeps the model busy (a load of 1): each challenger has two turns, and each
        turn costs ``turn_s * (ratio - 1)`` more. At another load ``u`` (calls per second times a call's seconds)
        it costs ``u`` times that (:meth:`next_round_at`).
        """
        return sum(2.0 * turn_s * max(0.0, r - 1.0) for r in ratios)

    def next_round_at(self, now: float, spent_s: float, extra_s: float, round_s: float, calls: int, rate: float,
                      call_s: float) -> float:
        """When a round that adds ``extra_s`` may start, the work before it having added ``spent_s``.

        The budget is ``max_tax`` of the **calls' own time**: the ``calls`` served since tuning began, each worth
        the serving candidate's ``call_s``, and those that come at ``rate`` per second until the round ends. So
        the tax is a share of the callers' mean latency whatever the load, and a caller that pauses does not pay
        for turns with its pauses (the clock's time would). With no calls coming (``rate`` 0) nothing accrues:
        the round is asked about again one ``round_s`` later.
        """
        if call_s <= 0.0:
            return now + round_s
        need = (spent_s + extra_s) / (self.max_tax * call_s) - rate * round_s  # calls served before it starts
        if calls >= need:
            return now
        return now + (need - calls) / rate if rate > 0.0 else now + round_s


@dataclass(frozen=True, slots=True)
class TimingPolicy:
    """How candidates are timed and judged at compile (declared, sample or static shapes): every number, in one record.

    The sibling of :class:`TuningPolicy` for the offline search (:mod:`.timing`, :mod:`.judge`, :mod:`.search`);
    ``hybrid.init({'autotune': {...}})`` sets ``time_budget_s``, ``tie_rel`` and ``tie_us``
    (:meth:`from_settings`), the rest are the method's own.

    Attributes:
        time_budget_s: Measuring time per candidate, at most.
        blocks: Rounds of paired blocks A X X A a challenger gets at most.
        max_block_calls: A block ends after this many timed calls (a 0.1 ms graph: 50 ms, not 0.2 s).
        lead_s, lead_calls: The calls of a block's first ``lead_s`` (at most ``lead_calls``) are run but not counted:
            a runtime whose pool idled takes that long to run at the speed it serves a stream of calls with.
        quick_s: A graph whose fastest candidate runs in less than this is timed quickly: a pause of
            ``quick_pause_s`` between blocks instead of :func:`.timing.settle`, blocks of ``quick_block_calls`` calls
            after as many lead-in calls (ONNX's node tests through ``target='auto'``: 0.013 s a case, 0.8 s otherwise).
        settle_max_s: The longest :func:`.timing.settle` waits (ONNX Runtime's idle threads spin 40-50 ms after a
            run on a 2-core machine).
        quiet_poll_s: :func:`.timing.settle` reads the process clock over windows this long: a thread on another
            core is charged at the scheduler's tick (4 ms), so a window must hold a tick even at HZ=100.
        quiet_share: The process is quiet when its threads use less than this share of one core.
        tie_rel, tie_us: Timings within ``tie_rel`` of the fastest, or ``tie_us`` microseconds where the fastest runs
            under ``tiny_s``, tie, and the tie goes to the answer closest to the reference (:mod:`.judge`): 2 % stays
            inside the 5 % auto may lose to the best single runtime; 20 us is the spread of medians between timings
            of one 15-40 us graph seconds apart on a shared machine.
        tiny_s: See ``tie_us``.
        exact_premium_rel, exact_premium_s: A candidate exact to the dtype's tolerance wins over a faster one that
            passed only the model-level tolerance when it is at most ``exact_premium_rel`` slower, capped at
            ``exact_premium_s`` (a few per cent is within a shared machine's timing noise; the answers' gap is not).
        deviation_floor: Answers this close to the reference (tolerance units) are equally exact: a tie between them
            goes to the fastest.
        confirm_ratio: Accelerated rivals timed within this of a winner that was the fastest stay compiled and confirm
            it on the first real calls (one timing at compile ranks a near tie the wrong way when the machine's state
            moves between compile and serving).
    """

    time_budget_s: float = 1.0
    blocks: int = 5
    max_block_calls: int = 500
    lead_s: float = 0.05
    lead_calls: int = 200
    quick_s: float = 2e-4
    quick_block_calls: int = 50
    quick_pause_s: float = 0.001
    settle_max_s: float = 0.15
    quiet_poll_s: float = 0.012
    quiet_share: float = 0.1
    tie_rel: float = 0.02
    tie_us: float = 20.0
    tiny_s: float = 1.5e-4
    exact_premium_rel: float = 0.03
    exact_premium_s: float = 200e-6
    deviation_floor: float = 0.01
    confirm_ratio: float = 1.5

    @classmethod
    def from_settings(cls, settings: AutotuneSettings) -> TimingPolicy:
        """The policy that ``hybrid.init({'autotune': {...}})`` asks for."""
        return cls(time_budget_s=settings.time_budget_s, tie_rel=settings.tie_rel, tie_us=settings.tie_us)

    @property
    def tie_bounds(self) -> tuple[float, float]:
        """(relative, absolute seconds) within which a timing ties with the fastest."""
        return self.tie_rel, self.tie_us * 1e-6

    def tie_slack(self, best: float) -> float:
        """Seconds by which a timing may exceed the fastest, ``best``, and still tie with it.

        ``tie_rel`` of it, or ``tie_us`` where the fastest runs under ``tiny_s`` a call. There the spread between two
        timings of one graph is already up to ~20 us: differences that small cannot be ranked, and exactness decides
        (ONNX's STFT node test: the reference 7 us a call slower than ONNX Runtime, whose answer is 246 tolerance
        units off). On slower graphs 20 us would be more than the 5 % auto may lose (a 0.3 ms encoder: 6.7 %).
        """
        rel, abs_s = self.tie_bounds
        return max(rel * best, abs_s if best < self.tiny_s else 0.0)
