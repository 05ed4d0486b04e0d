"""Running the app with uvicorn, with a graceful shutdown that drains in-flight requests.

On SIGTERM or SIGINT (or :meth:`BackgroundServer.stop`) the server, in order: marks itself draining
(readiness turns 503, new inference requests get HYB-706), flushes every model's queue at once instead of
waiting for batches to fill, stops accepting connections, lets the requests in flight finish and answer
(up to ``drain_timeout``), then closes the models. A second SIGINT forces the exit. The process exits 0
after a graceful drain.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from fastapi import FastAPI

    from hybrid.serve.app import ServerState

__all__ = ["BackgroundServer", "HybridServer", "make_server", "run"]

logger = logging.getLogger("hybrid.serve")

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class HybridServer(uvicorn.Server):
    """uvicorn's server with the drain step before uvicorn's own graceful shutdown."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
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


def make_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, drain_timeout: float = 30.0,
                log_level: str = "warning") -> HybridServer:
    """A configured server for ``app`` (made by :func:`hybrid.serve.app.create_app`); not started."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", access_log=False,
                            timeout_graceful_shutdown=max(1, round(drain_timeout)), server_header=False)
    return HybridServer(config, app.state.hybrid)


def run(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, drain_timeout: float = 30.0,
        log_level: str = "info") -> None:
    """Serve ``app`` until SIGTERM/SIGINT, then drain and return."""
    if host not in LOOPBACK and not app.state.hybrid.options.auth_token:
        logger.warning("serving on %s without --auth-token: anyone who reaches this address can run the models",
                       host)
    make_server(app, host, port, drain_timeout, log_level).run()


class BackgroundServer:
    """The server in a thread of this process (tests, benchmarks, notebooks); a context manager.

    Args:
        app: The app to serve.
        host: Address to bind (loopback by default).
        port: Port; 0 picks a free one (read it from :attr:`port`).
        drain_timeout: As for :func:`run`.
        startup_timeout: Longest time in seconds to wait for the socket to be listening.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, drain_timeout: float = 30.0,
                 startup_timeout: float = 30.0) -> None:
        self.server = make_server(app, host, port, drain_timeout)
        self.host = host
        self._startup_timeout = startup_timeout
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> BackgroundServer:
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
        return self.server.port

    @property
    def url(self) -> str:
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
