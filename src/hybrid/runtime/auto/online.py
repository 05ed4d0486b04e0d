"""Online auto-selection: decide per shape bucket on real calls (DESIGN 2.3).

A model whose inputs have dynamic dims, compiled with ``target='auto'`` and nothing declared about
its shapes, starts on the first candidate by priority that passed the check (never the numpy
reference while an accelerated backend can run the graph) and is served by an :class:`OnlineTuner`.
Per shape bucket (:func:`~.shapes.bucket_of`):

1. The calls of a bucket are answered by the current executable; a copy of the third one's inputs goes
   to the check: every candidate compiled and run on that copy against the reference at model-level
   tolerance (the same check as ``compile(shapes=...)``), in a low-priority worker process (below), or in a
   background thread that sleeps to stay within ``overhead_cap`` of the wall time where the worker cannot
   see a backend or an op. A start that fails the check on the real input is replaced at once by the
   first candidate that passes.
2. The checked candidates then take turns answering real calls, each timed as it runs for the
   caller: the configuration that serves is the one measured. A turn is a run of consecutive calls, in
   the order A B ... B A (so that a drift of the machine falls on every candidate alike), each timing
   half of ``calls_per_bucket`` calls and at least :data:`TURN_MIN_S` of calls; the calls of a turn's
   first :data:`TURN_LEAD_S` (and one call duration) are served but not timed. When the fastest are
   within 10 % of each other after their turns, they take their turns once more. Alternating call by
   call would time each candidate while the one before it still holds a core (ONNX Runtime's idle
   threads spin 40-50 ms after a run) and before its own pool is awake: the encoder's OpenVINO measured
   0.45 ms that way, 0.28 ms serving a stream of calls.
   A candidate whose warm run in the check took more than :data:`WARM_RUN_RATIO` (2x) the serving one's is
   not compiled here nor tried (serving it would cost the callers latency), and one under test more than 1.1x
   slower than the best after four timed calls (and 50 ms of them) stops (the serving one takes every turn).
3. After the turns, the fastest median serves the bucket (the current one keeps
   it when within the tie bounds); the switch is one reference assignment, so concurrent callers
   each get a whole answer from one executable. The decision is written to the decision cache per
   bucket and read back on the next compile of the same model on this machine.
4. The runners-up (within :data:`RUNNER_RATIO` of the round's fastest, stopped ones included) take their
   turns with the winner again 1 s, 4 s and 16 s later at the earliest (step 5)
   (:data:`RECHECK_AFTER_S`), and the winner is the candidate whose median relative to each round's fastest is
   least over the rounds: on a shared machine one round of turns can meet a burst of load, and the best of a
   near tie moves with the machine's state. After the last round the losers are released.
5. Turns cost the callers latency: a candidate under test serves its calls at its own speed, and its first
   calls after the lead-in are slow ones too. So a round of turns (the first one included) starts only when
   the calls the candidates under test would answer in it, added to those they answered before, stay within
   ``explore_share`` of the bucket's calls (one in 200): until then the serving candidate answers every call.
   A caller's p99 is its 1 % point: the 0.65 ms CRNN's OpenVINO at 1.45x answered about 300 calls a round,
   10 % of the calls while tuning, and moved the p99 of the tuning calls by 28-68 %.

A model decided at compile (``shapes=``, ``sample_inputs=``, static shapes) whose timing found rivals within
:data:`CONFIRM_RATIO` of the winner is served by a tuner too (:class:`Confirmation`): the timed bucket starts
with the rivals already checked (at compile, on samples at those shapes) and they take turns with the winner on
the first real calls: a timing at compile ranks a gap of 5-25 % the wrong way when the machine's state moves
between compile and serving (the encoder: ONNX Runtime 1.26x ahead at compile, 1.14x behind serving in the
same process). The confirmed winner replaces the compile's decision in the decision cache. Other shapes are
tuned as above.

A call that fails on the executable serving it (a shape that backend cannot run) is answered by the
next candidate in priority order, which then serves the bucket.

The check runs where the callers leave a core idle (a SCHED_IDLE worker process, :mod:`.worker`). Callers
that never leave one idle (a saturated closed loop) would starve it; after ``YIELD_AFTER_S`` of a pending
check, the tuner opens short *yield windows* instead: the call that opens one, and every tuning call that
arrives while it is open, waits ``YIELD_CALLS`` times the bucket's call duration (20-400 ms) while the check
takes the cores. Windows are spaced so that at most ``YIELD_CALL_SHARE`` of the calls (one in 1000) ever
wait, and at most ``YIELD_WALL_SHARE`` of the wall time goes to them: the tuning cost lands on a bounded
share of calls, so the p50 and p99 of the callers stay as they are, where a check that shares the cores
(nice 10) would slow a tenth of all calls by a scheduler slice. For the same reason, the tuning calls also
wait while a candidate that passed the check is compiled in this process and run once (its first run pays
for lazy initialisation): seconds of compile on the callers' cores would slow hundreds of calls.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybrid.config import AutotuneSettings
from hybrid.errors import HybridError, first_line
from hybrid.hal import Candidate, is_installed_backend
from hybrid.hal.backend import Executable
from hybrid.ir import Model
from hybrid.runtime.auto import cache, judge, worker
from hybrid.runtime.auto.decision import decision_from_json
from hybrid.runtime.auto.shapes import bucket_of
from hybrid.runtime.auto.timing import NEAR_TIE_REL, warm_estimate
from hybrid.runtime.auto.tolerance import OutputRule
from hybrid.runtime.auto.trials import OptionsOf, Search, Trial, trial_of, trials
from hybrid.runtime.partition import FALLBACK_BACKEND

__all__ = ["CONFIRM_RATIO", "BucketStatus", "Confirmation", "OnlineTuner"]

logger = logging.getLogger("hybrid")

Bucket = tuple[tuple[str, tuple[int, ...]], ...]
PRUNE_AFTER = 4  # timed calls (and PRUNE_AFTER_S of them) after which a clearly slower candidate stops taking turns
PRUNE_AFTER_S = 0.05  # two calls of a 0.3 ms model are no measurement: OpenVINO on the encoder was stopped after
# two 0.4 ms calls while it serves at 0.25; nor are two of a 22 ms U-Net (ORT stopped at 31.9 ms, serving at 21.5)
PRUNE_RATIO = 1.1  # a slower candidate serves the callers at most this much slower for long (tuning p99 goal: 1.1x)
WARM_RUN_RATIO = 2.0  # a candidate whose warm run in the check took this much longer than the serving one's
# is not tried on real calls. The check process runs one thread per session where serving runs one per core, and
# runtimes gain unevenly from the second core: on the encoder OpenVINO's warm run in the check was 1.53x ONNX
# Runtime's, and it serves as fast or faster on two cores (1.25, the bound before, kept it out of the turns)
MAX_PAUSE_S = 2.0
CHECK_AT_CALL = 3  # a bucket is checked from its third call: shapes called once or twice are not worth tuning
IDLE_POLL_S = 5.0
MAX_ROUTES = 4096  # exact shape combinations remembered on the hot path (more still work, through bucket_of)
YIELD_AFTER_S = 2.0  # a check pending this long while calls keep coming: the callers leave no core idle
YIELD_CALL_SHARE = 0.001  # at most this share of the calls waits in a yield window. A caller's p99 is the 1 % point:
# on the 0.36 ms external-data model the windows at one call in 400 (each 40 call durations) plus the calls that
# ran slow anyway (0.6 % here, raw ONNX Runtime alike) put more than 1 % of the tuning calls past it (p99 2.5x the
# raw runtime's); one call in 1000, in windows 6x as long, leave it where the raw runtime's is and give the check
# more time, not less
YIELD_CALLS = 250  # a window lasts this many of the bucket's call durations (with one call in 1000 waiting, a
YIELD_MIN_S, YIELD_MAX_S = 0.02, 0.4  # fifth of the wall time), within these bounds
YIELD_WALL_SHARE = 0.2  # and the windows take at most this share of the wall time
RELEASE_GRACE_S = 2.0  # after the last bucket settled, the losers are closed this much later
TURN_LEAD_S = 0.1  # a turn's calls are timed from this long (plus one call) after it began: the pool of the
# candidate before may still spin (ONNX Runtime: 40-50 ms here), and this one's takes ~50 ms to reach its speed
# A call that follows a pause (no call of the bucket for GAP_CALLS call durations, and GAP_MIN_S) finds the pool
# idled and other work run meanwhile: the calls of the next GAP_LEAD_S are served but not timed either (callers in
# bursts; the benchmark's blocks), unless the turn has lasted TURN_PATIENCE_S (callers that pause between all calls)
GAP_CALLS, GAP_MIN_S, GAP_LEAD_S, TURN_PATIENCE_S = 4, 0.02, 0.05, 2.0
TURN_MIN_S = 0.05  # and a turn times calls for at least this long (4 calls of a 0.3 ms model are no measurement)
RECHECK_AFTER_S = (1.0, 4.0, 16.0)  # after a bucket settled, its runners-up take turns again this much later
# (then 4x later, then once more): the best runtime of a near tie moves with the state of a shared machine, and one
# round of turns met a burst of load (the detector's ORT timed at 10.6 ms in its turns, 8.3 ms serving after)
RUNNER_RATIO = 1.5  # a candidate within this of a round's fastest takes turns in the next round (a stopped one
# was timed on a few calls: the U-Net's ORT at 1.49x in one round, 0.85x in the benchmark's blocks)
CONFIRM_RATIO = 1.5  # rivals timed at compile within this of the winner confirm it on real calls: the
# encoder's ONNX Runtime was timed 1.26x faster than OpenVINO at compile, and served 1.14x slower in the same process
MAX_GATE_S = 5.0  # the longest a tuning call waits for a candidate being compiled in this process (a longer build,
# such as a TensorRT engine, then goes on beside the calls)


def _fmt(key: Bucket) -> str:
    return ", ".join(f"{n}: {'x'.join(map(str, s))}" for n, s in key) or "scalars"


@dataclass(frozen=True, slots=True)
class BucketStatus:
    """Where tuning stands for one shape bucket (``OnlineTuner.status()``).

    Attributes:
        bucket: Input name -> shape with dynamic dims rounded up to a power of two.
        state: 'checking', 'exploring', 'settled', 'installing' (a cached decision being compiled) or
            'confirming' (candidates waiting for their turns: a compile-time decision's first real call, see
            :class:`Confirmation`, or the calls that ``explore_share`` allows).
        serving: The candidate answering the bucket's calls now.
        calls: Calls of the bucket so far.
        settled_after: The call count at which the bucket settled (None: not yet).
        final: Settled with no round of turns still to come (:data:`RECHECK_AFTER_S`): what serves now keeps
            serving. A bucket can settle, then take its runners-up's turns again seconds later.
    """

    bucket: Bucket
    state: str
    serving: str
    calls: int
    settled_after: int | None
    final: bool = False


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A decision made at compile (declared, sample or static shapes) that real calls confirm (module doc).

    Attributes:
        sample: The sample the candidates were timed on (its bucket is the one confirmed).
        rivals: Checked candidates, compiled, timed within :data:`CONFIRM_RATIO` of the start at compile.
        save: Writes the confirmed winner as the compile's decision (the next compile starts on it).
    """

    sample: Mapping[str, Any]
    rivals: tuple[Trial, ...]
    save: Callable[[Trial], Any]


