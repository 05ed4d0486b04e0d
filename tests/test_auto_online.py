"""target='auto' with nothing declared about a dynamic model: start sound, tune online per shape bucket, with the
real lab (check process, compiles, decision cache) and the real backends. The decision rule itself is tested on
scripted time in test_auto_controller.py."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from tests._backends import backend_registered
from tests._serve_support import poll, wait_for
from tests.test_auto_shapes import _Fake, _Perturbed, _SmallOnly, _Transposed, conv_net

import hybrid
from hybrid.runtime.auto import OnlineTuner, trials


@pytest.fixture(autouse=True)
def _quick_tuning():
    hybrid.init({"autotune": {"decide_within_s": 6.0, "overhead_cap": 1.0}})


def reference(x):
    return hybrid.compile(conv_net(), target="reference")(x)


def images(n, h, w, seed=0):
    return np.random.default_rng(seed).random((n, 3, h, w), np.float32)


def call_until_decided(cm, x, limit_s=120.0, expected=None):
    """Call ``cm`` on ``x`` until every bucket seen is decided; check every answer; return the calls made."""
    expected = reference(x) if expected is None else expected
    deadline, calls = time.monotonic() + limit_s, 0
    while True:
        np.testing.assert_allclose(cm(x), expected, rtol=1e-3, atol=1e-4)
        calls += 1
        if cm.tuning and all(s.state == "decided" for s in cm.tuning):
            return calls
        assert time.monotonic() < deadline, f"not decided after {calls} calls: {cm.tuning}"


def test_a_dynamic_model_starts_accelerated_and_is_decided_on_real_calls_within_the_bound():
    cm = hybrid.compile(conv_net(), target="auto")  # 1x1 samples cannot run a 3x3 conv: nothing checked yet
    assert isinstance(cm.executable, OnlineTuner)
    assert cm.backend != "reference" and cm.tuning == ()
    assert any("online tuning" in n for n in cm.plan.notes)
    calls = call_until_decided(cm, images(2, 24, 32))
    (status,) = cm.tuning
    assert status.key == (("x", (2, 3, 32, 32)),) and status.bucket == "x: 2x3x32x32"  # powers of two
    assert status.decided_after_calls is not None and calls >= status.decided_after_calls
    assert status.decided_after_s is not None and status.decided_after_s > 0  # (the bound: test_auto_controller)
    assert status.serving != "reference:cpu"  # never the reference while an accelerated backend is right
    outcomes = {"serving", "slower", "faster", "tie", "open", "rejected", "failed"}  # open: untimed, re-checked
    assert {c.outcome for c in status.candidates} <= outcomes
    assert any(n.startswith("bucket x: 2x3x32x32 (first call x: 2x3x24x32): ") for n in cm.plan.notes)
    assert status.first_shapes == "x: 2x3x24x32"
    assert cm.backend == status.serving.split(":")[0]
    assert status.as_dict()["key"] == [["x", [2, 3, 32, 32]]]


def test_each_bucket_decides_for_itself():
    cm = hybrid.compile(conv_net(), target="auto")
    call_until_decided(cm, images(1, 16, 16))
    call_until_decided(cm, images(4, 40, 40, seed=1))
    assert sorted(s.bucket for s in cm.tuning) == ["x: 1x3x16x16", "x: 4x3x64x64"]
    np.testing.assert_allclose(cm(images(1, 15, 13)), reference(images(1, 15, 13)), rtol=1e-3, atol=1e-4)


def test_bucket_decisions_are_cached_and_read_back_without_checks(monkeypatch):
    first = hybrid.compile(conv_net(), target="auto")
    call_until_decided(first, images(2, 24, 32))
    winner = first.tuning[0].serving
    first.close()

    def boom(*args, **kwargs):
        raise AssertionError("checked although the decision is cached")

    monkeypatch.setattr(trials.Search, "check", boom)
    second = hybrid.compile(conv_net(), target="auto")
    call_until_decided(second, images(2, 24, 32))
    (status,) = second.tuning
    assert status.serving == winner
    assert any("decision read from the autotune cache" in n and n.startswith("bucket") for n in second.plan.notes)


class _RightOnlyAtBatchOne(_Fake):
    """Fast and right on the generated batch-1 sample, wrong (+1) on real batches."""

    name = "batchone"

    @staticmethod
    def post(feeds, outs):
        return outs if next(iter(feeds.values())).shape[0] == 1 else [o + 1.0 for o in outs]


def _pool_model():
    # a model the generated 1x1 sample can run, so the start is checked (and passes) at batch 1
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
                          "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 1, 1])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_start_that_fails_the_check_on_real_inputs_is_replaced():
    with backend_registered(_RightOnlyAtBatchOne):
        cm = hybrid.compile(_pool_model(), target="auto")
        assert cm.tuning == () and cm.backend == "batchone"  # checked at batch 1: it passed
        x = np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32)
        expected = np.maximum(x.mean(axis=(2, 3), keepdims=True), 0)
        deadline = time.monotonic() + 60
        while not cm.tuning or cm.tuning[0].phase in ("new", "checking"):
            cm(x)  # served by the start until its check on this real input is done
            assert time.monotonic() < deadline
        for _ in range(10):  # from the check on: only right answers
            np.testing.assert_allclose(cm(x), expected, rtol=1e-5, atol=1e-6)
        (status,) = cm.tuning
        assert status.serving != "batchone:cpu"
        assert {c.label: c.outcome for c in status.candidates}["batchone:cpu"] == "rejected"


@pytest.mark.parametrize("cls", [_Perturbed, _Transposed])
def test_a_wrong_backend_that_is_first_by_priority_still_loses_online(cls):
    with backend_registered(cls):
        cm = hybrid.compile(conv_net(), target="auto")
        x = images(5, 16, 16)
        expected = reference(x)
        deadline = time.monotonic() + 60
        while not cm.tuning or cm.tuning[0].phase in ("new", "checking"):
            cm(x)
            assert time.monotonic() < deadline
        call_until_decided(cm, x, expected=expected)  # every answer from the check on is right
        (status,) = cm.tuning
        assert status.serving != f"{cls.name}:cpu"
        assert {c.label: c.outcome for c in status.candidates}[f"{cls.name}:cpu"] == "rejected"


def test_a_call_the_serving_backend_cannot_run_is_answered_by_the_next_candidate():
    with backend_registered(_SmallOnly):
        cm = hybrid.compile(conv_net(), target="auto")
        assert cm.backend == "smallonly"  # first by priority; the 1x1 sample could not be checked
        x = images(8, 16, 16)
        np.testing.assert_allclose(cm(x), reference(x), rtol=1e-3, atol=1e-4)  # batch 8: smallonly raises
        call_until_decided(cm, x)
        assert cm.tuning[0].serving != "smallonly:cpu"


def test_sixteen_callers_each_get_their_own_answer_while_the_bucket_switches():
    cm = hybrid.compile(conv_net(), target="auto")
    inputs = [images(2, 24, 32, seed=k) for k in range(16)]
    expected = [reference(x) for x in inputs]
    errors: list[str] = []
    start = threading.Barrier(16)

    def caller(k):
        start.wait()
        for _ in range(40):
            got = cm(inputs[k])
            if not np.allclose(got, expected[k], rtol=1e-3, atol=1e-4):
                errors.append(f"caller {k} got another answer")

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    call_until_decided(cm, inputs[0])
    assert cm.tuning[0].calls >= 16 * 40 * 0.98  # counted without a lock


def test_tune_decides_before_the_first_request_and_a_decided_model_just_warms_up():
    cm = hybrid.compile(conv_net(), target="auto")
    x = images(2, 24, 32)
    (status,) = cm.tune({"x": x}, timeout_s=120)
    assert status.state == "decided" and status.bucket == "x: 2x3x32x32"
    fixed = hybrid.compile(conv_net(), target="onnxruntime")
    assert fixed.tune([{"x": x}, {"x": images(1, 8, 8)}]) == () and fixed.tuning == ()
    with pytest.raises(hybrid.HybridError) as info:
        cm.tune({"x": np.zeros((2, 3), np.float32)})
    assert info.value.code == "HYB-404"


def test_online_tuning_can_be_switched_off():
    hybrid.init({"autotune": {"online": False}})
    cm = hybrid.compile(conv_net(), target="auto")
    assert not isinstance(cm.executable, OnlineTuner) and cm.tuning == ()


def test_precision_auto_races_reduced_precisions_online_within_the_budget_and_fp32_never():
    from hybrid.hal import Candidate
    from hybrid.runtime.auto import offered_precisions

    reduced = [f"openvino:cpu {p}" for p in offered_precisions(Candidate("openvino", "cpu"))]
    x = images(2, 24, 32)
    plain = hybrid.compile(conv_net(), target="auto")  # fp32: nothing changes numerics
    call_until_decided(plain, x)
    assert not any(" " in c.label for c in plain.tuning[0].candidates)
    cm = hybrid.compile(conv_net(), target="auto", precision="auto", accuracy={"min_cosine": 0.995})
    assert isinstance(cm.executable, OnlineTuner)
    deadline = time.monotonic() + 120
    while not cm.tuning or cm.tuning[0].state != "decided":
        y = cm(x)
        assert hybrid.runtime.auto.accuracy.cosine([reference(x)], [y], ["y"]) >= 0.995
        assert time.monotonic() < deadline, cm.tuning
    labels = {c.label for c in cm.tuning[0].candidates}
    assert set(reduced) <= labels  # each reduced precision offered here was checked against the budget


def test_the_check_process_answers_like_the_search_and_paces_itself():
    from hybrid.runtime.auto import worker

    model = hybrid.Model.load(conv_net())
    x = images(2, 16, 16)
    request = worker.CheckRequest(model.to_bytes(), "conv_net", ("onnxruntime:cpu", "reference:cpu"),
                                  {"onnxruntime:cpu": {}, "reference:cpu": {}}, 1e-3, {}, {"x": x}, share=0.5)
    checker = worker.Checker(worker.CheckProcess())
    verdicts = checker.check_elsewhere(request)
    assert verdicts is not None
    assert {label: why for label, why, _, _ in verdicts.results} == {"onnxruntime:cpu": None, "reference:cpu": None}
    warm = {label: seconds for label, _, seconds, _ in verdicts.results}
    assert warm["onnxruntime:cpu"] is not None and warm["onnxruntime:cpu"] > 0
    assert warm["reference:cpu"] is None  # the fallback serves only what no other candidate runs: not timed
    unknown = worker.CheckRequest(model.to_bytes(), "conv_net", ("nosuchbackend:cpu",), {"nosuchbackend:cpu": {}},
                                  1e-3, {}, {"x": x})
    assert checker.check_elsewhere(unknown) is None  # the caller then checks in its controller's thread
    clock = {"cpu": 0.0, "wall": 0.0}
    slept: list[float] = []

    class Time:  # a process that spent 0.3 s of CPU in 0.1 s of wall time, at a 0.5 share: it sleeps 0.5 s
        @staticmethod
        def process_time():
            return clock["cpu"]

        @staticmethod
        def perf_counter():
            return clock["wall"]

        @staticmethod
        def sleep(s):
            slept.append(s)

    real = worker.time
    worker.time = Time
    try:
        pace = worker.pacer(0.5)
        clock["cpu"], clock["wall"] = 0.3, 0.1
        pace()
    finally:
        worker.time = real
    assert slept == [pytest.approx(0.5)]



SPIN = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < {cpu}: pass\n"
        "print('done', flush=True)")


def test_the_parent_paces_the_check_process_from_outside_its_start_included():
    """A child that spins 0.4 s of CPU from its first instruction, held to a 0.25 share by the parent: at its end
    its CPU time is within that share of the wall time, give or take one slice and one tick of /proc's clock (an
    upper bound that holds however fast the machine is)."""
    import subprocess
    import sys

    from hybrid.runtime.auto import worker

    proc = subprocess.Popen([sys.executable, "-c", SPIN.format(cpu=0.4)], stdout=subprocess.PIPE)
    try:
        if not worker._Pacer.available(proc.pid):
            pytest.skip("this system does not let a parent read a child's CPU time from /proc")
        pacer = worker._Pacer(proc.pid, 0.25)
        t0 = time.perf_counter()
        pacer.wait(proc.stdout.fileno())
        wall = time.perf_counter() - t0
        cpu = pacer.cpu_s() - pacer._cpu0
        assert proc.stdout.readline() == b"done\n"
        assert cpu >= 0.35  # it did its work (the spin counts its own CPU time)
        assert cpu <= 0.25 * wall + worker.SLICE_S + 2.0 / os.sysconf("SC_CLK_TCK")
    finally:
        proc.kill()
        proc.wait()


def test_the_check_process_runs_unpaced_once_the_waiting_checks_time_to_be_paced_has_passed():
    import subprocess
    import sys

    from hybrid.runtime.auto import worker

    proc = subprocess.Popen([sys.executable, "-c", SPIN.format(cpu=2.0)], stdout=subprocess.PIPE)
    try:
        if not worker._Pacer.available(proc.pid):
            pytest.skip("this system does not let a parent read a child's CPU time from /proc")
        paced = worker.PacedUntil()
        pacer = worker._Pacer(proc.pid, 0.01, paced=paced)
        wait_for(lambda: pacer.cpu_s() - pacer._cpu0 >= 0.05, "the spin to run past a 1 % share", every=0.01)
        assert pacer.hold_s() > 0.0  # no check waits: paced (the imports of prestart)
        paced.add(time.perf_counter() + 60.0)
        assert pacer.hold_s() > 0.0
        paced.add(time.perf_counter() - 1.0)  # a check whose time to be paced has passed
        assert pacer.hold_s() == 0.0
    finally:
        proc.kill()
        proc.wait()

def test_the_prestart_imports_run_unpaced_until_a_check_waits_then_pay_only_from_then():
    """Before any call nothing waits for a core: the imports of prestart run at full speed; once a check waits they
    are paced to the share, counted from that moment (what ran unpaced is not paid back by a long stop)."""
    import subprocess
    import sys

    from hybrid.runtime.auto import worker

    proc = subprocess.Popen([sys.executable, "-c", SPIN.format(cpu=3.0)], stdout=subprocess.PIPE)
    try:
        if not worker._Pacer.available(proc.pid):
            pytest.skip("this system does not let a parent read a child's CPU time from /proc")
        paced = worker.PacedUntil()
        pacer = worker._Pacer(proc.pid, 0.01, until_a_check_waits=True, paced=paced)
        start = pacer.cpu_s()

        def far_past_its_share() -> bool:  # 0.3 s of CPU: far past a 1 % share of the wall time
            assert pacer.hold_s() == 0.0  # no check waits: unpaced at each look
            return pacer.cpu_s() - start >= 0.3

        wait_for(far_past_its_share, "0.3 s of the spin's CPU time", every=0.01)
        assert pacer.hold_s() == 0.0  # the last unpaced look, 0.3 s of CPU in
        paced.add(time.perf_counter() + 60.0)  # a call came: its check waits
        pacer.hold_s()
        # the share counts from the last unpaced look, not from the start: the unpaced 0.3 s is not paid back
        assert pacer._cpu0 - start >= 0.3 - 1.0 / os.sysconf("SC_CLK_TCK")
        base = pacer.cpu_s()
        wait_for(lambda: pacer.cpu_s() - base >= 0.05, "0.05 s more of the spin's CPU time", every=0.01)
        assert pacer.hold_s() > 0.0  # paced from when the check began to wait
    finally:
        proc.kill()
        proc.wait()


def test_a_check_process_held_stopped_dies_with_its_parent():
    """A parent that ends abruptly while its check process is stopped (paced) leaves nothing behind; a worker
    started by a thread that has ended serves on (it is the process's, not the thread's)."""
    import signal
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    parent = ("import os, signal, threading\nfrom hybrid.runtime.auto import worker\nchecks = worker.CheckProcess()\n"
              "t = threading.Thread(target=checks.worker)\nt.start()\nt.join()\nw = checks.worker()\n"
              "assert 'AttributeError' in w.ask(0)  # any request: the worker answers, in its loop\n"
              "os.kill(w.proc.pid, signal.SIGSTOP)\nprint(w.proc.pid, flush=True)\nos._exit(0)  # no atexit")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])

    def state() -> bytes:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0]
        except FileNotFoundError:
            return b"gone"

    if not poll(lambda: state() in (b"gone", b"Z", b"X"), 30, every=0.05):
        last = state()
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the check process {pid} outlived its parent (state {last!r})")

@pytest.mark.slow
def test_the_demo_decides_auto_on_a_zoo_model_and_reads_every_error_against_the_reference():
    import json

    from typer.testing import CliRunner

    from hybrid.cli.main import app

    r = CliRunner().invoke(app, ["demo", "--model", "vad_lstm", "--runs", "2", "--decide-within", "2", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["target"]: row for row in json.loads(r.stdout)["rows"]}
    auto = rows["auto"]
    assert auto["ok"] and auto["decided"] and auto["decided"][0]["state"] == "decided"
    assert auto["ran_on"] != "reference:cpu" and auto["max_error"] < 1e-3
    budget = next(row for name, row in rows.items() if name.startswith("auto, precision='auto'"))
    assert budget["cosine"] >= 0.995
    assert any(name.startswith("onnxruntime") and row["ok"] for name, row in rows.items())
