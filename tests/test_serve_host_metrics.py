"""Triton's CPU metrics (hybrid.serve.observe.host_metrics): read from /proc as Triton reads them, on scripted texts."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hybrid.serve.observe.host_metrics import HostCollector, cpu_times, memory_bytes

pytestmark = pytest.mark.timeout(60)

_STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2 3\n"
_MEMINFO = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\nBuffers:  1 kB\n"


def _stat(user: int, system: int, idle: int, iowait: int = 0) -> str:
    return _STAT.format(user=user, system=system, idle=idle, iowait=iowait)


def test_proc_texts_read_as_triton_reads_them():
    assert cpu_times(_stat(10, 5, 80, 5)) == (15, 100)  # idle and iowait are not busy
    assert cpu_times("intr 1 2\n") is None
    assert memory_bytes(_MEMINFO) == (1000 * 1024, 750 * 1024)  # used: total less available
    assert memory_bytes("MemTotal: 1000 kB\n") is None


def _samples(collector: HostCollector) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return {s.name: s.value for m in registry.collect() for s in m.samples}


def test_utilization_is_the_busy_share_since_the_last_scrape():
    texts = iter([_stat(0, 0, 100), _stat(30, 10, 140), _stat(30, 10, 240)])
    collector = HostCollector(stat=lambda: next(texts), meminfo=lambda: _MEMINFO)
    first = _samples(collector)  # 40 busy ticks of 80 since the server started
    assert first["nv_cpu_utilization"] == pytest.approx(0.5)
    assert first["nv_cpu_memory_total_bytes"] == 1000 * 1024 and first["nv_cpu_memory_used_bytes"] == 750 * 1024
    assert _samples(collector)["nv_cpu_utilization"] == 0.0  # 100 idle ticks since


def test_a_machine_without_proc_has_no_cpu_metrics():
    collector = HostCollector(stat=lambda: None, meminfo=lambda: None)
    assert _samples(collector) == {}
    registry = CollectorRegistry()
    registry.register(HostCollector())  # this machine's own files, whatever it has: read without an error
    generate_latest(registry)
