"""The servicer function Serve's gRPC proxy imports: tritonclient's KServe v2 / Triton service, picklable.

Serve's proxy decodes each call with the generated request type, then pickles the request to the replica.
tritonclient's generated messages name their module ``grpc_service_pb2`` (the .proto file's name), which
cannot be imported, so pickling fails; importing this module makes that name (and ``model_config_pb2``)
resolve to tritonclient's modules, in the proxy (which imports :func:`add_servicer` by its path) and in
the replicas (which import it with the deployment). Kept small: the proxy imports nothing else of pyasc.
"""

from __future__ import annotations

import sys
from typing import Any

from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

__all__ = ["SERVICER_FUNCTION", "add_servicer"]

SERVICER_FUNCTION = "hybrid.serve.ray.servicer.add_servicer"

sys.modules.setdefault(service_pb2.ServerLiveRequest.__module__, service_pb2)
sys.modules.setdefault(model_config_pb2.ModelConfig.__module__, model_config_pb2)


def add_servicer(servicer: Any, server: Any) -> None:
    """Register ``inference.GRPCInferenceService`` (what ``gRPCOptions.grpc_servicer_functions`` names)."""
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
