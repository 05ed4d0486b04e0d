"""``CompiledModel``: a model compiled for a target, with validated calls."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hybrid import providers
from hybrid.errors import ConfigError, HybridError, RunError, first_line
from hybrid.hal.layout import ReplicaPool
from hybrid.runtime.validate import InputValidator

if TYPE_CHECKING:
    from hybrid.hal.backend import Executable
    from hybrid.ir import Model, Signature
    from hybrid.runtime.plan import Plan

__all__ = ["CompiledModel", "LiveView", "ServingView"]


def _settle(future: Future[Any], done: Any) -> None:
    """Complete ``future`` with what a finished ``StreamResult`` holds (its device event waited on)."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(done.result())
    except BaseException as e:  # the work's error belongs to its future
        future.set_exception(e)


@dataclass(frozen=True, slots=True)
class ServingView:
    """What serves a model now, as :class:`CompiledModel` reports it (read from a :class:`LiveView` when asked).

    Attributes:
        backend: The backend's name.
        device: Its device.
        options: The candidate's backend options.
        plan: Its plan (with the tuning notes).
        executable: What runs the calls (for the profiler, which profiles that candidate alone).
    """

    backend: str
    device: str
    options: Mapping[str, Any]
    plan: Plan
    executable: Executable | None = None

    @property
    def replicas(self) -> int:
        """Calls that run at once without waiting for each other: the replicas of a layout's pool, else 1.

        A server runs that many batches at once (``hybrid.serve.core.runners``): fewer leave replicas idle, more
        wait inside the pool for a free one.
        """
        return len(self.executable.replicas) if isinstance(self.executable, ReplicaPool) else 1


@runtime_checkable
class LiveView(Protocol):
    """An executable that decides its backend while it serves (``target='auto'`` tuning online).

    What the compiled model reports is read from it, never written into the model from another thread.
    """

    def view(self) -> ServingView:
        """What serves the bucket with the most calls now (the start before any call)."""
        ...

    def serving_for(self, feeds: Mapping[str, Any]) -> ServingView:
        """What serves the shape bucket of ``feeds``, decided first (``tune``) when it is not yet."""
        ...

    def status(self) -> tuple[Any, ...]:
        """The per-bucket tuning records (``cm.tuning``)."""
        ...

    def tune(self, samples: Iterable[Mapping[str, Any]], timeout_s: float | None = None,
             run: Any = None) -> tuple[Any, ...]:
        """Decide the samples' buckets before returning."""
        ...

    def freeze(self) -> tuple[Any, ...]:
        """Stop tuning: what serves each bucket now serves it from now on."""
        ...


