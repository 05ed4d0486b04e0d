"""Measurement for ``compile(target='auto')``: sample inputs, timing, and the decision cache.

- Sample inputs come from the caller or are generated from the signature (symbolic dims -> 1,
  integer inputs 1 or 2, or bounded by the tables they index).
- Candidates are timed interleaved in blocks with short pauses (DESIGN 4); the median wins.
- Decisions are cached as JSON files, written atomically, keyed by the sha256 of what the decision
  depends on (:func:`decision_key`): model hash, input signature, target and candidates, precision
  and accuracy budget, backend options and versions, and the device fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.hal.machine import cache_root, cpu_facts

__all__ = [
    "SAMPLE_STYLES",
    "cache_dir",
    "decision_key",
    "device_fingerprint",
    "load_decision",
    "make_samples",
    "save_decision",
    "time_candidates",
]

logger = logging.getLogger("hybrid")

CACHE_SCHEMA = 1
TIME_BUDGET_S = 1.0  # measuring time per candidate, at most
BLOCKS = 5


# ---------------------------------------------------------------------------------------- samples
def _index_bounds(model: Any) -> dict[str, int]:
    """Input name -> exclusive upper bound, for integer inputs used as Gather indices into a constant."""
    graph = model.graph
    bounds: dict[str, int] = {}
    inputs = {v.name for v in graph.inputs}
    for node in graph:
        if node.op_type != "Gather" or len(node.inputs) < 2 or node.inputs[1] is None:
            continue
        data, idx = node.inputs[0], node.inputs[1]
        axis = node.attributes.get("axis")
        axis_v = axis.value if axis is not None else 0
        if idx.name in inputs and data is not None and data.shape is not None and len(data.shape) > axis_v:
            dim = data.shape[axis_v]
            if isinstance(dim, int) and dim > 0:
                bounds[idx.name] = min(bounds.get(idx.name, dim), dim)
    return bounds


SAMPLE_STYLES = 4


def make_samples(model: Any, given: Any = None, seed: int = 0, symbolic_size: int = 1,
                 style: int = 0, magnitude: float = 1.0, int_high: int | None = None) -> dict[str, Any] | None:
    """Sample inputs for the checks and timings: ``given`` validated, or generated from the signature.

    Symbolic dims are ``symbolic_size``. Integer inputs that index a constant table (token ids) stay
    inside it. Otherwise ``style`` picks the values, so that a model that rejects one style (an index
    out of range, a coordinate outside an image) can be sampled in another:

    ====== ====================== =====================
    style  floats                 other integers
    ====== ====================== =====================
    0      standard normal        1 or 2 (valid sizes)
    1      uniform in [0, 1)      1 or 2
    2      uniform in [0, 1)      0
    3      standard normal        0 or 1
    ====== ====================== =====================

    Floats are multiplied by ``magnitude``; ``int_high`` widens styles 0 and 1 to integers in
    [1, int_high). Booleans are random. Returns None when an input cannot be
    generated (sequences, maps, unknown rank or dtype).

    Raises:
        RunError: HYB-401..407 when ``given`` does not match the signature.
    """
    from hybrid.runtime.validate import InputValidator

    sig = model.signature
    if given is not None:
        v = InputValidator(sig)
        if isinstance(given, Mapping):
            return v.feeds(given)
        return v.positional(tuple(given) if isinstance(given, (list, tuple)) else (given,), {})
    rng = np.random.default_rng(seed)
    bounds = _index_bounds(model)
    int_range = {0: (1, 3), 1: (1, 3), 2: (0, 1), 3: (0, 2)}[style]
    if int_high is not None and style in (0, 1):
        int_range = (1, int_high)
    feeds: dict[str, Any] = {}
    for spec in sig.inputs:
        if spec.kind == "optional":
            continue
        if spec.kind != "tensor" or spec.dtype is None or spec.shape is None:
            return None
        shape = tuple(d if isinstance(d, int) else symbolic_size for d in spec.shape)
        dt = np.dtype(spec.dtype)
        if dt.kind in "fcV":
            real = rng.standard_normal if style in (0, 3) else rng.random
            arr = real(shape) * magnitude
            if dt.kind == "c":
                arr = arr + 1j * real(shape)
            arr = arr.astype(np.float32).astype(dt) if dt.kind == "V" else arr.astype(dt)
        elif dt.kind in "iu":
            lo, hi = (0, 1 if style == 2 else bounds[spec.name]) if spec.name in bounds else int_range
            arr = rng.integers(lo, hi, size=shape).astype(dt)
        elif dt.kind == "b":
            arr = rng.random(shape) < 0.5
        else:
            return None
        feeds[spec.name] = arr
    return feeds


# ---------------------------------------------------------------------------------------- timing
def time_candidates(runs: Mapping[str, Callable[[], Any]], budget_s: float | None = None,
                    blocks: int = BLOCKS, first_runs: Mapping[str, float] | None = None) -> dict[str, float]:
    """Median seconds per call of each candidate, measured interleaved in blocks.

    A candidate whose first run (``first_runs``, e.g. the check) took over 10x the fastest one's is
    not called again; the others are called up to 3 times to estimate their cost, and one more than 3x slower
    than the best estimate is not measured further (it cannot win): both report their estimate. The
    rest run ``blocks`` rounds in rotated order, each round for about ``budget_s / blocks`` seconds
    per candidate, with a pause between candidates so that ONNX Runtime's spinning threads settle.
    """
    budget_s = TIME_BUDGET_S if budget_s is None else budget_s
    est: dict[str, float] = {}
    first = dict(first_runs or {})
    fastest_first = min((first[n] for n in runs if n in first), default=None)
    for name, fn in runs.items():
        if fastest_first is not None and name in first and first[name] > 10 * fastest_first:
            est[name] = first[name]
            continue
        calls: list[float] = []
        while len(calls) < 3 and sum(calls) < 0.3:  # the least of a few calls: one can be a hiccup
            t0 = time.perf_counter()
            fn()
            calls.append(time.perf_counter() - t0)
        est[name] = min(calls)
    best = min(est.values())
    alive = [n for n in runs if est[n] <= 3 * best]
    pause = min(0.02, max(0.001, 2 * best))
    per_block = {n: int(min(50, max(1, budget_s / blocks / max(est[n], 1e-6)))) for n in alive}
    samples: dict[str, list[float]] = {n: [] for n in alive}
    for b in range(blocks):
        order = alive[b % len(alive):] + alive[:b % len(alive)]
        for name in order:
            fn = runs[name]
            for _ in range(per_block[name]):
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
            time.sleep(pause)
    return {n: (statistics.median(samples[n]) if n in samples else est[n]) for n in runs}


# ---------------------------------------------------------------------------------------- cache
def cache_dir() -> Path:
    """Where decisions live (under :func:`hybrid.hal.machine.cache_root`, in ``autotune/``)."""
    return cache_root()


def device_fingerprint() -> dict[str, Any]:
    """What makes timings of this machine comparable: CPU model and features, usable cores,
    thread setting, and every device the backends see."""
    from hybrid.config import get_config
    from hybrid.hal import devices

    cpu, flags = cpu_facts()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "machine": platform.machine(), "system": platform.system(), "cpu": cpu, "cpu_flags": flags,
        "cores": cores, "num_threads": get_config().num_threads,
        "devices": [[d.name, d.kind, sorted(str(p) for p in d.properties.items())] for d in devices()],
    }


def decision_key(material: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The cache key (sha256 of the canonical JSON) and the JSON-safe material it was made from."""
    safe = json.loads(json.dumps({"schema": CACHE_SCHEMA, **material}, sort_keys=True, default=str))
    digest = hashlib.sha256(json.dumps(safe, sort_keys=True).encode()).hexdigest()
    return digest, safe


def _path(key: str) -> Path:
    return cache_dir() / "autotune" / f"{key[:40]}.json"


def load_decision(key: str, material: Mapping[str, Any]) -> dict[str, Any] | None:
    """The cached record for ``key``, or None (missing, unreadable, or made from other material)."""
    path = _path(key)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != material or "decision" not in record:
        logger.debug("ignoring stale or foreign autotune record %s", path)
        return None
    record["path"] = str(path)
    return record


def save_decision(key: str, material: Mapping[str, Any], decision: Mapping[str, Any],
                  notes: list[str]) -> Path | None:
    """Write the decision atomically (temp file + rename); a read-only cache only logs."""
    from hybrid.ir import atomic_write_bytes

    path = _path(key)
    record = {"key": material, "decision": dict(decision), "notes": notes, "created": time.time()}
    try:
        atomic_write_bytes(path, json.dumps(record, indent=1, sort_keys=True, default=str).encode())
    except OSError as e:
        logger.warning("could not write the autotune cache %s: %s", path, e)
        return None
    return path
