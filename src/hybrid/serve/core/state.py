"""What both transports share: the options, the models and metrics, the draining flag, and the one infer path.

The HTTP app (:mod:`hybrid.serve.app`) and the gRPC service (:mod:`hybrid.serve.grpc.server`) sit above
this module and never import each other; the composition root (:mod:`hybrid.serve.server`) starts both.
Every inference request, whatever its transport, goes through :func:`infer`: decoded once by the
transport into arrays, checked once against the model (:meth:`ServedModel.check`), queued and batched,
run with no further check, encoded by the transport; the metrics and Triton's statistics are kept here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from hybrid.errors import ConfigError, HybridError, ServingError
from hybrid.serve.core.protocol import Limits
from hybrid.serve.observe.latency_summary import MetricsConfig
from hybrid.serve.observe.metrics import ServerMetrics
from hybrid.serve.observe.trace import Trace, TraceConfig, Tracer
from hybrid.serve.triton.log_settings import LogSettings
from hybrid.serve.triton.response_cache import ResponseCache
from hybrid.serve.triton.shared_memory import SharedMemoryRegions

if TYPE_CHECKING:
    import numpy as np

    from hybrid.serve.core.model import CheckedRequest, ServedModel
    from hybrid.serve.core.repository import ModelRegistry
    from hybrid.serve.triton.sequences import SequenceFlags

__all__ = ["EXTENSIONS", "Decoded", "ServeOptions", "ServerState", "available_model", "failure_reason", "http_status",
           "infer", "selected_models"]

logger = logging.getLogger("hybrid.serve")

EXTENSIONS = ["classification", "sequence", "binary_tensor_data", "model_configuration", "statistics",
              "model_repository", "schedule_policy", "system_shared_memory", "logging", "trace"]
"""The Triton protocol extensions pyasc serves; a server lists ``sequence``, ``system_shared_memory``, ``logging``
and ``trace`` only where its :class:`ServeOptions` allow them (:attr:`ServerState.extensions`)."""
_STATUS = {"HYB-701": 404, "HYB-702": 400, "HYB-703": 401, "HYB-704": 413, "HYB-705": 503, "HYB-706": 503,
           "HYB-707": 400, "HYB-709": 503, "HYB-711": 400, "HYB-712": 404, "HYB-713": 400, "HYB-714": 503,
           "HYB-715": 400, "HYB-411": 504, "HYB-412": 503, "HYB-414": 503, "HYB-415": 503}
_INPUT_CODES = {*(f"HYB-40{i}" for i in range(1, 8)), "HYB-418"}  # HYB-418: an index outside its table
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Server-wide settings.

    Attributes:
        auth_token: When set, every endpoint but liveness needs ``Authorization: Bearer <token>``.
        limits: Body size (after decompression) and JSON nesting limits.
        drain_timeout: Longest time in seconds the models take to run their queues at shutdown.
        grpc_address: 'host:port' of the gRPC service (port 0: a free one); None: no gRPC.
        model_control: Allow the repository load and unload endpoints (off: HYB-709).
        shared_memory: Take tensors in system shared memory regions of this machine (Triton's extension); off
            where requests may reach another machine's process (replicas on Ray).
        log_settings: Let clients read and change the server's log settings (Triton's logging extension); off
            where a call reaches one replica of several (Ray).
        trace: The trace settings at start-up (Triton's trace extension: ``--trace-config``); None: no trace
            extension (Ray, where a call reaches one replica of several).
        sequences: List Triton's sequence extension (models with sequence batching are served,
            :mod:`hybrid.serve.triton.sequences`); off on Ray, which refuses such models (a sequence's requests could
            reach different replicas).
        response_cache: Bytes of Triton's response cache (``--cache-config local,size=N``) for the models whose
            ``config.pbtxt`` enables it (:mod:`hybrid.serve.triton.response_cache`); 0: no cache.
        metrics_address: 'host:port' where ``GET /metrics`` is answered too, alone (Triton's metrics port, 8002
            there; port 0: a free one); None: on the server's port only.
        repository_poll_s: Triton's poll mode (``--model-control-mode poll``): seconds between two looks at the
            registry's paths, whose models added, changed or removed are loaded, reloaded or unloaded
            (:mod:`hybrid.serve.core.polling`, run by :class:`hybrid.serve.server.HybridServer`); the load and unload
            endpoints are then off (HYB-709). None: no polling.
        metrics: Which of Triton's latency metrics ``/metrics`` exposes (``--metrics-config``: the cumulative
            counters, the summaries; :mod:`hybrid.serve.observe.latency_summary`).
    """

    auth_token: str | None = None
    limits: Limits = field(default_factory=Limits)
    drain_timeout: float = 30.0
    grpc_address: str | None = None
    model_control: bool = False
    shared_memory: bool = True
    log_settings: bool = True
    trace: TraceConfig | None = field(default_factory=TraceConfig)
    sequences: bool = True
    response_cache: int = 0
    metrics_address: str | None = None
    repository_poll_s: float | None = None
    metrics: MetricsConfig = field(default_factory=MetricsConfig)


