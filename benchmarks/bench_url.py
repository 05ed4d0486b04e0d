"""``pyasc bench --url`` against ``pyasc serve`` and the real Triton server, same model, side by side.

The servers and the model are :mod:`vs_triton`'s (hybrid.zoo's ``external_data`` classifier, x [1, 3, 96, 96],
``max_batch_size 8`` with a 2 ms batching delay; Triton 2.51 from nvidia-pytriton running ONNX Runtime in a
Python-backend model with 2 threads; ``pyasc serve --target onnxruntime`` with 2 threads). Each round measures
every server at each concurrency with ``pyasc bench --url``'s sweep (its windows repeated until 3 agree within
10 %), in an order that alternates between rounds; the table gives medians over the rounds and the paired ratio
pyasc / Triton of the throughput. The server columns come from each server's statistics extension.

    flock /tmp/coord/bench.lock python benchmarks/bench_url.py --rounds 3 --window 2 --protocol grpc
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _results
import _triton_real as tr
import vs_triton as vt

from hybrid.cli._bench_remote import SweepSettings, run_sweep
from hybrid.cli._machine import machine_line
from hybrid.cli._remote import RemoteModel, parse_url, remote_samples
from hybrid.cli._sweep import StabilityPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=2.0, help="seconds per window")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    _results.add_argument(ap, "bench_url")
    args = ap.parse_args()
    levels = tuple(float(c) for c in args.concurrency.split(","))
    work = Path(tempfile.mkdtemp(prefix="bench-url-"))
    served = vt.build_model(work)
    stops = []
    try:
        triton = tr.TritonServer(vt.triton_repository(work / "triton", served, vt.THREADS)).start()
        stops.append(triton.stop)
        proc, grpc, _, http = vt.start_pyasc(served.path, "onnxruntime", 0)
        stops.append(lambda: (proc.terminate(), proc.wait(60)))
        urls = {"triton": f"grpc://{triton.grpc_url}" if args.protocol == "grpc" else f"http://{triton.http_url}",
                "pyasc serve": f"grpc://{grpc}" if args.protocol == "grpc" else http}
        models = {name: RemoteModel(parse_url(url), vt.MODEL) for name, url in urls.items()}
        samples = {name: remote_samples(m, None, 1, None) for name, m in models.items()}
        for name, m in models.items():  # first calls: connections, sessions, allocators
            for _ in range(20):
                m.run(samples[name][0])
        sweep = SweepSettings("concurrency", levels, StabilityPolicy(window_s=args.window, max_trials=8))
        got: dict[tuple[str, float], list] = {}
        for r in range(args.rounds):
            order = list(models) if r % 2 == 0 else list(reversed(models))
            for name in order:
                for lv in run_sweep(models[name], samples[name], sweep, 1):
                    got.setdefault((name, lv.value), []).append(lv)
                    print(f"round {r + 1} {name} c={lv.value:g}: {lv.merged.infer_per_s:.1f}/s stable={lv.stable}",
                          flush=True)
        for m in models.values():
            m.close()
    finally:
        for stop in reversed(stops):
            stop()

    def med(name: str, c: float, get) -> float:
        return statistics.median(get(lv.merged) for lv in got[(name, c)])

    print(f"\nmachine: {machine_line()}, Python {platform.python_version()}; protocol {args.protocol}; "
          f"{args.rounds} rounds, windows of {args.window:g} s\n")
    lines = ["| concurrency | server | infer/s | p50 ms | p99 ms | client send+recv ms | network+server send/recv ms "
             "| server queue ms | compute in/infer/out ms | stable rounds | infer/s pyasc / Triton (paired) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in levels:
        ratios = [p.merged.infer_per_s / t.merged.infer_per_s for p, t in zip(got[("pyasc serve", c)],
                                                                               got[("triton", c)])]
        for name in ("triton", "pyasc serve"):
            def srv(w, k):
                return (w.server_us or {}).get(k, 0.0) / 1e3
            compute = "/".join(f"{med(name, c, lambda w, k=k: srv(w, k)):.3f}" for k in
                               ("compute_input", "compute_infer", "compute_output"))
            stable = sum(lv.stable for lv in got[(name, c)])
            ratio = f"x{statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})" \
                if name == "pyasc serve" else ""
            lines.append(f"| {c:g} | {name} | {med(name, c, lambda w: w.infer_per_s):.1f} "
                         f"| {med(name, c, lambda w: w.percentiles_us[50]) / 1e3:.2f} "
                         f"| {med(name, c, lambda w: w.percentiles_us[99]) / 1e3:.2f} "
                         f"| {med(name, c, lambda w: w.send_us + w.recv_us) / 1e3:.3f} "
                         f"| {med(name, c, lambda w: w.network_us) / 1e3:.2f} "
                         f"| {med(name, c, lambda w: srv(w, 'queue')):.2f} | {compute} "
                         f"| {stable}/{len(got[(name, c)])} | {ratio} |")
    print("\n".join(lines))
    if args.write_results:
        _results.write_results(args.write_results,
                               "`pyasc bench --url` against pyasc serve and tritonserver (issue 52)",
                               _results.command_line(), "\n".join(lines),
                               notes=f"Protocol {args.protocol}; {args.rounds} rounds, windows of {args.window:g} s.")


if __name__ == "__main__":
    main()
