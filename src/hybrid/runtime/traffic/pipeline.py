"""``hybrid.Pipeline``: stages that run concurrently, joined by bounded queues (DESIGN 2.5).

Each stage has its own worker threads and a bounded input queue, so a slow stage pushes back on the
ones before it instead of letting memory grow. Items carry their own future: results keep their
identity whatever order the workers finish in, ``run`` yields them in input order, and an error in
one stage fails only that item (later stages skip it) while the pipeline goes on.

A stage names the device its work runs on; a device that is absent follows the ``device_fallback``
policy ('warn': a warning and the stage is placed on the cpu, 'error': HYB-307).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from hybrid.errors import ConfigError, RunError
from hybrid.hal import resolve_device

__all__ = ["Pipeline", "StageStats"]

logger = logging.getLogger("hybrid")
_ids = itertools.count(1)
_STOP = object()


@dataclass(frozen=True, slots=True)
class StageStats:
    """Counters of one stage.

    Attributes:
        name: Stage name.
        device: Device the stage runs on (after fallback).
        workers: Worker threads.
        items: Items the stage's function ran on.
        errors: Items whose function raised here.
        mean_time_s: Mean time of one call of the function.
        busy_s: Total time spent in the function, all workers together.
        utilization: ``busy_s / (workers * seconds since the pipeline started)``.
        max_queue_depth: Most items seen waiting in the stage's input queue.
        queued: Items waiting now.
    """

    name: str
    device: str
    workers: int
    items: int
    errors: int
    mean_time_s: float
    busy_s: float
    utilization: float
    max_queue_depth: int
    queued: int


class _Item:
    __slots__ = ("error", "future", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.future: Future[Any] = Future()
        self.error: BaseException | None = None


class _Stage:
    def __init__(self, fn: Callable[[Any], Any], device: str, workers: int, name: str, queue_size: int) -> None:
        self.fn = fn
        self.device = device
        self.workers = workers
        self.name = name
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.lock = threading.Lock()
        self.alive = 0
        self.items = 0
        self.errors = 0
        self.busy = 0.0
        self.max_depth = 0


class Pipeline:
    """Stages run concurrently with bounded queues; results come back per item, in input order from ``run``.

    Args:
        queue_size: Default bound of each stage's input queue (at least the stage's worker count).
        clock: What the stages' times and the utilization in :meth:`stats` are measured on (``time.perf_counter``;
            tests script it).

    Example:
        >>> with hybrid.Pipeline() as p:
        ...     p.add_stage(preprocess).add_stage(model, device='gpu').add_stage(postprocess)
        ...     for result in p.run(images):
        ...         ...
    """

    def __init__(self, queue_size: int = 4, clock: Callable[[], float] = time.perf_counter) -> None:
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ConfigError("HYB-102", f"Pipeline: queue_size must be a positive int, got {queue_size!r}")
        self.queue_size = queue_size
        self._clock = clock
        self._stages: list[_Stage] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._started_at = 0.0
        self._id = next(_ids)

    # ------------------------------------------------------------------ building
    def add_stage(self, fn: Callable[[Any], Any], device: str | None = "cpu", workers: int = 1,
                  name: str | None = None, queue_size: int | None = None) -> Pipeline:
        """Append a stage that maps one item to one item; returns the pipeline (calls chain).

        Args:
            fn: The stage's function (a compiled model works too).
            device: Where the stage's work runs ('cpu', 'gpu', 'cuda:1', 'npu'); absent devices follow
                the ``device_fallback`` policy.
            workers: Threads running ``fn`` for this stage.
            name: Shown in stats and errors; default ``fn``'s name.
            queue_size: Bound of this stage's input queue; default the pipeline's.

        Raises:
            ConfigError: HYB-102 for a bad argument or a pipeline that already started.
            BackendError: HYB-301 for a bad device name, HYB-307 for an absent device under 'error'.
        """
        if not callable(fn):
            raise ConfigError("HYB-102", f"add_stage: expected a callable, got {type(fn).__name__}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError("HYB-102", f"add_stage: workers must be a positive int, got {workers!r}")
        size = self.queue_size if queue_size is None else queue_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError("HYB-102", f"add_stage: queue_size must be a positive int, got {queue_size!r}")
        stage_name = name or getattr(fn, "__name__", "<lambda>")
        if stage_name == "<lambda>":
            stage_name = f"stage{len(self._stages)}"
        with self._lock:
            if self._threads or self._closed:
                raise ConfigError("HYB-102", f"add_stage({stage_name!r}): the pipeline already started; add "
                                  "every stage before the first submit or run")
            placed = resolve_device(device, f"pipeline stage {stage_name!r}")
            self._stages.append(_Stage(fn, placed, workers, stage_name, max(size, workers)))
        return self

    @property
    def stages(self) -> list[str]:
        """The stage names, in the order the items pass through them."""
        return [s.name for s in self._stages]

    # ------------------------------------------------------------------ running
    def _start(self) -> None:
        if not self._stages:
            raise ConfigError("HYB-102", "Pipeline has no stages; call add_stage first")
        self._started_at = self._clock()
        for i, stage in enumerate(self._stages):
            stage.alive = stage.workers
            for w in range(stage.workers):
                t = threading.Thread(target=self._work, args=(i,), daemon=True,
                                     name=f"hybrid-pipeline{self._id}-{stage.name}-{w}")
                self._threads.append(t)
                t.start()

    def submit(self, item: Any, timeout: float | None = None) -> Future[Any]:
        """Put one item into the pipeline; return a future for its result (or its stage's error).

        Blocks while the first stage's queue is full (back-pressure).

        Raises:
            RunError: HYB-415 after ``close``; HYB-412 when ``timeout`` passes without room in the queue.
        """
        with self._lock:
            if self._closed:
                raise RunError("HYB-415", "the pipeline is closed; it takes no more items")
            if not self._threads:
                self._start()
        entry = _Item(item)
        try:
            self._stages[0].queue.put(entry, timeout=timeout)
        except queue.Full:
            raise RunError("HYB-412", f"pipeline stage {self._stages[0].name!r}: no room in its queue of "
                           f"{self._stages[0].queue.maxsize} within {timeout} s", "retry later") from None
        return entry.future

    def run(self, items: Iterable[Any], return_exceptions: bool = False) -> Iterator[Any]:
        """Feed ``items`` through the pipeline and yield their results in input order.

        At most the pipeline's capacity is in flight, so an endless iterable runs in bounded memory.

        Args:
            items: The inputs.
            return_exceptions: Yield a failed item's exception in its place instead of raising it
                (raising ends the generator; the pipeline itself goes on).
        """
        window: deque[Future] = deque()
        capacity = sum(s.queue.maxsize + s.workers for s in self._stages) + 1

        def outcome(future: Future) -> Any:
            if return_exceptions:
                error = future.exception()
                return error if error is not None else future.result()
            return future.result()

        for x in items:
            window.append(self.submit(x))
            while window and (len(window) >= capacity or window[0].done()):
                yield outcome(window.popleft())
        while window:
            yield outcome(window.popleft())

    def _work(self, index: int) -> None:
        stage = self._stages[index]
        nxt = self._stages[index + 1] if index + 1 < len(self._stages) else None
        while True:
            item = stage.queue.get()
            if item is _STOP:
                with stage.lock:
                    stage.alive -= 1
                    last = stage.alive == 0
                if last and nxt is not None:  # the last worker out passes the stop on, once per next worker
                    for _ in range(nxt.workers):
                        nxt.queue.put(_STOP)
                return
            depth = stage.queue.qsize() + 1
            if index == 0 and not item.future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            if item.error is None:
                t0 = self._clock()
                try:
                    item.value = stage.fn(item.value)
                except BaseException as e:  # the item carries it to its caller; the worker never dies
                    e.add_note(f"in hybrid pipeline stage {stage.name!r}")
                    item.error = e
                spent = self._clock() - t0
                with stage.lock:
                    stage.items += 1
                    stage.errors += item.error is not None
                    stage.busy += spent
                    stage.max_depth = max(stage.max_depth, depth)
            if nxt is not None:
                nxt.queue.put(item)
            elif item.error is not None:
                item.future.set_exception(item.error)
            else:
                item.future.set_result(item.value)

    # ------------------------------------------------------------------ lifecycle and stats
    def close(self, timeout: float | None = None) -> None:
        """Take no more items, let every queued item finish, and stop the threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = bool(self._threads)
        if started:
            for _ in range(self._stages[0].workers):
                self._stages[0].queue.put(_STOP)
            # real time whatever the clock: the threads end in it
            deadline = None if timeout is None else time.monotonic() + timeout
            for t in self._threads:
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def stats(self) -> list[StageStats]:
        """Counters per stage, in stage order."""
        elapsed = self._clock() - self._started_at if self._started_at else 0.0
        out = []
        for s in self._stages:
            with s.lock:
                util = s.busy / (s.workers * elapsed) if elapsed > 0 else 0.0
                out.append(StageStats(s.name, s.device, s.workers, s.items, s.errors,
                                      s.busy / s.items if s.items else 0.0, s.busy, util, s.max_depth,
                                      s.queue.qsize()))
        return out

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        stages = " -> ".join(f"{s.name}@{s.device}x{s.workers}" for s in self._stages) or "no stages"
        return f"<hybrid.Pipeline {stages}>"
