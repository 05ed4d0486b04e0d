"""The background check of online tuning, in a separate low-priority process.

Checking candidates on a copy of a real input means running the numpy reference and every candidate:
seconds of CPU on a real model, and Python code that would hold the interpreter lock the caller's
thread needs. Done in one shared worker process paced to ``share`` of the wall time in CPU time (the
tuning policy's ``check_share``), its cost on the callers is bounded whatever the load, and so is the time
it takes: a low scheduling priority alone would starve it where the callers, or other processes, want every
core. Where the system lets the parent read the process's CPU time and stop it (Linux), the parent paces it
from outside in slices of :data:`SLICE_S` (:class:`_Pacer`), its start-up imports (over a second of CPU)
included once a check waits; elsewhere it paces itself after each candidate (:func:`pacer`). Where the callers leave
a core idle while it is paced, the parent moves the request's threads to the idle class instead and paces no more
(:meth:`_Pacer.to_idle_class`, ``TuningPolicy.idle_window_s``); each request runs in a thread of its own
(:func:`_in_a_thread`), so the next one starts in the normal class. No caller ever waits for it.
The process is started when a model that tunes is compiled (:meth:`CheckProcess.prestart`), and
imports at full speed until the first call asks for a check, so that its imports are done, or under way, before the
first check.
The worker runs one thread per session (it must not crowd the callers' cores). It imports only the libraries of
the candidates it is asked about, and ends once it has been idle for the tuning policy's ``check_idle_s``
(:meth:`CheckProcess.reap_idle`): the next check starts it again.

A candidate's faults stay in the worker (issue 54, docs/auto.md "Faults in a candidate"). The worker tells the
parent which candidate it starts on (:class:`Progress`) before it compiles, checks or times each one. A candidate
whose compile raises anything (``MemoryError``, a library's own exception) is rejected with it and the others are
checked. A worker that ends (a crash in native code, ``os._exit``, a SIGKILL) or that spends more than
:data:`CANDIDATE_LIMIT_S` of running time on one candidate (a hang) is ended and started again: the check is asked
again, and a candidate the worker died on twice, or hung on once, is rejected with the reason and never checked or
compiled again for that model by that owner (:meth:`Checker.blamed`), in the worker or in the caller's process.

The check process also does the costly part of each passing candidate's compile for the caller (issue 51): it writes
what the candidate's backend imports cheaply (:meth:`~hybrid.hal.backend.Backend.prepare_artifact`: ONNX Runtime's
optimized model, OpenVINO's exported blob) into a folder its owner's :class:`Checker` owns, and the caller's process
imports it instead of compiling (a compile there slows the serving calls 2-3.5x while it lasts).

State: no module-level mutable state. The process, its pacing and its reaper are a :class:`CheckProcess` (one is shared
by the models of a process, held by online.py, so that their checks together take one share of the time); what a
candidate did to it (the blame) and the artifacts are each model's own :class:`Checker`, held by its lab.

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
import dataclasses
import functools
import hashlib
import logging
import math
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybrid.config import autotune_config, validated_update
from hybrid.errors import first_line
from hybrid.hal import Candidate, backend_names, backend_status, get_backend, is_fallback
from hybrid.hal.layout import split_layout
from hybrid.ir import Model
from hybrid.runtime.auto import judge
from hybrid.runtime.auto.policy import Clock, TuningPolicy, monotonic
from hybrid.runtime.auto.timing import settle, warm_estimate
from hybrid.runtime.auto.tolerance import OutputRule
from hybrid.runtime.auto.trials import Search, check_trials

logger = logging.getLogger("hybrid")

__all__ = ["CANDIDATE_LIMIT_S", "CheckProcess", "CheckProcessDied", "CheckRequest", "Checker", "PacedUntil", "Progress",
           "Verdicts", "check", "pacer", "serve"]

_WORKER_MAIN = "from hybrid.runtime.auto.worker import serve; serve()"
_PARENT_ENV = "HYBRID_CHECK_PARENT"  # the pid of the process the worker serves (it ends with it)
SLICE_S = 0.02  # the parent looks at the paced process this often: it never runs more than about this long past
# its share (a core lost for longer stalls the callers' parallel operators in bursts they feel as latency)
CANDIDATE_LIMIT_S = 600.0  # one candidate (its compile, check and timing) may run this long in the worker, the time it
# is held stopped by the pacer not counted: longer is a hang, and the worker is ended. Generous: a TensorRT engine build
# of a large model takes minutes. Tests set it small.
DEATHS_TO_BLAME = 2  # killed from outside (SIGKILL: the OOM killer, an operator) this many times on the same candidate
# in one check, the worker blames the candidate; once, it asks again in a new process. A death of its own doing (a
# crash signal, an exit status) is blamed at once.
_OUTSIDE = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


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
    share: float = 1.0  # the share of the wall time the check may spend in CPU time (it is paced to it)
    artifact_dir: str | None = None  # where to write each passed candidate's artifact (None: none is made)


@dataclass(frozen=True, slots=True)
class Progress:
    """The worker's word that it starts on a candidate (its compile, its check or its timing): its label."""

    label: str


