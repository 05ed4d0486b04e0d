"""Measurement for ``compile(target='auto')``: sample inputs, the correctness check, timing, the cache.

- Sample inputs come from the caller or are generated from the signature (symbolic dims -> 1,
  integer inputs bounded by the tables they index).
- A candidate's outputs are compared with the reference backend's Polygraphy-style: an element is
  wrong when it is off by more than ``atol * scale`` *and* by more than ``rtol * |expected|``, with
  tolerances per dtype (:data:`TOLERANCES`; ``scale`` is the output's largest magnitude).
- Reduced precisions are held to an accuracy budget instead: ``min_cosine`` and/or
  ``max_rel_error`` (max |error| over the output's largest magnitude), per float output.
- Candidates are timed interleaved in blocks with short pauses (DESIGN 4); the median wins.
- Decisions are cached as JSON files, written atomically, keyed by the sha256 of what the decision
  depends on (:func:`decision_key`).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.errors import ConfigError

__all__ = [
    "ACCURACY_KEYS",
    "DEFAULT_BUDGET",
    "TOLERANCES",
    "Mismatch",
    "Tolerance",
    "accuracy_failure",
    "cache_dir",
    "compare",
    "decision_key",
    "device_fingerprint",
    "load_decision",
    "make_samples",
    "nudged",
    "save_decision",
    "time_candidates",
    "validate_accuracy",
]

logger = logging.getLogger("hybrid")

CACHE_SCHEMA = 1
ACCURACY_KEYS = ("min_cosine", "max_rel_error")
DEFAULT_BUDGET = {"min_cosine": 0.999}
TIME_BUDGET_S = 1.0  # measuring time per candidate, at most
BLOCKS = 5


@dataclass(frozen=True, slots=True)
class Tolerance:
    """Relative tolerance, and absolute tolerance as a fraction of the output's largest magnitude."""

    rtol: float
    atol: float


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-6, 1e-9),
    "float32": Tolerance(1e-3, 1e-5),
    "float16": Tolerance(1e-2, 1e-3),
    "bfloat16": Tolerance(5e-2, 1e-2),
    "complex128": Tolerance(1e-6, 1e-9),
    "complex64": Tolerance(1e-3, 1e-5),
}
_LOW_PRECISION = Tolerance(0.25, 0.1)  # float8 / float4 / int4-in-float formats


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


def make_samples(model: Any, given: Any = None, seed: int = 0, symbolic_size: int = 1) -> dict[str, Any] | None:
    """Sample inputs for the checks and timings: ``given`` validated, or generated from the signature.

    Generated floats are standard normal; symbolic dims are ``symbolic_size``; integer inputs that index a constant
    table (token ids) stay inside it, others lie in [0, 2); booleans are random. Returns None when an
    input cannot be generated (sequences, maps, unknown rank or dtype).

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
    feeds: dict[str, Any] = {}
    for spec in sig.inputs:
        if spec.kind == "optional":
            continue
        if spec.kind != "tensor" or spec.dtype is None or spec.shape is None:
            return None
        shape = tuple(d if isinstance(d, int) else symbolic_size for d in spec.shape)
        dt = np.dtype(spec.dtype)
        if dt.kind == "f":
            arr = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            arr = rng.integers(0, bounds.get(spec.name, 2), size=shape).astype(dt)
        elif dt.kind == "b":
            arr = rng.random(shape) < 0.5
        elif dt.kind == "c":
            arr = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
        elif dt.kind == "V":  # ml_dtypes (bfloat16, float8...)
            arr = rng.standard_normal(shape).astype(np.float32).astype(dt)
        else:
            return None
        feeds[spec.name] = arr
    return feeds


# ---------------------------------------------------------------------------------------- checks
@dataclass(frozen=True, slots=True)
class Mismatch:
    """How a candidate's output differs from the expected one."""

    output: str
    detail: str

    def __str__(self) -> str:
        return f"output {self.output!r} {self.detail}"


def _tolerance(dtype: np.dtype) -> Tolerance | None:
    if dtype.name in TOLERANCES:
        return TOLERANCES[dtype.name]
    if dtype.kind == "V":
        return _LOW_PRECISION
    return None


