"""A scripted clock for code that takes one (a ``clock`` and a ``wait``): time moves only when a test says so.

:class:`ScriptedClock` is the ``clock`` (``clock()`` is its time) and its :meth:`ScriptedClock.wait` the
``wait(cond, seconds)`` of the code under test: a thread waiting for some seconds of the clock wakes when
:meth:`ScriptedClock.advance` moves the time (or when the code notifies the condition itself), never because
real seconds passed. A test is then the same on a loaded machine and an idle one.
"""

from __future__ import annotations

import threading


class ScriptedClock:
    """Time that moves only by :meth:`advance`; threads waiting on it wake when it moves.

    Args:
        start: The time at the start, in seconds.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._read: dict[int, float] = {}  # thread id -> the time that thread last read
        self._conditions: list[threading.Condition] = []  # every condition that ever waited on this clock
        self._waiting: dict[int, float] = {}  # thread id -> the time at which it began to wait
        self._changed = threading.Condition(self._lock)

    def __call__(self) -> float:
        with self._lock:
            self._read[threading.get_ident()] = self._now
            return self._now

    def wait(self, cond: threading.Condition, seconds: float) -> bool:
        """Wait on ``cond`` (held by the caller) until the time moves or ``cond`` is notified; ``seconds`` is the
        caller's own deadline, which it checks again on the clock when this returns.

        Returns at once when the time moved since this thread last read it (its deadline may have passed).
        """
        with self._lock:
            if self._now != self._read.get(threading.get_ident()):
                return False
            if all(c is not cond for c in self._conditions):
                self._conditions.append(cond)
            me = threading.get_ident()
            self._waiting[me] = self._now
            self._changed.notify_all()
        try:
            # an advance() from here on notifies cond, and cannot do so before this wait releases it
            return cond.wait()
        finally:
            with self._lock:
                self._waiting.pop(me, None)

    def until_waiting(self, count: int = 1, limit: float = 30.0) -> None:
        """Return once ``count`` threads wait on the clock at its current time (they have seen it and wait
        for it to move); ``limit`` real seconds is only a safety net against a hang.

        Raises:
            AssertionError: Fewer were waiting after ``limit`` seconds.
        """
        with self._changed:
            ok = self._changed.wait_for(lambda: sum(t == self._now for t in self._waiting.values()) >= count, limit)
        assert ok, f"{count} thread(s) waiting on the clock at {self._now}: {self._waiting}"

    def advance(self, seconds: float) -> None:
        """Move the time on by ``seconds`` and wake every thread waiting on the clock."""
        with self._lock:
            self._now += seconds
            conditions = list(self._conditions)
        for cond in conditions:
            with cond:
                cond.notify_all()
