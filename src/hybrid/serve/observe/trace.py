"""Triton's trace extension: the timestamps (and tensors) of a sample of requests, to a JSON file or OpenTelemetry.

A server started with ``--trace-config triton,file=PATH --trace-config level=TIMESTAMPS`` traces one request of
every ``rate`` (1000 by default), ``count`` of them at most (-1: no limit), and writes them as Triton does: a JSON
array of entries, each with its trace's ``id``: the request (``model_name``, ``model_version``, ``request_id``),
one entry per timestamp (``{"id", "timestamps": [{"name", "ns"}]}``, nanoseconds of the monotonic clock, as
Triton's steady clock) and, at level ``TENSORS``, one per tensor (``{"id", "activity", "tensor": {"name",
"data", "shape", "dtype"}}``: the request's inputs as queued, its outputs as the model returned them). With
``log_frequency`` 0 the file is written when the server stops; with N > 0 every N traces go to ``PATH.0``,
``PATH.1``... and what is left when the server stops to the next one (Triton 2.51 drops those). Each file is
written whole to a temporary name, then renamed.

The timestamps, in the order a request meets them (Triton's names):

=============================  ===============================================================================
``HTTP_RECV_START`` / ``_END``  the inference route takes the request / its body has been read
``GRPC_WAITREAD_END``          grpcio hands the decoded request to the handler (grpcio does not show when it
                               began to wait for it: no ``GRPC_WAITREAD_START``)
``REQUEST_START``              the request is decoded and goes to the model's check
``QUEUE_START``                it joins the model's queue
``COMPUTE_START``              a batch runner begins its batch (joining the batch's inputs happens on the event
                               loop before: it counts as queue time), also ``COMPUTE_INPUT_END``
``COMPUTE_OUTPUT_START``       the model's run returned
``COMPUTE_END``                its rows of the batch's outputs are split out, also ``INFER_RESPONSE_COMPLETE``
``REQUEST_END``                the transport has the outputs
``HTTP_SEND_START`` / ``_END``  the answer (encoded) starts to be handed to the HTTP server / has been
``GRPC_SEND_START`` / ``_END``  the answer (encoded) goes to grpcio / the call has ended (the answer sent)
=============================  ===============================================================================

Settings (``GET`` / ``POST /v2/trace/setting`` and ``/v2/models/{m}/trace/setting``, gRPC ``TraceSetting``):
``trace_level`` (a list: ``["OFF"]``, or some of ``TIMESTAMPS``, ``TENSORS``), ``trace_rate``, ``trace_count`` (the
traces left to take), ``log_frequency``, ``trace_file`` and ``trace_mode`` (``triton``), all reported as strings. A
model's update overrides the server's settings for that model (its own rate counter; its own count when it sets one,
otherwise it draws from the server's); a ``null`` value clears a model's override, or resets a server setting to its
start-up value. Refused with HYB-702, where Triton 2.51 ignores them or answers 500: an unknown key or level, a
level that is not a non-empty list, ``OFF`` beside another level, a rate below 1, a count below -1, a negative log
frequency, a model's own ``log_frequency`` (the file is the server's), any ``trace_mode`` but the server's, a new
``trace_file`` (as in Triton: not over the network), and a level other than ``OFF`` on a server started without a
trace file.

OpenTelemetry mode (``--trace-config mode=opentelemetry``, Triton's spelling): the sampled requests are exported as
spans over OTLP/HTTP instead (:mod:`hybrid.serve.observe.trace_otel`: the layout, and the W3C ``traceparent`` a client
may send). Its settings document has Triton's keys for the mode: ``trace_level``, ``trace_rate``, ``trace_count``,
``trace_mode``, ``url``, ``resource`` (where given), ``bsp_schedule_delay``, ``bsp_max_export_batch_size``,
``bsp_max_queue_size``; the exporter's settings are fixed at start-up (a change is HYB-702; Triton ignores it), and
``trace_file`` / ``log_frequency`` belong to the other mode (HYB-702).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.errors import ConfigError, ServingError
from hybrid.ir import atomic_file

__all__ = ["LEVELS", "MODES", "SETTINGS", "Trace", "TraceConfig", "Tracer", "carrier_of"]

logger = logging.getLogger("hybrid.serve")

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
SETTINGS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
"""The settings of Triton's trace extension, in the order Triton reports them."""

