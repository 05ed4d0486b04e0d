"""Calls of the inference method accepted ahead, on grpcio's asyncio server.

grpcio's asyncio server asks the gRPC core for one call of each method at a time: its accepting task awaits the
next call, starts a task for it and only then asks for the one after. Every ask is answered through grpcio's poller
thread and a turn of the event loop, so a burst of ``ModelInfer`` calls waits in the core to be accepted one loop
turn after another, each turn behind whatever else the loop is doing (and, on a loaded machine, behind the wait
for a core). This keeps :data:`ACCEPT_AHEAD` more asks outstanding for the methods that carry the load, each
re-armed from its own completion callback, so calls that arrive together are handed over together and start at the
loop's next turn.

It drives the same grpcio functions the server's own accepting task calls (``AioServer._make_request_call_future``,
``cygrpc._handle_rpc``, ``cygrpc._schedule_rpc_coro``, ``cygrpc._MethodResolver``). They are not public: where
the installed grpcio does not have them (another release), :func:`accept_ahead` does nothing and says so in the
debug log, and the server accepts calls as grpcio does.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

__all__ = ["ACCEPT_AHEAD", "AheadAsks", "accept_ahead"]

logger = logging.getLogger("hybrid.serve")

ACCEPT_AHEAD = 8
"""How many more calls of a method the core may hand over before the event loop asks again.

An ask costs only its bookkeeping (one pending call state) until a call arrives; a burst larger than this is still
accepted, at grpcio's own pace for the rest. Against grpcio's one ask, eight took 10 % (a model's load) to 30 %
(every answer from the response cache) off the front end's CPU per call at 16 clients, and 2, 8 or 32 cost the same
(``benchmarks/vs_triton.py``, benchmarks/history/RESULTS-to-2026-12-07.md): most of the gain is the second
ask. Eight leaves room for a full batch of the usual ``max_batch_size`` arriving at once.
"""


@dataclass
class AheadAsks:
    """The asks :func:`accept_ahead` keeps outstanding on a server.

    Attributes:
        methods: The methods asked for, by full name.
        per_method: Asks kept outstanding per method.
        accepted: Calls accepted through these asks so far (the server's own ask accepts the others).
    """

    methods: tuple[str, ...]
    per_method: int
    accepted: int = 0


_INTERNALS = ("_MethodResolver", "_RequestCallError", "_handle_rpc", "_schedule_rpc_coro")
_PARAMETERS = {  # the functions called, with the parameters they are called with (grpcio 1.6x-1.8x)
    "_handle_rpc": ("method_name", "method_resolver", "interceptors", "rpc_state", "loop", "concurrency_exceeded"),
    "_schedule_rpc_coro": ("rpc_coro", "rpc_state", "loop", "method_name"),
}


def _internals_fit(cygrpc: Any, core: Any) -> bool:
    """Whether this grpcio has the internals :func:`accept_ahead` calls, taking the parameters it passes.

    A call accepted here and then not handled would hang until its deadline, so a release whose functions take
    other parameters is not used at all.
    """
    if core is None or not all(hasattr(cygrpc, name) for name in _INTERNALS):
        return False
    if not (hasattr(core, "_make_request_call_future") and hasattr(core, "is_running")):
        return False
    for name, parameters in _PARAMETERS.items():
        try:
            found = tuple(inspect.signature(getattr(cygrpc, name)).parameters)
        except (TypeError, ValueError):  # no signature to read
            return False
        if found != parameters:
            return False
    return True


def accept_ahead(server: grpc.aio.Server, handlers: Mapping[str, grpc.RpcMethodHandler],
                 n: int = ACCEPT_AHEAD) -> AheadAsks | None:
    """Keep ``n`` more asks for calls of each of ``handlers``' methods outstanding on a started ``server``.

    Call it on the server's event loop, after ``await server.start()``; the asks end when the server stops. The
    handlers must be the server's own for those methods (the server must have no interceptors: the calls accepted
    here are handled without them).

    Args:
        server: A started ``grpc.aio`` server.
        handlers: Method handlers by full method name (``/package.Service/Method``), registered on ``server``.
        n: Asks per method (0: none).

    Returns:
        The asks, counting the calls they accept; None where none were made (``n`` 0, no handlers, a server not
        running, or an installed grpcio without the internals: nothing changed).
    """
    from grpc._cython import cygrpc

    core = getattr(server, "_server", None)
    if n <= 0 or not handlers:
        return None
    if not _internals_fit(cygrpc, core):
        logger.debug("grpcio %s has no internals to accept calls ahead with; it accepts them one at a time",
                     grpc.__version__)
        return None
    if not core.is_running():
        return None
    loop = asyncio.get_running_loop()
    resolver = cygrpc._MethodResolver([], dict(handlers))
    running: set[asyncio.Task[Any]] = set()  # the loop holds tasks weakly
    asks = AheadAsks(tuple(handlers), n)

    def ask(method: str) -> None:
        core._make_request_call_future(method.encode()).add_done_callback(
            lambda future: accepted(method, future))

    def accepted(method: str, future: asyncio.Future[Any]) -> None:
        if future.cancelled():  # the server is stopping
            return
        error = future.exception()
        if error is not None:  # the core failed the ask: asked again as grpcio does, unless the server stops
            if isinstance(error, cygrpc._RequestCallError) and core.is_running():
                ask(method)
            elif core.is_running():  # an error that asking again would repeat: grpcio's own ask goes on
                logger.warning("calls of %s are no longer accepted ahead: %r", method, error)
            return
        state = future.result()
        asks.accepted += 1
        handling = cygrpc._handle_rpc(method, resolver, (), state, loop, False)
        task = loop.create_task(cygrpc._schedule_rpc_coro(handling, state, loop, method))
        running.add(task)
        task.add_done_callback(running.discard)
        if core.is_running():
            ask(method)

    for method in handlers:
        for _ in range(n):
            ask(method)
    return asks
