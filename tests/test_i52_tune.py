"""Issue 52: ``pyasc bench --scenario ... --tune`` measures ``auto`` after ``cm.tune()`` as well as compiled."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from hybrid.cli._loadgen import AUTO_TUNED, LoadgenSettings, _contenders, _decision, _tune
from hybrid.errors import ConfigError

pytestmark = pytest.mark.timeout(180)


def test_tune_adds_the_tuned_auto_contender_after_auto() -> None:
    pairs = _contenders(["onnxruntime", "auto"], ["fp32"], tune=True)
    assert pairs[-2:] == [("auto", "auto"), (AUTO_TUNED, "auto")]
    assert (AUTO_TUNED, "auto") not in _contenders(["onnxruntime", "auto"], ["fp32"])


def test_tune_without_auto_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as e:
        _contenders(["onnxruntime"], ["fp32"], tune=True)
    assert e.value.code == "HYB-102" and "auto" in e.value.message


def test_settings_carry_tune() -> None:
    assert LoadgenSettings("singlestream", tune=True).tune
    assert not LoadgenSettings("singlestream").tune


class _Tunable:
    """A compiled model's tune(): records what it was given, decides its buckets."""

    backend, device = "onnxruntime", "cpu"

    def __init__(self) -> None:
        self.given: list[dict[str, np.ndarray]] = []

    def tune(self, feeds):
        self.given = list(feeds)
        return tuple(SimpleNamespace(bucket=f"x: {f['x'].shape[0]}x3", serving="openvino:cpu", decided_after_calls=7)
                     for f in self.given)


def test_tune_runs_what_the_scenario_will_call() -> None:
    samples = [{"x": np.full((1, 3), i, np.float32)} for i in range(3)]
    cm = _Tunable()
    took, note = _tune(cm, samples, 1)
    assert [f["x"].shape for f in cm.given] == [(1, 3)]
    assert took >= 0 and "cm.tune()" in note and "openvino:cpu" in note and "7 calls" in note
    _tune(cm, samples, 4)  # Offline: the stacked batch is its own bucket, tuned too
    assert [f["x"].shape for f in cm.given] == [(1, 3), (4, 3)]
    np.testing.assert_array_equal(cm.given[1]["x"][:, 0], [0, 1, 2, 0])


def test_a_run_that_ended_while_tuning_says_its_figures_include_the_tuning() -> None:
    record = SimpleNamespace(bucket="x: 1x3", serving="onnxruntime:cpu", state="tuning", phase="checking",
                             calls=400, decided_after_s=None, decided_after_calls=None)
    note = _decision(SimpleNamespace(tuning=(record,)), 0.5)
    assert "still tuning (checking) after 400 calls" in note and "--tune" in note


def _cli(*args: str):
    from hybrid.cli.main import app

    return CliRunner().invoke(app, ["bench", *args])


def test_tune_without_auto_is_refused_by_the_command(tmp_path) -> None:
    zoo = pytest.importorskip("hybrid.zoo")
    pytest.importorskip("mlperf_loadgen")
    model = str(zoo.build("crnn").path)
    got = _cli(model, "-t", "onnxruntime", "--shapes", "x:1x3x48x96", "--scenario", "singlestream", "--tune",
               "--min-duration", "0.2", "--json")
    assert got.exit_code != 0 and "HYB-102" in got.output


def test_tune_measures_auto_after_its_decision() -> None:
    zoo = pytest.importorskip("hybrid.zoo")
    pytest.importorskip("mlperf_loadgen")
    model = str(zoo.build("crnn").path)
    got = _cli(model, "-t", "auto", "--shapes", "x:1x3x48x96", "--scenario", "singlestream", "--tune",
               "--min-duration", "0.5", "--json")
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)
    rows = {r["target"]: r for r in doc["results"]}
    versions = next(line for line in doc["header"] if line.startswith("versions:"))
    assert "auto" not in versions  # not a backend: no version to look up (it read 'auto+tune ?')
    assert set(rows) == {"auto", AUTO_TUNED}
    tuned = rows[AUTO_TUNED]
    assert tuned["status"] == "ok" and tuned["tune_s"] is not None and tuned["tune_s"] >= 0
    assert "cm.tune() took" in tuned["note"] and tuned["metric"] > 0
    from hybrid.cli._loadgen import children_cpu_s

    if children_cpu_s() is not None:  # measured once the check process idled (Linux: its CPU is read)
        assert "check process" in tuned["note"]
    assert rows["auto"]["tune_s"] is None


def test_settle_waits_until_the_children_use_no_cpu() -> None:
    from hybrid.cli._loadgen import settle

    now = [0.0]
    cpu = iter([0.0, 0.8, 1.6, 1.62, 9.0])  # busy for two windows, then idle (0.02 s of CPU in 1 s)
    got = settle(lambda: next(cpu), clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert got == (3.0, True)


def test_settle_gives_up_at_its_bound_and_says_so() -> None:
    from hybrid.cli._loadgen import settle

    now, used = [0.0], [0.0]

    def busy() -> float:
        used[0] += 0.5
        return used[0]

    got = settle(busy, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s), max_wait_s=5.0)
    assert got == (5.0, False)


def test_settle_cannot_tell_without_proc() -> None:
    from hybrid.cli._loadgen import settle

    assert settle(lambda: None, sleep=lambda s: None) is None


_BUSY_CHILD = """
import signal, subprocess, sys, time
from hybrid.cli._loadgen import children_cpu_s
before = children_cpu_s()
child = subprocess.Popen([sys.executable, "-c", "import signal, time\\nt = time.process_time()\\n"
                          "while time.process_time() - t < 0.3: pass\\nsignal.pause()"])
try:
    end = time.monotonic() + 20
    while children_cpu_s() - before < 0.2 and time.monotonic() < end:
        time.sleep(0.1)
    print(children_cpu_s() - before)
finally:
    child.kill()
    child.wait()
"""


def test_children_cpu_counts_a_busy_child() -> None:
    """Read in a process of its own: in the suite, a child of this one (an earlier test's check process) may end
    meanwhile and take its CPU time out of the sum (the suite read 0.40 - 3.12 s once)."""
    import subprocess
    import sys

    from hybrid.cli._loadgen import children_cpu_s

    if children_cpu_s() is None:
        pytest.skip("no /proc here")
    out = subprocess.run([sys.executable, "-c", _BUSY_CHILD], capture_output=True, text=True, timeout=60, check=True)
    assert float(out.stdout.strip().splitlines()[-1]) >= 0.2
