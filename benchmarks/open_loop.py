"""``pyasc serve`` against the real Triton server under open-loop load: requests arrive at a rate, not on answers.

A closed loop (``vs_triton.py``) sends a client's next request when its answer came: a slow server is sent less.
Many independent users are an open loop: requests arrive at random times (a Poisson process) at a rate the
server does not set, and what they see is the latency at that rate. This is perf_analyzer's
``--request-rate-range`` with ``--request-distribution poisson``.

Each request's latency counts from the time it was due (its arrival), not from when the load generator got round
to sending it, so a generator running late charges the server it was loading rather than hiding its queue (no
coordinated omission). The rates are fractions of the first server's (Triton's) closed-loop throughput at 16
clients of the same protocol, measured at the start of the run (or ``--rates``). Each (round, rate) block runs every
server for ``--seconds`` in an order that alternates between rounds; the table reports medians over the rounds of
p50/p90/p99 latency, their ratios to Triton's paired per round, the rate answered, the mean rows per model execution
(from each server's statistics) and the failed requests. Same model, repository and server settings as
``vs_triton.py``. ``--trace-rate`` adds where the time goes: the median of each stretch between the servers' trace
timestamps, with the client's send and answer beside them.

    flock /tmp/coord/bench.lock python benchmarks/open_loop.py --rounds 3 --seconds 8
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import _results
import vs_triton as vt  # (the same model, repository, servers and statistics)
from vs_triton import tr

PHASES = ("success", "queue", "compute_infer")  # Triton's inference_stats durations, per request


def stats_of(http: str) -> dict[str, tuple[int, int]]:
    """A server's (count, ns) so far of each of ``PHASES``, and ('runs', (inferences, executions))."""
    stats = vt.model_stats(http)
    out = {k: (int(stats["inference_stats"][k]["count"]), int(stats["inference_stats"][k]["ns"])) for k in PHASES}
    out["runs"] = vt.runs_in(stats)
    return out


CLIENT_TIMES: dict[str, dict[str, tuple[int, int]]] = {}  # url -> request id -> (sent, answered), monotonic ns

ANSWER_WAIT_S = 120.0  # after the last arrival, the longest wait for the answers still owed

CONNECTIONS = 16  # gRPC channels the arrivals are spread over (users on connections of their own)


