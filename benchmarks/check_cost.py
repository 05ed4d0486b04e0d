"""What online tuning's first phases cost calls that arrive at a rate below capacity (issue 51), by phase.

Each arm is a fresh process with an empty decision cache, on one ``hybrid.zoo`` model, calling it from one thread:

- ``untuned``: ``hybrid.compile(path, target='onnxruntime')``, what ``target='auto'`` starts on;
- ``auto``: ``hybrid.compile(path)`` with nothing given, while its first bucket is checked, compiled and raced.

Two loads, each at half the capacity of one raw ONNX Runtime session (its median call in a closed loop, measured in
the arm before it starts):

- ``duty``: after each call the thread waits as long as the call took (a 50 % duty cycle, which never queues):
  the calls' own durations, what the tuning's other work does to a call while it runs;
- ``arrivals``: calls due at fixed times (one every two service times: a D/D/1 queue that never queues by itself),
  latency from when each was due, so a call that starts late because of the tuning counts. The arm's own speed
  estimate sets the rate: where the machine slows down by half after it, the untuned arm queues too (read the
  untuned column before the ratios).

The table gives medians over ``--reps`` of the mean and p99 and the ratios to the untuned arm (paired per
repetition, the arms' order alternating), and the phases ``cm.tuning`` showed during the window.

    flock /tmp/coord/bench.lock python benchmarks/check_cost.py --models neg_dim crnn --reps 3 --seconds 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine_info, table
from _results import add_argument, command_line, write_results

ARMS = ("untuned", "auto")
LOADS = ("duty", "arrivals")


def arm(name: str, which: str, load: str, seconds: float, zoo_folder: str) -> dict[str, Any]:
    """One arm, in this process (run as ``--arm``): the calls' mean and p99 (ms) and the phases seen."""
    import numpy as np

    os.environ["HYBRID_CACHE_DIR"] = tempfile.mkdtemp(prefix="hybrid-check-cost-")
    import hybrid
    from hybrid import zoo

    m = zoo.build(name, folder=Path(zoo_folder))
    feeds = m.feeds(seed=0)
    raw = hybrid.compile(m.path, target="onnxruntime")
    for _ in range(50):
        raw.run(feeds)
    times: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.5 or len(times) < 20:
        s = time.perf_counter()
        raw.run(feeds)
        times.append(time.perf_counter() - s)
    service = statistics.median(times)
    raw.close()
    cm = hybrid.compile(m.path, target="onnxruntime" if which == "untuned" else "auto")
    out: list[float] = []
    phases: dict[str, int] = {}
    start = time.perf_counter()
    due = start
    while time.perf_counter() - start < seconds:
        if load == "arrivals":
            due += 2.0 * service
            wait = due - time.perf_counter()
            if wait > 1e-3:
                time.sleep(wait - 1e-3)
            while time.perf_counter() < due:
                pass
            cm.run(feeds)
            out.append(time.perf_counter() - due)
        else:
            s = time.perf_counter()
            cm.run(feeds)
            took = time.perf_counter() - s
            out.append(took)
            end = time.perf_counter() + took
            while time.perf_counter() < end:
                time.sleep(max(0.0, min(took, end - time.perf_counter())))
        if len(out) % 200 == 0 and which == "auto":
            for record in cm.tuning:
                phases[record.phase] = phases.get(record.phase, 0) + 1
    cm.close()
    a = np.asarray(out)
    return {"mean_ms": float(a.mean() * 1e3), "p99_ms": float(np.percentile(a, 99) * 1e3),
            "service_ms": service * 1e3, "phases": sorted(phases)}


def run_arm(name: str, which: str, load: str, seconds: float, zoo_folder: str) -> dict[str, Any]:
    """:func:`arm` in a fresh process (each arm starts with no check process and an empty decision cache)."""
    out = subprocess.run([sys.executable, __file__, "--arm", name, which, load, str(seconds), zoo_folder],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["neg_dim", "crnn"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--loads", nargs="+", choices=LOADS, default=list(LOADS))
    ap.add_argument("--arm", nargs=5, help=argparse.SUPPRESS)
    add_argument(ap)
    args = ap.parse_args()
    if args.arm:
        name, which, load, seconds, folder = args.arm
        print(json.dumps(arm(name, which, load, float(seconds), folder)))
        return
    if args.reps < 1 or args.seconds <= 0:
        ap.error("--reps must be >= 1 and --seconds > 0")
    print(machine_info(), flush=True)
    folder = tempfile.mkdtemp(prefix="hybrid-check-cost-zoo-")
    rows = []
    for name in args.models:
        for load in args.loads:
            got: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
            for rep in range(args.reps):
                for which in ARMS if rep % 2 == 0 else ARMS[::-1]:
                    got[which].append(run_arm(name, which, load, args.seconds, folder))
                    if sys.stderr.isatty():
                        print(f"{name} {load} rep {rep} {which}: {got[which][-1]}", file=sys.stderr, flush=True)
            u, t = got["untuned"], got["auto"]
            mean_x = [a["mean_ms"] / b["mean_ms"] for a, b in zip(t, u, strict=True)]
            p99_x = [a["p99_ms"] / b["p99_ms"] for a, b in zip(t, u, strict=True)]
            phases = sorted({p for r in t for p in r["phases"]})
            rows.append([name, load, f"{statistics.median(r['service_ms'] for r in u):.3f}",
                         f"{statistics.median(r['mean_ms'] for r in u):.3f}",
                         f"{statistics.median(r['mean_ms'] for r in t):.3f}",
                         f"{statistics.median(mean_x):.2f}x ({', '.join(f'{x:.2f}' for x in mean_x)})",
                         f"{statistics.median(r['p99_ms'] for r in u):.2f}",
                         f"{statistics.median(r['p99_ms'] for r in t):.2f}",
                         f"{statistics.median(p99_x):.2f}x ({', '.join(f'{x:.2f}' for x in p99_x)})",
                         ", ".join(phases)])
    text = table(["model", "load", "service ms", "untuned mean ms", "auto mean ms", "mean / untuned (per rep)",
                  "untuned p99 ms", "auto p99 ms", "p99 / untuned (per rep)", "auto's phases seen"], rows)
    print(text, flush=True)
    if args.write_results is not None:
        write_results(args.write_results or "check_cost", "What tuning's first phases cost calls below capacity "
                      "(issue 51)", command_line(), text,
                      f"One thread, each arm a fresh process with an empty decision cache; 'duty': a 50 % duty cycle "
                      f"(the calls' own durations); 'arrivals': calls due one every two service times (latency from "
                      f"when each was due); {args.seconds:g} s windows from the compile, medians over {args.reps} "
                      "repetitions, ratios paired per repetition.")


if __name__ == "__main__":
    main()
