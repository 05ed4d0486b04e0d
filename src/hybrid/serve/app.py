"""The FastAPI application: the KServe v2 REST API, metrics, auth and request limits.

``create_app(registry, options)`` is the one factory for both the single-machine server (uvicorn) and
the Ray Serve replicas. Routes: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``,
``/v2/models/{m}[/versions/{v}]``, ``.../ready``, ``POST .../infer`` and ``GET /metrics``, Triton's
extensions (:mod:`hybrid.serve.triton_http`: config, stats, repository index/load/unload). Inference
goes through the transports' shared path (:func:`hybrid.serve.state.infer`); the gRPC service is started
beside this app by the composition root (:mod:`hybrid.serve.server`), not by it. Every error
is ``{"error": "[HYB-7xx] ...", "code": ..., "hint": ...}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import hmac
import logging
import zlib
from collections.abc import AsyncIterator, Callable
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
from hybrid.serve.metrics import CONTENT_TYPE, ServerMetrics
from hybrid.serve.protocol import Limits, Precheck, check_head, encode_response, parse_request
from hybrid.serve.repository import ModelRegistry
from hybrid.serve.state import EXTENSIONS, Decoded, ServeOptions, ServerState, http_status, infer
from hybrid.serve.triton_http import add_triton_routes

__all__ = ["ServeOptions", "ServerState", "create_app", "http_status"]

logger = logging.getLogger("hybrid.serve")

LIVE_PATH = "/v2/health/live"
# set in a request's ASGI scope by the server (hybrid.serve.server) when it closed the connection because the
# body did not arrive in time: the disconnect is then reported with reason "body_timeout"
BODY_TIMEOUT_SCOPE_KEY = "pyasc.body_timeout"
_PARSE_INLINE = 64 << 10  # a body above this is decoded in a worker thread, not on the event loop
def _error_body(code: str, message: str, hint: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": f"[{code}] {message}", "code": code}
    if hint:
        body["hint"] = hint
    return body


class _AuthMiddleware:
    """Bearer-token check before any route runs (liveness excepted: orchestrators probe it bare)."""

    def __init__(self, app: ASGIApp, token: str, metrics: ServerMetrics) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, root = scope.get("path", ""), scope.get("root_path", "")
        if root and path.startswith(root):  # mounted under a prefix (a Ray Serve route_prefix)
            path = path[len(root):]
        if scope["type"] == "http" and path != LIVE_PATH:
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                self.metrics.http_errors.labels("HYB-703").inc()
                what = "no Authorization header" if not given else "a wrong bearer token"
                body = _error_body("HYB-703", f"this server requires a bearer token; the request has {what}",
                                   "send 'Authorization: Bearer <token>' (the server's --auth-token)")
                await JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _too_large(limit: int) -> ServingError:
    return ServingError("HYB-704", f"the request body exceeds {limit} bytes (after decompression)",
                        "send a smaller batch, or start the server with a larger --max-body")


async def read_body(request: Request, limit: int,
                    head: tuple[int, Callable[[bytes], object]] | None = None) -> bytes:
    """The request body, decompressed (gzip/deflate Content-Encoding), refused past ``limit`` bytes.

    The limit applies to the bytes received and to the decompressed bytes as they are produced, so
    neither a long upload nor a compression bomb is ever held in memory beyond it.

    Args:
        request: The request.
        limit: Most bytes accepted.
        head: ``(n, check)``: for an uncompressed body, ``check`` gets its first ``n`` bytes as soon as they
            have arrived, and its errors stop the reading (a request refused from its header is not read).

    Raises:
        ServingError: HYB-704 past the limit, HYB-702 for a bad or unsupported encoding.
    """
    declared = byte_count("Content-Length", request.headers.get("content-length"))
    if declared is not None and declared > limit:
        raise _too_large(limit)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        decoder = None
    elif encoding in ("gzip", "x-gzip"):
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        decoder = zlib.decompressobj(zlib.MAX_WBITS)
    else:
        raise ServingError("HYB-702", f"unsupported Content-Encoding {encoding!r}",
                           "send the body uncompressed, gzip or deflate")
    parts: list[bytes] = []
    received = produced = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise _too_large(limit)
            if decoder is None:
                parts.append(chunk)
                if head is not None and received >= head[0]:
                    parts = [b"".join(parts)]
                    head[1](parts[0][:head[0]])
                    head = None
                continue
            data = chunk
            while data:
                out = decoder.decompress(data, limit - produced + 1)
                produced += len(out)
                if produced > limit:
                    raise _too_large(limit)
                parts.append(out)
                data = decoder.unconsumed_tail
        if decoder is not None:
            tail = decoder.flush()
            produced += len(tail)
            if produced > limit:
                raise _too_large(limit)
            parts.append(tail)
            if not decoder.eof or decoder.unused_data:
                raise ServingError("HYB-702", f"the {encoding} body is truncated or has trailing bytes",
                                   "compress the whole body once")
    except zlib.error as e:
        raise ServingError("HYB-702", f"the body is not valid {encoding} data: {e}") from e
    return b"".join(parts)


def byte_count(header: str, value: str | None) -> int | None:
    """A header's byte count: ASCII digits only (``str.isdigit`` also takes '²' and other Unicode digits).

    Raises:
        ServingError: HYB-702 naming the header and the value.
    """
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise ServingError("HYB-702", f"{header} must be a byte count of ASCII digits, got {value[:40]!r}",
                           f"send {header} as a decimal number of bytes")
    return int(text)


def _header_length(request: Request) -> int | None:
    return byte_count("Inference-Header-Content-Length", request.headers.get("inference-header-content-length"))


def _head_check(request: Request, header_length: int | None, limits: Limits,
                precheck: Precheck) -> tuple[int, Callable[[bytes], object]] | None:
    """For a binary-extension request with a small JSON header: the check of that header alone.

    This is the request's pre-decode check; :func:`parse_request` then does not repeat it.
    """
    if header_length is None or header_length > _PARSE_INLINE:
        return None
    if request.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        return None
    total = byte_count("Content-Length", request.headers.get("content-length"))
    binary = total - header_length if total is not None and total >= header_length else None
    return header_length, lambda header: check_head(header, binary, limits, precheck)


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "a client"


def _add_routes(app: FastAPI, state: ServerState) -> None:
    registry, metrics, limits = state.registry, state.metrics, state.options.limits

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "pyasc", "version": __version__, "extensions": EXTENSIONS}

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
        model = registry.get(model_name, model_version)
        if state.draining or not model.ready:
            raise ServingError("HYB-706", f"model {model.name!r} version {model.version} is not ready")
        return {"name": model.name, "version": model.version, "ready": True}

    @app.post("/v2/models/{model_name}/infer")
    @app.post("/v2/models/{model_name}/versions/{model_version}/infer")
    async def infer_route(request: Request, model_name: str, model_version: str | None = None) -> Response:
        model = state.model(model_name, model_version)
        parsed: list[Any] = []

        async def decode() -> Decoded:
            header_length = _header_length(request)
            checked: list[bool] = []

            def precheck_once(feeds: Any) -> None:
                model.precheck(feeds)
                checked.append(True)

            body = await read_body(request, limits.max_body, _head_check(request, header_length, limits,
                                                                         precheck_once))
            # the declared inputs are checked against the model before their data is decoded (here unless
            # the header was checked on its own as it arrived); a large body (JSON, BYTES elements) is
            # decoded in a worker thread so the event loop keeps answering
            precheck = None if checked else model.precheck
            if len(body) > _PARSE_INLINE:
                found = await run_in_threadpool(parse_request, body, header_length, limits, precheck)
            else:
                found = parse_request(body, header_length, limits, precheck)
            parsed.append(found)
            return Decoded(found.inputs, found.timeout_s)

        content, json_length = await infer(
            state, model, decode, lambda outputs: encode_response(model.name, model.version, parsed[0], outputs))
        if await request.is_disconnected():  # gone while its request ran: nobody to answer
            raise ClientDisconnect()
        if json_length is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(json_length)})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)


def _add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def respond(code: str, message: str, hint: str | None, status: int) -> JSONResponse:
        metrics.http_errors.labels(code).inc()
        headers = {"Retry-After": "1"} if status == 503 else None
        return JSONResponse(_error_body(code, message, hint), status, headers=headers)

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
        # one line, no traceback: a client that hangs up is routine, not a server fault
        timeout = request.scope.get(BODY_TIMEOUT_SCOPE_KEY)
        metrics.dropped.labels("body_timeout" if timeout else "client_disconnect").inc()
        if timeout:
            logger.info("closed the connection of %s: the body of %s %s did not arrive within %g s",
                        _client(request), request.method, request.url.path, timeout)
        else:
            logger.info("client %s disconnected before the answer to %s %s", _client(request), request.method,
                        request.url.path)
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
    _add_routes(app, state)
    _add_error_handlers(app, state.metrics)
    if options.auth_token:
        app.add_middleware(_AuthMiddleware, token=options.auth_token, metrics=state.metrics)
    return app
