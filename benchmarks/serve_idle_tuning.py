"""A default-target ``pyasc serve`` started with nothing given, idle for a while, then loaded: idle tuning on vs off.

The user who passes nothing: no ``--warmup``, an empty decision cache, a server started some time before its
traffic comes. Two variants of that server on vs_triton.py's model (hybrid.zoo's ``external_data`` classifier,
``--max-batch 8 --batch-timeout 0.002``):

- ``idle-on``: the default target as ``pyasc serve`` starts it (idle tuning on);
- ``idle-off``: the same with ``--no-idle-tuning`` (its buckets are decided on the traffic's first calls).

Each variant is measured in a phase of its own, beside a fresh ``--target onnxruntime`` server (``ort``, the
yardstick, which decides nothing): both start, nothing is sent for ``--idle`` seconds, then ``--rounds`` rounds
of 1 and 16 tritonclient.grpc closed-loop clients, each server ``--seconds`` per block, the order alternating.
Phases of their own, because a server that tunes under the traffic runs its checks and compiles in the
background, and that would slow whichever server is measured beside it; within a phase it slows the yardstick
too, which is in the untuned variant's favour. The phases alternate over ``--reps`` repetitions. Per round it
prints the variant's throughput over ``ort``'s in the same block and both p99s; the summary gives the medians
over the first ``--early`` rounds (the traffic's start) and over the rest, per variant and client count.

With ``--dynamic-size`` the model's image height and width are symbolic, as an exporter leaves them for a
model that takes any image size: random inputs would have to guess a size, so the server with idle tuning
learns the shape from the traffic instead. ``--first-traffic`` seconds of one client (96x96 images, as all the
load) then come right after the start, before the idle wait: the first requests show the shape, and the idle
wait is the lull after them.

    flock /tmp/coord/bench.lock python benchmarks/serve_idle_tuning.py --reps 3 --idle 60 --rounds 6 --seconds 5
    flock /tmp/coord/bench.lock python benchmarks/serve_idle_tuning.py --dynamic-size --first-traffic 5 --idle 45
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

VARIANTS = {"idle-on": True, "idle-off": False}


def decided(http: str) -> str:
    """'3/4 buckets decided (openvino:cpu, ...)' from a server's model statistics."""
    with urllib.request.urlopen(f"{http}/v2/models/{vt.MODEL}/stats", timeout=10) as r:
        tuning = json.loads(r.read())["model_stats"][0].get("pyasc", {}).get("tuning", [])
    done = [t for t in tuning if t["state"] == "decided"]
    return f"{len(done)}/{len(tuning)} buckets decided ({', '.join(t['serving'] for t in done) or 'none'})"


def phase(variant: str, model: Path, x: object, work: Path, args: argparse.Namespace,
          counts: list[int]) -> dict[int, list[tuple[float, float, float]]]:
    """One variant beside a fresh yardstick: per client count, per round (ratio to ort, its p99, ort's p99)."""
    servers: dict[str, tuple[str, str]] = {}
    stops = []
    try:
        for name, target, idle in (("ort", "onnxruntime", False), (variant, None, VARIANTS[variant])):
            cache = tempfile.mkdtemp(prefix=f"cache-{name}-", dir=work)
            proc, url, _, http = vt.start_pyasc(model, target, 0, env={"HYBRID_CACHE_DIR": cache}, idle_tuning=idle)
            stops.append(lambda p=proc: (p.terminate(), p.wait(60)))
            servers[name] = (url, http)
        if args.first_traffic > 0:
            for name in servers:
                vt.load(servers[name][0], x, 1, args.first_traffic)
        time.sleep(args.idle)
        print(f"{variant} when the traffic comes: {decided(servers[variant][1])}", flush=True)
        out: dict[int, list[tuple[float, float, float]]] = {}
        for r in range(args.rounds):
            for n in counts:
                order = [variant, "ort"] if r % 2 == 0 else ["ort", variant]
                got = {name: vt.load(servers[name][0], x, n, args.seconds) for name in order}
                ratio = got[variant][0] / got["ort"][0]
                out.setdefault(n, []).append((ratio, got[variant][1], got["ort"][1]))
                print(f"  round {r} clients {n:2d}: {variant} x{ratio:.2f} p99 {got[variant][1]:5.1f} ms, "
                      f"ort {got['ort'][0]:7.1f} inf/s p99 {got['ort'][1]:5.1f} ms", flush=True)
        print(f"{variant} at the end: {decided(servers[variant][1])}", flush=True)
        return out
    finally:
        for stop in stops:
            stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the two phases (their order alternates)")
    ap.add_argument("--idle", type=float, default=60.0, help="seconds with no traffic after the servers are ready")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--early", type=int, default=3, help="rounds counted as the traffic's start in the summary")
    ap.add_argument("--dynamic-size", action="store_true", help="the model's image height and width symbolic")
    ap.add_argument("--first-traffic", type=float, default=0.0,
                    help="seconds of one client to each server right after the start, before the idle wait")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    work = Path(tempfile.mkdtemp(prefix="idle-tuning-"))
    model, x = vt.build_model(work)
    if args.dynamic_size:
        import onnx

        proto = onnx.load(str(model))
        dims = proto.graph.input[0].type.tensor_type.shape.dim
        dims[2].dim_param, dims[3].dim_param = "height", "width"
        onnx.save(proto, str(model))
    results: dict[tuple[str, int], list[list[tuple[float, float, float]]]] = {}
    for rep in range(args.reps):
        for variant in (list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))):
            print(f"rep {rep}: {variant}", flush=True)
            for n, rounds in phase(variant, model, x, work, args, counts).items():
                results.setdefault((variant, n), []).append(rounds)
    print()
    print("| clients | server | rounds | throughput / ort, medians per rep (median of all) | p99 ms (median) "
          "| ort p99 ms |")
    print("|---|---|---|---|---|---|")
    for n in counts:
        for variant in VARIANTS:
            reps = results[(variant, n)]
            for label, part in ((f"0-{args.early - 1}", slice(0, args.early)),
                                (f"{args.early}-{args.rounds - 1}", slice(args.early, None))):
                blocks = [b for rounds in reps for b in rounds[part]]
                if blocks:
                    per_rep = ", ".join(f"{statistics.median(b[0] for b in rounds[part]):.2f}" for rounds in reps)
                    mine, theirs = (statistics.median(b[i] for b in blocks) for i in (1, 2))
                    print(f"| {n} | {variant} | {label} | {per_rep} (x{statistics.median(b[0] for b in blocks):.2f}) "
                          f"| {mine:.1f} | {theirs:.1f} |")


if __name__ == "__main__":
    main()
