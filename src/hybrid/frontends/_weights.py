"""The torch tensors a jitted callable reads as constants, and whether any changed since its trace.

An export bakes parameters and buffers into the model as initializers, so a later in-place update
(``fc.weight.mul_(2)``, an optimizer step, ``load_state_dict``) or a replaced ``.data`` leaves the
compiled model stale. Each tensor's version counter (bumped by every in-place op) and storage pointer
(changed by ``.data =``) are recorded at trace time and compared on each call: two integer reads per
tensor, no hashing of weights.

The tensors are a module's parameters and buffers (the callable itself, or the module a bound method
belongs to), and for a plain function the modules and tensors its closure and the globals it names
hold, one level deep into nested functions. A submodule replaced by assignment (``net.fc = Linear(...)``)
is not seen: ``cache_clear()`` then.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["WeightWatch"]


class WeightWatch:
    """Snapshots of the tensors a callable reads; :meth:`changed` names those that differ since :meth:`snapshot`."""

    __slots__ = ("_fn", "_state", "_torch")

    def __init__(self, fn: Callable[..., Any], torch: Any) -> None:
        self._fn = fn
        self._torch = torch
        self._state: list[tuple[str, Any, int, int]] = []

    def snapshot(self) -> None:
        """Record every tensor's version and storage now (after a trace)."""
        self._state = [(name, t, _version(t), t.data_ptr()) for name, t in _tensors(self._fn, self._torch)]

    def changed(self) -> list[str]:
        """Names of the tensors changed in place or given new data since the snapshot (empty: none)."""
        return [name for name, t, version, ptr in self._state if _version(t) != version or t.data_ptr() != ptr]


def _version(t: Any) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference-mode tensor keeps no version counter: its storage pointer must do
        return -1


def _tensors(fn: Any, torch: Any) -> Iterator[tuple[str, Any]]:
    seen: set[int] = set()
    for label, obj in _roots(fn, torch):
        if isinstance(obj, torch.nn.Module):
            named = [*obj.named_parameters(remove_duplicate=True), *obj.named_buffers(remove_duplicate=True)]
            items = [(f"{label}.{n}" if label else n, t) for n, t in named]
        else:
            items = [(label, obj)]
        for name, t in items:
            if id(t) not in seen:
                seen.add(id(t))
                yield name, t


def _roots(fn: Any, torch: Any) -> Iterator[tuple[str, Any]]:
    """The modules and tensors ``fn`` reaches: itself, its bound module, its closure and named globals."""
    if isinstance(fn, torch.nn.Module):
        yield "", fn
        return
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        yield "self", owner
    func = getattr(fn, "__func__", fn)
    for code_owner in (func, *_nested_functions(func)):
        yield from _referenced(code_owner, torch)


def _referenced(func: Any, torch: Any) -> Iterator[tuple[str, Any]]:
    code = getattr(func, "__code__", None)
    if code is None:
        return
    cells = getattr(func, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars, cells):
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
        if isinstance(value, (torch.nn.Module, torch.Tensor)):
            yield name, value
    scope = getattr(func, "__globals__", {})
    for name in code.co_names:
        value = scope.get(name)
        if isinstance(value, (torch.nn.Module, torch.Tensor)):
            yield name, value


def _nested_functions(func: Any) -> Iterator[Any]:
    # functions the callable's globals name directly (a helper that calls the model), one level deep
    code = getattr(func, "__code__", None)
    scope = getattr(func, "__globals__", {})
    for name in getattr(code, "co_names", ()):
        value = scope.get(name)
        if isinstance(value, types.FunctionType) and value is not func:
            yield value