class CompiledModel:
    """A model compiled for one target: call it like a function, or ``run`` a dict of inputs.

    Attributes:
        model: The hybrid.Model it was compiled from.
        signature: Inputs and outputs (DESIGN 2.9).
        backend: Backend name ('onnxruntime', ...; 'hybrid' joined with '+' when partitioned). While
            ``target='auto'`` tunes online, each shape bucket may be served by another backend: then this is
            the one serving the bucket with the most calls so far (the start before any call); ``tuning``
            has every bucket's.
        device: Device name (of the same candidate as ``backend``).
        plan: The partition: which nodes run where, printable (of the same candidate, with the tuning notes).
        options: The backend options the executable was built with.
    """

    def __init__(self, model: Model, executable: Executable, plan: Plan, backend: str, device: str,
                 options: Mapping[str, Any] | None = None, target: str = "auto") -> None:
        self.model = model
        self.signature: Signature = model.signature
        self.executable = executable
        self._plan = plan
        self._backend = backend
        self._device = device
        self._options: dict[str, Any] = dict(options or {})
        self._live: LiveView | None = executable if isinstance(executable, LiveView) else None
        self.target = target
        self._validator = InputValidator(self.signature, model)  # index inputs checked against their tables
        self._output_names = self.signature.output_names
        self._exec_run = executable.run
        self._pool: ThreadPoolExecutor | None = None  # submit()'s workers, started by the first submit
        self._pool_workers = 1
        self._pool_lock = threading.Lock()

    # ------------------------------------------------------------------ what serves (read, never pushed)
    @property
    def backend(self) -> str:
        """The backend serving now; under online tuning, the one serving the bucket with the most calls."""
        return self._live.view().backend if self._live is not None else self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        self._backend = value

    @property
    def device(self) -> str:
        """The device of the candidate :attr:`backend` names."""
        return self._live.view().device if self._live is not None else self._device

    @device.setter
    def device(self, value: str) -> None:
        self._device = value

    @property
    def options(self) -> dict[str, Any]:
        """The backend options of the candidate :attr:`backend` names."""
        return dict(self._live.view().options) if self._live is not None else self._options

    @options.setter
    def options(self, value: Mapping[str, Any]) -> None:
        self._options = dict(value)

    @property
    def plan(self) -> Plan:
        """The partition plan of the candidate :attr:`backend` names."""
        return self._live.view().plan if self._live is not None else self._plan

    @plan.setter
    def plan(self, value: Plan) -> None:
        self._plan = value

    @property
    def tunes_online(self) -> bool:
        """Whether ``target='auto'`` decides this model's shape buckets on its calls (:attr:`tuning`)."""
        return self._live is not None

    @property
    def tuning(self) -> tuple[Any, ...]:
        """Per shape bucket, where ``target='auto'``'s online tuning stands.

        Each record is a ``hybrid.runtime.auto.BucketTuning``: bucket, state 'tuning' | 'decided', serving,
        calls, decided_after_calls, decided_after_s, candidates. Empty for a model decided at compile with
        nothing left to confirm.
        """
        return self._live.status() if self._live is not None else ()

    def tune(self, samples: Iterable[Mapping[str, Any]] | Mapping[str, Any], timeout_s: float | None = None
             ) -> tuple[Any, ...]:
        """Decide before serving: call the model on each sample until its shape bucket is decided.

        A sample is a mapping of input name -> array (or pass several); returns :attr:`tuning`. A model with
        nothing to decide runs each sample once (a warm-up, as Triton's ``model_warmup``). A bucket the time bound
        decided with candidates left untimed races them at once, not among the requests that follow: it returns when
        nothing is left to time (or logs what is, at ``timeout_s``).

        Raises:
            RunError: HYB-401..407 for a bad sample, HYB-411 when a bucket is not decided within ``timeout_s``.
        """
        batch = [samples] if isinstance(samples, Mapping) else list(samples)
        checked = [self._validator.feeds(s) for s in batch]
        if self._live is None:
            for feeds in checked:
                self._execute(feeds)
            return ()
        return self._live.tune(checked, timeout_s, run=self._execute)

    def freeze(self) -> tuple[Any, ...]:
        """Stop tuning (``target='auto'``): what serves each shape bucket now serves it from now on.

        A bucket under a race is decided as it stands, no re-check follows, and a shape first called later is served by
        its cached decision or the start, unchecked. Returns :attr:`tuning`; a model that does not tune returns ().
        """
        return self._live.freeze() if self._live is not None else ()

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Run on a mapping of input name -> array; return outputs by name in signature order.

        Raises:
            RunError: HYB-401..407 for bad inputs, HYB-408 when the backend fails.
        """
        return self._execute(self._validator.feeds(feeds))

    def run_checked(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """``run`` for feeds already checked against :attr:`signature` (``InputValidator(sig).feeds``).

        There is no second check: the server validates each request once, then batches and runs it.

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

    def submit(self, feeds: Mapping[str, Any], *, stream: Any = None) -> Future[dict[str, Any]]:
        """Run asynchronously: ``run(feeds)`` on a worker thread; return its ``concurrent.futures.Future``.

        The inputs are checked here, in the caller (a bad request fails at once, not in a callback). The
        future's ``add_done_callback`` is how a harness (LoadGen's system under test, a server) completes a
        request without a thread of its own waiting on it. Work runs on :attr:`submit_workers` threads of
        this model (1 by default: calls in submission order), or, with ``stream=``, queued on that
        ``StreamContext`` behind its other work (the future then completes when the stream runs it).

        Raises:
            RunError: HYB-401..407 for bad inputs, HYB-415 after ``close`` (or on a closed stream). The
                future holds HYB-408 when the backend fails.
        """
        checked = self._validator.feeds(feeds)
        if stream is not None:
            future: Future[dict[str, Any]] = Future()
            stream.submit(self._execute, checked).add_done_callback(lambda done: _settle(future, done))
            return future
        with self._pool_lock:
            if self._pool is None:
                if self._pool_workers == 0:
                    raise RunError("HYB-415", f"{self.model.name!r} is closed; it takes no more work",
                                   "compile the model again")
                self._pool = ThreadPoolExecutor(self._pool_workers, thread_name_prefix=f"hybrid-{self.model.name}")
            return self._pool.submit(self._execute, checked)

    @property
    def submit_workers(self) -> int:
        """Threads :meth:`submit` runs work on (callers at once into the backend); 1 keeps submission order."""
        return self._pool_workers

    @submit_workers.setter
    def submit_workers(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError("HYB-102", f"submit_workers: expected a whole number >= 1, got {value!r}",
                              "e.g. cm.submit_workers = 2")
        with self._pool_lock:  # a new size takes effect on the next submit; queued work finishes where it is
            old, self._pool, self._pool_workers = self._pool, None, value
        if old is not None:
            old.shutdown(wait=False)

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
        """Write a ``.hybrid`` bundle with the model, this machine's compiled caches and its task declarations.

        The bundle format lives above the runtime: this calls ``hybrid.bundle.save_bundle`` through
        :mod:`hybrid.providers` (see there), so the runtime imports nothing of the bundle.
        """
        providers.write_bundle(self, path)

    def close(self) -> None:
        """Finish the work :meth:`submit` queued, then release the backend's native resources."""
        with self._pool_lock:
            pool, self._pool, self._pool_workers = self._pool, None, 0
        if pool is not None:
            pool.shutdown(wait=True)
        self.executable.close()

    def __repr__(self) -> str:
        return f"<hybrid.CompiledModel {self.model.name!r} on {self.backend}:{self.device} {self.signature}>"
