"""Calibration data.

Any iterable of samples, checked against the model and split into calibration and held-back evaluation samples.

A sample is a dict ``{input_name: array}``, one array or tensor (one-input models), or a tuple/list
with one array per input in signature order; extra trailing items are dropped, so the ``(x, label)``
batches of a classification DataLoader work as they are. torch tensors become numpy arrays.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid.errors import QuantizationError
from hybrid.ir.signature import Signature, TensorSpec

__all__ = ["Samples", "collect", "progress", "synthetic"]

Feed = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class Samples:
    """The samples one quantization uses.

    Attributes:
        calibration: Samples the calibrator sees (static mode).
        evaluation: Samples held back for the accuracy report and the sensitivity analysis.
        source: How ``evaluation`` relates to calibration: 'held-out', 'calibration' (too few
            samples to hold any back), 'dataset' (dynamic mode: nothing is calibrated) or 'synthetic'.
    """

    calibration: tuple[Feed, ...]
    evaluation: tuple[Feed, ...]
    source: str


def collect(dataset: Iterable[Any], signature: Signature, *, n_calibration: int, n_eval: int,
            need_calibration: bool) -> Samples:
    """Read up to ``n_calibration + n_eval`` samples, check them, and split them.

    When the dataset has fewer, about a fifth (at least one) is held back; one sample serves both.

    Raises:
        QuantizationError: HYB-602 (no samples), HYB-603 (a sample does not match the model),
            HYB-604 (NaN or Inf), each naming the sample's index.
    """
    wanted = (n_calibration + n_eval) if need_calibration else n_eval
    try:
        iterator = iter(dataset)
    except TypeError as e:
        raise QuantizationError("HYB-601", f"calibration_dataset: expected an iterable, got {type(dataset).__name__}",
                                "pass a list of arrays or dicts, or a torch DataLoader") from e
    feeds = [normalize(s, i, signature) for i, s in enumerate(itertools.islice(iterator, wanted))]
    if not feeds:
        raise QuantizationError("HYB-602", "calibration_dataset yielded no samples; at least one is needed",
                                "check that the iterable is not exhausted (a generator can be read once)")
    if not need_calibration:
        return Samples((), tuple(feeds), "dataset")
    if len(feeds) == 1:
        return Samples(tuple(feeds), tuple(feeds), "calibration")
    held = n_eval if len(feeds) == wanted else max(1, len(feeds) // 5)
    return Samples(tuple(feeds[:-held]), tuple(feeds[-held:]), "held-out")


def normalize(sample: Any, index: int, signature: Signature) -> Feed:
    """One sample as ``{input_name: array}`` with the model's dtypes, or a 6xx error naming it."""
    inputs = signature.inputs
    names = [s.name for s in inputs]
    if isinstance(sample, Mapping):
        unknown = [k for k in sample if k not in names]
        missing = [n for n in names if n not in sample]
        if unknown or missing:
            raise QuantizationError("HYB-603", f"calibration sample {index}: the model takes inputs {names}; the "
                                    f"sample has unknown {unknown} and lacks {missing}",
                                    "name the sample's keys after the model's inputs")
        values = [sample[n] for n in names]
    elif isinstance(sample, (tuple, list)):
        if len(sample) < len(inputs):
            raise QuantizationError("HYB-603", f"calibration sample {index}: expected {len(inputs)} arrays (for "
                                    f"{names}), got a {type(sample).__name__} of {len(sample)}",
                                    "give one array per model input, in signature order, or a dict")
        values = list(sample[: len(inputs)])
    else:
        if len(inputs) != 1:
            raise QuantizationError("HYB-603", f"calibration sample {index}: one array given, but the model takes "
                                    f"{len(inputs)} inputs {names}", "give a dict {input_name: array} per sample")
        values = [sample]
    return {spec.name: _check(spec, value, index) for spec, value in zip(inputs, values)}


def _to_numpy(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return value


def _check(spec: TensorSpec, value: Any, index: int) -> np.ndarray:
    where = f"calibration sample {index}, input {spec.name!r}"
    arr = _to_numpy(value)
    if not isinstance(arr, np.ndarray):
        try:
            arr = np.asarray(arr)
        except Exception as e:
            raise QuantizationError("HYB-603", f"{where}: expected an array, got {type(value).__name__}") from e
        if arr.dtype == object:
            raise QuantizationError("HYB-603", f"{where}: expected an array, got {type(value).__name__}")
    want = spec.dtype
    if want is not None and arr.dtype != want:
        same_kind = (arr.dtype.kind == want.kind) or (arr.dtype.kind in "iu" and want.kind in "iu")
        if not same_kind:
            raise QuantizationError("HYB-603", f"{where}: expected dtype {want}, got {arr.dtype}",
                                    f"convert the sample to {want}")
        arr = arr.astype(want)
    if spec.shape is not None:
        if arr.ndim != len(spec.shape):
            raise QuantizationError("HYB-603", f"{where}: expected rank {len(spec.shape)} {spec.shape}, got shape "
                                    f"{arr.shape}", "batch samples the way the model's input is shaped")
        for axis, (dim, got) in enumerate(zip(spec.shape, arr.shape)):
            if isinstance(dim, int) and dim != got:
                raise QuantizationError("HYB-603", f"{where}: expected shape {spec.shape}, got {arr.shape} "
                                        f"(axis {axis})", "resize the sample to the model's input shape")
    if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
        bad = int(np.size(arr) - np.isfinite(arr).sum())
        raise QuantizationError("HYB-604", f"{where}: {bad} NaN or Inf values", "clean or drop that sample")
    return np.ascontiguousarray(arr)


def synthetic(signature: Signature, n: int, seed: int = 0) -> tuple[Feed, ...]:
    """Inputs made up from the signature when no dataset is given (dynamic mode's accuracy report).

    Standard-normal floats, zeros for integers, ones for booleans; symbolic dims are 1 (batch) or 8.
    """
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(n):
        feed = {}
        for spec in signature.inputs:
            if spec.shape is None or spec.dtype is None:
                return ()
            shape = tuple(d if isinstance(d, int) else (1 if i == 0 else 8)
                          for i, d in enumerate(spec.shape))
            if spec.dtype.kind == "f":
                feed[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
            elif spec.dtype.kind == "b":
                feed[spec.name] = np.ones(shape, spec.dtype)
            else:
                feed[spec.name] = np.zeros(shape, spec.dtype)
        feeds.append(feed)
    return tuple(feeds)


@contextmanager
def progress(description: str, total: int, enabled: bool | None) -> Iterator[Any]:
    """A rich progress bar on a terminal (``advance()`` per step); silent when not a TTY."""
    show = enabled if enabled is not None else sys.stderr.isatty()
    if not show or total <= 0:
        yield _NoProgress()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # stderr, like logging: stdout stays the program's own
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield _Bar(bar, task)


class _NoProgress:
    def advance(self, n: int = 1) -> None:
        pass


class _Bar:
    def __init__(self, bar: Any, task: Any) -> None:
        self._bar, self._task = bar, task

    def advance(self, n: int = 1) -> None:
        self._bar.advance(self._task, n)
