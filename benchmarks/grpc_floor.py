"""The floor of a Python gRPC front end: CPU per request of a servicer that only returns a canned answer.

``pyasc serve``'s front end is grpcio's asyncio server (on uvloop, in ``SCHED_BATCH``). This measures what that
server costs per request when the handler does nothing: a ``ModelInfer`` servicer that returns a prebuilt
``ModelInferResponse`` after ``--delay-ms`` (an ``asyncio.sleep``, no CPU: it stands in for the model, so the
request rate matches a real server's; the per-request cost of a Python gRPC server grows as the rate falls, each
request paying its own wake-ups), in a child process, loaded by the same unmodified ``tritonclient.grpc`` closed
loop as ``vs_triton.py``. Also grpcio's thread-pool server (``--kinds sync``) with ``time.sleep``, and the asyncio
server with the method behind a generic handler alone (``aio-generic``: grpcio's generated ``add_..._to_server``
also registers every method with the core, and its accepting loop then waits on one pending call per method), and
the asyncio server with N more asks for ``ModelInfer`` calls outstanding, as ``pyasc serve`` keeps
(``aio-aheadN``, :mod:`hybrid.serve.grpc.accept`). A kind followed by ``+NAME`` runs with the gRPC core experiment
NAME (``GRPC_EXPERIMENTS``; each server is a fresh process, started with ``spawn``). Reported:
requests per second and the server's CPU per request (``/proc``, Linux), per kind, interleaved over
``--rounds``. Compare with the ``front end us/inf`` column of ``vs_triton.py`` at the same rate.

    flock /tmp/coord/bench.lock python benchmarks/grpc_floor.py --clients 16 --delay-ms 8 --rounds 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _triton_real as tr
from vs_triton import MODEL, cpu_by_role, load


def serve(kind: str, port: int, delay_s: float, ready: mp.synchronize.Event) -> None:
    """The canned-answer server of ``kind`` ('aio': grpc.aio on uvloop, or 'sync': the thread-pool server)."""
    import asyncio
    import time
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    if hasattr(os, "SCHED_BATCH"):  # as pyasc's front end runs
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    answer = pb.ModelInferResponse(model_name=MODEL, model_version="1")
    answer.outputs.add(name="probs", datatype="FP32", shape=[1, 5])
    answer.raw_output_contents.append(np.zeros((1, 5), np.float32).tobytes())
    address = f"127.0.0.1:{port}"
    kind = kind.split("+")[0]  # "+name" parts were gRPC experiments, set in the environment (main)
    if kind == "sync":
        class Sync(pb_grpc.GRPCInferenceServiceServicer):
            def ModelInfer(self, request, context):
                time.sleep(delay_s)
                return answer

        server = grpc.server(ThreadPoolExecutor(32))
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Sync(), server)
        server.add_insecure_port(address)
        server.start()
        ready.set()
        server.wait_for_termination()
        return

    class Aio(pb_grpc.GRPCInferenceServiceServicer):
        async def ModelInfer(self, request, context):
            await asyncio.sleep(delay_s)
            return answer

    async def main() -> None:
        server = grpc.aio.server()
        servicer = Aio()
        handler = grpc.unary_unary_rpc_method_handler(  # ModelInfer's, as the generated code builds it
            servicer.ModelInfer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString)
        if kind == "aio-generic":  # the method through a generic handler alone, none registered with the core
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler}),))
        else:
            pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        server.add_insecure_port(address)
        await server.start()
        if kind.startswith("aio-ahead"):  # N more asks for ModelInfer calls, as pyasc serve keeps (aio-aheadN)
            from hybrid.serve.grpc.accept import accept_ahead

            accept_ahead(server, {"/inference.GRPCInferenceService/ModelInfer": handler}, int(kind[len("aio-ahead"):]))
        ready.set()
        await server.wait_for_termination()

    import uvloop

    uvloop.run(main())


def cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` so far, every thread whatever its role (:func:`vs_triton.cpu_by_role`)."""
    return sum(cpu_by_role(pid).values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--delay-ms", type=float, default=8.0, help="the handler's wait (no CPU) before it answers")
    ap.add_argument("--kinds", default="aio,sync",
                    help="aio, aio-generic, aio-aheadN (N more asks for ModelInfer calls), sync; a kind followed "
                         "by +NAME (repeatable) runs with the gRPC core experiment NAME (GRPC_EXPERIMENTS; -NAME "
                         "turns a default one off)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    x = np.zeros((1, 3, 96, 96), np.float32)
    kinds = args.kinds.split(",")
    procs, urls = {}, {}
    try:
        for kind in kinds:
            spawn = mp.get_context("spawn")  # a fresh gRPC core, which reads GRPC_EXPERIMENTS when it starts
            port, ready = tr.free_port(), spawn.Event()
            procs[kind] = spawn.Process(target=serve, args=(kind, port, args.delay_ms / 1e3, ready), daemon=True)
            experiments = ",".join(kind.split("+")[1:])
            saved = os.environ.get("GRPC_EXPERIMENTS")
            if experiments:
                os.environ["GRPC_EXPERIMENTS"] = experiments
            try:
                procs[kind].start()
            finally:
                os.environ.pop("GRPC_EXPERIMENTS", None)
                if saved is not None:
                    os.environ["GRPC_EXPERIMENTS"] = saved
            if not ready.wait(60):
                raise RuntimeError(f"the {kind} server did not start")
            urls[kind] = f"127.0.0.1:{port}"
            load(urls[kind], x, 4, 1.0)
        seen: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else list(reversed(kinds)):
                before = cpu_s(procs[kind].pid)
                rate, _ = load(urls[kind], x, args.clients, args.seconds)
                per = (cpu_s(procs[kind].pid) - before) / (rate * args.seconds) * 1e6
                seen[kind].append((rate, per))
                print(f"round {r} {kind:24s} {rate:7.0f} req/s  server CPU {per:5.0f} us/request", flush=True)
        print()
        head = f"server ({args.clients} clients, handler waits {args.delay_ms:g} ms)"
        print(f"| {head} | req/s | server CPU us/request |")
        print("|---|---|---|")
        for kind in kinds:
            print(f"| {kind} | {statistics.median(v[0] for v in seen[kind]):.0f} | "
                  f"{statistics.median(v[1] for v in seen[kind]):.0f} |")
    finally:
        for p in procs.values():
            p.terminate()


if __name__ == "__main__":
    main()
