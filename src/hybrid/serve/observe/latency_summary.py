"""Triton's latency summaries (``--metrics-config summary_latencies=true``): quantiles of recent latencies.

Triton 2.51 can expose, beside or instead of its cumulative ``nv_inference_*_duration_us`` counters, one
Prometheus summary per phase (``nv_inference_request_summary_us``, ``_queue_``, ``_compute_input_``,
``_compute_infer_``, ``_compute_output_``) with the quantiles of ``summary_quantiles`` (0.5, 0.9, 0.95, 0.99 and
0.999 by default) over the last minute. :class:`MetricsConfig` reads the same ``--metrics-config`` settings;
:class:`Window` keeps a phase's recent observations (at most :data:`WINDOW_SIZE`, none older than ``max_age_s``)
and answers its quantiles at scrape time: the observed value of that rank (nearest rank), exact over the window
where Triton keeps a streaming estimate within the error bounds that ``summary_quantiles`` sets (the bounds are
accepted and have nothing to bound here). Under more than :data:`WINDOW_SIZE` requests a minute the quantiles are
those of the newest ones. Counts and sums are the phase's totals since start, as in Triton.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hybrid.errors import ConfigError

__all__ = ["DEFAULT_QUANTILES", "WINDOW_SIZE", "MetricsConfig", "Window"]

DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.000001))
"""Triton's default ``summary_quantiles``: (quantile, its error bound) each."""

WINDOW_SIZE = 4096
"""Most observations a phase's window keeps (the newest); with ``max_age_s`` it bounds memory and scrape time."""


def _flag(key: str, value: str) -> bool:
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    raise ConfigError("HYB-102", f"--metrics-config {key}={value}: expected true or false",
                      f"e.g. --metrics-config {key}=true")


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    pairs = []
    for item in value.split(","):
        q, sep, err = item.partition(":")
        try:
            pair = (float(q), float(err) if sep else 0.0)
        except ValueError:
            pair = (math.nan, math.nan)
        if not (0.0 <= pair[0] <= 1.0 and 0.0 <= pair[1] <= 1.0):
            raise ConfigError("HYB-102", f"--metrics-config summary_quantiles={value}: {item!r} is not "
                              "QUANTILE:ERROR with both in [0, 1]",
                              "e.g. --metrics-config summary_quantiles=0.5:0.05,0.99:0.001")
        pairs.append(pair)
    return tuple(pairs)


@dataclass(frozen=True)
class MetricsConfig:
    """How the server's Triton latency metrics are exposed (``--metrics-config KEY=VALUE``, as tritonserver's).

    Attributes:
        counter_latencies: The cumulative ``nv_inference_*_duration_us`` counters (``counter_latencies``).
        summary_latencies: The ``nv_inference_*_summary_us`` summaries (``summary_latencies``).
        summary_quantiles: (quantile, error bound) of each quantile a summary reports (``summary_quantiles``).
        max_age_s: How far back a summary's quantiles look, in seconds.
    """

    counter_latencies: bool = True
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    max_age_s: float = 60.0

    @classmethod
    def from_options(cls, options: Sequence[str]) -> MetricsConfig:
        """Read ``--metrics-config`` values; later ones win.

        Such as ``counter_latencies=false``, ``summary_latencies=true``, ``summary_quantiles=0.5:0.05,0.99:0.001``.

        Raises:
            ConfigError: HYB-102 for a value without ``=``, an unknown key or a bad value.
        """
        fields: dict[str, object] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep:
                raise ConfigError("HYB-102", f"--metrics-config {option!r}: expected KEY=VALUE",
                                  "e.g. --metrics-config summary_latencies=true")
            if key in ("counter_latencies", "summary_latencies"):
                fields[key] = _flag(key, value)
            elif key == "summary_quantiles":
                fields[key] = _quantiles(value)
            else:
                raise ConfigError("HYB-102", f"--metrics-config {key}: unknown setting; pyasc takes "
                                  "counter_latencies, summary_latencies and summary_quantiles",
                                  "e.g. --metrics-config summary_latencies=true")
        return cls(**fields)  # type: ignore[arg-type]


class Window:
    """The recent observations of one latency (microseconds) and their quantiles; not thread-safe (its owner locks).

    Args:
        max_age_s: Observations older than this are left out of the quantiles.
        size: Most observations kept (the newest).
        clock: Seconds, monotonic (tests pass a scripted one).
    """

    __slots__ = ("_clock", "_values", "max_age_s")

    def __init__(self, max_age_s: float = 60.0, size: int = WINDOW_SIZE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self._clock = clock
        self._values: deque[tuple[float, float]] = deque(maxlen=size)

    def add(self, value_us: float) -> None:
        """One observation, now."""
        self._values.append((self._clock(), value_us))

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """The value at each quantile of ``qs`` among the observations of the last ``max_age_s`` seconds.

        Nearest rank, rounded to the microsecond; NaN each when there is none, as Prometheus reports an empty
        summary.
        """
        oldest = self._clock() - self.max_age_s
        while self._values and self._values[0][0] < oldest:
            self._values.popleft()
        values = sorted(v for _, v in self._values)
        if not values:
            return [math.nan] * len(qs)
        n = len(values)
        return [float(round(values[min(n - 1, max(0, math.ceil(q * n) - 1))])) for q in qs]
