"""Issue 54, item 1: a process that tunes online exits with the status its program chose, whatever is in flight.

Each run is a fresh interpreter (``_SCRIPT``) that compiles zoo models with ``target='auto'`` next to one pinned to
OpenVINO, calls them, and ends at a chosen moment of tuning: at once (the check of each model in flight in its
controller's thread, a candidate's ONNX Runtime or OpenVINO session being built), a little later (mid-compile),
or once a bucket races or is decided (right after a switch). Before the fix, the controller's daemon thread came
back from ONNX Runtime's C++ after the interpreter had begun to finalize, was ended by ``pthread_exit`` through
those frames, and libstdc++ aborted the process: ``terminate called without an active exception``, status -6
(134 in a shell), in most runs of the first moments. The checks run in the controller's thread
(``check_process: False``) in most runs, where the abort is most frequent, and in the check process in the others.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")
pytest.importorskip("torch")  # the zoo's builder

_SCRIPT = r'''
import json, signal, sys, time
import hybrid

spec = json.loads(sys.argv[1])
autotune = {"overhead_cap": 1.0, "decide_within_s": 3.0, "max_tax": 2.0, "check_process": spec["check_process"]}
hybrid.init({"autotune": autotune})
if spec.get("on_sigterm") is not None:  # the program's own choice: SIGTERM ends it with this status
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(spec["on_sigterm"]))
models = []
for path, target, feeds in spec["models"]:
    import numpy as np
    with np.load(feeds) as saved:
        arrays = dict(saved)
    models.append((hybrid.compile(path, target=target), arrays))
t0 = time.monotonic()
calls = 0
while True:
    for cm, arrays in models:
        cm.run(arrays)
    calls += 1
    if calls == spec["calls"]:
        print("tuning", flush=True)
    if calls < spec["calls"]:
        continue
    if spec["until"] == "now":
        break
    if spec["until"] == "sleep":
        time.sleep(spec["sleep_s"])  # real time: the program ends a while into its tuner's real work
        break
    if spec["until"] == "switch":  # a bucket left the check: it races or is decided (a candidate compiled, maybe in)
        phases = [s.phase for cm, _ in models for s in (cm.tuning or ())]
        if any(p in ("racing", "decided") for p in phases) or time.monotonic() - t0 > 8:
            break
    # "forever": until a signal
if spec.get("close"):  # cm.close() mid-tuning: each tuner stops as at exit, then its candidates are closed
    for cm, _ in models:
        cm.close()
if spec.get("interrupt"):  # as a Ctrl-C that the program does not catch: the interpreter ends with SIGINT's status
    raise KeyboardInterrupt
sys.exit(spec.get("status", 0))
'''

_ABORT = ("terminate called", "Fatal Python error", "Segmentation fault")


@pytest.fixture(scope="module")
def zoo_models(tmp_path_factory: pytest.TempPathFactory) -> list:
    from hybrid import zoo

    folder = tmp_path_factory.mktemp("zoo")
    out = []
    for name, target in (("detector", "auto"), ("encoder", "auto"), ("vad_lstm", "openvino")):
        m = zoo.build(name, folder=folder)
        np.savez(folder / f"{name}-feeds.npz", **m.feeds(seed=0))
        out.append([str(m.path), target, str(folder / f"{name}-feeds.npz")])
    return out


def _start(tmp_path: Path, run: int, models: list, **spec: object) -> subprocess.Popen[str]:
    env = {**os.environ, "HYBRID_CACHE_DIR": str(tmp_path / f"cache-{run}")}  # no decision read from another run
    env.pop("PYTHONFAULTHANDLER", None)
    body = json.dumps({"models": models, "check_process": False, "calls": 1, "until": "now", **spec})
    return subprocess.Popen([sys.executable, "-c", _SCRIPT, body], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


MOMENTS = [  # (how it ends, where the checks run): about 6 s each on 2 cores
    ({"until": "now"}, False),
    ({"until": "now", "calls": 2}, False),
    ({"until": "now", "close": True}, False),
    ({"until": "sleep", "sleep_s": 0.3, "interrupt": True, "status": -signal.SIGINT}, False),
    ({"until": "sleep", "sleep_s": 1.0}, False),
    ({"until": "switch"}, False),
    ({"until": "now", "status": 3}, False),  # the program's own status survives too
    ({"until": "now"}, True),
]


@pytest.mark.timeout(480)
def test_exit_at_any_moment_of_tuning_is_clean(zoo_models: list, tmp_path: Path) -> None:
    failures = []
    for run, (spec, in_process) in enumerate(MOMENTS):
        proc = _start(tmp_path, run, zoo_models, check_process=in_process, **spec)
        _, err = proc.communicate(timeout=120)
        want = spec.get("status", 0)
        if proc.returncode != want or any(a in err for a in _ABORT):
            failures.append(f"run {run} {spec} check_process={in_process}: status {proc.returncode} "
                            f"(want {want}); stderr tail: {err[-400:]!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(120)
def test_sigterm_mid_tuning_default_status(zoo_models: list, tmp_path: Path) -> None:
    """hybrid installs no SIGTERM handler: the default disposition ends the process at once, status -15."""
    proc = _start(tmp_path, 0, zoo_models, until="forever")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "tuning"
    time.sleep(0.2)  # real time: the signal lands a moment into the child's tuning, not at its first call
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err[-400:]
    assert not any(a in err for a in _ABORT), err[-400:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("delay_s", [0.0, 0.5])
def test_sigterm_handled_by_the_program_gives_its_status(zoo_models: list, tmp_path: Path, delay_s: float) -> None:
    """A program that turns SIGTERM into ``sys.exit(7)`` exits 7: the tuners stop before the interpreter finalizes."""
    proc = _start(tmp_path, 0, zoo_models, until="forever", on_sigterm=7)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "tuning"
    time.sleep(delay_s)  # real time: at once, or a while into the child's tuning
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err[-400:]
    assert not any(a in err for a in _ABORT), err[-400:]

