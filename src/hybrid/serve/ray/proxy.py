"""Serve's own HTTP errors, answered as the server's: a middleware for Ray Serve's HTTP proxy.

The replicas answer every error as ``{"error": "[HYB-7xx] ...", "code", "hint"}``. Some answers come
from Serve's proxy itself, as plain text: a replica that died holding the request (500), no replica able
to take it (503), Serve's request timeout (408), a path no application serves (404). This ASGI middleware
rewrites those (any 4xx/5xx answer that is not JSON) into the same JSON shape, keeping the status, and
sends a request again (up to :data:`RETRIES` times; bodies up to :data:`REPLAY_LIMIT`) when the replica
holding it died, for which Serve answers nothing at all: every v2 request is idempotent (model control,
the one that is not, is off on Ray), and Serve routes the new attempt to a live replica, or holds it until
one is back:

| status | code | when |
|---|---|---|
| 500 | HYB-708 | the replica holding the request failed or was stopped (Serve then answers nothing at all, and
  the server under it would send a bare 500) |
| 503, 429 | HYB-706, HYB-705 | no replica can take the request now (restarting, draining, back-pressure) |
| 408 | HYB-411 | Serve's request timeout |
| 404 | HYB-701 | no application serves the path (it was deleted) |

Serve (2.60) takes proxy middlewares only from ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``
(``HTTPOptions.middlewares`` is gone), read by each proxy process: :func:`hybrid.serve.ray.deployment.connect` sets it
to ``hybrid.serve.ray.proxy:middlewares`` before it starts a local instance (whose processes inherit it);
on a cluster set it in the environment of ``ray start`` on the nodes that run proxies.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ServeErrorsAsHyb", "middlewares"]

_CODES = {
    500: ("HYB-708", "the replica answering the request failed or was stopped",
          "retry: Serve sends it to a live replica"),
    503: ("HYB-706", "no replica can take the request now", "retry in a moment (replicas are starting or draining)"),
    429: ("HYB-705", "the replicas' queues are full", "retry later"),
    408: ("HYB-411", "Serve's request timeout passed", "retry, or raise Serve's request_timeout_s"),
    404: ("HYB-701", "no application serves this path", "check the URL; the application may have been deleted"),
}
_LIMIT = 64 << 10  # Serve's error texts are short; a longer body passes through as it is
RETRIES = 2  # times a request is sent again when the replica holding it died
REPLAY_LIMIT = 16 << 20  # request bodies kept for sending again; a larger request is not retried


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives the recorded request again, then waits on the client as before."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


class ServeErrorsAsHyb:
    """ASGI middleware: Serve's plain-text error answers become the server's JSON errors (see the module).

    Args:
        app: The proxy's ASGI app.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on (again, when the replica died holding it); answer Serve's errors as JSON."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        recorded: list[Message] = []
        replayable = True

        async def recording() -> Message:
            nonlocal replayable
            message = await receive()
            if message["type"] == "http.disconnect":  # the client went away: nobody to answer again
                replayable = False
            if message["type"] == "http.request" and replayable:
                recorded.append(message)
                if sum(len(m.get("body", b"")) for m in recorded) > REPLAY_LIMIT:
                    replayable = False
                    recorded.clear()
            return message

        source: Receive = recording
        failure = b""
        for attempt in range(RETRIES + 1):
            started = [False]
            try:
                if await self._attempt(scope, source, send, started):
                    return
            except Exception as e:  # the proxy failed: uvicorn would answer a bare 500 (or cut an answer)
                if started[0]:
                    raise
                failure = f"{type(e).__name__}: {e}".encode()
            whole = replayable and recorded and not recorded[-1].get("more_body", False)
            if attempt == RETRIES or not whole:
                break
            source = _replay(list(recorded), recording)  # inference is idempotent: Serve routes it anew
        await self._answer(send, {"status": 500, "headers": []}, failure)

    async def _attempt(self, scope: Scope, receive: Receive, send: Send, sent: list[bool]) -> bool:
        """One pass through Serve's proxy: True once an answer went out (Serve's own errors rewritten).

        False when Serve sent nothing at all: the replica died holding the request.
        """
        held: Message | None = None
        parts: list[bytes] = []
        started = False

        async def rewrite(message: Message) -> None:
            nonlocal held, started
            if message["type"] == "http.response.start":
                started = sent[0] = True
                headers = {k.lower(): v for k, v in message.get("headers", [])}
                if message["status"] >= 400 and not headers.get(b"content-type", b"").startswith(b"application/json"):
                    held = message
                    return
                await send(message)
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            parts.append(message.get("body", b""))
            if message.get("more_body") and sum(map(len, parts)) <= _LIMIT:
                return
            start, body, held = held, b"".join(parts), None
            if message.get("more_body"):  # not a short error text: pass it on untouched
                await send(start)
                await send({"type": "http.response.body", "body": body, "more_body": True})
                return
            await self._answer(send, start, body)

        await self.app(scope, receive, rewrite)
        return started

    @staticmethod
    async def _answer(send: Send, start: Message, body: bytes) -> None:
        status = start["status"]
        code, what, hint = _CODES.get(status, ("HYB-708", "Ray Serve answered with an error", "retry"))
        text = body.decode("utf-8", errors="replace").strip().splitlines()
        detail = f" (Ray Serve: {text[0][:300]})" if text else ""
        payload = json.dumps({"error": f"[{code}] {what}{detail}", "code": code, "hint": hint}).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def middlewares() -> list[Any]:
    """For ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=hybrid.serve.ray.proxy:middlewares``."""
    return [Middleware(ServeErrorsAsHyb)]