_HINT = "e.g. {'trace_level': ['TIMESTAMPS'], 'trace_rate': '100'}; tritonclient: update_trace_settings"
_OPTION_HINT = ("e.g. --trace-config triton,file=/tmp/trace.json --trace-config level=TIMESTAMPS "
                "--trace-config rate=100")
_OFF = ("OFF",)
_FIELD_OF = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}
_TRITON_KEYS = {"file": "file", "log-frequency": "log_frequency"}
_OTEL_KEYS = {k: k for k in ("url", "resource", "bsp_schedule_delay", "bsp_max_export_batch_size",
                             "bsp_max_queue_size")}
_GLOBAL_KEYS = {"level": "level", "rate": "rate", "count": "count", "mode": "mode"}
_OPTION_KEYS = {"": {**_GLOBAL_KEYS, **_TRITON_KEYS}, "triton": {**_GLOBAL_KEYS, **_TRITON_KEYS},
                "opentelemetry": {**_GLOBAL_KEYS, **_OTEL_KEYS}}
"""The ``--trace-config`` keys each prefix takes (``MODE,KEY=VALUE``; a bare ``KEY=VALUE``: global or Triton's)."""
PROPAGATED = ("traceparent", "tracestate")
"""The W3C trace context headers (HTTP) or metadata (gRPC) a client's span is continued from."""


