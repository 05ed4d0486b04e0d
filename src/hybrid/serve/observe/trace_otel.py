"""OpenTelemetry mode of the trace extension: each traced request as spans, exported over OTLP/HTTP.

``pyasc serve --trace-config mode=opentelemetry --trace-config level=TIMESTAMPS`` exports the requests it samples
(:class:`hybrid.serve.observe.trace.Tracer`: one of every ``rate``, ``count`` at most) as Triton 2.51 lays them out,
three spans of kind ``SERVER`` per request:

==================  ===================================================================================
``InferRequest``    the transport's part: ``HTTP_RECV_START`` / ``_END`` or ``GRPC_WAITREAD_END``,
                    ``INFER_RESPONSE_COMPLETE``, ``HTTP_SEND_*`` or ``GRPC_SEND_*`` as its events. A child of
                    the client's span where the request carries a W3C ``traceparent`` (HTTP header or
                    gRPC metadata), a new trace otherwise.
the model's name    ``REQUEST_START``, ``QUEUE_START``, ``REQUEST_END``; attributes ``triton.model_name``,
                    ``triton.model_version``, ``triton.trace_id`` (the trace's number), ``triton.trace_parent_id``
                    (0) and, where the client sent one, ``triton.request_id``
``compute``         ``COMPUTE_START``, ``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START``, ``COMPUTE_END`` (the
                    batch that carried the request)
==================  ===================================================================================

Each span runs from its first event to its last. At a level without ``TIMESTAMPS`` (``TENSORS`` alone) only the
``InferRequest`` span is exported, without events, as Triton does (neither exports tensors in this mode). The
spans are built as the OpenTelemetry SDK's read-only spans (they are born finished: the timestamps are taken as the
request goes, the spans made after it) and exported by the SDK's batch span processor (``bsp_*`` settings) through
its OTLP/HTTP exporter (protobuf; Triton's C++ exporter sends OTLP JSON, which collectors take alike). The
resource is the SDK's (``telemetry.sdk.*``, ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` are read)
with ``service.name`` ``pyasc`` unless the environment or ``--trace-config opentelemetry,resource=...`` names it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from hybrid._version import __version__
from hybrid.errors import ModelError

__all__ = ["COMPUTE_EVENTS", "MODEL_EVENTS", "SERVICE_NAME", "ExportSettings", "FinishedTrace", "SpanExport",
           "endpoint"]

SERVICE_NAME = "pyasc"
"""The service name of the exported spans unless the environment or a ``resource`` setting names another."""
MODEL_EVENTS = frozenset({"REQUEST_START", "QUEUE_START", "REQUEST_END"})
COMPUTE_EVENTS = frozenset({"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"})
logger = logging.getLogger("hybrid.serve")

_EXPORT_TIMEOUT_S = 10.0  # one OTLP request; an unreachable collector delays the server's stop by at most this


class ExportSettings(Protocol):
    """The exporter's settings (:class:`hybrid.serve.observe.trace.TraceConfig` in OpenTelemetry mode)."""

    url: str
    resource: tuple[str, ...]
    bsp_schedule_delay: int
    bsp_max_export_batch_size: int
    bsp_max_queue_size: int


class FinishedTrace(Protocol):
    """What a finished request's trace tells (:class:`hybrid.serve.observe.trace.Trace`).

    This module does not import the trace module: that one imports this.
    """

    id: int
    model_name: str
    model_version: str | None
    request_id: str
    timestamps: bool
    carrier: dict[str, str] | None

    def stamps(self) -> list[tuple[str, int]]:
        """The timestamps: (name, nanoseconds of the tracer's clock), in the order recorded."""


def endpoint(url: str) -> str:
    """The OTLP/HTTP endpoint of a ``url`` setting: Triton's ``host:port/path`` gets ``http://``."""
    return url if "://" in url else f"http://{url}"


