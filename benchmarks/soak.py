"""The server under attack and churn (issue 17): hostile probes, then a soak with disconnecting clients.

The server runs in its own process (``hybrid.serve.run``, 127.0.0.1 only, onnxruntime, --max-batch 8)
serving ONNX's light SqueezeNet made batch-dynamic; its resident memory is read from
``/proc/<pid>/status`` and its log (uvicorn and ``hybrid.serve`` at INFO) is written to a file.

Probes (``--probes``, on by default; each bounded):

- ``bytes16m``: a binary request declaring a BYTES input of 16,000,000 zero-length elements (a 64 MB
  body) for a model that takes FP32, sent while another thread polls ``GET /v2/health/live`` every
  10 ms: the request's answer time and status, and the health checks' worst and median latency;
- ``bytes-shape``: a BYTES shape of [16777216] with a 4-byte body: answer time and status;
- ``slowloris``: 50 sockets sending a request head one byte a second for up to 15 s, against the server's
  header deadline (``--header-timeout``, 10 s by default): how long each stayed open, and the latency
  of valid requests sent meanwhile.

Soak: ``--clients`` (32) asynchronous clients for ``--minutes`` (10), each sending requests back to
back. A request is a ``tritonclient.http.aio`` inference (binary tensor, ``--rows`` images) checked
against a local run of the same input, except that with probability ``--disconnect`` (5 %) the client
instead sends it from a raw socket and hangs up mid-request, cycling through three ways: half the body
then close, the whole body then close before the answer, and the request then close after the first
bytes of the answer. Reported: requests by outcome and HTTP status, disconnects made and the server's
``pyasc_connections_dropped_total`` counter (a client gone after its answer was sent is not a drop for
the server), log lines and tracebacks per disconnect, and the server's RSS, sampled every 2 s: at the
start (after a warm-up), around 1 minute (median of 45-75 s), at the end (median of the last 30 s), its
peak, and 10 s after the load stopped. ``--no-malloc-limit`` runs the server with glibc's dynamic mmap
threshold, as before issue 17, for comparison.

Run: ``flock /tmp/bench.lock python benchmarks/soak.py [--minutes 10] [--clients 32] [--no-probes]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _results
from _harness import machine_info, table

SERVER = """
import logging, sys
import onnx
from hybrid.zoo.samples import light_model_batch_dynamic
from hybrid.serve import build_registry, create_app
from hybrid.serve.core.repository import configure_backends
import hybrid.serve.server as server
from hybrid.serve.server import ConnectionLimits, run

path, header_timeout = sys.argv[1], float(sys.argv[2])
if sys.argv[3] == "0":  # --no-malloc-limit: glibc's dynamic mmap threshold, as before issue 17
    server.limit_allocator_retention = lambda *args, **kwargs: False
onnx.save(light_model_batch_dynamic("squeezenet"), path)
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
logging.getLogger("hybrid").setLevel(logging.INFO)
configure_backends({"onnxruntime": {"intra_op_num_threads": 1}})
registry = build_registry([path], target="onnxruntime", overrides={"max_batch": 8, "batch_timeout": 0.005,
                                                                    "max_queue": 1024})
run(create_app(registry), host="127.0.0.1", port=0, log_level="info",
    connections=ConnectionLimits(header_timeout=header_timeout))
"""
INPUT, OUTPUT = "data_0", "softmaxout_1"
DISCONNECTS = ("half the body", "whole body, gone before the answer", "gone after 16 bytes of the answer")


# ------------------------------------------------------------------------------------------------ server
class Server:
    """The server process; its log goes to ``log``."""

    def __init__(self, folder: Path, header_timeout: float, env: dict[str, str] | None = None,
                 malloc_limit: bool = True) -> None:
        self.log = folder / "server.log"
        self._log = self.log.open("w")
        argv = [sys.executable, "-c", SERVER, str(folder / "squeezenet.onnx"), str(header_timeout),
                str(int(malloc_limit))]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            m = re.search(r"Uvicorn running on http://(127\.0\.0\.1):(\d+)", self.log.read_text())
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not start:\n{self.log.read_text()[-3000:]}")

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def http(url: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 60) -> tuple[int, bytes]:
    import http.client

    host, _, port = url.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def dropped(url: str, reason: str) -> float:
    text = http(url, "GET", "/metrics")[1].decode()
    m = re.search(r'pyasc_connections_dropped_total\{reason="' + reason + r'"\} ([0-9.e+]+)', text)
    return float(m.group(1)) if m else 0.0


# ------------------------------------------------------------------------------------------------ probes
class LivePoller:
    """Polls /v2/health/live every 10 ms on a kept-alive connection; records each latency."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            http(self.url, "GET", "/v2/health/live", timeout=30)
            self.latencies.append(time.perf_counter() - t0)
            time.sleep(0.01)

    def __enter__(self) -> LivePoller:
        self._thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)
        self._stop.set()
        self._thread.join(60)