@dataclass(slots=True)
class _Slot:
    key: Bucket
    serving: tuple[str, Executable]
    state: str = "new"
    sample: dict[str, Any] | None = None
    survivors: list[str] = field(default_factory=list)
    times: dict[str, list[float]] = field(default_factory=dict)
    pruned: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    rejected: str = ""
    turns: list[str] = field(default_factory=list)  # the order of the turns (A B ... B A)
    turn: int = 0  # index of the current turn
    turn_from: float = 0.0  # perf_counter time from which the current turn's calls are timed
    turn_timed: int = 0  # calls timed in the current turn
    turn_began: float = 0.0  # perf_counter time at which the current turn began
    last_end: float = 0.0  # perf_counter time at which the bucket's last call ended
    extended: bool = False  # the near-tied candidates took their turns once more
    rounds: list[dict[str, float]] = field(default_factory=list)  # per round of turns: median / round's fastest
    explored: int = 0  # calls answered by a candidate under test (not the one serving) in the turns so far
    explore_from: int = 0  # the bucket's call count before which a round of turns cannot start (explore_share)
    runners: list[str] = field(default_factory=list)  # the runners-up that take turns again (RECHECK_AFTER_S)
    calls: int = 0
    settled_after: int | None = None
    checking_since: float = 0.0
    last_call_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _lead_in(slot: _Slot) -> None:
    """A turn of another candidate begins: its calls are timed from TURN_LEAD_S (and one call) on."""
    slot.turn_began = time.perf_counter()
    slot.turn_from = slot.turn_began + TURN_LEAD_S + slot.last_call_s


