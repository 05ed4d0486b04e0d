"""Concurrent callers of one compiled model: target='auto' with nothing given against every raw layout (issue 50).

Per zoo model and per number of caller threads (1, 4, 16 by default), in one process, on the same inputs:

- **raw layouts** (the sweep a deployment engineer would run by hand, as Triton Model Analyzer does): ONNX Runtime
  with R sessions x T intra-op threads filling the cores (R in 2, 4, cores: each call takes a free session, the
  callers that wait served in turn, as Triton's instance groups serve a queue: the sessions are raw, the pool is
  ``hybrid.hal.layout.ReplicaPool``; R = 1: one session of T threads running the calls concurrently, as ORT does
  when threads share a session) and its default (one session, ORT's own thread count); OpenVINO f32 with the
  LATENCY hint (its default here) and with the THROUGHPUT hint (one infer request per calling thread);
- **hybrid**: ``hybrid.compile(path)`` (target 'auto', nothing given, an empty decision cache), tuned by the same
  threads' calls until its bucket is decided (at most ``--limit-s``), then measured like the others.

Each contender runs windows of ``--window-s`` in which every thread calls it back to back (the first 0.3 s of a window
untimed); the contenders rotate through ``--reps`` rounds, and each ratio is the median over rounds of the paired
per-round ratio of inferences per second. Latencies are those of every call that ends in the timed part of a window,
from its start (a call that waited through the lead-in counts whole), and the slowest thread's share is its calls
over the mean thread's (1.0: every caller served alike; a pool that lets the thread giving a session back take it
again starves the others, and its rate and p99 then describe two callers, not sixteen). Reported per (model,
threads): hybrid over the best raw layout, hybrid over the raw default (one ORT session), what hybrid chose, its p99
latency over the best raw layout's, and both slowest threads' shares.

Run alone on the machine (under ``flock /tmp/coord/bench.lock``):
    python benchmarks/layouts.py [--models detector,crnn,encoder] [--threads 1,4,16] [--reps 3] [--window-s 1.5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results
from _harness import machine_info, percentile, table

LEAD_S = 0.3


def window(fn: Callable[[], object], threads: int, seconds: float) -> tuple[float, list[float], float]:
    """``threads`` callers calling ``fn`` back to back: inferences per second, the seconds of every call that ended
    in the timed part (from its start), and the slowest thread's calls over the mean thread's."""
    stop = time.perf_counter() + LEAD_S + seconds
    begin = time.perf_counter() + LEAD_S
    lat: list[list[float]] = [[] for _ in range(threads)]

    def caller(k: int) -> None:
        mine = lat[k]
        while True:
            t0 = time.perf_counter()
            if t0 >= stop:
                return
            fn()
            t1 = time.perf_counter()
            if begin <= t1 < stop:
                mine.append(t1 - t0)

    pool = [threading.Thread(target=caller, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    calls = [s for part in lat for s in part]
    counts = [len(part) for part in lat]
    return len(calls) / seconds, calls, min(counts) / max(statistics.mean(counts), 1e-9)


class _Session:
    """A raw ONNX Runtime session as a pool's replica (``run(feeds)``)."""

    def __init__(self, session: object) -> None:
        self.session = session
        self.input_names: list[str] = []
        self.output_names: list[str] = []

    def run(self, feeds: Mapping[str, object]) -> object:
        return self.session.run(None, dict(feeds))  # type: ignore[attr-defined]


def ort_layout(path: str, sessions: int, threads: int | None) -> Callable[[Mapping[str, object]], object]:
    """R sessions x T intra-op threads, the waiting callers served in turn; None: ORT's default thread count."""
    import onnxruntime as ort

    from hybrid.hal.layout import ReplicaPool

    made = []
    for _ in range(sessions):
        so = ort.SessionOptions()
        if threads is not None:
            so.intra_op_num_threads = threads
            if threads > 1 and sessions > 1:
                so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        made.append(ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]))
    if sessions == 1:  # one session runs concurrent calls itself
        return lambda feeds: made[0].run(None, dict(feeds))
    return ReplicaPool([_Session(s) for s in made]).run  # type: ignore[list-item]


def ov_layout(path: str, hint: str) -> Callable[[Mapping[str, object]], object]:
    """OpenVINO f32 with a performance hint; one infer request per calling thread."""
    import openvino as ov

    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": hint})
    local = threading.local()

    def run(feeds: Mapping[str, object]) -> object:
        req = getattr(local, "req", None)
        if req is None:
            req = local.req = compiled.create_infer_request()
        return req.infer(dict(feeds), share_outputs=False)
    return run


