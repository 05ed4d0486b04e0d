"""target='auto' with nothing declared about a dynamic model: start sound, tune online per shape bucket."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from tests._backends import backend_registered
from tests.test_auto_shapes import _Fake, _SmallOnly, conv_net

import hybrid
from hybrid.runtime.auto import OnlineTuner, trials


@pytest.fixture(autouse=True)
def _quick_tuning():
    hybrid.init({"autotune": {"calls_per_bucket": 2, "overhead_cap": 1.0, "explore_share": 1.0}})


def reference(x):
    return hybrid.compile(conv_net(), target="reference")(x)


def images(n, h, w, seed=0):
    return np.random.default_rng(seed).random((n, 3, h, w), np.float32)


def call_until_settled(cm, x, limit_s=120.0):
    """Call ``cm`` on ``x`` until every bucket seen has settled; check every answer; return the calls made."""
    expected = reference(x)
    deadline, calls = time.monotonic() + limit_s, 0
    while True:
        np.testing.assert_allclose(cm(x), expected, rtol=1e-3, atol=1e-4)
        calls += 1
        if all(s.state == "settled" for s in cm.executable.status()):
            return calls
        assert time.monotonic() < deadline, f"not settled after {calls} calls: {cm.executable.status()}"
        time.sleep(0.005)


def test_a_dynamic_model_starts_accelerated_and_settles_on_real_calls():
    cm = hybrid.compile(conv_net(), target="auto")  # 1x1 samples cannot run a 3x3 conv: nothing checked yet
    assert isinstance(cm.executable, OnlineTuner)
    assert cm.backend != "reference"
    assert any("online tuning" in n for n in cm.plan.notes)
    calls = call_until_settled(cm, images(2, 24, 32))
    (status,) = cm.executable.status()
    assert status.bucket == (("x", (2, 3, 32, 32)),)  # dynamic dims rounded up to powers of two
    assert status.settled_after is not None and calls >= status.settled_after
    assert status.serving != "reference:cpu"  # never the reference while an accelerated backend is right
    assert any(n.startswith("bucket x: 2x3x32x32: ") for n in cm.plan.notes)
    assert cm.backend == status.serving.split(":")[0]


def test_each_bucket_decides_for_itself():
    cm = hybrid.compile(conv_net(), target="auto")
    call_until_settled(cm, images(1, 16, 16))
    call_until_settled(cm, images(4, 40, 40, seed=1))
    assert sorted(s.bucket for s in cm.executable.status()) == [(("x", (1, 3, 16, 16)),), (("x", (4, 3, 64, 64)),)]
    np.testing.assert_allclose(cm(images(1, 15, 13)), reference(images(1, 15, 13)), rtol=1e-3, atol=1e-4)


def test_bucket_decisions_are_cached_and_read_back_without_checks(monkeypatch):
    first = hybrid.compile(conv_net(), target="auto")
    call_until_settled(first, images(2, 24, 32))
    winner = first.executable.status()[0].serving
    first.close()

    def boom(*args, **kwargs):
        raise AssertionError("checked although the decision is cached")

    monkeypatch.setattr(trials.Search, "check", boom)
    second = hybrid.compile(conv_net(), target="auto")
    call_until_settled(second, images(2, 24, 32))
    (status,) = second.executable.status()
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
        assert cm.executable.status() == [] and cm.backend == "batchone"  # checked at batch 1: it passed
        x = np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32)
        expected = np.maximum(x.mean(axis=(2, 3), keepdims=True), 0)
        deadline = time.monotonic() + 60
        while not cm.executable.status() or cm.executable.status()[0].state in ("new", "checking"):
            cm(x)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(10):  # from the check on: only right answers
            np.testing.assert_allclose(cm(x), expected, rtol=1e-5, atol=1e-6)
        assert cm.executable.status()[0].serving != "batchone:cpu"


def test_a_call_the_serving_backend_cannot_run_is_answered_by_the_next_candidate():
    with backend_registered(_SmallOnly):
        cm = hybrid.compile(conv_net(), target="auto")
        assert cm.backend == "smallonly"  # first by priority; the 1x1 sample could not be checked
        x = images(8, 16, 16)
        np.testing.assert_allclose(cm(x), reference(x), rtol=1e-3, atol=1e-4)  # batch 8: smallonly raises
        assert cm.executable.status()[0].serving != "smallonly:cpu"
        call_until_settled(cm, x)


def test_sixteen_callers_each_get_their_own_answer_while_the_bucket_switches():
    cm = hybrid.compile(conv_net(), target="auto")
    inputs = [images(2, 24, 32, seed=k) for k in range(16)]
    expected = [reference(x) for x in inputs]
    errors: list[str] = []
    start = threading.Barrier(16)

    def caller(k):
        start.wait()
        for _ in range(12):
            got = cm(inputs[k])
            if not np.allclose(got, expected[k], rtol=1e-3, atol=1e-4):
                errors.append(f"caller {k} got another answer")

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    call_until_settled(cm, inputs[0])
    assert cm.executable.status()[0].calls >= 16 * 12


def test_a_starved_check_gets_yield_windows_on_a_bounded_share_of_calls(monkeypatch):
    from hybrid.runtime.auto import online

    release = threading.Event()
    original = OnlineTuner._check

    def starved_check(self, slot):  # as a check that callers leaving no core idle starve: done when released
        release.wait(timeout=120)
        original(self, slot)

    class Clock:  # the real clock, counting the calls that wait in a window
        perf_counter = staticmethod(time.perf_counter)
        waits: list[float] = []

        @classmethod
        def sleep(cls, seconds):
            cls.waits.append(seconds)
            time.sleep(seconds)

    monkeypatch.setattr(OnlineTuner, "_check", starved_check)
    monkeypatch.setattr(online, "time", Clock)
    monkeypatch.setattr(online, "YIELD_AFTER_S", 0.0)
    cm = hybrid.compile(conv_net(), target="auto")
    inputs = [images(1, 12, 12, seed=k) for k in range(4)]
    expected = [reference(x) for x in inputs]
    calls_per_caller, errors = 600, []

    def caller(k):
        for _ in range(calls_per_caller):
            if not np.allclose(cm(inputs[k]), expected[k], rtol=1e-3, atol=1e-4):
                errors.append(k)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    wall = time.perf_counter() - t0
    assert not errors
    total = 4 * calls_per_caller
    assert 1 <= len(Clock.waits) <= total * online.YIELD_CALL_SHARE + 4  # a window holds up one call per caller
    assert all(w <= online.YIELD_MAX_S for w in Clock.waits)
    assert sum(Clock.waits) <= 4 * (online.YIELD_WALL_SHARE * wall + online.YIELD_MAX_S)
    release.set()
    call_until_settled(cm, inputs[0])


def test_candidates_that_serve_no_bucket_are_released_and_come_back_when_wanted(monkeypatch):
    from hybrid.hal import Executable
    from hybrid.runtime.auto import online

    class Loser(Executable):  # a candidate that lost every bucket it took turns in
        closed = False

        def run(self, feeds):
            raise AssertionError("a released candidate must not serve")

        def close(self):
            self.closed = True

    monkeypatch.setattr(online, "RELEASE_GRACE_S", 0.0)
    cm = hybrid.compile(conv_net(), target="auto")
    tuner = cm.executable
    call_until_settled(cm, images(2, 24, 32))
    loser = tuner._compiled["loser:cpu"] = Loser()
    tuner._release(next(iter(tuner._slots.values())))
    assert loser.closed and "loser:cpu" not in tuner._compiled
    assert {s.serving for s in tuner.status()} <= set(tuner._compiled)  # what serves stays open
    call_until_settled(cm, images(1, 40, 40, seed=3))  # a new bucket compiles what it needs again
    assert all(s.state == "settled" for s in tuner.status())


def test_online_tuning_can_be_switched_off():
    hybrid.init({"autotune": {"online": False}})
    cm = hybrid.compile(conv_net(), target="auto")
    assert not isinstance(cm.executable, OnlineTuner)


def test_the_check_process_answers_like_the_search_and_runs_below_the_callers():
    from hybrid.runtime.auto import worker

    assert worker.nice_for(1.0) == 0 and worker.nice_for(0.1) == 10 and worker.nice_for(0.001) == 19
    model = hybrid.Model.load(conv_net())
    x = images(2, 16, 16)
    request = worker.CheckRequest(model.to_bytes(), "conv_net", ("onnxruntime:cpu", "reference:cpu"),
                                  {"onnxruntime:cpu": {}, "reference:cpu": {}}, 1e-3, {}, {"x": x})
    verdicts = worker.check_elsewhere(request, share=0.1)
    assert verdicts is not None
    assert {label: why for label, why, _, _ in verdicts.results} == {"onnxruntime:cpu": None, "reference:cpu": None}
    pid = worker._WORKER.proc.pid  # below the callers from its start: its imports take seconds of CPU
    assert os.getpriority(os.PRIO_PROCESS, pid) == 10
    if hasattr(os, "SCHED_IDLE"):
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
    assert all(warm is not None and warm > 0 for _, _, warm, _ in verdicts.results)
    unknown = worker.CheckRequest(model.to_bytes(), "conv_net", ("nosuchbackend:cpu",), {"nosuchbackend:cpu": {}},
                                  1e-3, {}, {"x": x})
    assert worker.check_elsewhere(unknown, share=0.1) is None  # the caller then checks in a thread


def tuner_over(monkeypatch, candidates):
    """A model whose bucket check passes exactly ``candidates`` (label -> Executable), which then take turns."""

    def check(self, slot):
        self._compiled.update(candidates)
        with slot.lock:
            slot.survivors = list(candidates)
            self._begin_turns(slot)

    monkeypatch.setattr(OnlineTuner, "_check", check)
    monkeypatch.setattr(OnlineTuner, "_switched", lambda self, label, reason: None)
    return hybrid.compile(conv_net(), target="auto")


def run_until_settled(cm, x, limit_s=60.0):
    """Call the tuner itself (fake candidates answer anything) until its one bucket settled."""
    deadline = time.monotonic() + limit_s
    while not cm.executable.status() or cm.executable.status()[0].state != "settled":
        cm.executable.run({"x": x})
        assert time.monotonic() < deadline, cm.executable.status()


def test_candidates_take_turns_and_each_is_timed_at_its_own_speed(monkeypatch):
    """'fast' serves in 1 ms, but in 4 ms while 'spinner' (2 ms) ran within the last 30 ms, as a runtime does
    while another one's idle threads still spin on a core. Alternating call by call would time it at 4 ms and
    pick 'spinner'; turns with a lead-in time it at its own speed."""
    from hybrid.hal import Executable
    from hybrid.runtime.auto import online

    last_spin = [float("-inf")]
    ran: list[str] = []

    class Fake(Executable):
        def __init__(self, name, seconds):
            self.name, self.seconds = name, seconds

        def run(self, feeds):
            ran.append(self.name)
            if self.name == "spinner":
                time.sleep(self.seconds)
                last_spin[0] = time.perf_counter()
            else:
                time.sleep(4 * self.seconds if time.perf_counter() - last_spin[0] < 0.03 else self.seconds)
            return [np.zeros((1,), np.float32)]

    hybrid.init({"autotune": {"calls_per_bucket": 8, "overhead_cap": 1.0, "explore_share": 1.0}})
    monkeypatch.setattr(online, "PRUNE_RATIO", 100.0)  # the slower one takes its second turn too
    cm = tuner_over(monkeypatch, {"spinner:cpu": Fake("spinner", 0.002), "fast:cpu": Fake("fast", 0.001)})
    run_until_settled(cm, images(1, 8, 8))
    assert cm.executable.status()[0].serving == "fast:cpu"
    turns = [name for i, name in enumerate(ran) if i == 0 or ran[i - 1] != name]
    assert turns == ["spinner", "fast", "spinner"]  # A B B A: whole turns, not call by call


def test_a_candidate_that_fails_a_real_call_in_its_turn_leaves_the_turns(monkeypatch):
    from hybrid.hal import Executable

    class Broken(Executable):
        def run(self, feeds):
            raise RuntimeError("this shape is not supported here")

    class Right(Executable):
        def run(self, feeds):
            return [reference(feeds["x"])]

    cm = tuner_over(monkeypatch, {"broken:cpu": Broken(), "right:cpu": Right()})
    call_until_settled(cm, images(1, 8, 8), limit_s=60)  # every answer checked on the way
    assert cm.executable.status()[0].serving == "right:cpu"


def test_near_tied_candidates_take_their_turns_once_more(monkeypatch):
    from hybrid.hal import Executable
    from hybrid.runtime.auto import online

    ran: list[str] = []

    class Same(Executable):
        def __init__(self, name):
            self.name = name

        def run(self, feeds):
            ran.append(self.name)
            time.sleep(0.001)
            return [np.zeros((1,), np.float32)]

    # two equal 1 ms candidates are near by construction; how near a loaded machine times two sleeps is not
    # the point here, so any gap counts as near
    monkeypatch.setattr(online, "NEAR_TIE_REL", 10.0)
    cm = tuner_over(monkeypatch, {"a:cpu": Same("a"), "b:cpu": Same("b")})
    run_until_settled(cm, images(1, 8, 8))
    turns = [name for i, name in enumerate(ran) if i == 0 or ran[i - 1] != name]
    assert turns == ["a", "b", "a", "b", "a"]  # A B B A, then A B B A again: near ties take their turns twice


def test_runners_up_take_turns_again_later_and_the_rounds_decide_together(monkeypatch):
    """'a' wins the first round by 20 %; then the machine's state moves and 'b' is 18 % faster. One round
    that says so does not outvote the first (their median is still 'a'); two do. After the last round the
    bucket takes no more turns."""
    from hybrid.hal import Executable
    from hybrid.runtime.auto import online

    speed = {"a": 0.004, "b": 0.0048}

    class Timed(Executable):
        def __init__(self, name):
            self.name = name

        def run(self, feeds):
            time.sleep(speed[self.name])
            return [np.zeros((1,), np.float32)]

    monkeypatch.setattr(online, "RECHECK_AFTER_S", (0.05, 0.05))
    monkeypatch.setattr(online, "PRUNE_RATIO", 100.0)  # every turn is taken: the rounds are what is tested
    cm = tuner_over(monkeypatch, {"a:cpu": Timed("a"), "b:cpu": Timed("b")})
    run_until_settled(cm, images(1, 8, 8))
    tuner = cm.executable
    slot = next(iter(tuner._slots.values()))
    assert tuner.status()[0].serving == "a:cpu" and slot.runners == ["b:cpu"]  # within RUNNER_RATIO: it comes back
    assert not tuner.status()[0].final  # settled, with a round still to come
    speed["b"] = 0.0034
    deadline = time.monotonic() + 60
    while len(slot.rounds) < 3 or slot.state != "settled":
        tuner.run({"x": images(1, 8, 8)})
        assert time.monotonic() < deadline, tuner.status()
    assert tuner.status()[0].serving == "b:cpu" and slot.runners == [] and tuner.status()[0].final
    time.sleep(0.1)
    tuner.run({"x": images(1, 8, 8)})
    assert slot.state == "settled" and len(slot.rounds) == 3  # no fourth round
    assert any("over 3 rounds" in n for n in tuner.notes())


def test_turns_wait_until_the_buckets_calls_allow_them_and_stay_within_the_share(monkeypatch):
    """With ``explore_share`` 0.05, a round of two candidates under test, each answering about
    ``calls_per_bucket`` calls (no lead-in here), starts no earlier than the 80th call; until then the start
    answers every call, and over the rounds the candidates under test answer about a twentieth of the calls."""
    from hybrid.hal import Executable
    from hybrid.runtime.auto import online

    calls, ran = [0], []

    class Timed(Executable):
        def __init__(self, name, seconds):
            self.name, self.seconds = name, seconds

        def run(self, feeds):
            ran.append((calls[0], self.name))
            time.sleep(self.seconds)
            return [np.zeros((1,), np.float32)]

    hybrid.init({"autotune": {"calls_per_bucket": 2, "overhead_cap": 1.0, "explore_share": 0.05}})
    for name, value in [("TURN_LEAD_S", 0.0), ("TURN_MIN_S", 0.0), ("RECHECK_AFTER_S", (0.01, 0.01)),
                        ("NEAR_TIE_REL", 0.0), ("PRUNE_RATIO", 100.0)]:
        monkeypatch.setattr(online, name, value)
    cm = tuner_over(monkeypatch, {"a:cpu": Timed("a", 0.002), "b:cpu": Timed("b", 0.0024)})
    tuner, x = cm.executable, images(1, 8, 8)
    deadline = time.monotonic() + 60
    while not tuner.status() or not tuner.status()[0].final:
        calls[0] += 1
        tuner.run({"x": x})
        while tuner.status()[0].state == "checking":  # the check is done on the call it began on
            time.sleep(0.001)
        assert time.monotonic() < deadline, tuner.status()
    slot = next(iter(tuner._slots.values()))
    assert 80 <= ran[0][0] <= 81  # the first turn: two candidates under test, two calls each, at 5 %
    assert len(slot.rounds) == 3 and tuner.status()[0].serving == "a:cpu"
    answered_by_b = sum(1 for _, name in ran if name == "b")  # 'b' is under test in every round
    assert answered_by_b <= slot.explored <= 0.05 * calls[0] + 2 * 2  # a round's own calls may overshoot a little


def test_a_slow_candidate_under_test_stops_but_the_serving_one_takes_every_turn(monkeypatch):
    """After four timed calls and 50 ms of them, a candidate more than PRUNE_RATIO slower than the best stops
    taking turns, unless it is the one serving: its calls cost nothing more, and its last turn of A B B A is
    what makes the comparison fair to it (its first turn may follow a disruption, such as a compile)."""
    from hybrid.hal import Executable
    from hybrid.runtime.auto import online

    class Zero(Executable):
        def run(self, feeds):
            return [np.zeros((1,), np.float32)]

    hybrid.init({"autotune": {"calls_per_bucket": 8, "overhead_cap": 1.0, "explore_share": 1.0}})
    tuner = tuner_over(monkeypatch, {"a:cpu": Zero(), "b:cpu": Zero()}).executable
    for slow in ("a:cpu", "b:cpu"):
        base = time.perf_counter() + 5.0  # past any lead-in the turns set from the real clock
        slot = online._Slot((), ("a:cpu", Zero()), state="exploring", survivors=["a:cpu", "b:cpu"],
                            turns=["a:cpu", "b:cpu", "b:cpu", "a:cpu"], turn_began=base, turn_from=base,
                            last_end=base)
        for label, calls in (("a:cpu", 5), ("b:cpu", 10)):
            for _ in range(calls):
                seconds = 0.013 if label == slow else 0.010
                started = slot.last_end
                tuner._record(slot, label, started, seconds)
                slot.last_end = started + seconds
        if slow == "a:cpu":  # the serving one, 1.3x slower in its first turn: it still takes its last turn
            assert "a:cpu" not in slot.pruned and slot.turns[slot.turn] == "a:cpu" and slot.turn == 3
        else:  # a candidate under test, 1.3x slower: it stops
            assert slot.pruned == {"b:cpu"}


def test_calls_after_a_pause_are_served_but_not_timed_until_the_turn_ran_out_of_patience(monkeypatch):
    """A call that follows a pause finds its pool idled (callers in bursts, a benchmark's blocks): the calls of
    the next GAP_LEAD_S are not timed, unless the turn already lasted TURN_PATIENCE_S (callers that pause between
    every call must still be timed)."""
    from hybrid.hal import Executable
    from hybrid.runtime.auto import online

    class Zero(Executable):
        def run(self, feeds):
            return [np.zeros((1,), np.float32)]

    # one turn holds every call here
    hybrid.init({"autotune": {"calls_per_bucket": 100, "overhead_cap": 1.0, "explore_share": 1.0}})
    cm = tuner_over(monkeypatch, {"a:cpu": Zero(), "b:cpu": Zero()})
    tuner = cm.executable
    slot = online._Slot((), ("a:cpu", Zero()), state="exploring", survivors=["a:cpu", "b:cpu"],
                        turns=["a:cpu", "b:cpu", "b:cpu", "a:cpu"], turn_began=100.0, turn_from=100.0,
                        last_end=100.09)

    def call(started, seconds=0.001):
        tuner._record(slot, "a:cpu", started, seconds)
        slot.last_end = started + seconds

    call(100.10)
    call(100.11)
    assert len(slot.times["a:cpu"]) == 2  # back to back: timed
    call(100.50)  # after a 0.4 s pause
    for started in (100.515, 100.53, 100.545):  # 15 ms apart: no pause, but within GAP_LEAD_S of the one above
        call(started)
    assert len(slot.times["a:cpu"]) == 2 and slot.turn_from == pytest.approx(100.50 + online.GAP_LEAD_S)
    call(100.56)
    assert len(slot.times["a:cpu"]) == 3
    call(103.0)  # a pause, but the turn began 3 s ago: every call counts now
    assert len(slot.times["a:cpu"]) == 4
