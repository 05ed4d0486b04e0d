"""The background check of online tuning, in a separate low-priority process.

Checking candidates on a copy of a real input means running the numpy reference and every candidate:
seconds of CPU on a real model, and Python code that would hold the interpreter lock the caller's
thread needs. Done in one shared worker process paced to ``share`` of the wall time in CPU time (the
tuning policy's ``check_share``), its cost on the callers is bounded whatever the load, and so is the time
it takes: a low scheduling priority alone would starve it where the callers, or other processes, want every
core. Where the system lets the parent read the process's CPU time and stop it (Linux), the parent paces it
from outside in slices of :data:`SLICE_S` (:class:`_Pacer`), its start-up imports (over a second of CPU)
included once a check waits; elsewhere it paces itself after each candidate (:func:`pacer`). No caller ever
waits for it. The process is started when a model that tunes is compiled (:func:`prestart`), and imports at full
speed until the first call asks for a check, so that its imports are done, or under way, before the first check.
The worker runs one thread per session (it must not crowd the callers' cores). It imports only the libraries of
the candidates it is asked about, and ends once it has been idle for the tuning policy's ``check_idle_s``
(:func:`reap_idle`): the next check starts it again.

A candidate's faults stay in the worker (issue 54, docs/auto.md "Faults in a candidate"). The worker tells the
parent which candidate it starts on (:class:`Progress`) before it compiles, checks or times each one. A candidate
whose compile raises anything (``MemoryError``, a library's own exception) is rejected with it and the others are
checked. A worker that ends (a crash in native code, ``os._exit``, a SIGKILL) or that spends more than
:data:`CANDIDATE_LIMIT_S` of running time on one candidate (a hang) is ended and started again: the check is asked
again, and a candidate the worker died on twice, or hung on once, is rejected with the reason and never checked or
compiled again for that model in this process (:func:`blamed`), in the worker or in the caller's.

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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybrid.config import autotune_config, validated_update
from hybrid.errors import first_line
from hybrid.hal import Candidate, backend_names, backend_status, is_fallback
from hybrid.hal.layout import split_layout
from hybrid.ir import Model
from hybrid.runtime.auto import judge
from hybrid.runtime.auto.policy import Clock, TuningPolicy, monotonic
from hybrid.runtime.auto.timing import settle, warm_estimate
from hybrid.runtime.auto.tolerance import OutputRule
from hybrid.runtime.auto.trials import Search, check_trials

logger = logging.getLogger("hybrid")

__all__ = ["CANDIDATE_LIMIT_S", "CheckProcessDied", "CheckRequest", "Progress", "Verdicts", "blamed", "check",
           "check_elsewhere", "pacer", "prestart", "reap_idle", "serve", "shutdown"]

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
    measured) and whether it is a partition; the search's notes.
    """

    results: tuple[tuple[str, str | None, float | None, bool], ...]
    notes: tuple[str, ...]


