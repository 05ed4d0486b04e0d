"""`pyasc bench --concurrency N` throughput vs a separately timed loop of N threads (issue 16).

Each round runs the command line (a subprocess: `pyasc bench MODEL -t TARGET -p fp32 --concurrency N
--duration S --warmup 20 --json`, its items/s; with ``--in-process`` the same ``bench()`` function in this
process) and, in this process, N threads calling one compiled model for S seconds (calls / wall time), in
alternating order. Reported: both throughputs per round and the median
ratio bench / loop (1.0: the command measures what a plain threaded loop measures).

    python benchmarks/cli_concurrency.py --model squeezenet --target onnxruntime:cpu --threads 4 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time

import _results

import hybrid
from hybrid.runtime.profiler import sample_inputs
from hybrid.zoo import samples


def threaded_loop(cm, feeds, threads: int, seconds: float) -> float:
    """Calls per second of ``threads`` callers for ``seconds`` (after one warm call each)."""
    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def caller(i: int) -> None:
        for _ in range(20):  # the same warmup as the command's --warmup 20, per caller
            cm.run(feeds)
        barrier.wait()
        end = time.perf_counter() + seconds
        n = 0
        while n == 0 or time.perf_counter() < end:
            cm.run(feeds)
            n += 1
        counts[i] = n

    pool = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def cli_bench(path: str, target: str, threads: int, seconds: float) -> float:
    cmd = [sys.executable, "-m", "hybrid", "--quiet", "bench", path, "-t", target, "-p", "fp32", "--concurrency",
           str(threads), "--duration", str(seconds), "--blocks", "1", "--warmup", "20", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    (row,) = json.loads(out)["rows"]
    return row["items_per_s"]


def inprocess_bench(path: str, target: str, threads: int, seconds: float) -> float:
    """The function `pyasc bench` runs, called in this process (no interpreter start between the pair)."""
    from hybrid.cli.bench import Timing, bench

    timing = Timing(blocks=1, warmup=20, duration=seconds, concurrency=threads)
    (row,) = bench(path, [target], ("fp32",), timing=timing)[0]
    return row.items_per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--target", default="onnxruntime:cpu")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--in-process", action="store_true", help="call bench() here instead of the pyasc command")
    _results.add_argument(ap, "cli_concurrency")
    args = ap.parse_args()
    measure = inprocess_bench if args.in_process else cli_bench
    path = str(samples.light_model_path(args.model))
    cm = hybrid.compile(path, target=args.target)
    feeds = sample_inputs(cm.model)
    rows = []
    for r in range(args.rounds):
        pair = {}
        for kind in (("bench", "loop") if r % 2 == 0 else ("loop", "bench")):
            pair[kind] = measure(path, args.target, args.threads, args.seconds) if kind == "bench" else \
                threaded_loop(cm, feeds, args.threads, args.seconds)
            time.sleep(0.5)
        rows.append((pair["bench"], pair["loop"], pair["bench"] / pair["loop"]))
        print(f"round {r + 1}: bench {pair['bench']:.1f}/s  loop {pair['loop']:.1f}/s  ratio {rows[-1][2]:.3f}",
              flush=True)
    ratios = [x[2] for x in rows]
    results = ("| model | target | threads | bench items/s (median) | loop calls/s (median) | median ratio | range |\n"
               "|---|---|---|---|---|---|---|\n"
               f"| {args.model} | {args.target} | {args.threads} | {statistics.median(x[0] for x in rows):.1f} | "
               f"{statistics.median(x[1] for x in rows):.1f} | {statistics.median(ratios):.3f} | "
               f"{min(ratios):.3f}..{max(ratios):.3f} |")
    print("\n" + results)
    if args.write_results:
        _results.write_results(args.write_results, "`pyasc bench --concurrency 4` vs a separately timed 4-thread loop",
                               _results.command_line(), results,
                               notes=f"{args.rounds} rounds x {args.seconds:g} s, order alternating; ratio = bench / "
                               f"loop; bench {'in this process' if args.in_process else 'as the pyasc command'}.")


if __name__ == "__main__":
    main()