def http_status(code: str) -> int:
    """The HTTP status of a HybridError code: 400 for bad inputs, 404 unknown model, 503 overload..."""
    if code in _STATUS:
        return _STATUS[code]
    return 400 if code in _INPUT_CODES else 500


class ServerState:
    """What the transports share: the models, the metrics, the options and the draining flag.

    Attributes:
        managed: Set by the composition root (:class:`hybrid.serve.server.HybridServer`) when it starts
            and stops the transports and closes the models itself; otherwise the HTTP app's lifespan does.
        grpc_port: The bound gRPC port once the gRPC service has started.
        shared_memory: The registered system shared memory regions (None where ``options`` turns them off).
        extensions: The Triton extensions this server answers (the server metadata's list).
        log_settings: The log settings clients read and change (Triton's logging extension); None where
            ``options`` turns them off.
        tracer: The trace settings, the sampling of requests and the trace file (Triton's trace extension);
            None where ``options`` turns it off.
    """

    def __init__(self, registry: ModelRegistry, options: ServeOptions) -> None:
        poll = options.repository_poll_s
        if poll is not None and (options.model_control or not poll > 0):
            raise ConfigError("HYB-102", f"repository_poll_s={poll}: polling needs a positive interval and no "
                              "model_control (the poll serves what the repositories hold)",
                              "set repository_poll_s > 0 with model_control off, or repository_poll_s=None")
        self.registry = registry
        self.options = options
        # the response cache of the models that enable it; None without --cache-config
        self.response_cache = ResponseCache(options.response_cache) if options.response_cache else None
        self.metrics = ServerMetrics(registry, self.response_cache, options.metrics)
        for model in registry:
            model.observer = self.metrics.observe_batch
            self.metrics.stats(model)  # Triton lists a loaded model's metrics at 0 before its first request
        # the system shared memory extension's regions; None where the server takes none
        self.shared_memory = SharedMemoryRegions() if options.shared_memory else None
        off = {"system_shared_memory": not options.shared_memory, "logging": not options.log_settings,
               "trace": options.trace is None, "sequence": not options.sequences}
        self.extensions = [e for e in EXTENSIONS if not off.get(e)]
        # the logging extension's view of the ``hybrid`` logger; None where clients may not use it
        self.log_settings = LogSettings() if options.log_settings else None
        self.tracer = Tracer(options.trace) if options.trace is not None else None
        self.draining = False
        self.managed = False
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None  # the bound port of ``options.metrics_address``, once listening
        self._drained = threading.Event()
        self._closed = False

    def check_model_control(self) -> None:
        """Refuse a repository load or unload unless the server takes them.

        Raises:
            ServingError: HYB-709 without model control, or while the server polls its repositories (in
                Triton's words).
        """
        if self.options.repository_poll_s is not None:
            raise ServingError("HYB-709", "explicit model load / unload is not allowed if polling is enabled: the "
                               "server serves what its repositories hold (--model-control-mode poll)",
                               "add, change or remove the model's folder: the next poll serves what it holds")
        if not self.options.model_control:
            raise ServingError("HYB-709", "model control is off: this server does not load or unload models",
                               "start the server with --model-control")

    def begin_drain(self) -> None:
        """Refuse new requests and run every queued one now (in a thread: callable from a signal handler)."""
        if self.draining:
            return
        self.draining = True
        logger.info("draining: no new requests; running the queued ones")

        def drain() -> None:
            try:
                self.registry.drain(self.options.drain_timeout)
            finally:
                self._drained.set()

        threading.Thread(target=drain, name="hybrid-serve-drain", daemon=True).start()

    def close(self) -> None:
        """Drain (if not begun), wait for it, then close the models (once)."""
        self.begin_drain()
        self._drained.wait(self.options.drain_timeout)
        if not self._closed:
            self._closed = True
            self.registry.close()
            if self.shared_memory is not None:
                self.shared_memory.close()
            if self.tracer is not None:
                self.tracer.close()  # after the queued requests ran: their traces are in the file

    def regions(self) -> SharedMemoryRegions:
        """The registered shared memory regions.

        Raises:
            ServingError: HYB-711 where the server takes no shared memory (``ServeOptions.shared_memory``).
        """
        return _served(self.shared_memory, "HYB-711", "this server takes no system shared memory: its requests may "
                       "reach replicas on other machines", "send the tensors in the requests")

    def log_control(self) -> LogSettings:
        """The log settings clients read and change.

        Raises:
            ServingError: HYB-702 where the server does not serve them (``ServeOptions.log_settings``).
        """
        return _served(self.log_settings, "HYB-702", "this server does not serve its log settings: a call reaches "
                       "one of several replicas", "set the log level where the replicas start")

    def trace_control(self) -> Tracer:
        """The trace settings clients read and change.

        Raises:
            ServingError: HYB-702 where the server does not trace (``ServeOptions.trace``).
        """
        return _served(self.tracer, "HYB-702", "this server does not trace requests: a call reaches one of "
                       "several replicas", "trace a server started without --ray")

    def sample(self, model_name: str) -> Trace | None:
        """A trace for a request to ``model_name`` when the trace settings sample it; else None."""
        return None if self.tracer is None else self.tracer.sample(model_name)

    def model(self, name: str, version: str | None) -> ServedModel:
        """The served model, refusing new requests while draining (HYB-706) or for an unknown model (HYB-701)."""
        if self.draining:
            raise ServingError("HYB-706", "the server is shutting down; request refused", "retry on another replica")
        return self.registry.get(name, version)


