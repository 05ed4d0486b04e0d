"""Priority levels under load: ``pyasc serve`` against the real Triton server, the same config.pbtxt in both.

Both serve hybrid.zoo's ``external_data`` classifier as ``benchmarks/vs_triton.py`` does (ONNX Runtime with the
same intra-op threads, ``max_batch_size: 8``, ``max_queue_delay_microseconds: 2000``) with ``priority_levels: 2
default_priority_level: 2``. The load is closed-loop ``tritonclient.grpc`` from ``--clients`` threads, of which
``--urgent`` send ``priority=1`` and the others nothing (the default level, 2). Each round runs both servers for
``--seconds`` in an order that alternates between rounds; the table gives medians over the rounds: throughput, and
p50 / p99 latency of the urgent clients and of the others, with pyasc / Triton ratios paired within each round.

    flock /tmp/coord/bench.lock python benchmarks/priorities.py --rounds 3 --seconds 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from vs_triton import DELAY_S, MAX_BATCH, MODEL, build_model, start_pyasc, tr, triton_repository

LEVELS = "priority_levels: 2 default_priority_level: 2"


def _config() -> str:
    return (f'name: "{MODEL}"\nmax_batch_size: {MAX_BATCH}\n'
            'input [ { name: "x" data_type: TYPE_FP32 dims: [3, 96, 96] } ]\n'
            'output [ { name: "probs" data_type: TYPE_FP32 dims: [5] } ]\n'
            f"dynamic_batching {{ max_queue_delay_microseconds: {round(DELAY_S * 1e6)} {LEVELS} }}\n")


def run_load(url: str, x: np.ndarray, clients: int, urgent: int,
             seconds: float) -> tuple[float, list[float], list[float]]:
    """(inferences per second, latencies in s of the urgent clients, of the others)."""
    import tritonclient.grpc as grpcclient

    start = threading.Barrier(clients + 1)
    stop_at = [time.perf_counter() + 1e9]
    lat: list[list[float]] = [[] for _ in range(clients)]

    def client(i: int) -> None:
        c = grpcclient.InferenceServerClient(url)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        out = grpcclient.InferRequestedOutput("probs")
        priority = 1 if i < urgent else 0
        c.infer(MODEL, [inp], outputs=[out], priority=priority)  # connect
        start.wait()
        mine = lat[i]
        while (t0 := time.perf_counter()) < stop_at[0]:
            c.infer(MODEL, [inp], outputs=[out], priority=priority)
            mine.append(time.perf_counter() - t0)
        c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    every = [v for mine in lat for v in mine]
    return len(every) / elapsed, [v for mine in lat[:urgent] for v in mine], [v for mine in lat[urgent:] for v in mine]


def _ms(values: list[float], q: float) -> float:
    return 1e3 * float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--urgent", type=int, default=2, help="clients that send priority=1")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (both servers)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="priorities-"))
    model, x = build_model(work)
    triton_repo = triton_repository(work / "triton", model, args.threads, LEVELS)
    assert LEVELS in (triton_repo / MODEL / "config.pbtxt").read_text()
    pyasc_repo = work / "pyasc"
    (pyasc_repo / MODEL / "1").mkdir(parents=True)
    (pyasc_repo / MODEL / "1" / "model.onnx").write_bytes(model.read_bytes())
    (pyasc_repo / MODEL / "config.pbtxt").write_text(_config())
    import vs_triton

    vs_triton.THREADS = args.threads
    stops = []
    try:
        triton = tr.TritonServer(triton_repo).start()
        stops.append(triton.stop)
        proc, url, _, _ = start_pyasc(pyasc_repo, "onnxruntime", 0)
        stops.append(lambda: (proc.terminate(), proc.wait(60)))
        servers = {"triton": triton.grpc_url, "pyasc": url}
        for u in servers.values():
            run_load(u, x, 4, 1, 2.0)  # first calls: connections, sessions, allocators
        rows: dict[str, list[tuple[float, float, float, float, float]]] = {s: [] for s in servers}
        for r in range(args.rounds):
            for name in (list(servers) if r % 2 == 0 else list(reversed(servers))):
                rate, urgent, others = run_load(servers[name], x, args.clients, args.urgent, args.seconds)
                row = (rate, _ms(urgent, 50), _ms(urgent, 99), _ms(others, 50), _ms(others, 99))
                rows[name].append(row)
                print(f"round {r} {name:6s} {rate:7.1f} inf/s  urgent p50 {row[1]:6.1f} p99 {row[2]:6.1f} ms  "
                      f"others p50 {row[3]:6.1f} p99 {row[4]:6.1f} ms", flush=True)
        print()
        print(f"{args.clients} gRPC clients, {args.urgent} of them at priority 1:")
        print()
        print("| server | inf/s | urgent p50 ms | urgent p99 ms | others p50 ms | others p99 ms |")
        print("|---|---|---|---|---|---|")
        for name, values in rows.items():
            med = [statistics.median(v[i] for v in values) for i in range(5)]
            print(f"| {name} | {med[0]:.0f} | {med[1]:.1f} | {med[2]:.1f} | {med[3]:.1f} | {med[4]:.1f} |")
        paired = [[a[i] / b[i] for a, b in zip(rows["pyasc"], rows["triton"], strict=True)] for i in range(5)]
        print()
        print("pyasc / Triton, median of paired rounds: throughput x{:.2f}, urgent p50 x{:.2f}, urgent p99 x{:.2f}, "
              "others p50 x{:.2f}, others p99 x{:.2f}".format(*(statistics.median(p) for p in paired)))
    finally:
        for stop in reversed(stops):
            stop()


if __name__ == "__main__":
    main()
