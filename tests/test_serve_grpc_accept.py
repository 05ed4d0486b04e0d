"""Calls of ModelInfer accepted ahead on grpcio's asyncio server (:mod:`hybrid.serve.grpc.accept`).

A burst of calls is answered in full and in part through the asks kept ahead; other methods are still accepted by
grpcio's own task; the server stops cleanly with asks outstanding (nothing left pending, no error reported by the
loop); where grpcio lacks the internals nothing changes; and ``pyasc serve``'s gRPC service accepts its inference
calls this way.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tests._serve_support import serving, tiny_expected, tiny_model

grpc = pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")
import tritonclient.grpc.aio as tga  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc as pb_grpc  # noqa: E402

from hybrid.serve.grpc import accept as grpc_accept  # noqa: E402
from hybrid.serve.grpc import server as grpc_server  # noqa: E402

pytestmark = pytest.mark.timeout(120)

METHOD = "/inference.GRPCInferenceService/ModelInfer"


class Echo(pb_grpc.GRPCInferenceServiceServicer):
    """Answers ModelInfer with the request's id after a short wait (so calls overlap); counts them."""

    def __init__(self) -> None:
        self.calls = 0

    async def ModelInfer(self, request, context):
        self.calls += 1
        await asyncio.sleep(0.002)  # real time: the calls of a burst overlap on grpcio's real server
        return pb.ModelInferResponse(model_name=request.model_name, id=request.id)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)


def handlers(service: Echo) -> dict:
    return {METHOD: grpc.unary_unary_rpc_method_handler(
        service.ModelInfer, request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelInferResponse.SerializeToString)}


async def started(service: Echo) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def burst(port: int, calls: int) -> tuple[list[str], bool]:
    """``calls`` ModelInfer calls at once, then ServerLive: the ids answered in order, and liveness."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        answers = await asyncio.gather(*(stub.ModelInfer(pb.ModelInferRequest(model_name="m", id=str(i)))
                                         for i in range(calls)))
        live = await stub.ServerLive(pb.ServerLiveRequest())
    return [a.id for a in answers], live.live


def run_collecting_loop_errors(main) -> tuple[object, list[dict]]:
    """``main()`` on a fresh loop; returns its result and every context the loop's exception handler got."""
    errors: list[dict] = []

    async def wrapped():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        return await main()

    return asyncio.run(wrapped()), errors


async def others_ended(limit_s: float) -> list[asyncio.Task]:
    """The loop's other tasks once none is left, or those left after ``limit_s`` (the asks end as the core fails
    them at the stop, through grpcio's poller thread, possibly after ``stop`` returned)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        left = deadline - loop.time()
        if not others or left <= 0:
            return others
        await asyncio.wait(others, timeout=left)  # then again: an ending task may have started another


def test_a_burst_is_answered_in_full_partly_through_the_asks_and_the_server_stops_cleanly():
    service = Echo()

    async def main():
        server, port = await started(service)
        asks = grpc_accept.accept_ahead(server, handlers(service), n=4)
        try:
            ids, live = await burst(port, 64)
            accepted = asks.accepted
        finally:
            await server.stop(grace=1)
        return asks, ids, live, accepted, await others_ended(30.0)

    (asks, ids, live, accepted, pending), errors = run_collecting_loop_errors(main)
    assert asks is not None, (f"grpcio {grpc.__version__} no longer has the internals accept_ahead calls "
                              "(grpc_accept._INTERNALS / _PARAMETERS): its calls are accepted one at a time")
    assert asks.methods == (METHOD,) and asks.per_method == 4
    assert ids == [str(i) for i in range(64)] and service.calls == 64
    assert 0 < accepted <= 64  # the server's own ask accepts the rest
    assert live  # a method not asked for ahead is still accepted by grpcio
    assert asks.accepted == accepted  # nothing accepted (or asked again) after the stop
    assert pending == [] and errors == []


def _without_a_function(monkeypatch):  # a release without one of them (deleting a real one breaks grpcio's own)
    monkeypatch.setattr(grpc_accept, "_INTERNALS", (*grpc_accept._INTERNALS, "_not_in_this_release"))


def _with_other_parameters(monkeypatch):  # as a release before the concurrency limit
    parameters = dict(grpc_accept._PARAMETERS)
    parameters["_handle_rpc"] = parameters["_handle_rpc"][:-1]
    monkeypatch.setattr(grpc_accept, "_PARAMETERS", parameters)


@pytest.mark.parametrize("release", [_without_a_function, _with_other_parameters])
def test_nothing_changes_where_grpcio_s_internals_are_not_the_ones_called(monkeypatch, release):
    release(monkeypatch)
    service = Echo()

    async def main():
        server, port = await started(service)
        try:
            return grpc_accept.accept_ahead(server, handlers(service)), await burst(port, 16)
        finally:
            await server.stop(grace=1)

    (asks, (ids, live)), errors = run_collecting_loop_errors(main)
    assert asks is None and ids == [str(i) for i in range(16)] and live and errors == []


def test_no_asks_for_none_wanted_or_a_server_not_started():
    service = Echo()

    async def main():
        stopped = grpc.aio.server()
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, stopped)
        server, _ = await started(service)
        try:
            return (grpc_accept.accept_ahead(server, handlers(service), n=0), grpc_accept.accept_ahead(server, {}),
                    grpc_accept.accept_ahead(stopped, handlers(service)))
        finally:
            await server.stop(grace=1)

    assert asyncio.run(main()) == (None, None, None)


def test_pyasc_serve_accepts_its_inference_calls_ahead(tmp_path, monkeypatch):
    made = []

    def recording(server, methods, n=grpc_accept.ACCEPT_AHEAD):
        made.append(grpc_accept.accept_ahead(server, methods, n))
        return made[-1]

    monkeypatch.setattr(grpc_server, "accept_ahead", recording)
    rng = np.random.default_rng(3)
    feeds = [(rng.standard_normal((1, 4)).astype(np.float32), rng.uniform(0.5, 2, (1, 1)).astype(np.float32))
             for _ in range(48)]

    async def load(url):
        client = tga.InferenceServerClient(url)
        try:
            async def one(k, x, scale):
                ins = [tga.InferInput("x", [1, 4], "FP32"), tga.InferInput("scale", [1, 1], "FP32")]
                ins[0].set_data_from_numpy(x)
                ins[1].set_data_from_numpy(scale)
                return (await client.infer("tiny", ins, request_id=str(k))).as_numpy("y")
            return await asyncio.gather(*(one(k, x, s) for k, (x, s) in enumerate(feeds)))
        finally:
            await client.close()

    with serving([tiny_model(tmp_path / "tiny.onnx")]) as srv:
        got = asyncio.run(load(srv.grpc_url))
    assert len(made) == 1 and made[0] is not None
    assert made[0].methods == (grpc_server.INFER_METHOD,) and made[0].accepted > 0
    for (x, scale), y in zip(feeds, got, strict=True):
        np.testing.assert_allclose(y, tiny_expected(x, scale)["y"], rtol=1e-5, atol=1e-6)  # float32 sums
