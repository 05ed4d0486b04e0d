"""Exit soak (issue 54): a script that tunes online ends at a random moment of tuning; every exit status is counted.

Each run is a fresh interpreter that compiles nine models — six ``hybrid.zoo`` models and three exported here from
small torch modules — four of them with ``target='auto'`` (nothing given: they tune online, their candidates
ONNX Runtime, OpenVINO, torch and the reference) and the others pinned to ``'onnxruntime'`` or ``'openvino'``, calls
them, and ends at a moment drawn from:

- ``now``: right after the first 1-4 calls (each auto model's check in flight; a candidate's session being built);
- ``sleep``: 0-3 s later (mid-check, mid-compile);
- ``switch``: once a bucket races or is decided (right after a switch to a compiled candidate), 15 s at most;

with its checks in the check process or in the controller's thread (``check_process``), drawn too. ``--sigterm-runs``
more runs are sent SIGTERM while they tune: half keep the default disposition (status -15: hybrid installs no
handler), half have the program turn it into ``sys.exit(7)``. The table counts each status and each abort
(``terminate called``, ``Fatal Python error``): before issue 54's fix most runs of the first moments ended
``-6`` (SIGABRT, 134 in a shell); the expected count is every run at its status.

``python benchmarks/exit_soak.py --runs 50 --sigterm-runs 10`` (about 7 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _results
import numpy as np

SCRIPT = r'''
import json, signal, sys, time
import numpy as np
import hybrid

spec = json.loads(sys.argv[1])
hybrid.init({"autotune": {"overhead_cap": 1.0, "decide_within_s": 4.0, "max_tax": 2.0,
                          "check_process": spec["check_process"]}})
if spec.get("on_sigterm") is not None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(spec["on_sigterm"]))
models = []
for path, target, feeds in spec["models"]:
    with np.load(feeds) as saved:
        models.append((hybrid.compile(path, target=target), dict(saved)))
t0, calls = time.monotonic(), 0
while True:
    for cm, arrays in models:
        cm.run(arrays)
    calls += 1
    if calls == spec["calls"]:
        print("tuning", flush=True)
    if calls < spec["calls"] or spec["until"] == "forever":
        continue
    if spec["until"] == "sleep":
        time.sleep(spec["sleep_s"])
    if spec["until"] == "switch":
        phases = [s.phase for cm, _ in models for s in (cm.tuning or ())]
        if not any(p in ("racing", "decided") for p in phases) and time.monotonic() - t0 < 15:
            continue
    break
'''

ZOO = (("detector", "auto"), ("crnn", "auto"), ("encoder", "auto"), ("vad_lstm", "openvino"),
       ("if_model", "onnxruntime"), ("neg_dim", "openvino"))
ABORTS = ("terminate called", "Fatal Python error", "Segmentation fault")


def _torch_models(folder: Path) -> list[list[str]]:
    """Three small torch modules exported with a dynamic batch (an MLP, a CNN, a GRU), with their inputs."""
    import torch

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(16, 5))

    class Gru(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = torch.nn.GRU(16, 32, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.gru(x)[0]

    out = []
    for name, module, shape, target in (("mlp", mlp, (4, 64), "auto"), ("cnn", cnn, (2, 3, 32, 32), "openvino"),
                                        ("gru", Gru(), (2, 12, 16), "onnxruntime")):
        x = torch.rand(*shape)
        path = folder / f"{name}.onnx"
        torch.onnx.export(module.eval(), (x,), str(path), input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, dynamo=False)
        np.savez(folder / f"{name}.npz", x=x.numpy())
        out.append([str(path), target, str(folder / f"{name}.npz")])
    return out


def _models(folder: Path) -> list[list[str]]:
    from hybrid import zoo

    out = []
    for name, target in ZOO:
        m = zoo.build(name, folder=folder)
        np.savez(folder / f"{name}.npz", **m.feeds(seed=0))
        out.append([str(m.path), target, str(folder / f"{name}.npz")])
    return out + _torch_models(folder)


def _run(spec: dict, folder: Path, run: int, sigterm_after_s: float | None) -> tuple[int | None, bool, float]:
    env = {**os.environ, "HYBRID_CACHE_DIR": str(folder / f"cache-{run}")}  # each run tunes from scratch
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps(spec)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if sigterm_after_s is not None:
        assert proc.stdout is not None
        proc.stdout.readline()  # "tuning"
        time.sleep(sigterm_after_s)
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return None, False, time.monotonic() - t0
    return proc.returncode, any(a in err for a in ABORTS), time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50, help="runs that end on their own at a random moment")
    ap.add_argument("--sigterm-runs", type=int, default=10, help="runs sent SIGTERM mid-tuning")
    ap.add_argument("--seed", type=int, default=0)
    _results.add_argument(ap, "exit_soak")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="exit-soak-") as tmp:
        folder = Path(tmp)
        models = _models(folder)
        rows: collections.Counter[tuple[str, str, str]] = collections.Counter()
        bad = []
        total = args.runs + args.sigterm_runs
        for run in range(total):
            in_process = rng.random() < 0.5
            spec: dict = {"models": models, "check_process": in_process, "calls": rng.randint(1, 4)}
            sigterm_after_s = None
            if run < args.runs:
                spec["until"] = rng.choice(["now", "sleep", "switch"])
                spec["sleep_s"] = rng.uniform(0.0, 3.0)
                moment, want = spec["until"], 0
            else:
                spec["until"] = "forever"
                sigterm_after_s = rng.uniform(0.0, 2.0)
                handled = run % 2 == 0
                spec["on_sigterm"] = 7 if handled else None
                moment, want = ("SIGTERM, sys.exit(7)" if handled else "SIGTERM, default"), (7 if handled else -15)
            status, aborted, took = _run(spec, folder, run, sigterm_after_s)
            where = "check process" if in_process else "controller's thread"
            verdict = "ok" if status == want and not aborted else f"status {status}" + (" abort" if aborted else "")
            rows[(moment, where, verdict)] += 1
            if verdict != "ok":
                bad.append(f"run {run}: {moment}, {where}: {verdict} (want {want})")
            print(f"run {run:2d} {moment:22s} {where:19s} status {status} want {want} {took:5.1f} s {verdict}",
                  flush=True)
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; python "
          f"{platform.python_version()}; {total} runs, {total - len(bad)} at the expected status\n")
    results = "\n".join(["| moment | checks in | result | runs |", "|---|---|---|---|",
                          *(f"| {moment} | {where} | {verdict} | {n} |"
                            for (moment, where, verdict), n in sorted(rows.items()))])
    print(results)
    for line in bad:
        print(line)
    if args.write_results:
        _results.write_results(args.write_results, "Exit while tuning online (issue 54)", _results.command_line(),
                               results, notes="\n".join([f"{total} runs, {total - len(bad)} at the expected status; "
                                                         f"seed {args.seed}.", *bad]))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
