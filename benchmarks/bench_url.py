"""``pyasc bench --url`` against ``pyasc serve`` and the real Triton server, same model, side by side.

The servers are :mod:`vs_triton`'s (a ``hybrid.zoo`` model, ``--model``, default ``external_data``, re-saved as one
file; ``max_batch_size 8`` with a 2 ms batching delay; Triton 2.51 from nvidia-pytriton running ONNX Runtime in a
Python-backend model with 2 threads; ``pyasc serve --target onnxruntime`` with 2 threads: vs_triton's ``triton`` and
``pyasc-ort``). Each round measures every server at each concurrency with the command itself, ``pyasc bench --url
URL --model cls --shapes SAMPLE --concurrency-range C --measurement-interval MS --json`` (the zoo sample's
shapes, as vs_triton's clients send it; a child process per level: its windows
repeated until 3 agree within 10 %), in an order that alternates between rounds; the table gives medians over the
rounds of each level's figures, with the server's side from each server's statistics extension, and the paired ratio
pyasc / Triton of the throughput.

    flock /tmp/coord/bench.lock python benchmarks/bench_url.py --rounds 3 --window 2 --model crnn --concurrency 1,4
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _results
import _triton_real as tr
import vs_triton as vt

from hybrid.cli._machine import machine_line


def bench_url(url: str, shapes: str, concurrency: float, window_s: float, max_trials: int) -> dict[str, Any]:
    """One level measured by ``pyasc bench --url`` in a child process: its JSON level (perf_analyzer's columns)."""
    cmd = [sys.executable, "-m", "hybrid", "bench", "--url", url, "--model", vt.MODEL, "--shapes", shapes,
           "--concurrency-range", f"{concurrency:g}", "--measurement-interval", f"{window_s * 1e3:g}",
           "--max-trials", str(max_trials), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
    (level,) = json.loads(done.stdout)["levels"]
    return level


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=2.0, help="seconds per window")
    ap.add_argument("--max-trials", type=int, default=8, help="windows per level at most")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--model", default="external_data", help="the hybrid.zoo model both servers serve")
    ap.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    ap.add_argument("--json", type=Path, default=None, help="write every level of every round here")
    _results.add_argument(ap, "bench_url")
    args = ap.parse_args()
    levels = tuple(float(c) for c in args.concurrency.split(","))
    work = Path(tempfile.mkdtemp(prefix="bench-url-"))
    served = vt.build_model(work, args.model)
    # the zoo sample's shapes, as vs_triton's clients send it (a dynamic dim needs a size: --shapes)
    shapes = ",".join(f"{n}:{'x'.join(map(str, v.shape))}" for n, v in served.sample.items())
    stops = []
    got: dict[tuple[str, float], list[dict[str, Any]]] = {}
    try:
        triton = tr.TritonServer(vt.triton_repository(work / "triton", served, vt.THREADS)).start()
        stops.append(triton.stop)
        proc, grpc, _, http = vt.start_pyasc(served.path, "onnxruntime", 0)
        stops.append(lambda: (proc.terminate(), proc.wait(60)))
        urls = {"triton": f"grpc://{triton.grpc_url}" if args.protocol == "grpc" else f"http://{triton.http_url}",
                "pyasc serve": f"grpc://{grpc}" if args.protocol == "grpc" else http}
        for url in urls.values():  # first calls: connections, sessions, allocators (untimed, thrown away)
            bench_url(url, shapes, 1, 1.0, 3)
        for r in range(args.rounds):
            order = list(urls) if r % 2 == 0 else list(reversed(urls))
            for name in order:
                for c in levels:
                    lv = bench_url(urls[name], shapes, c, args.window, args.max_trials)
                    got.setdefault((name, c), []).append(lv)
                    print(f"round {r + 1} {name} c={c:g}: {lv['Inferences/Second']:.1f}/s stable={lv['stable']} "
                          f"windows={lv['windows']}", flush=True)
    finally:
        for stop in reversed(stops):
            stop()
    if args.json is not None:
        args.json.write_text(json.dumps({f"{n} c={c:g}": v for (n, c), v in got.items()}, indent=1))

    def med(name: str, c: float, key: str, scale: float = 1e-3) -> float:
        return statistics.median(lv[key] * scale for lv in got[(name, c)])

    print(f"\nmachine: {machine_line()}, Python {platform.python_version()}; model {args.model}; protocol "
          f"{args.protocol}; {args.rounds} rounds, windows of {args.window:g} s\n")
    lines = ["| concurrency | server | infer/s | p50 ms | p99 ms | client send+recv ms | network+server send/recv ms "
             "| server queue ms | compute in/infer/out ms | stable rounds | infer/s pyasc / Triton (paired) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in levels:
        ratios = [p["Inferences/Second"] / t["Inferences/Second"] for p, t in zip(got[("pyasc serve", c)],
                                                                                   got[("triton", c)])]
        for name in ("triton", "pyasc serve"):
            compute = "/".join(f"{med(name, c, k):.3f}" for k in
                               ("Server Compute Input", "Server Compute Infer", "Server Compute Output"))
            send_recv = statistics.median((lv["Client Send"] + lv["Client Recv"]) / 1e3 for lv in got[(name, c)])
            stable = sum(bool(lv["stable"]) for lv in got[(name, c)])
            ratio = f"x{statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})" \
                if name == "pyasc serve" else ""
            lines.append(f"| {c:g} | {name} | {med(name, c, 'Inferences/Second', 1):.1f} "
                         f"| {med(name, c, 'p50 latency'):.2f} | {med(name, c, 'p99 latency'):.2f} | {send_recv:.3f} "
                         f"| {med(name, c, 'Network+Server Send/Recv'):.2f} | {med(name, c, 'Server Queue'):.2f} "
                         f"| {compute} | {stable}/{len(got[(name, c)])} | {ratio} |")
    print("\n".join(lines))
    if args.write_results:
        _results.write_results(args.write_results,
                               "`pyasc bench --url` against pyasc serve and tritonserver (issue 52)",
                               _results.command_line(), "\n".join(lines),
                               notes=f"Model {args.model}, protocol {args.protocol}; {args.rounds} rounds, windows of "
                               f"{args.window:g} s.")


if __name__ == "__main__":
    main()
