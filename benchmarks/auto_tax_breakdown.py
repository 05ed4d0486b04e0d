"""Where the latency tax of online tuning goes: each call of a closed loop, by the bucket's phase and the lane serving.

One zoo model compiled with ``target='auto'`` and nothing given, called back to back until its bucket is decided.
Every call is recorded with its seconds, the bucket's phase at that moment (``cm.tuning``, polled every 2 ms) and
the lane that answered (the serving candidate, or a probe's turn). The excess of a group of calls is their seconds
beyond their count times the mean of the default candidate (``target=<the start's backend>``) timed alone for 2 s
before tuning. That baseline is not interleaved, so the total moves with this VM's speed (it halves for seconds at
a time): read the shares of the excess by phase, not the total; ``benchmarks/auto_real.py`` measures the tax itself.

Run:
    python benchmarks/auto_tax_breakdown.py [--model neg_dim] [--limit-s 40] [--warm]

``--warm`` starts the check process (and its imports) before the model is compiled, as a server that loaded a model
before has it; without it the first check also pays the process's start.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine_info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="neg_dim")
    ap.add_argument("--limit-s", type=float, default=40.0)
    ap.add_argument("--warm", action="store_true", help="start the check process before the compile")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hybrid-bench-tax-"))
    os.environ["HYBRID_CACHE_DIR"] = str(work / "cache")

    import hybrid
    from hybrid import zoo
    from hybrid.runtime.auto import worker

    print(machine_info(), flush=True)
    m = zoo.build(args.model, folder=work / "zoo")
    feeds = m.feeds(seed=0)
    if args.warm:
        worker._worker().ask("probe")  # the check process, started and its imports done
    cm = hybrid.compile(m.path, target="auto")
    default = hybrid.compile(m.path, target=cm.backend)
    for _ in range(200):
        default.run(feeds)
    base: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 2.0:
        a = time.perf_counter()
        default.run(feeds)
        base.append(time.perf_counter() - a)
    base_mean = statistics.fmean(base)

    router = cm.executable.router
    phase, done, marks = ["new"], [False], []
    polling = [True]

    def poll() -> None:
        last = None
        while polling[0]:
            status = cm.tuning
            p = status[0].phase if status else "new"
            if p != last:
                marks.append((time.perf_counter(), p))
                last = p
            phase[0] = p
            done[0] = p == "decided"
            time.sleep(0.002)

    threading.Thread(target=poll, daemon=True).start()
    calls = []
    start = time.perf_counter()
    while time.perf_counter() - start < args.limit_s and not done[0]:
        lane = cm.backend
        a = time.perf_counter()
        for route in list(router.routes().values())[:1]:
            lane, probe = route.serving.label, route.probe
            if probe is not None:
                turn = int((a - probe.start) // probe.turn_s)
                if 0 <= turn < len(probe.lanes):
                    lane = f"{probe.lanes[turn].label} (turn {turn + 1} of {len(probe.lanes)})"
        cm.run(feeds)
        calls.append((a - start, time.perf_counter() - a, phase[0], lane))
    polling[0] = False

    status = cm.tuning[0] if cm.tuning else None
    print(f"{args.model}: default {cm.backend} alone: mean {base_mean * 1e6:.1f} us; tuning {calls[-1][0]:.1f} s, "
          f"{len(calls)} calls; {status.state if status else '-'}, serving {status.serving if status else '-'}")
    print("phases: " + ", ".join(f"{p} at {t - start:.2f} s" for t, p in marks))
    groups: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for _, s, p, lane in calls:
        groups[(p, lane)][0] += 1
        groups[(p, lane)][1] += s
    excess = {k: s - n * base_mean for k, (n, s) in groups.items()}
    total = sum(max(0.0, e) for e in excess.values()) or 1e-12
    print(f"{'phase':10s} {'lane':40s} {'calls':>8s} {'mean us':>9s} {'excess s':>9s} {'share':>6s}")
    for (p, lane), e in sorted(excess.items(), key=lambda kv: -kv[1]):
        n, s = groups[(p, lane)]
        print(f"{p:10s} {lane:40s} {n:8d} {s / n * 1e6:9.1f} {e:9.3f} {max(0.0, e) / total:6.1%}")
    cm.close()
    default.close()


if __name__ == "__main__":
    main()
