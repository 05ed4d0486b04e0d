"""The KServe v2 / Triton gRPC service on Ray Serve: the replica side of Serve's gRPC proxy.

Serve's gRPC proxy (``serve.start(grpc_options=...)`` with :data:`SERVICER_FUNCTION`, which registers
tritonclient's generated service, :mod:`hybrid.serve.ray.servicer`) decodes each call with the generated request
type and routes it to the deployment method of the RPC's name (``ModelInfer``, ``ServerReady``, ...).
:class:`GrpcMethods` gives the deployment those methods; each runs the same
:class:`hybrid.serve.grpc.server.GrpcService` method the single-process server runs, over the replica's
own server state, so the checks, batching, metrics and HYB error codes are the same. An error's gRPC
status and ``[HYB-7xx] ...`` message are set on Serve's ``grpc_context`` (Serve copies them onto the
client's call) and an empty answer is returned, as Serve documents for status codes.

``ModelStreamInfer`` (bidirectional streaming) and model control (which would load on one replica only)
are not offered on Ray.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from hybrid.serve.grpc.server import GrpcService
from hybrid.serve.ray.servicer import SERVICER_FUNCTION

__all__ = ["SERVICER_FUNCTION", "UNARY_METHODS", "GrpcMethods"]


# each unary RPC and the type of its (empty) answer when the call fails
UNARY_METHODS: dict[str, type] = {
    "ServerLive": pb.ServerLiveResponse, "ServerReady": pb.ServerReadyResponse,
    "ModelReady": pb.ModelReadyResponse, "ServerMetadata": pb.ServerMetadataResponse,
    "ModelMetadata": pb.ModelMetadataResponse, "ModelInfer": pb.ModelInferResponse,
    "ModelConfig": pb.ModelConfigResponse, "ModelStatistics": pb.ModelStatisticsResponse,
    "RepositoryIndex": pb.RepositoryIndexResponse, "RepositoryModelLoad": pb.RepositoryModelLoadResponse,
    "RepositoryModelUnload": pb.RepositoryModelUnloadResponse,
}


class _Aborted(Exception):
    """Raised by :meth:`_ServeContext.abort` once the status is set: the call answers empty."""


class _ServeContext:
    """The part of ``grpc.aio.ServicerContext`` that :class:`GrpcService` uses, over Serve's context.

    Args:
        context: Serve's ``RayServegRPCContext`` for the call (None when called through a handle).
    """

    def __init__(self, context: Any) -> None:
        self._context = context

    def invocation_metadata(self) -> Sequence[tuple[str, Any]]:
        return self._context.invocation_metadata() if self._context is not None else ()

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        if self._context is not None:
            self._context.set_trailing_metadata(list(metadata))

    def time_remaining(self) -> float | None:
        return None  # Serve's proxy enforces its own request_timeout_s; the client's deadline is not passed on

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        if self._context is not None:
            self._context.set_code(code)
            self._context.set_details(details)
        raise _Aborted(details)


Method = Callable[..., Awaitable[Any]]


def _forward(name: str, answer: type) -> Method:
    async def method(self: GrpcMethods, request: Any, grpc_context: Any = None) -> Any:
        try:
            return await getattr(self.grpc_service, name)(request, _ServeContext(grpc_context))
        except _Aborted:
            return answer()

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``inference.GRPCInferenceService/{name}`` through Serve's gRPC proxy."
    return method


class GrpcMethods:
    """Mixin for the Serve deployment: one method per unary RPC of ``inference.GRPCInferenceService``.

    The deployment sets :attr:`grpc_service` in its constructor.
    """

    grpc_service: GrpcService


for _name, _answer in UNARY_METHODS.items():
    setattr(GrpcMethods, _name, _forward(_name, _answer))
