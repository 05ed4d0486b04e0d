"""@hybrid.dynamic_batch: routing, failure isolation, limits, timing guarantees, asyncio, lifecycle.

The timing guarantees run on a scripted clock (tests/_scripted_time.py); the tests of many threads or tasks run
on the real one with short timeouts, and assert only who got which answer, never how long it took.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from tests._scripted_time import ScriptedClock

import hybrid
from hybrid.errors import ConfigError, RunError
from hybrid.runtime.traffic.batching import Batcher, RequestFuture


class Recorder:
    """A batched function that records every batch it sees (ids and start/end times on ``clock``).

    ``started`` is set once a first batch has begun; a batch holding "block" waits for ``gate``.
    """

    def __init__(self, gate: threading.Event | None = None, poison: object = None, clock=time.monotonic) -> None:
        self.batches: list[list] = []
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.gate = gate
        self.poison = poison
        self.clock = clock
        self.started = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, items: list) -> list:
        start = self.clock()
        with self.lock:
            self.batches.append(list(items))
            self.starts.append(start)
        self.started.set()
        if self.gate is not None and "block" in items:
            assert self.gate.wait(10)
        if self.poison is not None and self.poison in items:
            raise ValueError("poisoned batch")
        out = [("answer", item) for item in items]
        with self.lock:
            self.ends.append(self.clock())
        return out


def blocked(rec: Recorder, f) -> RequestFuture:
    """Submit a lone "block" request and return once its batch runs (it waits for ``rec.gate``)."""
    first = f.submit("block")
    assert rec.started.wait(10)
    return first


@pytest.mark.timeout(120)
def test_64_threads_each_get_exactly_their_own_answer():
    rec = Recorder()
    f = hybrid.dynamic_batch(rec, max_batch=16, timeout=0.005)
    wrong: list = []
    errors: list = []

    def caller(thread_id: int) -> None:
        try:
            for i in range(200):
                tag = (thread_id, i)
                got = f(tag)
                if got != ("answer", tag):
                    wrong.append((tag, got))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    f.close()
    assert not errors and not wrong
    sizes = [len(b) for b in rec.batches]
    assert max(sizes) <= 16
    assert sum(sizes) == 64 * 200
    seen = [tag for b in rec.batches for tag in b]
    assert len(set(seen)) == 64 * 200  # no request ran twice or got lost
    st = f.stats()
    assert st.requests == 64 * 200 and st.batches == len(rec.batches) and st.max_batch_size <= 16
    assert st.mean_batch_size > 1  # concurrent callers were really batched together


@pytest.mark.timeout(60)
def test_poisoned_request_fails_only_its_batch():
    rec = Recorder(poison=("t", 7, 13))
    f = hybrid.dynamic_batch(rec, max_batch=8, timeout=0.005, isolate=False)  # (isolation: test_i55_runtime.py)
    outcome: dict = {}

    def caller(k: int) -> None:
        for i in range(30):
            tag = ("t", k, i)
            try:
                outcome[tag] = f(tag)
            except RunError as e:
                outcome[tag] = e

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    f.close()
    (bad_batch,) = [b for b in rec.batches if rec.poison in b]
    failed = {tag for tag, v in outcome.items() if isinstance(v, RunError)}
    assert failed == set(bad_batch)
    for tag in failed:
        assert outcome[tag].code == "HYB-408" and isinstance(outcome[tag].__cause__, ValueError)
    assert all(outcome[tag] == ("answer", tag) for tag in outcome if tag not in failed)
    assert len(outcome) == 16 * 30
    assert f.stats().failed_batches == 1


@pytest.mark.timeout(30)
def test_exception_instance_fails_only_its_own_caller():
    def fn(items):
        return [KeyError(x) if x == 3 else x * 10 for x in items]

    f = hybrid.dynamic_batch(fn, max_batch=8, timeout=0.05)
    futures = [f.submit(i) for i in range(8)]
    assert [fu.result(5) for i, fu in enumerate(futures) if i != 3] == [0, 10, 20, 40, 50, 60, 70]
    with pytest.raises(KeyError):
        futures[3].result(5)
    f.close()


@pytest.mark.timeout(30)
def test_wrong_length_fails_that_batch_and_the_loop_goes_on():
    calls = []

    def fn(items):
        calls.append(list(items))
        return items[:-1] if len(calls) == 1 else items

    f = hybrid.dynamic_batch(fn, max_batch=4, timeout=0.05)
    first = [f.submit(i) for i in range(4)]
    for fu in first:
        with pytest.raises(RunError) as info:
            fu.result(5)
        assert info.value.code == "HYB-413"
    assert [f(i, timeout=5) for i in (10, 11)] == [10, 11]
    for bad in (None, "abcd", 5):
        g = hybrid.dynamic_batch(lambda items, bad=bad: bad, max_batch=4, timeout=0.01)
        with pytest.raises(RunError, match="HYB-413"):
            g("x", timeout=5)
        g.close()
    f.close()


@pytest.mark.timeout(30)
def test_array_results_are_split_along_the_first_axis():
    f = hybrid.dynamic_batch(lambda items: np.stack(items) * 2, max_batch=4, timeout=0.05)
    futures = [f.submit(np.full(3, i, np.float32)) for i in range(4)]
    for i, fu in enumerate(futures):
        np.testing.assert_array_equal(fu.result(5), np.full(3, 2 * i, np.float32))
    f.close()


@pytest.mark.timeout(30)
def test_burst_never_exceeds_max_batch():
    rec = Recorder()
    f = hybrid.dynamic_batch(rec, max_batch=7, timeout=0.01)
    futures = [f.submit(i) for i in range(500)]
    assert [fu.result(10) for fu in futures] == [("answer", i) for i in range(500)]
    f.close()
    assert max(len(b) for b in rec.batches) <= 7
    assert sum(len(b) for b in rec.batches) == 500


@pytest.mark.timeout(30)
def test_lone_request_waits_exactly_the_timeout_on_the_batcher_s_clock():
    clock = ScriptedClock()
    rec = Recorder(clock=clock)
    f = Batcher(rec, max_batch=16, timeout=0.05, clock=clock, wait=clock.wait)
    arrived = clock()
    alone = f.submit("alone")
    clock.until_waiting()  # the collector waits for the batch to fill
    clock.advance(0.03)
    clock.until_waiting()  # it looked at the clock again: 0.02 s to go
    assert not alone.done() and rec.batches == []
    clock.advance(0.03)
    assert alone.result(5) == ("answer", "alone")
    assert rec.batches == [["alone"]]
    assert rec.starts[0] - arrived == pytest.approx(0.06)  # formed by the timeout, not by a full batch
    assert f.stats().max_queue_wait_s == pytest.approx(0.06)
    f.close()


@pytest.mark.timeout(30)
def test_request_arriving_during_a_slow_batch_starts_when_it_ends():
    """The formation window runs while a batch runs: once the slow batch ends, a request whose window has
    passed starts at once, not ``timeout`` later."""
    clock = ScriptedClock()
    gate = threading.Event()
    rec = Recorder(gate=gate, clock=clock)
    timeout = 2.0
    f = Batcher(rec, max_batch=4, timeout=timeout, clock=clock, wait=clock.wait)
    slow = [f.submit(x) for x in ("block", "a", "b", "c")]  # a full batch: starts at once
    assert rec.started.wait(10)
    arrived = clock()
    late = f.submit("late")
    clock.until_waiting()  # the collector waits out the late request's window...
    clock.advance(timeout + 0.3)  # ...which passes while the slow batch still runs
    released = clock()
    gate.set()
    assert late.result(5) == ("answer", "late")
    assert all(fu.result(5)[0] == "answer" for fu in slow)
    assert rec.starts[1] == released  # a timer restarted at the release would never start it on this clock
    assert rec.starts[1] - arrived == pytest.approx(timeout + 0.3)
    f.close()


@pytest.mark.timeout(30)
def test_with_two_batch_slots_a_request_does_not_wait_for_a_slow_batch():
    gate = threading.Event()
    rec = Recorder(gate=gate)
    f = hybrid.dynamic_batch(rec, max_batch=2, timeout=0.05, max_concurrent_batches=2)
    slow = [f.submit("block"), f.submit("x")]
    assert f("quick", timeout=5) == ("answer", "quick")  # served while the slow batch is still blocked
    assert not slow[0].done()
    gate.set()
    assert slow[0].result(5) == ("answer", "block")
    f.close()


@pytest.mark.timeout(30)
def test_per_call_timeout_fires_while_a_batch_runs_and_withdraws_the_request():
    gate = threading.Event()
    rec = Recorder(gate=gate)
    f = hybrid.dynamic_batch(rec, max_batch=1, timeout=0.01)
    blocker = blocked(rec, f)
    with pytest.raises(RunError) as info:
        f("impatient", timeout=0.1)  # (the per-call timeout is the caller's own real-time wait)
    assert info.value.code == "HYB-411" and "withdrawn" in info.value.message
    assert not blocker.done()  # it did not wait for the blocked batch to end
    gate.set()
    assert blocker.result(5) == ("answer", "block")
    f.close()
    assert ["impatient"] not in rec.batches
    assert f.stats().timed_out == 1 and f.stats().cancelled == 1


@pytest.mark.timeout(30)
def test_cancelled_queued_request_never_runs():
    gate = threading.Event()
    rec = Recorder(gate=gate)
    f = hybrid.dynamic_batch(rec, max_batch=1, timeout=0.01)
    blocked(rec, f)
    doomed = f.submit("doomed")
    kept = f.submit("kept")
    assert doomed.cancel()
    with pytest.raises(RunError) as info:
        doomed.result(1)
    assert info.value.code == "HYB-414"
    gate.set()
    assert kept.result(5) == ("answer", "kept")
    f.close()
    assert ["doomed"] not in rec.batches


@pytest.mark.timeout(30)
def test_max_queue_rejects_instead_of_growing():
    gate = threading.Event()
    rec = Recorder(gate=gate)
    f = hybrid.dynamic_batch(rec, max_batch=1, timeout=0.01, max_queue=2)
    blocked(rec, f)
    queued = [f.submit(1), f.submit(2)]
    with pytest.raises(RunError) as info:
        f.submit(3)
    assert info.value.code == "HYB-412"
    assert f.stats().rejected == 1 and f.stats().queued == 2
    gate.set()
    assert [q.result(5) for q in queued] == [("answer", 1), ("answer", 2)]
    f.close()


@pytest.mark.timeout(60)
def test_1000_asyncio_tasks_each_get_their_own_answer():
    rec = Recorder()
    f = hybrid.dynamic_batch(rec, max_batch=16, timeout=0.01)

    async def main() -> list:
        return await asyncio.gather(*(f.acall(("task", i)) for i in range(1000)))

    results = asyncio.run(main())
    f.close()
    assert results == [("answer", ("task", i)) for i in range(1000)]
    assert max(len(b) for b in rec.batches) <= 16
    assert sum(len(b) for b in rec.batches) == 1000
    assert f.stats().mean_batch_size > 4


@pytest.mark.timeout(30)
def test_asyncio_timeout_and_task_cancellation_withdraw_queued_requests():
    gate = threading.Event()
    rec = Recorder(gate=gate)
    f = hybrid.dynamic_batch(rec, max_batch=1, timeout=0.01)

    async def main() -> None:
        blocker = asyncio.ensure_future(f.acall("block"))
        assert await asyncio.to_thread(rec.started.wait, 10)
        with pytest.raises(RunError) as info:
            await f.acall("late", timeout=0.05)
        assert info.value.code == "HYB-411"
        task = asyncio.ensure_future(f.acall("cancel-me"))
        queued = f.stats().queued
        await asyncio.wait([task], timeout=0)  # one turn of the loop: the task queues its request, then waits
        assert f.stats().queued == queued + 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        assert await blocker == ("answer", "block")

    asyncio.run(main())
    f.close()
    assert rec.batches == [["block"]]


@pytest.mark.timeout(30)
def test_async_batched_function_and_poison_in_asyncio():
    async def fn(items):
        if "poison" in items:
            raise RuntimeError("bad batch")
        return [i.upper() for i in items]

    f = hybrid.dynamic_batch(fn, max_batch=2, timeout=0.01)

    async def main() -> list:
        return await asyncio.gather(f.acall("poison"), f.acall("x"), f.acall("ok"), return_exceptions=True)

    a, b, c = asyncio.run(main())
    f.close()
    assert isinstance(a, RunError) and a.code == "HYB-408"
    assert b == "X"  # batched with the poison, then run again alone (isolate)
    assert c == "OK"


@pytest.mark.timeout(30)
def test_close_drains_or_cancels_and_then_rejects():
    gate = threading.Event()
    rec = Recorder(gate=gate)
    f = hybrid.dynamic_batch(rec, max_batch=1, timeout=0.01)
    first = blocked(rec, f)
    queued = f.submit("queued")
    gate.set()
    f.close(wait=True, timeout=5)
    assert first.result(0) == ("answer", "block") and queued.result(0) == ("answer", "queued")
    with pytest.raises(RunError, match="HYB-415"):
        f(1)

    gate2 = threading.Event()
    rec2 = Recorder(gate=gate2)
    g = hybrid.dynamic_batch(rec2, max_batch=1, timeout=0.01)
    running = blocked(rec2, g)
    dropped = g.submit("dropped")
    dropped.add_done_callback(lambda _: gate2.set())  # the running batch ends once close has cancelled the queue
    g.close(wait=False, timeout=5)
    with pytest.raises(RunError, match="HYB-414"):
        dropped.result(1)
    assert running.result(0) == ("answer", "block") and rec2.batches == [["block"]]


@pytest.mark.timeout(10)
def test_bad_settings_are_config_errors():
    for kwargs in ({"max_batch": 0}, {"timeout": -1}, {"max_queue": 0}, {"max_concurrent_batches": 0},
                   {"max_batch": True}):
        with pytest.raises(ConfigError) as info:
            hybrid.dynamic_batch(lambda xs: xs, **kwargs)
        assert info.value.code == "HYB-102"

    @hybrid.dynamic_batch
    def plain(xs):
        """Doubles."""
        return [2 * x for x in xs]

    assert plain.__doc__ == "Doubles." and plain.__name__ == "plain"
    assert plain(4, timeout=5) == 8
    plain.close()