def _bad(message: str) -> ServingError:
    return ServingError("HYB-702", message, _HINT)


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """Trace settings: the server's at start-up, or a model's with its overrides applied.

    Attributes:
        level: ``("OFF",)`` or some of ``TIMESTAMPS``, ``TENSORS``.
        rate: One request of every ``rate`` is traced.
        count: Traces left to take; -1: no limit.
        log_frequency: Traces per file (``file.0``, ``file.1``...); 0: one file, written when the server stops.
        file: Where the traces are written; ``""``: nowhere (the level must then be ``OFF``).
        mode: ``triton`` (trace files) or ``opentelemetry`` (spans exported over OTLP/HTTP).
        url: The OTLP/HTTP traces endpoint (OpenTelemetry mode), ``host:port/path`` as Triton takes it, or with
            its ``http://`` / ``https://`` scheme.
        resource: ``key=value`` attributes of the exported spans' resource (``service.name=...`` names the
            service; the default service name is ``pyasc``).
        bsp_schedule_delay: Milliseconds between two exports of the batch span processor.
        bsp_max_export_batch_size: Spans per export at most.
        bsp_max_queue_size: Spans waiting for export at most; more are dropped (and counted by the SDK's log).
    """

    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    url: str = "localhost:4318/v1/traces"
    resource: tuple[str, ...] = ()
    bsp_schedule_delay: int = 5000
    bsp_max_export_batch_size: int = 512
    bsp_max_queue_size: int = 2048

    @classmethod
    def from_options(cls, options: Sequence[str]) -> TraceConfig:
        """The settings of ``--trace-config`` values, in Triton's spelling (``[MODE,]KEY=VALUE``).

        Global keys: ``level`` (repeatable: the levels add up), ``rate``, ``count`` and ``mode`` (``triton``, the
        default, or ``opentelemetry``). Triton's mode: ``triton,file=PATH`` (its folder must exist and be
        writable) and ``triton,log-frequency=N``. OpenTelemetry mode: ``opentelemetry,url=HOST:PORT/PATH``,
        ``opentelemetry,resource=KEY=VALUE`` (repeatable), ``opentelemetry,bsp_schedule_delay=MS``,
        ``opentelemetry,bsp_max_export_batch_size=N`` and ``opentelemetry,bsp_max_queue_size=N``.

        Raises:
            ConfigError: HYB-102 for an unknown key or mode, a bad value, a level without a writable file in
                Triton's mode, or a setting of one mode given with the other.
        """
        found: dict[str, Any] = {}
        levels: list[str] = []
        resource: list[str] = []
        prefixes: dict[str, str] = {}  # a mode-specific key -> the option that set it
        for option in options:
            head, comma, rest = option.partition(",")
            mode, setting = (head.strip(), rest) if comma and "=" not in head else ("", option)  # a path may hold ","
            key, sep, value = setting.partition("=")
            keys = _OPTION_KEYS.get(mode)
            if keys is None or not sep or key.strip() not in keys:
                raise ConfigError("HYB-102", f"--trace-config {option!r}: expected [MODE,]KEY=VALUE with MODE "
                                  "triton or opentelemetry and KEY one of "
                                  f"{', '.join(dict.fromkeys([*_GLOBAL_KEYS, *_TRITON_KEYS, *_OTEL_KEYS]))}",
                                  _OPTION_HINT)
            key, value = keys[key.strip()], value.strip()
            if key in _TRITON_KEYS.values() or key in _OTEL_KEYS:
                prefixes[key] = option
            if key == "level":
                levels.append(value.upper())
            elif key == "resource":
                name, equals, _ = value.partition("=")
                if not equals or not name.strip():
                    raise ConfigError("HYB-102", f"--trace-config {option!r}: a resource is KEY=VALUE",
                                      "e.g. --trace-config opentelemetry,resource=service.name=my-server")
                resource.append(value)
            else:
                found[key] = value
        mode = found.pop("mode", "triton")
        if mode not in MODES:
            raise ConfigError("HYB-102", f"--trace-config mode={mode}: expected one of {', '.join(MODES)}",
                              "--trace-config mode=opentelemetry, or leave the mode out (Triton's trace files)")
        other = [option for key, option in prefixes.items()
                 if key in (_OTEL_KEYS if mode == "triton" else _TRITON_KEYS.values())]
        if other:
            raise ConfigError("HYB-102", f"--trace-config {other[0]!r} is not a setting of mode {mode}",
                              "--trace-config mode=opentelemetry takes opentelemetry,url=... (no file); Triton's "
                              "mode takes triton,file=PATH")
        try:
            config = _checked(cls(mode=mode), {"trace_level": levels or None, "trace_rate": found.get("rate"),
                                               "trace_count": found.get("count"),
                                               "log_frequency": found.get("log_frequency")}, None)
        except ServingError as e:
            raise ConfigError("HYB-102", f"--trace-config: {e.message}", _OPTION_HINT) from e
        if mode == "opentelemetry":
            return _otel_settings(config, found, tuple(resource))
        file = found.get("file", "")
        if file:
            file = str(Path(file).expanduser().absolute())
            folder = Path(file).parent
            if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
                raise ConfigError("HYB-102", f"--trace-config triton,file={found['file']}: the folder {folder} does "
                                  "not exist or is not writable", "create it, or name a file in a writable folder")
        elif config.level != _OFF:
            raise ConfigError("HYB-102", f"--trace-config level={','.join(config.level)} needs a trace file",
                              "add --trace-config triton,file=PATH, or export spans: --trace-config "
                              "mode=opentelemetry")
        return replace(config, file=file)

    def document(self) -> dict[str, Any]:
        """The settings as Triton reports them (every value a string, the level a list), in its mode's keys."""
        head = {"trace_level": list(self.level), "trace_rate": str(self.rate), "trace_count": str(self.count)}
        if self.mode == "triton":
            return {**head, "log_frequency": str(self.log_frequency), "trace_file": self.file, "trace_mode": "triton"}
        return {**head, "trace_mode": self.mode, **self.otel_document()}

    def otel_document(self) -> dict[str, str]:
        """The OpenTelemetry settings as Triton reports them (``resource`` only where one was given)."""
        doc = {"url": self.url, "resource": ",".join(self.resource),
               "bsp_schedule_delay": str(self.bsp_schedule_delay),
               "bsp_max_export_batch_size": str(self.bsp_max_export_batch_size),
               "bsp_max_queue_size": str(self.bsp_max_queue_size)}
        if not self.resource:
            del doc["resource"]
        return doc