class CheckProcessDied(Exception):
    """The worker ended, or was ended for a hang, while it answered a request.

    Attributes:
        label: The candidate it was on (its last :class:`Progress`; None before the first).
        why: What ended it, in words (``'killed by SIGSEGV'``, ``'exit status 70'``, a hang).
        hung: It was ended by the parent for running longer than :data:`CANDIDATE_LIMIT_S` on ``label``.
        own: It ended of its own doing (a crash signal such as SIGSEGV or SIGABRT, an exit status), not from
            outside (SIGKILL, SIGTERM: the OOM killer, an operator).
    """

    def __init__(self, label: str | None, why: str, hung: bool = False, own: bool = False) -> None:
        super().__init__(f"the check process ended ({why})" + (f" on {label}" if label else ""))
        self.label, self.why, self.hung, self.own = label, why, hung, own


@dataclass(frozen=True, slots=True)
class Verdicts:
    """The worker's answer.

    Per trial label in check order, why it was rejected (None: it passed), the seconds of one warm run (None when not
    measured) and whether it is a partition; the search's notes; the artifacts made of the candidates that passed.
    """

    results: tuple[tuple[str, str | None, float | None, bool], ...]
    notes: tuple[str, ...]
    artifacts: tuple[tuple[str, str], ...] = ()  # (label, the file the serving process imports instead of compiling)


class PacedUntil:
    """Until when each check now waiting for the check process wants it paced (``time.perf_counter``'s).

    The process is paced until the earliest of them (forever while none waits, :meth:`until`); a pacer made
    ``until_a_check_waits`` (the imports of :meth:`CheckProcess.prestart`) is not paced while none waits.
    """

    def __init__(self) -> None:
        self._untils: list[float] = []
        self._lock = threading.Lock()

    def add(self, until: float) -> None:
        """A check waits, and wants the process paced until ``until``."""
        with self._lock:
            self._untils.append(until)

    def remove(self, until: float) -> None:
        """That check has its answer."""
        with self._lock:
            self._untils.remove(until)

    def until(self) -> float:
        """The earliest time a waiting check asked for (infinity while none waits)."""
        with self._lock:
            return min(self._untils, default=math.inf)

    def waiting(self) -> bool:
        """Whether a check waits for the process."""
        with self._lock:
            return bool(self._untils)


def _idle_cpu_s() -> float:
    """The machine's idle CPU seconds since boot, all cores together (Linux ``/proc/stat``: idle and iowait)."""
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


