"""The KServe v2 / Triton gRPC API (``inference.GRPCInferenceService``) on grpcio's asyncio server.

The service is built on the generated code that ships with tritonclient (``tritonclient.grpc.service_pb2``
and ``service_pb2_grpc``, from Triton's published ``grpc_service.proto``). Protobuf reads and writes every
message but one part of one: a ``ModelInferRequest``'s top-level fields are walked by hand
(:mod:`hybrid.serve.grpc.wire`) so that its ``raw_input_contents`` stay views of the received bytes (346 against
391 us per inference, measured; docs/serving.md), and protobuf parses the rest of the message; anything that
walk does not expect goes to protobuf whole. The tensors are then decoded by the one v2 codec both transports
use (:mod:`hybrid.serve.tensors`). The service runs on the HTTP server's event loop (started and stopped by the
composition root, :mod:`hybrid.serve.server`) and shares everything with it through
:mod:`hybrid.serve.core.state`, inference included (:func:`hybrid.serve.core.state.infer`): the models and their
batchers, the bearer token (``authorization`` metadata), the body limit (the largest message accepted), the
metrics and statistics, the draining state, and the HYB error codes, sent as the status message
``[HYB-7xx] ...`` with the code also in the trailing metadata ``hyb-code``; the status code follows the HTTP
status of the same error (:func:`grpc_status`).

Methods: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer (inputs as
``raw_input_contents`` or typed ``contents``; outputs always as ``raw_output_contents``, as Triton does),
ModelStreamInfer (requests of one stream run concurrently, so they batch; answers carry the request id),
ModelConfig, ModelStatistics, RepositoryIndex, RepositoryModelLoad / RepositoryModelUnload (refused with
HYB-709 unless the server runs with model control), SystemSharedMemoryStatus / Register / Unregister
(:mod:`hybrid.serve.triton.shared_memory`; inputs and outputs may then name a region), LogSettings
(:mod:`hybrid.serve.triton.log_settings`), TraceSetting (:mod:`hybrid.serve.observe.trace`; a sampled ModelInfer is
traced from ``GRPC_WAITREAD_END``, grpcio having read it, to ``GRPC_SEND_END``, its call ended). The CUDA
shared-memory methods answer UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from google.protobuf import message_factory
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from hybrid._version import __version__
from hybrid.errors import ConfigError, HybridError, ServingError
from hybrid.serve.core.protocol import Limits
from hybrid.serve.core.state import Decoded, ServerState, http_status, infer, selected_models, statistics_of
from hybrid.serve.grpc.accept import accept_ahead
from hybrid.serve.grpc.wire import ReceivedInfer, read_infer_request
from hybrid.serve.observe.trace import carrier_of
from hybrid.serve.tensors import RAW, bad, binary_of, bytes_array, datatype_of, dtype_for, from_raw, shape_of, values_as
from hybrid.serve.triton.classification import CLASSIFICATION, class_count, top_classes
from hybrid.serve.triton.config import load_request, model_config
from hybrid.serve.triton.sequences import SequenceFlags, sequence_flags
from hybrid.serve.triton.shared_memory import BYTE_SIZE, OFFSET, REGION, SharedMemoryRegions, Span, regions_for, span_of

if TYPE_CHECKING:
    from hybrid.serve.core.model import ServedModel
    from hybrid.serve.observe.trace import Trace

__all__ = ["GrpcDecoded", "GrpcService", "decode_inputs", "encode_outputs", "grpc_status", "method_handlers",
           "requested_outputs", "start_grpc"]

logger = logging.getLogger("hybrid.serve")

_OFFLOAD = 64 << 10  # requests with more tensor bytes than this are decoded in a worker thread
_BY_HTTP = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
            403: grpc.StatusCode.FAILED_PRECONDITION, 404: grpc.StatusCode.NOT_FOUND,
            413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE,
            504: grpc.StatusCode.DEADLINE_EXCEEDED}
_TYPED = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
          "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
          "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
SERVICE = "inference.GRPCInferenceService"
INFER_METHOD = f"/{SERVICE}/ModelInfer"  # its calls are accepted ahead (grpc_accept)
_HINT = "build requests with tritonclient.grpc (InferInput.set_data_from_numpy)"


def grpc_status(code: str) -> grpc.StatusCode:
    """The gRPC status of a HybridError code: the counterpart of its HTTP status.

    400 -> INVALID_ARGUMENT, 404 -> NOT_FOUND, 503 -> UNAVAILABLE, 504 -> DEADLINE_EXCEEDED, ...; anything
    else INTERNAL. A shared memory region registered twice (HYB-713) is ALREADY_EXISTS, as in Triton.
    """
    if code == "HYB-713":
        return grpc.StatusCode.ALREADY_EXISTS
    return _BY_HTTP.get(http_status(code), grpc.StatusCode.INTERNAL)


def _bad(message: str, hint: str | None = _HINT) -> ServingError:
    return ServingError("HYB-702", message, hint)


# ------------------------------------------------------------------------------------------------ tensors
def _from_typed(name: str, datatype: str, shape: tuple[int, ...], count: int, contents: Any) -> np.ndarray:
    field = _TYPED.get(datatype)
    if field is None:
        raise bad(f"input {name!r}: {datatype} has no typed contents field; send it as raw_input_contents")
    values = getattr(contents, field)
    if len(values) != count:
        raise bad(f"input {name!r}: shape {list(shape)} needs {count} values, {field} has {len(values)}")
    for other in set(_TYPED.values()) - {field}:
        if len(getattr(contents, other)):
            raise bad(f"input {name!r}: datatype {datatype} takes {field}, the request fills {other}")
    if datatype == "BYTES":
        return bytes_array(values, count).reshape(shape)
    found = np.array(values, dtype=np.bool_ if datatype == "BOOL" else None)
    return values_as(name, datatype, found, field).reshape(shape)


def _value(param: pb.InferParameter) -> Any:
    """The value an InferParameter holds (None for none); :func:`_setting` for settings and load parameters."""
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def _setting(param: Any) -> Any:
    """The value a settings parameter holds; ``""`` where it holds none (protobuf's default of its string)."""
    which = param.WhichOneof("parameter_choice")
    return param.string_param if which is None else getattr(param, which)


def _span(tensor: str, parameters: Any) -> Span | None:
    """Where a tensor's parameters put it in shared memory; None where they name no region."""
    if REGION not in parameters:
        return None
    return span_of(tensor, _value(parameters[REGION]),
                   *(_value(parameters[k]) if k in parameters else None for k in (BYTE_SIZE, OFFSET)))


def decode_inputs(request: pb.ModelInferRequest, limits: Limits, shared_memory: SharedMemoryRegions | None = None,
                  raw: list[memoryview] | None = None) -> dict[str, np.ndarray]:
    """The input arrays of a ModelInferRequest, every size checked before anything is allocated.

    An input whose parameters name a shared memory region is copied out of that region (``shared_memory``);
    ``raw_input_contents`` then hold the other inputs, in order, as tritonclient sends them. ``raw``: those
    contents where they were read apart from the message (:class:`ReceivedInfer`); the arrays are views of them.

    Raises:
        ServingError: HYB-702 naming the tensor and what is wrong with it; HYB-711 / HYB-712 for a shared
            memory span that is not inside a registered region.
    """
    if raw is None:
        raw = ReceivedInfer.parsed(request).raw
    spans = [_span(f"input {t.name!r}", t.parameters) if len(t.parameters) else None for t in request.inputs]
    carried = len(spans) - sum(s is not None for s in spans)
    if len(raw) and len(raw) != carried:
        raise _bad(f"the request has {carried} inputs outside shared memory but {len(raw)} raw_input_contents; "
                   "send every one of them raw or none")
    arrays: dict[str, np.ndarray] = {}
    next_raw = iter(raw)
    for tensor, span in zip(request.inputs, spans, strict=True):
        name, datatype = tensor.name, tensor.datatype
        if name in arrays:
            raise _bad(f"input {name!r} appears twice")
        dtype_for(name, datatype)
        shape, count = shape_of(name, tensor.shape, datatype, limits.max_body)
        if span is not None:
            if tensor.HasField("contents"):
                raise _bad(f"input {name!r} has both contents and a shared memory region")
            where = f"input {name!r}"
            data = regions_for(shared_memory, where).read(span.region, span.offset, span.byte_size, where)
            arrays[name] = from_raw(name, datatype, shape, count, data, BYTE_SIZE)
        elif len(raw):
            if tensor.HasField("contents"):
                raise _bad(f"input {name!r} has both contents and raw_input_contents")
            arrays[name] = from_raw(name, datatype, shape, count, next(next_raw), RAW)
        else:
            arrays[name] = _from_typed(name, datatype, shape, count, tensor.contents)
    return arrays


def _class_count(requested: pb.ModelInferRequest.InferRequestedOutputTensor) -> int:
    """The K of an output's ``classification`` parameter (an ``int64_param``, as Triton takes it); 0 without it."""
    if CLASSIFICATION not in requested.parameters:
        return 0
    param = requested.parameters[CLASSIFICATION]
    if param.WhichOneof("parameter_choice") != "int64_param":
        raise _bad(f"output {requested.name!r}: the 'classification' parameter must be an int64_param, got "
                   f"{param.WhichOneof('parameter_choice') or 'no value'}", "InferRequestedOutput(name, class_count=K)")
    return class_count(requested.name, param.int64_param)


Wanted = tuple[str, int, Span | None]  # an output a request names: name, class count (0: values), region span


def encode_outputs(model: ServedModel, request: pb.ModelInferRequest, outputs: Mapping[str, np.ndarray],
                   shared_memory: SharedMemoryRegions | None = None,
                   wanted: list[Wanted] | None = None) -> pb.ModelInferResponse:
    """The ModelInferResponse with the outputs the request asked for, as raw contents.

    All of the model's outputs when the request names none; an output asked for with ``classification`` K as
    its top K classes (:func:`hybrid.serve.triton.classification.top_classes`).

    ``wanted``: the request's outputs as :func:`requested_outputs` read them (read again where not given).

    Raises:
        ServingError: HYB-702 for an output the model does not have, a ``classification`` that is not a
            non-negative int64_param, or the top classes of an output that is not numeric; HYB-711 / HYB-712
            for an output whose shared memory region cannot hold it.
    """
    response = pb.ModelInferResponse(model_name=model.name, model_version=model.version, id=request.id)
    if wanted is None:
        wanted = [_wanted(o) for o in request.outputs]
    for name, classes, span in wanted or [(name, 0, None) for name in outputs]:
        if name not in outputs:
            raise _bad(f"output {name!r} is not an output of {model.name!r}; it has: {', '.join(outputs)}",
                       "request one of the model's outputs, or none for all of them")
        arr = np.asarray(outputs[name])
        if classes:
            arr = top_classes(name, arr, classes, batched=model.max_batch_size > 0, labels=model.labels.get(name, ()))
        datatype = datatype_of(arr.dtype)
        response.outputs.add(name=name, datatype=datatype, shape=list(arr.shape))
        if span is None:
            response.raw_output_contents.append(binary_of(arr, datatype))
        else:  # written to its region; an empty entry keeps raw_output_contents aligned with outputs, as Triton's
            where = f"output {name!r}"
            regions_for(shared_memory, where).write(span.region, span.offset, span.byte_size, binary_of(arr, datatype),
                                                 where)
            response.raw_output_contents.append(b"")
    return response


@dataclass(slots=True, kw_only=True)
class GrpcDecoded(Decoded[pb.ModelInferResponse]):
    """A ``ModelInferRequest``, decoded: the message and the outputs it names, for its answer.

    Attributes:
        message: The request (its id, the outputs it names).
        wanted: Its outputs as :func:`requested_outputs` read and checked them.
        shared_memory: The server's regions, where outputs the request puts in one are written.
    """

    message: pb.ModelInferRequest
    wanted: list[Wanted]
    shared_memory: SharedMemoryRegions | None

    def encode(self, model: ServedModel, outputs: Mapping[str, np.ndarray]) -> pb.ModelInferResponse:
        """The ModelInferResponse carrying ``outputs`` (:func:`encode_outputs`)."""
        return encode_outputs(model, self.message, outputs, self.shared_memory, self.wanted)


def requested_outputs(request: pb.ModelInferRequest, shared_memory: SharedMemoryRegions | None) -> list[Wanted]:
    """The outputs a request names, read and checked before the model runs (for :func:`encode_outputs`).

    Their parameters are well formed, and each shared memory span lies inside a registered region.

    Raises:
        ServingError: HYB-702 for a malformed parameter; HYB-711 / HYB-712 for a span outside the regions.
    """
    wanted = [_wanted(o) for o in request.outputs]
    for name, _, span in wanted:
        if span is not None:
            where = f"output {name!r}"
            regions_for(shared_memory, where).check(span, where)
    return wanted


def _wanted(requested: pb.ModelInferRequest.InferRequestedOutputTensor) -> Wanted:
    """An output the request names: its name, its class count (0: its values) and its shared memory span."""
    if not len(requested.parameters):
        return requested.name, 0, None
    classes = _class_count(requested)
    span = _span(f"output {requested.name!r}", requested.parameters)
    binary = "binary_data" in requested.parameters and _value(requested.parameters["binary_data"]) is True
    if span is not None and (classes or binary):
        raise _bad(f"output {requested.name!r} sets both '{REGION}' and "
                   f"'{CLASSIFICATION if classes else 'binary_data'}'")
    return requested.name, classes, span


def _request_timeout(request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> float | None:
    limits = []
    if "timeout" in request.parameters:
        micros = request.parameters["timeout"].int64_param
        if micros <= 0:
            raise _bad(f"parameter 'timeout' must be a positive number of microseconds, got {micros}")
        limits.append(micros / 1e6)
    remaining = context.time_remaining()
    if remaining is not None:
        limits.append(max(remaining, 1e-3))
    return min(limits) if limits else None


def _priority(request: pb.ModelInferRequest) -> int:
    """The request's ``priority`` parameter (tritonclient sends ``uint64_param``; 0 when absent).

    Raises:
        ServingError: HYB-702 for a value that is not an unsigned integer.
    """
    if "priority" not in request.parameters:
        return 0
    param = request.parameters["priority"]
    value = _value(param)
    if param.WhichOneof("parameter_choice") not in ("uint64_param", "int64_param") or value < 0:
        raise _bad(f"parameter 'priority' must be an unsigned integer (1 is the highest level, 0 the model's "
                   f"default), got {value!r}")
    return int(value)


def _sequence(request: pb.ModelInferRequest) -> SequenceFlags | None:
    """The request's sequence parameters (tritonclient's ``sequence_id``, ``sequence_start``, ``sequence_end``)."""
    params = request.parameters
    return sequence_flags(*(_value(params[k]) if k in params else None
                            for k in ("sequence_id", "sequence_start", "sequence_end")))


# ------------------------------------------------------------------------------------------------ service
Handler = Callable[..., Awaitable[Any]]


def _rpc(*, public: bool = False) -> Callable[[Handler], Handler]:
    """Wrap a method: the bearer-token check (not for liveness), and HybridError -> gRPC status."""

    def wrap(method: Handler) -> Handler:
        @functools.wraps(method)
        async def call(self: GrpcService, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                if not public:
                    self.authorize(context)
                return await method(self, request, context)
            except HybridError as e:
                await self.abort(context, e)

        return call

    return wrap


class GrpcService(pb_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over the HTTP server's state.

    Args:
        state: The app's shared state (models, metrics, options, draining flag).
    """

    def __init__(self, state: ServerState) -> None:
        self.state = state
        token = state.options.auth_token
        self._expected = f"Bearer {token}".encode() if token else None

    # ------------------------------------------------------------------ plumbing
    def authorize(self, context: grpc.aio.ServicerContext) -> None:
        """Check the call's ``authorization`` metadata against the bearer token (nothing to check without one).

        Raises:
            ServingError: HYB-703 when the metadata is missing or holds another token.
        """
        if self._expected is None:
            return
        given = next((v for k, v in (context.invocation_metadata() or ()) if k == "authorization"), "")
        given = given.encode() if isinstance(given, str) else given
        if not hmac.compare_digest(given, self._expected):
            what = "no authorization metadata" if not given else "a wrong bearer token"
            raise ServingError("HYB-703", f"this server requires a bearer token; the call has {what}",
                               "send the metadata 'authorization: Bearer <token>' (headers= in tritonclient)")

    async def abort(self, context: grpc.aio.ServicerContext, e: HybridError) -> None:
        """End the call with ``e``: counted in the gRPC error metric, its code in the trailing ``hyb-code``.

        The status is :func:`grpc_status` of the code, the message ``[HYB-7xx] message (hint: ...)``.
        """
        self.state.metrics.grpc_errors.labels(e.code).inc()
        context.set_trailing_metadata((("hyb-code", e.code),))
        text = f"[{e.code}] {e.message}" + (f" (hint: {e.hint})" if e.hint else "")
        await context.abort(grpc_status(e.code), text)

    def _model(self, name: str, version: str) -> ServedModel:
        return self.state.registry.get(name, version or None)

    def _control(self) -> None:
        self.state.check_model_control()

    # ------------------------------------------------------------------ health and metadata
    @_rpc(public=True)
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        """Answer ``ServerLive``: always live, and the one RPC that needs no bearer token."""
        return pb.ServerLiveResponse(live=True)

    @_rpc()
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        """Answer ``ServerReady``: ready when the server is not draining and every served model is ready."""
        ready = not self.state.draining and all(m.ready for m in self.state.registry)
        return pb.ServerReadyResponse(ready=ready)

    @_rpc()
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        """Answer ``ModelReady``: whether the model (the highest version when none is given) takes requests.

        An unknown model or version (HYB-701) is not ready rather than NOT_FOUND; a malformed name is
        INVALID_ARGUMENT (HYB-702). While the server drains every model is not ready.
        """
        try:
            model = self._model(request.name, request.version)
        except ServingError as e:
            if e.code != "HYB-701":
                raise
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=model.ready and not self.state.draining)

    @_rpc()
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        """Answer ``ServerMetadata``: name ``pyasc``, the package version and the supported extensions."""
        return pb.ServerMetadataResponse(name="pyasc", version=__version__, extensions=self.state.extensions)

    @_rpc()
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        """Answer ``ModelMetadata``: the model's platform and input and output tensors (name, datatype, shape).

        ``versions`` lists the requested version, or every served version when the request names none. An
        unknown model or version is NOT_FOUND (HYB-701).
        """
        model = self._model(request.name, request.version)
        versions = [model.version] if request.version else self.state.registry.versions(model.name)
        doc = model.metadata(versions)
        tensors = {k: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in doc[k]] for k in ("inputs", "outputs")}
        return pb.ModelMetadataResponse(name=doc["name"], versions=doc["versions"], platform=doc["platform"],
                                        **tensors)

    @_rpc()
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        """Answer ``ModelConfig``: Triton's ModelConfig of the model (:func:`.triton_config.model_config`).

        An unknown model or version is NOT_FOUND (HYB-701).
        """
        return pb.ModelConfigResponse(config=model_config(self._model(request.name, request.version)))

    @_rpc()
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: Any) -> pb.ModelStatisticsResponse:
        """Answer ``ModelStatistics``: Triton's per-model statistics of every model, every version or one.

        No name selects every served model, a name without a version every version of it. An unknown model
        or version is INVALID_ARGUMENT (HYB-715), as Triton answers it.
        """
        models = selected_models(self.state.registry, request.name or None, request.version or None)
        return pb.ModelStatisticsResponse(model_stats=statistics_of(self.state, models))

    # ------------------------------------------------------------------ repository
    @_rpc()
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: Any) -> pb.RepositoryIndexResponse:
        """Answer ``RepositoryIndex``: every model version loaded or found in the repositories, with its state.

        With ``ready`` set only the READY ones. The repositories are read in a worker thread.
        """
        entries = await asyncio.get_running_loop().run_in_executor(None, self.state.registry.index)
        models = [pb.RepositoryIndexResponse.ModelIndex(name=e.name, version=e.version, state=e.state,
                                                        reason=e.reason)
                  for e in entries if not request.ready or e.state == "READY"]
        return pb.RepositoryIndexResponse(models=models)

    @_rpc()
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Any) -> pb.RepositoryModelLoadResponse:
        """Answer ``RepositoryModelLoad``: load (or reload) every version of the model from the repositories.

        The load runs in a worker thread. Refused with UNAVAILABLE (HYB-709, as Triton answers) unless the server runs
        with model control; the ``config`` parameter (a ``ModelConfig`` as JSON, tritonclient's
        ``load_model(name, config=...)``) stands for the model's ``config.pbtxt`` for this load, and ``file:<path>``
        parameters (bytes; ``load_model(..., files=...)``) carry the model's files, served from a folder of their
        own (:meth:`hybrid.serve.core.repository.ModelRegistry.load`); a bad one, or any other parameter, is
        INVALID_ARGUMENT (HYB-702); a model no repository holds is NOT_FOUND (HYB-701).
        """
        self._control()
        wanted = load_request({key: _setting(value) for key, value in request.parameters.items()})
        await asyncio.get_running_loop().run_in_executor(None, self.state.registry.load, request.model_name,
                                                         wanted.config, wanted.files)
        return pb.RepositoryModelLoadResponse()

    @_rpc()
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Any) -> pb.RepositoryModelUnloadResponse:
        """Answer ``RepositoryModelUnload``: stop serving every version of the model; queued requests are answered.

        Refused with UNAVAILABLE (HYB-709, as Triton answers) unless the server runs with model control; a model not
        served is NOT_FOUND (HYB-701).
        """
        self._control()
        await asyncio.get_running_loop().run_in_executor(None, self.state.registry.unload, request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------------ system shared memory
    @_rpc()
    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                       context: Any) -> pb.SystemSharedMemoryStatusResponse:
        """Answer ``SystemSharedMemoryStatus``: the region named, or every one; an unknown one is NOT_FOUND."""
        regions = self.state.regions().status(request.name or None)
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        return pb.SystemSharedMemoryStatusResponse(regions={
            r.name: status(name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size) for r in regions})

    @_rpc()
    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                         context: Any) -> pb.SystemSharedMemoryRegisterResponse:
        """Answer ``SystemSharedMemoryRegister``: map the region (:class:`.shared_memory.SharedMemoryRegions`).

        A name registered already is ALREADY_EXISTS (HYB-713); an object that cannot be mapped
        INVALID_ARGUMENT (HYB-711).
        """
        self.state.regions().register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_rpc()
    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                           context: Any) -> pb.SystemSharedMemoryUnregisterResponse:
        """Answer ``SystemSharedMemoryUnregister``: drop the region named (nothing if unknown), or every one."""
        self.state.regions().unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    # ------------------------------------------------------------------ logging
    @_rpc()
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        """Answer ``LogSettings``: apply the settings the request carries (none: read them); all of them back.

        The values are :class:`.log_settings.LogSettings`'s: a bad one is INVALID_ARGUMENT (HYB-702).
        """
        changes = {key: _setting(value) for key, value in request.settings.items()}
        settings = self.state.log_control().update(changes) if changes else self.state.log_control().current()
        value = pb.LogSettingsResponse.SettingValue

        def setting(v: Any) -> Any:
            if isinstance(v, bool):
                return value(bool_param=v)
            return value(uint32_param=v) if isinstance(v, int) else value(string_param=v)

        return pb.LogSettingsResponse(settings={k: setting(v) for k, v in settings.items()})

    @_rpc()
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        """Answer ``TraceSetting``: the settings of the server, or of ``model_name``, after the request's changes.

        A setting with no value clears it (a model's override; a server setting: back to its start-up value);
        the values are :class:`.trace.Tracer`'s: a bad one is INVALID_ARGUMENT (HYB-702); an unknown model
        NOT_FOUND (HYB-701).
        """
        tracer = self.state.trace_control()
        model = request.model_name or None
        if model is not None:
            self.state.registry.get(model)
        changes: dict[str, Any] = {}
        for key, setting in request.settings.items():
            values = list(setting.value)
            if key == "trace_level" or not values:
                changes[key] = values or None
            elif len(values) == 1:
                changes[key] = values[0]
            else:
                raise ServingError("HYB-702", f"trace setting {key!r} takes one value, got {values!r}")
        settings = tracer.update(model, changes) if changes else tracer.settings(model)
        value = pb.TraceSettingResponse.SettingValue
        return pb.TraceSettingResponse(settings={k: value(value=v if isinstance(v, list) else [v])
                                                 for k, v in settings.items()})

    # ------------------------------------------------------------------ inference
    async def _infer(self, call: ReceivedInfer, context: Any, trace: Trace | None) -> pb.ModelInferResponse:
        request, raw = call.message, call.raw
        model = self.state.model(request.model_name, request.model_version or None)
        limits, shared_memory = self.state.options.limits, self.state.shared_memory

        def decode() -> GrpcDecoded | asyncio.Future[GrpcDecoded]:
            timeout = _request_timeout(request, context)
            sequence = _sequence(request) if request.parameters else None
            priority = _priority(request) if request.parameters else 0
            wanted = requested_outputs(request, shared_memory)
            names = tuple(w[0] for w in wanted)

            def decoded() -> GrpcDecoded:
                return GrpcDecoded(decode_inputs(request, limits, shared_memory, raw), timeout, sequence, names,
                                   priority, message=request, wanted=wanted, shared_memory=shared_memory)

            # raw contents become arrays without a copy (numpy views of the message's bytes): only typed
            # contents and BYTES elements cost work proportional to their size, and only those leave the loop
            costly = not raw or any(t.datatype == "BYTES" for t in request.inputs)
            if costly and request.ByteSize() + sum(map(len, raw)) > _OFFLOAD:  # ByteSize walks the message
                return asyncio.get_running_loop().run_in_executor(None, decoded)
            return decoded()

        return await infer(self.state, model, decode, trace)

    def _sample(self, request: pb.ModelInferRequest, context: Any) -> Trace | None:
        """The request's trace when it is sampled, stamped ``GRPC_WAITREAD_END`` (grpcio has read it).

        The call's metadata may carry the client's trace context (``traceparent``), as Triton reads it.
        """
        trace = self.state.sample(request.model_name)
        if trace is not None:
            trace.stamp("GRPC_WAITREAD_END")
            trace.request_id = request.id
            trace.carrier = carrier_of(context.invocation_metadata() or ())
        return trace

    @_rpc()
    async def ModelInfer(self, request: ReceivedInfer | pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        """Answer ``ModelInfer``: run one request through the model's batcher; outputs as raw contents.

        ``request`` as :func:`hybrid.serve.grpc.wire.read_infer_request` reads it (this service's own server), or
        parsed whole by protobuf (Ray Serve's gRPC proxy).

        The errors map through :func:`grpc_status`: a malformed request INVALID_ARGUMENT (HYB-702, HYB-401..407),
        an unknown model NOT_FOUND (HYB-701), a full queue or a draining server UNAVAILABLE (HYB-705,
        HYB-706), no result within the timeout DEADLINE_EXCEEDED (HYB-411).
        """
        call = _received(request)
        trace = self._sample(call.message, context)
        if trace is None:
            return await self._infer(call, context, None)
        context.add_done_callback(lambda _: _sent(trace))  # the call has ended: its answer (or status) is sent
        answer = await self._infer(call, context, trace)
        trace.stamp("GRPC_SEND_START")
        return answer

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[ReceivedInfer | pb.ModelInferRequest],
                               context: Any) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Answer ``ModelStreamInfer``: the requests of one stream run concurrently (so they batch).

        Each answer carries its request's id, in the order the results come. A failed request does not end
        the stream: its answer has ``error_message`` ``[HYB-xxx] ...`` and the request's model and id. A
        wrong bearer token ends the call (UNAUTHENTICATED, HYB-703).
        """
        try:
            self.authorize(context)
        except HybridError as e:
            await self.abort(context, e)
        answers: asyncio.Queue[tuple[pb.ModelStreamInferResponse, Trace | None] | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def one(received: ReceivedInfer | pb.ModelInferRequest) -> None:
            call = _received(received)
            request = call.message
            trace = self._sample(request, context)
            try:
                answer = pb.ModelStreamInferResponse(infer_response=await self._infer(call, context, trace))
            except HybridError as e:
                self.state.metrics.grpc_errors.labels(e.code).inc()
                text = f"[{e.code}] {e.message}" + (f" (hint: {e.hint})" if e.hint else "")
                answer = pb.ModelStreamInferResponse(error_message=text, infer_response=pb.ModelInferResponse(
                    model_name=request.model_name, model_version=request.model_version, id=request.id))
            except BaseException:
                _sent(trace)
                raise
            if trace is not None:
                trace.stamp("GRPC_SEND_START")
            await answers.put((answer, trace))

        async def read() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.create_task(one(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            finally:
                await answers.put(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await answers.get()) is not None:
                answer, trace = item
                yield answer
                _sent(trace)  # the stream has taken the answer
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()


def _received(request: ReceivedInfer | pb.ModelInferRequest) -> ReceivedInfer:
    """The request as read apart from its raw contents (one protobuf parsed whole, from Ray Serve's proxy, too)."""
    return request if isinstance(request, ReceivedInfer) else ReceivedInfer.parsed(request)


def method_handlers(service: GrpcService) -> dict[str, grpc.RpcMethodHandler]:
    """The handlers of ``inference.GRPCInferenceService``'s methods on ``service``, by method name.

    Each reads and writes its messages with the generated protobuf types, as tritonclient's
    ``add_GRPCInferenceServiceServicer_to_server`` registers them, except that ``ModelInfer`` and
    ``ModelStreamInfer`` read their requests with :func:`hybrid.serve.grpc.wire.read_infer_request`: the tensors'
    bytes are not copied out of the received message.
    """
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name[SERVICE.rpartition(".")[2]].methods:
        request, response = (message_factory.GetMessageClass(t) for t in (method.input_type, method.output_type))
        read = read_infer_request if request is pb.ModelInferRequest else request.FromString
        handlers[method.name] = kinds[method.client_streaming, method.server_streaming](
            getattr(service, method.name), request_deserializer=read, response_serializer=response.SerializeToString)
    return handlers


def _sent(trace: Trace | None) -> None:
    """A traced answer has been sent (or its call has ended): stamp ``GRPC_SEND_END``, hand the trace on."""
    if trace is not None:
        trace.stamp("GRPC_SEND_END")
        trace.finish()


async def start_grpc(state: ServerState, address: str) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC service on ``address`` ('host:port'; port 0 picks a free one) on the running loop.

    Returns:
        The started server and the port it listens on.

    Raises:
        ConfigError: HYB-102 when the address cannot be bound.
    """
    limit = state.options.limits.max_body + (1 << 20)  # the tensors plus room for the message around them
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", -1),
                                      ("grpc.so_reuseport", 0)])
    handlers = method_handlers(GrpcService(state))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as e:
        raise ConfigError("HYB-102", f"cannot listen for gRPC on {address}: {e}",
                          "choose another --grpc-port (0 turns gRPC off)") from e
    await server.start()
    accept_ahead(server, {INFER_METHOD: handlers["ModelInfer"]})
    logger.info("gRPC (KServe v2 / Triton) listening on %s", address.rpartition(":")[0] + f":{port}")
    return server, port

