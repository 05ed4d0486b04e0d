"""The HTTP inference route, ``POST /v2/models/{m}[/versions/{v}]/infer``, answered below the web framework.

Everything else the HTTP server answers goes through FastAPI (:mod:`hybrid.serve.app`); this one route is
the server's hot path, and FastAPI's routing, parameter solving and exception plumbing cost more per request
than the route's own work. :class:`InferRoute` is an ASGI middleware that recognizes the route from the
request's path and answers it itself, with the same behaviour as any route of the app:

- the body is read with its limits (:func:`read_body`: Content-Length, gzip/deflate, the decompressed size),
  and a binary-extension request's JSON header is checked against the model as soon as it has arrived,
  before the rest is read; the header is parsed once and handed on to :func:`parse_request`;
- the request goes through the transports' one inference path (:func:`hybrid.serve.core.state.infer`);
- errors answer the app's documented JSON error (:func:`error_response`), a client that hung up is counted
  and logged as the app does (:func:`note_disconnect`), anything unexpected is HYB-708 with the traceback in
  the server's log;
- the answer is compressed where the request's Accept-Encoding takes gzip or deflate (:func:`response_coding`;
  tritonclient's ``response_compression_algorithm``), as Triton's is; ``Inference-Header-Content-Length``
  stays the JSON part's length before compression.

Only the work proportional to a request's size leaves the event loop: a JSON part (or the elements of BYTES
tensors) above 64 KiB is decoded in a worker thread; binary tensors become arrays over the body, decoded inline
however large, and not copied here (the model's run aligns a tensor at an odd offset; a batch's join copies it
anyway).
"""

from __future__ import annotations

import inspect
import logging
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from hybrid.errors import HybridError, ServingError
from hybrid.serve.core.protocol import InferRequest, check_head, encode_response, parse_request
from hybrid.serve.core.state import Decoded, ServerState, http_status, infer
from hybrid.serve.observe.metrics import ServerMetrics
from hybrid.serve.observe.trace import carrier_of

if TYPE_CHECKING:
    import numpy as np

    from hybrid.serve.core.model import ServedModel
    from hybrid.serve.observe.trace import Trace
    from hybrid.serve.triton.shared_memory import SharedMemoryRegions

__all__ = ["BODY_TIMEOUT_SCOPE_KEY", "HttpDecoded", "InferRoute", "answer_infer", "byte_count", "compress",
           "error_body", "error_response", "infer_target", "note_disconnect", "read_body", "response_coding",
           "route_path"]

logger = logging.getLogger("hybrid.serve")

# set in a request's ASGI scope by the server (hybrid.serve.server) when it closed the connection because the
# body did not arrive in time: the disconnect is then reported with reason "body_timeout"
BODY_TIMEOUT_SCOPE_KEY = "pyasc.body_timeout"
PARSE_INLINE = 64 << 10  # a JSON part (or BYTES elements) above this is decoded in a worker thread
_PREFIX, _SUFFIX = "/v2/models/", "/infer"
# zlib's window bits of each HTTP content coding, both ways: request bodies and answers
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _content_encoding(request: Request) -> str | None:
    """The request body's coding, lower case; None for an uncompressed body."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    return None if encoding in ("", "identity") else encoding


def error_body(code: str, message: str, hint: str | None) -> dict[str, Any]:
    """The documented error document: ``{"error": "[HYB-7xx] ...", "code": ..., "hint": ...}``."""
    body: dict[str, Any] = {"error": f"[{code}] {message}", "code": code}
    if hint:
        body["hint"] = hint
    return body


def error_response(metrics: ServerMetrics, code: str, message: str, hint: str | None, status: int) -> JSONResponse:
    """The error answer of every HTTP route, counted in the metrics (503 adds ``Retry-After``)."""
    metrics.http_errors.labels(code).inc()
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(error_body(code, message, hint), status, headers=headers)


def note_disconnect(metrics: ServerMetrics, request: Request) -> None:
    """Count and log (one line, no traceback) a client that hung up before its answer."""
    timeout = request.scope.get(BODY_TIMEOUT_SCOPE_KEY)
    metrics.dropped.labels("body_timeout" if timeout else "client_disconnect").inc()
    client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
    if timeout:
        logger.info("closed the connection of %s: the body of %s %s did not arrive within %g s", client,
                    request.method, request.url.path, timeout)
    else:
        logger.info("client %s disconnected before the answer to %s %s", client, request.method, request.url.path)


def _too_large(limit: int) -> ServingError:
    return ServingError("HYB-704", f"the request body exceeds {limit} bytes (after decompression)",
                        "send a smaller batch, or start the server with a larger --max-body")


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
        ClientDisconnect: The client went away before the whole body came.
    """
    declared = byte_count("Content-Length", request.headers.get("content-length"))
    if declared is not None and declared > limit:
        raise _too_large(limit)
    encoding = _content_encoding(request)
    if encoding is not None and encoding not in _WBITS:
        raise ServingError("HYB-702", f"unsupported Content-Encoding {encoding!r}",
                           "send the body uncompressed, gzip or deflate")
    decoder = None if encoding is None else zlib.decompressobj(_WBITS[encoding])
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
    return parts[0] if len(parts) == 1 else b"".join(parts)


