"""Checks behind ``compile(target='auto')``: is a candidate's answer right, is a reduced precision good enough.

- fp32 candidates are compared with the reference backend Polygraphy-style: an element is wrong when
  it is off by more than the absolute tolerance *and* by more than ``rtol * |expected|``, with
  tolerances per dtype (:data:`TOLERANCES`), the relative one widened to the model-level ``rtol``
  (ONNX's own model tests use 1e-3: independent fp32 implementations of a deep network differ by
  1e-4 and more, and the reference is one of them). Where the reference answer itself drifts under
  rounding-level input noise (an ill-conditioned output), the absolute tolerance widens to twice
  that drift. Per output, an :class:`OutputRule` overrides the tolerances, allows a fraction of
  mismatching elements (integer outputs: exact by default), or judges a score-like output by
  cosine similarity or top-k agreement instead.

Reduced precisions are held to an accuracy budget instead (:mod:`.accuracy`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybrid.config import config_error
from hybrid.errors import ConfigError

__all__ = [
    "TOLERANCES",
    "Mismatch",
    "OutputRule",
    "Tolerance",
    "compare",
    "cosine_of",
    "deviation",
    "float_pairs",
    "nudged",
    "output_rules",
    "validated",
]

@dataclass(frozen=True, slots=True)
class Tolerance:
    """When an element counts as wrong: its error exceeds both tolerances.

    Its error exceeds ``rtol * |expected|`` *and* the absolute tolerance, ``max(atol, scaled * scale)`` where ``scale``
    is the output's largest magnitude.

    The defaults follow Polygraphy (rtol = atol = 1e-5 for fp32), with ``rtol`` widened for 16-bit
    floats to about one unit in the last place. ``scaled`` lets elements near zero in an output of
    large magnitude differ by the rounding of its largest elements (one ulp of them for fp32/fp64).
    """

    rtol: float
    atol: float
    scaled: float


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-7, 1e-9, 2.0 ** -52),
    "float32": Tolerance(1e-5, 1e-5, 2.0 ** -23),
    "float16": Tolerance(1e-3, 1e-4, 1e-4),
    "bfloat16": Tolerance(1e-2, 1e-3, 1e-3),
    "complex128": Tolerance(1e-7, 1e-9, 2.0 ** -52),
    "complex64": Tolerance(1e-5, 1e-5, 2.0 ** -23),
}
_LOW_PRECISION = Tolerance(0.25, 0.1, 0.1)  # float8 / float4 / int4-in-float formats


@dataclass(frozen=True, slots=True)
class Mismatch:
    """How a candidate's output differs from the expected one."""

    output: str
    detail: str
    values_only: bool = False  # same structure (shapes, dtypes), different values

    def __str__(self) -> str:
        return f"output {self.output!r} {self.detail}"