class _Pacer:
    """Keeps a child process's CPU time within ``share`` of the wall time, from outside, by stopping it.

    It reads the process's CPU time (all its threads) from ``/proc`` and, while the process is over its share,
    holds it with ``SIGSTOP`` until the wall time has caught up (then ``SIGCONT``). The child ends with its parent
    (:func:`_die_with_parent`), so a parent killed while it is held leaves nothing behind.
    """

    def __init__(self, pid: int, share: float, until_a_check_waits: bool = False) -> None:
        self.pid, self.share, self.until_a_check_waits = pid, share, until_a_check_waits
        self._tick = os.sysconf("SC_CLK_TCK")
        self._cpu0, self._wall0 = self.cpu_s(), time.perf_counter()

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

        0 once the time until which the waiting checks want it paced has passed (:func:`check_elsewhere`), and,
        for a pacer made ``until_a_check_waits`` (the imports of :func:`prestart`), while no check waits: no call
        has come to a model that tunes, so there is no caller to slow. The share counts from when pacing starts,
        so what ran unpaced is not paid back by a stop.
        """
        now = time.perf_counter()
        until = _paced_until()
        if now >= until or (self.until_a_check_waits and not _PACED):
            self._cpu0, self._wall0 = self.cpu_s(), now
            return 0.0
        return max(0.0, min((self.cpu_s() - self._cpu0) / self.share - (now - self._wall0), until - now))

    def hold(self) -> float:
        """Stop the process for as long as :meth:`hold_s` says (at most a second); the seconds it was held."""
        try:
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

    def __init__(self) -> None:
        self.proc = _spawn()
        self.lock = threading.Lock()
        self.paced = _Pacer.available(self.proc.pid)
        self.last_used = _clock()  # handed out or answered (:func:`reap_idle` ends it this long after)

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
                self.last_used = _clock()

    def _answer(self, share: float, until_a_check_waits: bool) -> Any:
        """Read the answer, pacing the process meanwhile and watching the time it runs on each candidate."""
        out = self.proc.stdout
        assert out is not None
        pacer = _Pacer(self.proc.pid, share, until_a_check_waits) if self.paced and share < 1.0 else None
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


_WORKER: _Worker | None = None
_WORKER_LOCK = threading.Lock()
_REAPING = False  # whether the reaper thread (:func:`_reap_forever`) is running; under _WORKER_LOCK
_EXITING = False  # set by ``shutdown(for_good=True)``: no worker starts again; under _WORKER_LOCK
_clock: Clock = monotonic  # the idle time's clock (tests script it)
_SPAWNER: queue.SimpleQueue[queue.SimpleQueue[Any]] | None = None
_SPAWNER_LOCK = threading.Lock()  # not _WORKER_LOCK: _worker() holds that one while it starts the process


def _spawn() -> subprocess.Popen[bytes]:
    """Start the worker process from the one thread that lives as long as this process.

    The worker asks the kernel to end it when its parent does (:func:`_die_with_parent`), and Linux sends that
    signal when the *thread* that started it ends: started by a thread that finishes (a loader, a pool's), it would
    die with that thread.
    """
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = queue.SimpleQueue()
            threading.Thread(target=_spawn_forever, args=(_SPAWNER,), name="hybrid-check-spawner", daemon=True).start()
        spawner = _SPAWNER
    box: queue.SimpleQueue[Any] = queue.SimpleQueue()
    spawner.put(box)
    started = box.get()
    if isinstance(started, BaseException):
        raise started
    return started


def _spawn_forever(requests: queue.SimpleQueue[queue.SimpleQueue[Any]]) -> None:
    while True:
        box = requests.get()
        try:
            box.put(subprocess.Popen([sys.executable, "-c", _WORKER_MAIN], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0,
                                     env={**os.environ, _PARENT_ENV: str(os.getpid())}))
        except Exception as e:
            box.put(e)


def _forget_spawner() -> None:
    """Forget, in a forked child, what belongs to the parent.

    Neither the spawner thread nor the worker is the child's (its exit must not kill the parent's worker), and a
    lock another thread held at the fork would never be released.
    """
    global _SPAWNER, _WORKER, _SPAWNER_LOCK, _WORKER_LOCK, _REAPING, _EXITING
    _SPAWNER, _WORKER, _REAPING, _EXITING = None, None, False, False
    _SPAWNER_LOCK, _WORKER_LOCK = threading.Lock(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spawner)


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


def shutdown(for_good: bool = False) -> None:
    """Stop the worker process (at exit, or after it failed).

    Args:
        for_good: No worker starts again in this process (interpreter exit: a check asked for later is not run).
    """
    global _WORKER, _EXITING
    with _WORKER_LOCK:
        w, _WORKER = _WORKER, None
        _EXITING = _EXITING or for_good
    if w is not None:
        w.close()


def _worker() -> _Worker:
    """The worker process, started (again) when there is none; handing it out counts as a use."""
    global _WORKER, _REAPING
    with _WORKER_LOCK:
        if _EXITING:
            raise RuntimeError("the process is exiting")
        if _WORKER is None or _WORKER.proc.poll() is not None:
            atexit.register(shutdown)  # registering twice is harmless
            _WORKER = _Worker()
        _WORKER.last_used = _clock()
        if not _REAPING:
            _REAPING = True
            threading.Thread(target=_reap_forever, name="hybrid-check-reaper", daemon=True).start()
        return _WORKER


def _idle_s() -> float:
    return TuningPolicy.from_settings(autotune_config()).check_idle_s


def reap_idle() -> float | None:
    """End the worker process if it has had no request for the tuning policy's ``check_idle_s``.

    The next check starts a new one. A worker answering a request is never ended.

    Returns:
        None when no worker is left; else the seconds after which it may be idle long enough.
    """
    global _WORKER, _REAPING
    idle_s = _idle_s()
    with _WORKER_LOCK:
        w = _WORKER
        if w is None or w.proc.poll() is not None:
            _WORKER, _REAPING = None, False  # the reaper thread ends; the next worker starts another
            return None
        left = w.last_used + idle_s - _clock()
        if left > 0.0:
            return left
        if not w.lock.acquire(blocking=False):
            return idle_s  # answering a request: idle that long after its answer at the earliest
        _WORKER, _REAPING = None, False
    try:
        logger.debug("auto (online): the check process was idle for %.0f s; ending it", idle_s)
        w.close()
    finally:
        w.lock.release()
    return None


def _reap_forever() -> None:
    """The reaper thread: wakes when the worker may have become idle, until no worker is left."""
    pause = threading.Event()  # never set: a wait that no scripted ``time`` of a test replaces
    while (left := reap_idle()) is not None:
        pause.wait(min(left, 60.0))


def prestart(share: float = 1.0, backends: tuple[str, ...] | None = None) -> None:
    """Start the worker process and let it import the candidates' libraries, in a background thread.

    Its first check then spends its time checking. The imports (over a second of CPU) run at full speed until
    the first call of a model that tunes asks for a check, and are paced to ``share`` from then on like the check
    (on Linux, where the parent paces the process; elsewhere they run unpaced): before any call, nothing waits
    for a core they take.

    Args:
        share: The share of the wall time the imports may run in CPU time once a check waits.
        backends: The backends the checks will run (None: every registered one); only their libraries are imported.
    """
    request = ("probe", tuple(backends) if backends is not None else None)

    def warm() -> None:
        with contextlib.suppress(Exception):
            _worker().ask(request, share, until_a_check_waits=True)

    threading.Thread(target=warm, name="hybrid-check-prestart", daemon=True).start()


_PACED: list[float] = []  # until when each check waiting for the worker wants it paced (``time.perf_counter``)
_PACED_LOCK = threading.Lock()


def _paced_until() -> float:
    """The worker is paced until the earliest time a waiting check asked for (forever while none waits).

    A pacer made ``until_a_check_waits`` (the imports of :func:`prestart`) is not paced while none waits
    (:meth:`_Pacer.hold_s`).
    """
    with _PACED_LOCK:
        return min(_PACED, default=math.inf)


_BLAMED: dict[tuple[str, str], str] = {}  # (model digest, candidate) -> why the worker died or hung on it
_BLAMED_LOCK = threading.Lock()


def _digest(model: bytes) -> str:
    return hashlib.sha256(model).hexdigest()


def blamed(model: Model | bytes, label: str) -> str | None:
    """Why candidate ``label`` must never be compiled for ``model`` in this process; None: it may be.

    The check process died on it :data:`DEATHS_TO_BLAME` times in one check, or hung on it (:func:`check_elsewhere`):
    compiled in the caller's process it would end or hang that process.
    """
    with _BLAMED_LOCK:
        if not _BLAMED:  # the common case costs no serialization of the model
            return None
    digest = _digest(model if isinstance(model, bytes) else model.to_bytes())
    with _BLAMED_LOCK:
        return _BLAMED.get((digest, split_layout(label)[0].partition(" ")[0]))  # its layouts and precisions too


def check_elsewhere(request: CheckRequest, paced_until: float = math.inf) -> Verdicts | None:
    """Run :func:`check` in the worker process; None when it cannot (the caller then checks itself).

    The worker is paced to the request's share until ``paced_until`` (``time.perf_counter``'s), and so is the
    request before it still under way (the imports of :func:`prestart`): the check must leave the turns their time.
    A worker that dies or hangs is started again and asked again (module doc); the candidates blamed for it
    (:func:`blamed`) are left out and come back rejected with the reason.
    """
    with _PACED_LOCK:
        _PACED.append(paced_until)
    try:
        return _check_surviving(request)
    finally:
        with _PACED_LOCK:
            _PACED.remove(paced_until)


def _check_surviving(request: CheckRequest) -> Verdicts | None:
    digest = _digest(request.model)
    deaths: dict[str | None, int] = {}
    notes: list[str] = []
    while True:
        with _BLAMED_LOCK:
            left_out = {lb: _BLAMED[(digest, lb)] for lb in request.order if (digest, lb) in _BLAMED}
        rejected = tuple((lb, f"left out: {why}", None, False) for lb, why in left_out.items())
        order = tuple(lb for lb in request.order if lb not in left_out)
        if not order:
            return Verdicts(rejected, tuple(notes))
        try:
            w = _worker()
            asked, share = dataclasses.replace(request, order=order), request.share
            if w.paced:  # paced from outside: it must not also pace itself (after ``paced_until`` it runs unpaced)
                asked = dataclasses.replace(asked, share=1.0)
            answer = w.ask(asked, share)
        except CheckProcessDied as died:
            shutdown()  # the next request starts a new process
            if _EXITING:  # ended by the stop at exit (online.stop_all): nothing is started again, nobody is blamed
                return None
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
                with _BLAMED_LOCK:
                    _BLAMED[(digest, candidate)] = why
            else:
                notes.append(f"the check process died ({died.why}) while it was on {died.label}; asked again in a "
                             "new one")
            continue
        except Exception as e:  # a broken or missing worker must never fail the model
            logger.info("auto (online): the check process is unavailable (%s); checking in a thread", e)
            shutdown()
            return None
        if not isinstance(answer, Verdicts):
            logger.info("auto (online): the check process could not check (%s); checking in a thread", answer)
            return None
        return Verdicts(answer.results + rejected, answer.notes + tuple(notes))


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
    judge.close_all(tried, None, search)
    return Verdicts(tuple((t.label, t.rejected, warm.get(t.label), t.partitioned) for t in tried)
                    + tuple((label, why, None, False) for label, why in failed.items()), tuple(search.notes))


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
            answer: Any = _probe(request[1]) if probing else check(request, lambda lb: _send(stdout, Progress(lb)))
        except Exception as e:
            answer = f"{type(e).__name__}: {e}"
        _send(stdout, answer)
