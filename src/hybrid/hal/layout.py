"""How an executable runs on its device: replicas and the backend's threading options (issue 50).

Which runtime runs a model is one half of a deployment's speed; how it runs is the other. One ONNX Runtime
session with every core as intra-op threads answers a lone caller fastest, but eight threads calling it at once
wait on each other's fork-joins, and one session per core serves them ~2x as many inferences per second; an
OpenVINO model compiled for LATENCY runs one stream, for THROUGHPUT one per core. A
:class:`~hybrid.hal.backend.Layout` is one such way to run, declared by the backend itself
(:meth:`hybrid.hal.Backend.layouts`), and a :class:`ReplicaPool` holds the replicas a layout asks for, so that
concurrent callers run in parallel without a lock.

The default layout (what ``compile`` gives each backend, no tag) is never listed: it is the candidate itself.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from hybrid.hal.backend import Executable, Layout, NodeSpan

__all__ = ["LAYOUT_MARK", "Layout", "ReplicaPool", "split_layout"]

LAYOUT_MARK = "@"  # a candidate's label with a layout: 'onnxruntime:cpu@2x1', 'openvino:cpu bf16@throughput'


def split_layout(label: str) -> tuple[str, str]:
    """(the candidate's label without its layout, the layout's tag or '') of a candidate label."""
    base, _, tag = label.partition(LAYOUT_MARK)
    return base, tag


class _Handoff:
    """A caller waiting for a replica: its lock is released once :meth:`ReplicaPool._give_back` hands it one."""

    __slots__ = ("ready", "replica")

    def __init__(self) -> None:
        self.ready = threading.Lock()
        self.ready.acquire()
        self.replica: Executable | None = None


class ReplicaPool(Executable):
    """Replicas of one executable; each call runs on a free one, waiting only when all are busy.

    The wait is part of the call, so a caller's time (what online tuning measures) includes it: a pool smaller
    than its callers shows as slower calls, not as hidden queueing. Callers that wait are served in the order they
    came: a replica given back goes straight to the one that has waited longest. A free list that the first
    thread to ask takes from (a ``queue.SimpleQueue``) lets the thread that has just given a replica back take it
    again before a woken waiter runs: with 16 threads calling a pool of 2 on 2 cores (AMD EPYC, no AMX), 2 threads made
    every call and 14 made one in 6 s (the zoo's crnn; 18-35 % more calls per second in all, answered to those 2
    threads).

    Args:
        replicas: Executables compiled alike (same model, options and device).
    """

    def __init__(self, replicas: Sequence[Executable]) -> None:
        if not replicas:
            raise ValueError("a replica pool needs at least one executable")
        self.replicas = tuple(replicas)
        self.input_names = list(self.replicas[0].input_names)
        self.output_names = list(self.replicas[0].output_names)
        self._lock = threading.Lock()
        self._free = list(self.replicas)
        self._waiting: deque[_Handoff] = deque()

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Run on a free replica (waiting for one, in turn, when every replica is busy)."""
        exe = self._take()
        try:
            return exe.run(feeds)
        finally:
            self._give_back(exe)

    def _take(self) -> Executable:
        with self._lock:
            if self._free:
                return self._free.pop()
            handoff = _Handoff()
            self._waiting.append(handoff)
        try:
            handoff.ready.acquire()
        except BaseException:  # interrupted while waiting: a replica handed over meanwhile goes back
            with self._lock:
                if handoff in self._waiting:
                    self._waiting.remove(handoff)
                    raise
            assert handoff.replica is not None
            self._give_back(handoff.replica)
            raise
        assert handoff.replica is not None
        return handoff.replica

    def _give_back(self, exe: Executable) -> None:
        with self._lock:
            if self._waiting:
                handoff = self._waiting.popleft()
                handoff.replica = exe
                handoff.ready.release()
            else:
                self._free.append(exe)

    @property
    def precision(self) -> str | None:
        """The first replica's (they are compiled alike)."""
        return self.replicas[0].precision

    @property
    def loaded_from_cache(self) -> bool | None:
        """The first replica's."""
        return self.replicas[0].loaded_from_cache

    def node_spans(self, calls: Sequence[tuple[int, int]]) -> list[NodeSpan]:
        """None: the profiler compiles a model with one replica."""
        return []

    def close(self) -> None:
        """Close every replica."""
        for exe in self.replicas:
            exe.close()
