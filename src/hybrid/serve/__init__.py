"""``hybrid.serve``: a KServe v2 / Open Inference Protocol server for hybrid models, and its Ray Serve form.

The server speaks HTTP and Triton's gRPC service.

Layout, lowest first: ``protocol`` (the v2 JSON/binary codec and its checks), ``model`` (one served model:
validation and dynamic batching), ``triton_config`` (config.pbtxt and the ModelConfig a model reports),
``repository`` (finding and loading models), ``statistics`` (Triton's per-model statistics), ``metrics``
(Prometheus, Triton's names too), ``triton_http`` (config, stats and repository routes), ``grpc_server``
(the gRPC service on the app's event loop), ``app`` (the FastAPI routes), ``server`` (uvicorn with graceful
drain), ``ray`` (Ray Serve deployment).
Names resolve lazily so that ``import hybrid.serve`` needs neither FastAPI nor Ray until used.

Example::

    from hybrid.serve import build_registry, create_app, run
    run(create_app(build_registry(["models/"])), port=8000)
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BatchSettings": "hybrid.serve.core.model:BatchSettings",
    "ServedModel": "hybrid.serve.core.model:ServedModel",
    "Limits": "hybrid.serve.core.protocol:Limits",
    "ModelRegistry": "hybrid.serve.core.repository:ModelRegistry",
    "build_registry": "hybrid.serve.core.repository:build_registry",
    "discover": "hybrid.serve.core.repository:discover",
    "ServeOptions": "hybrid.serve.app:ServeOptions",
    "create_app": "hybrid.serve.app:create_app",
    "BackgroundServer": "hybrid.serve.server:BackgroundServer",
    "ConnectionLimits": "hybrid.serve.server:ConnectionLimits",
    "run": "hybrid.serve.server:run",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'hybrid.serve' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
