"""Issue 51: a paced check moves to the idle class where the callers leave a core idle, never where they do not.

The idle CPU is scripted (:class:`IdleCores` reads an injected counter on an injected clock); the process moved is
a real child with a second thread, so the move itself is the kernel's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from tests._serve_support import wait_for

from hybrid.runtime.auto import worker
from hybrid.runtime.auto.worker import IdleCores


def _idle_class_allowed() -> bool:
    """Whether this system lets a thread move to the idle class (a throwaway thread tries; it cannot come back), and
    this process is not in it already (its children would start there: nothing would show a move)."""
    if not (IdleCores.available() and sys.platform.startswith("linux")) or os.sched_getscheduler(0) == os.SCHED_IDLE:
        return False
    ok: list[bool] = []

    def attempt() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            ok.append(True)
        except OSError:
            ok.append(False)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return ok[0]


needs_idle_class = pytest.mark.skipif(not _idle_class_allowed(),
                                      reason="needs Linux's idle scheduling class, allowed here, and /proc")

# a child whose second thread spins until stdin closes; it prints its threads' ids once both run
TWO_THREADS = ("import os, sys, threading\n"
               "def spin():\n    while True: pass\n"
               "threading.Thread(target=spin, daemon=True).start()\n"
               "print('ready', flush=True)\nsys.stdin.read()\n")


class Scripted:
    """An idle-CPU counter and a clock moved by the test: ``advance(s, idle_cores)``."""

    def __init__(self) -> None:
        self.now, self.idle = 0.0, 0.0

    def advance(self, seconds: float, idle_cores: float) -> None:
        self.now += seconds
        self.idle += seconds * idle_cores


def test_idle_cores_reads_nothing_until_its_window_is_spanned_then_the_window_only():
    t = Scripted()
    cores = IdleCores(0.5, read=lambda: t.idle, clock=lambda: t.now)
    assert cores.sample() is None
    t.advance(0.3, 2.0)
    assert cores.sample() is None  # 0.3 s of a 0.5 s window
    t.advance(0.3, 0.0)
    assert cores.sample() == pytest.approx(0.6 / 0.6)  # 0.6 idle core-seconds over 0.6 s
    for _ in range(5):
        t.advance(0.2, 0.1)
        got = cores.sample()
    assert got == pytest.approx(0.1, abs=0.05)  # the old idle time has left the window
    cores.reset()
    assert cores.sample() is None


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", TWO_THREADS], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _policies(pid: int) -> dict[int, int]:
    return {int(t): os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


def _started_in() -> int:
    """The scheduling class the children of this test start in (this process's: SCHED_OTHER, or SCHED_BATCH where the
    runner was started so)."""
    return os.sched_getscheduler(0)


@needs_idle_class
def test_a_paced_check_moves_to_the_idle_class_once_a_window_shows_its_share_idle(child):
    t = Scripted()
    paced = worker.PacedUntil()
    paced.add(time.perf_counter() + 60.0)  # a check waits, paced for a minute
    pacer = worker._Pacer(child.pid, 0.1, paced=paced,
                          idle=IdleCores(0.5, read=lambda: t.idle, clock=lambda: t.now))
    assert not pacer.to_idle_class()  # no window yet
    t.advance(0.6, 0.05)  # the callers leave half the share idle: paced as before
    assert not pacer.to_idle_class()
    assert set(_policies(child.pid).values()) == {_started_in()}
    for _ in range(4):
        t.advance(0.2, 1.0)  # now a core idle
    assert pacer.to_idle_class()
    policies = _policies(child.pid)
    assert policies.pop(child.pid) == _started_in()  # the main thread starts the next request in its own class
    assert set(policies.values()) == {os.SCHED_IDLE}  # the spinning thread
    assert pacer.hold_s() == 0.0 and pacer.hold() == 0.0  # not paced any more, however far past its share


@needs_idle_class
def test_the_idle_cpu_counts_only_while_a_check_waits_for_the_pace(child):
    """Before a call nothing waits for a core (the prestart's imports): an idle machine then says nothing about the
    callers, and the window starts again when a check waits."""
    t = Scripted()
    paced = worker.PacedUntil()
    pacer = worker._Pacer(child.pid, 0.1, until_a_check_waits=True, paced=paced,
                          idle=IdleCores(0.5, read=lambda: t.idle, clock=lambda: t.now))
    for _ in range(5):
        t.advance(0.2, 2.0)
        assert not pacer.to_idle_class()
        assert pacer.hold_s() == 0.0
    until = time.perf_counter() + 60.0
    paced.add(until)  # a call came: its check waits
    pacer.hold_s()
    assert not pacer.to_idle_class()  # a new window starts
    t.advance(0.6, 0.0)  # the callers keep both cores busy
    assert not pacer.to_idle_class()
    assert set(_policies(child.pid).values()) == {_started_in()}
    paced.remove(until)


@needs_idle_class
def test_a_thread_started_after_the_move_is_moved_at_the_next_look():
    """Threads inherit their creator's class; one started meanwhile by a thread the move had not reached yet (the
    main thread here) is moved when the pacer looks again, at its next slice."""
    code = ("import sys, threading, time\n"
            "def wait():\n    while True: time.sleep(0.001)\n"
            "threading.Thread(target=wait, daemon=True).start()\n"
            "print('ready', flush=True)\nsys.stdin.readline()\n"
            "threading.Thread(target=wait, daemon=True).start()\n"
            "print('started', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        t = Scripted()
        paced = worker.PacedUntil()
        paced.add(time.perf_counter() + 60.0)
        pacer = worker._Pacer(proc.pid, 0.1, paced=paced, idle=IdleCores(0.5, read=lambda: t.idle, clock=lambda: t.now))
        pacer.to_idle_class()
        t.advance(0.6, 1.0)
        assert pacer.to_idle_class()
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"started\n"
        wait_for(lambda: len(_policies(proc.pid)) == 3, "the third thread")
        assert sorted(_policies(proc.pid).values()).count(_started_in()) == 2  # not yet
        pacer.to_idle_class()
        policies = _policies(proc.pid)
        assert policies.pop(proc.pid) == _started_in()
        assert set(policies.values()) == {os.SCHED_IDLE}
    finally:
        proc.kill()
        proc.wait()


@needs_idle_class
def test_where_the_idle_class_is_not_allowed_the_check_stays_paced(child, monkeypatch):
    t = Scripted()
    paced = worker.PacedUntil()
    paced.add(time.perf_counter() + 60.0)
    pacer = worker._Pacer(child.pid, 0.1, paced=paced, idle=IdleCores(0.5, read=lambda: t.idle, clock=lambda: t.now))

    def refused(*_args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(worker.os, "sched_setscheduler", refused)
    pacer.to_idle_class()
    t.advance(0.6, 2.0)
    assert not pacer.to_idle_class()
    assert not pacer.idle_class and pacer.idle is None  # it stops asking
    wait_for(lambda: pacer.cpu_s() - pacer._cpu0 >= 0.05, "the child's spin to run past a 10 % share", every=0.01)
    assert pacer.hold_s() > 0.0  # paced as before


def test_each_request_of_the_worker_runs_in_a_thread_of_its_own_and_its_error_comes_back():
    main = threading.get_ident()
    assert worker._in_a_thread(lambda: threading.get_ident()) != main
    assert worker._in_a_thread(lambda: 42) == 42

    def fails():
        raise MemoryError("a candidate's compile")

    with pytest.raises(MemoryError, match="a candidate's compile"):
        worker._in_a_thread(fails)
