"""What an in-process compile costs a serving thread: the cost online tuning's budget does not cover (issue 24).

A serving thread calls a zoo model on ONNX Runtime back to back; a second thread compiles one candidate
(``hybrid.compile(path, target=T)``) and runs it 3 times, as the tuner's lab does before a candidate's turns.
Per candidate and interpreter switch interval (``sys.setswitchinterval``; 5 ms is CPython's default), the serving
calls during the compile against the median of the 0.5 s of calls just before it: their slowdown (mean over
that median), p99 and the longest stall, and how long the compile took. Blocks alternate candidates and
intervals, ``--reps`` times; the table gives medians over the repetitions.

Run: ``python benchmarks/compile_stall.py [--model neg_dim] [--reps 3]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine_info, table

TARGETS = ("onnxruntime", "openvino", "torch")
INTERVALS = (0.005, 0.0005)


def trial(serve, path, feeds, target: str, interval: float) -> dict[str, float]:
    """One compile of ``target`` beside the serving thread, at switch interval ``interval``."""
    import hybrid

    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        base: list[float] = []
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            serve.run(feeds)
            base.append(time.perf_counter() - t0)
        done = threading.Event()

        def compile_and_warm() -> None:
            try:
                cm = hybrid.compile(path, target=target)
                for _ in range(3):
                    cm.run(feeds)
                cm.close()
            finally:
                done.set()

        during: list[float] = []
        worker = threading.Thread(target=compile_and_warm, name="compile")
        start = time.perf_counter()
        worker.start()
        while not done.is_set():
            t0 = time.perf_counter()
            serve.run(feeds)
            during.append(time.perf_counter() - t0)
        seconds = time.perf_counter() - start
        worker.join()
    finally:
        sys.setswitchinterval(before)
    median = statistics.median(base)
    lat = np.asarray(during)
    return {"compile_s": seconds, "slowdown": float(lat.mean() / median), "p99_ms": float(np.percentile(lat, 99) * 1e3),
            "max_ms": float(lat.max() * 1e3), "base_ms": median * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="neg_dim")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    import hybrid
    from hybrid import zoo
    from hybrid.hal import backend_status

    print(machine_info(), flush=True)
    m = zoo.build(args.model, folder=Path(tempfile.mkdtemp(prefix="hybrid-stall-")) / "zoo")
    feeds = m.feeds(seed=0)
    serve = hybrid.compile(m.path, target="onnxruntime")
    for _ in range(200):
        serve.run(feeds)
    targets = [t for t in TARGETS if backend_status(t).available]
    results: dict[tuple[str, float], list[dict[str, float]]] = {}
    for rep in range(args.reps):
        order = [(t, i) for t in targets for i in INTERVALS]
        if rep % 2:
            order.reverse()
        for target, interval in order:
            results.setdefault((target, interval), []).append(trial(serve, m.path, feeds, target, interval))
    rows = []
    for (target, interval), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows.append([target, f"{interval * 1e3:g}", f"{med['compile_s']:.2f}", f"{med['slowdown']:.2f}x",
                     f"{med['p99_ms']:.1f}", f"{med['max_ms']:.1f}", f"{med['base_ms']:.3f}"])
    print(table(["candidate compiled", "switch interval ms", "compile + 3 runs s", "serving calls: mean / before",
                 "p99 ms", "longest ms", "median before ms"], rows))
    serve.close()


if __name__ == "__main__":
    main()
