"""Shared benchmark harness: interleaved timing, medians, ratios, machine facts, Markdown tables.

Contenders run in the same process on the same inputs, in blocks: each block runs every contender
``per_block`` times in turn (order rotated per block), with a short pause between contenders so that
ONNX Runtime's spinning intra-op threads settle before the next runtime starts (DESIGN section 4).
With ``lead_s``, the calls of each block's first ``lead_s`` seconds are run but not timed: a runtime whose
thread pool idled while the others ran needs that long to reach the speed at which it serves a stream of
calls (OpenVINO on a 0.3 ms encoder: 0.45 ms over its first calls, 0.28 ms from the 150th on).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

__all__ = ["geomean", "interleave", "machine_info", "median_ms", "paired_ratio", "percentile", "table"]


def interleave(contenders: Mapping[str, Callable[[], object]], blocks: int = 5, per_block: int = 10,
               warmup: int = 3, pause: float = 0.05, lead_s: float = 0.0) -> dict[str, list[float]]:
    """Time each contender, interleaved in blocks; return seconds per call for every contender (``per_block``
    timed calls per block, after the calls of its first ``lead_s`` seconds)."""
    names = list(contenders)
    for name in names:
        for _ in range(warmup):
            contenders[name]()
        time.sleep(pause)
    times: dict[str, list[float]] = {n: [] for n in names}
    for b in range(blocks):
        order = names[b % len(names):] + names[:b % len(names)]
        for name in order:
            fn = contenders[name]
            start = time.perf_counter()
            timed = 0
            while timed < per_block:
                t0 = time.perf_counter()
                fn()
                if t0 - start >= lead_s:
                    times[name].append(time.perf_counter() - t0)
                    timed += 1
            time.sleep(pause)
    return times


def paired_ratio(times: Mapping[str, Sequence[float]], num: str, den: str, per_block: int) -> float:
    """The median over blocks of ``num``'s block median / ``den``'s block median in the same block.

    Contenders in one block of :func:`interleave` ran within a second of each other, so each block's ratio
    is free of the machine's drift over the run (on a shared VM one runtime's time moves 10-30 % within
    minutes); the median over blocks drops a block that met a burst of load.
    """
    def block(name: str, b: int) -> float:
        return statistics.median(times[name][b * per_block:(b + 1) * per_block])

    blocks = len(times[num]) // per_block
    return statistics.median(block(num, b) / block(den, b) for b in range(blocks))


def median_ms(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1e3


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of samples, nearest-rank."""
    ordered = sorted(samples)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v > 0]
    if not vals:
        return float("nan")
    prod = 1.0
    for v in vals:
        prod *= v
    return prod ** (1 / len(vals))


def machine_info() -> str:
    """One line naming the machine: CPU model, cores, Python and the runtimes' versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = []
    for mod in ("numpy", "onnxruntime", "openvino", "torch"):
        try:
            m = __import__(mod)
            versions.append(f"{mod} {getattr(m, '__version__', '?')}")
        except ImportError:
            continue
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, " + ", ".join(versions)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; floats get 3 significant decimals."""
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
