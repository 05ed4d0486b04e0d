"""Timing candidate models on the quantizer's target backend (ONNX Runtime's CPU provider).

Short and interleaved: every model runs once per round, in turn, so that load on the machine falls on
all of them alike; the figure is the median per model. Spinning is off (fair on a shared machine).
Tests replace :data:`TIMER` to check that the speed check is consulted without timing anything.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import numpy as np

__all__ = ["MIN_SPEEDUP", "TIMER", "time_models"]

# int8 is returned only when measured at least this much faster than fp32: short interleaved timings on
# a busy machine vary by several percent, and a model that is merely as fast is not worth its accuracy loss
MIN_SPEEDUP = 1.1

Timer = Callable[[Mapping[str, bytes], dict[str, np.ndarray]], dict[str, float]]


def time_models(models: Mapping[str, bytes], feed: dict[str, np.ndarray], *, rounds: int = 25,
                budget_s: float = 4.0) -> dict[str, float]:
    """Median milliseconds per run of each model on ``feed``; models are keyed by any name."""
    import onnxruntime as ort

    sessions = {}
    for key, data in models.items():
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[key] = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    for s in sessions.values():  # warm up (first runs allocate)
        for _ in range(3):
            s.run(None, feed)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    start = time.perf_counter()
    for r in range(rounds):
        for key, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, feed)
            times[key].append((time.perf_counter() - t0) * 1e3)
        if r >= 6 and time.perf_counter() - start > budget_s:
            break
    return {k: statistics.median(v) for k, v in times.items()}


TIMER: Timer = time_models
