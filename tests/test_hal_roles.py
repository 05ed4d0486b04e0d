"""The fallback role is the backend's own declaration (``Backend.exact_and_complete``), read by hybrid.hal.

The runtime, ``target='auto'`` and the partitioner ask :func:`hybrid.hal.is_fallback` (or
``fallback_backend`` / ``split_fallback``); none compares a backend's name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests._backends import registered

import hybrid
from hybrid.hal import (
    Backend,
    Candidate,
    accelerated_first,
    backend_class,
    fallback_backend,
    is_fallback,
    split_fallback,
)

SRC = Path(hybrid.__file__).parent
# modules being rewritten by another change still read the old name; each leaves this set when switched
PENDING: set[str] = set()  # files still naming the fallback (none left)


class ExactBackend(Backend):
    """A third-party backend that declares the fallback role."""

    name = "exact_test"
    exact_and_complete = True

    def _probe(self):
        return []

    def version(self):
        return "0"

    def _compile(self, model, device, options):
        raise AssertionError("never compiled")


@pytest.fixture
def exact():
    yield from registered(ExactBackend)


def test_the_reference_backend_declares_the_role():
    assert backend_class("reference").exact_and_complete and fallback_backend() == "reference"
    assert is_fallback("reference") and not is_fallback("onnxruntime") and not is_fallback("no-such-backend")
    assert Backend.exact_and_complete is False  # a backend is accelerated unless it says otherwise


def test_a_backend_that_declares_the_role_is_a_fallback(exact):
    order = [Candidate("exact_test", "cpu"), Candidate("reference", "cpu"), Candidate("onnxruntime", "cpu"),
             Candidate("openvino", "cpu")]
    accelerated, fallback = split_fallback(order)
    assert accelerated == order[2:] and fallback == order[:2]
    assert accelerated_first(order) == order[2:] + order[:2]
    assert split_fallback(["reference:cpu", "onnxruntime:cpu"], lambda s: s.partition(":")[0]) == \
        (["onnxruntime:cpu"], ["reference:cpu"])
    assert fallback_backend() == "reference"  # the first registered that declares it


def _names_the_fallback(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name) and node.id in ("FALLBACK_BACKEND", "REFERENCE"):
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value == "reference"
                                                   for c in (node.left, *node.comparators)):
            found.append(f"line {node.lineno}: == 'reference'")
    return found


@pytest.mark.parametrize("package", ["runtime", "bundle", "serve"])
def test_no_module_compares_the_fallback_by_name(package):
    named = {}
    for path in sorted((SRC / package).rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel not in PENDING and (hits := _names_the_fallback(path)):
            named[rel] = hits
    assert not named, f"ask hybrid.hal.is_fallback / fallback_backend instead: {named}"