def _copy(feeds: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in feeds.items()}


class OnlineTuner(Executable):
    """Serves a compiled model and tunes its backend per shape bucket on real calls (module doc).

    Args:
        model: The model.
        start: The checked start (its executable serves every bucket until tuned).
        order: The candidates, in priority order.
        options_of: Backend options per candidate and precision.
        settings: ``hybrid.init({'autotune': ...})`` at compile time.
        rtol: Model-level relative tolerance of the check.
        rules: Per-output rules of the check.
        key_base: What the decision depends on besides the shapes (for the decision cache).
        notes: How the start was chosen (the plan's notes begin with them).
        confirm: Rivals of a decision made at compile, which its bucket's first real calls confirm.
    """

    def __init__(self, model: Model, start: Trial, order: list[Candidate], options_of: OptionsOf,
                 settings: AutotuneSettings, rtol: float, rules: Mapping[str, OutputRule],
                 key_base: Mapping[str, Any], notes: list[str], confirm: Confirmation | None = None) -> None:
        self.input_names = model.signature.input_names
        self.output_names = model.signature.output_names
        self._model = model
        self._sig = model.signature
        self._order = order
        self._options_of = options_of
        self._settings = settings
        self._rtol = rtol
        self._rules = dict(rules)
        self._start = start
        self._trials: dict[str, Trial] = {start.label: start}
        self._compiled: dict[str, Executable] = {start.label: start.executable}
        self._slots: dict[Bucket, _Slot] = {}
        self._routes: dict[tuple[Any, ...], _Slot] = {}  # (input names, exact shapes) -> its bucket's slot
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[str, _Slot] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._closed = threading.Event()
        self._window_end = 0.0  # perf_counter time at which the current yield window closes
        self._gate = threading.Event()  # cleared while the tuner compiles a candidate in this process
        self._gate.set()
        self._timers: list[threading.Timer] = []  # pending rounds of RECHECK_AFTER_S
        self._window_hits = 1  # calls that waited in the last window
        self._calls_since_window = 0
        self._notes = [*notes, f"online tuning: {start.label} serves every shape bucket until real calls decide "
                       f"({settings.calls_per_bucket} calls per candidate; the checks take at most "
                       f"{settings.overhead_cap:.0%} of a busy core)"]
        self._confirm = confirm
        self._confirm_key: Bucket | None = None  # the bucket a Confirmation is about
        self._bucket_notes: dict[Bucket, str] = {}
        self._on_switch: Callable[[Trial, list[str], str], Any] | None = None
        self._cm: Any = None
        self._index_key, self._index_material = cache.decision_key({**key_base, "online_buckets": True})
        self._cached: dict[Bucket, Any] = self._read_index()
        if confirm is not None:
            self._seed(confirm)
        # the worker process sees the built-in and installed backends and the standard op domains only
        self._portable = settings.check_process and all(
            n.domain in ("", "ai.onnx", "ai.onnx.ml", "com.microsoft") for n in model.graph.all_nodes()) and all(
            is_installed_backend(c.backend) for c in order)

    def _seed(self, confirm: Confirmation) -> None:
        """The timed bucket starts with its rivals checked: they take turns from its first real call."""
        key = self._confirm_key = bucket_of(self._sig, confirm.sample)
        labels = [t.label for t in confirm.rivals]
        for t in confirm.rivals:
            self._trials[t.label], self._compiled[t.label] = t, t.executable
        self._notes[-1] = (f"confirming on real calls: {', '.join(labels)} timed within {CONFIRM_RATIO}x of "
                           f"{self._start.label} at compile take turns with it on the first real calls of bucket "
                           f"{_fmt(key)}; other shapes are tuned online")
        if key not in self._cached:  # else a decision made on real calls before is installed
            self._slots[key] = _Slot(key, (self._start.label, self._start.executable), state="confirming",
                                     survivors=[self._start.label, *labels])

    # ------------------------------------------------------------------ wiring
    def attach(self, cm: Any, plan_of: Callable[[Trial, list[str], str], Any]) -> None:
        """Keep ``cm``'s backend, device and plan in step with the decisions (``cm.plan`` shows them)."""
        self._cm, self._on_switch = cm, plan_of

    def notes(self) -> list[str]:
        """The plan's notes: how the start was chosen, then one line per decided bucket."""
        with self._lock:
            return [*self._notes, *self._bucket_notes.values()]

    def status(self) -> list[BucketStatus]:
        """Where tuning stands, per bucket seen so far."""
        with self._lock:
            slots = list(self._slots.values())
        return [BucketStatus(s.key, s.state, s.serving[0], s.calls, s.settled_after,
                             s.state == "settled" and not s.runners) for s in slots]

    # ------------------------------------------------------------------ the hot path
    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        try:  # the exact shapes seen before route straight to their bucket (0.6 us instead of 6)
            slot = self._routes[(tuple(feeds), tuple([v.shape for v in feeds.values()]))]
        except (KeyError, AttributeError):
            slot = self._route(feeds)
        if slot.state == "settled":
            slot.calls += 1  # a racy count is fine: it is for status() only
            return slot.serving[1].run(feeds)
        return self._tuning_call(slot, feeds)

    def _route(self, feeds: Mapping[str, Any]) -> _Slot:
        key = bucket_of(self._sig, feeds)
        slot = self._slots.get(key) or self._new_slot(key)
        shapes = tuple(getattr(v, "shape", None) for v in feeds.values())
        if None not in shapes and len(self._routes) < MAX_ROUTES:
            self._routes[(tuple(feeds), shapes)] = slot
        return slot

    def _new_slot(self, key: Bucket) -> _Slot:
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None:
                return slot
            slot = _Slot(key, (self._start.label, self._start.executable))
            if key in self._cached:
                slot.state = "installing"
            self._slots[key] = slot
        if slot.state == "installing":
            self._submit("install", slot)
        return slot

    def _tuning_call(self, slot: _Slot, feeds: Mapping[str, Any]) -> list[Any]:
        self._yield(slot)
        if slot.state in ("checking", "installing") or (slot.state == "confirming" and slot.calls < slot.explore_from):
            slot.calls += 1  # nothing to decide on this call: no lock (a call of a 50 us model spends its time in
            label, exe = slot.serving  # the check phase, and waits for its turns; a racy count is fine here)
        else:
            with slot.lock:
                slot.calls += 1
                if slot.state == "new" and slot.calls >= CHECK_AT_CALL:
                    slot.sample, slot.state = _copy(feeds), "checking"
                    slot.checking_since = time.perf_counter()
                    self._submit("check", slot)
                elif slot.state == "confirming" and self._may_explore(slot):
                    self._start_turns(slot)
                label, exe = self._pick(slot)
                if label != slot.serving[0]:
                    slot.explored += 1
        t0 = time.perf_counter()
        try:
            outs = exe.run(feeds)
        except Exception as e:
            return self._recover(slot, label, e, feeds)
        elapsed = time.perf_counter() - t0
        slot.last_call_s = elapsed
        if slot.state == "exploring":
            with slot.lock:
                self._record(slot, label, t0, elapsed)
        slot.last_end = t0 + elapsed
        return outs

    def _yield(self, slot: _Slot) -> None:
        """Wait out the open yield window, or open one when the check starves (module doc). The calls that
        wait are counted under the lock (they wait anyway), so the share of calls that wait holds exactly;
        the calls between windows are counted without one (a lost count only delays the next window)."""
        if not self._gate.is_set():
            self._count_hit()
            self._gate.wait(MAX_GATE_S)
            return
        now = time.perf_counter()
        wait = self._window_end - now
        if wait > 0:
            self._count_hit()
            time.sleep(wait)
            return
        self._calls_since_window += 1
        if (slot.state != "checking" or now - slot.checking_since < YIELD_AFTER_S
                or self._calls_since_window * YIELD_CALL_SHARE < self._window_hits):
            return
        length = min(YIELD_MAX_S, max(YIELD_MIN_S, YIELD_CALLS * slot.last_call_s))
        if -wait < length * (1.0 / YIELD_WALL_SHARE - 1.0):  # too soon after the last window
            return
        with self._lock:
            if self._window_end > now:  # another caller opened one meanwhile: wait in it
                self._window_hits += 1
            else:
                self._window_end, self._window_hits, self._calls_since_window = now + length, 1, 0
            wait = self._window_end - now
        time.sleep(wait)

    def _count_hit(self) -> None:
        with self._lock:
            self._window_hits += 1

    def _pick(self, slot: _Slot) -> tuple[str, Executable]:
        if slot.state != "exploring":
            return slot.serving
        if slot.turn < len(slot.turns) and slot.turns[slot.turn] not in slot.survivors:
            self._next_turn(slot)  # its candidate failed a real call (_recover) during its turn
            self._settle_when_done(slot)
        if slot.state != "exploring" or slot.turn >= len(slot.turns):
            return slot.serving
        label = slot.turns[slot.turn]
        return label, self._compiled[label]

    def _may_explore(self, slot: _Slot) -> bool:
        """Whether a round of turns may start now (module doc, step 5): each candidate under test answers about
        ``TURN_LEAD_S + 2 * TURN_MIN_S`` of calls at the serving one's speed (fewer when it is slower) and at
        least ``calls_per_bucket`` timed calls."""
        share = self._settings.explore_share
        if share >= 1.0:
            return True
        if slot.last_call_s <= 0.0:  # no call timed yet: nothing to size the round by
            return False
        rivals = sum(1 for lb in slot.survivors if lb != slot.serving[0])
        per_rival = (TURN_LEAD_S + 2 * TURN_MIN_S) / slot.last_call_s + self._settings.calls_per_bucket
        slot.explore_from = math.ceil((slot.explored + rivals * per_rival) / share)
        return slot.calls >= slot.explore_from

    def _begin_turns(self, slot: _Slot) -> None:
        """The survivors take turns now, or from the call the exploration budget allows (caller holds
        ``slot.lock``)."""
        if self._may_explore(slot):
            self._start_turns(slot)
        else:
            slot.state = "confirming"

    def _start_turns(self, slot: _Slot) -> None:
        """Begin exploring: the survivors take turns A B ... B A (caller holds ``slot.lock``)."""
        slot.turns = slot.survivors + slot.survivors[::-1]
        slot.turn, slot.turn_timed = 0, 0
        _lead_in(slot)
        slot.state = "exploring"

    def _record(self, slot: _Slot, label: str, started: float, seconds: float) -> None:
        """Count a call of the current turn that started after its lead-in; end the turn after half of
        ``calls_per_bucket`` timed calls spanning at least TURN_MIN_S (caller holds ``slot.lock``)."""
        if slot.state != "exploring" or slot.turn >= len(slot.turns) or label != slot.turns[slot.turn]:
            return
        if (started - slot.last_end > max(GAP_CALLS * seconds, GAP_MIN_S)
                and started - slot.turn_began < TURN_PATIENCE_S):
            slot.turn_from = max(slot.turn_from, started + GAP_LEAD_S)  # a pause: the pool idled, others ran
        if started < slot.turn_from:
            return
        slot.times.setdefault(label, []).append(seconds)
        slot.turn_timed += 1
        medians = {lb: statistics.median(ts) for lb, ts in slot.times.items()
                   if lb not in slot.pruned and len(ts) >= PRUNE_AFTER and sum(ts) >= PRUNE_AFTER_S}
        if medians:
            best = min(medians.values())
            # the serving candidate is never stopped: its calls cost the callers nothing more, and its last turn
            # (A B B A) is what makes the turns fair to it (the detector's ORT, timed at 12.7 ms in its first turn
            # right after OpenVINO was compiled, was stopped there while it served at 7.8 ms)
            slot.pruned.update(lb for lb, m in medians.items() if m > PRUNE_RATIO * best and lb != slot.serving[0])
        enough = (slot.turn_timed >= (self._settings.calls_per_bucket + 1) // 2
                  and started + seconds - slot.turn_from >= TURN_MIN_S)
        if enough or label in slot.pruned:
            self._next_turn(slot)
        self._settle_when_done(slot)

    def _settle_when_done(self, slot: _Slot) -> None:
        """Once every turn was taken: settle, or when the fastest candidates are within NEAR_TIE_REL of each
        other, let them take their turns once more first (caller holds ``slot.lock``)."""
        if slot.turn < len(slot.turns):
            return
        timed = [lb for lb in slot.survivors if lb not in slot.pruned and slot.times.get(lb)]
        if not timed:  # every candidate that took turns failed a real call: the one serving keeps the bucket
            slot.runners = []
            self._install(slot, slot.serving[0], "no candidate was timed on real calls")
            return
        medians = {lb: statistics.median(slot.times[lb]) for lb in timed}
        near = [lb for lb in timed if medians[lb] <= (1 + NEAR_TIE_REL) * min(medians.values())]
        if len(near) > 1 and not slot.extended:
            slot.extended = True
            last = slot.turns[-1]
            slot.turns += near + near[::-1]
            slot.turn_timed = 0
            if near[0] != last:
                _lead_in(slot)
            return
        self._settle(slot, timed)

    def _next_turn(self, slot: _Slot) -> None:
        """Move to the next turn of a candidate still in (not pruned, no failed call); a turn of another
        candidate than the one before times its calls only after a lead-in (module doc)."""
        before = slot.turns[slot.turn]
        slot.turn += 1
        while slot.turn < len(slot.turns) and (slot.turns[slot.turn] in slot.pruned
                                               or slot.turns[slot.turn] not in slot.survivors):
            slot.turn += 1
        slot.turn_timed = 0
        if slot.turn < len(slot.turns) and slot.turns[slot.turn] != before:
            _lead_in(slot)
        else:
            slot.turn_began = time.perf_counter()

    def _settle(self, slot: _Slot, alive: list[str]) -> None:
        """Pick the bucket's winner from the timed calls of every round so far: per round, each candidate's
        median relative to that round's fastest; over rounds, the median of those (a round that met a burst of
        load, or a machine in another state, is outvoted by the others). Then schedule the next round of
        :data:`RECHECK_AFTER_S` while candidates other than the winner are still in (caller holds
        ``slot.lock``)."""
        medians = {lb: statistics.median(ts) for lb, ts in slot.times.items() if ts and lb not in slot.failed}
        fastest = min(medians[lb] for lb in alive)
        slot.rounds.append({lb: m / fastest for lb, m in medians.items()})
        score = {lb: statistics.median([r[lb] for r in slot.rounds if lb in r]) for lb in medians}
        best = min(alive, key=score.__getitem__)
        current = slot.serving[0]
        if current in score and score[current] <= score[best] * (1.0 + judge.tie_slack(fastest) / fastest):
            best = current  # as fast within noise: no switch
        timed = ", ".join(f"{lb} {m * 1e3:.3g} ms ({len(slot.times[lb])} calls{', stopped' * (lb in slot.pruned)})"
                          for lb, m in sorted(medians.items(), key=lambda kv: kv[1]))
        why = f"picked {best} by the median of its timed real calls ({timed})"
        if len(slot.rounds) > 1:
            why += (f"; over {len(slot.rounds)} rounds, relative to each round's fastest: "
                    + ", ".join(f"{lb} {v:.3f}" for lb, v in sorted(score.items(), key=lambda kv: kv[1])))
        # runners-up: those within RUNNER_RATIO this round, stopped ones included (four calls can stop one)
        slot.runners = [lb for lb, v in slot.rounds[-1].items() if lb != best and v <= RUNNER_RATIO
                        and len(slot.rounds) <= len(RECHECK_AFTER_S)]
        self._install(slot, best, why)
        if slot.runners:
            self._recheck_later(slot, RECHECK_AFTER_S[len(slot.rounds) - 1])

    def _recheck_later(self, slot: _Slot, delay_s: float) -> None:
        """In ``delay_s``, let the bucket's winner and runners-up take their turns again on real calls."""
        ref = weakref.ref(self)

        def reopen() -> None:
            tuner = ref()
            if tuner is not None:
                tuner._reopen(slot)

        timer = threading.Timer(delay_s, reopen)
        timer.daemon = True
        with self._lock:
            if self._closed.is_set():
                return
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    def _reopen(self, slot: _Slot) -> None:
        with slot.lock:
            if slot.state != "settled" or self._closed.is_set():
                return
            survivors = [slot.serving[0], *(lb for lb in slot.runners if lb in self._compiled
                                            and lb not in slot.failed)]
            if len(survivors) < 2:  # the runners-up failed or were released: the decision stands
                slot.runners = []
                return
            slot.survivors, slot.times, slot.pruned, slot.extended = survivors, {}, set(), True
            slot.state = "confirming"  # the turns start on the call the exploration budget allows

    def _install(self, slot: _Slot, label: str, why: str) -> None:
        slot.serving = (label, self._compiled[label])
        note = f"bucket {_fmt(slot.key)}: {why}"
        if slot.rejected:
            note += "; " + slot.rejected
        with self._lock:
            self._bucket_notes[slot.key] = note
        logger.info("auto (online): %s: %s", self._model.name, note)
        self._switched(label, why)
        slot.state, slot.settled_after = "settled", slot.calls  # last: the plan already says what serves
        self._submit("persist", slot)
        self._submit("release", slot)

    def _switched(self, label: str, reason: str) -> None:
        trial = self._trials.get(label)
        if self._cm is None or self._on_switch is None or trial is None:
            return
        cm = self._cm
        cm.plan = self._on_switch(trial, self.notes(), reason)
        cm.backend, cm.device, cm.options = trial.backend, trial.device, dict(trial.options)

    def _recover(self, slot: _Slot, label: str, error: Exception, feeds: Mapping[str, Any]) -> list[Any]:
        """Answer a call whose executable failed with the next candidate by priority that runs it."""
        why = first_line(error)
        logger.warning("auto (online): %s failed on %s for %r: %s", label, _fmt(slot.key), self._model.name, why)
        with slot.lock:
            slot.failed[label] = why
            if label in slot.survivors:
                slot.survivors.remove(label)
        order = [str(c) for c in self._order if c.backend != FALLBACK_BACKEND]
        order += [str(c) for c in self._order if c.backend == FALLBACK_BACKEND]
        if slot.serving[0] != label:
            order.insert(0, slot.serving[0])
        for other in dict.fromkeys(order):
            if other in slot.failed:
                continue
            exe = self._executable(other)
            if exe is None:
                continue
            try:
                outs = exe.run(feeds)
            except Exception as e:
                slot.failed[other] = first_line(e)
                continue
            with slot.lock:
                if slot.serving[0] in slot.failed:
                    slot.serving = (other, exe)
                    with self._lock:
                        self._bucket_notes[slot.key] = (f"bucket {_fmt(slot.key)}: {other} serves ({label} failed "
                                                        f"on a real call: {why})")
                    self._switched(other, f"{label} failed on a real call")
            return outs
        raise error

    def _prepared(self, label: str, sample: Mapping[str, Any] | None) -> Executable | None:
        """:meth:`_executable`, compiled and run once on the bucket's sample (a first run pays for lazy
        initialisation) while the tuning callers wait: work that shares the process's cores would slow
        every call meanwhile, where waiting costs one call per caller (module doc)."""
        if label in self._compiled:
            return self._compiled[label]
        self._gate.clear()
        try:
            exe = self._executable(label)
            if exe is not None and sample is not None:
                with contextlib.suppress(Exception):  # a failure shows when it serves, and is handled there
                    exe.run(sample)
            return exe
        finally:
            self._gate.set()

    def _executable(self, label: str) -> Executable | None:
        exe = self._compiled.get(label)
        if exe is not None:
            return exe
        backend, _, device = label.partition(":")
        search = Search(self._model, self._order, self._options_of, "fp32", None, None, compiled=self._compiled)
        trial = search.single(Candidate(backend, device), "fp32")
        if trial is not None:
            self._trials.setdefault(label, trial)
        return self._compiled.get(label)

    # ------------------------------------------------------------------ background work
    def _submit(self, job: str, slot: _Slot) -> None:
        if self._closed.is_set() and job != "persist":
            return
        self._jobs.put((job, slot))
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=_work, args=(weakref.ref(self), self._jobs),
                                                name="hybrid-online-tuner", daemon=True)
                self._worker.start()

    def _do(self, job: str, slot: _Slot) -> None:
        if self._closed.is_set() and job != "persist":  # closing: decisions made are still written
            return
        try:
            {"check": self._check, "install": self._install_cached, "persist": self._persist,
             "release": self._release}[job](slot)
        except Exception as e:  # the tuner must never take the model down: the bucket keeps its executable
            logger.warning("auto (online): %s of bucket %s failed: %s", job, _fmt(slot.key), first_line(e))
            with slot.lock:
                if slot.state in ("checking", "installing"):
                    slot.state, slot.settled_after = "settled", slot.calls

    def _pause(self, busy_s: float) -> None:
        """Sleep so that background work stays within ``overhead_cap`` of the wall time."""
        cap = self._settings.overhead_cap
        if cap < 1.0:
            self._closed.wait(min(MAX_PAUSE_S, busy_s * (1.0 / cap - 1.0)))

    def _check(self, slot: _Slot) -> None:
        verdicts = (worker.check_elsewhere(self._request(slot.sample), self._settings.overhead_cap)
                    if self._portable else None)
        if verdicts is None or any(partitioned for *_, partitioned in verdicts.results):
            verdicts = self._check_here(slot)
        if verdicts is None:
            return
        passed = [(label, warm) for label, why, warm, _ in verdicts.results if why is None]
        accelerated = [(lb, w) for lb, w in passed if not lb.startswith(f"{FALLBACK_BACKEND}:")]
        pool = accelerated or passed
        timed = [w for _, w in pool if w is not None]
        serving = slot.serving[0]
        serving_warm = dict(pool).get(serving)
        if len(pool) > 1 and timed:
            # Only candidates that may beat the serving one take turns with real calls (compiling and serving a
            # slower one costs the callers latency): within WARM_RUN_RATIO of its warm run in the check, or of
            # the fastest when it failed the check. The serving candidate stays: real calls decide.
            limit = WARM_RUN_RATIO * (serving_warm if serving_warm else min(timed))
            slow = [f"not tried {lb}: a warm run in the check took {w * 1e3:.3g} ms, over {WARM_RUN_RATIO}x of "
                    f"{serving if serving_warm else 'the fastest'}'s" for lb, w in pool
                    if w is not None and lb != serving and w > limit]
            pool = [(lb, w) for lb, w in pool if w is None or lb == serving or w <= limit]
        else:
            slow = []
        labels = [lb for lb, _ in pool if self._prepared(lb, slot.sample) is not None]
        rejected = "; ".join([*(f"rejected {lb}: {why}" for lb, why, _, _ in verdicts.results if why), *slow])
        with slot.lock:
            slot.rejected = rejected
            if not labels:
                self._install(slot, slot.serving[0], f"no candidate passed the check on a real input ({rejected})")
                return
            current = slot.serving[0]
            if current not in labels:
                why = next((w for lb, w, _, _ in verdicts.results if lb == current), "not checked")
                slot.serving = (labels[0], self._compiled[labels[0]])
                logger.warning("auto (online): %s for %r failed the check on a real input (%s); %s serves",
                               current, self._model.name, why, labels[0])
                self._switched(labels[0], f"{current} failed the check on a real input")
            slot.sample = None
            slot.survivors = [lb for lb in labels if lb not in slot.failed]
            if len(slot.survivors) <= 1:
                self._install(slot, slot.serving[0], "the only candidate that passed the check on a real input")
            else:
                self._begin_turns(slot)

    def _request(self, sample: Mapping[str, Any] | None) -> worker.CheckRequest:
        return worker.CheckRequest(
            self._model.to_bytes(), self._model.name, tuple(str(c) for c in self._order),
            {str(c): self._options_of(c, "fp32") for c in self._order}, self._rtol,
            {k: r.model_dump() for k, r in self._rules.items()}, dict(sample or {}))

    def _check_here(self, slot: _Slot) -> worker.Verdicts | None:
        """The check in this process's background thread (custom ops or backends the worker cannot see)."""
        search = Search(self._model, self._order, self._options_of, "fp32", None, slot.sample, rtol=self._rtol,
                        rules=self._rules, compiled=self._compiled)
        tried: list[Trial] = []
        for trial in trials(search, autotune=True):
            if self._closed.is_set():
                return None
            t0 = time.perf_counter()
            trial.rejected = search.check(trial)
            tried.append(trial)
            self._trials.setdefault(trial.label, trial)
            self._compiled.setdefault(trial.label, trial.executable)
            self._pause(time.perf_counter() - t0)
        judge.outvote(tried, search, self._model.name)
        many = sum(t.rejected is None for t in tried) > 1
        return worker.Verdicts(tuple((t.label, t.rejected, self._warm_run(t, search.verifier.samples)
                                      if many and t.rejected is None else None, False) for t in tried),
                               tuple(search.notes))

    def _warm_run(self, trial: Trial, feeds: Mapping[str, Any] | None) -> float:
        """Seconds of a warm run of a checked candidate on the bucket's sample (:func:`.timing.warm_estimate`);
        infinity when it fails."""
        t0 = time.perf_counter()
        try:
            warm = warm_estimate(lambda: trial.executable.run(feeds or {}))
        except Exception:
            return float("inf")
        self._pause(time.perf_counter() - t0)
        return warm

    def _release(self, slot: _Slot) -> None:
        """Once every bucket seen has settled, close the candidates that serve none (their sessions hold the
        model's weights and arenas: tens to hundreds of MB each). The start stays (a new bucket begins on
        it); a candidate a later bucket wants again is compiled again, while its tuning callers wait. Done
        ``RELEASE_GRACE_S`` after the settle, so that a call a loser was answering has ended."""
        if self._closed.wait(RELEASE_GRACE_S):
            return
        with self._lock:
            slots = list(self._slots.values())
            if not slots or any(s.state != "settled" for s in slots):
                return
            keep = {s.serving[0] for s in slots} | {lb for s in slots for lb in s.runners} | {self._start.label}
            losers = [(label, self._compiled.pop(label)) for label in list(self._compiled) if label not in keep]
            for label, _ in losers:
                self._trials.pop(label, None)
            kept = {id(exe) for exe in self._compiled.values()}
        for label, exe in losers:
            if id(exe) not in kept:
                exe.close()
                logger.info("auto (online): %s: released %s (it serves no bucket)", self._model.name, label)

    def _install_cached(self, slot: _Slot) -> None:
        decision = self._cached[slot.key]
        label = decision.label
        if label not in self._compiled:
            trial = trial_of(self._model, decision, self._order, self._options_of)
            if trial is None:
                raise HybridError("HYB-304", f"the cached decision {label} no longer applies here")
            self._compiled[label], self._trials[label] = trial.executable, trial
        with slot.lock:
            self._install(slot, label, f"{label} (decision read from the autotune cache)")

    # ------------------------------------------------------------------ the decision cache
    def _read_index(self) -> dict[Bucket, Any]:
        record = cache.load_decision(self._index_key, self._index_material)
        out: dict[Bucket, Any] = {}
        for bucket, decision in (record or {}).get("decision", {}).get("buckets", []):
            try:
                out[tuple((str(n), tuple(int(d) for d in s)) for n, s in bucket)] = decision_from_json(decision)
            except (KeyError, TypeError, ValueError):
                continue
        return out

    def _persist(self, slot: _Slot) -> None:
        trial = self._trials.get(slot.serving[0])
        if trial is None:
            return
        if self._confirm is not None and slot.key == self._confirm_key:
            self._confirm.save(trial)
        known = self._read_index()
        known[slot.key] = trial.decision
        buckets = [[[[n, list(s)] for n, s in key], d.to_json()] for key, d in known.items()]
        cache.save_decision(self._index_key, self._index_material, {"kind": "buckets", "buckets": buckets},
                            [f"online decisions of {self._model.name!r} per shape bucket"])

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        with self._lock:
            self._closed.set()
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()
        self._jobs.put(None)
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout=30)
        for exe in {id(e): e for e in self._compiled.values()}.values():
            exe.close()
        self._compiled.clear()


def _work(ref: weakref.ReferenceType[OnlineTuner], jobs: queue.SimpleQueue[tuple[str, _Slot] | None]) -> None:
    """The background thread of one tuner. It holds the tuner weakly: a model nobody uses any more is
    collected, and its pending checks are dropped with it."""
    while True:
        try:
            item = jobs.get(timeout=IDLE_POLL_S)
        except queue.Empty:
            if ref() is None:
                return
            continue
        tuner = ref()
        if item is None or tuner is None:
            return
        tuner._do(*item)
        del tuner
