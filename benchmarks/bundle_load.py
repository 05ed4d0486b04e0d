"""Bundle load times (first load from the IR vs second load from the cache) and profiler accuracy.

Part 1, per light model (O1-optimized, so that its weights are stored in the file) and backend, in one
process, repeated in rounds:
  raw      the runtime alone: onnxruntime.InferenceSession / openvino compile_model from the model bytes
  compile  hybrid.compile(model, target) — what a first load does besides reading the bundle
  first    hybrid.load of a bundle with no cache for this machine, local cache empty (compiles from the IR
           and saves the artifact)
  second   the same load again: the artifact from hybrid's local cache
  bundled  hybrid.load of a bundle saved on this machine (cm.save): the artifact from the bundle itself
The ratio first/second is what the cache buys on a second load.

Part 2: ``hybrid.profile`` for 5 s against a separate plain timing loop of 5 s on the same model,
alternated; the summary's throughput must agree within 10%.

Run: flock /tmp/bench.lock python benchmarks/bundle_load.py [--models squeezenet,resnet50] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import _results
from _harness import machine_info, table


def _raw(backend: str, data: bytes) -> None:
    if backend == "onnxruntime":
        import onnxruntime as ort

        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    else:
        import openvino as ov

        core = ov.Core()
        core.compile_model(core.read_model(data), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def load_times(models: list[str], rounds: int, work: Path) -> list[list[object]]:
    import hybrid
    from hybrid.bundle import create_bundle, load_with_info
    from hybrid.zoo.samples import light_model_path

    rows = []
    for name in models:
        # weights stored in the file, as real models have them (the light zoo generates its weights)
        path = work / f"{name}.onnx"
        hybrid.optimize(light_model_path(name), level="O1").save(path)
        data = path.read_bytes()
        for backend in ("onnxruntime", "openvino"):
            target = f"{backend}:cpu"
            ir_only = work / f"{name}-{backend}-ir.hybrid"
            create_bundle(path, ir_only, platform="arm64", caches=False)  # a bundle made for another machine
            bundled = work / f"{name}-{backend}.hybrid"
            hybrid.compile(path, target=target).save(str(bundled))
            times: dict[str, list[float]] = {k: [] for k in ("raw", "compile", "first", "second", "bundled")}
            sources = set()
            for _ in range(rounds):
                cache = work / "cache"
                shutil.rmtree(cache, ignore_errors=True)
                os.environ["HYBRID_CACHE_DIR"] = str(cache)
                steps = (("raw", partial(_raw, backend, data)), ("compile", partial(hybrid.compile, path, target)),
                         ("first", partial(load_with_info, ir_only, target)),
                         ("second", partial(load_with_info, ir_only, target)),
                         ("bundled", partial(load_with_info, bundled, target)))
                for key, fn in steps:
                    t0 = time.perf_counter()
                    out = fn()
                    times[key].append(time.perf_counter() - t0)
                    if key in ("first", "second", "bundled"):
                        sources.add((key, out[1].source))
                    time.sleep(0.05)
            assert sources == {("first", "ir"), ("second", "local-cache"), ("bundled", "bundle-cache")}, sources
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            rows.append([name, backend, med["raw"], med["compile"], med["first"], med["second"], med["bundled"],
                         med["first"] / med["second"], bundled.stat().st_size / 2**20])
    return rows


def _plain_rate(cm, feeds, seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        cm.run(feeds)
        n += 1
    return n / (time.perf_counter() - t0)


def profile_accuracy(models: list[str], seconds: float, pairs: int, work: Path) -> list[list[object]]:
    """Profiled periods sandwiched between plain ones (plain, profile, plain, profile, ..., plain): each
    profile's throughput is compared with the mean of the plain periods around it, so that a load that
    drifts during the run cancels; the median of those ratios is reported."""
    import hybrid
    from hybrid.runtime.profiler import profile, sample_inputs
    from hybrid.zoo.samples import light_model_path

    rows = []
    for name in models:
        for backend in ("onnxruntime", "openvino"):
            cm = hybrid.compile(light_model_path(name), target=f"{backend}:cpu")
            feeds = sample_inputs(cm.signature)
            plain = [_plain_rate(cm, feeds, seconds)]
            prof = []
            for _ in range(pairs):
                time.sleep(0.2)
                report = profile(cm, duration=seconds, output=work / "profile.json", quiet=True)
                prof.append(report.throughput)
                time.sleep(0.2)
                plain.append(_plain_rate(cm, feeds, seconds))
            ratios = [p / ((a + b) / 2) for p, a, b in zip(prof, plain, plain[1:])]
            trace = json.loads((work / "profile.json").read_text())  # the last 5-second trace parses...
            spans = sum(1 for e in trace["traceEvents"] if e.get("cat") == "node")  # ...and has node spans
            rows.append([name, backend, report.runs, report.latency_ms["p50"], report.latency_ms["p99"],
                         statistics.median(prof), statistics.median(plain), statistics.median(ratios),
                         f"{min(ratios):.3f}..{max(ratios):.3f}", report.top_ops[0].name if report.top_ops else "-",
                         spans])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="squeezenet,inception_v1,resnet50,densenet121")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile-seconds", type=float, default=5.0)
    parser.add_argument("--pairs", type=int, default=3, help="alternations of profiled and plain periods")
    parser.add_argument("--skip-load", action="store_true", help="only the profiler part")
    _results.add_argument(parser, "bundle_load")
    args = parser.parse_args()
    models = args.models.split(",")
    print(f"machine: {machine_info()}\n")
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.skip_load:
            rows = load_times(models, args.rounds, work)
            parts.append(f"### Bundle load time (median of {args.rounds} rounds, ms)\n\n"
                         + table(["model", "backend", "raw runtime", "hybrid.compile", "first load (IR)",
                                  "second load (cache)", "load from bundle cache", "first/second", "bundle MiB"], rows))
            print(parts[-1])
        rows = profile_accuracy(models[:2], args.profile_seconds, args.pairs, work)
        parts.append(f"### hybrid.profile ({args.profile_seconds:.0f} s) vs a separate timing loop "
                     f"({args.pairs} profiled periods between plain ones)\n\n"
                     + table(["model", "backend", "runs", "p50 ms", "p99 ms", "profile throughput /s", "plain loop /s",
                              "median ratio", "ratio range", "top op", "node spans"], rows))
        print("\n" + parts[-1])
    if args.write_results:
        _results.write_results(args.write_results, "Profiler and bundle cache through the backend contract",
                               _results.command_line(), "\n\n".join(parts))


if __name__ == "__main__":
    main()