def tune(cm: object, feeds: Mapping[str, object], threads: int, limit_s: float) -> tuple[float, str]:
    """Call ``cm`` from ``threads`` threads until its bucket is decided with no candidate left untimed (the time bound
    can decide a bucket with some left for its re-check: the measurement would then time that re-check's turns);
    (seconds, what serves)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        window(lambda: cm.run(feeds), threads, 0.5)
        status = cm.tuning
        if status and all(s.state == "decided" and not any(c.outcome == "open" for c in s.candidates)
                          for s in status):
            return time.perf_counter() - t0, status[0].serving
    return time.perf_counter() - t0, (cm.tuning[0].serving + " (not settled)") if cm.tuning else "?"


def measure(name: str, threads: int, reps: int, window_s: float, limit_s: float) -> list[object]:
    import hybrid
    from hybrid import zoo
    from hybrid.hal.machine import usable_cores

    folder = Path(tempfile.mkdtemp(prefix=f"layouts-{name}-"))
    m = zoo.build(name, folder=folder)
    path = str(m.path)
    feeds = m.feeds(seed=0)
    cores = usable_cores()
    raw: dict[str, Callable[[Mapping[str, object]], object]] = {"ort default": ort_layout(path, 1, None)}
    for r in sorted({1, 2, 4, cores}):
        if r <= cores:
            raw[f"ort {r}x{max(1, cores // r)}"] = ort_layout(path, r, max(1, cores // r))
    raw["ov LATENCY"] = ov_layout(path, "LATENCY")
    raw["ov THROUGHPUT"] = ov_layout(path, "THROUGHPUT")
    os.environ["HYBRID_CACHE_DIR"] = str(folder / "cache")  # an empty decision cache: decided by these calls
    cm = hybrid.compile(path)
    decided_s, serving = tune(cm, feeds, threads, limit_s)
    contenders = {**{k: (lambda f=f: f(feeds)) for k, f in raw.items()}, "hybrid": lambda: cm.run(feeds)}
    rate: dict[str, list[float]] = {k: [] for k in contenders}
    lat: dict[str, list[float]] = {k: [] for k in contenders}
    share: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    for rep in range(reps):
        for k in names[rep % len(names):] + names[:rep % len(names)]:
            r, calls, slowest = window(contenders[k], threads, window_s)
            rate[k].append(r)
            lat[k] += calls
            share[k].append(slowest)
    best = max(raw, key=lambda k: statistics.median(rate[k]))
    vs_best = statistics.median(rate["hybrid"][i] / rate[best][i] for i in range(reps))
    vs_default = statistics.median(rate["hybrid"][i] / rate["ort default"][i] for i in range(reps))
    p99 = percentile(lat["hybrid"], 99) / percentile(lat[best], 99)
    layouts = " / ".join(f"{k} {statistics.median(rate[k]):.0f}" for k in raw)
    after = cm.tuning[0].serving if cm.tuning else "?"
    if after != serving.split(" ")[0]:  # the calls of the measured windows brought the layouts in (a re-check)
        serving = f"{serving}, then {after}"
    cm.close()
    return [name, threads, f"{statistics.median(rate['hybrid']):.0f}", serving, f"{decided_s:.0f}", best,
            f"x{vs_best:.2f}", f"x{vs_default:.2f}", f"x{p99:.2f}", f"{min(share['hybrid']):.2f}",
            f"{min(share[best]):.2f}", layouts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="detector,crnn,encoder")
    ap.add_argument("--threads", default="1,4,16")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--window-s", type=float, default=1.5)
    ap.add_argument("--limit-s", type=float, default=150.0)
    _results.add_argument(ap, "layouts")
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            rows.append(measure(name, threads, args.reps, args.window_s, args.limit_s))
            print(rows[-1], file=sys.stderr, flush=True)
    print(machine_info())
    results = table(["model", "threads", "hybrid inf/s", "hybrid chose", "decided after s", "best raw layout",
                     "hybrid / best raw", "hybrid / raw default", "p99 / best raw's", "hybrid slowest thread",
                     "best raw slowest thread", "raw layouts inf/s"], rows)
    print(results)
    if args.write_results:
        _results.write_results(args.write_results, "Concurrent callers: layouts in target='auto' (issue 50)",
                               _results.command_line(), results)


if __name__ == "__main__":
    main()
