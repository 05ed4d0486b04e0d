"""Pipeline throughput: three stages of about 10 ms each, run concurrently versus one after another.

Each stage waits about 10 ms without holding the GIL (``time.sleep``, standing in for a device call or
I/O), so what is measured is the pipeline machinery itself: with the stages overlapped, throughput
should approach 1 / (slowest stage time). A second case uses unequal stages (5, 10, 15 ms). Contenders
run interleaved in blocks: the pipeline (``hybrid.Pipeline``, one worker per stage) and the plain loop
that calls the three stages in turn.

Run: ``flock /tmp/bench.lock python benchmarks/pipeline.py [--items 200 --blocks 3]``.
Goal: pipeline throughput >= 0.85 / slowest stage time (the measured mean of that stage's calls).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _harness as h
import _results

import hybrid


def stage(seconds: float):
    def run(x: int) -> int:
        time.sleep(seconds)
        return x + 1
    run.__name__ = f"sleep{seconds * 1e3:.0f}ms"
    return run


def run_pipeline(delays: tuple[float, ...], items: int) -> tuple[float, float]:
    """Items/s through a fresh pipeline, and the slowest stage's measured mean time."""
    with hybrid.Pipeline() as p:
        for d in delays:
            p.add_stage(stage(d))
        t0 = time.perf_counter()
        out = list(p.run(range(items)))
        elapsed = time.perf_counter() - t0
    assert out == [i + len(delays) for i in range(items)]
    return items / elapsed, max(s.mean_time_s for s in p.stats())


def run_loop(delays: tuple[float, ...], items: int) -> float:
    fns = [stage(d) for d in delays]
    t0 = time.perf_counter()
    for i in range(items):
        x = i
        for fn in fns:
            x = fn(x)
    return items / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=3)
    _results.add_argument(parser, "pipeline")
    args = parser.parse_args()
    print(f"machine: {h.machine_info()}\n")
    rows = []
    verdicts = []
    for delays in ((0.01, 0.01, 0.01), (0.005, 0.01, 0.015)):
        piped, slowest, looped = [], [], []
        for b in range(args.blocks):
            order = ("pipe", "loop") if b % 2 == 0 else ("loop", "pipe")
            for which in order:
                if which == "pipe":
                    rate, slow = run_pipeline(delays, args.items)
                    piped.append(rate)
                    slowest.append(slow)
                else:
                    looped.append(run_loop(delays, args.items // 4))
                time.sleep(0.2)
        rate, slow, loop = statistics.median(piped), statistics.median(slowest), statistics.median(looped)
        ideal = 1 / slow
        label = " + ".join(f"{d * 1e3:.0f}" for d in delays) + " ms"
        rows.append([label, rate, ideal, rate / ideal, loop, rate / loop])
        verdicts.append(rate / ideal >= 0.85)
    print(f"{args.items} items per run, {args.blocks} blocks, medians\n")
    results = h.table(["stages", "pipeline items/s", "1 / slowest stage", "fraction of ideal", "plain loop items/s",
                       "x plain loop"], rows)
    goal = f"goal: fraction of ideal >= 0.85: {'PASS' if all(verdicts) else 'MISS'}"
    print(results)
    print(f"\n{goal}")
    if args.write_results:
        _results.write_results(args.write_results, "Pipeline", _results.command_line(), results,
                               notes=f"{args.items} items per run, {args.blocks} blocks, medians; {goal}.")


if __name__ == "__main__":
    main()
