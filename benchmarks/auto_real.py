"""target='auto' on realistic models (hybrid.zoo) at the shapes users run, against the raw runtimes.

For each zoo model at its realistic shapes, in one process, on the same inputs, interleaved in blocks:

- raw ONNX Runtime (default CPU session) and raw OpenVINO (f32, LATENCY hint), as a user would run them;
- ``hybrid.compile(path, 'auto', shapes=m.shapes)`` (decided offline at the declared shapes; a near tie there is
  confirmed on real calls once ``explore_share`` allows, tens of seconds of calls later: the timed blocks
  measure the compile's pick);
- ``hybrid.compile(path, 'auto')`` with nothing declared, after its online warm-up: the calls until every
  bucket settled (later rounds of turns answer at most 0.5 % of the calls), and the latency of the calls
  made while it tuned (p50/p99) against the raw runtime it started on, called in 0.2 s blocks that alternate
  with the tuning calls (the same minutes of the machine; the model's settled latency, measured minutes later,
  where the start has no raw counterpart);
- hybrid on one backend (``target='onnxruntime'``, ``'openvino'``) against that raw runtime: what hybrid
  costs on top of the backend it runs.

Every compile starts from an empty decision cache. Crashes are counted, not raised. Times are steady-state
times: the calls of each block's first ``--lead-s`` seconds are run but not timed (a runtime whose thread pool
idled while the others ran is slower over its first calls; see benchmarks/_harness.py). Ratios are paired: the
median over blocks of the ratio within each block (contenders of one block ran within a second of each other).

Run (alone on the machine; a few minutes):
    python benchmarks/auto_real.py [--models detector,crnn] [--blocks 25 --block-s 0.02 --lead-s 0.05]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import interleave, machine_info, median_ms, paired_ratio, percentile, table


def settled(cm) -> bool:
    """Every bucket of ``cm`` settled once (a static model: decided at compile). Later rounds of turns may follow:
    they answer at most ``explore_share`` of the calls (0.5 %), in the timed blocks too."""
    status = cm.executable.status() if hasattr(cm.executable, "status") else None
    return status is None or (bool(status) and all(s.state == "settled" for s in status))


def warm_up_online(cm, feeds, baseline=None, block_s: float = 0.2, lead_s: float = 0.1,
                   limit_s: float = 600.0) -> tuple[int, list[float], list[float]]:
    """Call an online-tuning model until every bucket settled (at most ``limit_s``); return the calls, their
    latencies, and the latencies of ``baseline`` (the raw runtime the model started on) called in blocks that
    alternate with the model's: the tuning's cost is then read against the same minutes of the shared machine
    (its speed drifts by 20 % and more between one minute and the next). The calls of each block's first
    ``lead_s`` are left out on both sides: a session whose pool idled during the other's block runs slow for a
    while (external_data, ONNX Runtime on both sides: 255 of 301 calls over 2 ms at 50-80 ms into a block, 0.6 %
    of all calls, enough to move a p99)."""
    lat: list[float] = []
    base: list[float] = []
    calls = 0
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not settled(cm):
        start = time.perf_counter()
        while time.perf_counter() - start < block_s and not settled(cm):
            t0 = time.perf_counter()
            cm.run(feeds)
            calls += 1
            if t0 - start >= lead_s or baseline is None:
                lat.append(time.perf_counter() - t0)
        if baseline is not None:
            start = time.perf_counter()
            while time.perf_counter() - start < block_s:
                t0 = time.perf_counter()
                baseline()
                if t0 - start >= lead_s:
                    base.append(time.perf_counter() - t0)
    return calls, lat, base


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="")
    ap.add_argument("--blocks", type=int, default=25)
    ap.add_argument("--per-block", type=int, default=5, help="calls per block at the least")
    ap.add_argument("--block-s", type=float, default=0.02,
                    help="seconds per block for fast models: short blocks, many rounds, so that the machine's drift "
                         "falls on every contender alike")
    ap.add_argument("--lead-s", type=float, default=0.05,
                    help="seconds of calls at the start of each block that are run but not timed: a runtime whose "
                         "pool idled takes about that long to serve at its steady speed (0: time from the first call)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hybrid-bench-auto-real-"))

    import numpy as np
    import onnxruntime as ort
    import openvino as ov

    import hybrid
    from hybrid import zoo

    names = args.models.split(",") if args.models else list(zoo.NAMES)
    core = ov.Core()
    print(machine_info(), flush=True)
    rows, notes, backend_rows = [], [], []
    for name in names:
        m = zoo.build(name, folder=work / "zoo")
        feeds = m.feeds(seed=0)
        shapes = {k: v.shape for k, v in feeds.items()}
        row = [name, ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s in shapes.items())]
        try:
            sess = ort.InferenceSession(str(m.path), providers=["CPUExecutionProvider"])
            contenders = {"onnxruntime": lambda s=sess, f=feeds: s.run(None, f)}
            try:
                req = core.compile_model(str(m.path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                              "PERFORMANCE_HINT": "LATENCY"}).create_infer_request()
                req.infer(feeds)
                contenders["openvino f32"] = lambda r=req, f=feeds: r.infer(f, share_inputs=True)
            except Exception as e:  # the raw runtime cannot run it: compared with the ones that can
                notes.append(f"{name}: raw OpenVINO cannot run it: {' '.join(str(e).split())[:160]}")
            on_ort = hybrid.compile(m.path, target="onnxruntime")
            contenders["hybrid on ORT"] = lambda c=on_ort, f=feeds: c.run(f)
            if "openvino f32" in contenders:
                on_ov = hybrid.compile(m.path, target="openvino")
                contenders["hybrid on OV"] = lambda c=on_ov, f=feeds: c.run(f)
            os.environ["HYBRID_CACHE_DIR"] = str(work / f"cache-{name}-shapes")
            declared = hybrid.compile(m.path, target="auto", shapes=shapes)
            contenders["auto shapes="] = lambda c=declared, f=feeds: c.run(f)
            os.environ["HYBRID_CACHE_DIR"] = str(work / f"cache-{name}-online")
            online = hybrid.compile(m.path, target="auto")
            start_raw = {"onnxruntime": "onnxruntime", "openvino": "openvino f32"}.get(online.backend)
            calls, tuning, beside = warm_up_online(online, feeds, contenders.get(start_raw or ""))
            contenders["auto online"] = lambda c=online, f=feeds: c.run(f)
            t0 = time.perf_counter()
            contenders["onnxruntime"]()
            per_block = min(2000, max(args.per_block, int(args.block_s / max(time.perf_counter() - t0, 1e-6))))
            times = interleave(contenders, blocks=args.blocks, per_block=per_block, lead_s=args.lead_s)
            notes.append(f"{name}: shapes= " + "; ".join(n for n in declared.plan.notes
                                                         if n.startswith(("timed:", "picked", "bucket"))))
            notes.append(f"{name}: online " + "; ".join(n for n in online.plan.notes if n.startswith("bucket")))
            med = {k: median_ms(v) for k, v in times.items()}
            best = min(("onnxruntime", "openvino f32"), key=lambda k: med.get(k, float("inf")))
            shapes_ratio = paired_ratio(times, "auto shapes=", best, per_block)  # per block, then the median
            online_ratio = paired_ratio(times, "auto online", best, per_block)
            after = beside or times["auto online"]  # the raw start beside the tuning calls, else the settled model
            p50 = percentile(tuning, 50) / percentile(after, 50) if tuning else float("nan")
            p99 = percentile(tuning, 99) / percentile(after, 99) if tuning else float("nan")
            p99_settled = percentile(tuning, 99) / percentile(times["auto online"], 99) if tuning else float("nan")
            status = online.executable.status() if hasattr(online.executable, "status") else []
            picked_online = ", ".join(sorted({s.serving for s in status})) or f"{online.backend}:{online.device}"
            if not status:  # static shapes: decided offline like shapes=, no tuning window
                calls, p50, p99, p99_settled = 0, float("nan"), float("nan"), float("nan")
            ov = f"{med['openvino f32']:.2f}" if "openvino f32" in med else "n/a"
            row += [f"{med['onnxruntime']:.2f}", ov, f"{med['auto shapes=']:.2f}",
                    f"{med['auto online']:.2f}", f"{shapes_ratio:.3f}", f"{online_ratio:.3f}",
                    f"{declared.backend}:{declared.device}", picked_online, str(calls), f"{p50:.2f} / {p99:.2f}",
                    f"{p99_settled:.2f}"]
            ref = sess.run(None, feeds)
            got = list(declared.run(feeds).values())
            err = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))) /
                          max(float(np.max(np.abs(np.asarray(a, np.float64)))), 1e-12)) for a, b in zip(ref, got)
                      if np.asarray(a).dtype.kind == "f" and np.asarray(a).size)
            row.append(f"{err:.1e}")
            same = [f"{paired_ratio(times, 'hybrid on ORT', 'onnxruntime', per_block):.3f}"]
            same.append(f"{paired_ratio(times, 'hybrid on OV', 'openvino f32', per_block):.3f}"
                        if "hybrid on OV" in med else "n/a")
            backend_rows.append([name, *same])
            declared.close()
            online.close()
        except Exception as e:  # a crash is a result: counted and shown
            notes.append(f"{name}: {type(e).__name__}: {e}")
            traceback.print_exc()
            row += ["crash"] * (14 - len(row))
        rows.append(row)
        print(" | ".join(row), flush=True)
    print()
    print(table(["model", "shapes", "ORT ms", "OV f32 ms", "auto shapes= ms", "auto online ms",
                 "shapes= / best raw", "online / best raw", "picked (shapes=)", "picked (online)",
                 "calls to settle", "tuning p50 / p99 vs raw start", "tuning p99 vs settled", "max rel err vs ORT"],
                rows))
    print()
    print(table(["model", "hybrid on ORT / raw ORT", "hybrid on OV / raw OV f32"], backend_rows))
    within = sum(1 for r in rows if r[6] != "crash" and float(r[6]) <= 1.05 and float(r[7]) <= 1.05)
    crashes = sum(1 for r in rows if "crash" in r)
    print(f"\n{within} of {len(rows)} models within 1.05x of the best raw runtime both ways; {crashes} crashes")
    for n in notes:
        print("  " + n)


if __name__ == "__main__":
    main()
