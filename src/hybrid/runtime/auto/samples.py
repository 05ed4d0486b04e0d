"""Sample inputs for the checks and timings of auto-selection, the benchmark and the profiler.

One generator for every consumer, so that ``pyasc bench``, ``pyasc profile`` and ``compile(target=
'auto')`` judge a backend on the same kind of data. Values are chosen to be valid for what the
input feeds: integer inputs that index a constant table (token ids) stay inside it, masks are ones,
other integers are small valid sizes; floats follow a *style* so that a model that rejects one kind of
value can be sampled with another. Shapes come from ``shapes=`` (see :mod:`.shapes`) or, for
symbolic dims nobody declared, ``symbolic_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hybrid.runtime.validate import InputValidator

__all__ = ["SAMPLE_STYLES", "make_samples"]

SAMPLE_STYLES = 4


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


def make_samples(model: Any, given: Any = None, seed: int = 0, symbolic_size: int = 1, style: int = 0,
                 magnitude: float = 1.0, int_high: int | None = None,
                 shapes: Mapping[str, tuple[int, ...] | None] | None = None) -> dict[str, Any] | None:
    """Sample inputs for the checks and timings: ``given`` validated, or generated from the signature.

    ``shapes`` gives the concrete shape of any input (see :func:`.shapes.concrete_shapes`); other
    symbolic dims are ``symbolic_size``. Integer inputs that index a constant table (token ids) stay
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
        if spec.kind != "tensor" or spec.dtype is None or (spec.shape is None and spec.name not in (shapes or {})):
            return None
        declared = (shapes or {}).get(spec.name)
        shape = declared if declared is not None else tuple(
            d if isinstance(d, int) and d >= 0 else symbolic_size for d in spec.shape)
        dt = np.dtype(spec.dtype)
        if dt.kind in "fcV":
            real = rng.standard_normal if style in (0, 3) else rng.random
            arr = real(shape) * magnitude
            if dt.kind == "c":
                arr = arr + 1j * real(shape)
            arr = arr.astype(np.float32).astype(dt) if dt.kind == "V" else arr.astype(dt)
        elif dt.kind in "iu":
            lo, hi = (0, 1 if style == 2 else bounds[spec.name]) if spec.name in bounds else int_range
            if "mask" in spec.name.lower() and spec.name not in bounds and style in (0, 1):
                lo, hi = 1, 2  # attention masks: attend everywhere
            arr = rng.integers(lo, hi, size=shape).astype(dt)
        elif dt.kind == "b":
            arr = rng.random(shape) < 0.5
        else:
            return None
        feeds[spec.name] = arr
    return feeds