class IdleCores:
    """The machine's idle CPU over the last ``window_s``, in cores (2.0: two cores idle all that time).

    Args:
        window_s: How far back :meth:`sample` reads.
        read: The machine's idle CPU seconds so far (:func:`_idle_cpu_s`; tests script it).
        clock: The wall clock the window is timed on.
    """

    def __init__(self, window_s: float, read: Callable[[], float] = _idle_cpu_s,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.window_s, self._read, self._clock = window_s, read, clock
        self._samples: deque[tuple[float, float]] = deque()

    @staticmethod
    def available() -> bool:
        """Whether this system reports its idle CPU and has an idle scheduling class (Linux)."""
        return hasattr(os, "SCHED_IDLE") and os.path.exists("/proc/stat")

    def reset(self) -> None:
        """Forget the samples (the window starts again at the next one)."""
        self._samples.clear()

    def sample(self) -> float | None:
        """Read now; the idle cores over the last ``window_s`` (None until the samples span that long)."""
        now, idle = self._clock(), self._read()
        self._samples.append((now, idle))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        t0, idle0 = self._samples[0]
        return (idle - idle0) / (now - t0) if now - t0 >= self.window_s else None


class _Pacer:
    """Keeps a child process's CPU time within ``share`` of the wall time, from outside, by stopping it.

    It reads the process's CPU time (all its threads) from ``/proc`` and, while the process is over its share,
    holds it with ``SIGSTOP`` until the wall time has caught up (then ``SIGCONT``). The child ends with its parent
    (:func:`_die_with_parent`), so a parent killed while it is held leaves nothing behind.

    While it paces, it reads the machine's idle CPU (``idle``); once the callers leave at least ``share`` of a core idle
    over a window, it moves the process's threads but the main one to the idle class (``TuningPolicy.idle_window_s``)
    and paces no more: the idle class takes only what no one else wants. The main thread keeps the normal class and
    starts each request's thread (:func:`serve`), so the next check starts in it again (a thread cannot leave the idle
    class without a privilege).
    """

    def __init__(self, pid: int, share: float, until_a_check_waits: bool = False,
                 paced: PacedUntil | None = None, idle: IdleCores | None = None) -> None:
        self.pid, self.share, self.until_a_check_waits = pid, share, until_a_check_waits
        self.paced = paced if paced is not None else PacedUntil()
        self._tick = os.sysconf("SC_CLK_TCK")
        self._cpu0, self._wall0 = self.cpu_s(), time.perf_counter()
        self.idle = idle
        self.idle_class = False  # its threads (but the main one) run in the idle class: unpaced from then on
        self._moved: set[int] = set()  # the threads moved there

    @staticmethod
    def available(pid: int) -> bool:
        """Whether this system lets a parent read ``pid``'s CPU time and stop it."""
        return sys.platform.startswith("linux") and os.path.exists(f"/proc/{pid}/stat")

    def cpu_s(self) -> float:
        """The process's user and system CPU seconds so far (its threads included)."""
        with open(f"/proc/{self.pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._tick

    def hold_s(self) -> float:
        """How long the process must stay stopped for its CPU time to be within its share (0: none).

        0 once the time until which the waiting checks want it paced has passed (:class:`PacedUntil`), and,
        for a pacer made ``until_a_check_waits`` (the imports of :meth:`CheckProcess.prestart`), while no check waits:
        no call has come to a model that tunes, so there is no caller to slow. The share counts from when pacing
        starts, so what ran unpaced is not paid back by a stop.
        """
        if self.idle_class:
            return 0.0
        now = time.perf_counter()
        until = self.paced.until()
        if not self._pacing(now, until):
            self._cpu0, self._wall0 = self.cpu_s(), now
            if self.idle is not None:
                self.idle.reset()  # the idle CPU counts while it is paced (before a call, the machine may be idle)
            return 0.0
        return max(0.0, min((self.cpu_s() - self._cpu0) / self.share - (now - self._wall0), until - now))

    def _pacing(self, now: float, until: float) -> bool:
        """Whether the process is paced now: a waiting check wants it paced past ``now`` (:class:`PacedUntil`)."""
        return now < until and not (self.until_a_check_waits and not self.paced.waiting())

    def to_idle_class(self) -> bool:
        """Move the process's threads but the main one to the idle class once the callers leave ``share`` idle.

        The idle CPU is read only while the process is paced; once moved, each later look moves the threads started
        since by a thread not moved yet (threads inherit their creator's class). True once moved.
        """
        if self.idle is None:
            return False
        if not self.idle_class:
            if not self._pacing(time.perf_counter(), self.paced.until()):
                return False  # the callers' idle time is read only while the pace holds (unpaced, the check's own
                # CPU would hide it; before a call, nothing waits for a core)
            cores = self.idle.sample()
            if cores is None or cores < self.share:
                return False
            self.idle_class = True
            logger.debug("auto (online): the machine had %.2f cores idle over %.1f s; the check process runs in the "
                         "idle class from now on", cores, self.idle.window_s)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
        except OSError:  # the process ended: reading its answer says so
            return True
        for tid in tids:
            if tid != self.pid and tid not in self._moved:
                try:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                    self._moved.add(tid)
                except ProcessLookupError:  # a thread that ended meanwhile
                    pass
                except OSError as e:  # not allowed here (a sandbox's system-call filter): paced as before
                    if not self._moved:
                        logger.debug("auto (online): the check process cannot run in the idle class here (%s)", e)
                        self.idle, self.idle_class = None, False
                        return False
        return True

    def hold(self) -> float:
        """Stop the process for as long as :meth:`hold_s` says (at most a second); the seconds it was held."""
        try:
            if self.to_idle_class():
                return 0.0
            hold = self.hold_s()
            if hold <= 0.0:
                return 0.0
            t0 = time.perf_counter()
            os.kill(self.pid, signal.SIGSTOP)
            try:
                time.sleep(min(hold, 1.0))
            finally:
                os.kill(self.pid, signal.SIGCONT)
            return time.perf_counter() - t0
        except (OSError, ValueError):  # the process ended: reading its answer says so
            return 0.0

    def wait(self, readable: int) -> None:
        """Pace the process until file descriptor ``readable`` has data (its answer); it runs freely after."""
        try:
            while not select.select([readable], [], [], SLICE_S)[0]:
                self.hold()
        except (OSError, ValueError):  # the process ended: reading its answer says so
            pass


class _Worker:
    """The worker process, the lock that keeps one request at a time on its pipes, and when it last answered."""

    def __init__(self, proc: subprocess.Popen[bytes], paced: PacedUntil, clock: Clock) -> None:
        self.proc = proc
        self.lock = threading.Lock()
        self.paced = _Pacer.available(self.proc.pid)
        self._paced_until = paced
        self._clock = clock
        self.last_used = clock()  # handed out or answered (:meth:`CheckProcess.reap_idle` ends it this long after)

    def ask(self, request: CheckRequest | tuple[str, tuple[str, ...] | None], share: float = 1.0,
            until_a_check_waits: bool = False) -> Any:
        """Send ``request`` and return the answer; the process paced to ``share`` meanwhile where it can be.

        ``until_a_check_waits``: paced only while a check waits for the worker (:meth:`_Pacer.hold_s`).

        Raises:
            CheckProcessDied: The process ended before it answered, or was ended for a hang (then it is killed).
        """
        with self.lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            try:
                _send(self.proc.stdin, request)
            except OSError:  # its end of the pipe is closed: it has ended
                raise CheckProcessDied(None, *self._ended()) from None
            try:
                return self._answer(share, until_a_check_waits)
            finally:
                self.last_used = self._clock()

    def _answer(self, share: float, until_a_check_waits: bool) -> Any:
        """Read the answer, pacing the process meanwhile and watching the time it runs on each candidate."""
        out = self.proc.stdout
        assert out is not None
        window = _policy().idle_window_s
        pacer = (_Pacer(self.proc.pid, share, until_a_check_waits, self._paced_until,
                        IdleCores(window) if window > 0.0 and IdleCores.available() else None)
                 if self.paced and share < 1.0 else None)
        label: str | None = None
        ran, last = 0.0, time.perf_counter()
        while True:
            try:
                ready = bool(select.select([out], [], [], SLICE_S)[0])
            except (OSError, ValueError):
                ready = True  # reading says what happened
            held = pacer.hold() if pacer is not None and not ready else 0.0
            now = time.perf_counter()
            ran, last = ran + max(0.0, now - last - held), now
            if not ready:
                if label is not None and ran > CANDIDATE_LIMIT_S:
                    self.close()
                    raise CheckProcessDied(label, f"it did not finish within {CANDIDATE_LIMIT_S:g} s in the check "
                                           "process, which was ended", hung=True)
                continue
            try:
                message = _receive(out)
            except EOFError:
                raise CheckProcessDied(label, *self._ended()) from None
            if isinstance(message, Progress):
                label, ran = message.label, 0.0
                continue
            return message

    def _ended(self) -> tuple[str, bool, bool]:
        """How the process ended, in words; False (not a hang); whether it was its own doing."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # its pipe closed but it lives on: it is no use any more
            self.close()
            code = self.proc.returncode
        if code is None:
            return "its pipe closed", False, False
        if code < 0:
            try:
                sig = signal.Signals(-code)
            except ValueError:
                return f"killed by signal {-code}", False, True
            return f"killed by {sig.name}", False, sig not in _OUTSIDE
        return f"exit status {code}", False, True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=5)


def _spawn_forever(requests: queue.SimpleQueue[queue.SimpleQueue[Any]]) -> None:
    while True:
        box = requests.get()
        try:
            box.put(subprocess.Popen([sys.executable, "-c", _WORKER_MAIN], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0,
                                     env={**os.environ, _PARENT_ENV: str(os.getpid())}))
        except Exception as e:
            box.put(e)


def _send(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read(stream: Any, size: int) -> bytes:
    """Exactly ``size`` bytes (the parent's end of the pipe is unbuffered: ``select`` must see what is unread)."""
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("the check process ended")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(stream: Any) -> Any:
    (size,) = struct.unpack("<Q", _read(stream, 8))
    return pickle.loads(_read(stream, size))  # our own child process, over a private pipe


def _policy() -> TuningPolicy:
    """The tuning policy that ``hybrid.init``'s settings ask for now."""
    return TuningPolicy.from_settings(autotune_config())


class CheckProcess:
    """The check process of this Python process, and everything about it: its start, pacing, reaping and stop.

    One is shared by the models that tune (online.py holds it): the check of one model waits for another's, so
    however many tune, the checks together take one ``check_share`` of the wall time. What a candidate did to the
    process (:class:`Checker`) is its owner's, not this object's.

    Args:
        clock: The idle time's clock (tests script it).
    """

    def __init__(self, clock: Clock = monotonic) -> None:
        self.clock = clock
        self.paced = PacedUntil()
        self._worker: _Worker | None = None
        self._lock = threading.Lock()
        self._reaping = False  # whether the reaper thread (:meth:`_reap_forever`) is running; under _lock
        self.exiting = False  # set by ``shutdown(for_good=True)``: no worker starts again; under _lock
        self._spawner: queue.SimpleQueue[queue.SimpleQueue[Any]] | None = None
        self._spawner_lock = threading.Lock()  # not _lock: worker() holds that one while it starts the process
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: (p := ref()) is not None and p._forget())

    def _forget(self) -> None:
        """Forget, in a forked child, what belongs to the parent.

        Neither the spawner thread nor the worker is the child's (its exit must not kill the parent's worker), and a
        lock another thread held at the fork would never be released.
        """
        self._spawner, self._worker, self._reaping, self.exiting = None, None, False, False
        self._spawner_lock, self._lock = threading.Lock(), threading.Lock()
        self.paced = PacedUntil()

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Start the worker process from the one thread that lives as long as this object's process.

        The worker asks the kernel to end it when its parent does (:func:`_die_with_parent`), and Linux sends that
        signal when the *thread* that started it ends: started by a thread that finishes (a loader, a pool's), it
        would die with that thread.
        """
        with self._spawner_lock:
            if self._spawner is None:
                self._spawner = queue.SimpleQueue()
                threading.Thread(target=_spawn_forever, args=(self._spawner,), name="hybrid-check-spawner",
                                 daemon=True).start()
            spawner = self._spawner
        box: queue.SimpleQueue[Any] = queue.SimpleQueue()
        spawner.put(box)
        started = box.get()
        if isinstance(started, BaseException):
            raise started
        return started

    @property
    def current(self) -> _Worker | None:
        """The worker process now running (None: none)."""
        return self._worker

    def worker(self) -> _Worker:
        """The worker process, started (again) when there is none; handing it out counts as a use."""
        with self._lock:
            if self.exiting:
                raise RuntimeError("the process is exiting")
            if self._worker is None or self._worker.proc.poll() is not None:
                atexit.register(self.shutdown)  # registering twice is harmless
                self._worker = _Worker(self._spawn(), self.paced, self.clock)
            self._worker.last_used = self.clock()
            if not self._reaping:
                self._reaping = True
                threading.Thread(target=self._reap_forever, name="hybrid-check-reaper", daemon=True).start()
            return self._worker

    def shutdown(self, for_good: bool = False) -> None:
        """Stop the worker process (at exit, or after it failed).

        Args:
            for_good: No worker starts again (interpreter exit: a check asked for later is not run).
        """
        with self._lock:
            w, self._worker = self._worker, None
            self.exiting = self.exiting or for_good
        if w is not None:
            w.close()

    def reap_idle(self) -> float | None:
        """End the worker process if it has had no request for the tuning policy's ``check_idle_s``.

        The next check starts a new one. A worker answering a request is never ended.

        Returns:
            None when no worker is left; else the seconds after which it may be idle long enough.
        """
        idle_s = _policy().check_idle_s
        with self._lock:
            w = self._worker
            if w is None or w.proc.poll() is not None:
                self._worker, self._reaping = None, False  # the reaper thread ends; the next worker starts another
                return None
            left = w.last_used + idle_s - self.clock()
            if left > 0.0:
                return left
            if not w.lock.acquire(blocking=False):
                return idle_s  # answering a request: idle that long after its answer at the earliest
            self._worker, self._reaping = None, False
        try:
            logger.debug("auto (online): the check process was idle for %.0f s; ending it", idle_s)
            w.close()
        finally:
            w.lock.release()
        return None

    def _reap_forever(self) -> None:
        """The reaper thread: wakes when the worker may have become idle, until no worker is left."""
        pause = threading.Event()  # never set: a wait that no scripted ``time`` of a test replaces
        while (left := self.reap_idle()) is not None:
            pause.wait(min(left, 60.0))

    def prestart(self, share: float = 1.0, backends: tuple[str, ...] | None = None) -> None:
        """Start the worker process and let it import the candidates' libraries, in a background thread.

        Its first check then spends its time checking. The imports (over a second of CPU) run at full speed until
        the first call of a model that tunes asks for a check, and are paced to ``share`` from then on like the
        check (on Linux, where the parent paces the process; elsewhere they run unpaced): before any call, nothing
        waits for a core they take.

        Args:
            share: The share of the wall time the imports may run in CPU time once a check waits.
            backends: The backends the checks will run (None: every registered one); only their libraries are
                imported.
        """
        request = ("probe", tuple(backends) if backends is not None else None)

        def warm() -> None:
            with contextlib.suppress(Exception):
                self.worker().ask(request, share, until_a_check_waits=True)

        threading.Thread(target=warm, name="hybrid-check-prestart", daemon=True).start()


def _digest(model: bytes) -> str:
    return hashlib.sha256(model).hexdigest()


class Checker:
    """One owner's use of the check process (a model's lab): what its candidates did to it, and their artifacts.

    The blame (a candidate the process died on :data:`DEATHS_TO_BLAME` times in one check, or hung on) is this
    owner's: another model's controller, with the same candidates, does not inherit it. The artifacts the process
    made for this owner's candidates (:meth:`~hybrid.hal.backend.Backend.prepare_artifact`) are files in a folder
    this object owns, removed by :meth:`close` (or when it is collected, or at exit).

    Args:
        process: The check process it asks (shared with the other owners).
        artifacts: Whether the process makes an artifact of each candidate that passes.
    """

    def __init__(self, process: CheckProcess, artifacts: bool = True) -> None:
        self.process = process
        self._blamed: dict[tuple[str, str], str] = {}  # (model digest, candidate) -> why the worker died or hung
        self._lock = threading.Lock()
        self._artifacts = artifacts
        self._folder: tempfile.TemporaryDirectory[str] | None = None

    def artifact_dir(self) -> str | None:
        """The folder the check process writes this owner's artifacts to (made on first use; None: no artifacts)."""
        if not self._artifacts:
            return None
        with self._lock:
            if self._folder is None:
                self._folder = tempfile.TemporaryDirectory(prefix="hybrid-artifacts-")
            return self._folder.name

    def blame(self, model: bytes, candidate: str, why: str) -> None:
        """Never compile ``candidate`` (and its precisions and layouts) for ``model`` again, for ``why``."""
        with self._lock:
            self._blamed[(_digest(model), candidate)] = why

    def blamed(self, model: Model | bytes, label: str) -> str | None:
        """Why candidate ``label`` must never be compiled for ``model`` by this owner; None: it may be.

        The check process died on it :data:`DEATHS_TO_BLAME` times in one check, or hung on it
        (:meth:`check_elsewhere`): compiled in the caller's process it would end or hang that process.
        """
        with self._lock:
            if not self._blamed:  # the common case costs no serialization of the model
                return None
        digest = _digest(model if isinstance(model, bytes) else model.to_bytes())
        with self._lock:
            return self._blamed.get((digest, split_layout(label)[0].partition(" ")[0]))  # its layouts, precisions

    def prestart(self, share: float = 1.0, backends: tuple[str, ...] | None = None) -> None:
        """:meth:`CheckProcess.prestart`."""
        self.process.prestart(share, backends)

    def check_elsewhere(self, request: CheckRequest, paced_until: float = math.inf) -> Verdicts | None:
        """Run :func:`check` in the worker process; None when it cannot (the caller then checks itself).

        The worker is paced to the request's share until ``paced_until`` (``time.perf_counter``'s), and so is the
        request before it still under way (the imports of :meth:`CheckProcess.prestart`): the check must leave the
        turns their time. A worker that dies or hangs is started again and asked again (module doc); the candidates
        blamed for it (:meth:`blamed`) are left out and come back rejected with the reason.
        """
        if request.artifact_dir is None and self._artifacts:
            request = dataclasses.replace(request, artifact_dir=self.artifact_dir())
        self.process.paced.add(paced_until)
        try:
            return self._check_surviving(request)
        finally:
            self.process.paced.remove(paced_until)

    def _check_surviving(self, request: CheckRequest) -> Verdicts | None:
        digest = _digest(request.model)
        deaths: dict[str | None, int] = {}
        notes: list[str] = []
        while True:
            with self._lock:
                left_out = {lb: self._blamed[(digest, lb)] for lb in request.order if (digest, lb) in self._blamed}
            rejected = tuple((lb, f"left out: {why}", None, False) for lb, why in left_out.items())
            order = tuple(lb for lb in request.order if lb not in left_out)
            if not order:
                return Verdicts(rejected, tuple(notes))
            try:
                w = self.process.worker()
                asked, share = dataclasses.replace(request, order=order), request.share
                if w.paced:  # paced from outside: it must not also pace itself (after ``paced_until`` it runs unpaced)
                    asked = dataclasses.replace(asked, share=1.0)
                answer = w.ask(asked, share)
            except CheckProcessDied as died:
                self.process.shutdown()  # the next request starts a new process
                if self.process.exiting:  # ended by the stop at exit (online.stop_all): nothing is started again,
                    return None  # nobody is blamed
                candidate = died.label.partition(" ")[0] if died.label else None
                count = deaths[candidate] = deaths.get(candidate, 0) + 1
                logger.warning("auto (online): %s while checking %r; starting it again", died, request.name)
                if candidate is None:
                    if count >= DEATHS_TO_BLAME:
                        return None  # it dies before it starts on any candidate: the caller checks in a thread
                    continue
                if died.hung or died.own or count >= DEATHS_TO_BLAME:
                    why = died.why if died.hung else f"the check process died on it ({died.why}" + (
                        f", {count} times)" if count > 1 else ")")
                    self.blame(request.model, candidate, why)
                else:
                    notes.append(f"the check process died ({died.why}) while it was on {died.label}; asked again in "
                                 "a new one")
                continue
            except Exception as e:  # a broken or missing worker must never fail the model
                logger.info("auto (online): the check process is unavailable (%s); checking in a thread", e)
                self.process.shutdown()
                return None
            if not isinstance(answer, Verdicts):
                logger.info("auto (online): the check process could not check (%s); checking in a thread", answer)
                return None
            return Verdicts(answer.results + rejected, answer.notes + tuple(notes), answer.artifacts)

    def close(self) -> None:
        """Remove the artifacts' folder (the executables imported from them no longer need the files)."""
        with self._lock:
            folder, self._folder = self._folder, None
        if folder is not None:
            with contextlib.suppress(OSError):
                folder.cleanup()


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


def check(request: CheckRequest, tell: Callable[[str], None] = lambda _label: None) -> Verdicts | None:
    """Check every candidate on the request's sample, as the offline search does (runs in the worker).

    ``tell`` receives the label of each candidate as the worker starts on it (:class:`Progress`). A candidate whose
    compile raises (``MemoryError``, a library's own exception: anything but the HybridError the search reports
    itself) is rejected with it, and the others are checked without it.
    """
    known = set(backend_names())
    if any(label.partition(":")[0] not in known for label in request.order):
        return None
    validated_update({"num_threads": 1})  # what hybrid.init does for this key (the api sits above runtime)
    model = Model.load(request.model)
    model.name = request.name
    rules = {k: OutputRule(**v) for k, v in request.rules.items()}
    current: list[str | None] = [None]

    def options_of(c: Candidate, p: str) -> dict[str, Any]:  # the search asks right before it compiles ``c``
        label = f"{c} {p}" if p != "fp32" else str(c)
        current[0] = label
        tell(label)
        return dict(request.options[label])

    failed: dict[str, str] = {}
    compiled: dict[str, Any] = {}  # what compiled before a candidate failed is not compiled again
    pace = pacer(request.share)
    while True:
        order = [Candidate(*label.split(":", 1)) for label in request.order if label not in failed]
        search = Search(model, order, options_of, request.precision, request.budget, request.sample,
                        rtol=request.rtol, rules=rules, compiled=compiled)
        try:
            tried, _ = check_trials(search, autotune=True, after_each=lambda _s: pace())
            break
        except Exception as e:
            at = (current[0] or "").partition(" ")[0]
            if not at or at in failed:
                raise
            failed[at] = f"could not compile in the check process: {type(e).__name__}: {first_line(e)}"
            current[0] = None
    judge.outvote(tried, search, model.name)
    warm: dict[str, float] = {}  # the fallback last, timed only where no other passed (else the lab leaves it out)
    for t in sorted(tried, key=lambda t: is_fallback(t.backend)):
        accelerated = any(u.rejected is None and not is_fallback(u.backend) for u in tried)
        if t.rejected is None and not (accelerated and is_fallback(t.backend)):
            try:
                tell(t.label)
                settle()  # the candidate checked before may still hold a core (its pool's idle threads spin)
                # in CPU time: this process runs where the callers leave a core idle, so its wall time measures its
                # waits (a U-Net's OpenVINO run "took" 13.6 s; the encoder's OpenVINO read 2.6x ONNX Runtime)
                warm[t.label] = warm_estimate(lambda e=t.executable: e.run(search.verifier.samples or {}),
                                              calls=10, within_s=0.25, clock=time.process_time)
            except Exception as e:
                t.rejected = f"failed on a second run: {e}"
            pace()
    artifacts = _artifacts(request, model, tried, tell, pace)
    judge.close_all(tried, None, search)
    return Verdicts(tuple((t.label, t.rejected, warm.get(t.label), t.partitioned) for t in tried)
                    + tuple((label, why, None, False) for label, why in failed.items()), tuple(search.notes),
                    artifacts)


def _artifacts(request: CheckRequest, model: Model, tried: list[Any], tell: Callable[[str], None],
               pace: Callable[[], None]) -> tuple[tuple[str, str], ...]:
    """What the serving process imports instead of compiling, for each accelerated candidate that passed.

    Made here, off the callers' cores' share (:meth:`~hybrid.hal.backend.Backend.prepare_artifact`), from the
    executable the check compiled where the backend can export it. One that fails is only not made: the serving
    process compiles that candidate itself.
    """
    if request.artifact_dir is None:
        return ()
    out = []
    for i, t in enumerate(tried):
        if t.rejected is not None or t.partitioned or is_fallback(t.backend) or t.label not in request.options:
            continue
        path = os.path.join(request.artifact_dir, f"{_digest(request.model)[:12]}-{i}.artifact")
        try:
            tell(t.label)
            if get_backend(t.backend).prepare_artifact(model, t.device, request.options[t.label], path,
                                                       compiled=t.executable):
                out.append((t.label, path))
        except Exception as e:  # the serving process compiles it instead
            logger.info("auto (online): no artifact of %s: %s", t.label, first_line(e))
        pace()
    return tuple(out)


def _probe(backends: tuple[str, ...] | None) -> str:
    """Import the libraries of ``backends`` (None: every registered one): what the first check would pay for."""
    for name in backend_names() if backends is None else backends:
        with contextlib.suppress(Exception):  # an unknown name is the check's to report
            backend_status(name)
    return "ok"


def _die_with_parent() -> None:
    """Have the kernel kill this process when its parent ends (Linux's parent-death signal).

    A parent that dies while it holds this process stopped (:class:`_Pacer`) must not leave it stopped for ever; a
    running one would see its standard input close, a stopped one cannot.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if str(os.getppid()) != os.environ.get(_PARENT_ENV, str(os.getppid())):
            os._exit(0)  # the parent ended before the signal was asked for (this process was handed to another)


def _answer(request: Any, probing: bool, stdout: Any) -> Any:
    """The answer to one request: a probe's or a check's (its progress told on ``stdout`` as it goes)."""
    return _probe(request[1]) if probing else check(request, lambda lb: _send(stdout, Progress(lb)))


def _in_a_thread(work: Callable[[], Any]) -> Any:
    """``work()`` in a thread of its own, waited for: its answer, or its error raised here.

    The parent may move a request's threads to the idle class (:meth:`_Pacer.to_idle_class`), and no thread can leave
    it without a privilege; the main thread, which starts each request's thread in its own class, never is.
    """
    out: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            out.append((True, work()))
        except BaseException as e:  # handed to the main thread
            out.append((False, e))

    thread = threading.Thread(target=run, name="hybrid-check-request")
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


def serve() -> None:
    """The worker's loop: answer each request on stdin with its verdicts (or why not) on stdout."""
    _die_with_parent()
    logging.basicConfig(level=logging.ERROR)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the answer stream
    while True:
        try:
            request = _receive(stdin)
        except EOFError:
            return
        try:
            probing = isinstance(request, tuple) and request[:1] == ("probe",)
            answer: Any = _in_a_thread(functools.partial(_answer, request, probing, stdout))
        except Exception as e:
            answer = f"{type(e).__name__}: {e}"
        _send(stdout, answer)
