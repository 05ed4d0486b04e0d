"""``@hybrid.dynamic_batch``: many single requests in, one call of the wrapped function per batch.

Callers in many threads (``f(x)``, ``f.submit(x)``) or asyncio tasks (``await f.acall(x)``) each pass
one request. A collector thread forms batches: a batch is sent as soon as it holds ``max_batch``
requests or its oldest request has waited ``timeout`` seconds, whichever is first; with
``dispatch_when_idle`` (the server's batching) also as soon as a runner is idle, so a lone request on an
idle model runs at once and ``timeout`` is only an upper bound (Triton's default queue delay is 0).
Batch formation goes on while earlier batches run, so the requests that arrive during a batch run
together as soon as a runner frees (at most ``timeout`` after they arrived or then, whichever is later). Runner threads
(``max_concurrent_batches``, default 1) call the function with a list and hand result ``i`` to the
caller of request ``i``.

Contract of the wrapped function: take a list of requests, return a sequence of the same length
(a list, a tuple, or an array whose first axis is the batch). An element that is an exception
instance fails only its own caller. When the function raises on a batch, each member is run again alone
(``isolate``, default on), so only the requests that fail alone fail, each with its own error (a
HybridError as raised, anything else as HYB-408); ``isolate=False`` fails the whole batch with HYB-408. A
wrong length or type fails that batch's callers with HYB-413. The batcher itself goes on.

Requests can also be checked before they join a batch (``validate``: a compiled model, or any callable
that raises for a bad request): a bad one fails at once, in its caller's thread, and never reaches a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid.errors import ConfigError, HybridError, RunError, first_line
from hybrid.ir.signature import Signature
from hybrid.runtime.validate import RequestValidator

__all__ = ["BatchStats", "Batcher", "RequestFuture", "dynamic_batch"]

_ids = itertools.count(1)

Clock = Callable[[], float]
"""Seconds on a monotonic clock (``time.monotonic`` in production; a scripted one in tests)."""

Wait = Callable[[threading.Condition, float], object]
"""``wait(cond, seconds)``: wait on ``cond`` (held) for at most ``seconds`` of the clock, or until notified.

In production :meth:`threading.Condition.wait`; a scripted clock's own, which returns when its time moves."""


class RequestFuture(Future[Any]):
    """A ``concurrent.futures.Future`` whose cancellation surfaces as HYB-414 from ``result()``."""

    def result(self, timeout: float | None = None) -> Any:
        """The request's result, as ``Future.result`` gives it.

        Raises:
            RunError: HYB-414 when the request was cancelled before its batch ran.
        """
        try:
            return super().result(timeout)
        except CancelledError as e:
            raise RunError("HYB-414", "the request was cancelled before its batch ran",
                           "submit it again if the result is still needed") from e

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The request's exception (None when it succeeded), as ``Future.exception`` gives it.

        Raises:
            RunError: HYB-414 when the request was cancelled before its batch ran.
        """
        try:
            return super().exception(timeout)
        except CancelledError as e:
            raise RunError("HYB-414", "the request was cancelled before its batch ran") from e


@dataclass(frozen=True, slots=True)
class BatchStats:
    """Counters of one batcher since it was made.

    Attributes:
        requests: Requests that ran in a batch (succeeded or failed).
        batches: Batches run.
        mean_batch_size: ``requests / batches``.
        max_batch_size: Largest batch run (never above ``max_batch``).
        mean_queue_wait_s: Mean time from submit to the start of the request's batch.
        p99_queue_wait_s: 99th percentile of that wait over the last 10,000 requests.
        max_queue_wait_s: Longest such wait.
        mean_batch_time_s: Mean time the wrapped function took per batch.
        failed_batches: Batches whose function raised or broke the contract.
        retried_alone: Requests run again alone after their batch raised (``isolate``).
        rejected: Submits refused because the queue held ``max_queue`` requests (HYB-412).
        cancelled: Requests cancelled while queued (HYB-414), including timed-out ones.
        timed_out: Calls that gave up after their per-call timeout (HYB-411).
        queued: Requests waiting now.
        running: Batches running now.
    """

    requests: int
    batches: int
    mean_batch_size: float
    max_batch_size: int
    mean_queue_wait_s: float
    p99_queue_wait_s: float
    max_queue_wait_s: float
    mean_batch_time_s: float
    failed_batches: int
    retried_alone: int
    rejected: int
    cancelled: int
    timed_out: int
    queued: int
    running: int


def _mismatch(out: Any, n: int) -> str:
    """What is wrong with a batch's return value ('' when it has one result per request)."""
    if isinstance(out, (str, bytes)) or not isinstance(out, (Sequence, np.ndarray)):
        return type(out).__name__
    if isinstance(out, np.ndarray) and out.ndim == 0:
        return "a 0-d array"
    return "" if len(out) == n else f"{type(out).__name__} of length {len(out)}"


