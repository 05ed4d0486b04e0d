"""hybrid.Pipeline: concurrency, order, per-item errors, bounded queues, draining, device fallback."""

from __future__ import annotations

import logging
import threading

import pytest
from tests._scripted_time import ScriptedClock
from tests._serve_support import wait_for

import hybrid
from hybrid.errors import BackendError, ConfigError, RunError


@pytest.mark.timeout(60)
def test_order_is_kept_when_items_finish_out_of_order_with_many_workers():
    # out of order for sure, on any machine: the first stage finishes each odd item before the even one before it
    # (the even one's worker waits for it), so every later stage sees them swapped
    finished = [threading.Event() for _ in range(300)]
    done_first: list[int] = []

    def add(x):
        if x % 2 == 0:
            assert finished[x + 1].wait(10)
        done_first.append(x)
        finished[x].set()
        return x + 1

    with hybrid.Pipeline(queue_size=3) as p:
        p.add_stage(add, workers=2, name="add")
        p.add_stage(lambda x: x * 3, workers=4, name="mul")
        p.add_stage(lambda x: (x, "done"), workers=3, name="tag")
        out = list(p.run(range(300)))
    assert done_first[:2] == [1, 0] and sorted(done_first) == list(range(300))
    assert out == [((i + 1) * 3, "done") for i in range(300)]
    stats = p.stats()
    assert [s.name for s in stats] == ["add", "mul", "tag"]
    assert [s.items for s in stats] == [300, 300, 300]
    assert all(s.errors == 0 and s.max_queue_depth <= 4 for s in stats)


@pytest.mark.timeout(60)
def test_stages_run_at_the_same_time():
    # a rendezvous instead of overlapping sleeps: stage 1 on item 1 and stage 3 on item 0 must be inside
    # their calls at the same moment, or the barrier breaks (after 10 s) and the item fails
    meet = threading.Barrier(2, timeout=10)

    def first(x):
        if x == 1:
            meet.wait()
        return x

    def last(x):
        if x == 0:
            meet.wait()
        return x

    with hybrid.Pipeline() as p:
        p.add_stage(first).add_stage(lambda x: x).add_stage(last)
        assert list(p.run(range(30))) == list(range(30))
    assert not meet.broken


@pytest.mark.timeout(30)
def test_an_error_reaches_only_its_item_and_the_pipeline_goes_on():
    def fragile(x):
        if x == 5:
            raise ValueError(f"bad item {x}")
        return x

    with hybrid.Pipeline() as p:
        p.add_stage(lambda x: x, name="first").add_stage(fragile).add_stage(lambda x: -x, name="last")
        futures = [p.submit(i) for i in range(10)]
        with pytest.raises(ValueError, match="bad item 5") as info:
            futures[5].result(5)
        assert any("fragile" in note for note in info.value.__notes__)
        assert [f.result(5) for i, f in enumerate(futures) if i != 5] == [-i for i in range(10) if i != 5]
        results = list(p.run(range(8), return_exceptions=True))
        assert isinstance(results[5], ValueError)
        assert results[:5] == [0, -1, -2, -3, -4] and results[6:] == [-6, -7]
        gen = p.run(range(8))
        assert [next(gen) for _ in range(5)] == [0, -1, -2, -3, -4]
        with pytest.raises(ValueError):
            next(gen)
        assert p.submit(1).result(5) == -1  # still running
    stats = {s.name: s for s in p.stats()}
    assert stats["fragile"].errors == 3
    assert stats["last"].items == stats["fragile"].items - 3  # failed items skip the later stages


@pytest.mark.timeout(30)
def test_queues_are_bounded():
    gate = threading.Event()
    seen = []

    def first(x):
        seen.append(x)
        return x

    def blocked(x):
        assert gate.wait(10)
        return x

    p = hybrid.Pipeline(queue_size=2)
    p.add_stage(first).add_stage(blocked)
    feeder = threading.Thread(target=lambda: [p.submit(i) for i in range(50)], daemon=True)
    feeder.start()
    # the pipeline fills up, then stops: 1 in `blocked`, 2 queued before it, 1 in hand of `first`'s worker, and
    # 2 in `first`'s queue (the feeder waits for room)
    wait_for(lambda: len(seen) == 4 and p.stats()[0].queued == 2, "the pipeline to fill up")
    with pytest.raises(RunError) as info:
        p.submit("extra", timeout=0.05)  # (no room can come while `blocked` waits: the timeout is the caller's)
    assert info.value.code == "HYB-412"
    assert len(seen) == 4  # bounded: no more went in meanwhile
    gate.set()
    feeder.join(10)
    p.close(timeout=10)
    assert len(seen) == 50