def _otel_settings(config: TraceConfig, found: Mapping[str, str], resource: tuple[str, ...]) -> TraceConfig:
    """``config`` (OpenTelemetry mode) with the ``--trace-config opentelemetry,...`` values in ``found``."""
    sizes: dict[str, Any] = {}
    for key, least in (("bsp_schedule_delay", 1), ("bsp_max_export_batch_size", 1), ("bsp_max_queue_size", 1)):
        if key in found:
            try:
                sizes[key] = _integer(key, found[key], least)
            except ServingError as e:
                raise ConfigError("HYB-102", f"--trace-config opentelemetry,{key}: {e.message}", _OPTION_HINT) from e
    config = replace(config, resource=resource, **sizes)
    if config.bsp_max_export_batch_size > config.bsp_max_queue_size:
        raise ConfigError("HYB-102", f"--trace-config opentelemetry,bsp_max_export_batch_size="
                          f"{config.bsp_max_export_batch_size} is more than bsp_max_queue_size="
                          f"{config.bsp_max_queue_size}",
                          "an export takes its spans from the queue: make the batch at most the queue")
    url = found.get("url", config.url)
    if not url or url.startswith("/"):
        raise ConfigError("HYB-102", f"--trace-config opentelemetry,url={url}: expected HOST:PORT/PATH",
                          "e.g. --trace-config opentelemetry,url=localhost:4318/v1/traces")
    return replace(config, url=url)


