"""Tuning a served model while it has no requests: its buckets decided before the traffic comes.

A model served with ``target='auto'`` and no warm-up decides each shape bucket on the bucket's first real
calls (:mod:`hybrid.runtime.auto`): for its first half-minute of traffic a bucket is served by the start while
the candidates are checked, compiled and raced beside the requests, on the same cores. A server is usually
started some time before its traffic comes (a rollout waits for readiness, then shifts the load). The
:class:`IdleTuner` uses that time. While the server has had no request (to any of its models) for
:attr:`IdleTuningPolicy.quiet_s`, it calls the model on random inputs at the batch sizes the batcher forms
(1, 2, 4, ... up to ``max_batch_size``), one bucket after the other, until each is decided; the decisions go
to the decision cache as any other. A candidate the race left untimed races again at the bucket's re-check
(a minute later by default): the tuner waits for it and feeds that race too, so that it is settled, and the
candidate released, before the traffic rather than on its first calls. A request that arrives meanwhile
shares the cores with at most one such call, after which the tuner waits for the server to be idle again.

Random inputs stand for the real ones only where every input has a declared dtype and shape with no dynamic
dimension but the batch, and no reduced precision was asked for. Elsewhere the tuner learns from the traffic
instead: a sequence length or an image size would be a guess (a shape nobody may send), and the accuracy of a
reduced precision (``--precision``) is judged on real inputs. So it keeps the first request of each shape it
sees (its shape but the batch: :attr:`IdleTuningPolicy.max_learned_shapes` of them at most), and when the
server is idle it decides the other batch sizes of that shape on that request's rows, repeated to each batch
size: the buckets the batcher will form from requests like it.

``pyasc serve`` starts one per model (``--no-idle-tuning`` turns it off); a model with explicit warm-up samples
is decided before it serves, and the tuner then finds nothing left to do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hybrid.errors import HybridError
from hybrid.runtime.auto.shapes import bucket_of

if TYPE_CHECKING:
    from hybrid.serve.core.model import ServedModel

__all__ = ["IdleTuner", "IdleTuningPolicy", "idle_samples", "learned_samples", "random_inputs_unfit",
           "start_idle_tuning"]

logger = logging.getLogger("hybrid.serve")
_UNTIL_NEWS = 3600.0  # learning, nothing pending: wait for a request of a new shape (saw wakes the thread)


@dataclass(frozen=True, slots=True)
class IdleTuningPolicy:
    """When the idle tuner calls the model.

    Attributes:
        quiet_s: The server is idle once no request has run for this long; then one call at a time, each after
            looking again. A second is longer than the gap between the requests of any client that is still
            sending (a closed loop waits only for its answers), and short beside the minutes before a
            rollout's traffic.
        poll_s: How often a busy server is looked at again.
        recheck_grace_s: A re-check planned for a candidate left untimed is waited for (the tuner stays on);
            one that has not begun this long after it was due is not waited for any more.
        max_learned_shapes: Where the tuner learns from the traffic, the most shapes (but the batch) whose
            first request it keeps and tunes: each costs the buckets of every batch size, and the memory of
            one request.
    """

    quiet_s: float = 1.0
    poll_s: float = 0.25
    recheck_grace_s: float = 5.0
    max_learned_shapes: int = 16


def _reduced_precision(model: ServedModel) -> bool:
    precision = model.compile_request.get("precision")
    return precision not in (None, "fp32")


def _batch_sizes(model: ServedModel) -> list[int]:
    """The batch sizes tuned: the powers of two up to ``max_batch_size``, and the maximum itself.

    The batches the batcher forms round up to those buckets; a model that does not batch has one, 1.
    """
    top = max(1, model.max_batch_size) if model.batch_symbol is not None else 1
    return sorted({min(top, 1 << k) for k in range(top.bit_length() + 1)})


def random_inputs_unfit(model: ServedModel) -> str | None:
    """Why random inputs cannot stand for ``model``'s real ones (then the tuner learns from the traffic); None."""
    if _reduced_precision(model):
        return "the accuracy of a reduced precision is checked on real inputs"
    for spec in model.signature.inputs:
        dims = list(spec.shape or ())
        if model.batch_symbol is not None and dims:
            dims = dims[1:]
        if spec.kind != "tensor" or spec.dtype is None or spec.shape is None or not all(isinstance(d, int)
                                                                                         for d in dims):
            return f"input {spec.name!r} has no fixed shape but for its batch ({spec.shape})"
    return None