@pytest.mark.timeout(30)
def test_close_drains_then_rejects():
    p = hybrid.Pipeline()
    p.add_stage(lambda x: x).add_stage(lambda x: x * 2)
    futures = [p.submit(i) for i in range(20)]
    p.close()
    assert all(f.done() for f in futures)
    assert [f.result() for f in futures] == [2 * i for i in range(20)]
    with pytest.raises(RunError) as info:
        p.submit(1)
    assert info.value.code == "HYB-415"
    p.close()  # closing twice is harmless


@pytest.mark.timeout(30)
def test_cancelled_item_is_skipped():
    gate = threading.Event()
    ran = []
    p = hybrid.Pipeline(queue_size=4)
    p.add_stage(lambda x: (gate.wait(10), ran.append(x), x)[2])
    first = p.submit("first")
    doomed = p.submit("doomed")
    assert doomed.cancel()
    gate.set()
    assert first.result(5) == "first"
    p.close()
    assert ran == ["first"]


@pytest.mark.timeout(30)
def test_absent_device_follows_the_fallback_policy(caplog):
    p = hybrid.Pipeline()
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        p.add_stage(lambda x: x, device="cuda:3", name="gpu-stage")
    assert "not present" in caplog.text and "cuda:3" in caplog.text
    assert p.stats()[0].device == "cpu"
    p.add_stage(lambda x: x, device=None, name="default")
    assert p.stats()[1].device == "cpu"
    p.close()

    hybrid.init({"device_fallback": "error"})
    with pytest.raises(BackendError) as info:
        hybrid.Pipeline().add_stage(lambda x: x, device="npu")
    assert info.value.code == "HYB-307" and "cpu" in info.value.message
    with pytest.raises(BackendError) as info:
        hybrid.Pipeline().add_stage(lambda x: x, device="tpu")
    assert info.value.code == "HYB-301"


@pytest.mark.timeout(30)
def test_misuse_is_reported():
    with pytest.raises(ConfigError, match="HYB-102"):
        hybrid.Pipeline().submit(1)
    with pytest.raises(ConfigError, match="HYB-102"):
        hybrid.Pipeline().add_stage("not callable")
    with pytest.raises(ConfigError, match="HYB-102"):
        hybrid.Pipeline().add_stage(lambda x: x, workers=0)
    with pytest.raises(ConfigError, match="HYB-102"):
        hybrid.Pipeline(queue_size=0)
    p = hybrid.Pipeline().add_stage(lambda x: x)
    assert p.submit(1).result(5) == 1
    with pytest.raises(ConfigError, match="already started"):
        p.add_stage(lambda x: x)
    p.close()


@pytest.mark.timeout(60)
def test_compiled_model_as_a_stage(light):
    import numpy as np

    # random weights: real logits, so the class is decided by the model (the shipped SqueezeNet's softmax
    # over equal logits of ~9.5e9 is decided by the machine's rounding)
    cm = hybrid.compile(light.light_model_with_random_weights("squeezenet"), "onnxruntime")
    x = light.light_input()
    with hybrid.Pipeline() as p:
        p.add_stage(lambda a: a * 1.0, name="pre").add_stage(cm, name="model").add_stage(np.argmax, name="post")
        out = list(p.run([x] * 3))
    assert out == [int(np.argmax(cm(x)))] * 3


@pytest.mark.timeout(30)
def test_stage_times_and_utilization_on_the_pipeline_s_clock():
    clock = ScriptedClock()

    def slow(x):  # 10 ms of the pipeline's clock per item
        clock.advance(0.01)
        return x

    p = hybrid.Pipeline(clock=clock)
    p.add_stage(slow, name="slow").add_stage(lambda x: x, name="fast")
    assert list(p.run(range(10))) == list(range(10))
    p.close(timeout=10)
    slow_stats, fast_stats = p.stats()
    assert slow_stats.items == 10 and slow_stats.busy_s == pytest.approx(0.1)
    assert slow_stats.mean_time_s == pytest.approx(0.01)
    assert slow_stats.utilization == pytest.approx(1.0)  # the clock moved only while `slow` ran
    assert fast_stats.items == 10  # (its times may overlap the slow stage's clock moves: not asserted)
