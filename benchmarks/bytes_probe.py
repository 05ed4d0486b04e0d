"""One hostile request against the in-process server: a BYTES input of 16,000,000 zero-length elements.

The request (a 64 MB binary body, under the default body limit) goes to ONNX's light SqueezeNet, which takes
FP32, while another thread polls ``GET /v2/health/live`` every 10 ms. Printed per try: the status and error
code, the request's answer time, and the health checks' worst and median latency. It uses only names that
existed before issue 17 (``BackgroundServer``, ``build_registry``, ``create_app``), so it measures an older
tree too: ``PYTHONPATH=<tree>/src python benchmarks/bytes_probe.py [--tries 2]``.

``--json N`` sends instead a plain JSON request of about N zeros for the FP32 input, shaped
[N // 150528, 3, 224, 224] (a body of 2N bytes), plus an input the model does not have, so that it is refused
(400 HYB-402) once its JSON is parsed: what parsing a large JSON body costs the other requests.
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
    parser.add_argument("--json", type=int, default=0, metavar="N", help="send N zeros as plain JSON instead")
    args = parser.parse_args()

    import onnx

    from hybrid.serve import BackgroundServer, build_registry, create_app
    from hybrid.zoo.samples import light_model_batch_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "squeezenet.onnx"
        onnx.save(light_model_batch_dynamic("squeezenet"), path)
        server = BackgroundServer(create_app(build_registry([path], target="onnxruntime"))).start()
        try:
            head = json.dumps({"inputs": [{"name": "data_0", "shape": [args.count], "datatype": "BYTES",
                                           "parameters": {"binary_data_size": 4 * args.count}}]}).encode()
            body = head + bytes(4 * args.count)
            headers = {"Inference-Header-Content-Length": str(len(head))}
            if args.json:  # N zeros for an FP32 image batch, plus an input the model does not have: 400 HYB-402
                rows = max(1, args.json // 150528)
                body = (b'{"inputs":[{"name":"data_0","shape":[%d,3,224,224],"datatype":"FP32","data":[' % rows
                        + b"0," * (rows * 150528 - 1) + b'0]},{"name":"extra","shape":[1],"datatype":"FP32",'
                        b'"data":[0]}]}')
                headers = {}
            print(f"body {len(body) / 1e6:.1f} MB")
            for _ in range(args.tries):
                latencies: list[float] = []
                stop = threading.Event()
                poller = threading.Thread(target=poll, args=(server.port, latencies, stop))
                poller.start()
                time.sleep(0.2)
                t0 = time.perf_counter()
                status, answer = request(server.port, "POST", "/v2/models/squeezenet/infer", body, headers)
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
