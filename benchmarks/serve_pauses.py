"""Tail latency of ``pyasc serve`` with and without its garbage-collector policy (hybrid.runtime.traffic.collector).

Two ``pyasc serve`` processes of the same model on the default target (``--warmup``, default 200: its buckets are
decided before the load, so that the tuning's own work does not mix with the pauses; 0: as a user who passes
nothing runs it), each with an empty decision cache: one as shipped, one with ``HYBRID_GC_MAX_PAUSE_MS=off`` (Python's
collector as CPython sets it). The same unmodified ``tritonclient.grpc`` closed loop as ``vs_triton.py`` (one image
per request, ``--clients`` threads) loads them in turn, ``--seconds`` per block, in an order that alternates between
rounds. Reported per server, over all its requests: p50, p99, p99.9 and the longest latency, and how many requests
took longer than ``--stall-ms``; and the throughput ratio (policy / off) paired within each round, as a median.

    flock /tmp/coord/bench.lock python benchmarks/serve_pauses.py --rounds 12 --seconds 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_triton import build_model, latencies, paired, start_pyasc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--stall-ms", type=float, default=50.0)
    ap.add_argument("--warmup", type=int, default=200, help="pyasc serve --warmup (0: tune under the load)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="serve-pauses-"))
    model, x = build_model(work)
    servers: dict[str, str] = {}
    stops = []
    try:
        for name, pause in (("policy", {}), ("off", {"HYBRID_GC_MAX_PAUSE_MS": "off"})):
            cache = tempfile.mkdtemp(prefix=f"cache-{name}-", dir=work)
            proc, url, _, _ = start_pyasc(model, None, args.warmup, env={"HYBRID_CACHE_DIR": cache, **pause})
            stops.append(lambda p=proc: (p.terminate(), p.wait(60)))
            servers[name] = url
        seen: dict[str, list[float]] = {k: [] for k in servers}
        rates: dict[str, list[float]] = {k: [] for k in servers}
        for r in range(args.rounds):
            for name in servers if r % 2 == 0 else reversed(servers):
                lat, elapsed = latencies(servers[name], x, args.clients, args.seconds)
                seen[name] += lat
                rates[name].append(len(lat) / elapsed)
                over = sum(v * 1e3 > args.stall_ms for v in lat)
                print(f"round {r} {name:6s} {len(lat) / elapsed:7.1f} inf/s  max {1e3 * max(lat):6.1f} ms  "
                      f"{over} over {args.stall_ms:g} ms", flush=True)
        print()
        print(f"| server ({args.clients} clients, {args.rounds} x {args.seconds:g} s) | p50 ms | p99 ms | p99.9 ms | "
              f"max ms | requests over {args.stall_ms:g} ms |")
        print("|---|---|---|---|---|---|")
        for name, lat in seen.items():
            v = np.array(lat) * 1e3
            p50, p99, p999 = np.percentile(v, [50, 99, 99.9])
            print(f"| {name} | {p50:.1f} | {p99:.1f} | {p999:.1f} | {v.max():.1f} | "
                  f"{int((v > args.stall_ms).sum())} of {v.size} |")
        ratios = [a / b for a, b in zip(rates["policy"], rates["off"], strict=True)]
        print(f"\nthroughput policy / off, paired per round: {paired(ratios)}")
    finally:
        for stop in stops:
            stop()


if __name__ == "__main__":
    main()