def route_path(scope: Scope) -> str:
    """The request's path below the scope's ``root_path`` (a Ray Serve route prefix), as the routes see it."""
    path: str = scope.get("path", "")
    root = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def infer_target(scope: Scope) -> tuple[str, str | None] | None:
    """``(model, version or None)`` when ``scope`` is a ``POST`` to the inference route; else None.

    The path's segments as the app's routes match them (each a non-empty run without '/'), below the
    scope's ``root_path`` when mounted under one (a Ray Serve route prefix).
    """
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path = route_path(scope)
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    parts = path[len(_PREFIX):-len(_SUFFIX)].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return parts[0], parts[2]
    return None


def _costly(body: bytes, header_length: int | None) -> bool:
    """Whether decoding ``body`` costs work proportional to its size: a large JSON part, or BYTES elements."""
    if header_length is None or not 0 < header_length <= len(body):
        return len(body) > PARSE_INLINE
    return header_length > PARSE_INLINE or (len(body) - header_length > PARSE_INLINE
                                            and body.find(b'"BYTES"', 0, header_length) >= 0)


@dataclass(slots=True, kw_only=True)
class HttpDecoded(Decoded[tuple[bytes, int | None]]):
    """An HTTP inference request, decoded: the request as :func:`parse_request` read it, for its answer.

    Attributes:
        request: The decoded request (its id, the outputs it asks for and how: binary, classes, region).
        shared_memory: The server's regions, where outputs the request puts in one are written.
    """

    request: InferRequest
    shared_memory: SharedMemoryRegions | None

    def encode(self, model: ServedModel, outputs: Mapping[str, np.ndarray]) -> tuple[bytes, int | None]:
        """The body and its JSON header's length (None: JSON) (:func:`encode_response`)."""
        return encode_response(model.name, model.version, self.request, outputs, batched=model.max_batch_size > 0,
                               labels=model.labels, shared_memory=self.shared_memory)


async def answer_infer(state: ServerState, request: Request, model_name: str, model_version: str | None,
                       trace: Trace | None = None) -> tuple[bytes, int | None]:
    """One HTTP inference request, decoded, run and encoded: the body and its JSON header's length (None: JSON).

    ``trace`` (the request's, when sampled) is stamped ``HTTP_RECV_END`` once the body is read, and by
    :func:`~hybrid.serve.core.state.infer`.

    Raises:
        HybridError: The request's error, as every transport raises it.
        ClientDisconnect: The client went away before its answer.
    """
    model = state.model(model_name, model_version)
    limits = state.options.limits

    async def decode() -> HttpDecoded:
        header_length = byte_count("Inference-Header-Content-Length",
                                   request.headers.get("inference-header-content-length"))
        heads: list[dict[str, Any]] = []

        def check_header(header: bytes) -> None:  # the pre-decode check, as the header arrives
            heads.append(check_head(header, binary, limits, model.precheck))

        head, binary = None, None
        if header_length is not None and header_length <= PARSE_INLINE and _content_encoding(request) is None:
            total = byte_count("Content-Length", request.headers.get("content-length"))
            binary = total - header_length if total is not None and total >= header_length else None
            head = (header_length, check_header)
        body = await read_body(request, limits.max_body, head)
        if trace is not None:
            trace.stamp("HTTP_RECV_END")
        # the declared inputs are checked against the model before their data is decoded: here unless the
        # header was checked (and parsed) on its own as it arrived
        header = heads[0] if heads else None
        precheck = None if heads else model.precheck
        if _costly(body, header_length):
            found = await run_in_threadpool(parse_request, body, header_length, limits, precheck, header,
                                            state.shared_memory)
        else:
            found = parse_request(body, header_length, limits, precheck, header, state.shared_memory)
        if trace is not None:
            trace.request_id = found.id or ""
        return HttpDecoded(found.inputs, found.timeout_s, found.sequence, tuple(o.name for o in found.outputs or ()),
                           found.priority, request=found, shared_memory=state.shared_memory)

    content, json_length = await infer(state, model, decode, trace)
    if await _disconnected(request.receive):  # gone while its request ran: nobody to answer
        raise ClientDisconnect()
    return content, json_length


