"""Backends defined for tests."""

from __future__ import annotations

from hybrid.hal import Backend


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
