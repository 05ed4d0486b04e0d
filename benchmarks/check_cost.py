"""What online tuning's first phases cost calls that arrive at a rate below capacity (issue 51), by phase.

Each arm is a fresh process with an empty decision cache, on one ``hybrid.zoo`` model, calling it from one thread:

- ``untuned``: ``hybrid.compile(path, target='onnxruntime')``, what ``target='auto'`` starts on;
- ``auto``: ``hybrid.compile(path)`` with nothing given, while its first bucket is checked, compiled and raced;
- ``auto-base`` (with ``--baseline SRC``): the same from another checkout's ``src`` (old against new, paired).

Two loads, each at a share of the capacity of one raw ONNX Runtime session (``--shares``, 0.5 by default; its
median call in a closed loop, measured in the arm before it starts):

- ``duty``: after each call the thread waits so that calls fill that share of the time (at 0.5 as long as the call
  took; it never queues): the calls' own durations, what the tuning's other work does to a call while it runs;
- ``arrivals``: calls due at fixed times (one every service time over the share: a D/D/1 queue that never queues by
  itself), latency from when each was due, so a call that starts late because of the tuning counts. The arm's own
  speed estimate sets the rate: where the machine slows down after it, the untuned arm queues too (read the
  untuned column before the ratios). The caller sleeps until 1 ms before each call is due and spins from there, so
  with calls less than 1 ms apart it keeps a core busy between them;
- ``arrivals-asleep``: the same calls, the caller asleep until each is due (Linux: a timer slack of 1 ns, so it wakes
  within microseconds), as a server's thread waits for its next request without using a core.

The table gives medians over ``--reps`` of the mean and p99 and the ratios to the untuned arm (paired per
repetition, the arms' order alternating), and the phases ``cm.tuning`` showed during the window.

    flock /tmp/coord/bench.lock python benchmarks/check_cost.py --models neg_dim crnn --reps 3 --seconds 12 \
        [--shares 0.5 0.85] [--baseline /tmp/base/src] [--loads arrivals-asleep --interval-ms 0.3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine_info, table
from _results import add_argument, command_line, write_results

ARMS = ("untuned", "auto")
BASE = "auto-base"  # --baseline's target='auto'
LOADS = ("duty", "arrivals", "arrivals-asleep")


def arm(name: str, which: str, load: str, seconds: float, zoo_folder: str, share: float = 0.5,
        interval_s: float = 0.0) -> dict[str, Any]:
    """One arm, in this process (run as ``--arm``): the calls' mean and p99 (ms) and the phases seen."""
    import numpy as np

    os.environ["HYBRID_CACHE_DIR"] = tempfile.mkdtemp(prefix="hybrid-check-cost-")
    import hybrid
    from hybrid import zoo

    m = zoo.build(name, folder=Path(zoo_folder))
    feeds = m.feeds(seed=0)
    raw = hybrid.compile(m.path, target="onnxruntime")
    for _ in range(50):
        raw.run(feeds)
    times: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.5 or len(times) < 20:
        s = time.perf_counter()
        raw.run(feeds)
        times.append(time.perf_counter() - s)
    service = statistics.median(times)
    raw.close()
    if load == "arrivals-asleep" and sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK, 1 ns: sleep() wakes when due, not 50 us later
    cm = hybrid.compile(m.path, target="onnxruntime" if which == "untuned" else "auto")
    out: list[float] = []
    phases: dict[str, int] = {}
    start = time.perf_counter()
    due = start
    while time.perf_counter() - start < seconds:
        if load.startswith("arrivals"):
            due += interval_s or service / share
            wait = due - time.perf_counter()
            if load == "arrivals-asleep":
                if wait > 0.0:
                    time.sleep(wait)
            else:
                if wait > 1e-3:
                    time.sleep(wait - 1e-3)
                while time.perf_counter() < due:
                    pass
            cm.run(feeds)
            out.append(time.perf_counter() - due)
        else:
            s = time.perf_counter()
            cm.run(feeds)
            took = time.perf_counter() - s
            out.append(took)
            end = time.perf_counter() + took * (1.0 / share - 1.0)
            while time.perf_counter() < end:
                time.sleep(max(0.0, min(took, end - time.perf_counter())))
        if len(out) % 200 == 0 and which == "auto":
            for record in cm.tuning:
                phases[record.phase] = phases.get(record.phase, 0) + 1
    cm.close()
    a = np.asarray(out)
    return {"mean_ms": float(a.mean() * 1e3), "p99_ms": float(np.percentile(a, 99) * 1e3),
            "service_ms": service * 1e3, "phases": sorted(phases)}


