"""The background check of online tuning, in a separate low-priority process.

Checking candidates on a copy of a real input means running the numpy reference and every candidate:
seconds of CPU on a real model, and Python code that would hold the interpreter lock the caller's
thread needs. Done in one shared worker process started at a low scheduling priority (the nice
level whose CPU share matches the tuning policy's ``check_share``), it takes the cores the callers leave
idle and, where they want every core, about that share of one: its cost on the callers is bounded, and so is
the time it takes (no caller waits for it).
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
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from hybrid.config import validated_update
from hybrid.hal import Candidate, backend_names
from hybrid.ir import Model
from hybrid.runtime.auto import judge
from hybrid.runtime.auto.timing import settle, warm_estimate
from hybrid.runtime.auto.tolerance import OutputRule
from hybrid.runtime.auto.trials import Search, check_trials

logger = logging.getLogger("hybrid")

__all__ = ["CheckRequest", "Verdicts", "check", "check_elsewhere", "serve", "shutdown"]

# Linux CFS weights of nice 0..19: a thread at nice n gets weight[n] / (weight[n] + 1024) of a core that a
# nice-0 thread also wants
_CFS_WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15)


_WORKER_MAIN = "from hybrid.runtime.auto.worker import serve; serve()"


def nice_for(share: float) -> int:
    """The nice level at which the worker takes at most ``share`` of a core the callers also want."""
    for level, weight in enumerate(_CFS_WEIGHTS):
        if weight / (weight + 1024) <= share:
            return level
    return len(_CFS_WEIGHTS) - 1


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


@dataclass(frozen=True, slots=True)
class Verdicts:
    """The worker's answer: per trial label in check order, why it was rejected (None: it passed), the
    seconds of one warm run (None when not measured) and whether it is a partition; the search's notes."""

    results: tuple[tuple[str, str | None, float | None, bool], ...]
    notes: tuple[str, ...]


class _Worker:
    """The worker process and the lock that keeps one request at a time on its pipes."""

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER_MAIN], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        _lower_priority(self.proc.pid, nice)
        self.lock = threading.Lock()

    def ask(self, request: CheckRequest) -> Any:
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


def _lower_priority(pid: int, nice: int) -> None:
    """Put the just-started worker ``pid`` at ``nice``: where the callers want every core, it gets about the
    share of a core its nice level's CFS weight gives it (the tuning policy's ``check_share``), and any core
    they leave idle. Not SCHED_IDLE: a caller that keeps every core busy would starve it, and the decision
    is bounded in time. Set from here, before the worker has imported anything (seconds of CPU) or started a
    thread: the threads it starts later (the runtimes' pools) inherit it."""
    with contextlib.suppress(OSError, AttributeError):  # not permitted here: still correct, only less polite
        os.setpriority(os.PRIO_PROCESS, pid, nice)


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


def check_elsewhere(request: CheckRequest, share: float) -> Verdicts | None:
    """Run :func:`check` in the worker process, at the priority that gives it at most ``share`` of a busy
    core; None when it cannot (the caller then checks itself)."""
    global _WORKER
    nice = nice_for(share)
    try:
        with _WORKER_LOCK:
            if _WORKER is not None and _WORKER.nice != nice:
                _WORKER.close()
                _WORKER = None
            if _WORKER is None or _WORKER.proc.poll() is not None:
                atexit.register(shutdown)  # registering twice is harmless
                _WORKER = _Worker(nice)
            w = _WORKER
        answer = w.ask(request)
    except Exception as e:  # a broken or missing worker must never fail the model
        logger.info("auto (online): the check process is unavailable (%s); checking in a thread", e)
        shutdown()
        return None
    if not isinstance(answer, Verdicts):
        logger.info("auto (online): the check process could not check (%s); checking in a thread", answer)
        return None
    return answer


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
    tried, _ = check_trials(search, autotune=True)
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
        results.append((t.label, t.rejected, warm, t.partitioned))
    judge.close_all(tried, None, search)
    return Verdicts(tuple(results), tuple(search.notes))


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
            answer: Any = check(request)
        except Exception as e:
            answer = f"{type(e).__name__}: {e}"
        _send(stdout, answer)
