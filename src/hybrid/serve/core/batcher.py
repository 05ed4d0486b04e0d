"""The server's dynamic batcher: the queue lives on the event loop, only the model's run leaves it.

:class:`LoopBatcher` keeps a model's waiting requests on the event loop that received them. Whenever a
runner is idle, what is queued (up to ``max_batch``) goes as one batch: a lone client's request on an
idle model never waits, and what queued while a batch ran goes together when it ends (Triton's default
queue delay is 0). When ``max_batch`` requests are already queued while every runner is busy, that full
batch is joined at once and handed over, so a runner that finishes takes its next batch without waiting
for the loop. Under load, an idle runner lets its batch fill to the number of requests that have lately
come together (the most queued and running at once over the last 32 batches; lowered to what came when a
hold runs out), for at most ``max_delay`` (the model's ``batch_timeout``) and never longer than the last
batch took: closed-loop clients then meet in one batch instead of splitting into a lone request and the
rest, which costs both throughput and tail latency. A closing batcher never holds.

The work of a batch is split so that the runner threads need Python (and so the GIL, which the
transports' event loop holds most of the time under load) as little as possible: the loop joins the
batch (``join``), a runner thread only executes it (``execute``: the model's run, which releases the GIL)
and posts it back with one loop wake-up per batch, and the loop splits the outputs and answers each
caller (``split``). The runner threads never touch the queue or any lock of it, the loop never waits
for a runner.

How many batches run at once may change while it serves (:meth:`LoopBatcher.resize`, or the ``sizer`` asked after
each batch): a served model runs as many as the layout serving it has replicas (:mod:`hybrid.serve.core.runners`).

The queue is bound to the loop of its first request; a request from another loop is passed to that one.
:meth:`LoopBatcher.close` (any thread but the loop's) refuses new requests, lets the queued ones run
and waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from hybrid.errors import RunError

__all__ = [
    "COMPUTE_NICE", "COMPUTE_THREAD_NAME", "BatcherStats", "LoopBatcher", "QueueTimeout", "enter_compute_policy",
    "in_compute_policy",
]

logger = logging.getLogger("hybrid.serve")

Item = TypeVar("Item")
Job = Any  # what join returns and execute takes


COMPUTE_NICE = 3
"""How much lower the models' threads run than the rest of the server process (nice increments, Linux).

