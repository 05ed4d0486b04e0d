"""Triton's classification extension: an output answered as its top classes instead of its values.

A request asks for it per output (HTTP: ``outputs[i].parameters.classification: K``; gRPC: the output's
``parameters["classification"].int64_param``; tritonclient: ``InferRequestedOutput(name, class_count=K)``).
The output then comes back as a BYTES tensor of strings ``"value:index"``, or ``"value:index:label"`` where
the model's configuration names a label file for that output (``label_filename`` in ``config.pbtxt``, one
label per line, line i for class i). The classes are in descending order of value; equal values keep
ascending index order. As in Triton:

- a model that batches (``max_batch_size > 0``) is classified row by row: shape ``[batch, min(K, n)]``,
  with ``n`` the elements of one row;
- a model that does not batch is classified over the whole tensor, flattened: shape ``[min(K, n)]``;
- K = 0 asks for the output's values, as if no classification were asked for;
- values print as C's ``%f`` (floating point) or ``%d`` (integers).

Unlike Triton 2.51, a value that is not a non-negative integer is a 400 (HYB-702) over HTTP too, and a BYTES
or BOOL output is refused with HYB-702 rather than ending the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hybrid.errors import ServingError

__all__ = ["CLASSIFICATION", "class_count", "top_classes"]

CLASSIFICATION = "classification"
"""The output parameter that asks for the top classes."""

_HINT = "ask for K >= 0 classes, e.g. tritonclient's InferRequestedOutput(name, class_count=3)"


def class_count(name: str, value: Any) -> int:
    """The K of an output's ``classification`` parameter (a JSON value), checked.

    Raises:
        ServingError: HYB-702 when ``value`` is not a non-negative integer.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ServingError("HYB-702", f"output {name!r}: 'classification' must be a non-negative integer, got "
                                      f"{value!r}", _HINT)
    return value


def _text(value: Any, floating: bool) -> str:
    return f"{float(value):f}" if floating else str(int(value))


def top_classes(name: str, arr: np.ndarray, count: int, *, batched: bool,
                labels: Sequence[str] = ()) -> np.ndarray:
    """The ``count`` largest classes of an output as Triton's classification strings (a BYTES array).

    Args:
        name: The output's name (for messages).
        arr: The output's values (the batch first where ``batched``).
        count: How many classes (K); fewer where the output has fewer elements per row.
        batched: Classify each row of the first dimension (a model with ``max_batch_size > 0``); otherwise
            the whole tensor.
        labels: Label of class i at position i; a class past the end has none.

    Returns:
        An object array of ``bytes``, shape ``[rows, k]`` when batched, else ``[k]``.

    Raises:
        ServingError: HYB-702 for an output that is not numeric (BOOL, BYTES).
    """
    arr = np.asarray(arr)
    floating = arr.dtype.kind == "f" or arr.dtype.name == "bfloat16"
    if not (floating or arr.dtype.kind in "iu"):
        raise ServingError("HYB-702", f"output {name!r} holds {arr.dtype} values: the classification extension "
                                      "needs numbers", f"request {name!r} without 'classification'")
    rows = arr.reshape(arr.shape[0] if batched and arr.ndim else 1, -1)
    if floating:
        rows = rows.astype(np.float64)
    n = rows.shape[1]
    k = min(count, n)
    # descending by value, ties by ascending index: a stable ascending sort of each row reversed, mapped back
    order = (n - 1) - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1][:, :k]
    values = np.take_along_axis(rows, order, axis=1)
    out = np.empty(order.shape, dtype=object)
    for r in range(order.shape[0]):
        for j in range(k):
            i = int(order[r, j])
            text = f"{_text(values[r, j], floating)}:{i}"
            out[r, j] = (f"{text}:{labels[i]}" if i < len(labels) else text).encode("utf-8")
    return out if batched and arr.ndim else out.reshape(k)