def run_arm(name: str, which: str, load: str, seconds: float, zoo_folder: str, share: float,
            baseline: Path | None = None, interval_s: float = 0.0) -> dict[str, Any]:
    """:func:`arm` in a fresh process (each arm starts with no check process and an empty decision cache);
    ``auto-base`` runs ``baseline``'s code (a ``src`` folder put ahead on ``PYTHONPATH``) as ``auto``."""
    env = dict(os.environ)
    if which == BASE:
        assert baseline is not None
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(baseline), env.get("PYTHONPATH")]))
        which = "auto"
    out = subprocess.run([sys.executable, __file__, "--arm", name, which, load, str(seconds), zoo_folder, str(share),
                          str(interval_s)],
                         capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def _paired(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> tuple[float, str]:
    """The median of the per-repetition ratios ``a[key] / b[key]``, and the ratios as text."""
    x = [p[key] / q[key] for p, q in zip(a, b, strict=True)]
    return statistics.median(x), ", ".join(f"{v:.2f}" for v in x)


def _row(name: str, load: str, got: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One table row: the untuned and auto arms' medians, their paired ratios, and auto-base's where it ran."""
    u, t = got["untuned"], got["auto"]
    (mean_x, means), (p99_x, p99s) = _paired(t, u, "mean_ms"), _paired(t, u, "p99_ms")
    row = [name, load, f"{statistics.median(r['service_ms'] for r in u):.3f}",
           f"{statistics.median(r['mean_ms'] for r in u):.3f}", f"{statistics.median(r['mean_ms'] for r in t):.3f}",
           f"{mean_x:.2f}x ({means})", f"{statistics.median(r['p99_ms'] for r in u):.2f}",
           f"{statistics.median(r['p99_ms'] for r in t):.2f}", f"{p99_x:.2f}x ({p99s})",
           ", ".join(sorted({p for r in t for p in r["phases"]}))]
    if BASE in got:
        b = got[BASE]
        row += [f"{_paired(b, u, 'mean_ms')[0]:.2f}x", f"{_paired(b, u, 'p99_ms')[0]:.2f}x",
                "{:.2f}x ({})".format(*_paired(t, b, "mean_ms")), "{:.2f}x ({})".format(*_paired(t, b, "p99_ms"))]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["neg_dim", "crnn"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--loads", nargs="+", choices=LOADS, default=list(LOADS))
    ap.add_argument("--shares", nargs="+", type=float, default=[0.5],
                    help="the load as a share of one raw session's capacity (0 < share < 1)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="the src folder of another checkout: its target='auto' runs as arm auto-base, paired")
    ap.add_argument("--interval-ms", type=float, default=0.0,
                    help="calls due this far apart in every arm (arrivals loads) instead of the service time over the "
                         "share: the same rate for every arm, where a model's speed estimate swings (a 0.1 ms model)")
    ap.add_argument("--arm", nargs=7, help=argparse.SUPPRESS)
    add_argument(ap)
    args = ap.parse_args()
    if args.arm:
        name, which, load, seconds, folder, share, interval = args.arm
        print(json.dumps(arm(name, which, load, float(seconds), folder, float(share), float(interval))))
        return
    if args.reps < 1 or args.seconds <= 0 or args.interval_ms < 0 or not all(0.0 < x < 1.0 for x in args.shares):
        ap.error("--reps must be >= 1, --seconds > 0, --interval-ms >= 0 and every share between 0 and 1")
    arms = (*ARMS, BASE) if args.baseline is not None else ARMS
    print(machine_info(), flush=True)
    folder = tempfile.mkdtemp(prefix="hybrid-check-cost-zoo-")
    rows = []
    for name in args.models:
        for load in args.loads:
            for share in args.shares:
                got: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
                for rep in range(args.reps):
                    for which in arms if rep % 2 == 0 else arms[::-1]:
                        got[which].append(run_arm(name, which, load, args.seconds, folder, share, args.baseline,
                                                  args.interval_ms / 1e3))
                        if sys.stderr.isatty():
                            print(f"{name} {load} {share:g} rep {rep} {which}: {got[which][-1]}", file=sys.stderr,
                                  flush=True)
                every = f"every {args.interval_ms:g} ms" if args.interval_ms and load != "duty" else f"{share:.0%}"
                rows.append(_row(name, f"{load} {every}", got))
    head = ["model", "load", "service ms", "untuned mean ms", "auto mean ms", "mean / untuned (per rep)",
            "untuned p99 ms", "auto p99 ms", "p99 / untuned (per rep)", "auto's phases seen"]
    if args.baseline is not None:
        head += ["auto-base mean / untuned", "auto-base p99 / untuned", "auto / auto-base mean (per rep)",
                 "auto / auto-base p99 (per rep)"]
    text = table(head, rows)
    print(text, flush=True)
    if args.write_results is not None:
        write_results(args.write_results or "check_cost", "What tuning's first phases cost calls below capacity "
                      "(issue 51)", command_line(), text,
                      f"One thread, each arm a fresh process with an empty decision cache; 'duty S': calls filling "
                      f"the share S of the time (the calls' own durations); 'arrivals S': calls due one every service "
                      f"time over S (latency from when each was due; 'arrivals-asleep': the caller asleep until each "
                      f"is due, 'arrivals': spinning its last ms); {args.seconds:g} s windows from the compile, "
                      f"medians over {args.reps} repetitions, ratios paired per repetition"
                      + (f"; auto-base: target='auto' from {args.baseline}" if args.baseline is not None else "")
                      + ".")


if __name__ == "__main__":
    main()