async def _disconnected(receive: Receive) -> bool:
    """Whether the client has hung up, without waiting: ``receive`` is stepped once and left if it would wait.

    Starlette's ``Request.is_disconnected`` does the same inside a cancelled cancel scope, at about ten times
    the cost (16 against 1.2 us a call, measured in-process). With the body read, the server's next message is
    ``http.disconnect``, now or later.
    """
    step = receive()
    if not inspect.iscoroutine(step):  # (every server's receive is a coroutine function; answer regardless)
        return False
    try:
        step.send(None)
    except StopIteration as done:
        return bool(done.value and done.value.get("type") == "http.disconnect")
    step.close()  # it waits: nothing came, the client is still there
    return False


def response_coding(accept: str | None) -> str | None:
    """The Content-Encoding of an answer to a request with this Accept-Encoding: 'gzip', 'deflate' or None.

    The first of gzip and deflate the client lists with a weight above 0 (``q=0`` refuses it), as Triton
    answers; anything else (``identity``, ``*``, ``br``, no header) gets the answer uncompressed.
    """
    if not accept:
        return None
    for item in accept.split(","):
        coding, _, params = item.strip().partition(";")
        coding = coding.strip().lower()
        if coding not in ("gzip", "deflate"):
            continue
        weight = params.strip().lower()
        if weight.startswith("q="):
            try:
                if float(weight[2:]) <= 0:
                    continue
            except ValueError:
                continue
        return coding
    return None


def compress(content: bytes, coding: str) -> bytes:
    """``content`` compressed as ``coding`` ('gzip', or 'deflate': zlib's format, as HTTP means it).

    zlib's fastest level: an answer is compressed once, on the server's time, for every request that asks.
    """
    packer = zlib.compressobj(1, zlib.DEFLATED, _WBITS[coding])
    return packer.compress(content) + packer.flush()


class InferRoute:
    """ASGI middleware: answers the inference route itself (:func:`infer_target`); other requests go to ``app``.

    Args:
        app: The application below (FastAPI's stack: routing, the other routes, their error handlers).
        state: The server's state.
    """

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the inference route; pass anything else on."""
        target = infer_target(scope)
        if target is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        trace = self.state.sample(target[0])
        if trace is None:
            await self._answer(request, target, None, send)
            return
        trace.stamp("HTTP_RECV_START")
        trace.carrier = carrier_of(request.headers.items())
        try:
            await self._answer(request, target, trace, send)
        finally:
            trace.finish()

    async def _answer(self, request: Request, target: tuple[str, str | None], trace: Trace | None,
                      send: Send) -> None:
        scope, receive = request.scope, request.receive
        metrics = self.state.metrics
        try:
            content, json_length = await answer_infer(self.state, request, *target, trace)
        except ClientDisconnect:
            note_disconnect(metrics, request)
            return
        except HybridError as e:
            await error_response(metrics, e.code, e.message, e.hint, http_status(e.code))(scope, receive, send)
            return
        except Exception as e:  # the log has the traceback; the client the documented error and no internals
            logger.exception("internal error while answering POST %s", scope["path"])
            await error_response(metrics, "HYB-708", f"internal server error ({type(e).__name__}) while answering "
                                 f"POST {scope['path']}", "retry; report it if it persists", 500)(scope, receive, send)
            return
        headers = []
        if json_length is None:
            headers.append((b"content-type", b"application/json"))
        else:  # the JSON part's length in the answer as encoded, before any compression (as Triton's)
            headers += [(b"content-type", b"application/octet-stream"),
                        (b"inference-header-content-length", str(json_length).encode())]
        coding = response_coding(request.headers.get("accept-encoding"))
        if coding is not None:
            content = (await run_in_threadpool(compress, content, coding) if len(content) > PARSE_INLINE
                       else compress(content, coding))  # proportional to the answer: a large one leaves the loop
            headers.append((b"content-encoding", coding.encode()))
        headers.append((b"content-length", str(len(content)).encode()))
        if trace is not None:
            trace.stamp("HTTP_SEND_START")
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        if trace is not None:
            trace.stamp("HTTP_SEND_END")