class SpanExport:
    """The spans of finished traces, handed to an OpenTelemetry span processor.

    Args:
        config: The server's trace settings at start-up (OpenTelemetry mode).
        clock: The tracer's clock (nanoseconds, monotonic): the traces' stamps are turned into wall-clock time by
            the offset between it and ``time.time_ns`` taken here.
        exporter: Where the spans go: an SDK ``SpanExporter`` called as each trace finishes, in the caller's
            thread (tests); None: the OTLP/HTTP exporter to ``config.url`` behind a batch span processor with the
            ``bsp_*`` settings, the spans built in a thread of their own (``pyasc-spans``), off the event loop.

    Raises:
        ModelError: HYB-207 where the OpenTelemetry SDK or its OTLP/HTTP exporter is not installed.
    """

    def __init__(self, config: ExportSettings, clock: Callable[[], int] = time.monotonic_ns,
                 exporter: Any = None) -> None:
        try:
            from opentelemetry import trace as otel_trace
            from opentelemetry.sdk import trace as otel_sdk
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
            from opentelemetry.sdk.util.instrumentation import InstrumentationScope
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            if exporter is None:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as e:
            raise ModelError("HYB-207", f"--trace-config mode=opentelemetry needs {e.name or e}, which is not "
                             "installed", "pip install 'pyasc[serve]'") from e
        resource = Resource.create({"service.name": SERVICE_NAME})  # OTEL_SERVICE_NAME / _RESOURCE_ATTRIBUTES win
        self._resource = resource.merge(Resource({key.strip(): value.strip() for key, _, value in
                                                  (item.partition("=") for item in config.resource)}))
        if exporter is None:
            self._processor: Any = BatchSpanProcessor(
                OTLPSpanExporter(endpoint=endpoint(config.url), timeout=_EXPORT_TIMEOUT_S),
                max_queue_size=config.bsp_max_queue_size, schedule_delay_millis=config.bsp_schedule_delay,
                max_export_batch_size=config.bsp_max_export_batch_size)
        else:
            self._processor = SimpleSpanProcessor(exporter)
        self._scope = InstrumentationScope("hybrid.serve", __version__)
        self._sdk, self._api = otel_sdk, otel_trace
        self._sampled = otel_trace.TraceFlags(otel_trace.TraceFlags.SAMPLED)  # the server's rate has sampled it
        self._propagator = TraceContextTextMapPropagator()
        self._offset = time.time_ns() - clock()
        self._builder = None if exporter is not None else concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="pyasc-spans")

    def export(self, trace: FinishedTrace) -> None:
        """Build the spans of a finished ``trace`` and hand them to the processor (in the builder thread)."""
        if self._builder is None:
            self._build(trace)
        else:
            self._builder.submit(self._build_logged, trace)

    def _build_logged(self, trace: FinishedTrace) -> None:
        try:
            self._build(trace)
        except Exception:  # a trace is lost, the server goes on: say so once per trace, with the cause
            logger.exception("the spans of trace %d could not be built", trace.id)

    def _build(self, trace: FinishedTrace) -> None:
        """Build the spans of ``trace`` and hand them to the processor.

        They are born finished: built as the SDK's read-only spans and handed over as the SDK's tracer would hand
        them when they end (its live spans cost about three times more and add nothing here).
        """
        stamps = [(name, ns + self._offset) for name, ns in trace.stamps()]
        if not stamps:
            return
        trace_id, parent, state = random.getrandbits(128) or 1, None, None
        if trace.carrier:
            remote = self._api.get_current_span(self._propagator.extract(trace.carrier)).get_span_context()
            if remote.is_valid:  # the client's trace, its vendors' state (tracestate) carried on
                trace_id, parent, state = remote.trace_id, remote, remote.trace_state
        request = self._context(trace_id, state)
        finished = []
        events: list[tuple[str, int]] = []  # level TENSORS alone: a bare span over the request, as Triton's
        if trace.timestamps:
            events = [(n, t) for n, t in stamps if n not in MODEL_EVENTS and n not in COMPUTE_EVENTS]
            model = [(n, t) for n, t in stamps if n in MODEL_EVENTS]
            compute = [(n, t) for n, t in stamps if n in COMPUTE_EVENTS]
            if model:
                version = trace.model_version or ""
                attributes: dict[str, Any] = {
                    "triton.model_name": trace.model_name,
                    "triton.model_version": int(version) if version.isdigit() else version,
                    "triton.trace_id": trace.id, "triton.trace_parent_id": 0}
                if trace.request_id:
                    attributes["triton.request_id"] = trace.request_id
                served = self._context(trace_id, state)
                if compute:
                    finished.append(self._span("compute", self._context(trace_id, state), served, compute, compute,
                                               None))
                finished.append(self._span(trace.model_name, served, request, model, model, attributes))
        finished.append(self._span("InferRequest", request, parent, events, stamps, None))
        for one in finished:  # children first, as they end (and as Triton exports them)
            self._processor.on_end(one)

    def _context(self, trace_id: int, state: Any) -> Any:
        return self._api.SpanContext(trace_id, random.getrandbits(64) or 1, False, self._sampled, state)

    def _span(self, name: str, context: Any, parent: Any, events: list[tuple[str, int]],
              bounds: list[tuple[str, int]], attributes: dict[str, Any] | None) -> Any:
        """A finished span with ``events``, from the first of ``bounds`` to the last."""
        times = [t for _, t in bounds]
        return self._sdk.ReadableSpan(name, context, parent, self._resource, attributes,
                                      tuple(self._sdk.Event(n, None, t) for n, t in events), (),
                                      self._api.SpanKind.SERVER, instrumentation_scope=self._scope,
                                      start_time=min(times), end_time=max(times))

    def close(self) -> None:
        """Build the spans of the traces handed over, export what is queued, and stop (the processor's shutdown)."""
        if self._builder is not None:
            self._builder.shutdown(wait=True)
        self._processor.shutdown()