def _compare_one(name: str, expected: Any, got: Any, moved: Any = None) -> Mismatch | None:
    if isinstance(expected, (list, tuple)) or isinstance(got, (list, tuple)):
        if not isinstance(got, (list, tuple)) or not isinstance(expected, (list, tuple)):
            return Mismatch(name, f"is a {type(got).__name__}, expected a {type(expected).__name__}")
        if len(got) != len(expected):
            return Mismatch(name, f"has {len(got)} elements, expected {len(expected)}")
        moved_items = moved if isinstance(moved, (list, tuple)) and len(moved) == len(expected) else [None] * len(
            expected)
        for k, (e, g, m) in enumerate(zip(expected, got, moved_items)):
            bad = _compare_one(f"{name}[{k}]", e, g, m)
            if bad:
                return bad
        return None
    if expected is None or got is None:
        return None if expected is None and got is None else Mismatch(name, "is missing")
    e, g = np.asarray(expected), np.asarray(got)
    m = np.asarray(moved) if moved is not None else None
    if m is not None and (m.shape != e.shape or m.dtype != e.dtype):
        m = None
    if e.shape != g.shape:
        return Mismatch(name, f"has shape {g.shape}, expected {e.shape}")
    if e.dtype != g.dtype:
        return Mismatch(name, f"has dtype {g.dtype}, expected {e.dtype}")
    tol = _tolerance(e.dtype)
    if tol is None:
        if e.dtype.kind in "OSU":
            equal = np.array_equal(e.astype(object), g.astype(object))
        else:
            # an output the reference itself flips under rounding-level input noise is not exact
            equal = np.array_equal(e, g) or (m is not None and not np.array_equal(e, m))
        if equal:
            return None
        wrong = int(np.sum(e != g)) if e.dtype.kind not in "OSU" else "some"
        return Mismatch(name, f"differs exactly-compared ({e.dtype}): {wrong} of {e.size} elements")
    if e.dtype.kind == "V":
        e, g = e.astype(np.float32), g.astype(np.float32)
        m = None if m is None else m.astype(np.float32)
    wide = np.complex128 if e.dtype.kind == "c" else np.float64
    e64, g64 = e.astype(wide), g.astype(wide)
    both_nan = np.isnan(e64) & np.isnan(g64)
    same_inf = np.isinf(e64) & (e64 == g64)
    err = np.abs(e64 - g64)
    finite = np.isfinite(e64)
    scale = float(np.max(np.abs(e64[finite]))) if finite.any() else 0.0
    atol = tol.atol * max(scale, np.finfo(np.float32).tiny)
    drift = 0.0
    if m is not None:
        moved_err = np.abs(m.astype(wide) - e64)
        moved_err = moved_err[np.isfinite(moved_err)]
        drift = float(np.max(moved_err)) if moved_err.size else 0.0
        atol = max(atol, 2 * drift)  # an ill-conditioned output cannot be checked more tightly
    bad = ~(both_nan | same_inf) & ~((err <= atol) | (err <= tol.rtol * np.abs(e64)))
    if not bad.any():
        return None
    errs = np.nan_to_num(np.where(bad, err, 0.0), nan=np.inf)
    worst = int(np.argmax(errs))
    rel = float(err.flat[worst] / max(abs(e64.flat[worst]), 1e-30))
    return Mismatch(name, f"differs at {int(bad.sum())} of {e.size} elements: max abs error "
                    f"{float(errs.flat[worst]):.3g} (got {g64.flat[worst]:.6g}, expected {e64.flat[worst]:.6g}, "
                    f"rel {rel:.3g}; {e.dtype} tolerance rtol {tol.rtol:g}, atol {atol:.3g})")


def compare(expected: list[Any], got: list[Any], names: list[str], moved: list[Any] | None = None) -> Mismatch | None:
    """The first output of ``got`` that differs from ``expected`` beyond its dtype's tolerance.

    ``moved`` is the expected answer for the sample input nudged by rounding-level noise: where it
    differs from ``expected`` the output is ill-conditioned at this sample, and the absolute tolerance
    of that output widens to twice the drift.
    """
    if len(got) != len(expected):
        return Mismatch("*", f"count is {len(got)}, expected {len(expected)}")
    moved = moved if moved is not None and len(moved) == len(expected) else [None] * len(expected)
    for name, e, g, m in zip(names, expected, got, moved):
        bad = _compare_one(name, e, g, m)
        if bad:
            return bad
    return None


def nudged(samples: Mapping[str, Any], rel: float = 2.0 ** -20, seed: int = 1) -> dict[str, Any] | None:
    """``samples`` with every float input multiplied by (1 + u * rel), u uniform in [-1, 1]; None
    when no input is a float (then nothing can drift)."""
    rng = np.random.default_rng(seed)
    out, any_float = {}, False
    for k, v in samples.items():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
            any_float = True
            v = (v * (1 + rel * rng.uniform(-1, 1, v.shape))).astype(v.dtype)
        out[k] = v
    return out if any_float else None


