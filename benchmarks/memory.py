"""Memory (RSS) of hybrid against the raw runtime it wraps, each contender alone in a fresh process (issue 55).

Contenders, on a ``hybrid.zoo`` model at the shapes its users run, ``--runs`` calls each after compiling:

- ``ort``: raw ``onnxruntime.InferenceSession(path)`` on the CPU execution provider;
- ``hybrid:ort``: ``hybrid.compile(path, target='onnxruntime')``;
- ``ov``: raw OpenVINO ``Core.compile_model(path, 'CPU', ...)`` with hybrid's defaults (LATENCY hint, f32);
- ``hybrid:ov``: ``hybrid.compile(path, target='openvino')``;
- ``hybrid:auto``: ``hybrid.compile(path, target='auto')`` and its check process (the process's children).

Each sample is a fresh interpreter that imports numpy and loads the inputs (from an ``.npz`` the driver wrote),
then does only what its contender does, and reads ``VmRSS`` / ``VmHWM`` from ``/proc`` (Linux). ``steady`` is the
RSS after the calls, ``peak`` the high-water mark. For auto, the process and its children are sampled every 50 ms
while it compiles and serves calls (until tuning has decided or ``--auto-seconds`` passed): ``peak`` is the largest
sum seen, ``steady`` the sum at the end; the run then says how long after the last call the check process ended
(it is idle for the tuning policy's ``check_idle_s`` once a check under way has answered). The contenders run
interleaved, ``--reps`` rounds in a rotated order; hybrid/raw ratios are taken within a round (paired) and the
median over rounds is reported. With ``--write-results`` the tables replace this benchmark's section of
``benchmarks/RESULTS.md`` (one current table; the one replaced goes to ``benchmarks/history/memory.md``).

Run it alone on the machine (``flock /tmp/coord/bench.lock python benchmarks/memory.py``): the RSS of a process
does not depend on the load, but the auto contender's tuning does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TITLE = "Memory: RSS of hybrid vs the raw runtimes (issue 55)"
CONTENDERS = ("ort", "hybrid:ort", "ov", "hybrid:ov", "hybrid:auto")
WHY = {"unet": "the zoo's largest model in memory: raw ONNX Runtime's RSS at the shapes its users run",
       "external_data": "the zoo's largest file"}
PAIRS = (("hybrid:ort", "ort"), ("hybrid:ov", "ov"), ("hybrid:auto", "ort"))
IDLE_WAIT_S = 60.0  # how long past the policy's check_idle_s the run waits for the check process to end: a check
# still under way when the calls stop (paced to a share of the CPU) finishes first, and only then is it idle


# ------------------------------------------------------------------ /proc
def _status_mb(pid: int | str, key: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (Linux: the ``children`` file of each of its threads)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            continue
    return found + [g for c in found for g in _children(c)]


# ------------------------------------------------------------------ one contender, in its own process
def _child(mode: str, path: str, feeds_path: str, runs: int, auto_seconds: float) -> dict:
    import numpy as np

    feeds = dict(np.load(feeds_path))
    before = _status_mb("self", "VmRSS")
    out: dict = {"mode": mode, "before_mb": before}
    if mode == "ort":
        import onnxruntime as ort

        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            session.run(None, feeds)
    elif mode == "ov":
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                                         "INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        for _ in range(runs):
            request.infer(feeds)
    elif mode in ("hybrid:ort", "hybrid:ov"):
        import hybrid

        cm = hybrid.compile(path, target={"hybrid:ort": "onnxruntime", "hybrid:ov": "openvino"}[mode])
        for _ in range(runs):
            cm.run(feeds)
    elif mode == "hybrid:auto":
        out.update(_auto(path, feeds, runs, auto_seconds))
        return out
    else:
        raise SystemExit(f"unknown contender {mode!r}")
    out["steady_mb"] = _status_mb("self", "VmRSS")
    out["peak_mb"] = _status_mb("self", "VmHWM")
    return out


def _auto(path: str, feeds: dict, runs: int, auto_seconds: float) -> dict:
    """target='auto' with its check process: sampled while it compiles and serves, then left idle."""
    import hybrid
    from hybrid.config import autotune_config
    from hybrid.runtime.auto.policy import TuningPolicy

    me = os.getpid()
    peak = {"sum": 0.0, "worker": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            kids = sum(_status_mb(c, "VmRSS") for c in _children(me))
            peak["sum"] = max(peak["sum"], _status_mb(me, "VmRSS") + kids)
            peak["worker"] = max(peak["worker"], kids)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    cm = hybrid.compile(path, target="auto")
    calls = 0
    while calls < runs or (time.perf_counter() - t0 < auto_seconds
                           and any(b.state != "decided" for b in (cm.tuning or ()))):
        cm.run(feeds)
        calls += 1
    stop.set()
    sampler.join()
    kids = _children(me)
    out = {"steady_mb": _status_mb(me, "VmRSS") + sum(_status_mb(c, "VmRSS") for c in kids),
           "peak_mb": max(peak["sum"], _status_mb(me, "VmHWM")), "worker_peak_mb": peak["worker"],
           "parent_mb": _status_mb(me, "VmRSS"), "calls": calls, "seconds": time.perf_counter() - t0,
           "backend": cm.backend}
    idle_s = TuningPolicy.from_settings(autotune_config()).check_idle_s
    ended = time.perf_counter()
    while _children(me) and time.perf_counter() - ended < idle_s + IDLE_WAIT_S:
        time.sleep(0.5)
    out["idle_s"] = idle_s
    out["worker_left_after_s"] = None if _children(me) else time.perf_counter() - ended
    return out


# ------------------------------------------------------------------ the driver
def _sample(mode: str, model: str, feeds_path: str, runs: int, auto_seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="hybrid-memory-") as cache:
        # a cache of its own: each sample compiles as a first run does (no decision cached by the one before)
        env = {**os.environ, "HYBRID_CACHE_DIR": cache, "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run([sys.executable, __file__, "--child", mode, model, feeds_path, str(runs),
                               str(auto_seconds)], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} on {model} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _section(models: list[tuple[str, str]], samples: dict, args: argparse.Namespace) -> str:
    lines = ["Each figure the median over the repetitions, each a fresh process (numpy and the inputs loaded "
             "first: `before`); `steady` is the RSS after the calls, `peak` the high-water mark; ratios are paired "
             "within a repetition. `hybrid:auto` counts its check process too (sampled every 50 ms).", ""]
    for model, size in models:
        why = f"; {WHY[model]}" if model in WHY else ""
        lines += [f"**{model}** ({size}{why}):", "",
                  "| contender | before MB | steady MB | peak MB | steady vs raw | peak vs raw |",
                  "|---|---|---|---|---|---|"]
        for mode in CONTENDERS:
            rows = samples[model][mode]
            raw = dict(PAIRS).get(mode)
            ratio_s = ratio_p = "—"
            if raw:
                pairs = list(zip(rows, samples[model][raw], strict=True))
                ratio_s = f"x{_median([a['steady_mb'] / b['steady_mb'] for a, b in pairs]):.2f}"
                ratio_p = f"x{_median([a['peak_mb'] / b['peak_mb'] for a, b in pairs]):.2f}"
            lines.append(f"| {mode} | {_median([r['before_mb'] for r in rows]):.0f} | "
                         f"{_median([r['steady_mb'] for r in rows]):.0f} | {_median([r['peak_mb'] for r in rows]):.0f} "
                         f"| {ratio_s} | {ratio_p} |")
        auto = samples[model]["hybrid:auto"]
        gone = [r["worker_left_after_s"] for r in auto if r["worker_left_after_s"] is not None]
        if not gone:
            ended = "was still there in every run"
        else:
            ended = f"ended {min(gone):.0f}-{max(gone):.0f} s after the last call in {len(gone)} of {len(auto)} runs"
        lines += ["", f"auto: served by {', '.join(sorted({r['backend'] for r in auto}))}; "
                  f"{_median([r['calls'] for r in auto]):.0f} calls in {_median([r['seconds'] for r in auto]):.1f} s; "
                  f"the process itself {_median([r['parent_mb'] for r in auto]):.0f} MB at the end, its check process "
                  f"{_median([r['worker_peak_mb'] for r in auto]):.0f} MB at its peak; the check process "
                  f"(idle time {auto[0]['idle_s']:.0f} s, the tuning policy's `check_idle_s`) {ended}.", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--models", default="unet,external_data",
                        help="zoo models (default: unet, the largest in memory; external_data, the largest file)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20, help="calls after compiling")
    parser.add_argument("--auto-seconds", type=float, default=60.0,
                        help="auto: serve calls until tuning decided or this long")
    # The flag _results.add_argument would add, written here: the children measure their own RSS, so this script
    # imports nothing at its top that the raw contenders would not (benchmarks/_results.py is imported to write).
    parser.add_argument("--write-results", nargs="?", const="memory", default=None, metavar="NAME",
                        help="replace this benchmark's section of benchmarks/RESULTS.md with this run's tables")
    parser.add_argument("--child", nargs=5, metavar=("MODE", "MODEL", "FEEDS", "RUNS", "AUTO_SECONDS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, model, feeds, runs, auto_seconds = args.child
        print(json.dumps(_child(mode, model, feeds, int(runs), float(auto_seconds))))
        return
    from hybrid import zoo

    models: list[tuple[str, str]] = []
    samples: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="hybrid-memory-feeds-") as tmp:
        import numpy as np

        for name in args.models.split(","):
            m = zoo.build(name)
            data = Path(str(m.path) + ".data")
            size = m.path.stat().st_size + (data.stat().st_size if data.exists() else 0)
            feeds_path = os.path.join(tmp, f"{name}.npz")
            np.savez(feeds_path, **m.feeds(seed=0))
            shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in m.shapes.items())
            models.append((name, f"{size / 1e6:.1f} MB file, inputs {shapes}"))
            samples[name] = {c: [] for c in CONTENDERS}
            for rep in range(args.reps):
                order = CONTENDERS[rep % len(CONTENDERS):] + CONTENDERS[:rep % len(CONTENDERS)]
                for mode in order:
                    s = _sample(mode, str(m.path), feeds_path, args.runs, args.auto_seconds)
                    samples[name][mode].append(s)
                    print(f"{name} rep {rep} {mode}: steady {s['steady_mb']:.0f} MB, peak {s['peak_mb']:.0f} MB",
                          flush=True)
    section = _section(models, samples, args)
    print(section)
    if args.write_results:
        import _results  # benchmarks/ is first on sys.path when this runs as a script

        _results.write_results(args.write_results, TITLE, _results.command_line(), section)


if __name__ == "__main__":
    main()
