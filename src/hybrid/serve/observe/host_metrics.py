"""Triton's CPU metrics of the machine the server runs on: ``nv_cpu_utilization``, ``nv_cpu_memory_*``.

As Triton does, on Linux only, from ``/proc/stat`` and ``/proc/meminfo``: the utilization is the share of the
machine's CPU time (all cores) that was not idle since the previous scrape (the first scrape: since the server
started), used memory is ``MemTotal - MemAvailable``. Where those files cannot be read the metrics are left out,
as Triton leaves them out off Linux.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["HostCollector", "cpu_times", "memory_bytes"]

_IDLE_FIELDS = (3, 4)  # idle, iowait among the cpu line's fields (user nice system idle iowait irq softirq steal)


def cpu_times(text: str) -> tuple[int, int] | None:
    """(busy, total) CPU time in clock ticks over all cores, from ``/proc/stat``'s text.

    None if it has no ``cpu`` line. Guest time is already inside user and nice, so it is not added again.
    """
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(v) for v in fields[1:9]]
            total = sum(ticks)
            return total - sum(ticks[i] for i in _IDLE_FIELDS if i < len(ticks)), total
    return None


def memory_bytes(text: str) -> tuple[int, int] | None:
    """(total, used) memory in bytes from ``/proc/meminfo``'s text (used: total less available).

    None where a field is missing.
    """
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            found[key] = int(rest.split()[0]) * 1024  # kB
    if len(found) < 2:
        return None
    return found["MemTotal"], found["MemTotal"] - found["MemAvailable"]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


class HostCollector(Collector):
    """The CPU metrics, read when scraped.

    Args:
        stat: Returns ``/proc/stat``'s text, or None where it cannot be read (tests give their own).
        meminfo: Returns ``/proc/meminfo``'s text, or None.
    """

    def __init__(self, stat: Callable[[], str | None] = lambda: _read("/proc/stat"),
                 meminfo: Callable[[], str | None] = lambda: _read("/proc/meminfo")) -> None:
        self._stat = stat
        self._meminfo = meminfo
        self._lock = threading.Lock()  # two scrapes at once must not share one previous sample
        text = stat()
        self._last = cpu_times(text) if text is not None else None

    def collect(self) -> Iterator[Metric]:
        """``nv_cpu_utilization`` since the last scrape and the memory gauges, where the machine tells them."""
        text = self._stat()
        now = cpu_times(text) if text is not None else None
        if now is not None:
            with self._lock:
                last, self._last = self._last, now
            busy, total = (now[0] - last[0], now[1] - last[1]) if last is not None else (0, 0)
            share = min(1.0, max(0.0, busy / total)) if total > 0 else 0.0
            yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=share)
        text = self._meminfo()
        memory = memory_bytes(text) if text is not None else None
        if memory is not None:
            yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=memory[0])
            yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=memory[1])
