"""perf_analyzer's measurement, as ``pyasc bench --url`` runs it: windows, the stability rule, the sweep's levels.

A level (a concurrency, or a request rate) is measured in windows of ``window_s`` seconds; windows are repeated
until the last ``windows`` of them agree (perf_analyzer's rule: max / min of both the throughput and the
latency within ``stability_pct`` percent) or ``max_trials`` windows have run. The level's figures are those
windows merged. Everything here is arithmetic on records and clock readings: the load itself is
:mod:`hybrid.cli._remote`'s, so the rule and the window accounting are tested on scripted time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hybrid.errors import ConfigError

__all__ = ["COLUMNS", "Level", "Record", "ServerCounters", "StabilityPolicy", "Window", "csv_rows", "measure",
           "merge", "parse_range", "stable", "window_of"]

PERCENTILES = (50, 90, 95, 99)
# perf_analyzer's CSV header (-f), times in microseconds; the first column is "Request Rate" for a rate sweep
COLUMNS = ("Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
           "Server Compute Infer", "Server Compute Output", "Client Recv",
           *(f"p{p} latency" for p in PERCENTILES))
_STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True, slots=True)
class StabilityPolicy:
    """When a level's windows agree: perf_analyzer's rule and its defaults.

    Attributes:
        window_s: Seconds per window (perf_analyzer ``--measurement-interval``, 5000 ms): long enough that a
            window holds many requests, so its mean and percentiles are not a handful of samples.
        stability_pct: Largest spread allowed, max / min - 1 in percent, of throughput and of latency over the
            compared windows (``--stability-percentage``, 10): run-to-run noise of a shared machine is a few
            percent, a trend (warm-up, a cache filling, tuning) is more.
        windows: How many of the last windows must agree (perf_analyzer's 3): two can agree by chance.
        max_trials: Windows per level at most (``--max-trials``, 10); a level still unstable is reported as such.
        percentile: The latency compared (``--percentile``); None: the mean, as perf_analyzer's default.
    """

    window_s: float = 5.0
    stability_pct: float = 10.0
    windows: int = 3
    max_trials: int = 10
    percentile: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("--measurement-interval", self.window_s), ("--stability-percentage",
                                                                       self.stability_pct)):
            if not value > 0:
                raise ConfigError("HYB-102", f"{name}: expected a number > 0, got {value!r}")
        if self.windows < 1 or self.max_trials < self.windows:
            raise ConfigError("HYB-102", f"--max-trials: expected at least {self.windows} (the windows compared), "
                              f"got {self.max_trials}", "perf_analyzer's default is 10")
        if self.percentile is not None and self.percentile not in PERCENTILES:
            raise ConfigError("HYB-102", f"--percentile: expected one of {', '.join(map(str, PERCENTILES))}, got "
                              f"{self.percentile}", "or leave it out to compare mean latencies")


@dataclass(frozen=True, slots=True)
class Record:
    """One completed request, in seconds of the load's clock: when it ended, its latency, send and receive parts.

    ``late``: a rate load sent it behind its schedule (its senders were all busy).
    """

    end: float
    latency: float
    send: float
    recv: float
    ok: bool = True
    late: bool = False


@dataclass(frozen=True, slots=True)
class ServerCounters:
    """The model's cumulative statistics at one moment (``/v2/models/NAME/stats``): (count, ns) per stage."""

    success: int
    stages: Mapping[str, tuple[int, int]]

    @classmethod
    def from_stats(cls, doc: Mapping[str, object], version: str = "") -> ServerCounters:
        """From the statistics extension's JSON (HTTP's numbers, or gRPC's as_json strings), summed over versions."""
        success, stages = 0, {s: (0, 0) for s in _STAGES}
        for model in doc.get("model_stats", []) or []:  # type: ignore[union-attr]
            if version and str(model.get("version", "")) != version:
                continue
            infer = model.get("inference_stats", {})
            success += int(infer.get("success", {}).get("count", 0))
            for s in _STAGES:
                part = infer.get(s, {})
                count, ns = stages[s]
                stages[s] = (count + int(part.get("count", 0)), ns + int(part.get("ns", 0)))
        return cls(success, stages)


@dataclass(frozen=True, slots=True)
class Window:
    """One measurement window: what completed in it, and the server's side of it.

    Times are microseconds, per request. ``server_us`` is per stage (queue, compute_input, compute_infer,
    compute_output), the deltas of the server's counters over the window; None when the server has no
    statistics extension or served nothing in the window.
    """

    seconds: float
    requests: int
    errors: int
    infer_per_s: float
    avg_us: float
    percentiles_us: Mapping[int, float]
    send_us: float
    recv_us: float
    server_us: Mapping[str, float] | None = None
    latencies_us: tuple[float, ...] = field(default=(), repr=False)
    server_requests: int = 0
    late: int = 0

    def latency_us(self, percentile: int | None) -> float:
        """The latency the stability rule compares: a percentile, or the mean."""
        return self.avg_us if percentile is None else self.percentiles_us[percentile]

    @property
    def network_us(self) -> float:
        """perf_analyzer's Network+Server Send/Recv: what the client waited beyond the server's queue and compute."""
        server = sum(self.server_us.values()) if self.server_us else 0.0
        return max(self.avg_us - self.send_us - self.recv_us - server, 0.0)


def _server_deltas(before: ServerCounters | None, after: ServerCounters | None) -> tuple[dict[str, float] | None, int]:
    if before is None or after is None:
        return None, 0
    out: dict[str, float] = {}
    for s in _STAGES:
        count = after.stages[s][0] - before.stages[s][0]
        ns = after.stages[s][1] - before.stages[s][1]
        out[s] = ns / count / 1e3 if count > 0 else 0.0
    served = after.success - before.success
    return (out if served > 0 else None), served


def window_of(records: Sequence[Record], start: float, end: float, items: int = 1,
              before: ServerCounters | None = None, after: ServerCounters | None = None) -> Window:
    """The window [start, end) of the load's clock: the requests that completed in it.

    Args:
        records: Completed requests (any order; those ending outside the window are left out).
        start: The window's first instant.
        end: Its end (exclusive).
        items: Inferences per request (the batch size), as perf_analyzer counts Inferences/Second.
        before: The server's counters read at ``start``.
        after: Read at ``end``.
    """
    inside = [r for r in records if start <= r.end < end]
    good = [r for r in inside if r.ok]
    seconds = end - start
    lat = np.array([r.latency for r in good], dtype=np.float64) * 1e6
    server, served = _server_deltas(before, after)
    return Window(seconds=seconds, requests=len(good), errors=len(inside) - len(good),
                  infer_per_s=len(good) * items / seconds if seconds > 0 else 0.0,
                  avg_us=float(lat.mean()) if len(lat) else 0.0,
                  percentiles_us={p: float(np.percentile(lat, p)) if len(lat) else 0.0 for p in PERCENTILES},
                  send_us=float(np.mean([r.send for r in good]) * 1e6) if good else 0.0,
                  recv_us=float(np.mean([r.recv for r in good]) * 1e6) if good else 0.0,
                  server_us=server, latencies_us=tuple(float(x) for x in lat), server_requests=served,
                  late=sum(r.late for r in inside))


def stable(windows: Sequence[Window], policy: StabilityPolicy) -> bool:
    """perf_analyzer's rule: the last ``policy.windows`` windows agree in throughput and in latency.

    Each figure's max / min over them must be within ``1 + stability_pct / 100``; a window that completed
    nothing is never stable.
    """
    if len(windows) < policy.windows:
        return False
    last = windows[-policy.windows:]
    limit = 1 + policy.stability_pct / 100
    for values in ([w.infer_per_s for w in last], [w.latency_us(policy.percentile) for w in last]):
        low, high = min(values), max(values)
        if low <= 0 or high / low > limit:
            return False
    return True


def merge(windows: Sequence[Window]) -> Window:
    """Windows as one: the requests pooled, per-request means weighted by each window's requests."""
    requests = sum(w.requests for w in windows)
    seconds = sum(w.seconds for w in windows)
    lat = np.array([x for w in windows for x in w.latencies_us], dtype=np.float64)

    def mean(get: Callable[[Window], float]) -> float:
        return sum(get(w) * w.requests for w in windows) / requests if requests else 0.0

    with_server = [w for w in windows if w.server_us is not None]
    served = sum(w.server_requests for w in with_server)
    server = None
    if with_server and served:
        server = {s: sum(w.server_us[s] * w.server_requests for w in with_server) / served  # type: ignore[index]
                  for s in _STAGES}
    items = sum(w.infer_per_s * w.seconds for w in windows)
    return Window(seconds=seconds, requests=requests, errors=sum(w.errors for w in windows),
                  infer_per_s=items / seconds if seconds > 0 else 0.0, avg_us=mean(lambda w: w.avg_us),
                  percentiles_us={p: float(np.percentile(lat, p)) if len(lat) else 0.0 for p in PERCENTILES},
                  send_us=mean(lambda w: w.send_us), recv_us=mean(lambda w: w.recv_us), server_us=server,
                  latencies_us=tuple(lat), server_requests=served, late=sum(w.late for w in windows))


@dataclass(frozen=True, slots=True)
class Level:
    """One level of the sweep: its value, whether its windows agreed, every window, and the merged figures."""

    mode: str
    value: float
    stable: bool
    windows: tuple[Window, ...]
    merged: Window


def measure(mode: str, value: float, run_window: Callable[[], Window], policy: StabilityPolicy,
            on_window: Callable[[int, Window], None] | None = None) -> Level:
    """Run windows at one level until the last ``policy.windows`` agree or ``policy.max_trials`` have run.

    The reported figures merge the last ``policy.windows`` windows (perf_analyzer reports the stable ones).
    """
    windows: list[Window] = []
    while len(windows) < policy.max_trials:
        windows.append(run_window())
        if on_window is not None:
            on_window(len(windows), windows[-1])
        if stable(windows, policy):
            break
    ok = stable(windows, policy)
    return Level(mode, value, ok, tuple(windows), merge(windows[-policy.windows:]))


def parse_range(text: str, option: str, integer: bool) -> list[float]:
    """``START[:END[:STEP]]`` as perf_analyzer takes it (END and STEP default to START and 1) -> the levels.

    Raises:
        ConfigError: HYB-102 for a range that does not parse, is empty, or holds a level <= 0.
    """
    parts = text.split(":")
    kind = "whole numbers" if integer else "numbers"
    try:
        nums = [int(p) if integer else float(p) for p in parts]
    except ValueError:
        nums = []
    if not 1 <= len(parts) <= 3 or len(nums) != len(parts):
        raise ConfigError("HYB-102", f"{option}: expected START[:END[:STEP]] of {kind}, got {text!r}",
                          f"e.g. {option} {'1:8:2' if integer else '10:50:10'}")
    start = nums[0]
    end = nums[1] if len(nums) > 1 else start
    step = nums[2] if len(nums) > 2 else 1
    if start <= 0 or step <= 0 or end < start or math.isinf(end):
        raise ConfigError("HYB-102", f"{option}: expected 0 < START <= END and STEP > 0, got {text!r}",
                          f"e.g. {option} {'1:8:2' if integer else '10:50:10'}")
    levels, k = [], 0
    while start + k * step <= end * (1 + 1e-9):
        levels.append(start + k * step)
        k += 1
    if len(levels) > 1000:
        raise ConfigError("HYB-102", f"{option}: {text!r} makes {len(levels)} levels; at most 1000",
                          "a larger STEP")
    return levels


def csv_rows(levels: Sequence[Level]) -> tuple[list[str], list[list[str]]]:
    """perf_analyzer's CSV (``-f``): header and rows, times in whole microseconds, sorted by throughput."""
    first = "Concurrency" if not levels or levels[0].mode == "concurrency" else "Request Rate"
    rows = []
    for lv in sorted(levels, key=lambda lv: lv.merged.infer_per_s):
        w = lv.merged
        server = w.server_us or {}
        value = f"{int(lv.value)}" if lv.mode == "concurrency" else f"{lv.value:g}"
        rows.append([value, f"{w.infer_per_s:.6g}", *(str(int(x)) for x in (
            w.send_us, w.network_us, server.get("queue", 0.0), server.get("compute_input", 0.0),
            server.get("compute_infer", 0.0), server.get("compute_output", 0.0), w.recv_us,
            *(w.percentiles_us[p] for p in PERCENTILES)))])
    return [first, *COLUMNS], rows
