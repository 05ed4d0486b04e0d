"""The FastAPI application: the KServe v2 REST API, metrics, auth and request limits.

``create_app(registry, options)`` is the one factory for both the single-machine server (uvicorn) and
the Ray Serve replicas. Routes: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``,
``/v2/models/{m}[/versions/{v}]``, ``.../ready``, ``POST .../infer`` and ``GET /metrics``, Triton's
extensions (:mod:`hybrid.serve.http.extensions`: config, stats, repository index/load/unload). Inference
goes through the transports' shared path (:func:`hybrid.serve.core.state.infer`), answered below FastAPI's routing
by :class:`hybrid.serve.http.infer.InferRoute` (the hot path); the gRPC service is started
beside this app by the composition root (:mod:`hybrid.serve.server`), not by it. Every error
is ``{"error": "[HYB-7xx] ...", "code": ..., "hint": ...}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from hybrid._version import __version__
from hybrid.errors import HybridError, ServingError
from hybrid.serve.core.repository import ModelRegistry
from hybrid.serve.core.state import ServeOptions, ServerState, available_model, http_status
from hybrid.serve.http.extensions import add_triton_routes
from hybrid.serve.http.generate import add_generate_routes
from hybrid.serve.http.infer import (
    InferRoute,
    answer_infer,
    error_body,
    error_response,
    note_disconnect,
    route_path,
)
from hybrid.serve.observe.metrics import CONTENT_TYPE, ServerMetrics

__all__ = ["ServeOptions", "ServerState", "create_app", "http_status"]

logger = logging.getLogger("hybrid.serve")

LIVE_PATH = "/v2/health/live"


class _AuthMiddleware:
    """Bearer-token check before any route runs (liveness excepted: orchestrators probe it bare)."""

    def __init__(self, app: ASGIApp, token: str, metrics: ServerMetrics) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and route_path(scope) != LIVE_PATH:
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                self.metrics.http_errors.labels("HYB-703").inc()
                what = "no Authorization header" if not given else "a wrong bearer token"
                body = error_body("HYB-703", f"this server requires a bearer token; the request has {what}",
                                  "send 'Authorization: Bearer <token>' (the server's --auth-token)")
                await JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _MetricsPort:
    """The metrics port (``ServeOptions.metrics_address``) answers ``GET /metrics`` alone, as Triton's does."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") if scope["type"] == "http" else None
        if server and server[1] == self.state.metrics_port and route_path(scope) != "/metrics":
            self.state.metrics.http_errors.labels("HYB-701").inc()
            body = error_body("HYB-701", f"the metrics port answers GET /metrics alone, not {route_path(scope)}",
                              "send the inference API's requests to the server's port (--port)")
            await JSONResponse(body, 404)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _add_routes(app: FastAPI, state: ServerState) -> None:
    registry, metrics = state.registry, state.metrics

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "pyasc", "version": __version__, "extensions": state.extensions}

    @app.get(LIVE_PATH)
    async def live() -> dict[str, Any]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, Any]:
        if state.draining:
            raise ServingError("HYB-706", "the server is shutting down", "send requests to another replica")
        if not all(m.ready for m in registry):
            raise ServingError("HYB-706", "a model is not ready")
        return {"ready": True}

    @app.get("/v2/models/{model_name}")
    @app.get("/v2/models/{model_name}/versions/{model_version}")
    async def model_metadata(model_name: str, model_version: str | None = None) -> dict[str, Any]:
        model = registry.get(model_name, model_version)
        versions = [model.version] if model_version else registry.versions(model.name)
        return model.metadata(versions)

    @app.get("/v2/models/{model_name}/ready")
    @app.get("/v2/models/{model_name}/versions/{model_version}/ready")
    async def model_ready(model_name: str, model_version: str | None = None) -> dict[str, Any]:
        model = available_model(registry, model_name, model_version, "Model version not ready")
        if state.draining or not model.ready:
            raise ServingError("HYB-706", f"model {model.name!r} version {model.version} is not ready")
        return {"name": model.name, "version": model.version, "ready": True}

    # answered by InferRoute below FastAPI (the hot path); declared here too, so that the route exists for the
    # app's own routing (another method answers 405, as on any route) and in one place with the others
    @app.post("/v2/models/{model_name}/infer")
    @app.post("/v2/models/{model_name}/versions/{model_version}/infer")
    async def infer_route(request: Request, model_name: str, model_version: str | None = None) -> Response:
        content, json_length = await answer_infer(state, request, model_name, model_version)
        if json_length is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(json_length)})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)


def _add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def respond(code: str, message: str, hint: str | None, status: int) -> JSONResponse:
        return error_response(metrics, code, message, hint, status)

    @app.exception_handler(HybridError)
    async def hybrid_error(request: Request, e: HybridError) -> JSONResponse:
        return respond(e.code, e.message, e.hint, http_status(e.code))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = "HYB-701" if e.status_code == 404 else "HYB-702"
        return respond(code, f"{request.method} {request.url.path}: {e.detail}", None, e.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return respond("HYB-702", f"invalid request: {e.errors()}", None, 400)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, e: ClientDisconnect) -> Response:
        note_disconnect(metrics, request)
        return Response(status_code=499)  # never sent: the connection is closed

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception) -> JSONResponse:
        # the server's log has the traceback; the client gets the documented error shape and no internals
        return respond("HYB-708", f"internal server error ({type(e).__name__}) while answering "
                       f"{request.method} {request.url.path}", "retry; report it if it persists", 500)


def create_app(registry: ModelRegistry, options: ServeOptions | None = None) -> FastAPI:
    """The v2 inference API over ``registry``; the app owns the registry and closes it at shutdown.

    Args:
        registry: The loaded models.
        options: Auth token, limits, drain timeout.
    """
    options = options or ServeOptions()
    state = ServerState(registry, options)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if not state.managed:  # served by something else than the composition root (Ray Serve)
                await run_in_threadpool(state.close)

    app = FastAPI(title="pyasc inference server", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.hybrid = state
    add_triton_routes(app, state)  # first: /v2/models/stats must not match /v2/models/{model_name}
    add_generate_routes(app, state)
    _add_routes(app, state)
    _add_error_handlers(app, state.metrics)
    app.add_middleware(InferRoute, state=state)  # inside the token check, added after it
    if options.auth_token:
        app.add_middleware(_AuthMiddleware, token=options.auth_token, metrics=state.metrics)
    if options.metrics_address:  # outermost: the metrics port serves nothing else, token or not
        app.add_middleware(_MetricsPort, state=state)
    return app
