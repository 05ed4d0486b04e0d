"""Issue 51 on scripted time: tuning that finishes (tune() races what the bound left untimed, freeze()), a re-check
that keeps the first decision's time, and a candidate the check shows hopeless is never compiled or timed."""

from __future__ import annotations

import math

from tests.test_auto_controller import FakeClock, FakeLab, InflatedWarmUpLab, Scripted, X, decided, drive, tuner

from hybrid.runtime.auto import race
from hybrid.runtime.auto.lab import CheckResult
from hybrid.runtime.auto.policy import TuningPolicy


class CountingLab(FakeLab):
    """Remembers which candidates it compiled; its check reports ``cores``."""

    def __init__(self, exes, cores: int = 1, **kw) -> None:
        super().__init__(exes, **kw)
        self.compiled: list[str] = []
        self.cores = cores

    def lane(self, label, sample):
        self.compiled.append(label)
        return super().lane(label, sample)

    def check(self, sample, closing, *, paced_for_s=float("inf")):
        r = super().check(sample, closing, paced_for_s=paced_for_s)
        return CheckResult(r.passed, r.rejected, r.notes, r.accuracy, self.cores)


def test_a_candidate_the_check_shows_hopeless_is_pruned_and_says_why():
    clock = FakeClock()
    exes = {"a:cpu": Scripted(clock, 1e-3), "b:cpu": Scripted(clock, 1.2e-3), "t:cpu": Scripted(clock, 9e-3)}
    lab = CountingLab(exes, cores=2, warm={"a:cpu": 1e-3, "b:cpu": 1.2e-3, "t:cpu": 9e-3})
    router, controller, _ = tuner(exes, clock, lab=lab)
    drive(router, controller, X, decided(controller))
    (status,) = controller.status()
    pruned = {c.label: c for c in status.candidates}["t:cpu"]
    assert pruned.outcome == "slower" and pruned.reason.startswith("pruned: at least 4.5x the fastest")
    assert "t:cpu" not in lab.compiled and exes["t:cpu"].calls == 0
    assert "b:cpu" in lab.compiled and exes["b:cpu"].calls > 0  # within the bound: raced as before


def test_the_prune_bound_reads_cpu_seconds_over_the_cores():
    # 4x the CPU seconds on 2 cores may be a runtime that spreads its work: at least 2x in wall time, not hopeless
    clock = FakeClock()
    exes = {"a:cpu": Scripted(clock, 1e-3), "t:cpu": Scripted(clock, 2e-3)}
    lab = CountingLab(exes, cores=2, warm={"a:cpu": 1e-3, "t:cpu": 4e-3})
    router, controller, _ = tuner(exes, clock, lab=lab)
    drive(router, controller, X, decided(controller))
    assert "t:cpu" in lab.compiled


def test_freeze_mid_race_keeps_what_serves_and_nothing_races_after():
    clock = FakeClock()
    exes = {"a:cpu": Scripted(clock, 1e-3), "b:cpu": Scripted(clock, 0.995e-3)}  # a near tie: a long race
    router, controller, _ = tuner(exes, clock)
    drive(router, controller, X, lambda: controller.status() and controller.status()[0].phase == "racing")
    controller.freeze()
    controller.step()
    assert controller.frozen.is_set()
    (status,) = controller.status()
    assert status.state == "decided" and status.recheck_at_s is None and status.serving == "a:cpu"
    assert "frozen" in controller.notes()[0]
    calls_b = exes["b:cpu"].calls
    drive(router, controller, X, lambda: clock() >= 1000 + 300)  # five minutes of calls
    assert exes["b:cpu"].calls == calls_b  # no turn, no re-check


def test_a_shape_first_called_after_freeze_is_served_by_the_start_unchecked():
    clock = FakeClock()
    exes = {"a:cpu": Scripted(clock, 1e-3), "b:cpu": Scripted(clock, 0.5e-3)}
    router, controller, lab = tuner(exes, clock)
    controller.freeze()
    controller.step()
    drive(router, controller, X, decided(controller))
    (status,) = controller.status()
    assert status.serving == "a:cpu" and lab.checks == 0 and exes["b:cpu"].calls == 0
    assert "unchecked" in controller.notes()[0]


def test_recheck_now_races_what_the_bound_left_untimed_and_keeps_the_first_decisions_time():
    clock = FakeClock()
    policy = TuningPolicy(decide_within_s=5.0, recheck_after_s=600.0)
    exes = {"a:cpu": Scripted(clock, 1e-3), "b:cpu bf16": Scripted(clock, 0.5e-3)}
    lab = InflatedWarmUpLab(exes, {"b:cpu bf16": 20e-3}, warm={"a:cpu": 1e-3, "b:cpu bf16": 1.05e-3})
    router, controller, _ = tuner(exes, clock, policy, lab=lab)
    drive(router, controller, X, decided(controller))
    (first,) = controller.status()
    assert {c.label: c.reason for c in first.candidates}["b:cpu bf16"] == race.NOT_TIMED
    t_decided = clock()
    controller.recheck_now(first.key)  # what cm.tune() asks: not ten minutes later, among the requests
    drive(router, controller, X, lambda: controller.status()[0].serving == "b:cpu bf16"
          and controller.status()[0].state == "decided")
    (status,) = controller.status()
    assert clock() - t_decided < 60.0
    assert status.decided_after_s == first.decided_after_s and status.decided_after_calls == first.decided_after_calls
    assert "re-decided" in controller.notes()[0]


