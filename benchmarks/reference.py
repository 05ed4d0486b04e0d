"""The reference backend against raw ONNX Runtime and onnx.reference on the light models, batch 1.

Same process, same input (ONNX's light-model input), interleaved in blocks with pauses (the shared
harness). Goals (issue 3): ResNet-50 within 2.5x of onnxruntime's latency and at least 10x faster
than onnx.reference. ONNX Runtime runs with its default CPU session options. The reference backend
runs twice: with its default threads (the big GEMMs split over all cores, BLAS single-threaded) and
with ``num_threads=1``; the speed-up over onnx.reference uses the better of the two. Every contender's output is
checked against the model's shipped expected output before timing.

Run: ``flock /tmp/bench.lock python benchmarks/reference.py [model ...] [--blocks N] [--per-block N]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator

sys.path.insert(0, str(Path(__file__).parent))
import _harness as h
import _results

import hybrid
from hybrid.backends.onnxruntime import session_options
from hybrid.zoo.samples import LIGHT_MODELS, LIGHT_RTOL, light_expected, light_input, light_model_path


def contenders(name: str) -> tuple[dict[str, object], float]:
    path = str(light_model_path(name))
    t0 = time.perf_counter()
    cm = hybrid.compile(path, target="reference")
    compile_s = time.perf_counter() - t0
    cm1 = hybrid.compile(path, target="reference", config={"num_threads": 1})
    feed_name = cm.signature.input_names[0]
    feeds = {feed_name: light_input()}
    raw = ort.InferenceSession(path, sess_options=session_options(ort, {}), providers=["CPUExecutionProvider"])
    evaluator = ReferenceEvaluator(onnx.load(path))
    runs = {
        "hybrid reference": lambda: cm.run(feeds),
        "hybrid reference, 1 thread": lambda: cm1.run(feeds),
        "raw onnxruntime": lambda: raw.run(None, feeds),
        "onnx.reference": lambda: evaluator.run(None, feeds),
    }
    expected, rtol = light_expected(name), LIGHT_RTOL.get(name, 1e-3)
    for label, fn in runs.items():
        out = fn()
        got = next(iter(out.values())) if isinstance(out, dict) else out[0]
        if not np.allclose(got, expected, rtol=rtol, atol=1e-7):
            print(f"  note: {label} differs from the expected output of {name}")
    return runs, compile_s


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(LIGHT_MODELS))
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--per-block", type=int, default=2)
    _results.add_argument(parser, "reference")
    args = parser.parse_args(argv)
    print(f"machine: {h.machine_info()}; load average {os.getloadavg()[0]:.2f} at start\n")
    rows = []
    for name in args.models:
        runs, compile_s = contenders(name)
        t = h.interleave(runs, blocks=args.blocks, per_block=args.per_block, warmup=1, pause=0.2)
        ref, ref1, raw, onnx_ref = (h.median_ms(t[k]) for k in ("hybrid reference", "hybrid reference, 1 thread",
                                                                "raw onnxruntime", "onnx.reference"))
        best = min(ref, ref1)
        rows.append([name, ref, ref1, raw, onnx_ref, ref / raw, best / raw, onnx_ref / best, compile_s])
        print(f"{name}: reference {ref:.1f} ms (1 thread {ref1:.1f}), onnxruntime {raw:.1f} ms, "
              f"onnx.reference {onnx_ref:.1f} ms", flush=True)
    results = h.table(["model (batch 1)", "reference ms", "reference 1 thread ms", "raw onnxruntime ms",
                       "onnx.reference ms", "reference / ort", "best reference / ort", "speed-up vs onnx.reference",
                       "compile s"], rows)
    print()
    print(results)
    print(f"\nload average {os.getloadavg()[0]:.2f} at end; goals: ResNet-50 reference / onnxruntime <= 2.5, "
          "speed-up vs onnx.reference >= 10")
    if args.write_results:
        _results.write_results(args.write_results, "Reference backend speed: numpy kernels vs ONNX Runtime and "
                               "onnx.reference", _results.command_line(), results,
                               notes=f"Batch 1, same process, interleaved: {args.blocks} blocks x {args.per_block} "
                               "runs. Goals: ResNet-50 reference / onnxruntime <= 2.5, speed-up vs onnx.reference "
                               ">= 10.")


if __name__ == "__main__":
    main()
