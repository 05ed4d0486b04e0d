"""``hybrid.serve``: a KServe v2 / Open Inference Protocol server for hybrid models, and its Ray Serve form.

The server speaks HTTP and Triton's gRPC service.

Layout, lowest first (import-linter's ``serve-layers`` contract; docs/serving.md maps every file):
``tensors`` (the one v2 tensor codec), ``triton`` (Triton's extensions, one module each) and ``observe``
(metrics, statistics, traces), ``core`` (server state and the one inference path, served models, batching, the
repository, the v2 JSON/binary protocol), the transports ``http`` and ``grpc`` (which never import each other),
the composition root ``app`` (the FastAPI app) and ``server`` (uvicorn with graceful drain, gRPC beside it), and
``ray`` (Ray Serve deployment, Ray Data).
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