def arrivals(rate: float, seconds: float, seed: int, start: float) -> Iterator[tuple[int, float]]:
    """A Poisson process of ``rate`` per second from ``start`` (``time.perf_counter``) for ``seconds``: yields each
    arrival's number and due time once it is due (sleeping until then; at once when the caller runs late)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=int(rate * seconds * 2) + 16)
    due = start
    for k, gap in enumerate(gaps):
        due += gap
        if due >= start + seconds:
            return
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        yield k, due


def open_loop(url: str, x: np.ndarray, rate: float, seconds: float,
              seed: int, protocol: str = "grpc") -> tuple[list[float], float, int, list[float]]:
    """Poisson arrivals at ``rate`` per second for ``seconds``: each answered request's latency from its arrival
    (seconds), the rate answered, the number of failed requests, and how late each request was sent (seconds
    after its arrival: the load generator's own lag).

    ``protocol`` 'grpc': ``tritonclient.grpc``'s ``async_infer`` over ``CONNECTIONS`` channels; 'grpc-stream': one
    ``ModelStreamInfer`` stream on each of them (``async_stream_infer``, perf_analyzer's ``--streaming``); 'http':
    ``tritonclient.http`` (binary tensors) from ``HTTP_WORKERS`` threads with a client each, fed in arrival order.
    """
    if protocol == "http":
        return _open_loop_http(url, x, rate, seconds, seed)
    import tritonclient.grpc as grpcclient

    clients = [grpcclient.InferenceServerClient(url) for _ in range(CONNECTIONS)]
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out = grpcclient.InferRequestedOutput("probs")
    for c in clients:  # connect
        c.infer(vt.MODEL, [inp], outputs=[out])
    lat: list[float] = []
    lags: list[float] = []
    failed = [0]
    lock = threading.Lock()
    done = threading.Semaphore(0)

    times = CLIENT_TIMES.setdefault(url, {})  # (a dict's item assignment needs no lock)

    def answered(due: float, rid: str, sent_ns: int) -> Any:
        def callback(result: Any, error: Any) -> None:
            now = time.perf_counter()
            times[rid] = (sent_ns, time.monotonic_ns())
            with lock:
                if error is not None:
                    failed[0] += 1
                else:
                    lat.append(now - due)
            done.release()
        return callback

    pending: dict[str, tuple[float, int]] = {}  # on a stream: request id -> (due, sent), until its answer

    def on_stream(result: Any, error: Any) -> None:
        rid = result.get_response().id if error is None and result is not None else None
        if rid is None or rid not in pending:
            with lock:
                failed[0] += 1
            done.release()
            return
        due, sent_ns = pending.pop(rid)
        answered(due, rid, sent_ns)(result, None)

    if protocol == "grpc-stream":
        for c in clients:
            c.start_stream(callback=on_stream)
    start = time.perf_counter()
    for k, due in arrivals(rate, seconds, seed, start):
        lags.append(max(0.0, time.perf_counter() - due))
        rid = f"{seed}-{k}"
        if protocol == "grpc-stream":
            pending[rid] = (due, time.monotonic_ns())
            clients[k % CONNECTIONS].async_stream_infer(vt.MODEL, [inp], outputs=[out], request_id=rid)
        else:
            clients[k % CONNECTIONS].async_infer(vt.MODEL, [inp], answered(due, rid, time.monotonic_ns()),
                                                 outputs=[out], request_id=rid)
    sent = len(lags)  # one per request sent
    answers_due = time.perf_counter() + ANSWER_WAIT_S
    missing = sum(not done.acquire(timeout=max(0.0, answers_due - time.perf_counter())) for _ in range(sent))
    with lock:
        failed[0] += missing  # (no answer within ANSWER_WAIT_S: counted as failed, not waited for)
    elapsed = time.perf_counter() - start
    for c in clients:
        if protocol == "grpc-stream":
            c.stop_stream()
        c.close()
    return lat, len(lat) / elapsed, failed[0], lags


HTTP_WORKERS = 64  # requests in flight at most over HTTP (tritonclient.http's infer blocks its thread)


def _open_loop_http(url: str, x: np.ndarray, rate: float, seconds: float,
                    seed: int) -> tuple[list[float], float, int, list[float]]:
    import queue

    import tritonclient.http as httpclient

    due_times: queue.SimpleQueue[tuple[float, str] | None] = queue.SimpleQueue()
    lat: list[float] = []
    lags: list[float] = []
    failed = [0]
    lock = threading.Lock()
    times = CLIENT_TIMES.setdefault(url, {})
    ready = threading.Barrier(HTTP_WORKERS + 1, timeout=60)  # a worker that cannot connect breaks it: no hang

    def worker() -> None:
        c = httpclient.InferenceServerClient(url.removeprefix("http://"))
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        out = httpclient.InferRequestedOutput("probs", binary_data=True)
        c.infer(vt.MODEL, [inp], outputs=[out])  # connect
        ready.wait()
        while (job := due_times.get()) is not None:
            due, rid = job
            sent = time.perf_counter()
            sent_ns = time.monotonic_ns()
            try:
                c.infer(vt.MODEL, [inp], outputs=[out], request_id=rid)
                ok = True
            except Exception:  # counted, as the gRPC callback counts an error
                ok = False
            now = time.perf_counter()
            times[rid] = (sent_ns, time.monotonic_ns())
            with lock:
                lags.append(max(0.0, sent - due))
                if ok:
                    lat.append(now - due)
                else:
                    failed[0] += 1
        c.close()

    threads = [threading.Thread(target=worker) for _ in range(HTTP_WORKERS)]
    for t in threads:
        t.start()
    ready.wait()
    start = time.perf_counter()
    for k, due in arrivals(rate, seconds, seed, start):
        due_times.put((due, f"{seed}-{k}"))
    for _ in threads:
        due_times.put(None)
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return lat, len(lat) / elapsed, failed[0], lags


def stretches(path: Path, client: dict[str, tuple[int, int]]) -> str:
    """The median of each stretch between consecutive timestamps of the traced requests in a trace file.

    ``client``: request id -> (sent, answered) on the client's side (``CLIENT_TIMES``), read with the same clock
    (CLOCK_MONOTONIC) as both servers' trace timestamps: ``CLIENT_SEND -> GRPC_WAITREAD_END`` is the way in to the
    handler (the client's send, the network, the gRPC server's reading), ``GRPC_SEND_END -> CLIENT_ANSWERED`` the
    way back. Triton's ``GRPC_WAITREAD_START`` (when its next read began, before the request came) is left out.
    """
    if not path.exists():
        return "no trace file"
    stamps: dict[Any, dict[str, int]] = {}
    rids: dict[Any, str] = {}
    for entry in json.loads(path.read_text() or "[]"):
        if entry.get("request_id"):
            rids[entry["id"]] = entry["request_id"]
        for t in entry.get("timestamps", []):
            stamps.setdefault(entry["id"], {})[t["name"]] = int(t["ns"])
    for tid, rid in rids.items():  # the client's send and answer on the same clock (CLOCK_MONOTONIC)
        if rid in client and tid in stamps:
            stamps[tid]["CLIENT_SEND"], stamps[tid]["CLIENT_ANSWERED"] = client[rid]
    gaps: dict[str, list[float]] = {}
    for one in stamps.values():
        one.pop("GRPC_WAITREAD_START", None)
        ordered = sorted(one.items(), key=lambda kv: kv[1])
        for (a, ta), (b, tb) in itertools.pairwise(ordered):
            gaps.setdefault(f"{a}->{b}", []).append((tb - ta) / 1e6)
    return "; ".join(f"{k} {statistics.median(v):.3f} (n={len(v)})" for k, v in gaps.items() if len(v) > 20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--fractions", default="0.3,0.6,0.85",
                    help="offered rates as fractions of Triton's closed-loop throughput at 16 clients")
    ap.add_argument("--rates", default="", help="offered rates per second instead of --fractions")
    ap.add_argument("--servers", default="triton,pyasc-ort", help="of triton, pyasc-ort, pyasc-auto")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="the src folder of another checkout: adds pyasc-ort-base, --target onnxruntime from it")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=SRC",
                    help="another pyasc-ort, from the src folder SRC of another checkout, named NAME (repeatable)")
    ap.add_argument("--protocol", choices=("grpc", "grpc-stream", "http"), default="grpc",
                    help="tritonclient.grpc (async_infer), tritonclient.grpc over one stream per connection "
                         "(async_stream_infer), or tritonclient.http (binary tensors, a thread per request in flight)")
    ap.add_argument("--trace-rate", type=int, default=0,
                    help="every server traces one request in N (Triton's --trace-config level=TIMESTAMPS, to a file); "
                         "the median of each stretch between the timestamps is printed per server at the end")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (both servers)")
    _results.add_argument(ap)
    args = ap.parse_args()
    vt.THREADS = args.threads
    names = args.servers.split(",")
    sources = {name: Path(src) for name, src in (v.split("=", 1) for v in args.variant)}
    if args.baseline is not None:
        sources["pyasc-ort-base"] = args.baseline
    work = Path(tempfile.mkdtemp(prefix="open-loop-"))
    model, x = vt.build_model(work)
    target: dict[str, str] = {}  # where each server is loaded: its gRPC or its HTTP address
    http: dict[str, str] = {}
    stops = []

    def tracing(name: str) -> list[str]:
        if not args.trace_rate:
            return []
        options = ["level=TIMESTAMPS", f"rate={args.trace_rate}", f"triton,file={work / name}-trace.json"]
        return [a for option in options for a in ("--trace-config", option)]

    try:
        if "triton" in names:
            triton = tr.TritonServer(vt.triton_repository(work / "triton", model, args.threads),
                                     extra_args=tracing("triton")).start()
            stops.append(triton.stop)
            http["triton"] = f"http://{triton.http_url}"
            target["triton"] = triton.grpc_url if args.protocol.startswith("grpc") else http["triton"]
        servers = [("pyasc-ort", "onnxruntime", 0, None), ("pyasc-auto", None, 200, None)]
        servers += [(name, "onnxruntime", 0, source) for name, source in sources.items()]
        for name, runtime, warm, source in servers:
            if name in names or source is not None:
                proc, url, _, address = vt.start_pyasc(model, runtime, warm, tuple(tracing(name)), source)
                stops.append(lambda p=proc: (p.terminate(), p.wait(60)))
                target[name], http[name] = (url if args.protocol.startswith("grpc") else address), address
        for url in target.values():  # first calls: connections, sessions, allocators
            vt.load(url, x, 4, 2.0, args.protocol)
        for name in target:  # what each pyasc server runs the model on (its statistics)
            if name != "triton":
                print(f"{name}: {vt.decision_of(http[name])}", flush=True)
        if args.rates:
            rates = [float(r) for r in args.rates.split(",")]
        else:
            capacity = vt.load(target[names[0]], x, 16, 4.0, args.protocol)[0]
            rates = [round(float(f) * capacity) for f in args.fractions.split(",")]
            print(f"{names[0]} closed loop, 16 {args.protocol} clients: {capacity:.0f} inf/s; offered rates {rates}",
                  flush=True)
        rows: dict[tuple[str, float], list[tuple[float, float, float, float, float, int]]] = {}
        for r in range(args.rounds):
            for rate in rates:
                order = list(target) if r % 2 == 0 else list(reversed(target))
                for name in order:
                    before = stats_of(http[name])
                    lat, answered, failed, lags = open_loop(target[name], x, rate, args.seconds,
                                                            seed=1000 * r + int(rate), protocol=args.protocol)
                    after = stats_of(http[name])
                    batch = (after["runs"][0] - before["runs"][0]) / max(after["runs"][1] - before["runs"][1], 1)
                    phases = "  ".join(  # mean ms per request of each of Triton's durations
                        f"{k} {(after[k][1] - before[k][1]) / 1e6 / max(after[k][0] - before[k][0], 1):.2f}"
                        for k in PHASES)
                    p50, p90, p99 = (1e3 * float(np.percentile(lat, q)) for q in (50, 90, 99))
                    late = "/".join(f"{1e3 * float(np.percentile(lags, q)):.2f}" for q in (50, 99))
                    rows.setdefault((name, rate), []).append((answered, p50, p90, p99, batch, failed))
                    print(f"round {r} rate {rate:6.0f} {name:14s} answered {answered:7.1f}/s  p50 {p50:6.2f}  "
                          f"p90 {p90:6.2f}  p99 {p99:6.2f} ms  rows/run {batch:4.2f}  failed {failed}  "
                          f"sent late p50/p99 {late} ms  server ms per request: {phases}", flush=True)
        for name in target:  # again after the load: per batch size, what the default target decided
            if name != "triton":
                print(f"{name} after the rounds: {vt.decision_of(http[name])}", flush=True)
        lines = ["| offered /s | server | answered /s | p50 ms | p90 ms | p99 ms | p50 / Triton's | p99 / Triton's "
                 "(rounds) | rows per run | failed |", "|---|---|---|---|---|---|---|---|---|---|"]
        for rate in rates:
            for name in target:
                mine = rows[(name, rate)]
                med = [statistics.median(v[i] for v in mine) for i in range(5)]
                p50_ratio = p99_ratio = ""
                if "triton" in target and name != "triton":  # paired within each round
                    base = rows[("triton", rate)]
                    p50_ratio = f"x{statistics.median(a[1] / b[1] for a, b in zip(mine, base, strict=True)):.2f}"
                    p99_ratio = vt.paired([a[3] / b[3] for a, b in zip(mine, base, strict=True)])
                lines.append(f"| {rate:.0f} | {name} | {med[0]:.0f} | {med[1]:.2f} | {med[2]:.2f} | {med[3]:.2f} "
                             f"| {p50_ratio} | {p99_ratio} | {med[4]:.2f} | {sum(v[5] for v in mine)} |")
        print()
        print("\n".join(lines))
        if args.write_results is not None:  # one section per protocol: open_loop, open_loop_http, ...
            suffix = "" if args.protocol == "grpc" else "_" + args.protocol.replace("-", "_")
            how = "--rates" if args.rates else f"--fractions {args.fractions} of {names[0]}'s closed loop at 16 clients"
            _results.write_results(args.write_results or "open_loop" + suffix,
                                   f"Open-loop load over {args.protocol}: latency at a rate, pyasc vs Triton",
                                   _results.command_line(), "\n".join(lines),
                                   notes=f"Offered rates {', '.join(f'{v:.0f}' for v in rates)} per second ({how}).")
    finally:
        for stop in reversed(stops):
            stop()
    if args.trace_rate:
        for name in target:
            print(f"{name}: median ms of each stretch: "
                  f"{stretches(work / f'{name}-trace.json', CLIENT_TIMES.get(target[name], {}))}")


if __name__ == "__main__":
    main()
