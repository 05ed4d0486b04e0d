"""How auto times candidates: at each one's steady speed, once the one timed before it has let go of the cores.

The clock is a fake one here (timing.time replaced), so that the tests hold on any machine: what is
asserted is what the timing code does with the clocks, not how fast this machine is.
"""

from __future__ import annotations

import pytest

from hybrid.runtime.auto import timing
from hybrid.runtime.auto.policy import TimingPolicy


class FakeClock:
    """perf_counter advances only by sleep() and by the candidates' work; the process clock advances with
    the wall while some thread of the process is busy (until ``busy_until``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0
        self.busy_until = 0.0

    def perf_counter(self) -> float:
        return self.now

    def process_time(self) -> float:
        return self.cpu

    def sleep(self, seconds: float) -> None:
        self.cpu += max(0.0, min(self.now + seconds, self.busy_until) - self.now)
        self.now += seconds

    def work(self, seconds: float) -> None:
        self.cpu += seconds
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", fake)
    return fake


def test_settle_waits_until_the_process_stops_using_the_cpu(clock):
    clock.busy_until = 0.04  # a pool's idle threads spin for 40 ms after a run
    waited = timing.settle()
    assert 0.04 <= waited <= 0.04 + 2 * TimingPolicy().quiet_poll_s


class TickClock(FakeClock):
    """As Linux charges a thread running on another core: to the process clock in whole 4 ms ticks."""

    def process_time(self) -> float:
        busy = min(self.now, self.busy_until)
        return self.cpu - busy + 0.004 * (busy // 0.004)


def test_settle_sees_a_pool_charged_only_at_the_scheduler_tick(monkeypatch):
    fake = TickClock()
    monkeypatch.setattr(timing, "time", fake)
    fake.busy_until = 0.045
    assert timing.settle() >= 0.045


def test_settle_gives_up_after_its_limit_when_the_process_stays_busy(clock):
    clock.busy_until = 10.0
    assert timing.settle(0.05) == pytest.approx(0.05, abs=TimingPolicy().quiet_poll_s)


def test_a_block_leaves_out_the_calls_of_its_lead_in(clock):
    start = clock.now

    def waking():  # 5 ms per call while its pool wakes up (the first 20 ms), then 1 ms
        clock.work(0.005 if clock.now - start < 0.02 else 0.001)

    kept = timing.steady_calls(waking, block_s=0.2, lead_s=0.05)
    assert kept and all(k == pytest.approx(0.001) for k in kept)
    assert clock.now - start == pytest.approx(0.2, abs=0.0011)


def test_a_call_longer_than_the_block_is_still_kept(clock):
    assert timing.steady_calls(lambda: clock.work(0.5), block_s=0.2, lead_s=0.05) == [pytest.approx(0.5)]


def test_candidates_are_ranked_at_their_steady_speed_not_right_after_another(clock):
    """The encoder's case: 'waking' takes 0.3 ms a call once its pool is up, 0.45 ms over the first 45 ms after
    another candidate ran (and while that one's threads still spin); 'steady' takes 0.35 ms and leaves its
    threads spinning for 40 ms. Timed in short blocks right after 'steady', 'waking' would lose."""
    state = {"woke": 0.0, "last": None}

    def run(name):
        def call():
            if state["last"] != name:
                state["woke"], state["last"] = clock.now, name
            if name == "steady":
                clock.work(0.00035)
                clock.busy_until = clock.now + 0.04
            else:
                clock.work(0.00045 if clock.now - state["woke"] < 0.045 or clock.now < clock.busy_until else 0.0003)
        return call

    times = timing.time_candidates({"steady": run("steady"), "waking": run("waking")}, budget_s=1.0)
    assert times["waking"] == pytest.approx(0.0003)
    assert times["steady"] == pytest.approx(0.00035)


def test_paired_rounds_stop_when_the_rule_decides_and_go_on_while_it_cannot(clock, monkeypatch):
    blocks: list[str] = []
    real = timing.steady_calls

    def counted(fn, *args):
        blocks.append(fn.__name__)
        return real(fn, *args)

    def fixed(seconds):
        def call():
            clock.work(seconds)
        call.__name__ = f"{seconds * 1e3:g} ms"
        return call

    monkeypatch.setattr(timing, "steady_calls", counted)
    times = timing.time_candidates({"a": fixed(0.001), "c": fixed(0.0015)}, budget_s=0.5)  # 50 % apart
    assert blocks == ["1 ms", "1.5 ms", "1.5 ms", "1 ms"]  # one round A X X A: the gap is clear
    assert times == {"a": pytest.approx(0.001), "c": pytest.approx(0.0015)}
    blocks.clear()
    def wobbly():  # 0.85 or 1.15 ms, turn about per block: the interval of its ratio straddles the tie band
        clock.work(0.00085 if blocks.count("wobbly") % 2 else 0.00115)

    wobbly.__name__ = "wobbly"
    timing.time_candidates({"a": fixed(0.001), "w": wobbly}, budget_s=0.5)
    assert blocks.count("wobbly") == 2 * TimingPolicy().blocks  # every round it may take


def test_a_block_of_a_tiny_graph_ends_after_its_call_cap(clock):
    kept = timing.steady_calls(lambda: clock.work(0.00002), block_s=0.2, lead_s=0.05, max_kept=500)
    assert len(kept) == 500 and clock.now < 0.05 + 500 * 0.00002 + 0.001


def test_a_graph_faster_than_quick_s_is_timed_without_waiting_for_quiet(clock, monkeypatch):
    settles: list[float] = []
    monkeypatch.setattr(timing, "settle", lambda *a, **k: settles.append(clock.now) or 0.0)
    times = timing.time_candidates({"a": lambda: clock.work(0.00002), "b": lambda: clock.work(0.00003)})
    assert settles == [] and times == {"a": pytest.approx(0.00002), "b": pytest.approx(0.00003)}
    assert clock.now < 0.5  # 5 blocks of at most quick_block_calls calls and a short lead-in each
    timing.time_candidates({"a": lambda: clock.work(0.001), "b": lambda: clock.work(0.0015)})
    assert len(settles) == 4  # one round A B B A: a 50 % gap is clear


def test_a_warm_estimate_in_cpu_time_leaves_out_the_wait_for_a_core(clock):
    """The check process runs only where the callers leave a core idle: the wall time of its warm runs is mostly
    the wait (a U-Net's OpenVINO run 'took' 13.6 s), its CPU time is the work."""

    def starved():
        clock.sleep(0.5)  # waiting for a core: the wall clock moves, the process clock does not
        clock.work(0.001)

    assert timing.warm_estimate(starved, calls=10, within_s=0.5, clock=clock.process_time) == pytest.approx(0.001)
    assert timing.warm_estimate(starved) == pytest.approx(0.501)  # the wall clock counts the wait