def binary_body(inputs: list[dict], payload: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps({"inputs": inputs}).encode()
    return head + payload, {"Inference-Header-Content-Length": str(len(head))}


def probe_bytes(server: Server) -> list[list[str]]:
    rows = []
    count = 16_000_000
    body, headers = binary_body([{"name": INPUT, "shape": [count], "datatype": "BYTES",
                                  "parameters": {"binary_data_size": 4 * count}}], bytes(4 * count))
    upload = []
    for _ in range(3):  # the time to send 64 MB to an endpoint that only reads it, for reference
        t0 = time.perf_counter()
        http(server.url, "POST", "/v2/models/nope/infer", body, headers)
        upload.append(time.perf_counter() - t0)
    for _ in range(3):
        with LivePoller(server.url) as live:
            t0 = time.perf_counter()
            status, answer = http(server.url, "POST", "/v2/models/squeezenet/infer", body, headers)
            took = time.perf_counter() - t0
        code = json.loads(answer).get("code")
        rows.append(["16M zero-length BYTES (64 MB body)", f"{status} {code}", f"{took * 1e3:.0f}",
                     f"{max(live.latencies) * 1e3:.1f}", f"{statistics.median(live.latencies) * 1e3:.1f}",
                     str(len(live.latencies))])
    rows.append(["(64 MB upload to an unknown model: 404)", "404 HYB-701", f"{min(upload) * 1e3:.0f}", "", "", ""])
    del body
    body, headers = binary_body([{"name": INPUT, "shape": [16_777_216], "datatype": "BYTES",
                                  "parameters": {"binary_data_size": 4}}], bytes(4))
    with LivePoller(server.url) as live:
        t0 = time.perf_counter()
        status, answer = http(server.url, "POST", "/v2/models/squeezenet/infer", body, headers)
        took = time.perf_counter() - t0
    rows.append(["BYTES shape [16777216], 4-byte body", f"{status} {json.loads(answer).get('code')}",
                 f"{took * 1e3:.1f}", f"{max(live.latencies) * 1e3:.1f}",
                 f"{statistics.median(live.latencies) * 1e3:.1f}", str(len(live.latencies))])
    return rows


def probe_slowloris(server: Server, sockets: int = 50, limit_s: float = 15.0) -> list[list[str]]:
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 64

    def trickle() -> float:
        with socket.create_connection((server.host, server.port), timeout=5) as s:
            t0 = time.monotonic()
            for byte in head:
                if time.monotonic() - t0 > limit_s:
                    break
                try:
                    s.sendall(bytes([byte]))
                    s.settimeout(1.0)
                    if s.recv(1) == b"":
                        return time.monotonic() - t0
                except TimeoutError:
                    continue
                except OSError:
                    return time.monotonic() - t0
            return float("inf")

    results: list[float] = []
    threads = [threading.Thread(target=lambda: results.append(trickle()), daemon=True) for _ in range(sockets)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    latencies = []
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    body, headers = binary_body([{"name": INPUT, "shape": [1, 3, 224, 224], "datatype": "FP32",
                                  "parameters": {"binary_data_size": x.nbytes}}], x.tobytes())
    stop = time.monotonic() + limit_s
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        status, _ = http(server.url, "POST", "/v2/models/squeezenet/infer", body, headers)
        assert status == 200
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.5)
    for t in threads:
        t.join(limit_s + 10)
    closed = [r for r in results if r != float("inf")]
    return [[f"{sockets} sockets, 1 byte/s", f"{len(closed)}/{sockets}",
             f"{min(closed):.1f}-{max(closed):.1f}" if closed else "-",
             f"{statistics.median(latencies) * 1e3:.0f}", f"{max(latencies) * 1e3:.0f}", str(len(latencies))]]


# ------------------------------------------------------------------------------------------------ soak
async def disconnecting_request(server: Server, body: bytes, headers: dict[str, str], kind: int) -> None:
    """Send an inference request from a raw socket and hang up mid-request (three ways, by ``kind``)."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    head = (f"POST /v2/models/squeezenet/infer HTTP/1.1\r\nHost: soak\r\nContent-Length: {len(body)}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    try:
        if kind == 0:  # half the body
            writer.write(head + body[:len(body) // 2])
            await writer.drain()
        elif kind == 1:  # the whole body, then gone before the answer
            writer.write(head + body)
            await writer.drain()
        else:  # the request, then gone after the first bytes of the answer
            writer.write(head + body)
            await writer.drain()
            await asyncio.wait_for(reader.read(16), 60)
    finally:
        sock = writer.get_extra_info("socket")
        if sock is not None:  # reset, not a polite FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.close()


async def soak(server: Server, clients: int, seconds: float, rows: int, p_disconnect: float,
               reference: dict[int, np.ndarray], inputs: dict[int, np.ndarray]) -> dict[str, object]:
    import tritonclient.http.aio as tha
    from tritonclient.utils import InferenceServerException

    outcomes: Counter[str] = Counter()
    disconnects = [0]
    kinds: Counter[str] = Counter()
    bodies = {}
    for seed, x in inputs.items():
        bodies[seed] = binary_body([{"name": INPUT, "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}], x.tobytes())
    rss: list[tuple[float, float]] = []
    t_start = time.monotonic()
    deadline = t_start + seconds

    async def sampler() -> None:
        while time.monotonic() < deadline:
            rss.append((time.monotonic() - t_start, server.rss_mb()))
            await asyncio.sleep(2)

    async def client(i: int) -> None:
        rng = random.Random(i)
        triton = tha.InferenceServerClient(server.url, conn_limit=1, conn_timeout=120)
        try:
            while time.monotonic() < deadline:
                seed = rng.choice(list(inputs))
                if rng.random() < p_disconnect:
                    kind = disconnects[0] % 3
                    disconnects[0] += 1  # before the await: the other clients take the next kinds
                    kinds[DISCONNECTS[kind]] += 1
                    with contextlib.suppress(OSError, TimeoutError):
                        await disconnecting_request(server, *bodies[seed], kind)
                    continue
                inp = tha.InferInput(INPUT, list(inputs[seed].shape), "FP32")
                inp.set_data_from_numpy(inputs[seed], binary_data=True)
                try:
                    result = await triton.infer("squeezenet", [inp], outputs=[tha.InferRequestedOutput(OUTPUT)])
                except InferenceServerException as e:
                    outcomes[f"error {e.status()}"] += 1
                    continue
                except Exception as e:  # a transport failure on the client side
                    outcomes[f"client {type(e).__name__}"] += 1
                    continue
                ok = np.allclose(result.as_numpy(OUTPUT), reference[seed], rtol=1e-4, atol=1e-5)
                outcomes["200 correct" if ok else "200 WRONG"] += 1
        finally:
            await triton.close()

    await asyncio.gather(sampler(), *(client(i) for i in range(clients)))
    rss.append((time.monotonic() - t_start, server.rss_mb()))
    return {"outcomes": outcomes, "disconnects": disconnects[0], "kinds": kinds, "rss": rss,
            "seconds": time.monotonic() - t_start}


def rss_around(samples: list[tuple[float, float]], lo: float, hi: float) -> float:
    """The median RSS sampled between ``lo`` and ``hi`` seconds (requests in flight make single samples noisy)."""
    window = [r for t, r in samples if lo <= t <= hi] or [min(samples, key=lambda s: abs(s[0] - lo))[1]]
    return statistics.median(window)


# ------------------------------------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="soak duration")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rows", type=int, default=1, help="images per request")
    parser.add_argument("--disconnect", type=float, default=0.05, help="fraction of requests that hang up")
    parser.add_argument("--header-timeout", type=float, default=10.0, help="the server's --header-timeout")
    parser.add_argument("--no-probes", action="store_true", help="skip the hostile probes")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment of the server process (e.g. MALLOC_ARENA_MAX=2); repeatable")
    parser.add_argument("--no-malloc-limit", action="store_true",
                        help="leave glibc's dynamic mmap threshold alone (the server's behaviour before issue 17)")
    _results.add_argument(parser, "soak")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.server_env)
    parts = []  # each part's heading and table, printed as it ends and written together with --write-results

    import onnxruntime as ort

    print(machine_info())
    if env:
        print("server environment: " + " ".join(f"{k}={v}" for k, v in env.items()))
    print("allocator: " + ("glibc's dynamic mmap threshold (--no-malloc-limit)" if args.no_malloc_limit
                           else "mmap threshold pinned at 256 KiB (hybrid.serve.server.limit_allocator_retention)"))
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), args.header_timeout, env, not args.no_malloc_limit)
        try:
            if not args.no_probes:
                parts.append("### Hostile requests (the health check polled every 10 ms meanwhile)\n\n"
                             + table(["request", "answer", "answer ms", "health worst ms", "health median ms",
                                      "health checks"], probe_bytes(server)))
                print("\n" + parts[-1])
                parts.append(f"### Slow header senders (--header-timeout {args.header_timeout:g})\n\n"
                             + table(["attack", "closed by the server", "closed after s", "valid request median ms",
                                      "valid request worst ms", "valid requests"], probe_slowloris(server)))
                print("\n" + parts[-1])
            session = ort.InferenceSession(str(Path(tmp) / "squeezenet.onnx"), providers=["CPUExecutionProvider"])
            rng = np.random.default_rng(0)
            inputs = {s: rng.random((args.rows, 3, 224, 224), dtype=np.float32) for s in range(8)}
            reference = {s: session.run([OUTPUT], {INPUT: x})[0] for s, x in inputs.items()}
            asyncio.run(soak(server, 4, 10, args.rows, 0.0, reference, inputs))  # warm-up
            log_before = len(server.log_lines())
            drops_before = dropped(server.url, "client_disconnect")
            result = asyncio.run(soak(server, args.clients, args.minutes * 60, args.rows, args.disconnect,
                                      reference, inputs))
            time.sleep(10)
            idle_rss = server.rss_mb()
            lines = server.log_lines()[log_before:]
            drops = dropped(server.url, "client_disconnect") - drops_before
            alive = http(server.url, "GET", "/v2/health/live")[0]
        finally:
            server.stop()
    samples = result["rss"]
    last = samples[-1][0]
    start, one, end = samples[0][1], rss_around(samples, 45, 75), rss_around(samples, last - 30, last)
    peak = max(r for _, r in samples)
    n = result["disconnects"]
    tracebacks = sum("Traceback" in line for line in lines)
    heading = (f"### Soak: {args.clients} clients, {result['seconds'] / 60:.1f} min, {args.rows} image(s) per request, "
               f"{args.disconnect:.0%} of requests hang up mid-request")
    outcomes = result["outcomes"]
    rows = [[k, str(v)] for k, v in sorted(outcomes.items())]
    rows += [["disconnects made (raw sockets)", f"{n} (" + ", ".join(f"{k}: {v}" for k, v in
                                                                 result["kinds"].items()) + ")"],
             ["server's pyasc_connections_dropped_total{reason=\"client_disconnect\"}", f"{drops:.0f}"],
             ["server log lines during the soak", f"{len(lines)} ({len(lines) / max(n, 1):.2f} per disconnect)"],
             ["tracebacks in the log", str(tracebacks)],
             ["requests per second (all)", f"{(sum(outcomes.values()) + n) / result['seconds']:.1f}"],
             ["RSS start / 1 min / end / peak (MB)", f"{start:.0f} / {one:.0f} / {end:.0f} / {peak:.0f}"],
             ["RSS end vs 1 min", f"{(end - one) / one:+.1%}"],
             ["RSS 10 s after the soak, idle (MB)", f"{idle_rss:.0f}"],
             ["/v2/health/live after", str(alive)]]
    rss = "RSS samples (s, MB): " + ", ".join(f"{t:.0f}:{r:.0f}" for t, r in samples[::15])
    parts.append(f"{heading}\n\n{table(['measure', 'value'], rows)}\n\n{rss}")
    print("\n" + parts[-1])
    if args.write_results:
        _results.write_results(args.write_results, "Serving under attack and churn (issue 17)", _results.command_line(),
                               "\n\n".join(parts))


if __name__ == "__main__":
    main()
