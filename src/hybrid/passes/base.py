"""The pass contract and the pass manager that runs one optimize level to a fixpoint.

A pass is a callable object with a ``name`` and an ``in_place`` flag that takes an ``onnx_ir.Model`` and
returns ``PassResult(model, modified)`` (onnx-ir's own record, so that onnx-ir's passes and ours compose).
Hand-written passes subclass :class:`HybridPass` (an ``onnx_ir.passes.InPlacePass``, which also checks the
in-place promise); passes borrowed from ``onnx_ir.passes.common`` are wrapped by :class:`OnnxIrPass`,
which gives them a name. :class:`PassManager` runs an explicit list of passes, repeats it until no pass
changes the graph (with an iteration cap), verifies the graph after each pass that changed it when asked
to, and turns any failure into ``ModelError('HYB-208')`` that names the pass.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import onnx_ir as ir
from onnx_ir.passes import PassResult

from hybrid.errors import HybridError, ModelError
from hybrid.passes.verify import GraphInvalid, verify_model

__all__ = ["HybridPass", "OnnxIrPass", "Pass", "PassManager", "PassResult", "verify_enabled", "working_copy"]

logger = logging.getLogger("hybrid.passes")

VERIFY_ENV = "HYBRID_VERIFY_PASSES"


@runtime_checkable
class Pass(Protocol):
    """What the pass manager runs."""

    name: str

    @property
    def in_place(self) -> bool:
        """True when the pass edits the model it is given and returns that same object."""
        ...

    def __call__(self, model: ir.Model, /) -> PassResult:
        """Run the pass on ``model``."""
        ...


class HybridPass(ir.passes.InPlacePass):
    """Base of hybrid's hand-written passes: in place, with a stable ``name`` used in errors and configs."""

    name: str = ""

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


class OnnxIrPass:
    """A pass from ``onnx_ir.passes`` under a hybrid name.

    Args:
        name: The name used in level lists, ``disabled_passes`` and HYB-208 errors.
        inner: The onnx-ir pass (or ``onnx_ir.passes.Sequential``) that does the work.
        counts: False for passes whose ``modified`` reports annotations only (shape inference): they
            never keep the fixpoint loop going.
    """

    def __init__(self, name: str, inner: ir.passes.PassBase, *, counts: bool = True) -> None:
        self.name = name
        self.inner = inner
        self.counts = counts

    @property
    def in_place(self) -> bool:
        """Whether the wrapped pass edits the model in place."""
        return self.inner.in_place

    def __call__(self, model: ir.Model, /) -> PassResult:
        """Run the wrapped onnx-ir pass."""
        result = self.inner(model)
        return result if self.counts else PassResult(result.model, False)

    def __repr__(self) -> str:
        return f"<pass {self.name} ({type(self.inner).__name__})>"


def working_copy(model: ir.Model) -> ir.Model:
    """A copy of ``model`` for passes to edit (tensors are shared, never written).

    Raises:
        ModelError: HYB-205 when the graph cannot be copied because it is invalid (a value used but
            defined nowhere, for example).
    """
    try:
        return model.clone()
    except Exception as e:
        cause = e.__cause__ or e
        raise ModelError("HYB-205", f"the model to optimize is not a valid graph: {type(cause).__name__}: "
                         f"{cause}", "fix the model (onnx.checker.check_model says more)") from e


def verify_enabled(flag: bool | None = None) -> bool:
    """Whether to verify the graph after each pass: the explicit flag, else ``HYBRID_VERIFY_PASSES=1``."""
    if flag is not None:
        return flag
    return os.environ.get(VERIFY_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(slots=True)
class PassManager:
    """Run ``passes`` in order, repeated until none of them changes the model.

    Attributes:
        passes: The explicit pass list of one optimize level.
        max_iterations: Cap on the repetitions (a rewrite that undoes another would otherwise loop).
        verify: Check the graph after every pass that changed it (topological order, unique names,
            every use defined); None reads ``HYBRID_VERIFY_PASSES``.
        history: Filled by each call: ``(iteration, pass name)`` for every pass that changed the model.
    """

    passes: Sequence[Pass]
    max_iterations: int = 10
    verify: bool | None = None
    history: list[tuple[int, str]] = field(default_factory=list)

    def __call__(self, model: ir.Model) -> PassResult:
        """Run the passes in order, repeating them until none changes the model (at most ``max_iterations`` rounds)."""
        check = verify_enabled(self.verify)
        self.history = []
        if check:
            self._verify(model, "<input>")
        any_change = False
        for iteration in range(self.max_iterations):
            changed = False
            for pass_ in self.passes:
                result = self._run_one(pass_, model)
                model = result.model
                if result.modified:
                    changed = True
                    self.history.append((iteration, pass_.name))
                    logger.debug("optimize: iteration %d: pass %s changed the model", iteration, pass_.name)
                    if check:
                        self._verify(model, pass_.name)
            any_change = any_change or changed
            if not changed:
                break
        else:
            logger.info("optimize: stopped after %d iterations with the graph still changing",
                        self.max_iterations)
        return PassResult(model, any_change)

    def _run_one(self, pass_: Pass, model: ir.Model) -> PassResult:
        try:
            result = pass_(model)
        except HybridError:
            raise  # already says what went wrong and what to do (HYB-209 from make_batch_dynamic, ...)
        except Exception as e:
            ran = [name for _, name in self.history]
            raise ModelError(
                "HYB-208",
                f"optimization pass {pass_.name!r} failed on graph {model.graph.name!r}: "
                f"{type(e).__name__}: {e} (passes that changed the model before it: {ran or 'none'})",
                f"run with a lower optimize level or add {pass_.name!r} to config['disabled_passes']",
            ) from e
        if not isinstance(result, PassResult):
            raise ModelError("HYB-208", f"optimization pass {pass_.name!r} returned {type(result).__name__}, "
                             "expected a PassResult", "this is a bug in the pass; disable it")
        if pass_.in_place and result.model is not model:
            raise ModelError("HYB-208", f"optimization pass {pass_.name!r} is declared in place but returned "
                             "a new model", "this is a bug in the pass; disable it")
        return result

    def _verify(self, model: ir.Model, after: str) -> None:
        try:
            verify_model(model)
        except GraphInvalid as e:
            if after == "<input>":
                raise ModelError("HYB-205", f"the model to optimize is not a valid graph: {e}",
                                 "fix the model (onnx.checker.check_model says more)") from e
            raise ModelError("HYB-208", f"optimization pass {after!r} produced an invalid graph: {e}",
                             f"run with a lower optimize level or add {after!r} to "
                             "config['disabled_passes']") from e
