"""What batching can buy on this machine at all: SqueezeNet's cost per image through raw ONNX Runtime.

Every way of spending the cores on the batch-dynamic light SqueezeNet (the model of
``benchmarks/batching.py``), measured in rounds that interleave the configurations, reported as the
median milliseconds per image over the rounds:
- 16 caller threads each running batch 1 on one session (what an unbatched server does);
- one caller running batch 1, 2, 4, 8, 16 with 2 intra-op threads (what a batcher does), also with
  ONNX Runtime's thread spinning on for batch 16;
- two caller threads, each running sub-batches of 1, 4 or 8 on a single-threaded session (a batcher
  that splits its batch across the cores).

When the best batched configuration costs about as much per image as 16 concurrent batch-1 callers,
no dynamic batcher can beat unbatched serving on this model here: the cores are already busy with
arithmetic at batch 1. The ratio column is (16 concurrent batch-1 callers) / (configuration): above 1
means that configuration is faster per image.

Run: ``flock /tmp/bench.lock python benchmarks/batching_ceiling.py [--seconds 2 --rounds 3]``.
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
import onnxruntime as ort

from hybrid.zoo.samples import light_model_batch_dynamic

sys.path.insert(0, str(Path(__file__).parent))
import _harness as h
import _results


def _session(model: bytes, intra: int, spinning: bool) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = intra
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def ms_per_image(run: Callable[[np.ndarray], object], callers: int, batch: int, seconds: float) -> float:
    """``callers`` threads each running batches of ``batch`` back to back for ``seconds``."""
    x = np.random.default_rng(batch).random((batch, 3, 224, 224), dtype=np.float32)
    run(x)
    done = [0] * callers
    stop = time.perf_counter() + seconds

    def caller(i: int) -> None:
        while time.perf_counter() < stop:
            run(x)
            done[i] += batch

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (time.perf_counter() - t0) / max(1, sum(done)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per configuration per round")
    parser.add_argument("--rounds", type=int, default=3)
    _results.add_argument(parser, "batching_ceiling")
    args = parser.parse_args()
    model = light_model_batch_dynamic("squeezenet").SerializeToString()
    two, one, spin = _session(model, 2, False), _session(model, 1, False), _session(model, 2, True)

    def run(s: ort.InferenceSession) -> Callable[[np.ndarray], object]:
        return lambda x: s.run(None, {"data_0": x})

    configs: dict[str, tuple[Callable[[np.ndarray], object], int, int]] = {
        "16 callers x batch 1, 2 threads (unbatched)": (run(two), 16, 1),
        **{f"1 caller x batch {b}, 2 threads": (run(two), 1, b) for b in (1, 2, 4, 8, 16)},
        "1 caller x batch 16, 2 threads, spinning": (run(spin), 1, 16),
        **{f"2 callers x batch {b}, 1 thread each": (run(one), 2, b) for b in (1, 4, 8)},
    }
    names = list(configs)
    results: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            results[name].append(ms_per_image(*configs[name], seconds=args.seconds))
            time.sleep(0.2)
    base = statistics.median(results[names[0]])
    rows = [[n, f"{statistics.median(v):.3f}", f"{base / statistics.median(v):.2f}"] for n, v in results.items()]
    print(h.machine_info())
    print(f"SqueezeNet (batch-dynamic light model), raw onnxruntime {ort.__version__}, {args.rounds} rounds x "
          f"{args.seconds:g} s\n")
    table = h.table(["configuration", "ms per image (median)", "x unbatched"], rows)
    best = min((n for n in names if configs[n][2] > 1), key=lambda n: statistics.median(results[n]))
    summary = (f"best batched configuration: {best}, {base / statistics.median(results[best]):.2f}x the "
               "unbatched cost per image (a batcher's ceiling here)")
    print(table)
    print(f"\n{summary}")
    if args.write_results:
        _results.write_results(args.write_results, "What batching can buy on 2 cores (raw ONNX Runtime only)",
                               _results.command_line(), table, notes=f"SqueezeNet (batch-dynamic light model), "
                               f"{args.rounds} rounds x {args.seconds:g} s. {summary}.")


if __name__ == "__main__":
    main()