class _Request:
    __slots__ = ("enqueued", "future", "item")

    def __init__(self, item: Any, enqueued: float) -> None:
        self.item = item
        self.future = RequestFuture()
        self.enqueued = enqueued


def _request_check(validate: Any) -> Callable[[Any], Any] | None:
    """The per-request check of ``validate``: a model's (anything with a Signature), or the callable itself."""
    if validate is None:
        return None
    signature = getattr(validate, "signature", None)
    if isinstance(signature, Signature):  # a CompiledModel or hybrid.Model (checked before callable: a model is one)
        return RequestValidator(signature, getattr(validate, "model", validate))
    if callable(validate):
        return validate
    raise ConfigError("HYB-102", f"dynamic_batch: validate must be a compiled model or a function that raises for a "
                      f"bad request, got {type(validate).__name__}", "pass validate=model or validate=check_request")


def _positive(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("HYB-102", f"dynamic_batch: {name} must be a positive int, got {value!r}")


class Batcher:
    """The callable that ``@dynamic_batch`` returns; see the module docstring for the semantics.

    Args:
        fn: ``fn(list_of_requests) -> sequence_of_results`` (a coroutine function is run to completion
            in the runner thread).
        max_batch: Most requests in one call of ``fn``.
        timeout: Longest time in seconds a request waits for its batch to fill.
        max_queue: Most requests waiting at once; more are rejected with HYB-412. None: unbounded.
        max_concurrent_batches: Batches that may run at the same time (runner threads).
        name: Used in thread names and messages; default: the function's name.
        dispatch_when_idle: Send what is queued as soon as a runner is idle instead of waiting for the
            batch to fill (``timeout`` stays the longest wait).
        validate: Checks each request before it is queued, in the caller's thread: a compiled model (its
            inputs' names, dtypes, shapes and index ranges; a request is a mapping, a tuple or one array,
            with or without the batch axis: :class:`hybrid.runtime.validate.RequestValidator`) or a function
            that raises for a bad request. None: no check.
        isolate: When the function raises on a batch of several, run each member again alone, so that only
            the requests that fail alone fail (the function must tolerate running a request twice).
        clock: What the queue waits and the stats are measured on (``time.monotonic``; tests script it).
        wait: How the collector waits for a batch's ``timeout`` on that clock (:data:`Wait`); goes with ``clock``.

    Raises:
        ConfigError: HYB-102 for a bad setting.
    """

    def __init__(self, fn: Callable[[list[Any]], Sequence[Any]], max_batch: int = 16, timeout: float = 0.1,
                 max_queue: int | None = None, max_concurrent_batches: int = 1, name: str | None = None,
                 dispatch_when_idle: bool = False, validate: Any = None, isolate: bool = True,
                 clock: Clock = time.monotonic, wait: Wait = threading.Condition.wait) -> None:
        if not callable(fn):
            raise ConfigError("HYB-102", f"dynamic_batch: expected a function, got {type(fn).__name__}")
        _positive("max_batch", max_batch)
        _positive("max_queue", max_queue, allow_none=True)
        _positive("max_concurrent_batches", max_concurrent_batches)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise ConfigError("HYB-102", f"dynamic_batch: timeout must be seconds >= 0, got {timeout!r}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self._clock = clock
        self._wait = wait
        self._check = _request_check(validate)
        self.isolate: bool = bool(isolate)
        self.max_batch = max_batch
        self.timeout: float = float(timeout)
        self.max_queue = max_queue
        self.max_concurrent_batches = max_concurrent_batches
        # dispatch_when_idle: no collector; each runner takes what is queued whenever it is idle
        self._busy_at = max_concurrent_batches if dispatch_when_idle else 0
        self.name: str = name or getattr(fn, "__name__", "batched")
        self._is_async = inspect.iscoroutinefunction(fn)
        self._cond = threading.Condition()  # guards the queue, the counters and the lifecycle
        self._queue: deque[_Request] = deque()
        self._slots = threading.Semaphore(max_concurrent_batches)
        self._batches: deque[list[_Request] | None] = deque()
        self._batch_ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._counts = dict.fromkeys(("requests", "batches", "max_size", "failed", "alone", "rejected",
                                      "cancelled", "timed_out", "running"), 0)
        self._wait_sum = 0.0
        self._wait_max = 0.0
        self._waits: deque[float] = deque(maxlen=10_000)
        self._run_sum = 0.0

    # ------------------------------------------------------------------ calling
    def submit(self, item: Any) -> RequestFuture:
        """Queue one request; return a future for its own result.

        Raises:
            RunError: HYB-412 when ``max_queue`` requests are already waiting, HYB-415 after ``close``.
            HybridError: what ``validate`` raised for a bad request (HYB-401..407, HYB-418 for a model).
        """
        if self._check is not None:
            self._check(item)  # a bad request fails here, alone, before it can share a batch
        req = _Request(item, self._clock())
        with self._cond:
            if self._closing:
                raise RunError("HYB-415", f"dynamic_batch {self.name!r} is closed; it takes no more requests")
            if self.max_queue is not None and len(self._queue) >= self.max_queue:
                self._counts["rejected"] += 1
                raise RunError("HYB-412", f"dynamic_batch {self.name!r}: {len(self._queue)} requests already "
                               f"queued (max_queue={self.max_queue}); request rejected",
                               "retry later, or raise max_queue")
            if not self._threads:
                self._start()
            self._queue.append(req)
            self._cond.notify_all()
        req.future.add_done_callback(functools.partial(self._on_done, req))
        return req.future

    def __call__(self, item: Any, *, timeout: float | None = None) -> Any:
        """Run one request through a batch and return its result (blocking; from asyncio use ``acall``).

        Args:
            item: The request.
            timeout: Longest time to wait in seconds; None waits as long as it takes.

        Raises:
            RunError: HYB-411 when ``timeout`` passes first (a queued request is withdrawn), HYB-412,
                HYB-413, HYB-414, HYB-415 as described on the class; whatever the function failed this
                request with.
        """
        future = self.submit(item)
        try:
            return future.result(timeout)
        except TimeoutError:
            if future.done():  # the function's own TimeoutError for this request
                raise
            raise self._timed_out(future, timeout) from None

    async def acall(self, item: Any, *, timeout: float | None = None) -> Any:
        """``await f.acall(x)``: the asyncio form of ``f(x)``; cancelling the task withdraws a queued request."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        def done(_: Future) -> None:  # in the runner thread: one hop back to the loop
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(wake)

        future = self.submit(item)
        timer = loop.call_later(timeout, wake) if timeout is not None else None
        future.add_done_callback(done)
        try:
            await waiter
        except asyncio.CancelledError:
            future.cancel()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if not future.done():
            raise self._timed_out(future, timeout)
        return future.result()  # the result, this request's error, or HYB-414 when it was cancelled

    def _timed_out(self, future: RequestFuture, timeout: float | None) -> RunError:
        withdrawn = future.cancel()
        with self._cond:
            self._counts["timed_out"] += 1
        where = "it was still queued and is withdrawn" if withdrawn else "its batch was still running"
        return RunError("HYB-411", f"dynamic_batch {self.name!r}: no result within {timeout} s ({where})",
                        "raise the per-call timeout, lower max_batch, or add max_concurrent_batches")

    def _on_done(self, req: _Request, future: Future) -> None:
        if future.cancelled():
            with self._cond:
                self._counts["cancelled"] += 1
                with contextlib.suppress(ValueError):  # already taken into a batch
                    self._queue.remove(req)
                self._cond.notify_all()

    # ------------------------------------------------------------------ threads
    def _start(self) -> None:
        uid = next(_ids)
        if self._busy_at:  # dispatch_when_idle: an idle runner takes what is queued itself (no collector hop)
            self._threads = [threading.Thread(target=self._pull, name=f"hybrid-batch-{self.name}-{uid}-run{i}",
                                              daemon=True) for i in range(self.max_concurrent_batches)]
            for t in self._threads:
                t.start()
            return
        collector = threading.Thread(target=self._collect, name=f"hybrid-batch-{self.name}-{uid}", daemon=True)
        runners = [threading.Thread(target=self._runner, name=f"hybrid-batch-{self.name}-{uid}-run{i}",
                                    daemon=True) for i in range(self.max_concurrent_batches)]
        self._threads = [collector, *runners]
        for t in self._threads:
            t.start()

    def _collect(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    break  # closing and drained
                while self._queue and len(self._queue) < self.max_batch and not self._closing:
                    remaining = self._queue[0].enqueued + self.timeout - self._clock()
                    if remaining <= 0:
                        break
                    self._wait(self._cond, remaining)
                if not self._queue:
                    continue
            # a batch is due; wait for a runner slot while requests keep queueing, then take them
            self._slots.acquire()
            with self._cond:
                batch = self._take()
                if batch:
                    self._counts["running"] += 1
            if batch:
                with self._batch_ready:
                    self._batches.append(batch)
                    self._batch_ready.notify()
            else:
                self._slots.release()
        with self._batch_ready:
            self._batches.extend([None] * self.max_concurrent_batches)
            self._batch_ready.notify_all()

    def _pull(self) -> None:
        """A runner of ``dispatch_when_idle``: whenever it is idle it runs what is queued (up to max_batch)."""
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return  # closing and drained
                batch = self._take()
                if not batch:
                    continue
                self._counts["running"] += 1
            self._run(batch)

    def _take(self) -> list[_Request]:
        batch: list[_Request] = []
        now = self._clock()
        while self._queue and len(batch) < self.max_batch:
            req = self._queue.popleft()
            if req.future.set_running_or_notify_cancel():  # False: cancelled while queued
                wait = now - req.enqueued
                self._wait_sum += wait
                self._wait_max = max(self._wait_max, wait)
                self._waits.append(wait)
                batch.append(req)
        return batch

    def _runner(self) -> None:
        while True:
            with self._batch_ready:
                while not self._batches:
                    self._batch_ready.wait()
                batch = self._batches.popleft()
            if batch is None:
                return
            try:
                self._run(batch)
            finally:
                self._slots.release()

    def _call(self, items: list[Any]) -> Any:
        out = self.fn(items)
        return asyncio.run(out) if self._is_async else out

    def _run(self, batch: list[_Request]) -> None:
        t0 = self._clock()
        failed = True
        try:
            try:
                out = self._call([r.item for r in batch])
            except Exception as e:
                if self.isolate and len(batch) > 1:
                    self._run_alone(batch)
                else:
                    self._fail_raised(batch, e)
                return
            if self._hand_out(batch, out):
                failed = False
        except BaseException as e:  # never leave a caller waiting, whatever happened
            self._fail(batch, "HYB-408", f"dynamic_batch {self.name!r}: batch failed: {e!r}", None, e)
            if not isinstance(e, Exception):
                raise
        finally:
            with self._cond:
                self._counts["requests"] += len(batch)
                self._counts["batches"] += 1
                self._counts["max_size"] = max(self._counts["max_size"], len(batch))
                self._counts["failed"] += failed
                self._counts["running"] -= 1
                self._run_sum += self._clock() - t0

    def _run_alone(self, batch: list[_Request]) -> None:
        """Run each member of a batch that raised by itself: only the requests that fail alone fail."""
        with self._cond:
            self._counts["alone"] += len(batch)
        for req in batch:
            try:
                out = self._call([req.item])
            except Exception as e:
                self._fail_raised([req], e)
                continue
            self._hand_out([req], out)

    def _hand_out(self, batch: list[_Request], out: Any) -> bool:
        """Give result ``i`` to the caller of request ``i``; False (and HYB-413 to all) for a wrong return."""
        found = _mismatch(out, len(batch))
        if found:
            self._fail(batch, "HYB-413", f"dynamic_batch {self.name!r}: expected a list of {len(batch)} "
                       f"results (one per request), got {found}", "return one result per request, in request order",
                       None)
            return False
        for req, value in zip(batch, out):
            if isinstance(value, BaseException):
                req.future.set_exception(value)
            else:
                req.future.set_result(value)
        return True

    def _fail_raised(self, batch: list[_Request], error: Exception) -> None:
        """The function raised on ``batch``: a lone request gets a HybridError as it is, anything else HYB-408."""
        if len(batch) == 1 and isinstance(error, HybridError):
            batch[0].future.set_exception(error)
            return
        self._fail(batch, "HYB-408", f"dynamic_batch {self.name!r}: the function raised {type(error).__name__} on a "
                   f"batch of {len(batch)}: {first_line(error)}",
                   "return an exception instance at a request's position to fail only that request", error)

    @staticmethod
    def _fail(batch: list[_Request], code: str, message: str, hint: str | None,
              cause: BaseException | None) -> None:
        for req in batch:
            if not req.future.done():
                err = RunError(code, message, hint)  # one object per caller: tracebacks never mix across threads
                err.__cause__ = cause
                req.future.set_exception(err)

    # ------------------------------------------------------------------ lifecycle and stats
    def stats(self) -> BatchStats:
        """A snapshot of the counters."""
        with self._cond:
            c = self._counts
            waits = sorted(self._waits)
            p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else 0.0
            return BatchStats(
                requests=c["requests"], batches=c["batches"],
                mean_batch_size=c["requests"] / c["batches"] if c["batches"] else 0.0,
                max_batch_size=c["max_size"],
                mean_queue_wait_s=self._wait_sum / c["requests"] if c["requests"] else 0.0,
                p99_queue_wait_s=p99, max_queue_wait_s=self._wait_max,
                mean_batch_time_s=self._run_sum / c["batches"] if c["batches"] else 0.0,
                failed_batches=c["failed"], retried_alone=c["alone"], rejected=c["rejected"], cancelled=c["cancelled"],
                timed_out=c["timed_out"], queued=len(self._queue), running=c["running"])

    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        """Take no more requests; run what is queued (``wait=True``) or cancel it (HYB-414), then stop.

        Args:
            wait: Drain the queue first; False cancels queued requests.
            timeout: Longest time to wait for the threads to finish.
        """
        with self._cond:
            self._closing = True
            dropped = [] if wait else list(self._queue)
            self._cond.notify_all()
        for req in dropped:
            req.future.cancel()
        # the threads' join is real time whatever the queue's clock (a scripted one need not move while they end)
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<hybrid dynamic_batch {self.name!r} max_batch={self.max_batch} timeout={self.timeout} "
                f"max_queue={self.max_queue}>")


def dynamic_batch(fn: Callable[[list[Any]], Sequence[Any]] | None = None, *, max_batch: int = 16,
                  timeout: float = 0.1, max_queue: int | None = None, max_concurrent_batches: int = 1,
                  name: str | None = None, validate: Any = None, isolate: bool = True) -> Any:
    """Turn ``fn(list_of_requests) -> list_of_results`` into a function of one request, batched across callers.

    Use as ``@dynamic_batch`` or ``@dynamic_batch(max_batch=16, timeout=0.1, max_queue=None, validate=model)``.
    The result is a :class:`Batcher`: ``f(x)`` blocks for the result, ``f.submit(x)`` returns a future,
    ``await f.acall(x)`` serves asyncio tasks, ``f.stats()`` reports, ``f.close()`` drains. ``validate`` checks
    each request before it joins a batch; ``isolate`` reruns the members of a batch that raised one by one.
    """
    def wrap(func: Callable[[list[Any]], Sequence[Any]]) -> Batcher:
        return Batcher(func, max_batch=max_batch, timeout=timeout, max_queue=max_queue,
                       max_concurrent_batches=max_concurrent_batches, name=name, validate=validate,
                       isolate=isolate)

    return wrap if fn is None else wrap(fn)
