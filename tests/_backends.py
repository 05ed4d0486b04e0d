"""Backends defined for tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hybrid.hal import Backend, register_backend, reset_discovery


class BrokenBackend(Backend):
    """A backend whose library is missing: discovery must record why, never raise."""

    name = "broken"
    install_hint = "pip install broken-runtime"

    def _probe(self):
        raise ImportError("No module named 'broken_runtime'")

    def version(self):
        return "0"

    def _compile(self, model, device, options):
        raise AssertionError("never compiled")


def registered(cls: type[Backend]) -> Iterator[None]:
    """Register backend class ``cls`` for one test, then forget it (use with ``yield from`` in a fixture)."""
    register_backend(cls)
    try:
        yield
    finally:  # a failing test must not leave its backend registered for the tests after it
        from hybrid.hal import registry

        registry._paths.pop(cls.name, None)
        registry._classes.pop(cls.name, None)
        reset_discovery()


backend_registered = contextlib.contextmanager(registered)  # ``with backend_registered(cls): ...``