def validate_accuracy(accuracy: Mapping[str, Any] | None) -> dict[str, float]:
    """Check an accuracy budget; return it with floats.

    Raises:
        ConfigError: HYB-101 for an unknown key, HYB-102 for a value outside its range.
    """
    if accuracy is None:
        return dict(DEFAULT_BUDGET)
    if not isinstance(accuracy, Mapping) or not accuracy:
        raise ConfigError("HYB-102", f"accuracy: expected a mapping such as {{'min_cosine': 0.995}}, got {accuracy!r}")
    out = {}
    for key, value in accuracy.items():
        if key not in ACCURACY_KEYS:
            raise ConfigError("HYB-101", f"unknown accuracy key {key!r}; valid keys: {', '.join(ACCURACY_KEYS)}",
                              "e.g. accuracy={'min_cosine': 0.995} or {'max_rel_error': 0.01}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError("HYB-102", f"accuracy.{key}: expected a number, got {value!r}")
        lo, hi = (-1.0, 1.0) if key == "min_cosine" else (0.0, float("inf"))
        if not lo <= float(value) <= hi:
            raise ConfigError("HYB-102", f"accuracy.{key}: expected a value in [{lo}, {hi}], got {value!r}")
        out[key] = float(value)
    return out


def _float_pairs(expected: list[Any], got: list[Any], names: list[str]):
    for name, e, g in zip(names, expected, got):
        if isinstance(e, (list, tuple)):
            yield from _float_pairs(list(e), list(g), [f"{name}[{k}]" for k in range(len(e))])
            continue
        e, g = np.asarray(e), np.asarray(g)
        yield name, e, g


def accuracy_failure(budget: Mapping[str, float], expected: list[Any], got: list[Any],
                     names: list[str]) -> str | None:
    """Why ``got`` misses the budget against ``expected`` (None: within it). Non-float outputs must
    match exactly; float outputs are held to ``min_cosine`` and ``max_rel_error``."""
    if len(got) != len(expected):
        return f"returned {len(got)} outputs, expected {len(expected)}"
    for name, e, g in _float_pairs(expected, got, names):
        if e.shape != g.shape:
            return f"output {name!r} has shape {g.shape}, expected {e.shape}"
        if e.dtype.kind not in "fcV":
            if not np.array_equal(e, g):
                return f"output {name!r} ({e.dtype}) differs at {int(np.sum(e != g))} of {e.size} elements"
            continue
        a, b = e.astype(np.float64).ravel(), g.astype(np.float64).ravel()
        if not (np.isfinite(b).all() or np.array_equal(np.isfinite(a), np.isfinite(b))):
            return f"output {name!r} has non-finite values where fp32 has none"
        fin = np.isfinite(a) & np.isfinite(b)
        a, b = a[fin], b[fin]
        if "min_cosine" in budget:
            na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
            cos = 1.0 if na == nb == 0 else float(a @ b) / max(na * nb, 1e-300)
            if cos < budget["min_cosine"]:
                return f"output {name!r} cosine similarity {cos:.6f} < {budget['min_cosine']}"
        if "max_rel_error" in budget:
            scale = float(np.max(np.abs(a))) if a.size else 0.0
            rel = float(np.max(np.abs(a - b))) / max(scale, 1e-30) if a.size else 0.0
            if rel > budget["max_rel_error"]:
                return f"output {name!r} relative error {rel:.3g} > {budget['max_rel_error']}"
    return None


def cosine(expected: list[Any], got: list[Any], names: list[str]) -> float:
    """The smallest cosine similarity over the float outputs (1.0 when there are none)."""
    worst = 1.0
    for _, e, g in _float_pairs(expected, got, names):
        if e.dtype.kind in "fcV" and e.shape == g.shape:
            a, b = e.astype(np.float64).ravel(), g.astype(np.float64).ravel()
            na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
            worst = min(worst, 1.0 if na == nb == 0 else float(a @ b) / max(na * nb, 1e-300))
    return worst


# ---------------------------------------------------------------------------------------- timing
def time_candidates(runs: Mapping[str, Callable[[], Any]], budget_s: float = TIME_BUDGET_S,
                    blocks: int = BLOCKS, first_runs: Mapping[str, float] | None = None) -> dict[str, float]:
    """Median seconds per call of each candidate, measured interleaved in blocks.

    A candidate whose first run (``first_runs``, e.g. the check) took over 10x the fastest one's is
    not called again; the others are called up to 3 times to estimate their cost, and one more than 3x slower
    than the best estimate is not measured further (it cannot win): both report their estimate. The
    rest run ``blocks`` rounds in rotated order, each round for about ``budget_s / blocks`` seconds
    per candidate, with a pause between candidates so that ONNX Runtime's spinning threads settle.
    """
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
    """Where decisions live: $HYBRID_CACHE_DIR, else ``hybrid.init(cache_dir=...)``, else the user
    cache folder ($XDG_CACHE_HOME/hybrid, ~/Library/Caches/hybrid, %LOCALAPPDATA%/hybrid/Cache)."""
    from hybrid.config import get_config

    env = os.environ.get("HYBRID_CACHE_DIR")
    if env:
        return Path(env)
    if get_config().cache_dir:
        return Path(get_config().cache_dir)
    system = platform.system()
    if system == "Windows":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
        return base / "hybrid" / "Cache"
    if system == "Darwin":
        return Path.home() / "Library" / "Caches" / "hybrid"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hybrid"


def _cpu_facts() -> tuple[str, str]:
    name, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("", platform.machine(), platform.processor()):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return name, hashlib.sha1(flags.encode()).hexdigest()[:16]


def device_fingerprint() -> dict[str, Any]:
    """What makes timings of this machine comparable: CPU model and features, usable cores,
    thread setting, and every device the backends see."""
    from hybrid.config import get_config
    from hybrid.hal import devices

    cpu, flags = _cpu_facts()
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
