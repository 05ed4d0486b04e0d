"""The fallback role, read in one place: the backend that declares itself exact and complete.

A backend declares the role (``Backend.exact_and_complete``; the reference backend does); the runtime,
``target='auto'`` and the partitioner ask these functions instead of comparing names: the fallback
takes only the nodes no other backend runs, comes after every accelerated candidate, and is the
yardstick the others' answers are checked against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from hybrid.errors import BackendError
from hybrid.hal.registry import backend_class, backend_names

__all__ = ["accelerated_first", "fallback_backend", "is_fallback", "split_fallback"]

T = TypeVar("T")


def is_fallback(backend: str) -> bool:
    """Whether backend ``backend`` (a name; for a label ``'name:device'`` pass the name) is a fallback.

    An unknown or unimportable backend is not.
    """
    try:
        return bool(backend_class(backend).exact_and_complete)
    except BackendError:
        return False


def fallback_backend() -> str:
    """The name of the first registered backend that declares itself exact and complete.

    Raises:
        BackendError: HYB-301 when no registered backend declares the role.
    """
    for name in backend_names():
        if is_fallback(name):
            return name
    raise BackendError("HYB-301", "no registered backend declares itself exact and complete (the fallback that "
                       "checks the others)", "reinstall pyasc: its reference backend is the fallback")


def _backend_of(item: Any) -> str:
    return item.backend


def split_fallback(items: Iterable[T], backend_of: Callable[[T], str] = _backend_of) -> tuple[list[T], list[T]]:
    """``(accelerated, fallback)``: the items whose backend is not a fallback, then those whose is, in order.

    Args:
        items: Candidates, trials, anything with a backend.
        backend_of: The item's backend name (default: its ``backend`` attribute).
    """
    accelerated: list[T] = []
    fallback: list[T] = []
    for item in items:
        (fallback if is_fallback(backend_of(item)) else accelerated).append(item)
    return accelerated, fallback


def accelerated_first(items: Iterable[T], backend_of: Callable[[T], str] = _backend_of) -> list[T]:
    """The items with every fallback moved after the accelerated ones (each group in its order)."""
    accelerated, fallback = split_fallback(items, backend_of)
    return accelerated + fallback
