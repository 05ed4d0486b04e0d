"""The two services a lower layer calls and a higher layer provides, installed by the facade.

Imports flow one way (DESIGN 2: ir -> passes -> hal/backends -> runtime -> bundle), yet two calls run
against that flow:

- constant folding (:mod:`hybrid.passes.fold`) evaluates nodes with the reference backend's numpy kernels
  (the one definition of every op hybrid runs, custom ops included), and backends sit above passes;
- ``CompiledModel.save`` (DESIGN 2.9 ``cm.save(path)``) writes a ``.hybrid`` bundle, whose format lives
  above the runtime.

Each caller declares here what it needs (:class:`NodeEvaluator`, :class:`BundleWriter`) and calls it through
:func:`evaluate_node` / :func:`write_bundle`; ``hybrid/__init__.py`` installs the providers
(``hybrid.backends.reference.evaluate.evaluate_node``, ``hybrid.bundle.save_bundle``), each importing its
module on first call. Python runs a package's ``__init__`` before any of its modules, so whichever module a
program imports first, both are in place, and ``import hybrid`` stays light. No module imports another
against the flow, so the import graph has no circle (tests/test_import_graph.py). This module imports
nothing of hybrid's: it sits in the lowest layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir

__all__ = ["BundleWriter", "NodeEvaluator", "evaluate_node", "install", "write_bundle"]


class NodeEvaluator(Protocol):
    """What constant folding calls to compute a node (the reference backend's ``evaluate_node``)."""

    def __call__(self, node: ir.Node, inputs: list[np.ndarray | None]) -> list[np.ndarray | None]:
        """Compute one node's outputs from constant inputs (None for an omitted optional input).

        Raises:
            BackendError: HYB-305 when there is no kernel for the node (folding then tries ONNX's own
                reference evaluator); any other error leaves the node unfolded.
        """
        ...


class BundleWriter(Protocol):
    """What ``CompiledModel.save`` calls to write a bundle (``hybrid.bundle.save_bundle``)."""

    def __call__(self, cm: Any, path: str) -> None:
        """Write compiled model ``cm`` (a ``hybrid.CompiledModel``) as a ``.hybrid`` bundle at ``path``."""
        ...


_evaluator: NodeEvaluator | None = None
_writer: BundleWriter | None = None


def install(*, evaluator: NodeEvaluator, writer: BundleWriter) -> None:
    """Set both providers (``hybrid/__init__.py`` does, once, before any other module of hybrid runs)."""
    global _evaluator, _writer
    _evaluator, _writer = evaluator, writer


def _missing(what: str) -> RuntimeError:
    # an internal invariant, not a bad input: any import of a hybrid module runs hybrid/__init__.py first
    return RuntimeError(f"no {what} is installed; hybrid/__init__.py installs it when hybrid is imported")


def evaluate_node(node: ir.Node, inputs: list[np.ndarray | None]) -> list[np.ndarray | None]:
    """Evaluate ``node`` with the installed :class:`NodeEvaluator` (the reference backend's kernels)."""
    if _evaluator is None:
        raise _missing("node evaluator")
    return _evaluator(node, inputs)


def write_bundle(cm: Any, path: str) -> None:
    """Write ``cm`` as a bundle with the installed :class:`BundleWriter` (``hybrid.bundle.save_bundle``)."""
    if _writer is None:
        raise _missing("bundle writer")
    _writer(cm, path)
