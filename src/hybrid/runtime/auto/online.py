"""Online auto-selection: decide per shape bucket on real calls, within a bound in time (DESIGN 2.3, docs/auto.md).

A model whose inputs have dynamic dims, compiled with ``target='auto'`` and nothing declared about its shapes,
starts on the first candidate by priority that passed the check (never the numpy reference while an
accelerated backend can run the graph) and is served by an :class:`OnlineTuner`, which is three parts:

- the :class:`~.router.Router` (data plane): routes each call to the executable its bucket's route names,
  times the calls of a round of turns, falls back to the next candidate when a call fails;
- the :class:`~.controller.Controller` (control plane, one background thread): checks the candidates on a copy
  of each new bucket's first inputs, compiles those that passed while the start keeps serving, races them in
  rounds of paired turns on real calls, decides by the sequential test of :mod:`.rule` within the
  :class:`~.policy.TuningPolicy`'s bound in time and latency tax, and re-checks later by the same rule;
- the :class:`~.lab.RealLab`: the check (in the low-priority process of :mod:`.worker`), the compiles and
  the decision cache per bucket.

A model decided at compile (``shapes=``, ``sample_inputs=``, static shapes) whose timing found rivals near the
winner is served by a tuner too (:class:`~.lab.Confirmation`): its timed bucket races at once, from its first
real call. No caller ever waits for the tuner.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hybrid.errors import RunError
from hybrid.hal.backend import Executable
from hybrid.ir import Model
from hybrid.runtime.auto import worker
from hybrid.runtime.auto.controller import Controller
from hybrid.runtime.auto.lab import Confirmation, RealLab, confirm_key
from hybrid.runtime.auto.policy import STOP_WAIT_S, Clock, TuningPolicy, monotonic
from hybrid.runtime.auto.router import Event, Lane, Router
from hybrid.runtime.auto.shapes import bucket_of
from hybrid.runtime.auto.status import BucketTuning, bucket_label
from hybrid.runtime.auto.trials import Trial
from hybrid.runtime.compiled import ServingView

__all__ = ["OnlineTuner", "stop_all"]

logger = logging.getLogger("hybrid")

PlanOf = Callable[[Trial, list[str], str], Any]
CHECKS = worker.CheckProcess()  # the check process the labs of this process share (their checks take one share)


class OnlineTuner(Executable):
    """Serves a model compiled with ``target='auto'`` and decides its backend per shape bucket (module doc).

    Args:
        model: The model.
        lab: Checks, compiles and caches for it.
        policy: Every threshold of the decisions.
        notes: How the start was chosen (the plan's notes begin with them).
        plan_of: Builds the plan shown for a trial (``cm.plan``).
        clock: The clock of the router and the controller.
        background: Run the controller in its own thread (False: the caller calls :meth:`step`, as tests do).
    """

    def __init__(self, model: Model, lab: RealLab, policy: TuningPolicy, notes: list[str], plan_of: PlanOf,
                 clock: Clock = monotonic, background: bool = True) -> None:
        self.input_names = model.signature.input_names
        self.output_names = model.signature.output_names
        self.model = model
        self.lab = lab
        self.policy = policy
        self._plan_of = plan_of
        self._clock = clock
        start = Lane(lab.start.label, lab.start.executable)
        self.router = Router(model.signature, start, clock, self._on_event, self._compile_lane)
        confirm = lab.confirm
        seeded = None if confirm is None else (confirm_key(model, confirm),
                                               tuple(Lane(t.label, t.executable) for t in confirm.rivals))
        self.controller = Controller(self.router, lab, policy, clock, start, model.name, seeded)
        self._notes = [*notes, self._start_note(lab, confirm)]
        self._poke = threading.Event()
        self._closed = False
        self._view: tuple[tuple[str, tuple[str, ...]], Any] | None = None  # (label, notes) -> the plan shown
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=_loop, args=(weakref.ref(self), self._poke),
                                            name="hybrid-online-tuner", daemon=True)
            self._thread.start()
            _track(self)

    @staticmethod
    def _start_note(lab: RealLab, confirm: Confirmation | None) -> str:
        if confirm is not None:
            rivals = ", ".join(t.label for t in confirm.rivals)
            return (f"confirming on real calls: {rivals} timed within {confirm.ratio}x of {lab.start.label} at "
                    "compile take turns with it on the first real calls of the timed bucket; other shapes are "
                    "tuned online")
        return (f"online tuning: {lab.start.label} serves every shape bucket until real calls decide (each bucket "
                "is checked, raced in paired turns and decided within the tuning policy's time bound)")

    # ------------------------------------------------------------------ the hot path
    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """One call: the router answers it on its bucket's route (the hot path takes no lock)."""
        return self.router.run(feeds)

    def _on_event(self, event: Event) -> None:
        self.controller.notify(event)
        self._poke.set()

    def _compile_lane(self, label: str) -> Lane | None:
        return self.lab.lane(label, None)

    # ------------------------------------------------------------------ the control plane
    def step(self) -> float:
        """Let the controller do what is due (the background thread's work; tests call it on scripted time)."""
        return self.controller.step()

    def status(self) -> tuple[BucketTuning, ...]:
        """Where tuning stands, per bucket seen so far (``cm.tuning``)."""
        return self.controller.status()

    def notes(self) -> list[str]:
        """The plan's notes: how the start was chosen, then one line per bucket checked or decided."""
        return [*self._notes, *self.controller.notes()]

    def view(self) -> ServingView:
        """The candidate serving the bucket with the most calls (the start before any call).

        What ``cm.backend``, ``cm.device``, ``cm.options`` and ``cm.plan`` report.
        """
        routes = self.router.routes()
        label = self.lab.start.label
        if routes:
            label = max(routes.values(), key=lambda r: r.tally.calls).serving.label
        trial = self.lab.trials.get(label) or self.lab.start
        notes = self.notes()
        key = (trial.label, tuple(notes))  # a bucket's note is replaced when it is decided again: same count
        cached = self._view
        if cached is None or cached[0] != key:
            cached = self._view = (key, self._plan_of(trial, notes, "chosen online" if routes else "start of tuning"))
        return ServingView(trial.backend, trial.device, dict(trial.options), cached[1], trial.executable)

    def serving_for(self, feeds: Mapping[str, Any]) -> ServingView:
        """The candidate serving the bucket of ``feeds``, decided first (:meth:`tune`) when it is not yet.

        A decided bucket is not called again (its counts stay the callers'). The plan's last note names the bucket and
        the candidate: every figure of a profile taken on it is that candidate's.
        """
        key = bucket_of(self.model.signature, feeds)
        if not any(s.key == key and s.state == "decided" for s in self.status()):
            self.tune([feeds])
        route = self.router.route(key)
        label = route.serving.label if route is not None else self.lab.start.label
        trial = self.lab.trials.get(label)
        if trial is None:  # compiled for the fallback only: the lab compiles (or shares) it by label
            self.lab.lane(label, None)
            trial = self.lab.trials[label]
        note = (f"target='auto' serves {bucket_label(key)} with {label} (decided before profiling); every figure is "
                "of that candidate")
        plan = self._plan_of(trial, [*self.notes(), note], "chosen online for the profiled shape")
        return ServingView(trial.backend, trial.device, dict(trial.options), plan,
                           route.serving.executable if route is not None else trial.executable)

    def tune(self, samples: Iterable[Mapping[str, Any]], timeout_s: float | None = None,
             run: Callable[[Mapping[str, Any]], Any] | None = None) -> tuple[BucketTuning, ...]:
        """Call the model on each sample until its bucket is decided: the decision made before the first request.

        At most ``timeout_s`` in all; by default the policy's bound for each distinct bucket (they are decided one
        after the other), plus a minute for the compiles.

        Raises:
            RunError: HYB-411 when a bucket is not decided within ``timeout_s``.
        """
        call = run or self.run
        samples = list(samples)
        keys = [bucket_of(self.model.signature, sample) for sample in samples]
        limit = timeout_s if timeout_s is not None else 2 * self.policy.decide_within_s * len(set(keys)) + 60.0
        deadline = time.monotonic() + limit
        for sample, key in zip(samples, keys, strict=True):
            asked = False
            while True:
                call(sample)
                status = next((s for s in self.status() if s.key == key), None)
                if status is not None and status.state == "decided":
                    if not _pending(status) or self.controller.frozen.is_set():
                        break
                    if not asked:  # left untimed by the time bound: raced now, not among the requests that follow
                        self.controller.recheck_now(key)
                        self._poke.set()
                        asked = True
                if time.monotonic() > deadline:
                    if status is not None and status.state == "decided":
                        logger.warning("auto (online): tune(): %s bucket %s decided, but %s still untimed after "
                                       "%g s; they race at its re-check", self.model.name, status.bucket,
                                       ", ".join(c.label for c in _pending(status)), limit)
                        break
                    raise RunError("HYB-411", f"tuning {self.model.name!r}: bucket {key} was not decided within "
                                   f"{limit:g} s", "give tune() a longer timeout_s, or declare shapes= at compile")
        return self.status()

    def freeze(self, timeout_s: float = STOP_WAIT_S) -> tuple[BucketTuning, ...]:
        """Stop tuning: every bucket keeps what serves it, decided as it stands; no check, race or re-check follows.

        Waits up to ``timeout_s`` for the controller to apply it (a check in progress ends after its candidate).
        """
        self.controller.freeze()
        if self._thread is None:
            self.step()
        else:
            self._poke.set()
            self.controller.frozen.wait(timeout_s)
        return self.status()

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop the controller thread (it ends the compile or check it is in first) and close every candidate."""
        self._stop()
        self._join(STOP_WAIT_S)
        self.lab.close()

    def _stop(self) -> None:
        """Ask the controller to stop: it starts no check, compile or decision from now on (it never blocks)."""
        self._closed = True
        self.controller.closing = True
        self._poke.set()

    def _join(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for the controller's thread to end; whether it has."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout=max(0.0, wait_s))
        return not thread.is_alive()


def _pending(status: BucketTuning) -> list[Any]:
    """The candidates a decided bucket left untimed (they race at its re-check)."""
    return [c for c in status.candidates if c.outcome == "open"]


def _loop(ref: weakref.ReferenceType[OnlineTuner], poke: threading.Event) -> None:
    """The controller's thread. It holds the tuner weakly: a model nobody uses any more is collected."""
    while True:
        tuner = ref()
        if tuner is None or tuner._closed:
            return
        poke.clear()  # before the step: an event that arrives during it wakes the wait below at once
        try:
            wake = tuner.step()
        except Exception as e:  # never let the thread die: the model keeps serving what its routes name
            logger.warning("auto (online): the controller of %r failed a step: %s", tuner.model.name, e)
            wake = math.inf
        idle = tuner.policy.idle_poll_s
        timeout = idle if wake == math.inf else max(0.0, min(idle, wake - tuner._clock()))
        del tuner
        poke.wait(timeout)


_LIVE: weakref.WeakSet[OnlineTuner] = weakref.WeakSet()  # tuners with a controller thread (collected ones leave)
_LIVE_LOCK = threading.Lock()


def _track(tuner: OnlineTuner) -> None:
    """Remember ``tuner`` for :func:`stop_all`, and make :func:`stop_all` the next exit handler to run.

    ``atexit`` runs the last registered first: registered again after the imports of every candidate's library so
    far, the stop runs before their own exit handlers (torch's among them) tear anything down.
    """
    with _LIVE_LOCK:
        _LIVE.add(tuner)
    atexit.unregister(stop_all)
    atexit.register(stop_all)


def stop_all(wait_s: float = STOP_WAIT_S) -> list[str]:
    """Stop every online tuner of this process, in the order the native libraries accept (issue 54).

    Run at interpreter exit (``atexit``: a normal return, ``sys.exit``, an uncaught exception, KeyboardInterrupt),
    before the interpreter finalizes: a daemon thread that comes back from ONNX Runtime's or OpenVINO's C++ after
    that is ended by ``pthread_exit`` through their frames, and libstdc++ aborts the process ("terminate called
    without an active exception", status 134). The order:

    1. every controller is told to stop: none starts a check, a compile or a decision from then on;
    2. the check process is ended for good (a controller waiting for its answer returns at once, and checks
       nothing in its own thread instead; no new one starts);
    3. each controller's thread is joined, within ``wait_s`` (:data:`~.policy.STOP_WAIT_S`) for all: the native
       call it is in (a candidate's compile or warm-up) ends while the interpreter still runs.

    The candidates are not closed here (``cm.close()`` does that): the libraries release them in their own
    teardown. Signals: hybrid installs no handler; SIGTERM's default ends the process at once with status -15
    (143 in a shell), no Python code runs and nothing aborts; a program that turns SIGTERM into an exception
    (``signal.signal(SIGTERM, lambda *_: sys.exit(0))``) gets this path and its own status. ``pyasc serve`` drains
    and closes its models on SIGTERM, then exits 0.

    Returns:
        The names of the models whose controller was still busy when ``wait_s`` ran out (empty: all stopped).
    """
    with _LIVE_LOCK:
        tuners = list(_LIVE)
    for tuner in tuners:
        tuner._stop()
    CHECKS.shutdown(for_good=True)
    deadline = time.monotonic() + wait_s
    busy = [t.model.name for t in tuners if not t._join(deadline - time.monotonic())]
    if busy:
        logger.warning("auto (online): at exit, the tuning of %s was still in a native call after %.0f s",
                       ", ".join(busy), wait_s)
    return busy
