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

__all__ = ["TIMER", "time_models"]

Timer = Callable[[Mapping[str, bytes], dict[str, np.ndarray]], dict[str, float]]


def time_models(models: Mapping[str, bytes], feed: dict[str, np.ndarray], *, rounds: int = 15,
                budget_s: float = 3.0) -> dict[str, float]:
    """Median milliseconds per run of each model on ``feed``; models are keyed by any name."""
    import onnxruntime as ort

    sessions = {}
    for key, data in models.items():
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[key] = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    for s in sessions.values():  # warm up (first runs allocate)
        s.run(None, feed)
        s.run(None, feed)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    start = time.perf_counter()
    for r in range(rounds):
        for key, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, feed)
            times[key].append((time.perf_counter() - t0) * 1e3)
        if r >= 4 and time.perf_counter() - start > budget_s:
            break
    return {k: statistics.median(v) for k, v in times.items()}


TIMER: Timer = time_models
