"""The data plane of online tuning: route each call to an executable, time it, and record it (docs/auto.md).

The router decides nothing. Per shape bucket it holds one immutable :class:`Route` that the controller
replaces whole (one reference assignment: a caller reads either the old route or the new one, and gets its
whole answer from one executable). A route names the candidate serving the bucket and, while candidates take
turns, a :class:`Probe`: a schedule of turns in time, ``lanes[i]`` serving the calls that start in the i-th
``turn_s`` from ``start``. The router appends (turn, start, seconds) of each call of a probe to the probe's
records (``list.append`` is atomic), which the controller reads once the probe is over. No caller waits for
anything but its own call.

A call that fails on its executable (a shape the backend cannot run) is answered by the next candidate in
priority order that runs it; the same fallback serves every bucket, decided or not, and the controller is told.
So is a call that a candidate compiled online answers with NaN or Inf in a floating-point output where the start
(checked at compile) does not (issue 54: a candidate that answers NaN now and then never answers a caller so); where
the start's answer holds them too, they are the model's own and the bucket's answers are not looked at again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybrid.errors import first_line
from hybrid.hal.backend import Executable
from hybrid.ir import Signature
from hybrid.runtime.auto.policy import Clock
from hybrid.runtime.auto.shapes import bucket_of
from hybrid.runtime.auto.status import Bucket

__all__ = ["Event", "Lane", "Probe", "Route", "Router", "Tally"]

MAX_EXACT = 4096  # exact shape combinations remembered on the hot path (more still work, through bucket_of)


@dataclass(frozen=True, slots=True)
class Lane:
    """A candidate ready to serve: its label, its compiled executable, and its fastest warm-up call.

    The warm-up time is the seconds of its fastest warm-up call in this process (None: not measured).
    """

    label: str
    executable: Executable
    warm_s: float | None = None


@dataclass(slots=True)
class Tally:
    """Counters of one bucket, written by the callers without a lock.

    They are for reports and for sizing turns: a lost increment under a race is harmless.
    """

    first_call: float
    calls: int = 0
    last_s: float = 0.0  # the last untimed-by-a-probe call's seconds (the serving candidate's speed)
    served: int = 0  # calls answered outside a probe's turns, and their seconds: what tuning's other work
    served_s: float = 0.0  # (the check, the compiles) cost the callers is read from these (:mod:`.race`)
    guarded: bool = True  # answers of candidates compiled online are looked at for NaN and Inf (module doc)


@dataclass(frozen=True, slots=True)
class Probe:
    """A round of turns: each lane serves the calls that start in its turn.

    ``lanes[i]`` serves the calls that start in ``[start + i * turn_s, start + (i+1) * turn_s)``; after the last turn
    the route's serving candidate answers until the controller replaces the route.
    """

    start: float
    turn_s: float
    lanes: tuple[Lane, ...]
    records: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def end(self) -> float:
        """When the last turn ends (the clock's seconds)."""
        return self.start + self.turn_s * len(self.lanes)

    def timed(self, turn: int, lead_share: float) -> list[float]:
        """Seconds of the calls of ``turn`` that started after its first ``lead_share`` (the lead-in)."""
        begin = self.start + (turn + lead_share) * self.turn_s
        return [s for i, t0, s in list(self.records) if i == turn and t0 >= begin]


@dataclass(frozen=True, slots=True)
class Route:
    """How the calls of one bucket are answered now."""

    serving: Lane
    tally: Tally
    probe: Probe | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """What the router tells the controller: a new bucket, or a candidate that failed a real call.

    A new bucket comes with a copy of its first inputs; a failure names the candidate that answered instead.
    """

    kind: str  # 'new' | 'failed'
    key: Bucket
    sample: dict[str, Any] | None = None
    label: str = ""
    why: str = ""
    answered_by: str = ""


def _copy(feeds: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in feeds.items()}


class Router(Executable):
    """Routes the calls of a model compiled with ``target='auto'`` (module doc).

    Args:
        signature: The model's signature (for the buckets).
        start: The candidate that answers a bucket until the controller decides otherwise.
        clock: Times each call.
        notify: Receives the router's :class:`Event` (the controller's inbox; must not block).
        compile_lane: Compiles a candidate by label for the fallback (None when it cannot); called in the
            caller's thread, and only when a call failed.
    """

    def __init__(self, signature: Signature, start: Lane, clock: Clock, notify: Callable[[Event], None],
                 compile_lane: Callable[[str], Lane | None]) -> None:
        self.input_names = signature.input_names
        self.output_names = signature.output_names
        self._sig = signature
        self._start = start
        self._clock = clock
        self._notify = notify
        self._compile_lane = compile_lane
        self._routes: dict[Bucket, Route] = {}
        self._exact: dict[tuple[Any, ...], Bucket] = {}
        self._lanes: dict[str, Lane] = {start.label: start}  # replaced whole by the controller
        self._order: tuple[str, ...] = (start.label,)  # the fallback's priority order
        self._failed: dict[Bucket, dict[str, str]] = {}
        self._lock = threading.Lock()
        # every call's seconds, in any bucket and in a race's turns too, from the first call on: the model's load
        # (Little's law), which decides whether layouts race (written without a lock, as the tallies are)
        self.first_call: float | None = None
        self.busy_s = 0.0

    # ------------------------------------------------------------------ the controller's side
    def publish(self, key: Bucket, route: Route) -> None:
        """Install ``route`` for ``key`` (one assignment: callers see the old route or this one)."""
        self._routes[key] = route

    def route(self, key: Bucket) -> Route | None:
        """The route installed for bucket ``key`` (None before its first call)."""
        return self._routes.get(key)

    def routes(self) -> dict[Bucket, Route]:
        """A copy of every bucket's route."""
        return dict(self._routes)

    def set_lanes(self, lanes: Mapping[str, Lane], order: tuple[str, ...]) -> None:
        """The compiled candidates the fallback may use, and its priority order (labels)."""
        self._lanes, self._order = {self._start.label: self._start, **lanes}, order

    # ------------------------------------------------------------------ the hot path
    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Answer one call on its bucket's route: the serving candidate, or the lane whose turn it is."""
        try:  # the exact shapes seen before route straight to their bucket
            key = self._exact[(tuple(feeds), tuple([v.shape for v in feeds.values()]))]
        except (KeyError, AttributeError):
            key = self._key(feeds)
        route = self._routes.get(key) or self._open(key, feeds)
        tally = route.tally
        tally.calls += 1
        probe = route.probe
        clock = self._clock
        t0 = clock()
        lane, turn = route.serving, -1
        if probe is not None:
            turn = int((t0 - probe.start) // probe.turn_s)
            if 0 <= turn < len(probe.lanes):
                lane = probe.lanes[turn]
            else:
                turn = -1
        try:
            outs = lane.executable.run(feeds)
        except Exception as e:
            return self._fall_back(key, lane, e, feeds)
        seconds = clock() - t0
        if self.first_call is None:
            self.first_call = t0
        self.busy_s += seconds
        if tally.guarded and lane is not self._start and not _finite(outs):
            return self._not_finite(key, lane, outs, feeds, tally)
        if turn >= 0:
            probe.records.append((turn, t0, seconds))  # type: ignore[union-attr]
        else:
            tally.last_s = seconds
            tally.served += 1
            tally.served_s += seconds
        return outs

    def _key(self, feeds: Mapping[str, Any]) -> Bucket:
        key = bucket_of(self._sig, feeds)
        shapes = tuple(getattr(v, "shape", None) for v in feeds.values())
        if None not in shapes and len(self._exact) < MAX_EXACT:
            self._exact[(tuple(feeds), shapes)] = key
        return key

    def _open(self, key: Bucket, feeds: Mapping[str, Any]) -> Route:
        with self._lock:
            route = self._routes.get(key)
            if route is not None:
                return route
            route = self._routes[key] = Route(self._start, Tally(self._clock()))
        self._notify(Event("new", key, _copy(feeds)))
        return route

    def _not_finite(self, key: Bucket, lane: Lane, outs: list[Any], feeds: Mapping[str, Any],
                    tally: Tally) -> list[Any]:
        """``lane`` answered NaN or Inf: the model's own where the start's answer holds them too, else a failed call."""
        try:
            theirs = self._start.executable.run(feeds)
        except Exception:
            theirs = None
        if theirs is not None and not _finite(theirs):
            tally.guarded = False  # the model computes them: nothing to tell the candidates apart by
            return outs
        why = FloatingPointError(f"answered NaN or Inf on a real call where {self._start.label} did not")
        return self._fall_back(key, lane, why, feeds)

    def _fall_back(self, key: Bucket, lane: Lane, error: Exception, feeds: Mapping[str, Any]) -> list[Any]:
        """Answer a call whose executable failed with the next candidate by priority that runs it.

        The bucket's route then serves with that one (the controller is told, and decides the rest).
        """
        why = first_line(error)
        failed = self._failed.setdefault(key, {})
        failed[lane.label] = why
        for label in self._order:
            if label in failed:
                continue
            other = self._lanes.get(label) or self._compile_lane(label)
            if other is None:
                failed[label] = "could not compile"
                continue
            try:
                outs = other.executable.run(feeds)
            except Exception as e:
                failed[label] = first_line(e)
                continue
            with self._lock:
                route = self._routes.get(key)
                if route is not None and route.serving.label in failed:
                    self._routes[key] = Route(other, route.tally)
            self._notify(Event("failed", key, label=lane.label, why=why, answered_by=label))
            return outs
        raise error

    def close(self) -> None:
        """Nothing of its own: the controller closes the executables."""


def _finite(outs: list[Any]) -> bool:
    """Whether no floating-point output holds NaN or Inf (one pass over each: cheap next to the call)."""
    return all(not (isinstance(o, np.ndarray) and o.dtype.kind in "fc") or bool(np.isfinite(o).all()) for o in outs)