class OutputRule(BaseModel):
    """How one output is judged, overriding the defaults (``compile(accuracy={'outputs': {name: {...}}})``).

    Attributes:
        rtol: Relative tolerance (None: the dtype's, widened to the model-level rtol).
        atol: Absolute tolerance (None: the dtype's).
        mismatch: Fraction of elements allowed outside the tolerance (integers: differing), 0..1.
        min_cosine: Judge the output by cosine similarity with the expected one instead of elementwise.
        topk: Judge the output's last axis by agreement of its k largest entries (as sets) instead.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    rtol: float | None = Field(None, ge=0.0, description="a number >= 0", examples=[1e-2])
    atol: float | None = Field(None, ge=0.0, description="a number >= 0", examples=[1e-4])
    mismatch: float = Field(0.0, ge=0.0, le=1.0, description="a number in [0, 1]", examples=[0.001])
    min_cosine: float | None = Field(None, ge=0.0, le=1.0, description="a number in [0, 1]", examples=[0.999])
    topk: int | None = Field(None, ge=1, description="an int >= 1", examples=[5])


def validated(model: type[BaseModel], value: Any, section: str) -> Any:
    """``model`` built from ``value`` (a mapping), or the ConfigError (HYB-101/102) naming what is wrong."""
    if not isinstance(value, Mapping):
        example = "{'topk': 5} or {'rtol': 1e-2}" if model is OutputRule else "{'min_cosine': 0.995}"
        raise ConfigError("HYB-102", f"{section}: expected a mapping such as {example}, got {value!r}",
                          "e.g. accuracy={'min_cosine': 0.995}, {'rtol': 1e-2} or {'outputs': {'y': {'topk': 5}}}")
    try:
        return model.model_validate(dict(value))
    except ValidationError as e:
        raise config_error(e, model, section) from None


def output_rules(spec: Mapping[str, Any] | None, names: list[str]) -> dict[str, OutputRule]:
    """Validate ``accuracy['outputs']``: output name -> rule mapping.

    Raises:
        ConfigError: HYB-101 for an unknown key, HYB-102 for an unknown output or a value out of range.
    """
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise ConfigError("HYB-102", f"accuracy.outputs: expected a mapping of output name -> rule, got "
                          f"{type(spec).__name__}", "e.g. accuracy={'outputs': {'scores': {'topk': 5}}}")
    rules = {}
    for name, rule in spec.items():
        if name not in names:
            raise ConfigError("HYB-102", f"accuracy.outputs: the model has no output {name!r}; its outputs: "
                              f"{', '.join(names)}", "name one of the model's outputs")
        rules[name] = validated(OutputRule, rule, f"accuracy.outputs.{name}")
    return rules


def cosine_of(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine similarity of two arrays of one size, in float64 (1.0 when both are all zero)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return 1.0 if na == nb == 0 else float(a @ b) / max(na * nb, 1e-300)


def _judge_by_score(name: str, e: np.ndarray, g: np.ndarray, rule: OutputRule) -> Mismatch | None:
    a, b = e.astype(np.float64), g.astype(np.float64)
    if rule.min_cosine is not None:
        cos = cosine_of(a, b)
        if not cos >= rule.min_cosine:
            return Mismatch(name, f"cosine similarity {cos:.6f} < {rule.min_cosine} (per-output rule)", True)
    if rule.topk is not None and a.ndim:
        k = min(rule.topk, a.shape[-1])
        ta = np.sort(np.argsort(-a.reshape(-1, a.shape[-1]), axis=-1)[:, :k], axis=-1)
        tb = np.sort(np.argsort(-b.reshape(-1, b.shape[-1]), axis=-1)[:, :k], axis=-1)
        rows = int(np.sum(np.any(ta != tb, axis=-1)))
        if rows > rule.mismatch * ta.shape[0]:
            return Mismatch(name, f"top-{k} differs in {rows} of {ta.shape[0]} rows (per-output rule)", True)
    return None


def _tolerance(dtype: np.dtype) -> Tolerance | None:
    if dtype.name in TOLERANCES:
        return TOLERANCES[dtype.name]
    if dtype.kind == "V":
        return _LOW_PRECISION
    return None


def _compare_one(name: str, expected: Any, got: Any, moved: Any = None, rtol: float = 0.0,
                 rule: OutputRule | None = None) -> Mismatch | None:
    if isinstance(expected, (list, tuple)) or isinstance(got, (list, tuple)):
        if not isinstance(got, (list, tuple)) or not isinstance(expected, (list, tuple)):
            return Mismatch(name, f"is a {type(got).__name__}, expected a {type(expected).__name__}")
        if len(got) != len(expected):
            return Mismatch(name, f"has {len(got)} elements, expected {len(expected)}")
        moved_items = moved if isinstance(moved, (list, tuple)) and len(moved) == len(expected) else [None] * len(
            expected)
        for k, (e, g, m) in enumerate(zip(expected, got, moved_items)):
            bad = _compare_one(f"{name}[{k}]", e, g, m, rtol, rule)
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
    rule = rule or OutputRule()
    if tol is None:
        if e.dtype.kind in "OSU":
            equal = np.array_equal(e.astype(object), g.astype(object))
        else:
            # an output the reference itself flips under rounding-level input noise is not exact
            equal = np.array_equal(e, g) or (m is not None and not np.array_equal(e, m))
        if equal:
            return None
        wrong = int(np.sum(e != g)) if e.dtype.kind not in "OSU" else e.size
        if e.dtype.kind not in "OSU" and wrong <= rule.mismatch * e.size:
            return None
        return Mismatch(name, f"differs exactly-compared ({e.dtype}): {wrong} of {e.size} elements", True)
    if rule.min_cosine is not None or rule.topk is not None:
        return _judge_by_score(name, e, g, rule)
    if rule.rtol is not None or rule.atol is not None:
        tol = Tolerance(tol.rtol if rule.rtol is None else rule.rtol, tol.atol if rule.atol is None else rule.atol,
                        tol.scaled if rule.atol is None else 0.0)
    elif e.dtype.kind != "V" and rtol > tol.rtol:
        tol = Tolerance(rtol, tol.atol, tol.scaled)  # model level: independent implementations differ this much
    if e.dtype.kind == "V":
        e, g = e.astype(np.float32), g.astype(np.float32)
        m = None if m is None else m.astype(np.float32)
    wide = np.complex128 if e.dtype.kind == "c" else np.float64
    e64, g64 = e.astype(wide), g.astype(wide)
    both_nan = np.isnan(e64) & np.isnan(g64)
    same_inf = np.isinf(e64) & (e64 == g64)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: judged by same_inf below
        err = np.abs(e64 - g64)
    finite = np.isfinite(e64)
    scale = float(np.max(np.abs(e64[finite]))) if finite.any() else 0.0
    atol = max(tol.atol, tol.scaled * scale)
    drift = 0.0
    if m is not None:
        moved_err = np.abs(m.astype(wide) - e64)
        moved_err = moved_err[np.isfinite(moved_err)]
        drift = float(np.max(moved_err)) if moved_err.size else 0.0
        atol = max(atol, 2 * drift)  # an ill-conditioned output cannot be checked more tightly
    # rtol * |inf| would excuse any value: a non-finite expected element must be matched exactly
    close = np.isfinite(e64) & ((err <= atol) | (err <= tol.rtol * np.abs(e64)))
    bad = ~(both_nan | same_inf | close)
    if not bad.any() or int(bad.sum()) <= rule.mismatch * e.size:
        return None
    errs = np.nan_to_num(np.where(bad, err, 0.0), nan=np.inf)
    worst = int(np.argmax(errs))
    with np.errstate(invalid="ignore", over="ignore"):
        rel = float(err.flat[worst] / max(abs(e64.flat[worst]), 1e-30))
    return Mismatch(name, f"differs at {int(bad.sum())} of {e.size} elements: max abs error "
                    f"{float(errs.flat[worst]):.3g} (got {g64.flat[worst]:.6g}, expected {e64.flat[worst]:.6g}, "
                    f"rel {rel:.3g}; {e.dtype} tolerance rtol {tol.rtol:g}, atol {atol:.3g})", True)


def compare(expected: list[Any], got: list[Any], names: list[str], moved: list[Any] | None = None, *,
            rtol: float = 0.0, rules: Mapping[str, OutputRule] | None = None) -> Mismatch | None:
    """The first output of ``got`` that differs from ``expected`` beyond its tolerance.

    ``rtol`` is the model-level relative tolerance (floats wider than their dtype's default);
    ``rules`` override the judgement per output name. ``moved`` is the expected answer for the
    sample input nudged by rounding-level noise: where it differs from ``expected`` the output is
    ill-conditioned at this sample, and the absolute tolerance of that output widens to twice the drift.
    """
    if len(got) != len(expected):
        return Mismatch("*", f"count is {len(got)}, expected {len(expected)}")
    moved = moved if moved is not None and len(moved) == len(expected) else [None] * len(expected)
    rules = rules or {}
    for name, e, g, m in zip(names, expected, got, moved):
        bad = _compare_one(name, e, g, m, rtol, rules.get(name))
        if bad:
            return bad
    return None


def nudged(samples: Mapping[str, Any], rel: float = 2.0 ** -23, seed: int = 1) -> dict[str, Any] | None:
    """``samples`` with every float input multiplied by (1 + u * rel), u uniform in [-1, 1].

    None when no input is a float (then nothing can drift).
    """
    rng = np.random.default_rng(seed)
    out, any_float = {}, False
    for k, v in samples.items():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
            any_float = True
            v = (v * (1 + rel * rng.uniform(-1, 1, v.shape))).astype(v.dtype)
        out[k] = v
    return out if any_float else None


def float_pairs(expected: list[Any], got: list[Any], names: list[str]) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(name, expected, got) per output as arrays, nested sequences flattened to ``name[k]``."""
    for name, e, g in zip(names, expected, got):
        if isinstance(e, (list, tuple)):
            yield from float_pairs(list(e), list(g), [f"{name}[{k}]" for k in range(len(e))])
            continue
        e, g = np.asarray(e), np.asarray(g)
        yield name, e, g


def deviation(expected: list[Any], got: list[Any], names: list[str]) -> float:
    """How far ``got`` is from ``expected``, in units of the dtype tolerance without its scaled part.

    The largest ``|error| / (atol + rtol * |expected|)`` over the float outputs (0.0: the same numbers). Other outputs
    count 0.0 when equal and infinity when not; so do mismatched shapes. It ranks candidates that all passed
    :func:`compare` by closeness to the reference.
    """
    if len(got) != len(expected):
        return float("inf")
    worst = 0.0
    for _, e, g in float_pairs(expected, got, names):
        if e.shape != g.shape or e.dtype != g.dtype:
            return float("inf")
        tol = _tolerance(e.dtype)
        if tol is None:
            same = np.array_equal(e.astype(object), g.astype(object)) if e.dtype.kind in "OSU" else np.array_equal(e, g)
            if not same:
                return float("inf")
            continue
        if e.dtype.kind == "V":
            e, g = e.astype(np.float32), g.astype(np.float32)
        wide = np.complex128 if e.dtype.kind == "c" else np.float64
        a, b = e.astype(wide), g.astype(wide)
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(a - b)
        agree = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
        err = np.where(agree, 0.0, np.nan_to_num(err, nan=np.inf))
        if err.size:
            worst = max(worst, float(np.max(err / (tol.atol + tol.rtol * np.abs(np.nan_to_num(a))))))
    return worst
