"""target='auto' against the raw runtimes, each timed ALONE in its own process (hybrid.zoo, realistic shapes).

``auto_real.py`` interleaves every contender in one process, as the repo's benchmarks do. On 2 cores that
has a cost of its own: the runtimes' thread pools slow each other (DESIGN section 4), and not evenly. Yet a
deployed model runs one backend in its process. Here every contender (raw ONNX Runtime, raw OpenVINO f32 +
LATENCY, ``hybrid.compile(path, 'auto', shapes=...)``) runs in a fresh process of its own, the processes
take turns (round robin, ``--rounds`` times, so that the machine's drift falls on all of them), and each
process reports the median of its calls after a warm-up. The ratio is auto / the best raw runtime.

Run (alone on the machine; about half a minute a model):
    python benchmarks/auto_alone.py [--models encoder,unet] [--rounds 3] [--seconds 1.5]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results
from _harness import machine_info, table

CONTENDERS = ("onnxruntime", "openvino f32", "auto shapes=")


def child(contender: str, name: str, folder: str, seconds: float) -> None:
    """Time one contender on one zoo model in this process; print its median (ms) and what ran."""
    from hybrid import zoo

    m = zoo.build(name, folder=Path(folder))
    feeds = m.feeds(seed=0)
    ran = contender
    if contender == "onnxruntime":
        import onnxruntime as ort

        sess = ort.InferenceSession(str(m.path), providers=["CPUExecutionProvider"])
        fn = lambda: sess.run(None, feeds)  # noqa: E731
    elif contender == "openvino f32":
        import openvino as ov

        req = ov.Core().compile_model(str(m.path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                           "PERFORMANCE_HINT": "LATENCY"}).create_infer_request()
        fn = lambda: req.infer(feeds, share_inputs=True)  # noqa: E731
    else:
        import hybrid

        cm = hybrid.compile(m.path, target="auto", shapes={k: v.shape for k, v in feeds.items()})
        ran = f"{cm.backend}:{cm.device}"
        fn = lambda: cm.run(feeds)  # noqa: E731
    deadline = time.perf_counter() + 0.3
    while time.perf_counter() < deadline:  # warm-up
        fn()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"ms": statistics.median(times) * 1e3, "ran": ran, "calls": len(times)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--child", nargs=3, metavar=("CONTENDER", "MODEL", "FOLDER"), help=argparse.SUPPRESS)
    _results.add_argument(ap, "auto_alone")
    args = ap.parse_args()
    if args.child:
        child(*args.child, args.seconds)
        return
    from hybrid import zoo

    names = args.models.split(",") if args.models else list(zoo.NAMES)
    work = Path(tempfile.mkdtemp(prefix="auto-alone-"))
    env = {**os.environ, "HYBRID_CACHE_DIR": str(work / "cache"), "PYTHONWARNINGS": "ignore"}
    print(machine_info(), flush=True)
    rows = []
    for name in names:
        zoo.build(name, folder=work / "zoo")  # once: the children read it back
        med: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        ran: dict[str, str] = {}
        for r in range(args.rounds):
            order = CONTENDERS[r % 3:] + CONTENDERS[:r % 3]
            for contender in order:
                out = subprocess.run([sys.executable, __file__, "--seconds", str(args.seconds), "--child", contender,
                                      name, str(work / "zoo")], capture_output=True, text=True, env=env)
                lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
                if out.returncode or not lines:  # a runtime that cannot run the model: left out of the best
                    ran.setdefault(contender, "cannot run it")
                    continue
                got = json.loads(lines[-1])
                med[contender].append(got["ms"])
                ran[contender] = got["ran"]
        ms = {c: statistics.median(v) if v else float("nan") for c, v in med.items()}
        best = min(v for c, v in ms.items() if c != "auto shapes=" and v == v)
        row = [name, *(f"{ms[c]:.3f}" if ms[c] == ms[c] else "n/a" for c in CONTENDERS),
               f"{ms['auto shapes='] / best:.3f}", ran.get("auto shapes=", "?")]
        rows.append(row)
        print(" | ".join(row), flush=True)
    results = table(["model", "ORT alone ms", "OV f32 alone ms", "auto shapes= alone ms", "auto / best raw",
                     "auto picked"], rows)
    within = sum(1 for r in rows if float(r[4]) <= 1.05)
    summary = f"{within} of {len(rows)} models: auto within 1.05x of the best raw runtime, each timed alone"
    print()
    print(results)
    print(f"\n{summary}")
    if args.write_results:
        _results.write_results(args.write_results,
                               "Auto-selection with every contender alone in its process (issue 13)",
                               _results.command_line(), results, notes=summary + ".")


if __name__ == "__main__":
    main()