def _served(part: T | None, code: str, message: str, hint: str) -> T:
    """``part`` of the server's state, or the error saying the server's options leave it out."""
    if part is None:
        raise ServingError(code, message, hint)
    return part


@dataclass(slots=True)
class Decoded(ABC, Generic[T]):
    """A request as its transport decoded it, carrying what its transport needs to encode the answer.

    Each transport subclasses it with the parts of the request its answer needs (the outputs asked for, the
    request id, the shared memory regions) and :meth:`encode`; :func:`infer` runs the model between the two,
    so nothing passes back from the core to the transport but the outputs.

    Attributes:
        inputs: The input arrays.
        timeout_s: The client's own timeout in seconds, if any.
        sequence: Its sequence parameters, if any (a model with sequence batching needs them).
        outputs: The names of the outputs it asks for (none: all of them); checked before the model runs.
        priority: Its ``priority`` parameter (0: none; the model's levels apply it).
    """

    inputs: dict[str, np.ndarray]
    timeout_s: float | None
    sequence: SequenceFlags | None = None
    outputs: tuple[str, ...] = ()
    priority: int = 0

    @abstractmethod
    def encode(self, model: ServedModel, outputs: Mapping[str, np.ndarray]) -> T:
        """The transport's answer carrying ``outputs``, the model's answer to this request."""


_REFUSED = frozenset({"HYB-702", "HYB-705", "HYB-706"})
"""The errors of :meth:`ServedModel.run` raised before a request joins the model's queue (sequence parameters that
do not fit, a full queue, a model shutting down)."""


def failure_reason(error: BaseException) -> str | None:
    """Triton's ``reason`` for a request that failed once :meth:`ServedModel.run` had it.

    None for one it refused before its queue, which Triton counts nowhere (as it counts no request that fails
    its checks).
    """
    if isinstance(error, asyncio.CancelledError):
        return "CANCELED"  # its client went away
    if not isinstance(error, HybridError):
        return "OTHER"
    if error.code in _REFUSED:
        return None
    return "REJECTED" if error.code in ("HYB-411", "HYB-714") else "BACKEND"  # its time ran out; the run failed


