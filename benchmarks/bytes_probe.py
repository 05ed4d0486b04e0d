"""One hostile request against the in-process server: a BYTES input of 16,000,000 zero-length elements.

The request (a 64 MB binary body, under the default body limit) goes to ONNX's light SqueezeNet, which takes
FP32, while another thread polls ``GET /v2/health/live`` every 10 ms. Printed per try: the status and error
code, the request's answer time, and the health checks' worst and median latency. It uses only names that
existed before issue 17 (``BackgroundServer``, ``build_registry``, ``create_app``), so it measures an older
tree too: ``PYTHONPATH=<tree>/src python benchmarks/bytes_probe.py [--tries 2]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path


def request(port: int, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def poll(port: int, latencies: list[float], stop: threading.Event) -> None:
    """GET /v2/health/live every 10 ms until ``stop``; append each latency."""
    while not stop.is_set():
        t0 = time.perf_counter()
        request(port, "GET", "/v2/health/live")
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=2)
    parser.add_argument("--count", type=int, default=16_000_000, help="BYTES elements declared")
    args = parser.parse_args()

    import onnx

    from hybrid.samples import light_model_batch_dynamic
    from hybrid.serve import BackgroundServer, build_registry, create_app

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "squeezenet.onnx"
        onnx.save(light_model_batch_dynamic("squeezenet"), path)
        server = BackgroundServer(create_app(build_registry([path], target="onnxruntime"))).start()
        try:
            head = json.dumps({"inputs": [{"name": "data_0", "shape": [args.count], "datatype": "BYTES",
                                           "parameters": {"binary_data_size": 4 * args.count}}]}).encode()
            body = head + bytes(4 * args.count)
            for _ in range(args.tries):
                latencies: list[float] = []
                stop = threading.Event()
                poller = threading.Thread(target=poll, args=(server.port, latencies, stop))
                poller.start()
                time.sleep(0.2)
                t0 = time.perf_counter()
                status, answer = request(server.port, "POST", "/v2/models/squeezenet/infer", body,
                                         {"Inference-Header-Content-Length": str(len(head))})
                took = time.perf_counter() - t0
                time.sleep(0.2)
                stop.set()
                poller.join()
                print(f"{status} {json.loads(answer).get('code')}: answer {took * 1e3:.0f} ms; health worst "
                      f"{max(latencies) * 1e3:.0f} ms, median {statistics.median(latencies) * 1e3:.1f} ms "
                      f"({len(latencies)} checks)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
