"""A served model: one compiled model, its request checks, and its dynamic batcher.

Each request is checked once (:meth:`ServedModel.check`: names, dtypes, ranks, static dims, Triton's
``max_batch_size``) into a :class:`CheckedRequest` before it queues, so a bad request fails alone and the
batches run with no further check (``CompiledModel.run_checked``). Errors name what the model expects the
way Triton does (``Expected [-1,3,224,224], got [2,3,224,225]``; -1 for a dynamic dim).

A model batches as Triton batches with ``max_batch_size > 0``: when every input and output has a dynamic
first dimension (whatever each names it), that dimension is the batch. The batcher concatenates the
requests of a batch along it (grouped by their other dims), runs the model once per group, and splits the
outputs back by each request's own row count; an output whose first dim is not the group's rows fails its
requests (HYB-413) rather than being sliced. Models with a static batch run each request of a batch in turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from pydantic import Field

from hybrid.config import ConfigSection
from hybrid.errors import ConfigError, HybridError, RunError, ServingError
from hybrid.hal.machine import usable_cores
from hybrid.runtime.validate import InputValidator
from hybrid.serve.core.batch_buffers import BatchBuffers
from hybrid.serve.core.batcher import LoopBatcher, QueueTimeout
from hybrid.serve.core.random_inputs import samples_of_rows
from hybrid.serve.core.runners import RunnerPolicy, Runners
from hybrid.serve.triton.schedule import QueuePolicy, SchedulePolicy
from hybrid.serve.triton.sequences import Sequences, visible_signature

if TYPE_CHECKING:
    from hybrid.runtime.compiled import CompiledModel
    from hybrid.serve.observe.trace import Trace
    from hybrid.serve.triton.sequences import SequenceFlags, SequenceSettings

__all__ = ["BatchSettings", "CheckedRequest", "ServedModel", "Stoppable"]

logger = logging.getLogger("hybrid.serve")


class BatchSettings(ConfigSection):
    """How a model takes requests (checked on construction: HYB-101/102).

    Attributes:
        max_batch: Most requests run in one call of the model; 0 turns batching off (each request runs
            on its own, concurrently, in the server's thread pool).
        batch_timeout: Longest time in seconds a request waits for its batch to fill; a lone request that
            finds the model idle runs at once (what queued while a batch ran goes as soon as the model is
            free; under load an idle model lets its batch fill to what lately came together, within this
            bound: :mod:`hybrid.serve.core.batcher`).
        max_queue: Most requests waiting at once; more get HTTP 503 (HYB-705). None: unbounded.
        request_timeout: Longest time in seconds a request may take in the server; None: no limit.
        concurrency: Batches that may run at the same time; None (the default): as many as the layout serving
            the model has replicas, more while online tuning needs to see the load (:mod:`hybrid.serve.core.runners`).
    """

    max_batch: int = Field(default=8, ge=0, description="an int >= 0", examples=[8])
    batch_timeout: float = Field(default=0.005, ge=0, description="seconds >= 0", examples=[0.005])
    max_queue: int | None = Field(default=256, ge=1, description="an int >= 1 or null", examples=[256])
    request_timeout: float | None = Field(default=60.0, gt=0, description="seconds > 0 or null", examples=[60.0])
    concurrency: int | None = Field(default=None, ge=1, description="an int >= 1", examples=[2])

    def merged(self, overrides: Mapping[str, Any], where: str) -> BatchSettings:
        """A copy with ``overrides`` applied (keys as the attribute names), checked.

        Raises:
            ConfigError: HYB-101 for an unknown key, HYB-102 for a bad value; the message names ``where``.
        """
        try:
            return BatchSettings.model_validate({**self.model_dump(), **dict(overrides)})
        except ConfigError as e:
            raise ConfigError(e.code, f"{where}: {e.message}", e.hint) from None


# callback(model, batch_size, queue_waits_s, run_s) after every batch the model runs
BatchObserver = Callable[["ServedModel", int, list[float], float], None]


class CheckedRequest:
    """One request, checked against its model once (:meth:`ServedModel.check`); it runs with no further check.

    Attributes:
        feeds: Input name -> array, as the model's signature wants them.
        rows: Inferences it holds as Triton counts them (its batch rows when the model batches, else 1).
        enqueued: When it joined its model's queue (``time.monotonic``).
        trace: Its trace when it is traced (:mod:`hybrid.serve.observe.trace`): the queue and the run stamp it.
        sequence: Its sequence parameters (``sequence_id``, ``sequence_start``, ``sequence_end``), if any: a
            model with sequence batching needs them (:mod:`hybrid.serve.triton.sequences`), others ignore them.
        priority: Its ``priority`` parameter (0: none); a model with priority levels queues it at its level
            (:class:`hybrid.serve.triton.schedule.SchedulePolicy`), others ignore it.
    """

    __slots__ = ("enqueued", "feeds", "priority", "rows", "sequence", "trace")

    def __init__(self, feeds: dict[str, np.ndarray], rows: int) -> None:
        self.feeds = feeds
        self.rows = rows
        self.enqueued = 0.0
        self.trace: Trace | None = None
        self.sequence: SequenceFlags | None = None
        self.priority = 0


_Item = CheckedRequest  # what the batcher queues


class _Group:
    """Requests of a batch that run as one call: their positions in the batch and their joined feeds."""

    __slots__ = ("feeds", "idx", "members")

    def __init__(self, idx: list[int], members: list[CheckedRequest], feeds: dict[str, np.ndarray]) -> None:
        self.idx = idx
        self.members = members
        self.feeds = feeds


class _Each(list):  # type: ignore[type-arg]
    """One result per request of a group (its joined run failed, or broke the rows apart)."""


def _aligned(feeds: dict[str, Any]) -> dict[str, Any]:
    """``feeds`` with each array aligned for its datatype: a request's tensors may be views at any byte of its body."""
    if all(not isinstance(v, np.ndarray) or v.flags.aligned for v in feeds.values()):
        return feeds
    return {k: v.copy() if isinstance(v, np.ndarray) and not v.flags.aligned else v for k, v in feeds.items()}


def _stamp_run(trace: Trace, started: float, finished: float, outputs: Any) -> None:
    """Stamp a traced request's run: its batch began at ``started`` and ended at ``finished`` (``time.monotonic``).

    The batch's inputs were joined before it began, on the loop (queue time in the trace); its outputs are the
    request's own rows, split out now.
    """
    trace.stamp_at("COMPUTE_START", started)
    trace.stamp_at("COMPUTE_INPUT_END", started)
    trace.stamp_at("COMPUTE_OUTPUT_START", finished)
    if isinstance(outputs, dict):
        trace.record_tensors("TENSOR_BACKEND_OUTPUT", outputs)
    trace.stamp("INFER_RESPONSE_COMPLETE")
    trace.stamp("COMPUTE_END")


def _as_text(name: str, arr: np.ndarray) -> np.ndarray:
    """BYTES elements (bytes) as the str elements an ONNX string tensor holds (UTF-8)."""
    if arr.size == 0 or not isinstance(arr.flat[0], bytes):
        return arr
    out = np.empty(arr.shape, dtype=object)
    try:
        out.flat[:] = [v.decode("utf-8") if isinstance(v, bytes) else v for v in arr.flat]
    except UnicodeDecodeError as e:
        raise RunError("HYB-403", f"input {name!r}: the model takes text (UTF-8), element bytes are not UTF-8: {e}",
                       "send UTF-8 encoded strings") from None
    return out


def _dims(shape: Any) -> list[int]:
    """A shape as Triton prints it: symbolic or unknown dims are -1."""
    return [d if isinstance(d, int) else -1 for d in shape]


def _batch_symbol(compiled: CompiledModel) -> str | None:
    """The batch dim's name (the first input's), or None when the model cannot batch.

    Triton's rule for ``max_batch_size > 0``: the first dim of every input and output is the batch. So a model
    batches when each of its inputs and outputs is a tensor of known rank whose first dim is dynamic, whatever
    the names (an exporter often names an output's batch dim apart from the input's: 'batch' in, 'N' or
    'unk__0' out). That the sizes agree is checked on each request's inputs and on each run's outputs.
    """
    sig = compiled.signature
    specs = [*sig.inputs, *sig.outputs]
    if not sig.inputs or any(s.kind != "tensor" or not s.shape or isinstance(s.shape[0], int) for s in specs):
        return None
    return str(sig.inputs[0].shape[0])  # type: ignore[index]  # (a known shape, checked above)


def _names_one_batch(compiled: CompiledModel) -> bool:
    """Whether every input and output names its first dim alike: the graph itself says it is one batch."""
    sig = compiled.signature
    return len({s.shape[0] for s in (*sig.inputs, *sig.outputs) if s.shape}) == 1


def _rows_not_kept(model: ServedModel) -> str | None:
    """Why ``model``'s outputs do not keep the rows of its inputs (None when they do at 1 and 2 rows).

    An output whose first dim is named apart from the inputs' may be the batch (an exporter's own name for
    it) or not (the boxes left after NMS); without a configuration that says so, two runs on random inputs
    tell, before any request could be sliced into another request's rows.
    """
    try:
        for rows, sample in zip((1, 2), samples_of_rows(model, [1, 2])):
            outs = model.compiled.run(sample)
            for name, value in outs.items():
                if not np.ndim(value) or len(value) != rows:
                    return f"output {name!r} has shape {np.shape(value)} for an input of {rows} row(s)"
    except HybridError as e:
        return f"random inputs could not run it to check ({e.code}: {e.message[:200]})"
    return None


class Stoppable(Protocol):
    """A background task tied to a served model's life (:meth:`ServedModel.run_beside`)."""

    def stop(self) -> None:
        """Stop, and wait for what is in progress to end (the model is closed after)."""
        ...


class ServedModel:
    """One model version behind the HTTP API.

    Args:
        name: The model's name on the server.
        version: Its version string ('1', '2', ...).
        compiled: The compiled model that runs the requests.
        settings: Batching and queue settings.
        platform: What the model was loaded from ('onnx' or 'hybrid'), reported in metadata.
        observer: Called after each batch (the server's metrics).
        model_config: Triton's ``ModelConfig`` from the folder's ``config.pbtxt`` (:mod:`.triton_config`), if any.
        sequences: Its sequence batching (``config.pbtxt``'s ``sequence_batching``): the requests of a sequence
            run in order with its controls and state (:mod:`hybrid.serve.triton.sequences`); clients see the model
            without the inputs the server feeds.
        schedule: Triton's priority levels and queue policies (``config.pbtxt``'s ``dynamic_batching``), for a
            model from a configuration; None: pyasc's own timeouts.
        runner_policy: When its runners follow the layout serving it (``concurrency`` unset), and when a probe
            runs more (:mod:`hybrid.serve.core.runners`).
    """

    def __init__(self, name: str, version: str, compiled: CompiledModel, settings: BatchSettings,
                 platform: str = "onnx", observer: BatchObserver | None = None, *, model_config: Any = None,
                 sequences: SequenceSettings | None = None, schedule: SchedulePolicy | None = None,
                 runner_policy: RunnerPolicy | None = None) -> None:
        self.name = name
        self.version = version
        self.compiled = compiled
        self.settings = settings
        self.platform = platform
        self.sequences = sequences
        self.signature = visible_signature(compiled.signature, sequences)  # what clients send and get
        self.batch_symbol = _batch_symbol(compiled)
        if (self.batch_symbol is not None and settings.max_batch > 0 and model_config is None and sequences is None
                and not _names_one_batch(compiled)):
            why = _rows_not_kept(self)
            if why is not None:  # Triton would batch it only when a config.pbtxt declares max_batch_size
                logger.warning("model %s:%s is served request by request: its first dims are named apart and %s "
                               "(a config.pbtxt with max_batch_size > 0 batches it as declared)", name, version, why)
                self.batch_symbol = None
        self.observer = observer
        self.model_config = model_config
        self.schedule = schedule  # None: pyasc's own timeouts (a model without a configuration)
        # class labels by output name (config.pbtxt's label_filename): the classification extension's answers
        self.labels: dict[str, tuple[str, ...]] = {}
        self._validator = InputValidator(self.signature, getattr(compiled, "model", None))
        self._specs = {spec.name: spec for spec in self.signature.inputs}
        # string inputs: the protocols carry BYTES elements, the runtimes take str elements (ONNX strings)
        self._text = [s.name for s in self.signature.inputs if s.kind == "tensor" and s.dtype == np.dtype(object)]
        self._max_rows: int | None = None  # Triton's max_batch_size once known (0: no limit); see max_batch_size
        self._output_names = compiled.signature.output_names  # a batch's outputs, states included
        self._visible_outputs = frozenset(s.name for s in self.signature.outputs)  # what a request may ask for
        self._in_flight = 0  # unbatched mode's queue
        self._active = 0  # requests in run() now
        self._last_active = time.monotonic()  # when the last request ended (idle_for)
        self._beside: list[Stoppable] = []  # background tasks stopped when it drains (run_beside)
        self._watchers: tuple[Callable[[dict[str, np.ndarray]], None], ...] = ()  # (watch_requests)
        self._closed = False
        self._batcher: LoopBatcher[CheckedRequest] | None = None
        self._runners = Runners(compiled, f"{name}:{version}", settings.concurrency, usable_cores(), runner_policy)
        self._buffers = BatchBuffers(keep=self._runners.count + 2)  # batches in flight at once, and one ending
        if settings.max_batch > 0:
            self._batcher = LoopBatcher(self._join, self._execute, self._split, max_batch=settings.max_batch,
                                        max_delay=settings.batch_timeout, max_queue=settings.max_queue,
                                        runners=self._runners.count, sizer=self._size_runners,
                                        name=f"{name}:{version}", reorders=schedule is not None and schedule.reorders)
        self._sequences = Sequences(sequences, name, self.max_batch_size > 0) if sequences is not None else None
        if settings.max_batch > 1 and self.batch_symbol is None and _batch_symbol(compiled) is None:
            logger.warning("model %s:%s has an input or output without a dynamic first (batch) dimension; its "
                           "batches run request by request", name, version)

    @property
    def queued(self) -> int:
        """Requests waiting now."""
        return self._batcher.stats().queued if self._batcher else self._in_flight

    def _size_runners(self, waited: bool) -> int:
        """The batcher's sizer: the runners to keep; the free batch blocks kept follow them.

        A probe's one runner per core on a many-core server would otherwise keep that many batches' memory for good.
        """
        count = self._runners.after_batch(waited)
        self._buffers.keep = count + 2
        return count

    @property
    def runners(self) -> int:
        """Batches it runs at once now (``concurrency``, else the replicas of the layout serving it)."""
        return self._runners.count

    def serving_layout(self) -> dict[str, Any]:
        """The layout serving it, its replicas and the runners now (the statistics' and the metrics' words)."""
        return self._runners.report()

    @property
    def ready(self) -> bool:
        """Serving: not closed, and its warm-up (if any) done."""
        return not self._closed and self._warm

    _warm = True  # False while warm_up runs

    def warm_up(self, samples: list[dict[str, np.ndarray]], timeout_s: float | None = None) -> None:
        """Run ``samples`` before serving (Triton's ``model_warmup``, ``pyasc serve --warmup``).

        The model is not ready meanwhile; a model that tunes online (``target='auto'``) decides their shape
        buckets (``CompiledModel.tune``), any other runs each sample once.

        Raises:
            RunError: HYB-401..407 for a sample that does not fit the model; HYB-411 when tuning takes
                longer than ``timeout_s``.
        """
        if not samples:
            return
        self._warm = False
        try:
            requests = [self.check(sample) for sample in samples]
            checked = [r.feeds for r in requests]
            if self._sequences is not None:  # each row a whole sequence: started, ended, from its first state
                checked = [{**r.feeds, **self._sequences.lone_feeds(r.rows)} for r in requests]
            tune = getattr(self.compiled, "tune", None)
            if tune is not None:
                tune(checked, timeout_s=timeout_s)
            else:
                for feeds in checked:
                    self.compiled.run_checked(feeds)
            logger.info("model %s:%s warmed up with %d sample(s)", self.name, self.version, len(samples))
        finally:
            self._warm = True

    def report(self) -> dict[str, Any]:
        """What pyasc adds to Triton's statistics of this model.

        Where it runs, at which precision and with what measured accuracy (the compile's decision), and the
        online tuning's state per shape bucket.
        """
        compiled = self.compiled
        plan = getattr(compiled, "plan", None)
        segments = getattr(plan, "segments", ()) or ()
        notes = tuple(getattr(plan, "notes", ()) or ())
        tuning = getattr(compiled, "tuning", ()) or ()
        return {"target": getattr(compiled, "target", None), "backend": compiled.backend,
                "device": str(getattr(compiled, "device", "")),
                "precision": sorted({str(getattr(seg, "precision", "fp32")) for seg in segments}) or ["fp32"],
                "requested": dict(self.compile_request),
                "accuracy": [n for n in notes if "cosine" in n or "accuracy" in n],
                "tuning": [t.as_dict() for t in tuning], **self.serving_layout()}

    compile_request: Mapping[str, Any] = {}  # the precision and accuracy budget asked for (load_model)

    @property
    def caches_responses(self) -> bool:
        """Whether the model's ``config.pbtxt`` enables Triton's response cache.

        Never with sequence batching: a sequence's answers depend on its state.
        """
        config = getattr(self, "model_config", None)
        return config is not None and config.response_cache.enable and self._sequences is None

    @property
    def max_batch_size(self) -> int:
        """Triton's ``max_batch_size`` of this model (its configuration's): most rows a request may carry.

        0: no limit (the model does not batch).
        """
        if self._max_rows is None:  # as hybrid.serve.triton.config.model_config reports it
            if self.model_config is not None:
                self._max_rows = int(self.model_config.max_batch_size)
            else:
                batched = self.batch_symbol is not None and self.settings.max_batch > 0
                self._max_rows = self.settings.max_batch if batched else 0
        return self._max_rows

    def precheck(self, feeds: Mapping[str, np.ndarray]) -> None:
        """The check of :meth:`check` on a request's declared inputs (placeholder arrays).

        It runs before the request's data is decoded.
        """
        self._checked(feeds)

    def check(self, feeds: Mapping[str, np.ndarray]) -> CheckedRequest:
        """Check one request's inputs against the model, once: the request then runs with no further check.

        Raises:
            RunError: HYB-401..407 naming the input, what the model expects (Triton's dims, -1 dynamic) and
                what came; HYB-405 when a request holds more rows than ``max_batch_size``.
        """
        checked, rows = self._checked(feeds)
        return CheckedRequest(checked, rows)

    def check_outputs(self, names: Iterable[str]) -> None:
        """Check the outputs a request asks for before it runs, as Triton does.

        Raises:
            ServingError: HYB-702 naming the first output the model does not have, in Triton's words.
        """
        known = self._visible_outputs
        for name in names:
            if name not in known:
                raise ServingError("HYB-702", f"unexpected inference output {name!r} for model {self.name!r}",
                                   f"request one of the model's outputs ({', '.join(sorted(known))}), or none for "
                                   "all of them")

    def _checked(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        try:
            checked = self._validator.feeds(feeds)
        except RunError as e:
            raise self._triton_wording(e, feeds) from None
        for name in self._text:
            if name in checked:
                checked[name] = _as_text(name, checked[name])
        rows = 1
        if self.batch_symbol is not None and checked:
            rows = self._rows(checked)
            limit = self._max_rows if self._max_rows is not None else self.max_batch_size
            if limit and rows > limit:
                raise RunError("HYB-405", f"inference request batch-size must be <= {limit} for {self.name!r} "
                               f"(the request has {rows} rows)",
                               f"split the request into requests of at most {limit} rows")
        return checked, rows

    def _rows(self, checked: Mapping[str, np.ndarray]) -> int:
        """A batching request's rows: its inputs' first dim, the same in every input (Triton's batch size).

        Inputs whose batch dims the model names apart are not tied by the validator's named-dim check.
        """
        (first_name, first), *rest = checked.items()
        rows = int(first.shape[0]) if first.ndim else 1
        for name, value in rest:
            if value.ndim and int(value.shape[0]) != rows:
                raise RunError("HYB-405", f"input {name!r} batch size does not match other inputs for {self.name!r}: "
                               f"{int(value.shape[0])} rows, {first_name!r} has {rows}",
                               "send every input with the same first (batch) dimension")
        return rows

    def _triton_wording(self, e: RunError, feeds: Mapping[str, np.ndarray]) -> RunError:
        """A shape or dtype error worded as Triton's, naming the expected dims (-1 for a dynamic one)."""
        from hybrid.serve.tensors import datatype_of

        for name, value in feeds.items():
            spec = self._specs.get(name)
            if spec is None or spec.kind != "tensor" or not isinstance(value, np.ndarray):
                continue
            if e.code == "HYB-403" and spec.dtype is not None and value.dtype != spec.dtype:
                return RunError("HYB-403", f"inference input {name!r} data-type is {datatype_of(value.dtype)!r}, "
                                f"but model {self.name!r} expects {datatype_of(spec.dtype)!r}",
                                f"send {name!r} as {datatype_of(spec.dtype)}")
            if e.code in ("HYB-404", "HYB-405") and spec.shape is not None and name in e.message:
                want = _dims(spec.shape)
                return RunError(e.code, f"unexpected shape for input {name!r} for model {self.name!r}. Expected "
                                f"{str(want).replace(' ', '')}, got {str(list(value.shape)).replace(' ', '')}",
                                "send the shape the model's metadata gives (-1: any size)")
        return e

    async def infer(self, feeds: Mapping[str, np.ndarray], timeout: float | None = None) -> dict[str, np.ndarray]:
        """Check one request's inputs and run it: :meth:`check`, then :meth:`run`."""
        return await self.run(self.check(feeds), timeout)

    async def run(self, request: CheckedRequest, timeout: float | None = None) -> dict[str, np.ndarray]:
        """Run one checked request (in a batch when batching is on), return its outputs.

        Args:
            request: From :meth:`check`.
            timeout: The client's own timeout in seconds. Without a :attr:`schedule` the shorter of it and
                ``request_timeout`` applies; with one (a model from a ``config.pbtxt``), as Triton applies it:
                only to the wait in the queue, where the request's level's policy allows (:class:`QueuePolicy`).

        Raises:
            RunError: HYB-411 past ``request_timeout`` (or the client's timeout), HYB-408 when the backend fails.
            ServingError: HYB-705 when the queue (or the request's priority level) is full, HYB-706 when the model
                is shutting down, HYB-714 past the queue policy's timeout while still queued (``REJECT``).
        """
        limit = self.settings.request_timeout
        level, policy = 0, None
        if self.schedule is not None:
            level = self.schedule.level_of(request.priority)
            policy = self.schedule.policy(level)
        elif timeout is not None and (limit is None or timeout < limit):
            limit = timeout
        if self._closed:
            raise self._closing_error()
        request.enqueued = time.monotonic()
        if request.trace is not None:
            request.trace.stamp_at("QUEUE_START", request.enqueued)
            request.trace.record_tensors("TENSOR_QUEUE_INPUT", request.feeds)
        for watch in self._watchers:
            watch(request.feeds)
        self._active += 1  # on the event loop's thread only; read by the idle tuner (idle_for)
        try:
            if self._sequences is not None:
                return await self._sequences.run(request.sequence, request.rows, request.feeds,
                                                 lambda: self._queue(request, limit))
            return await self._queue(request, limit, level, policy, timeout)
        except QueueTimeout as e:
            raise ServingError("HYB-714", f"Request timeout expired: model {self.name!r} version {self.version}: "
                               f"the request waited {e.seconds:g} s in the queue (its queue policy's timeout)",
                               "retry later, or raise default_timeout_microseconds") from None
        except RunError as e:
            if e.code == "HYB-412":
                full = (f"{self.settings.max_queue} requests" if policy is None or policy.max_queue is None else
                        f"{policy.max_queue} requests of priority level {level}")
                raise ServingError("HYB-705", f"Exceeds maximum queue size: model {self.name!r} version "
                                   f"{self.version}: {full} already queued", "retry later") from e
            if e.code == "HYB-415":
                raise self._closing_error() from e
            raise
        finally:
            self._active -= 1
            self._last_active = time.monotonic()

    async def _queue(self, request: CheckedRequest, limit: float | None, level: int = 0,
                     policy: QueuePolicy | None = None, requested_s: float | None = None) -> dict[str, np.ndarray]:
        if self._batcher is None:  # (Triton's queue policy belongs to its dynamic batcher)
            return await self._infer_alone(request.feeds, limit, request.trace)
        if policy is None:
            return await self._batcher.acall(request, timeout=limit)
        return await self._batcher.acall(request, timeout=limit, queue_timeout=policy.queue_timeout(requested_s),
                                         level=level, max_queued=policy.max_queue, delay=policy.delay)

    def idle_for(self, now: float) -> float | None:
        """Seconds at ``now`` (``time.monotonic()``) since this model's last request ended; None while one runs.

        Before any request it counts from the model's creation. Read from any thread (a heuristic: the
        counters are the event loop's).
        """
        if self._active or self._closed:
            return None
        return max(0.0, now - self._last_active)

    async def _infer_alone(self, feeds: dict[str, np.ndarray], limit: float | None,
                           trace: Trace | None) -> dict[str, np.ndarray]:
        cap = self.settings.max_queue
        if cap is not None and self._in_flight >= cap:
            raise ServingError("HYB-705", f"model {self.name!r} version {self.version}: {cap} requests already "
                               "in flight", "retry later")
        self._in_flight += 1  # only the event loop thread touches the counter
        enqueued = time.monotonic()
        try:
            task = asyncio.get_running_loop().run_in_executor(None, self._run_alone, feeds, enqueued, trace)
            try:
                return await asyncio.wait_for(task, limit)
            except TimeoutError:
                raise RunError("HYB-411", f"model {self.name!r}: no result within {limit} s",
                               "raise the request timeout") from None
        finally:
            self._in_flight -= 1

    def _run_alone(self, feeds: dict[str, np.ndarray], enqueued: float, trace: Trace | None) -> dict[str, np.ndarray]:
        t0 = time.monotonic()
        try:
            out = self.compiled.run_checked(_aligned(feeds))
        except HybridError:
            raise
        except Exception as e:  # HYB-408, as a batch's failure is
            raise self._error_for_one(e, 1) from e
        if self.batch_symbol is not None and self.max_batch_size > 0:  # (config.pbtxt without dynamic_batching)
            error = self._unbatched_output(out, self._rows(feeds), 1)
            if error is not None:
                raise error
        t1 = time.monotonic()
        if self.observer is not None:
            self.observer(self, 1, [t0 - enqueued], t1 - t0)
        if trace is not None:
            _stamp_run(trace, t0, t1, out)
        return out

    # ---------------------------------------------------------------------------------------- batching
    # the batcher's three steps (hybrid.serve.core.batcher): join and split on the event loop, execute in a runner
    # thread, which needs the GIL only to call the model and to post the batch back
    def _join(self, items: list[_Item]) -> list[_Group]:
        """The batch's groups (requests that concatenate: same inputs and inner shapes), each with its feeds.

        A group of several requests is joined into blocks kept from earlier batches (:class:`BatchBuffers`), given
        back when the batch is split.
        """
        job: list[_Group] = []
        try:
            for idx in self._groups(items):
                members = [items[i] for i in idx]
                if len(idx) == 1:
                    job.append(_Group(idx, members, members[0].feeds))
                else:
                    feeds: dict[str, np.ndarray] = {}
                    job.append(_Group(idx, members, feeds))
                    for k in members[0].feeds:
                        feeds[k] = self._buffers.join([m.feeds[k] for m in members])
        except BaseException:
            for group in job:
                self._buffers.give_back(group.feeds.values(), ())
            raise
        return job

    def _execute(self, job: list[_Group]) -> list[dict[str, np.ndarray] | _Each]:
        """Run each group: its outputs, or (when a joined run failed) one result per request."""
        return [self._run_group(group) for group in job]

    def _run_group(self, group: _Group) -> dict[str, np.ndarray] | _Each:
        try:
            outs = self.compiled.run_checked(_aligned(group.feeds))
        except Exception as e:
            return self._isolate(group.members, e)
        if self.batch_symbol is not None:
            error = self._unbatched_output(outs, sum(m.rows for m in group.members), len(group.members))
            if error is not None:
                return _Each([self._error_for_one(error, 1) for _ in group.members])
        return outs

    def _unbatched_output(self, outs: Mapping[str, Any], total: int, requests: int) -> RunError | None:
        """HYB-413 when an output's first dim is not the ``total`` rows of the run (None when every output has them).

        With ``max_batch_size > 0`` every output's first dim is the batch (Triton's rule); an output without the
        batch's rows cannot be given back row by row, and slicing it would hand requests other rows than theirs.
        """
        for name, value in outs.items():
            rows = len(value) if np.ndim(value) else None
            if rows == total:
                continue
            logger.warning("model %s:%s: output %r has %s rows for a batch of %d", self.name, self.version, name,
                           rows, total)
            found = "no batch dimension" if rows is None else f"{rows} rows"
            return RunError("HYB-413", f"model {self.name!r}: output {name!r} has {found} for a batch of {total} "
                            f"rows ({requests} request{'s' if requests > 1 else ''}); with max_batch_size "
                            f"{self.max_batch_size} > 0 the first dim of every output is the batch, as Triton reads it",
                            "if that output's first dim is not the batch, serve the model without batching "
                            "(max_batch_size: 0 in its config.pbtxt, or --max-batch 0); else export it so that "
                            "every output keeps the batch first")
        return None

    def _split(self, items: list[_Item], job: list[_Group], raw: list[Any] | Exception, started: float,
               run_s: float) -> list[dict[str, np.ndarray] | Exception]:
        """Each request's outputs: its rows of its group's outputs (views); the batch ran from ``started``."""
        results: list[dict[str, np.ndarray] | Exception] = [None] * len(items)  # type: ignore[list-item]
        if isinstance(raw, Exception):
            raw = [_Each([self._error_for_one(raw, len(g.members)) for _ in g.members]) for g in job]
        names = self._output_names
        for group, outs in zip(job, raw, strict=True):
            if isinstance(outs, _Each):
                parts: list[Any] = outs
            elif len(group.members) == 1:
                parts = [outs]
            else:
                parts, start = [], 0
                for m in group.members:
                    stop = start + m.rows
                    parts.append({k: outs[k][start:stop] for k in names})
                    start = stop
            for i, part in zip(group.idx, parts, strict=True):
                results[i] = part
                trace = items[i].trace
                if trace is not None:
                    _stamp_run(trace, started, started + run_s, part)
            if len(group.members) > 1:  # its joined feeds go back to be joined into again
                answers = [v for p in parts if isinstance(p, dict) for v in p.values()]
                self._buffers.give_back(group.feeds.values(), answers)
        if self.observer is not None:
            self.observer(self, len(items), [started - item.enqueued for item in items], run_s)
        return results

    def _isolate(self, group: list[_Item], error: Exception) -> _Each:
        """After a joined run failed: run each request alone, so only the requests that fail on their own get an error.

        One bad request must not fail the requests it was batched with.
        """
        if len(group) == 1:
            return _Each([self._error_for_one(error, 1)])
        logger.warning("model %s:%s failed on a batch of %d (%s); running its requests one by one", self.name,
                       self.version, len(group), str(error).splitlines()[0][:200] if str(error) else type(error))
        outs = _Each()
        for item in group:
            try:
                out = self.compiled.run_checked(_aligned(item.feeds))
            except Exception as e:
                outs.append(self._error_for_one(e, 1))
                continue
            unbatched = self._unbatched_output(out, item.rows, 1) if self.batch_symbol is not None else None
            outs.append(out if unbatched is None else unbatched)
        return outs

    def _error_for_one(self, e: Exception, size: int) -> Exception:
        """A fresh error per caller (tracebacks never mix across threads), chained to the batch's own."""
        if isinstance(e, HybridError):
            err = type(e)(e.code, e.message, e.hint)
        else:
            first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            err = RunError("HYB-408", f"model {self.name!r} failed on a batch of {size}: {first}")
        err.__cause__ = e
        return err

    def _groups(self, items: list[_Item]) -> list[list[int]]:
        """Indices of the requests that can be concatenated together (same inputs and inner shapes)."""
        if self.batch_symbol is None:
            return [[i] for i in range(len(items))]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, item in enumerate(items):
            key = tuple((k, v.dtype.str, v.shape[1:]) for k, v in sorted(item.feeds.items()))
            groups.setdefault(key, []).append(i)
        return list(groups.values())

    # ---------------------------------------------------------------------------------------- lifecycle
    def _closing_error(self) -> ServingError:
        return ServingError("HYB-706", f"model {self.name!r} version {self.version} is shutting down",
                            "send the request to another replica")

    def watch_requests(self, watch: Callable[[dict[str, np.ndarray]], None]) -> None:
        """Show ``watch`` every checked request's inputs as it starts to run (on the event loop; keep it cheap).

        The idle tuner learns the shapes of the traffic this way (:meth:`hybrid.serve.core.idle_tuning.IdleTuner.saw`).
        """
        self._watchers = (*self._watchers, watch)

    def run_beside(self, task: Stoppable) -> None:
        """Tie a background task to the model's life: it is stopped first when the model drains or closes.

        (:func:`hybrid.serve.core.idle_tuning.start_idle_tuning` ties its tuner so.)
        """
        self._beside.append(task)

    def drain(self, timeout: float | None = None) -> None:
        """Refuse new requests; run every queued one now (without waiting for batches to fill), then stop."""
        self._closed = True
        for task in self._beside:
            task.stop()
        if self._batcher is not None:
            self._batcher.close(timeout=timeout)

    def close(self) -> None:
        """Drain, then release the backend's resources."""
        self.drain()
        self.compiled.close()

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The v2 model metadata document."""
        from hybrid.serve.core.protocol import tensor_metadata

        sig = self.signature
        return {
            "name": self.name,
            "versions": sorted(versions, key=int),  # lowest first, as Triton lists them
            "platform": self.platform,
            "inputs": [tensor_metadata(s.name, s.dtype, s.shape) for s in sig.inputs],
            "outputs": [tensor_metadata(s.name, s.dtype, s.shape) for s in sig.outputs],
        }

    def __repr__(self) -> str:
        return f"<hybrid.serve model {self.name}:{self.version} {self.signature} max_batch={self.settings.max_batch}>"
