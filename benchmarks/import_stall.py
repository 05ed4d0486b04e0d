"""What the serving calls feel of a candidate made ready in their process: a compile there, or an import (issue 51).

Two parts, both on ``hybrid.zoo`` models (``--models``: by default the smallest and the largest that tune online).

**Stall.** A serving thread calls the model on ONNX Runtime back to back; a second thread makes one candidate ready
as the tuner's lab does, and runs it 3 times: either compiled from the model (what the lab did before), or imported
from the artifact the check process hands back (``Backend.prepare_artifact``, made here beforehand and outside the
window, as the check process makes it). Compile and import alternate (paired, the order flipped every repetition);
the table gives medians over ``--reps``: how long it took, and the serving calls meanwhile against the median of the
0.3 s of calls just before (mean slowdown, p99).

**Open loop.** Requests arrive at random (a Poisson process) at ``--loads`` of one raw ONNX Runtime session's
capacity (its mean call time in a closed loop, measured first), into one serving thread (a FIFO queue): the latency
of each counts from its arrival. Three arms take turns per repetition, each from an empty decision cache:
``hybrid.compile(path, target='auto')`` with nothing given while its first bucket tunes (artifacts imported), the
same with artifacts off (every candidate compiled in this process, as before), and the untuned start alone
(``target='onnxruntime'``, what auto starts on). The table gives medians over the repetitions of p99 and mean
latency, and their ratios to the untuned start's (paired per repetition).

    flock /tmp/coord/bench.lock python benchmarks/import_stall.py --reps 3 --seconds 12
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine_info, table
from _results import add_argument, command_line, write_results

MODELS = ("neg_dim", "detector")  # the smallest and the largest zoo model whose dims are dynamic (they tune online)
CANDIDATES = ("onnxruntime", "openvino")


def _calls_during(serve: Callable[[], Any], action: Callable[[], None]) -> dict[str, float]:
    """The serving calls during ``action`` (in another thread) against the 0.3 s of calls just before."""
    base: list[float] = []
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        serve()
        base.append(time.perf_counter() - t0)
    done = threading.Event()

    def run() -> None:
        try:
            action()
        finally:
            done.set()

    during: list[float] = []
    thread = threading.Thread(target=run)
    start = time.perf_counter()
    thread.start()
    while not done.is_set():
        t0 = time.perf_counter()
        serve()
        during.append(time.perf_counter() - t0)
    seconds = time.perf_counter() - start
    thread.join()
    lat = np.asarray(during)
    median = statistics.median(base)
    return {"s": seconds, "slowdown": float(lat.mean() / median), "p99_ms": float(np.percentile(lat, 99) * 1e3),
            "base_ms": median * 1e3}


def stall(name: str, folder: Path, reps: int) -> list[list[str]]:
    import hybrid
    from hybrid import zoo
    from hybrid.hal import backend_status, get_backend
    from hybrid.ir import Model

    m = zoo.build(name, folder=folder / "zoo")
    feeds = m.feeds(seed=0)
    model = Model.load(m.path)
    serve = hybrid.compile(m.path, target="onnxruntime")
    for _ in range(200):
        serve.run(feeds)
    rows = []
    for backend in [b for b in CANDIDATES if backend_status(b).available]:
        be = get_backend(backend)
        path = str(folder / f"{name}-{backend}.artifact")
        if not be.prepare_artifact(model, "cpu", {}, path):
            continue
        runs: dict[str, list[dict[str, float]]] = {"compile": [], "import": []}

        def ready(artifact: str | None, be: Any = be) -> None:
            exe = be.compile(model, "cpu", {}, artifact=artifact)
            for _ in range(3):
                exe.run(feeds)
            exe.close()

        for rep in range(reps):
            order = [("compile", None), ("import", path)]
            for how, artifact in order[::-1] if rep % 2 else order:
                runs[how].append(_calls_during(lambda: serve.run(feeds), lambda a=artifact: ready(a)))
        med = {how: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for how, rs in runs.items()}
        rows.append([name, backend, f"{med['compile']['s']:.3f}", f"{med['import']['s']:.3f}",
                     f"{med['compile']['slowdown']:.2f}x", f"{med['import']['slowdown']:.2f}x",
                     f"{med['compile']['p99_ms']:.2f}", f"{med['import']['p99_ms']:.2f}",
                     f"{med['compile']['base_ms']:.3f}"])
    serve.close()
    return rows


def _poisson(run: Callable[[], Any], rate: float, seconds: float, seed: int) -> list[float]:
    """Latencies (from arrival to answer) of Poisson arrivals at ``rate`` per second into one serving thread.

    One FIFO server, simulated exactly in one thread: each request starts at its arrival or when the one before it is
    answered, whichever is later, and its latency counts from its arrival (no coordinated omission). No generator
    thread competes with the server for the interpreter (at thousands of arrivals a second it would be the
    bottleneck); the thread spins the last millisecond before an arrival, as a serving thread that polls would.
    """
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, int(rate * seconds * 1.5) + 10)
    out: list[float] = []
    start = time.perf_counter()
    due = start
    for gap in gaps:
        due += gap
        if due - start >= seconds:
            break
        wait = due - time.perf_counter()
        if wait > 1e-3:
            time.sleep(wait - 1e-3)
        while time.perf_counter() < due:
            pass
        run()
        out.append(time.perf_counter() - due)
    return out


def open_loop(name: str, folder: Path, loads: list[float], reps: int, seconds: float,
              arms: tuple[str, ...] = ("import", "compile")) -> list[list[str]]:
    import hybrid
    from hybrid import zoo
    from hybrid.runtime.auto import worker

    m = zoo.build(name, folder=folder / "zoo")
    feeds = m.feeds(seed=0)
    raw = hybrid.compile(m.path, target="onnxruntime")
    for _ in range(100):
        raw.run(feeds)
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 2.0 or calls < 20:  # the capacity of a closed loop, hiccups included
        raw.run(feeds)
        calls += 1
    service_s = (time.perf_counter() - t0) / calls
    raw.close()
    print(f"{name}: {service_s * 1e3:.3f} ms a call in a closed loop", flush=True)
    real_dir = worker.Checker.artifact_dir

    def arm(how: str, rate: float, seed: int, tag: str) -> dict[str, float]:
        os.environ["HYBRID_CACHE_DIR"] = str(folder / f"cache-{tag}")
        worker.Checker.artifact_dir = real_dir if how == "import" else (lambda self: None)  # type: ignore[method-assign]
        try:
            cm = hybrid.compile(m.path, target="onnxruntime" if how == "untuned" else "auto")
            got = _poisson(lambda: cm.run(feeds), rate, seconds, seed)
            lab = getattr(getattr(cm, "executable", None), "lab", None)
            imported = getattr(lab, "imported", 0)
            decided = bool(cm.tuning) and all(s.state == "decided" for s in cm.tuning)
            cm.close()
        finally:
            worker.Checker.artifact_dir = real_dir  # type: ignore[method-assign]
        a = np.asarray(got)
        return {"p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "imported": imported,
                "decided": float(decided)}

    rows = []
    for load in loads:
        rate = load / service_s
        per: dict[str, list[dict[str, float]]] = {"untuned": [], **{how: [] for how in arms}}
        for rep in range(reps):
            order = ["untuned", *arms]
            for how in order[::-1] if rep % 2 else order:
                per[how].append(arm(how, rate, rep, f"{name}-{load}-{rep}-{how}"))
        for how in arms:
            p99 = statistics.median(r["p99"] / u["p99"] for r, u in zip(per[how], per["untuned"], strict=True))
            tax = statistics.median(r["mean"] / u["mean"] for r, u in zip(per[how], per["untuned"], strict=True))
            rows.append([name, f"{load:.0%}", how, f"{statistics.median(r['p99'] for r in per[how]) * 1e3:.2f}",
                         f"{statistics.median(r['p99'] for r in per['untuned']) * 1e3:.2f}", f"{p99:.2f}x",
                         f"{tax:.3f}x", f"{sum(r['imported'] for r in per[how]):.0f}",
                         f"{sum(r['decided'] for r in per[how]):.0f}/{reps}"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--loads", type=float, nargs="+", default=[0.5, 0.85])
    ap.add_argument("--skip-stall", action="store_true")
    ap.add_argument("--skip-open", action="store_true")
    ap.add_argument("--arms", nargs="+", choices=("import", "compile"), default=["import", "compile"],
                    help="the open loop's tuned arms beside the untuned start (artifacts imported; compiled here)")
    add_argument(ap)  # --write-results: the stall's table as 'import_stall', the open loop's as 'import_stall_open'
    args = ap.parse_args()
    print(machine_info(), flush=True)
    folder = Path(tempfile.mkdtemp(prefix="hybrid-import-stall-"))
    if not args.skip_stall:
        rows = [row for name in args.models for row in stall(name, folder, args.reps)]
        text = table(["model", "candidate", "compile + 3 runs s", "import + 3 runs s", "serving: slowdown (compile)",
                      "slowdown (import)", "p99 ms (compile)", "p99 ms (import)", "median before ms"], rows)
        print(text, flush=True)
        if args.write_results is not None:
            write_results(args.write_results or "import_stall", "A candidate made ready in the serving process: "
                          "compile vs the check process's artifact (issue 51)", command_line(), text,
                          f"Medians over {args.reps} paired repetitions; slowdown: the serving calls' mean while the "
                          "candidate is made ready and run 3 times, over their median in the 0.3 s before.")
    if not args.skip_open:
        rows = [row for name in args.models
                for row in open_loop(name, folder, args.loads, args.reps, args.seconds, tuple(args.arms))]
        text = table(["model", "load", "auto, candidates", "p99 ms", "untuned p99 ms", "p99 / untuned",
                      "mean / untuned", "imported", "decided"], rows)
        print(text, flush=True)
        if args.write_results is not None:
            write_results((args.write_results or "import_stall") + "_open", "Open loop while a new bucket tunes: "
                          "artifacts imported vs compiled in process (issue 51)", command_line(), text,
                          f"Poisson arrivals into one serving thread for the first {args.seconds:g} s after "
                          "`hybrid.compile(path, target='auto')` from an empty decision cache; ratios to the untuned "
                          f"start (`target='onnxruntime'`) at the same arrivals, paired per repetition, medians of "
                          f"{args.reps}.")


if __name__ == "__main__":
    main()
