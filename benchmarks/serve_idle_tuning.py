"""A default-target ``pyasc serve`` started with nothing given, idle for a while, then loaded: idle tuning on vs off.

The user who passes nothing: no ``--warmup``, an empty decision cache, a server started some time before its
traffic comes. Three ``pyasc serve`` processes start together on vs_triton.py's model (hybrid.zoo's
``external_data`` classifier, ``--max-batch 8 --batch-timeout 0.002``), each with a decision cache of its own:

- ``idle-on``: the default target as ``pyasc serve`` starts it (idle tuning on);
- ``idle-off``: the same with ``--no-idle-tuning`` (its buckets are decided on the traffic's first calls);
- ``ort``: ``--target onnxruntime``, which decides nothing (the yardstick).

Nothing is sent for ``--idle`` seconds. Then the rounds: every (round, clients) block runs each server for
``--seconds`` with the same unmodified tritonclient.grpc closed loop, in an order that alternates between rounds.
Per round it prints each default-target server's throughput over ``ort``'s in the same block and its p99, so the
first rounds show what the traffic meets; the summary gives the median over the first ``--early`` rounds and
over the rest, and what each server had decided when the traffic came and at the end.

    flock /tmp/coord/bench.lock python benchmarks/serve_idle_tuning.py --idle 60 --rounds 8 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_triton as vt


def decided(http: str) -> str:
    """'3/4 buckets decided (openvino:cpu, ...)' from a server's model statistics."""
    with urllib.request.urlopen(f"{http}/v2/models/{vt.MODEL}/stats", timeout=10) as r:
        tuning = json.loads(r.read())["model_stats"][0].get("pyasc", {}).get("tuning", [])
    done = [t for t in tuning if t["state"] == "decided"]
    return f"{len(done)}/{len(tuning)} buckets decided ({', '.join(t['serving'] for t in done) or 'none'})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=60.0, help="seconds with no traffic after the servers are ready")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--early", type=int, default=3, help="rounds counted as the traffic's start in the summary")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    work = Path(tempfile.mkdtemp(prefix="idle-tuning-"))
    model, x = vt.build_model(work)
    servers: dict[str, tuple[str, str]] = {}
    stops = []
    try:
        # idle-on starts last: its tuning begins a second after its load, and must not race its first bucket
        # while the other two are still importing and compiling
        for name, target, idle in (("ort", "onnxruntime", False), ("idle-off", None, False), ("idle-on", None, True)):
            cache = tempfile.mkdtemp(prefix=f"cache-{name}-", dir=work)
            proc, url, _, http = vt.start_pyasc(model, target, 0, env={"HYBRID_CACHE_DIR": cache}, idle_tuning=idle)
            stops.append(lambda p=proc: (p.terminate(), p.wait(60)))
            servers[name] = (url, http)
        print(f"servers ready; {args.idle:g} s with no traffic", flush=True)
        time.sleep(args.idle)
        for name in ("idle-on", "idle-off"):
            print(f"{name} when the traffic comes: {decided(servers[name][1])}", flush=True)
        results: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for r in range(args.rounds):
            for n in counts:
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order:
                    results.setdefault((name, n), []).append(vt.load(servers[name][0], x, n, args.seconds))
                base = results[("ort", n)][-1]
                line = "  ".join(f"{s} x{results[(s, n)][-1][0] / base[0]:.2f} p99 {results[(s, n)][-1][1]:5.1f} ms"
                                 for s in ("idle-on", "idle-off"))
                print(f"round {r} clients {n:2d}: ort {base[0]:7.1f} inf/s p99 {base[1]:5.1f} ms  {line}", flush=True)
        for name in ("idle-on", "idle-off"):
            print(f"{name} at the end: {decided(servers[name][1])}", flush=True)
        print()
        print("| clients | server | rounds | throughput / ort (median) | p99 ms (median) | ort p99 ms |")
        print("|---|---|---|---|---|---|")
        for n in counts:
            base = results[("ort", n)]
            for s in ("idle-on", "idle-off"):
                mine = results[(s, n)]
                for label, part in ((f"0-{args.early - 1}", slice(0, args.early)),
                                    (f"{args.early}-{args.rounds - 1}", slice(args.early, None))):
                    ratios = [a[0] / b[0] for a, b in zip(mine[part], base[part], strict=True)]
                    if ratios:
                        print(f"| {n} | {s} | {label} | {vt.paired(ratios)} | "
                              f"{statistics.median(v[1] for v in mine[part]):.1f} | "
                              f"{statistics.median(v[1] for v in base[part]):.1f} |")
    finally:
        for stop in stops:
            stop()


if __name__ == "__main__":
    main()