async def infer(state: ServerState, model: ServedModel, decode: Callable[[], Awaitable[Decoded[T]] | Decoded[T]],
                trace: Trace | None = None) -> T:
    """The one inference path of both transports.

    Args:
        state: The server's state (metrics).
        model: From :meth:`ServerState.model`.
        decode: The transport's decoding of the request (its own checks before decoding any data); a
            coroutine function or a plain one. Called here, so that its time and its errors count as the
            request's.
        trace: The request's trace (:meth:`ServerState.sample`): stamped here from ``REQUEST_START`` to
            ``REQUEST_END``; the transport stamps its receiving and sending and finishes it.

    Returns:
        The decoded request's :meth:`Decoded.encode` of the model's outputs.

    Raises:
        HybridError: From decoding, the checks, the run or encoding; counted in the metrics by code. Triton's
            statistics count the request only once the model took it (:func:`failure_reason`); once the model
            answered, it is a success there even if encoding fails, as Triton's backend reports it.
    """
    metrics = state.metrics
    key = (model.name, model.version)
    requests, latency = metrics.children(key)
    requests.inc()
    t0 = time.perf_counter()
    ran, reason, rows, cached = False, None, 1, False
    input_s = output_s = 0.0
    try:
        decoded = decode()
        if not isinstance(decoded, Decoded):
            decoded = await decoded
        if trace is not None:
            trace.model_version = model.version
            trace.stamp("REQUEST_START")
        request = model.check(decoded.inputs)
        if decoded.outputs:
            model.check_outputs(decoded.outputs)
        request.trace = trace
        request.sequence = decoded.sequence
        request.priority = decoded.priority
        decoded.inputs = {}  # the request holds the arrays now (views of the body): nothing else keeps them
        rows = request.rows
        t1 = time.perf_counter()
        input_s = t1 - t0
        cache = state.response_cache
        if cache is not None and not model.caches_responses:
            cache = None
        try:
            if cache is None:
                outputs = await model.run(request, decoded.timeout_s)
            else:
                outputs, cached = await _cached_run(state, cache, model, request, decoded.timeout_s)
        except BaseException as e:
            reason = failure_reason(e)
            raise
        ran = True
        del request
        if trace is not None:
            trace.stamp("REQUEST_END")
        t2 = time.perf_counter()
        try:
            return decoded.encode(model, outputs)
        finally:
            output_s = time.perf_counter() - t2
    except HybridError as e:
        metrics.failures.labels(*key, e.code).inc()
        raise
    finally:
        elapsed = time.perf_counter() - t0
        latency.observe(elapsed)
        if ran or reason is not None:
            metrics.request_done(model, ran, elapsed, rows, input_s, output_s, cached, reason or "OTHER")


async def _cached_run(state: ServerState, cache: ResponseCache, model: ServedModel, request: CheckedRequest,
                      timeout_s: float | None) -> tuple[Mapping[str, np.ndarray], bool]:
    """The model's answer from the response cache, or run and kept there; and whether it came from the cache.

    The lookup (and, on a miss, the insertion) is timed into the model's ``cache_hit`` / ``cache_miss``.
    """
    key, found, lookup_s = cache.lookup(model.name, model.version, request.feeds)
    if found is not None:
        state.metrics.cache_lookup(model, True, lookup_s)
        return found, True
    outputs = await model.run(request, timeout_s)
    state.metrics.cache_lookup(model, False, lookup_s + cache.insert(key, outputs))
    return outputs, False


def selected_models(registry: ModelRegistry, name: str | None, version: str | None) -> list[ServedModel]:
    """The models a statistics request names: all, every version of ``name``, or one version.

    Raises:
        ServingError: HYB-715 (400, as Triton answers a statistics request) for a model or version not served,
            in Triton's words; HYB-702 for a malformed name.
    """
    if name is None:
        return list(registry)
    if version is not None:
        return [available_model(registry, name, version,
                                f"requested model version is not available for model '{name}'")]
    available_model(registry, name, None, f"requested model '{name}' is not available")
    return [registry.get(name, v) for v in registry.versions(name)]


def available_model(registry: ModelRegistry, name: str, version: str | None, says: str) -> ServedModel:
    """The model ``name`` at ``version`` for a readiness or statistics request.

    Triton answers these for a model or version it does not serve with 400 / INVALID_ARGUMENT rather than the
    404 of metadata and inference.

    Raises:
        ServingError: HYB-715 whose message begins with ``says`` (Triton's words) and goes on with what is served;
            HYB-702 for a malformed name or version.
    """
    try:
        return registry.get(name, version)
    except ServingError as e:
        if e.code != "HYB-701":
            raise
        raise ServingError("HYB-715", f"{says}: {e.message}", e.hint) from None


def statistics_of(state: ServerState, models: list[ServedModel]) -> list[Any]:
    """Triton's ``ModelStatistics`` messages of ``models``."""
    return [state.metrics.stats(m).to_proto() for m in models]
