"""Input validation before any backend runs: names, types, dtypes, ranks, dims, and index ranges.

The checks are prepared once per compiled model (one small closure per input) so that a call pays a
few attribute reads per input, well under the 20 µs per call budget. An integer input that indexes a
table of the model (token ids into an embedding) also pays one min and one max: backends disagree on an
index outside its table (ONNX Runtime and torch raise, OpenVINO reads past it), so it is refused here,
alike for every backend (:func:`index_bounds` finds such inputs once, from the graph).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from hybrid.errors import RunError
from hybrid.hal.interop import host_array
from hybrid.ir.signature import UNKNOWN_DIM, Signature, TensorSpec
from hybrid.runtime.index_bounds import IndexBound, index_bounds

if TYPE_CHECKING:
    from hybrid.ir import Model

__all__ = ["IndexBound", "InputValidator", "RequestValidator", "index_bounds", "to_array"]

MAX_PASSED = 1024  # combinations of input shapes remembered as checked (more are checked each call)
_MIN, _MAX = np.minimum.reduce, np.maximum.reduce


def to_array(name: str, value: Any) -> np.ndarray:
    """Return ``value`` as a numpy array, without copying when possible.

    Numpy arrays and scalars, torch CPU tensors and anything with ``__array__`` are accepted.

    Raises:
        RunError: HYB-406 naming the input, for any other value.
    """
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    if hasattr(value, "__array__") and not isinstance(value, (str, bytes, list, tuple, dict)):
        return host_array(value)
    raise RunError("HYB-406", f"input {name!r}: expected a numpy array, got {type(value).__name__}",
                   "wrap the value with numpy.asarray(...) and the dtype the model declares")


def _check_tensor(spec: TensorSpec) -> Callable[[Any, dict[str, int]], np.ndarray]:
    name, dtype, shape = spec.name, spec.dtype, spec.shape
    static = [] if shape is None else [(i, d) for i, d in enumerate(shape) if isinstance(d, int)]
    symbolic = [] if shape is None else [(i, d) for i, d in enumerate(shape)
                                         if isinstance(d, str) and d != UNKNOWN_DIM]
    rank = None if shape is None else len(shape)
    fixed = tuple(shape) if shape is not None and len(static) == len(shape) else None  # every dim static

    def check(value: Any, dims: dict[str, int]) -> np.ndarray:
        arr = value if type(value) is np.ndarray else to_array(name, value)
        if dtype is not None and arr.dtype != dtype:
            raise RunError("HYB-403", f"input {name!r}: expected dtype {dtype}, got {arr.dtype}",
                           f"cast it: x.astype(numpy.{dtype})")
        if fixed is not None and arr.shape == fixed:
            return arr
        if rank is not None:
            if arr.ndim != rank:
                raise RunError("HYB-404", f"input {name!r}: expected rank {rank} {spec.shape}, got rank "
                               f"{arr.ndim} {arr.shape}", "reshape the input to the model's rank")
            got = arr.shape
            for i, d in static:
                if got[i] != d:
                    raise RunError("HYB-405", f"input {name!r}: expected dim {i} to be {d} "
                                   f"(shape {spec.shape}), got {got[i]} (shape {got})",
                                   "resize the input, or make the dimension dynamic with hybrid.optimize")
            for i, sym in symbolic:
                seen = dims.setdefault(sym, got[i])
                if seen != got[i]:
                    raise RunError("HYB-405", f"input {name!r}: dim {i} ({sym!r}) is {got[i]}, but another "
                                   f"input gave {sym!r} = {seen}", "inputs must agree on shared dimensions")
        return arr

    return check


def _check_container(spec: TensorSpec) -> Callable[[Any, dict[str, int]], Any]:
    def check(value: Any, dims: dict[str, int]) -> Any:
        if spec.kind == "sequence" and not isinstance(value, (list, tuple)):
            raise RunError("HYB-406", f"input {spec.name!r}: expected a list of arrays (a sequence), got "
                           f"{type(value).__name__}", "pass a Python list of numpy arrays")
        return value

    return check


def _check_range(name: str, bound: IndexBound, arr: np.ndarray) -> None:
    """Refuse an index outside ``[-size, size)`` of the table it reads: one min and one max of the array."""
    if arr.size == 0:
        return
    size = bound.size
    low, high = _MIN(arr, axis=None), _MAX(arr, axis=None)  # the ufuncs: half the cost of arr.min() on small arrays
    if low >= -size and high < size:
        return
    value = high if high >= size else low
    where = np.unravel_index(int(np.argmax(arr == value)), arr.shape) if arr.ndim else ()
    at = f" at {tuple(int(i) for i in where)}" if arr.ndim else ""
    raise RunError("HYB-418", f"input {name!r} holds {int(value)}{at}, outside the range [-{size}, {size}) of "
                   f"{bound.table} it indexes", f"keep every value of {name!r} in [-{size}, {size}) (the table has "
                   f"{size} rows); for token ids, use the tokenizer that belongs to the model")


class InputValidator:
    """Validates and normalizes feeds for one signature.

    Args:
        signature: The inputs to check feeds against.
        model: The model, when known: its integer inputs that index a table (:func:`index_bounds`) are
            checked against the table's size on every call.
    """

    __slots__ = ("_bounds", "_checks", "_names", "_order", "_passed", "_required")

    def __init__(self, signature: Signature, model: Model | None = None) -> None:
        self._order = [s.name for s in signature.inputs]
        self._names = set(self._order)
        self._checks = {s.name: (_check_tensor(s) if s.kind == "tensor" else _check_container(s))
                        for s in signature.inputs}
        self._required = [s.name for s in signature.inputs if s.kind != "optional"]
        self._passed: set[tuple[Any, ...]] = set()  # (name, dtype, shape) per input of feeds that passed
        # inputs checked by value too (what an index reads is not a function of the shape: never cached)
        found = index_bounds(model) if model is not None else {}
        self._bounds = tuple((name, bound) for name, bound in found.items() if name in self._names)

    def feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Check a name -> value mapping; return the normalized feeds.

        Numpy feeds whose names, dtypes and shapes passed before pass again without the per-input checks (what
        they check is a function of those alone): a model called in a loop pays one lookup.

        Raises:
            RunError: HYB-401..406 naming the input, what was expected and what was given; HYB-418 for an
                index input holding a value outside the table it reads.
        """
        # the usual call (a dict of every input, nothing else) needs no per-key checks
        if type(feeds) is not dict or feeds.keys() != self._names:
            self._check_names(feeds)
            key = None
        else:
            key = tuple([(k, v.dtype, v.shape) if type(v) is np.ndarray else None for k, v in feeds.items()])
            if key in self._passed:
                if self._bounds:
                    self._check_ranges(feeds)
                return dict(feeds)
        dims: dict[str, int] = {}
        checks = self._checks
        out = {k: checks[k](v, dims) for k, v in feeds.items()}
        if self._bounds:
            self._check_ranges(out)
        if key is not None and None not in key and len(self._passed) < MAX_PASSED:
            self._passed.add(key)
        return out

    def _check_ranges(self, feeds: Mapping[str, Any]) -> None:
        # a bounded input's dtype is an integer one (index_bounds) and the checks above held the array to it
        for name, bound in self._bounds:
            value = feeds.get(name)
            if type(value) is np.ndarray:
                _check_range(name, bound, value)

    def _check_names(self, feeds: Any) -> None:
        if not isinstance(feeds, Mapping):
            raise RunError("HYB-406", f"expected a mapping of input name -> array, got "
                           f"{type(feeds).__name__}", "call cm.run({'input': array}) or cm(array)")
        for key in feeds:
            if key not in self._names:
                raise RunError("HYB-402", f"unknown input {key!r}; the model takes: "
                               f"{', '.join(self._order) or 'no inputs'}", "use one of the model's input names")
        for key in self._required:
            if key not in feeds:
                raise RunError("HYB-401", f"missing input {key!r}; the model takes: {', '.join(self._order)}",
                               "pass every input the model declares")

    def positional(self, args: tuple[Any, ...], named: Mapping[str, Any]) -> dict[str, Any]:
        """Map positional then named arguments to inputs in signature order, then validate."""
        if len(args) > len(self._order):
            raise RunError("HYB-407", f"expected at most {len(self._order)} inputs "
                           f"({', '.join(self._order)}), got {len(args)} positional",
                           "pass one array per model input")
        feeds = dict(zip(self._order, args))
        for key, value in named.items():
            if key in feeds:
                raise RunError("HYB-407", f"input {key!r} given both positionally and by name",
                               "pass each input once")
            feeds[key] = value
        return self.feeds(feeds)


