"""The composition root: the HTTP app on uvicorn and the gRPC service beside it, with a graceful shutdown.

:class:`HybridServer` starts both transports on one event loop (the gRPC service first, when
``ServeOptions.grpc_address`` is set) and, at shutdown, stops both and then closes the models; the
transports share only :mod:`hybrid.serve.core.state`.

On SIGTERM or SIGINT (or :meth:`BackgroundServer.stop`) the server, in order: marks itself draining
(readiness turns 503, new inference requests get HYB-706), flushes every model's queue at once instead of
waiting for batches to fill, stops accepting connections, lets the requests in flight finish and answer
(up to ``drain_timeout``), then closes the models. A second SIGINT forces the exit. The process exits 0
after a graceful drain.

Connections are guarded below the application (:class:`ConnectionLimits`): uvicorn's keep-alive timeout
only runs between requests and restarts on every byte, so a client trickling a request's headers would
hold its connection forever. Each connection therefore gets a deadline for a complete request head
(``header_timeout``, from the connection's opening or the first byte of its next request) and each
request a deadline for its whole body once its head is complete (``body_timeout``), and past
``max_connections`` open connections the oldest idle one (no request in progress) is closed. HTTP parse
errors answer the documented JSON error (HYB-702) instead of uvicorn's plain text.

Memory: request bodies and batches are large, short-lived buffers allocated from many threads. glibc's
malloc raises its mmap threshold each time such a buffer is freed (up to 32 MiB), after which they come
from the heap arenas, which keep the freed pages: the server's RSS then grows under churn and is not
given back. :func:`run` pins the threshold (:func:`limit_allocator_retention`) so that large buffers are
mapped and unmapped and RSS returns to its steady state (benchmarks/soak.py measures both).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import platform
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from pydantic import Field

from hybrid.config import ConfigSection
from hybrid.errors import ServingError
from hybrid.runtime.traffic import collector
from hybrid.serve.http.infer import BODY_TIMEOUT_SCOPE_KEY

if TYPE_CHECKING:
    from fastapi import FastAPI

    from hybrid.serve.core.state import ServerState

__all__ = ["BackgroundServer", "ConnectionLimits", "HybridServer", "front_end_yields_to_compute",
           "limit_allocator_retention", "listen", "make_server", "run"]

logger = logging.getLogger("hybrid.serve")

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ConnectionLimits(ConfigSection):
    """How long and how many connections may stay open without a request in progress.

    Checked on construction: HYB-102 for a value out of range.

    Attributes:
        header_timeout: Seconds a connection has to deliver a complete request head (request line and
            headers), counted from its opening or from the first byte of its next request; then it is closed.
        keep_alive_timeout: Seconds an idle kept-alive connection stays open between requests (uvicorn's
            ``timeout_keep_alive``).
        body_timeout: Seconds a request has to deliver its whole body once its head is complete; then the
            connection is closed (a slow upload is a disconnect with reason ``body_timeout``). None: no limit.
        max_connections: Open connections past which the oldest idle one (no request in progress) is
            closed to make room; with none idle, the new connection is closed.
    """

    header_timeout: float = Field(default=10.0, gt=0, description="seconds > 0", examples=[10.0])
    keep_alive_timeout: int = Field(default=5, ge=1, description="an int >= 1", examples=[5])
    max_connections: int = Field(default=1024, ge=1, description="an int >= 1", examples=[1024])
    body_timeout: float | None = Field(default=60.0, gt=0, description="seconds > 0 or None", examples=[60.0])


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def limit_allocator_retention(mmap_threshold: int = 256 << 10) -> bool:
    """Have glibc's malloc map every allocation of ``mmap_threshold`` bytes or more (returned on free).

    This turns off glibc's dynamic threshold, which otherwise climbs to the largest buffer freed so far
    and leaves request-sized buffers in the heap arenas, kept after use. It changes the whole process:
    :func:`run` calls it for the server process it owns, tests and notebooks (``BackgroundServer``) do not.
    Nothing happens off glibc, or when ``MALLOC_MMAP_THRESHOLD_`` is set in the environment (the user's
    own setting wins).

    Returns:
        True when the threshold was set.
    """
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(mmap_threshold)))
    except (OSError, AttributeError):
        return False


def _bad_request(message: str) -> bytes:
    """The raw HTTP/1.1 answer to a request the HTTP parser refused: the documented JSON error, then close."""
    body = json.dumps({"error": f"[HYB-702] malformed HTTP request: {message}", "code": "HYB-702",
                       "hint": "send a valid HTTP/1.1 request"}).encode()
    return (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


def guarded_protocol(base: type[asyncio.Protocol], limits: ConnectionLimits,
                     on_drop: Callable[[str], None] = lambda reason: None) -> type[asyncio.Protocol]:
    """Uvicorn's HTTP protocol class ``base`` (httptools or h11) with a header deadline and a connection cap.

    Both uvicorn protocols make a new ``cycle`` when a request's headers are complete and clear its
    ``more_body`` when its body is complete, which is all this relies on. ``on_drop(reason)`` is called for
    each connection closed without a request in progress ('header_timeout', 'connection_limit'); a body
    deadline marks the request's scope (:data:`BODY_TIMEOUT_SCOPE_KEY`) and the application reports it.
    """

    class Guarded(base):  # type: ignore[valid-type, misc]
        _deadline: asyncio.TimerHandle | None = None
        _body_deadline: asyncio.TimerHandle | None = None
        _opened = 0.0

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(limits.header_timeout, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _disarm_body(self) -> None:
            if self._body_deadline is not None:
                self._body_deadline.cancel()
                self._body_deadline = None

        def _body_expired(self, cycle: Any) -> None:
            self._body_deadline = None
            if self.cycle is cycle and cycle.more_body and not self.transport.is_closing():
                cycle.scope[BODY_TIMEOUT_SCOPE_KEY] = limits.body_timeout
                self.transport.close()

        def _close(self, reason: str) -> None:
            if not self.transport.is_closing():
                on_drop(reason)
                self.transport.close()

        def _expire(self) -> None:
            self._deadline = None
            if self._idle():
                logger.info("closing the connection of %s: no complete request head within %g s",
                            f"{self.client[0]}:{self.client[1]}" if self.client else "a client",
                            limits.header_timeout)
                self._close("header_timeout")

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._opened = time.monotonic()
            self._arm()
            if len(self.connections) > limits.max_connections:
                open_ = [c for c in self.connections if not c.transport.is_closing()]  # closed ones linger a tick
                if len(open_) <= limits.max_connections:
                    return
                idle = [c for c in open_ if c is not self and getattr(c, "_idle", None) and c._idle()]
                victim = min(idle, key=lambda c: c._opened) if idle else self
                logger.info("more than %d connections open: closing the oldest idle one", limits.max_connections)
                victim._close("connection_limit")

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self._idle():  # the first bytes of the next request
                self._arm()
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:  # its headers are complete: the request belongs to the app now
                self._disarm()
                self._disarm_body()
                if limits.body_timeout is not None and self.cycle.more_body:
                    self._body_deadline = self.loop.call_later(limits.body_timeout, self._body_expired,
                                                               self.cycle)
            elif self._body_deadline is not None and not self.cycle.more_body:
                self._disarm_body()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._disarm_body()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self._disarm()
            self.transport.write(_bad_request(msg))
            self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


class HybridServer(uvicorn.Server):
    """Uvicorn's server with the gRPC service beside it and the drain step before uvicorn's own graceful shutdown.

    It closes the models once both transports have stopped.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        state.managed = True

    async def serve(self, sockets: list[Any] | None = None) -> None:
        """Run both transports until shutdown: the gRPC service (when ``grpc_address`` is set), then uvicorn.

        Once uvicorn has stopped, the gRPC service stops after its in-flight calls finish (at most
        ``drain_timeout`` seconds; the drain has begun, so new ones are refused), and the models are closed
        in a worker thread. With ``repository_poll_s`` the registry's paths are polled meanwhile
        (:mod:`hybrid.serve.core.polling`), until the drain begins.
        """
        grpc_server = None
        address = self.state.options.grpc_address
        if sockets is None and self.state.options.metrics_address:  # uvicorn listens on both ports
            metrics = listen(self.state.options.metrics_address)
            self.state.metrics_port = metrics.getsockname()[1]
            sockets = [self.config.bind_socket(), metrics]
        poller = None
        try:
            if address:
                from hybrid.serve.grpc.server import start_grpc

                grpc_server, self.state.grpc_port = await start_grpc(self.state, address)
            if self.state.options.repository_poll_s is not None:
                from hybrid.serve.core.polling import RepositoryPoller

                state = self.state
                poller = RepositoryPoller(state.registry, state.options.repository_poll_s,
                                          serving=lambda: not state.draining).start()
            await super().serve(sockets)
        finally:
            if grpc_server is not None:  # in-flight calls finish (the drain has begun), new ones are refused
                self.state.begin_drain()
                await grpc_server.stop(self.state.options.drain_timeout)
            if poller is not None:  # no load begins now (draining); one under way ends before the models close
                self.state.begin_drain()
                await asyncio.get_running_loop().run_in_executor(None, poller.stop, self.state.options.drain_timeout)
            await asyncio.get_running_loop().run_in_executor(None, self.state.close)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """On SIGTERM/SIGINT: begin the drain and ask uvicorn to shut down; a second SIGINT forces the exit."""
        # the signal is not re-raised after the drain (uvicorn's default): a drained server exits 0
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
            return
        self.state.begin_drain()
        self.should_exit = True

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self.servers[0].sockets[0].getsockname()[1]


