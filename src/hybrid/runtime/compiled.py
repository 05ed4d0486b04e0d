"""``CompiledModel``: a model compiled for a target, with validated calls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hybrid.errors import HybridError, RunError, first_line
from hybrid.runtime.validate import InputValidator

if TYPE_CHECKING:
    from hybrid.hal.backend import Executable
    from hybrid.ir import Model, Signature
    from hybrid.runtime.plan import Plan

__all__ = ["CompiledModel"]


class CompiledModel:
    """A model compiled for one target: call it like a function, or ``run`` a dict of inputs.

    Attributes:
        model: The hybrid.Model it was compiled from.
        signature: Inputs and outputs (DESIGN 2.9).
        backend: Backend name ('onnxruntime', ...; 'hybrid' joined with '+' when partitioned).
        device: Device name.
        plan: The partition: which nodes run where, printable.
        options: The backend options the executable was built with.
    """

    def __init__(self, model: Model, executable: Executable, plan: Plan, backend: str, device: str,
                 options: Mapping[str, Any] | None = None, target: str = "auto") -> None:
        self.model = model
        self.signature: Signature = model.signature
        self.executable = executable
        self.plan = plan
        self.backend = backend
        self.device = device
        self.options: dict[str, Any] = dict(options or {})
        self.target = target
        self._validator = InputValidator(self.signature)
        self._output_names = self.signature.output_names
        self._exec_run = executable.run

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Run on a mapping of input name -> array; return outputs by name in signature order.

        Raises:
            RunError: HYB-401..407 for bad inputs, HYB-408 when the backend fails.
        """
        return self._execute(self._validator.feeds(feeds))

    def run_checked(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """``run`` for feeds already checked against :attr:`signature` (``InputValidator(sig).feeds``): no
        second check (the server validates each request once, then batches and runs it).

        Raises:
            RunError: HYB-408 when the backend fails.
        """
        return self._execute(feeds)

    def _execute(self, feeds: dict[str, Any]) -> dict[str, Any]:
        try:
            outs = self._exec_run(feeds)
        except HybridError:
            raise
        except Exception as e:
            first = first_line(e, 500)
            raise RunError("HYB-408", f"{self.backend} failed running {self.model.name!r} on {self.device}: "
                           f"{first}", "check the inputs' values, or try another target") from e
        return dict(zip(self._output_names, outs))

    def __call__(self, *inputs: Any, stream: Any = None, **named: Any) -> Any:
        """Run with positional inputs (signature order) and/or named ones.

        Returns one array for a one-output model, else a tuple in signature order. With
        ``stream=``, the call is queued on that stream and a result handle returns at once.
        """
        if stream is not None:
            return stream.submit(self._call, inputs, named)
        return self._call(inputs, named)

    def _call(self, inputs: tuple[Any, ...], named: Mapping[str, Any]) -> Any:
        outs = self._execute(self._validator.positional(inputs, named))
        values = tuple(outs.values())
        return values[0] if len(values) == 1 else values

    def task_declarations(self) -> tuple[str, dict[str, Any]] | None:
        """What a bundle must keep to load this model as it is: ``(task, flat task options)``, or None.

        A plain compiled model declares no task; ``hybrid.vision.TaskModel`` returns its pre- and
        postprocessing, which ``save_bundle`` writes to the manifest (so ``save`` needs no override).
        """
        return None

    def save(self, path: str) -> None:
        """Write a ``.hybrid`` bundle with the model, this machine's compiled caches and its task declarations."""
        from hybrid.bundle import save_bundle

        save_bundle(self, path)

    def close(self) -> None:
        """Release the backend's native resources."""
        self.executable.close()

    def __repr__(self) -> str:
        return f"<hybrid.CompiledModel {self.model.name!r} on {self.backend}:{self.device} {self.signature}>"