def _integer(key: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _bad(f"trace setting {key!r} must be an integer as a string, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise _bad(f"trace setting {key!r} must be an integer, got {value!r}") from None
    if number < least:
        raise _bad(f"trace setting {key!r} must be >= {least}, got {number}")
    return number


def _level(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _bad(f"trace setting 'trace_level' must be a non-empty list of levels ({', '.join(LEVELS)}), "
                   f"got {value!r}")
    levels = [v.upper() for v in value]
    unknown = sorted(set(levels) - set(LEVELS))
    if unknown:
        raise _bad(f"unknown trace level(s) {', '.join(map(repr, unknown))}; the levels are {', '.join(LEVELS)}")
    if "OFF" in levels and len(levels) > 1:
        raise _bad(f"trace level 'OFF' must be the only one, got {value!r}")
    return tuple(dict.fromkeys(levels))


def _checked(base: TraceConfig, changes: Mapping[str, Any], reset: TraceConfig | None) -> TraceConfig:
    """``base`` with ``changes`` applied (a None value: ``reset``'s value; None ``reset``: unchanged).

    Raises:
        ServingError: HYB-702 for an unknown key or a bad value, a setting of the other mode, or a change of one
            that is set where the server starts (the mode, the file, the OpenTelemetry exporter's settings).
    """
    unknown = sorted(set(changes) - set(SETTINGS) - set(_OTEL_KEYS))
    if unknown:
        raise _bad(f"unknown trace setting(s) {', '.join(map(repr, unknown))}; the settings are "
                   f"{', '.join(base.document())}")
    fields: dict[str, Any] = {}
    for key, value in changes.items():
        if value is None:
            if reset is not None and key in _FIELD_OF:  # the file, the mode and the exporter have nothing to reset
                fields[_FIELD_OF[key]] = getattr(reset, _FIELD_OF[key])
            continue
        if key == "trace_level":
            fields["level"] = _level(value)
        elif key == "trace_rate":
            fields["rate"] = _integer(key, value, 1)
        elif key == "trace_count":
            fields["count"] = _integer(key, value, -1)
        elif key == "trace_mode":
            if value != base.mode:
                raise _bad(f"trace setting 'trace_mode' is {base.mode!r} on this server, got {value!r}: the mode "
                           "is chosen where the server starts (--trace-config mode=...)")
        elif base.mode == "opentelemetry" and key in ("log_frequency", "trace_file"):
            raise ServingError("HYB-702", f"trace setting {key!r} is one of Triton's trace files; this server exports "
                               f"its traces to OpenTelemetry ({base.url})", "leave it out")
        elif key == "log_frequency":
            fields["log_frequency"] = _integer(key, value, 0)
        elif key in _OTEL_KEYS:
            if base.mode != "opentelemetry":
                raise _bad(f"trace setting {key!r} is one of OpenTelemetry mode; this server writes Triton's trace "
                           "files (start it with --trace-config mode=opentelemetry to export spans)")
            if value != base.otel_document().get(key, ""):
                raise ServingError("HYB-702", f"trace setting {key!r} cannot be changed over the network",
                                   f"set it where the server starts: --trace-config opentelemetry,{key}=...")
        elif value != base.file:  # trace_file
            raise ServingError("HYB-702", "the trace file cannot be changed over the network (as in Triton)",
                               "name it where the server starts: --trace-config triton,file=PATH")
    return replace(base, **fields)


def _tensor_text(array: np.ndarray) -> str:
    """A tensor's values as Triton's trace writes them: comma-separated, floats with 6 significant digits."""
    flat = np.asarray(array).reshape(-1)
    if flat.dtype.kind == "f" or flat.dtype.name == "bfloat16":
        return ",".join(format(float(v), "g") for v in flat.astype(np.float64))
    if flat.dtype.kind in "iub":
        return ",".join(str(int(v)) for v in flat)
    return ",".join(v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v) for v in flat)


_DTYPES = {"b": "BOOL", "i1": "INT8", "i2": "INT16", "i4": "INT32", "i8": "INT64", "u1": "UINT8", "u2": "UINT16",
           "u4": "UINT32", "u8": "UINT64", "f2": "FP16", "f4": "FP32", "f8": "FP64"}


def _datatype(array: np.ndarray) -> str:
    kind = array.dtype.kind
    if kind in "OSU":
        return "BYTES"
    if array.dtype.name == "bfloat16":
        return "BF16"
    return _DTYPES.get("b" if kind == "b" else f"{kind}{array.dtype.itemsize}", array.dtype.name.upper())


class Trace:
    """One traced request: its model, its request id, its timestamps and (level ``TENSORS``) its tensors.

    The transports and the model stamp it as the request goes (:meth:`stamp`); the transport that sampled it
    calls :meth:`finish` once the request has been answered (or has failed).

    Attributes:
        id: The trace's number, from 1, in the order requests were sampled.
        model_name: The model the request names.
        model_version: Its version once the request reaches the model (None before).
        request_id: The client's request id ("" when none).
        tensors: Whether the level records tensors (``TENSORS``).
        timestamps: Whether the level reports timestamps (``TIMESTAMPS``; OpenTelemetry mode: the spans' events).
        carrier: The client's trace context (:func:`carrier_of`: ``traceparent``, ``tracestate``), where it sent
            one: OpenTelemetry mode continues the client's trace.
    """

    __slots__ = ("_clock", "_entries", "_tracer", "carrier", "id", "model_name", "model_version", "request_id",
                 "tensors", "timestamps")

    def __init__(self, tracer: Tracer, trace_id: int, model_name: str, tensors: bool,
                 clock: Callable[[], int], timestamps: bool = True) -> None:
        self._tracer = tracer
        self.id = trace_id
        self.model_name = model_name
        self.model_version: str | None = None
        self.request_id = ""
        self.tensors = tensors
        self.timestamps = timestamps
        self.carrier: dict[str, str] | None = None
        self._clock = clock
        self._entries: list[tuple[str, int] | dict[str, Any]] = []  # timestamps (name, ns) and tensor entries

    def stamp(self, name: str, ns: int | None = None) -> None:
        """Record timestamp ``name`` now (or at ``ns``, nanoseconds of the monotonic clock)."""
        self._entries.append((name, self._clock() if ns is None else ns))

    def stamp_at(self, name: str, seconds: float) -> None:
        """Record timestamp ``name`` at ``seconds`` of ``time.monotonic()`` (the batcher's clock)."""
        self._entries.append((name, int(seconds * 1e9)))

    def record_tensors(self, activity: str, arrays: Mapping[str, np.ndarray]) -> None:
        """At level ``TENSORS``: record ``arrays`` as ``activity`` (``TENSOR_QUEUE_INPUT`` or ``_BACKEND_OUTPUT``)."""
        if not self.tensors:
            return
        for name, array in arrays.items():
            arr = np.asarray(array)
            self._entries.append({"id": self.id, "activity": activity, "tensor": {
                "name": name, "data": _tensor_text(arr), "shape": ",".join(map(str, arr.shape)),
                "dtype": _datatype(arr)}})

    def stamps(self) -> list[tuple[str, int]]:
        """The timestamps recorded so far: (name, nanoseconds of the monotonic clock), in the order recorded."""
        return [entry for entry in self._entries if type(entry) is tuple]

    def finish(self) -> None:
        """Hand the trace to its tracer's file or exporter (:meth:`Tracer.finish`).

        A request that never reached its model (unknown, or refused before its check) leaves no trace.
        """
        self._tracer.finish(self)

    def text(self) -> str:
        """The trace's entries as Triton writes them, joined by commas: the request first, then what was recorded.

        A timestamp is an entry of its own (``{"id", "timestamps": [{"name", "ns"}]}``), as in Triton's files.
        """
        version: Any = self.model_version
        if version is not None and version.isdigit():
            version = int(version)
        head: dict[str, Any] = {"id": self.id, "model_name": self.model_name, "model_version": version}
        if self.request_id:
            head["request_id"] = self.request_id
        parts = [json.dumps(head, separators=(",", ":"))]
        for entry in self._entries:  # the names are this module's constants: nothing to escape
            parts.append(f'{{"id":{self.id},"timestamps":[{{"name":"{entry[0]}","ns":{entry[1]}}}]}}'
                         if type(entry) is tuple else json.dumps(entry, separators=(",", ":")))
        return ",".join(parts)

    def entries(self) -> list[dict[str, Any]]:
        """The trace's entries (:meth:`text`) as JSON objects."""
        return json.loads(f"[{self.text()}]")


class _Scope:
    """Where requests are sampled: the server, or a model with overrides (its own rate counter).

    ``counts`` is the scope whose count of traces left this one draws from: itself, or (a model that sets no
    count of its own) the server's.
    """

    __slots__ = ("config", "counts", "left", "seen")

    def __init__(self, config: TraceConfig, counts: _Scope | None = None) -> None:
        self.config = config
        self.seen = 0
        self.left = config.count
        self.counts = counts or self

    def document(self) -> dict[str, Any]:
        return {**self.config.document(), "trace_count": str(self.counts.left)}


class Tracer:
    """The trace settings of a server, the sampling of requests, and the trace files; thread-safe.

    In OpenTelemetry mode the finished traces go to :class:`hybrid.serve.observe.trace_otel.SpanExport` instead of a
    file.

    Args:
        config: The settings at start-up (:meth:`TraceConfig.from_options`).
        clock: Nanoseconds of a monotonic clock (injected in tests; the batcher's timestamps use
            ``time.monotonic``, so a real server keeps the default).
        span_exporter: OpenTelemetry mode: where the spans go (an SDK ``SpanExporter``, exported as each trace
            finishes); None: OTLP/HTTP to the configured url, in batches.

    Raises:
        ModelError: HYB-207 in OpenTelemetry mode where the OpenTelemetry SDK is not installed.
    """

    def __init__(self, config: TraceConfig | None = None, clock: Callable[[], int] = time.monotonic_ns,
                 span_exporter: Any = None) -> None:
        self._start = config or TraceConfig()
        self._server = _Scope(self._start)
        self._overrides: dict[str, dict[str, Any]] = {}  # model -> the settings it overrides, as sent
        self._models: dict[str, _Scope] = {}
        self._clock = clock
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending: list[str] = []  # finished traces, each its JSON entries joined by commas
        self._files = 0  # files written with a log frequency
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self._spans = None
        if self._start.mode == "opentelemetry":
            from hybrid.serve.observe.trace_otel import SpanExport

            self._spans = SpanExport(self._start, clock=clock, exporter=span_exporter)

    # ------------------------------------------------------------------ settings
    def settings(self, model: str | None = None) -> dict[str, Any]:
        """The settings of the server (``model`` None) or of a model, as Triton reports them."""
        with self._lock:
            return (self._server if model is None else self._models.get(model, self._server)).document()

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` to the server's settings (``model`` None) or to a model's; the settings after.

        Raises:
            ServingError: HYB-702 for an unknown key or level, a bad value, a new trace file, a model's own
                log frequency, or a level other than ``OFF`` without a trace file; nothing changes then.
        """
        with self._lock:
            if model is None:
                return self._update_server(changes)
            if changes.get("log_frequency") is not None and self._start.mode == "triton":
                raise ServingError("HYB-702", "'log_frequency' is a setting of the server's trace file, not of "
                                   "one model's", "update it on /v2/trace/setting (tritonclient: "
                                   "update_trace_settings without model_name)")
            overrides = {k: v for k, v in {**self._overrides.get(model, {}), **changes}.items() if v is not None}
            config = self._checked(self._server.config, overrides)
            if not overrides:  # nothing of its own left: the model follows the server again
                self._overrides.pop(model, None)
                self._models.pop(model, None)
                return self._server.document()
            scope = self._models.get(model)
            if scope is None:
                scope = self._models[model] = _Scope(config, self._server)
            scope.config = config
            self._overrides[model] = overrides
            if changes.get("trace_count") is not None:
                scope.counts, scope.left = scope, config.count
            elif "trace_count" not in overrides:
                scope.counts = self._server
            return scope.document()

    def _update_server(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        config = _checked(self._server.config, changes, self._start)
        self._refuse_without_file(config)
        models = {name: self._checked(config, self._overrides[name]) for name in self._models}
        self._server.config = config
        if "trace_count" in changes:
            self._server.left = config.count
        for name, scope in self._models.items():
            scope.config = models[name]
        self._flush_due()
        return self._server.document()

    def _checked(self, base: TraceConfig, overrides: Mapping[str, Any]) -> TraceConfig:
        config = _checked(base, overrides, None)
        self._refuse_without_file(config)
        return config

    def _refuse_without_file(self, config: TraceConfig) -> None:
        if config.level != _OFF and not self._start.file and self._start.mode == "triton":
            raise ServingError("HYB-702", f"trace level {', '.join(config.level)}: this server was started without "
                               "a trace file", "start it with --trace-config triton,file=PATH")

    # ------------------------------------------------------------------ sampling
    def sample(self, model: str) -> Trace | None:
        """A new trace for a request to ``model`` when it is sampled (one of every rate, count left); else None."""
        scope = self._models.get(model, self._server) if self._models else self._server
        if scope.config.level == _OFF:
            return None
        with self._lock:
            owner = scope.counts
            if owner.left == 0:
                return None
            scope.seen += 1
            if scope.seen % scope.config.rate:
                return None
            if owner.left > 0:
                owner.left -= 1
            self._next_id += 1
            level = scope.config.level
            return Trace(self, self._next_id, model, "TENSORS" in level, self._clock, "TIMESTAMPS" in level)

    def finish(self, trace: Trace | None) -> None:
        """Keep a finished trace for the file, or export its spans (one that never reached its model is dropped)."""
        if trace is None or trace.model_version is None:
            return
        if self._spans is not None:
            with self._lock:  # not after close() stopped the exporter
                if not self._closed:
                    self._spans.export(trace)
            return
        text = trace.text()
        with self._lock:
            if self._closed:
                return
            self._pending.append(text)
            self._flush_due()

    # ------------------------------------------------------------------ files
    def _flush_due(self) -> None:
        """With a log frequency: hand every full file's traces to the writer (lock held)."""
        every = self._server.config.log_frequency
        while every and len(self._pending) >= every:
            chunk, self._pending = self._pending[:every], self._pending[every:]
            path = f"{self._start.file}.{self._files}"
            self._files += 1
            if self._writer is None:
                self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pyasc-trace")
            self._writer.submit(_write, path, chunk)

    def close(self) -> None:
        """Write what is left (``file``, or the next ``file.N`` with a log frequency) and stop; once.

        OpenTelemetry mode: export the spans still queued and stop the exporter.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = self._pending, []
            writer, self._writer = self._writer, None
            path = f"{self._start.file}.{self._files}" if self._server.config.log_frequency else self._start.file
        if writer is not None:
            writer.shutdown(wait=True)
        if self._spans is not None:
            self._spans.close()
        if pending and self._start.file:
            _write(path, pending)


def carrier_of(pairs: Iterable[tuple[str, str]]) -> dict[str, str] | None:
    """The W3C trace context among ``pairs`` (HTTP headers or gRPC metadata, lower-case names); None if none."""
    found = {key: value for key, value in pairs if key in PROPAGATED}
    return found or None


def _write(path: str, traces: Iterable[str]) -> None:
    """Write ``traces`` as one JSON array to ``path``, atomically (:func:`hybrid.ir.atomic_file`)."""
    try:
        with atomic_file(path) as f:
            f.write(b"[" + ",".join(traces).encode("utf-8") + b"]")
    except OSError as e:
        logger.error("the trace file %s could not be written: %s", path, e)