class RequestValidator:
    """Checks one request for a model before it joins a batch (``@dynamic_batch(validate=model)``).

    A request is what one caller passes: a mapping of input name -> array, a tuple of arrays in signature
    order, or one array (a one-input model). It may hold whole inputs (with the batch axis: the function
    concatenates) or rows of a batch (without it: the function stacks); a request whose arrays lack the
    leading symbolic dim of their inputs is checked as rows.

    Args:
        signature: The model's inputs.
        model: The model, when known, for its index inputs' ranges (:class:`InputValidator`).
    """

    __slots__ = ("_batched", "_rows", "_specs")

    def __init__(self, signature: Signature, model: Model | None = None) -> None:
        self._batched = InputValidator(signature, model)
        self._specs = {s.name: s for s in signature.inputs}
        rows = tuple(_row_spec(s) for s in signature.inputs)
        leading = any(r is not s for r, s in zip(rows, signature.inputs))
        self._rows = InputValidator(Signature(rows, signature.outputs), model) if leading else None

    def __call__(self, request: Any) -> None:
        """Check ``request``.

        Raises:
            RunError: HYB-401..407 or HYB-418 naming the input, as a call of the model would.
        """
        if isinstance(request, Mapping):
            values = tuple(request.get(name) for name in self._specs)
        else:
            values = request if isinstance(request, tuple) else (request,)
        validator = self._rows if self._rows is not None and self._as_rows(values) else self._batched
        if isinstance(request, Mapping):
            validator.feeds(request)
        else:
            validator.positional(values, {})

    def _as_rows(self, values: tuple[Any, ...]) -> bool:
        """Whether an array lacks its input's leading symbolic dim (one row, to be stacked)."""
        for spec, value in zip(self._specs.values(), values):
            if spec.shape and isinstance(spec.shape[0], str) and getattr(value, "ndim", None) == len(spec.shape) - 1:
                return True
        return False


def _row_spec(spec: TensorSpec) -> TensorSpec:
    """``spec`` as one row of a batch: its leading symbolic dim dropped (the spec itself when it has none)."""
    if spec.kind != "tensor" or not spec.shape or not isinstance(spec.shape[0], str):
        return spec
    return TensorSpec(spec.name, spec.dtype, spec.shape[1:], spec.kind)
