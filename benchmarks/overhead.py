"""What hybrid adds on top of ONNX Runtime per call.

CompiledModel on target='onnxruntime' vs a raw ``InferenceSession.run`` built with the same session
options, same process, same inputs, interleaved in blocks:
- SqueezeNet (light model, batch 1): median latency ratio (goal <= 1.03);
- a one-MatMul model: microseconds added per call (goal <= 20 µs).

Run: ``python benchmarks/overhead.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).parent))
import _harness as h
import _results

import hybrid
from hybrid.backends.onnxruntime import session_options
from hybrid.zoo.samples import light_input, light_model_path


def tiny_matmul() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 16], np.eye(16, dtype=np.float32).ravel().tolist())
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def pair(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> dict[str, object]:
    cm = hybrid.compile(model, target="onnxruntime")
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else Path(model).read_bytes()
    raw = ort.InferenceSession(data, sess_options=session_options(ort, {}), providers=["CPUExecutionProvider"])
    ref = raw.run(None, feeds)[0]
    got = cm.run(feeds)[cm.signature.output_names[0]]
    assert np.array_equal(ref, got), "hybrid and raw onnxruntime disagree"
    return {"raw onnxruntime": lambda: raw.run(None, feeds), "hybrid (onnxruntime)": lambda: cm.run(feeds)}


def per_call(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _results.add_argument(ap, "overhead")
    args = ap.parse_args()
    print(f"machine: {h.machine_info()}\n")
    squeeze = pair(str(light_model_path("squeezenet")), {"data_0": light_input()})
    t = h.interleave(squeeze, blocks=10, per_block=20, warmup=10, pause=0.1)
    raw_ms, hyb_ms = h.median_ms(t["raw onnxruntime"]), h.median_ms(t["hybrid (onnxruntime)"])

    tiny = pair(tiny_matmul(), {"x": np.ones((1, 16), np.float32)})
    raw_us, hyb_us = [], []
    for b in range(15):  # blocks of many calls: per-call means, then the median over blocks
        order = ["raw onnxruntime", "hybrid (onnxruntime)"][:: 1 if b % 2 else -1]
        for name in order:
            v = per_call(tiny[name], 2000) * 1e6
            (raw_us if name == "raw onnxruntime" else hyb_us).append(v)
            time.sleep(0.05)
    raw_t, hyb_t = float(np.median(raw_us)), float(np.median(hyb_us))
    rows = [
        ["SqueezeNet b1 (ms)", raw_ms, hyb_ms, hyb_ms / raw_ms, "ratio <= 1.03"],
        ["one MatMul (µs)", raw_t, hyb_t, hyb_t - raw_t, "added <= 20 µs"],
    ]
    results = h.table(["case", "raw onnxruntime", "hybrid", "ratio / added", "goal"], rows)
    print(results)
    if args.write_results:
        _results.write_results(args.write_results, "Overhead of hybrid over raw ONNX Runtime", _results.command_line(),
                               results)


if __name__ == "__main__":
    main()