def idle_samples(model: ServedModel, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Random inputs for the idle tuner, one per batch-size bucket; none where random inputs are unfit.

    The batch sizes are the powers of two up to ``max_batch_size`` and the maximum itself; a model that does
    not batch gets one sample.
    """
    from hybrid.serve.core.warmup import samples_of_rows

    if not getattr(model.compiled, "tunes_online", False) or random_inputs_unfit(model) is not None:
        return []
    return _distinct(model, samples_of_rows(model, _batch_sizes(model), seed))


def _distinct(model: ServedModel, samples: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """``samples`` less those whose bucket an earlier one has."""
    seen, out = set(), []
    for sample in samples:
        key = bucket_of(model.signature, sample)
        if key not in seen:
            seen.add(key)
            out.append(sample)
    return out


def learned_samples(model: ServedModel, request: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """A real request's rows, repeated to each batch size of :func:`idle_samples` (one per bucket)."""
    if model.batch_symbol is None:
        return [dict(request)]
    out = []
    for size in _batch_sizes(model):
        out.append({name: np.take(value, np.arange(size) % len(value), axis=0) for name, value in request.items()})
    return _distinct(model, out)


class IdleTuner:
    """Calls a served model while the server is idle, until each bucket it follows is decided.

    It follows the buckets of ``samples`` (random inputs), and with ``learn`` also those of the requests it is
    shown (:meth:`saw`): for each new shape (but the batch), every batch size of it (:func:`learned_samples`).

    Args:
        model: The served model (its compiled model tunes online).
        samples: From :func:`idle_samples`, checked here as a request is.
        policy: When to call.
        clock: ``time.monotonic`` or a scripted one (tests).
        idle_for: ``idle_for(now)``: seconds since the last request ended, None while one runs. The server's
            (:meth:`hybrid.serve.core.repository.ModelRegistry.idle_for`: a model's tuning must not slow the requests
            of another); default: the model's own.
        turn: Shared by the tuners of one server: a tuner holds it while it races a bucket, so that the models
            of a repository are tuned one after the other, each race timed without another beside it.
        learn: Follow the shapes of the requests it is shown too, and stay on for new ones once every bucket
            is decided.
    """

    def __init__(self, model: ServedModel, samples: list[dict[str, np.ndarray]],
                 policy: IdleTuningPolicy | None = None, clock: Callable[[], float] = time.monotonic,
                 idle_for: Callable[[float], float | None] | None = None,
                 turn: threading.Lock | None = None, learn: bool = False) -> None:
        self.model = model
        self.policy = policy or IdleTuningPolicy()
        self._clock = clock
        self._idle_for = idle_for or model.idle_for
        self._turn = turn
        self._holding = False
        self._pending: list[tuple[Any, dict[str, np.ndarray]]] = []
        self._followed: set[Any] = set()  # every bucket ever pending
        for sample in samples:
            self._follow(sample)
        self.learn = learn
        self.shapes: set[Any] = set()  # the shapes (but the batch) of the requests it learned from
        self._news: deque[dict[str, np.ndarray]] = deque()  # their first requests, from the event loop
        self._first_call: dict[Any, float] = {}  # bucket -> when this tuner made its first call
        self.calls = 0
        self.done = False
        self._quiet = False  # learning, every bucket seen so far decided (logged once each time)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = clock()

    def _follow(self, sample: dict[str, np.ndarray]) -> None:
        key = bucket_of(self.model.signature, sample)
        if key not in self._followed:
            self._followed.add(key)
            self._pending.append((key, self.model.check(sample).feeds))

    def saw(self, feeds: Mapping[str, Any]) -> None:
        """A checked request, shown on the event loop: a new shape's first one is kept (a copy) to learn from.

        Cheap for a shape already seen, and nothing once :attr:`IdleTuningPolicy.max_learned_shapes` are kept.
        """
        if not self.learn or len(self.shapes) >= self.policy.max_learned_shapes:
            return
        batched = self.model.batch_symbol is not None
        try:
            shape = tuple((name, value.shape[1:] if batched else value.shape) for name, value in feeds.items())
        except AttributeError:  # not arrays (a sequence input): nothing to repeat
            return
        if shape in self.shapes or (batched and any(v.ndim == 0 or len(v) == 0 for v in feeds.values())):
            return
        self.shapes.add(shape)
        self._news.append({name: np.array(value, copy=True) for name, value in feeds.items()})
        self._wake.set()

    def step(self) -> float | None:
        """Do what is due now: one call when the server is idle and a bucket is being tuned.

        A bucket is followed until it is decided and no re-check is planned for a candidate its race left
        untimed (outcome 'open': such a candidate races at the re-check, which is better run now than on the
        traffic's first calls; a re-check planned for a tie is the long run's, and is left to the traffic).

        Returns:
            Seconds until the next step is due; None once no bucket is followed any more, or the model closed.
        """
        if self.done:
            return None
        if self._stop.is_set() or not self.model.ready:  # closed (a tuner starts after the warm-up)
            return self._finish("stopped")
        while self._news:  # requests of new shapes, learned from
            request = self._news.popleft()
            try:
                for sample in learned_samples(self.model, request):
                    self._follow(sample)
            except HybridError as e:  # (checked as a request is; one that passed passes repeated)
                logger.info("model %r version %s: not tuned while idle at a request's shape: %s", self.model.name,
                            self.model.version, e)
        now = self._clock()
        status = {s.key: s for s in self.model.compiled.tuning}
        pending, waits = [], []
        for key, feeds in self._pending:
            record = status.get(key)
            if record is None or record.state != "decided":
                pending.append((key, feeds))
            elif (due := self._recheck_due(record)) is not None and now < due + self.policy.recheck_grace_s:
                pending.append((key, feeds))
                waits.append(max(due - now, 0.0))
        self._pending = pending
        if not pending:
            if not self.learn:
                return self._finish("decided")
            self._release()
            if not self._quiet and self.shapes:
                self._quiet = True
                logger.info("model %r version %s: idle tuning: the buckets of the %d shape(s) seen so far are "
                            "decided (%d calls of its own)", self.model.name, self.model.version, len(self.shapes),
                            self.calls)
            return _UNTIL_NEWS
        self._quiet = False
        tuning = [(key, feeds) for key, feeds in pending if key not in status or status[key].state != "decided"]
        if not tuning:  # a re-check is planned: the controller starts it on time, then its turns need calls
            self._release()
            return max(min(waits), self.policy.poll_s / 10)
        idle = self._idle_for(now)
        if idle is None:
            return self.policy.poll_s
        if idle < self.policy.quiet_s:
            return max(self.policy.quiet_s - idle, 0.001)
        if self._turn is not None and not self._holding:
            if not self._turn.acquire(blocking=False):  # another model's race: after it
                return self.policy.poll_s
            self._holding = True
        key, feeds = tuning[0]
        if key not in status:
            self._first_call[key] = now  # what the bucket's re-check time counts from
        try:
            self.model.compiled.run_checked(dict(feeds))
        except Exception as e:  # the thread must not die with a traceback: the model serves on regardless
            logger.warning("model %r version %s: tuning while idle stopped: %s", self.model.name, self.model.version,
                           e if isinstance(e, HybridError) else f"{type(e).__name__}: {e}")
            return self._finish("failed")
        self.calls += 1
        return 0.0

    def _recheck_due(self, record: Any) -> float | None:
        """When (on the tuner's clock) the planned re-check of an untimed candidate of a decided bucket is due."""
        if record.recheck_at_s is None or record.key not in self._first_call:
            return None
        if not any(c.outcome == "open" for c in record.candidates):
            return None
        return self._first_call[record.key] + record.recheck_at_s

    def _finish(self, how: str) -> None:
        """Mark the tuner done (``how``: 'decided', 'stopped' or 'failed'); log a completion."""
        self.done = True
        self._release()
        if how == "decided":
            logger.info("model %r version %s: idle tuning done, every batch-size bucket decided (%d calls of its "
                        "own, %.1f s)", self.model.name, self.model.version, self.calls, self._clock() - self._started)

    def _release(self) -> None:
        if self._holding and self._turn is not None:
            self._holding = False
            self._turn.release()

    def run(self) -> None:
        """Step until done (the thread's body), in the models' scheduling (as the batch runners)."""
        from hybrid.serve.core.batcher import enter_compute_policy

        enter_compute_policy()
        try:
            while (wait := self.step()) is not None:
                if wait > 0:
                    self._wake.wait(wait)  # a new shape (saw) or a stop wakes it early
                    self._wake.clear()
                if self._stop.is_set():
                    self.done = True
                    return
        finally:
            self._release()

    def start(self, name: str) -> None:
        """Run in a daemon thread named ``name`` (in Python; the OS shows the models' thread name)."""
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:  # (hybrid.serve.core.model.Stoppable)
        """Stop, and wait for a call in progress to end (before the model is closed)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


def start_idle_tuning(model: ServedModel, idle_for: Callable[[float], float | None] | None = None,
                      policy: IdleTuningPolicy | None = None, turn: threading.Lock | None = None) -> IdleTuner | None:
    """Start the idle tuning of ``model``, tied to its life (:meth:`ServedModel.run_beside`).

    On random inputs where they stand for the real ones (:func:`idle_samples`); else on the requests' own
    shapes and rows as they come (:meth:`IdleTuner.saw`, which the model calls for each request:
    :meth:`ServedModel.watch_requests`; why is logged).

    Args:
        model: A served model; nothing starts unless it tunes online.
        idle_for: How long the server has been idle (:meth:`hybrid.serve.core.repository.ModelRegistry.idle_for`);
            None: the model's own.
        policy: When to call (None: the defaults).
        turn: The server's tuners' shared lock (:class:`IdleTuner`).

    Returns:
        The running tuner, or None.
    """
    if not getattr(model.compiled, "tunes_online", False) or not model.ready:
        return None
    if model.sequences is not None:  # its requests need their sequence's controls and state: tuned on the traffic
        logger.info("model %s:%s: not tuned while idle (sequence batching: it decides on its requests)",
                    model.name, model.version)
        return None
    unfit = random_inputs_unfit(model)
    try:
        samples = idle_samples(model) if unfit is None else []
        tuner = IdleTuner(model, samples, policy, idle_for=idle_for, turn=turn, learn=unfit is not None)
    except HybridError as e:  # optional: the model serves, and decides on its first real calls
        logger.warning("model %s:%s: not tuned while idle: %s", model.name, model.version, e)
        return None
    model.run_beside(tuner)
    if tuner.learn:
        model.watch_requests(tuner.saw)
    tuner.start(f"hybrid-serve-{model.name}-idle")
    sizes = ", ".join(str(s) for s in _batch_sizes(model))
    if unfit is None:
        logger.info("model %s:%s: deciding its buckets of batch size %s while the server is idle (--no-idle-tuning "
                    "turns this off)", model.name, model.version, sizes)
    else:
        logger.info("model %s:%s: random inputs cannot stand for its requests (%s): while the server is idle, it "
                    "decides the buckets of batch size %s at the shapes its requests bring, on their rows "
                    "(--no-idle-tuning turns this off)", model.name, model.version, unfit, sizes)
    return tuner
