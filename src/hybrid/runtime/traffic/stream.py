"""``hybrid.StreamContext``: an ordered asynchronous work queue (DESIGN 2.5).

``model(x, stream=s)`` (and ``s.submit(fn, ...)``) returns a :class:`StreamResult` at once; the work
runs on the stream's own thread in submission order; leaving ``with s:`` waits for everything
submitted. On a CUDA device with torch, the work is issued on a CUDA stream (:mod:`hybrid.hal.interop`) and
each result carries a CUDA event that ``result()`` waits on, so torch kernels of one stream stay ordered on
the GPU too (written against torch's API; unverified on this project's CPU-only machines). Elsewhere
the stream is a worker thread.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future
from typing import Any

from hybrid.errors import RunError
from hybrid.hal import resolve_device
from hybrid.hal.interop import device_stream, host_array

__all__ = ["StreamContext", "StreamResult"]

_ids = itertools.count(1)


def _host(value: Any) -> Any:
    """A model's result on the host: one array, or a tuple of arrays for several outputs."""
    if isinstance(value, (tuple, list)):
        return tuple(host_array(v) for v in value)
    return host_array(value)


class StreamResult:
    """The handle of one piece of work on a stream: ``result()``, ``numpy()``, ``done()``, ``await``, callbacks."""

    __slots__ = ("_future", "_stream")

    def __init__(self, future: Future[Any], stream: StreamContext) -> None:
        self._future = future
        self._stream = stream

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the work and return what it returned (or raise what it raised).

        Raises:
            RunError: HYB-411 when ``timeout`` seconds pass first (the work stays queued).
        """
        try:
            value, event = self._future.result(timeout)
        except TimeoutError:
            if self._future.done():
                raise
            raise RunError("HYB-411", f"stream {self._stream.name}: the work did not finish within {timeout} s",
                           "wait longer, or synchronize() the stream") from None
        if event is not None:
            event.synchronize()
        return value

    def numpy(self, timeout: float | None = None) -> Any:
        """The result as numpy arrays (a tuple for several outputs), copied to the host if needed."""
        return _host(self.result(timeout))

    def done(self) -> bool:
        """Whether the work has finished (or failed), without waiting."""
        return self._future.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """What the work raised, or None; waits up to ``timeout`` seconds, as ``Future.exception`` does."""
        return self._future.exception(timeout)

    def add_done_callback(self, fn: Callable[[StreamResult], Any]) -> None:
        """Call ``fn(self)`` when the work finishes or fails (at once if it has), as ``Future`` does.

        It runs on the stream's thread: keep it short (hand the result on), as later work waits behind it.
        """
        self._future.add_done_callback(lambda _future: fn(self))

    def __await__(self) -> Generator[Any, None, Any]:
        yield from asyncio.wrap_future(self._future).__await__()
        return self.result()

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<hybrid StreamResult on {self._stream.name} ({state})>"


class StreamContext:
    """An ordered queue of work on one device.

    Args:
        device: The device the stream's work targets; None: 'cpu'. An absent device follows the
            ``device_fallback`` policy.

    Raises:
        BackendError: HYB-301 for a bad device name, HYB-307 for an absent device under 'error'.
    """

    def __init__(self, device: str | None = None) -> None:
        self.device: str = resolve_device(device, "StreamContext")
        self.name: str = f"stream{next(_ids)}:{self.device}"
        self._cond = threading.Condition()
        self._work: deque[tuple[Callable[..., Any], tuple, dict, Future] | None] = deque()
        self._thread: threading.Thread | None = None
        self._retiring: threading.Thread | None = None  # a stopped thread that may still be finishing
        self._closed = False
        self._device_stream = device_stream(self.device)

    # ------------------------------------------------------------------ work
    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> StreamResult:
        """Queue ``fn(*args, **kwargs)`` behind everything already on this stream; return its handle.

        Raises:
            RunError: HYB-415 after ``close``.
        """
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RunError("HYB-415", f"stream {self.name} is closed; it takes no more work")
            if self._thread is None:
                self._thread = threading.Thread(target=self._worker, args=(self._retiring,),
                                                name=f"hybrid-{self.name}", daemon=True)
                self._thread.start()
            self._work.append((fn, args, kwargs, future))
            self._cond.notify()
        return StreamResult(future, self)

    def _worker(self, previous: threading.Thread | None) -> None:
        if previous is not None:  # keep submission order across a stop and restart
            previous.join()
        on_device = self._device_stream
        while True:
            with self._cond:
                while not self._work:
                    self._cond.wait()
                job = self._work.popleft()
            if job is None:
                return
            fn, args, kwargs, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                if on_device is None:
                    future.set_result((fn(*args, **kwargs), None))
                else:
                    future.set_result(on_device.run(fn, *args, **kwargs))
            except BaseException as e:  # the error belongs to this work's handle; the stream goes on
                future.set_exception(e)

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait until everything submitted so far has finished (errors stay with their handles).

        Raises:
            RunError: HYB-411 when ``timeout`` passes first.
        """
        with self._cond:
            idle = self._thread is None or self._closed
        if idle:
            return
        self.submit(lambda: None).result(timeout)
        if self._device_stream is not None:
            self._device_stream.synchronize()

    def _stop(self, timeout: float | None) -> None:
        with self._cond:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._retiring = thread
                self._work.append(None)
                self._cond.notify()
        if thread is not None:
            thread.join(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Finish the queued work, stop the thread; the stream takes no more work."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.synchronize(timeout)
        with self._cond:
            self._closed = True
        self._stop(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> StreamContext:
        return self

    def __exit__(self, *exc: object) -> None:
        """Wait for all work; the stream stays usable (its thread restarts on the next submit)."""
        self._stop(None)
        if self._device_stream is not None:
            self._device_stream.synchronize()

    def __repr__(self) -> str:
        return f"<hybrid.StreamContext {self.name}>"
