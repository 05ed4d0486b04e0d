"""The background check of online tuning, in a separate low-priority process.

Checking candidates on a copy of a real input means running the numpy reference and every candidate:
seconds of CPU on a real model, and Python code that would hold the interpreter lock the caller's
thread needs. Done in one shared worker process that paces itself to ``share`` of the wall time in CPU
time (after each candidate it sleeps until its CPU time is within that share: the tuning policy's
``check_share``), its cost on the callers is bounded whatever the load, and so is the time it takes: a
low scheduling priority alone would starve it where the callers, or other processes, want every core.
No caller ever waits for it. The process is started when a model begins to tune (:func:`prestart`), so
its imports are done before the first check.
The worker runs one thread per session (it must not crowd the callers' cores).

The worker is ``python -c "from hybrid.runtime.auto.worker import serve; serve()"`` (``-m`` would run a
second copy of this module, already imported by its package), spoken to with length-prefixed pickles over its
standard input and output: a plain subprocess, which (unlike multiprocessing's spawn) never re-runs
the caller's main script. It cannot see what exists only in the calling process (a backend registered
with ``register_backend`` at run time, a custom op defined with ``hybrid.custom_op``): then, or when
the worker fails, the caller checks in its own background thread instead.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybrid.config import validated_update
from hybrid.hal import Candidate, backend_names, devices
from hybrid.ir import Model
from hybrid.runtime.auto import judge
from hybrid.runtime.auto.timing import settle, warm_estimate
from hybrid.runtime.auto.tolerance import OutputRule
from hybrid.runtime.auto.trials import Search, check_trials

logger = logging.getLogger("hybrid")

__all__ = ["CheckRequest", "Verdicts", "check", "check_elsewhere", "pacer", "prestart", "serve", "shutdown"]

_WORKER_MAIN = "from hybrid.runtime.auto.worker import serve; serve()"


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """What the worker needs to check candidates on one sample (all picklable)."""

    model: bytes
    name: str
    order: tuple[str, ...]
    options: dict[str, dict[str, Any]]
    rtol: float
    rules: dict[str, dict[str, Any]]
    sample: dict[str, Any]
    precision: str = "fp32"  # 'auto': the reduced precisions each backend offers join, within ``budget``
    budget: dict[str, float] | None = None
    share: float = 1.0  # the share of the wall time the check may spend in CPU time (it paces itself)


@dataclass(frozen=True, slots=True)
class Verdicts:
    """The worker's answer.

    Per trial label in check order, why it was rejected (None: it passed), the seconds of one warm run (None when not
    measured) and whether it is a partition; the search's notes.
    """

    results: tuple[tuple[str, str | None, float | None, bool], ...]
    notes: tuple[str, ...]


class _Worker:
    """The worker process and the lock that keeps one request at a time on its pipes."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER_MAIN], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        self.lock = threading.Lock()

    def ask(self, request: CheckRequest | str) -> Any:
        with self.lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            _send(self.proc.stdin, request)
            return _receive(self.proc.stdout)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=5)


_WORKER: _Worker | None = None
_WORKER_LOCK = threading.Lock()


def _send(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream: Any) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the check process ended")
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))  # our own child process, over a private pipe


def shutdown() -> None:
    """Stop the worker process (at exit, or after it failed)."""
    global _WORKER
    with _WORKER_LOCK:
        w, _WORKER = _WORKER, None
    if w is not None:
        w.close()


def _worker() -> _Worker:
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None or _WORKER.proc.poll() is not None:
            atexit.register(shutdown)  # registering twice is harmless
            _WORKER = _Worker()
        return _WORKER


def prestart() -> None:
    """Start the worker process and let it import the backends' libraries, in a background thread.

    Its first check then spends its time checking.
    """

    def warm() -> None:
        with contextlib.suppress(Exception):
            _worker().ask("probe")

    threading.Thread(target=warm, name="hybrid-check-prestart", daemon=True).start()


def check_elsewhere(request: CheckRequest) -> Verdicts | None:
    """Run :func:`check` in the worker process; None when it cannot (the caller then checks itself)."""
    try:
        answer = _worker().ask(request)
    except Exception as e:  # a broken or missing worker must never fail the model
        logger.info("auto (online): the check process is unavailable (%s); checking in a thread", e)
        shutdown()
        return None
    if not isinstance(answer, Verdicts):
        logger.info("auto (online): the check process could not check (%s); checking in a thread", answer)
        return None
    return answer


def pacer(share: float) -> Callable[[], None]:
    """A function that paces this process's CPU time to ``share`` of the wall time.

    It sleeps until the CPU time since the last call is at most ``share`` of the wall time since then
    (call it between units of work).
    """
    last = [time.process_time(), time.perf_counter()]

    def pace() -> None:
        if share < 1.0:
            cpu, wall = time.process_time() - last[0], time.perf_counter() - last[1]
            time.sleep(min(5.0, max(0.0, cpu / share - wall)))
        last[0], last[1] = time.process_time(), time.perf_counter()

    return pace


def check(request: CheckRequest) -> Verdicts | None:
    """Check every candidate on the request's sample, as the offline search does (runs in the worker)."""
    known = set(backend_names())
    if any(label.partition(":")[0] not in known for label in request.order):
        return None
    validated_update({"num_threads": 1})  # what hybrid.init does for this key (the api sits above runtime)
    model = Model.load(request.model)
    model.name = request.name
    order = [Candidate(*label.split(":", 1)) for label in request.order]
    rules = {k: OutputRule(**v) for k, v in request.rules.items()}
    search = Search(model, order, lambda c, p: dict(request.options[f"{c} {p}" if p != "fp32" else str(c)]),
                    request.precision, request.budget, request.sample, rtol=request.rtol, rules=rules)
    pace = pacer(request.share)
    tried, _ = check_trials(search, autotune=True, after_each=lambda _s: pace())
    judge.outvote(tried, search, model.name)
    results = []
    for t in tried:
        warm = None
        if t.rejected is None:
            try:
                settle()  # the candidate checked before may still hold a core (its pool's idle threads spin)
                # in CPU time, the least of 10 calls: this process runs only where the callers leave a core idle,
                # and its wall time measures how long it waited (a U-Net's OpenVINO run "took" 13.6 s; the least of
                # 3 wall-clock calls had OpenVINO on the encoder at 2.6x ONNX Runtime, which it serves as fast as)
                warm = warm_estimate(lambda e=t.executable: e.run(search.verifier.samples or {}), calls=10,
                                     within_s=0.5, clock=time.process_time)
            except Exception as e:
                t.rejected = f"failed on a second run: {e}"
            pace()
        results.append((t.label, t.rejected, warm, t.partitioned))
    judge.close_all(tried, None, search)
    return Verdicts(tuple(results), tuple(search.notes))


def _probe() -> str:
    """Import every backend's library (what the first check would otherwise pay for)."""
    devices()
    return "ok"


def serve() -> None:
    """The worker's loop: answer each request on stdin with its verdicts (or why not) on stdout."""
    logging.basicConfig(level=logging.ERROR)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the answer stream
    while True:
        try:
            request = _receive(stdin)
        except EOFError:
            return
        try:
            answer: Any = _probe() if request == "probe" else check(request)
        except Exception as e:
            answer = f"{type(e).__name__}: {e}"
        _send(stdout, answer)
