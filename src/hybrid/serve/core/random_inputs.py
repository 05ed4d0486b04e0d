"""Random inputs at a served model's declared shapes: warm-up samples, the idle tuner's, the batch probe's.

Kept apart from :mod:`hybrid.serve.core.warmup` (which reads ``config.pbtxt``'s ``model_warmup``) so that the served
model itself can make them (:class:`hybrid.serve.core.model.ServedModel` probes whether its outputs keep the rows)
without a circle of imports.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from hybrid.errors import ServingError

__all__ = ["Batchable", "random_array", "samples_of_rows"]


class Batchable(Protocol):
    """What random samples are made from: a served model's name, client-visible signature and batch dim."""

    name: str
    signature: Any
    batch_symbol: str | None


def random_array(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values of a dtype: normal floats, small integers (valid indices of most tables), bytes."""
    if dtype == np.dtype(object):
        return np.full(shape, b"warmup", dtype=object)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, 8, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def samples_of_rows(model: Batchable, batch_sizes: list[int], seed: int = 0) -> list[dict[str, np.ndarray]]:
    """One random sample per batch size at the model's declared input shapes (1 for other dynamic dims).

    Raises:
        ServingError: HYB-707 for an input without a declared dtype and shape.
    """
    rng = np.random.default_rng(seed)
    samples = []
    for rows in batch_sizes:
        sample = {}
        for spec in model.signature.inputs:
            if spec.kind != "tensor" or spec.dtype is None or spec.shape is None:
                raise ServingError("HYB-707", f"model {model.name!r}: input {spec.name!r} has no declared dtype and "
                                   "shape to warm up with", "warm it up with model_warmup in config.pbtxt")
            shape = tuple(d if isinstance(d, int) else 1 for d in spec.shape)
            if model.batch_symbol is not None:
                shape = (rows, *shape[1:])
            sample[spec.name] = random_array(spec.dtype, shape, rng)
        samples.append(sample)
    return samples
