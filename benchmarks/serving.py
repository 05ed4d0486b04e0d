"""Serving throughput: dynamic batching vs one inference per request, same runtime, over loopback.

Two models, each served by ``pyasc serve`` (its command function, in its own process, bound to
127.0.0.1) with onnxruntime on the CPU, in two configurations:

- ``batched``: --max-batch 16 --batch-timeout 0.005: requests queue and run in batches;
- ``naive``: --max-batch 0: every request runs its own inference as it arrives (in the server's thread
  pool), the usual hand-written model server.

Models:

- ``squeezenet``: ONNX's light SqueezeNet made batch-dynamic (the data input's and the output's first
  dim set to the symbol 'N'; checked here to run at batch 16 in ONNX Runtime and to match batch 1);
- ``densecnn``: a small CNN built here with a dynamic batch (2 strided convs on 3x64x64, then dense
  layers 4096 -> 4096 -> 1000, 80 MB of weights), the shape of model whose batch-1 cost is reading
  its weights, which batching shares.

Load: 32 concurrent tritonclient.http clients (binary tensors), each sending its own input; every
response is checked against a local run of that input. The two servers take turns in blocks (order
rotated, a pause between), 100 requests per client per server in all. Reported: throughput, p50/p99
latency, the mean batch the server formed (from its /metrics), throughput relative to ``naive``; and,
to explain the ratios, the runtime's own time per image at batch 1, 4 and 16 (in this process).

Run: ``flock /tmp/bench.lock python benchmarks/serving.py [--blocks 4] [--per-block 25]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
import _results
from _harness import interleave, machine_info, median_ms, percentile, table

CLIENTS = 32
SERVER = ("import sys; from hybrid.cli.serve import serve; "
          "serve([sys.argv[1]], port=0, target='onnxruntime', max_batch=int(sys.argv[2]), batch_timeout=0.005, "
          "max_queue=1024, log_level='info')")
CONTENDERS = {"batched": 16, "naive": 0}


# ------------------------------------------------------------------------------------------------ models
def dynamic_squeezenet(folder: Path) -> Path:
    """The light SqueezeNet with a symbolic batch, checked to run at batch 16 in ONNX Runtime."""
    import onnxruntime as ort

    from hybrid.zoo.samples import light_model_batch_dynamic

    model = light_model_batch_dynamic("squeezenet")
    path = folder / "squeezenet.onnx"
    onnx.save(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((16, 3, 224, 224), dtype=np.float32)
    y16 = session.run(None, {"data_0": x})[0]
    y1 = session.run(None, {"data_0": x[5:6]})[0]
    assert y16.shape == (16, 1000, 1, 1) and np.allclose(y16[5:6], y1, rtol=1e-4, atol=1e-6)
    return path


def dense_cnn(folder: Path, hidden: int = 4096) -> Path:
    """Conv(3->32, s2) Relu Conv(32->64, s2) Relu MaxPool Flatten Gemm(4096->hidden) Relu Gemm(->1000) Softmax."""
    rng = np.random.default_rng(0)

    def he(name: str, shape: tuple[int, ...], fan_in: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)

    def zeros(name: str, n: int) -> onnx.TensorProto:
        return numpy_helper.from_array(np.zeros(n, np.float32), name)

    inits = [he("w1", (32, 3, 3, 3), 27), zeros("b1", 32), he("w2", (64, 32, 3, 3), 288), zeros("b2", 64),
             he("w3", (4096, hidden), 4096), zeros("b3", hidden), he("w4", (hidden, 1000), hidden),
             zeros("b4", 1000)]
    node = helper.make_node
    nodes = [node("Conv", ["image", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
             node("Relu", ["c1"], ["r1"]),
             node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
             node("Relu", ["c2"], ["r2"]),
             node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Flatten", ["p2"], ["f"], axis=1),
             node("Gemm", ["f", "w3", "b3"], ["g3"]), node("Relu", ["g3"], ["r3"]),
             node("Gemm", ["r3", "w4", "b4"], ["g4"]), node("Softmax", ["g4"], ["probs"], axis=1)]
    graph = helper.make_graph(nodes, "densecnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                                ["N", 3, 64, 64])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 1000])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    path = folder / "densecnn.onnx"
    onnx.save(model, path)
    return path


@dataclass(frozen=True)
class Case:
    build: Callable[[Path], Path]
    shape: tuple[int, ...]
    input: str
    output: str


CASES = {"squeezenet": Case(dynamic_squeezenet, (3, 224, 224), "data_0", "softmaxout_1"),
         "densecnn": Case(dense_cnn, (3, 64, 64), "image", "probs")}


# ------------------------------------------------------------------------------------------------ servers
def start_server(model: Path, max_batch: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(model), str(max_batch)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"Uvicorn running on http://(127\.0\.0\.1:\d+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise RuntimeError(f"server for {model.name} (max_batch={max_batch}) did not start")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    proc.stdout.close()


def load(url: str, case: Case, name: str, inputs: list[np.ndarray], expected: list[np.ndarray],
         per_client: int) -> tuple[float, list[float], int, int]:
    """CLIENTS clients x per_client requests; returns wall seconds, latencies, errors, mismatches."""
    import tritonclient.http as th

    def client(cid: int) -> tuple[list[float], int, int]:
        c = th.InferenceServerClient(url, network_timeout=300.0)
        inp = th.InferInput(case.input, list(inputs[cid].shape), "FP32")
        inp.set_data_from_numpy(inputs[cid], binary_data=True)
        out = th.InferRequestedOutput(case.output, binary_data=True)
        times, errors, mismatches = [], 0, 0
        try:
            for _ in range(per_client):
                t0 = time.perf_counter()
                try:
                    y = c.infer(name, [inp], outputs=[out]).as_numpy(case.output)
                except Exception:
                    errors += 1
                    continue
                times.append(time.perf_counter() - t0)
                mismatches += not np.allclose(y, expected[cid], rtol=1e-4, atol=1e-6)
        finally:
            c.close()
        return times, errors, mismatches

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(client, range(CLIENTS)))
    wall = time.perf_counter() - t0
    return wall, [t for r in results for t in r[0]], sum(r[1] for r in results), sum(r[2] for r in results)


def mean_batch(url: str, name: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode()
    count = re.search(rf'pyasc_batch_size_count\{{model="{name}",version="1"\}} ([0-9.e+]+)', text)
    total = re.search(rf'pyasc_batch_size_sum\{{model="{name}",version="1"\}} ([0-9.e+]+)', text)
    return float(total.group(1)) / float(count.group(1)) if count and float(count.group(1)) else float("nan")


# ------------------------------------------------------------------------------------------------ runs
def runtime_per_image(model: Path, case: Case) -> list[float]:
    """ms per image of the compiled model itself at batch 1, 4, 16 (the servers' runtime settings)."""
    import hybrid
    from hybrid.serve.core.repository import configure_backends

    configure_backends(None)
    cm = hybrid.compile(model, target="onnxruntime")
    xs = {b: np.random.default_rng(b).random((b, *case.shape), dtype=np.float32) for b in (1, 4, 16)}
    times = interleave({b: (lambda b=b: cm.run({case.input: xs[b]})) for b in xs}, blocks=4, per_block=4)
    cm.close()
    return [median_ms(times[b]) / b for b in xs]


def serve_case(name: str, case: Case, folder: Path, blocks: int, per_block: int) -> tuple[list[list], list[float]]:
    import hybrid

    model = case.build(folder)
    rng = np.random.default_rng(1)
    inputs = [rng.random((1, *case.shape), dtype=np.float32) for _ in range(CLIENTS)]
    local = hybrid.compile(model, target="onnxruntime")
    expected = [local.run({case.input: x})[case.output] for x in inputs]
    local.close()
    per_image = runtime_per_image(model, case)
    servers = {label: start_server(model, mb) for label, mb in CONTENDERS.items()}
    stats = {label: {"wall": 0.0, "times": [], "errors": 0, "mismatches": 0} for label in servers}
    try:
        labels = list(servers)
        for label in labels:  # warm-up (first runs allocate), not counted
            load(servers[label][1], case, name, inputs, expected, 2)
        for block in range(blocks):
            for label in labels[block % 2:] + labels[:block % 2]:
                time.sleep(0.5)
                wall, times, errors, mismatches = load(servers[label][1], case, name, inputs, expected, per_block)
                for key, value in (("wall", wall), ("times", times), ("errors", errors), ("mismatches", mismatches)):
                    stats[label][key] += value
                print(f"{name} block {block} {label}: {len(times) / wall:.1f} req/s", flush=True)
        batches = {label: mean_batch(url, name) for label, (_, url) in servers.items()}
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    naive = len(stats["naive"]["times"]) / stats["naive"]["wall"]
    rows = []
    for label, s in stats.items():
        tput = len(s["times"]) / s["wall"]
        rows.append([name, label, CONTENDERS[label], len(s["times"]) + s["errors"], s["errors"], s["mismatches"],
                     tput, percentile(s["times"], 50) * 1e3, percentile(s["times"], 99) * 1e3, batches[label],
                     tput / naive])
    return rows, per_image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--per-block", type=int, default=25, help="requests per client per block")
    parser.add_argument("--models", nargs="*", choices=list(CASES), default=list(CASES))
    _results.add_argument(parser, "serving")
    args = parser.parse_args()
    rows, runtime_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            case_rows, per_image = serve_case(name, CASES[name], Path(tmp), args.blocks, args.per_block)
            rows += case_rows
            runtime_rows.append([name, *per_image, per_image[0] / per_image[2]])
    print(f"\nServing over loopback: {CLIENTS} concurrent tritonclient.http clients x "
          f"{args.blocks * args.per_block} requests each, binary tensors, onnxruntime CPU, one server process "
          f"per row\n{machine_info()}\n")
    results = (table(["model", "server", "max_batch", "requests", "errors", "mismatches", "req/s", "p50 ms", "p99 ms",
                      "mean batch", "x naive"], rows)
               + "\n\nThe runtime alone (same process, interleaved): ms per image by batch size\n\n"
               + table(["model", "batch 1", "batch 4", "batch 16", "batch 1 / batch 16"], runtime_rows))
    print(results)
    if args.write_results:
        _results.write_results(args.write_results, "Serving: dynamic batching in pyasc serve", _results.command_line(),
                               results, notes=f"{CLIENTS} concurrent tritonclient.http clients x "
                               f"{args.blocks * args.per_block} requests each, binary tensors, onnxruntime CPU, one "
                               "server process per row.")


if __name__ == "__main__":
    main()