def listen(address: str) -> socket.socket:
    """A TCP socket bound to ``address`` ('host:port', '[v6]:port'; port 0: a free one), not yet listening.

    Raises:
        ServingError: HYB-710 when the port is taken.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as e:
        sock.close()
        raise ServingError("HYB-710", f"cannot listen on {address}: {e.strerror or e}",
                           "stop what listens there, or choose another port") from e
    sock.set_inheritable(True)
    return sock


def make_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, drain_timeout: float = 30.0,
                log_level: str = "warning", connections: ConnectionLimits | None = None) -> HybridServer:
    """A configured server for ``app`` (made by :func:`hybrid.serve.app.create_app`); not started.

    Args:
        app: The application.
        host: Address to bind.
        port: Port (0: any free one).
        drain_timeout: Seconds to finish in-flight requests at shutdown.
        log_level: uvicorn's log level.
        connections: Header deadline, keep-alive and connection cap (defaults: :class:`ConnectionLimits`).
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    connections = connections or ConnectionLimits()
    dropped = app.state.hybrid.metrics.dropped
    protocol = guarded_protocol(AutoHTTPProtocol, connections, lambda reason: dropped.labels(reason).inc())
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", access_log=False,
                            timeout_graceful_shutdown=max(1, round(drain_timeout)), server_header=False,
                            http=protocol, timeout_keep_alive=connections.keep_alive_timeout)
    return HybridServer(config, app.state.hybrid)


