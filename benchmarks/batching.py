"""Dynamic batching under concurrent load: 16 callers on SqueezeNet through onnxruntime.

Contenders, each driven by the same number of caller threads that send one image per request, back to
back, for a fixed time (closed loop), interleaved in blocks with a pause between contenders:
- raw onnxruntime, unbatched: every caller runs ``InferenceSession.run`` on its own image;
- hybrid, unbatched: every caller runs the ``CompiledModel`` (target 'onnxruntime');
- hybrid dynamic_batch: every caller goes through ``@hybrid.dynamic_batch(max_batch=16)``, which runs the
  same CompiledModel once per batch.

The light SqueezeNet has a static batch of 1; the script runs a batch-dynamic copy made by
``hybrid.make_batch_dynamic`` (``hybrid.zoo.samples.light_model_batch_dynamic``) and checks that
onnxruntime runs it at batch 16 with the same numbers as 16 runs at batch 1.

A fourth row, one caller running batches of 16 on the raw session, is the ceiling any batcher can reach
on this hardware. A second model, a small MLP whose batch-1 run is a memory-bound matrix-vector product,
shows the case where batching pays on a CPU.

Run: ``flock /tmp/bench.lock python benchmarks/batching.py [--callers 16 --seconds 3 --blocks 3]``.
Goal: batched throughput >= 1.3x hybrid unbatched. Prints p50/p99 latency per contender.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
import _harness as h
import _results

import hybrid
from hybrid.backends.onnxruntime import session_options
from hybrid.zoo.samples import light_input, light_model_batch_dynamic


def closed_loop(call: Callable[[np.ndarray], object], images: list[np.ndarray], seconds: float,
                per_call: int = 1) -> tuple[float, list[float]]:
    """One caller thread per image, each calling back to back for ``seconds``; return (requests/s, latencies).

    ``per_call``: requests one call answers (for the batch-16 reference that runs 16 images per call).
    """
    start = threading.Barrier(len(images) + 1)
    stop_at = [0.0]
    latencies: list[list[float]] = [[] for _ in images]

    def caller(i: int) -> None:
        x = images[i]
        mine = latencies[i]
        start.wait()
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at[0]:
                return
            call(x)
            mine.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(len(images))]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + seconds
    t_begin = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t_begin
    flat = [v for per in latencies for v in per]
    return per_call * len(flat) / elapsed, flat


def mlp(features: int = 512, hidden: int = 2048, classes: int = 10) -> onnx.ModelProto:
    """A three-layer MLP with batch dim 'N' and random weights made here (about 21 MB of fp32)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    dims = [features, hidden, hidden, classes]
    inits, nodes, prev = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(dims[i + 1], np.float32),
                                                                              f"b{i}")]
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"g{i}"]))
        prev = f"g{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def bench(title: str, model: onnx.ModelProto, input_name: str, base: np.ndarray, args: argparse.Namespace) -> str:
    """Run the four contenders on one model; print and return its table and the batched / unbatched ratio."""
    options = {"allow_spinning": args.spinning == "on"}
    cm = hybrid.compile(model, "onnxruntime", config=options)
    raw = ort.InferenceSession(model.SerializeToString(), sess_options=session_options(ort, options),
                               providers=["CPUExecutionProvider"])
    images = [base + np.float32(0.01 * i) for i in range(args.callers)]

    # the model runs at batch 16 and agrees with per-image runs
    stacked = np.concatenate([images[i % len(images)] for i in range(16)])
    at16 = raw.run(None, {input_name: stacked})[0]
    assert at16.shape[0] == 16
    for i in range(16):
        one = raw.run(None, {input_name: stacked[i:i + 1]})[0]
        np.testing.assert_allclose(at16[i:i + 1], one, rtol=1e-4, atol=1e-5)

    @hybrid.dynamic_batch(max_batch=16, timeout=args.timeout)
    def batched(xs: list[np.ndarray]) -> np.ndarray:
        return cm(np.concatenate(xs))  # row i answers request i

    np.testing.assert_allclose(batched(images[3])[None], cm(images[3]), rtol=1e-4, atol=1e-5)

    ceiling = "raw onnxruntime, one caller, batch 16"  # what batching can reach: no queueing at all
    contenders: dict[str, Callable[[np.ndarray], object]] = {
        "raw onnxruntime, unbatched": lambda x: raw.run(None, {input_name: x}),
        "hybrid, unbatched": cm,
        "hybrid dynamic_batch(16)": batched,
        ceiling: lambda x: raw.run(None, {input_name: x}),
    }
    loads = {name: ([stacked], 16) if name == ceiling else (images, 1) for name in contenders}
    for name, call in contenders.items():  # warm-up
        closed_loop(call, loads[name][0], 0.5, loads[name][1])
    throughput: dict[str, list[float]] = {n: [] for n in contenders}
    latency: dict[str, list[float]] = {n: [] for n in contenders}
    names = list(contenders)
    for b in range(args.blocks):
        for name in names[b % len(names):] + names[:b % len(names)]:
            rps, lats = closed_loop(contenders[name], loads[name][0], args.seconds, loads[name][1])
            throughput[name].append(rps)
            latency[name].extend(lats)
            time.sleep(0.5)
    batched.close()
    stats = batched.stats()

    base_rps = statistics.median(throughput["hybrid, unbatched"])
    rows = []
    for name in names:
        rps = statistics.median(throughput[name])
        rows.append([name, rps, h.percentile(latency[name], 50) * 1e3, h.percentile(latency[name], 99) * 1e3,
                     rps / base_rps])
    ratio = statistics.median(throughput["hybrid dynamic_batch(16)"]) / base_rps
    text = (f"### {title}: onnxruntime CPU, {args.callers} concurrent callers, {args.blocks} blocks x "
            f"{args.seconds:g} s, spinning {args.spinning}\n\n"
            + h.table(["contender", "requests/s (median)", "p50 ms", "p99 ms", "x hybrid unbatched"], rows)
            + f"\n\ndynamic_batch: {stats.batches} batches, mean size {stats.mean_batch_size:.1f}, max "
            f"{stats.max_batch_size}, mean queue wait {stats.mean_queue_wait_s * 1e3:.1f} ms, "
            f"p99 queue wait {stats.p99_queue_wait_s * 1e3:.1f} ms\n"
            f"batched / unbatched throughput: {ratio:.2f}x (goal >= 1.3x): {'PASS' if ratio >= 1.3 else 'MISS'}")
    print(text + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=0.01, help="dynamic_batch timeout (s)")
    parser.add_argument("--spinning", choices=("on", "off"), default="off",
                        help="ORT intra-op spinning, same for every contender")
    parser.add_argument("--models", default="squeezenet,mlp", help="comma-separated: squeezenet, mlp")
    _results.add_argument(parser, "batching")
    args = parser.parse_args()
    print(f"machine: {h.machine_info()}\n")
    wanted = args.models.split(",")
    sections = []
    if "squeezenet" in wanted:
        model = light_model_batch_dynamic("squeezenet")
        sections.append(bench("SqueezeNet (light, batch-dynamic copy)", model, "data_0", light_input(), args))
    if "mlp" in wanted:
        x = np.random.default_rng(1).standard_normal((1, 512)).astype(np.float32)
        sections.append(bench("MLP 512-2048-2048-10 (fp32, 21 MB of weights)", mlp(), "x", x, args))
    if args.write_results:
        _results.write_results(args.write_results, "Dynamic batching", _results.command_line(), "\n\n".join(sections))


if __name__ == "__main__":
    main()