def test_cm_freeze_on_a_real_model_stops_tuning_and_answers_stay_right():
    import numpy as np
    from tests.test_auto_shapes import conv_net

    import hybrid

    hybrid.init({"autotune": {"decide_within_s": 6.0, "overhead_cap": 1.0}})
    cm = hybrid.compile(conv_net(), target="auto")
    ref = hybrid.compile(conv_net(), target="reference")
    x = np.random.default_rng(0).random((2, 3, 24, 32), np.float32)
    np.testing.assert_allclose(cm(x), ref(x), rtol=1e-3, atol=1e-4)
    status = cm.freeze()
    assert all(s.state == "decided" and s.recheck_at_s is None for s in status)
    y = np.random.default_rng(1).random((1, 3, 64, 64), np.float32)  # a new bucket after the freeze
    np.testing.assert_allclose(cm(y), ref(y), rtol=1e-3, atol=1e-4)
    cm.freeze()  # applied again: the new bucket is decided, unchecked
    assert {s.bucket: s.state for s in cm.tuning}["x: 1x3x64x64"] == "decided"
    assert any("unchecked" in n or "frozen" in n for n in cm.plan.notes)
    assert hybrid.compile(conv_net(), target="onnxruntime").freeze() == ()  # nothing tunes: nothing to stop
    cm.close()


def test_pyasc_serve_freeze_tuning_stops_each_models_tuning_once_loaded(tmp_path):
    import onnx
    from tests.test_auto_shapes import conv_net
    from typer.testing import CliRunner

    from hybrid.cli.main import app
    from hybrid.serve.core.repository import build_registry

    path = tmp_path / "net.onnx"
    onnx.save(conv_net(), str(path))
    registry = build_registry([path], target="auto", freeze_tuning=True)
    try:
        (model,) = list(registry)
        assert model.compiled.tunes_online and model.compiled.executable.controller.frozen.is_set()
    finally:
        registry.close()
    assert "--freeze-tuning" in CliRunner().invoke(app, ["serve", "--help"], terminal_width=200).output


def test_a_race_that_falls_in_a_pause_waits_for_calls_and_times_every_candidate():
    clock = FakeClock()
    policy = TuningPolicy(decide_within_s=10.0)
    exes = {"a:cpu": Scripted(clock, 1e-3), "b:cpu": Scripted(clock, 0.97e-3)}  # 3 % apart: several rounds
    router, controller, _ = tuner(exes, clock, policy)
    drive(router, controller, X, lambda: controller.status() and controller.status()[0].phase == "racing")
    for _ in range(120):  # a minute without a call, longer than the bound; the controller looks every half second
        clock.advance(0.5)
        controller.step()
    (status,) = controller.status()
    assert status.state == "tuning"  # not concluded on the clock: the bound counts the bucket's traffic
    drive(router, controller, X, decided(controller))
    (status,) = controller.status()
    outcomes = {c.label: (c.outcome, c.reason) for c in status.candidates}
    assert race.NOT_TIMED not in {why for _, why in outcomes.values()}
    assert status.serving == "b:cpu"


def test_a_burst_only_bucket_is_decided_within_a_bounded_amount_of_its_traffic():
    clock = FakeClock()
    policy = TuningPolicy(decide_within_s=10.0)
    # 3 % apart, each drifting 6 % over seconds (a shared machine): the rule needs several rounds of turns
    exes = {"a:cpu": Scripted(clock, lambda c: 1e-3 * (1 + 0.06 * math.sin(c() * 4.1))),
            "b:cpu": Scripted(clock, lambda c: 0.97e-3 * (1 + 0.06 * math.sin(c() * 2.9 + 1)))}
    router, controller, _ = tuner(exes, clock, policy)
    busy = 0.0
    while not decided(controller)():
        t0 = clock()
        drive(router, controller, X, lambda t0=t0: clock() - t0 >= 1.5 or decided(controller)())  # 1.5 s bursts
        busy += clock() - t0
        for _ in range(60):  # 30 s pauses
            clock.advance(0.5)
            controller.step()
        assert busy <= policy.decide_within_s + 4.0, controller.status()
    assert controller.status()[0].serving == "b:cpu"
    assert "by the paired turns" in controller.notes()[0]  # on real turns, not at a bound that ran out in a pause


def test_a_check_that_ran_past_the_bound_leaves_the_race_its_turns():
    class SlowCheckLab(FakeLab):
        def check(self, sample, closing, *, paced_for_s=float("inf")):
            clock.advance(45.0)  # a loaded machine: the check took longer than the whole bound
            return super().check(sample, closing, paced_for_s=paced_for_s)

    clock = FakeClock()
    exes = {"a:cpu": Scripted(clock, 1e-3), "b:cpu": Scripted(clock, 0.5e-3)}
    lab = SlowCheckLab(exes, warm={"a:cpu": 1e-3, "b:cpu": 1.05e-3})  # the check did not see b's real speed
    router, controller, _ = tuner(exes, clock, TuningPolicy(decide_within_s=30.0), lab=lab)
    drive(router, controller, X, decided(controller))
    (status,) = controller.status()
    assert status.serving == "b:cpu" and "by the paired turns" in controller.notes()[0]
    assert exes["b:cpu"].calls > 0