def front_end_yields_to_compute() -> bool:
    """Put the calling thread (the event loop's) and the threads it starts after this in Linux's ``SCHED_BATCH``.

    The threads started after this are gRPC's poller and event-engine threads. In ``SCHED_BATCH`` all of them
    keep their share of the CPU but no longer preempt a running thread when they wake. The models' threads keep
    the normal policy at a lower weight (:data:`hybrid.serve.core.batcher.COMPUTE_NICE`: the runtimes' pools were made
    in a thread of that scheduling while the models loaded, the batcher's runner threads set it for themselves),
    so a wake-up of the front end no longer stalls a parallel operator of the model mid-run on a loaded machine,
    and the front end still gets the CPU it needs to read and answer the requests while a batch runs.
    False where the platform has no ``SCHED_BATCH`` or refuses it.
    """
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_BATCH"):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        return False
    return True


def run(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, drain_timeout: float = 30.0,
        log_level: str = "info", connections: ConnectionLimits | None = None) -> None:
    """Serve ``app`` until SIGTERM/SIGINT, then drain and return.

    The front end runs in ``SCHED_BATCH`` (:func:`front_end_yields_to_compute`); long-lived objects are kept
    out of the garbage collector's full passes (:mod:`hybrid.runtime.traffic.collector`, ``HYBRID_GC_MAX_PAUSE_MS``).
    """
    if host not in LOOPBACK and not app.state.hybrid.options.auth_token:
        logger.warning("serving on %s without --auth-token: anyone who reaches this address can run the models",
                       host)
    limit_allocator_retention()
    policy = collector.policy_from_env()
    if policy is not None:  # the imports and the loaded models leave the collector's full passes
        collector.install(policy)
    front_end_yields_to_compute()
    make_server(app, host, port, drain_timeout, log_level, connections).run()


class BackgroundServer:
    """The server in a thread of this process (tests, benchmarks, notebooks); a context manager.

    Args:
        app: The app to serve.
        host: Address to bind (loopback by default).
        port: Port; 0 picks a free one (read it from :attr:`port`).
        drain_timeout: As for :func:`run`.
        startup_timeout: Longest time in seconds to wait for the socket to be listening.
        connections: As for :func:`make_server`.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, drain_timeout: float = 30.0,
                 startup_timeout: float = 30.0, connections: ConnectionLimits | None = None) -> None:
        self.server = make_server(app, host, port, drain_timeout, connections=connections)
        self.host = host
        self._startup_timeout = startup_timeout
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> BackgroundServer:
        """Start serving in a daemon thread and wait until the socket is listening.

        Returns:
            This server.

        Raises:
            RuntimeError: When the server did not start within ``startup_timeout`` (or its thread ended
                first); the server is stopped.
        """
        def target() -> None:
            try:
                asyncio.run(self.server.serve())
            except BaseException as e:  # reported by start() or stop()
                self._error = e

        self._thread = threading.Thread(target=target, name="hybrid-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start: {self._error!r}")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        """The bound port (the free one picked for port 0)."""
        return self.server.port

    @property
    def url(self) -> str:
        """``host:port`` of the server."""
        return f"{self.host}:{self.port}"

    def stop(self, timeout: float = 60.0) -> None:
        """Drain and stop as SIGTERM would; wait for the thread to end."""
        self.server.handle_exit(signal.SIGTERM, None)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