Under saturation the front end (gRPC and HTTP, in ``SCHED_BATCH``) competed with the model's threads at equal
weight, so requests waited to be read and answered while the batch ran: with the models' threads at nice +3
(about half a normal thread's CPU weight) the front end keeps up and the batches fill: ``pyasc serve`` answered
x1.06 the requests at 16 clients (``benchmarks/vs_triton.py --baseline``, medians of paired rounds on 2 cores;
+2 gave x1.06, +3 x1.09, +5 and +8 less and noisier in the exploration; also with the load generator's own
threads at +3, so the gain is the front end's, not the co-located clients'). On an idle core a nice value changes
nothing. Raising one's own nice value needs no privilege.
"""

COMPUTE_THREAD_NAME = "pyasc-compute"
"""The OS name of the models' threads (batch runners, model loading, and the runtime pools they start): in
``top -H`` or ``/proc/PID/task/*/comm`` the rest of the server process is its front end."""


def _name_thread(name: str) -> None:
    """Give the calling thread ``name`` in the OS (Linux: what ``top -H``, ``ps -L``, ``perf`` and py-spy show).

    Threads it starts afterwards (a runtime's thread pool) inherit the name. Nothing where the platform has no
    per-thread name file.
    """
    with contextlib.suppress(OSError):
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(name[:15])


def enter_compute_policy() -> None:
    """Put the calling thread in the models' scheduling: the normal policy, ``COMPUTE_NICE`` below the process.

    The thread is named :data:`COMPUTE_THREAD_NAME` in the OS, and so are the threads it starts.

    The server's front end runs in ``SCHED_BATCH`` (:func:`hybrid.serve.server.front_end_yields_to_compute`);
    the model's run must not, and it yields CPU weight to the front end instead (:data:`COMPUTE_NICE`). Only
    ever lowers the thread's priority (needs no privilege); nothing where the platform has no per-thread
    scheduling.
    """
    _name_thread(COMPUTE_THREAD_NAME)
    if not (hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_OTHER")):
        return
    with contextlib.suppress(OSError):
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    with contextlib.suppress(OSError):
        target = _compute_nice()
        if os.getpriority(os.PRIO_PROCESS, 0) < target:
            os.setpriority(os.PRIO_PROCESS, 0, target)


def _compute_nice() -> int:
    """The models' threads' nice value: ``COMPUTE_NICE`` above the process's, at most 19.

    On Linux a nice value is per thread; the main thread's is the process's.
    """
    return min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + COMPUTE_NICE)


def _in_compute_policy() -> bool:
    if not (hasattr(os, "sched_getscheduler") and hasattr(os, "SCHED_OTHER")):
        return True
    try:
        return os.sched_getscheduler(0) == os.SCHED_OTHER and os.getpriority(os.PRIO_PROCESS, 0) >= _compute_nice()
    except OSError:
        return True


def in_compute_policy(fn: Callable[..., Item], *args: Any, **kwargs: Any) -> Item:
    """``fn(*args, **kwargs)`` in a thread of the models' scheduling (:func:`enter_compute_policy`), waited for.

    What a model builds there (a runtime's thread pool) inherits that scheduling: a model loaded at start-up
    or through model control (from an executor thread of the ``SCHED_BATCH`` front end) computes like the
    batch runners. Runs ``fn`` in the calling thread where that already has it (or the platform has no
    per-thread scheduling). Returns ``fn``'s result or raises its error.
    """
    if _in_compute_policy():
        return fn(*args, **kwargs)
    out: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        enter_compute_policy()
        try:
            out.append(fn(*args, **kwargs))
        except BaseException as e:  # handed to the caller
            error.append(e)

    thread = threading.Thread(target=target, name="hybrid-model-load", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return out[0]


class QueueTimeout(RunError):
    """A request withdrawn from the queue after waiting its ``queue_timeout`` (:meth:`LoopBatcher.acall`).

    Attributes:
        seconds: The wait it was allowed.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__("HYB-411", f"still queued after {seconds:g} s", "raise the queue's timeout")
        self.seconds = seconds


@dataclass(frozen=True, slots=True)
class BatcherStats:
    """A snapshot: requests waiting (``queued``), batches running (``running``), batches run (``batches``)."""

    queued: int
    running: int
    batches: int


class _Waiting(Generic[Item]):
    """A queued request.

    ``rank`` is its place in the queue, lowest first: twice its priority level, plus one once it is delayed.
    Requests of one rank keep their order.
    """

    __slots__ = ("enqueued", "future", "item", "rank")

    def __init__(self, item: Item, future: asyncio.Future[Any], enqueued: float, rank: int = 0) -> None:
        self.item = item
        self.future = future
        self.enqueued = enqueued
        self.rank = rank


class _Task(Generic[Item]):
    """A batch handed to the runners: its requests, its joined job, whether a runner has begun it."""

    __slots__ = ("batch", "begun", "job")

    def __init__(self, batch: list[_Waiting[Item]], job: Job) -> None:
        self.batch = batch
        self.job = job
        self.begun = False


class LoopBatcher(Generic[Item]):
    """Batches the requests of one model on the event loop; see the module docstring.

    Args:
        join: ``join(items) -> job``, on the loop: the batch made ready to run (inputs concatenated).
        execute: ``execute(job) -> raw``, in a runner thread: the run itself (exceptions are passed to
            ``split``).
        split: ``split(items, job, raw_or_exception, started, run_s) -> results``, on the loop: one result
            per item, in order (an element that is an exception fails only its own caller); the batch began to
            run at ``started`` (on ``clock``) and ran for ``run_s`` seconds.
        max_batch: Most requests in one batch.
        max_delay: Under load (the last batch was full), longest time in seconds a request waits for its
            batch to fill when a runner is idle; otherwise an idle runner takes what is queued at once.
        max_queue: Most requests waiting at once; more get HYB-412. None: unbounded.
        runners: Batches that may run at the same time (runner threads); :meth:`resize` changes it.
        sizer: ``sizer(waited) -> runners``, on the loop after each batch: told whether requests were waiting
            for a runner when the batch ended, it returns the runners to keep (the served model's
            :class:`~hybrid.serve.core.runners.Runners`). None: ``runners`` stays.
        name: Used in thread names and messages.
        reorders: Requests may change places in the queue (priority levels, a queue policy that delays): a batch
            is then joined only once a runner is free to take it, never ahead, so that it holds the requests
            first in line at that moment.
        clock: What the requests' waits, the batches' run times and so the holds are measured on
            (``time.monotonic``; tests script it). A hold's timer is the loop's: it lasts the hold's seconds of
            this clock.
    """

    def __init__(self, join: Callable[[list[Item]], Job], execute: Callable[[Job], Any],
                 split: Callable[[list[Item], Job, Any, float, float], list[Any]], *, max_batch: int,
                 max_delay: float = 0.0, max_queue: int | None = None, runners: int = 1,
                 sizer: Callable[[bool], int] | None = None, name: str = "model", reorders: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._join, self._execute, self._split = join, execute, split
        self._clock = clock
        self.max_batch = max_batch
        self.max_delay = max_delay
        # how many requests come together: the most seen at once (queued + running) lately, grown at once and
        # lowered when a held batch did not fill; an idle runner lets its batch fill to that (up to max_delay)
        self._expect = 1
        self._peak = 0
        self._dispatches = 0
        self._running = 0  # requests in the batches handed to the runners
        self._last_run = 0.0  # seconds the last batch took
        self._timer: asyncio.TimerHandle | None = None
        self.max_queue = max_queue
        self.runners = runners
        self._sizer = sizer
        self.name = name
        self._ahead = not reorders  # a full batch may be joined while every runner is busy
        self._queue: deque[_Waiting[Item]] = deque()
        self._at_level: dict[int, int] = {}  # level -> queued requests of it that have a rank (a level, or delayed)
        self._jobs: queue.SimpleQueue[_Task[Item] | None] = queue.SimpleQueue()
        self._tasks: set[_Task[Item]] = set()  # handed to the runners and not yet split (loop thread only)
        self._threads: list[threading.Thread] = []  # every runner thread started (some may have ended)
        self._live = 0  # runner threads started and not told to end
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batches = 0
        self._closing = False
        self._drained = threading.Event()
        self._drained.set()

    # ------------------------------------------------------------------ on the loop
    async def acall(self, item: Item, timeout: float | None = None, queue_timeout: float | None = None, *,
                    level: int = 0, max_queued: int | None = None, delay: bool = False) -> Any:
        """Queue ``item``, return its result.

        ``queue_timeout``: longest time it may wait in the queue (not counting its run): past it, a request still
        queued is withdrawn with :class:`QueueTimeout` (Triton's queue policy), or with ``delay`` goes behind the
        requests of its level still in time; one already running goes on. ``level``: its priority level (1 is
        the highest; 0, the only level of a model without priorities, comes first): a batch takes the highest
        levels first, and at most ``max_queued`` requests of a level wait at once.

        Raises:
            RunError: HYB-411 after ``timeout`` seconds (a queued request is withdrawn), HYB-412 when
                ``max_queue`` requests (or ``max_queued`` of its level) are waiting, HYB-415 once closing; the
                request's own error.
            QueueTimeout: Still queued after ``queue_timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed() and (self._queue or self._tasks):
                # the queue belongs to another loop now: run the call there
                other = asyncio.run_coroutine_threadsafe(
                    self.acall(item, timeout, queue_timeout, level=level, max_queued=max_queued, delay=delay),
                    self._loop)
                return await asyncio.wrap_future(other)
            self._loop = loop
        if self._closing:
            raise RunError("HYB-415", f"batcher {self.name!r} is closed; it takes no more requests")
        if self.max_queue is not None and len(self._queue) >= self.max_queue:
            raise RunError("HYB-412", f"batcher {self.name!r}: {len(self._queue)} requests already queued "
                           f"(max_queue={self.max_queue}); request rejected", "retry later, or raise max_queue")
        if max_queued is not None and self._at_level.get(level, 0) >= max_queued:
            raise RunError("HYB-412", f"batcher {self.name!r}: {max_queued} requests of priority level {level} "
                           "already queued; request rejected", "retry later, or raise the level's max_queue_size")
        waiting = _Waiting(item, loop.create_future(), self._clock(), 2 * level)
        self._enqueue(waiting)
        if len(self._queue) + self._running > self._expect:
            self._expect = min(self.max_batch, len(self._queue) + self._running)
        self._drained.clear()
        self._dispatch()
        timer = loop.call_later(timeout, self._expire, waiting, timeout) if timeout is not None else None
        queued = (loop.call_later(queue_timeout, self._expire_queued, waiting, queue_timeout, delay)
                  if queue_timeout is not None else None)
        try:
            return await waiting.future
        except asyncio.CancelledError:
            self._withdraw(waiting)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if queued is not None:
                queued.cancel()

    def _enqueue(self, waiting: _Waiting[Item]) -> None:
        """Put ``waiting`` behind every queued request of its rank or lower (ahead of the higher ranks)."""
        q = self._queue
        rank = waiting.rank
        if rank:
            level = rank >> 1
            self._at_level[level] = self._at_level.get(level, 0) + 1
        if not q or q[-1].rank <= rank:
            q.append(waiting)
            return
        i = len(q) - 1
        while i > 0 and q[i - 1].rank > rank:
            i -= 1
        q.insert(i, waiting)

    def _dequeued(self, waiting: _Waiting[Item]) -> None:
        """Count ``waiting`` out of its level (it left the queue)."""
        if waiting.rank:
            self._at_level[waiting.rank >> 1] -= 1

    def _expire_queued(self, waiting: _Waiting[Item], seconds: float, delay: bool) -> None:
        if waiting.future.done():
            return
        if delay:  # Triton's DELAY: behind the requests of its level still in time (a running one goes on)
            if not waiting.rank & 1 and self._withdraw(waiting):
                waiting.rank |= 1
                self._enqueue(waiting)
                self._drained.clear()
                self._dispatch()
            return
        if self._withdraw(waiting):  # a request that runs already goes on
            waiting.future.set_exception(QueueTimeout(seconds))

    def _expire(self, waiting: _Waiting[Item], timeout: float) -> None:
        if waiting.future.done():
            return
        withdrawn = self._withdraw(waiting)
        where = "it was still queued and is withdrawn" if withdrawn else "its batch was still running"
        waiting.future.set_exception(RunError("HYB-411", f"batcher {self.name!r}: no result within {timeout} s "
                                              f"({where})", "raise the request timeout, or lower max_batch"))

    def _withdraw(self, waiting: _Waiting[Item]) -> bool:
        try:
            self._queue.remove(waiting)
        except ValueError:
            return False  # already in a batch
        self._dequeued(waiting)
        self._check_drained()
        return True

    def _dispatch(self, waited: bool = False) -> None:
        """Hand batches to the runners: to an idle one, and a full batch ahead of busy ones.

        An idle runner takes what is queued at once, except under load (the last batch was full): then
        once the batch is full or its oldest request has waited ``max_delay`` (``waited``: that is now).
        """
        while self._queue and (len(self._tasks) < self.runners
                               or (self._ahead and len(self._tasks) == self.runners
                                   and len(self._queue) >= self.max_batch)):
            if not waited and not self._closing and len(self._queue) < self._expect and self._loop is not None:
                # never longer than a batch takes: past that, running now and the rest after is sooner
                due = self._queue[0].enqueued + min(self.max_delay, self._last_run)
                now = self._clock()
                if due > now:
                    if self._timer is None:
                        self._timer = self._loop.call_later(due - now, self._due)
                    return
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._learn(waited)
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            if self._at_level:
                for w in batch:
                    self._dequeued(w)
            self._running += len(batch)
            items = [w.item for w in batch]
            try:
                job = self._join(items)
            except Exception as e:  # never leave a caller waiting
                for w in batch:
                    if not w.future.done():
                        w.future.set_exception(e)
                continue
            if self._live < self.runners:
                self._start()
            task = _Task(batch, job)
            self._tasks.add(task)
            self._jobs.put(task)

    def _learn(self, waited: bool) -> None:
        """Update how many requests come together, at a dispatch (``waited``: its hold ran out)."""
        together = min(self.max_batch, len(self._queue) + self._running)
        if waited and len(self._queue) < self._expect:
            self._expect = max(1, together)  # they did not come: expect what came
        self._peak = max(self._peak, together)
        self._dispatches += 1
        if self._dispatches >= 32:  # the peak of the last 32 batches
            self._expect = max(1, min(self._expect, self._peak))
            self._peak, self._dispatches = 0, 0

    def _due(self) -> None:
        self._timer = None
        self._dispatch(waited=True)

    def _finished(self, task: _Task[Item], raw: Any, started: float, run_s: float) -> None:
        if self._sizer is not None:
            # every runner was busy (this one too) and requests waited for one: queued, or a full batch joined ahead
            waited = len(self._tasks) >= self.runners and (bool(self._queue) or len(self._tasks) > self.runners)
            try:
                self.resize(self._sizer(waited))
            except Exception as e:  # the batch's callers get their answers whatever the sizer did
                logger.warning("batcher %r: the runner count was not updated: %s", self.name, e)
        self._tasks.discard(task)
        batch, job = task.batch, task.job
        self._running -= len(batch)
        self._last_run = run_s
        self._batches += 1
        self._dispatch()  # the next batch first: the runner must not wait for the answers of this one
        try:
            results = self._split([w.item for w in batch], job, raw, started, run_s)
            if len(results) != len(batch):
                raise RunError("HYB-413", f"batcher {self.name!r}: {len(results)} results for {len(batch)} requests")
        except Exception as e:
            results = [e] * len(batch)
        for w, result in zip(batch, results, strict=True):
            if w.future.done():  # its caller went away
                continue
            if isinstance(result, BaseException):
                w.future.set_exception(result)
            else:
                w.future.set_result(result)
        self._check_drained()

    def _flush(self) -> None:
        self._dispatch(waited=True)
        self._check_drained()

    def _check_drained(self) -> None:
        if not self._queue and not self._tasks:
            self._drained.set()

    def resize(self, runners: int) -> None:
        """Run up to ``runners`` batches at once from now on (on the loop's thread).

        More start as the next batches need them. Fewer: the runner threads past the count end once they have run
        what was handed to them (a batch already handed over runs; one joined ahead waits for a runner as before).
        """
        runners = max(1, runners)
        if runners == self.runners:
            return
        self.runners = runners
        for _ in range(self._live - runners):
            self._jobs.put(None)  # behind the batches handed over: a runner ends only once they are taken
            self._live -= 1

    # ------------------------------------------------------------------ runner threads
    def _start(self) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        while self._live < self.runners:
            t = threading.Thread(target=self._run, name=f"hybrid-serve-{self.name}-run{len(self._threads)}",
                                 daemon=True)
            self._threads.append(t)
            self._live += 1
            t.start()

    def _run(self) -> None:
        enter_compute_policy()
        while (task := self._jobs.get()) is not None:
            task.begun = True
            started = self._clock()
            try:
                raw = self._execute(task.job)
            except Exception as e:
                raw = e
            run_s = self._clock() - started
            loop = self._loop
            if loop is None:
                continue
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(self._finished, task, raw, started, run_s)

    # ------------------------------------------------------------------ lifecycle
    def stats(self) -> BatcherStats:
        """Requests waiting (queued, or in a batch no runner has begun), batches running, batches run."""
        tasks = list(self._tasks)
        waiting = sum(len(t.batch) for t in tasks if not t.begun)
        return BatcherStats(queued=len(self._queue) + waiting, running=sum(t.begun for t in tasks),
                            batches=self._batches)

    def close(self, timeout: float | None = None) -> None:
        """Take no more requests; let the queued ones run and wait for them, then stop the runner threads.

        Args:
            timeout: Longest time in seconds to wait. On the loop's own thread it does not wait.
        """
        self._closing = True
        loop = self._loop
        # real time whatever the clock: the threads end in it (a scripted clock need not move while they do)
        deadline = None if timeout is None else time.monotonic() + timeout
        on_loop = False
        with contextlib.suppress(RuntimeError):
            on_loop = asyncio.get_running_loop() is loop
        if loop is not None and not loop.is_closed() and not on_loop:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._flush)
                self._drained.wait(timeout)
        if on_loop:
            return
        for _ in range(self._live):
            self._jobs.put(None)
        self._live = 0
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
