"""Issue 50: a served model runs as many batches at once as the layout serving it has replicas.

The runner count follows the most replicas among the layouts serving the buckets called lately (read after a batch),
runs more for a probe while requests queue behind busy runners and the model still tunes (so that the tuner sees the
load; again at every race under a backlog), and settles back;
``--concurrency`` and a ``config.pbtxt``'s ``instance_group`` win. The statistics and metrics name the layout.
Every rule is tested on scripted time or on batch counts (a poll every batch), with a fake live executable whose
serving view reports the replicas.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tests._scripted_time import ScriptedClock
from tests._serve_support import request

from hybrid.hal.backend import Executable
from hybrid.hal.layout import ReplicaPool
from hybrid.runtime.auto.status import BucketTuning
from hybrid.runtime.compiled import CompiledModel, ServingView
from hybrid.runtime.compiler import compile_model
from hybrid.serve import BackgroundServer, BatchSettings, ServedModel, create_app
from hybrid.serve.core.repository import ModelRegistry
from hybrid.serve.core.runners import Lately, RunnerPolicy, Runners, Serving, serving_now

pytestmark = pytest.mark.timeout(120)

EVERY_BATCH = RunnerPolicy(poll_s=0.0)  # what serves is read after every batch: the tests count batches, not seconds


def relu_model(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


class Counting(Executable):
    """A replica: runs the real executable and counts the calls in flight at once (the most it saw).

    With ``meet``, a call waits (up to 30 s) until another call is in flight beside it, so that a test sees
    batches overlap whatever the machine's speed.
    """

    def __init__(self, exe: Executable, tally: dict[str, int], lock: threading.Lock,
                 meet: threading.Event | None = None) -> None:
        self.exe, self.tally, self.lock, self.meet = exe, tally, lock, meet
        self.input_names, self.output_names = exe.input_names, exe.output_names

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        with self.lock:
            self.tally["now"] += 1
            self.tally["most"] = max(self.tally["most"], self.tally["now"])
            if self.meet is not None and self.tally["now"] >= 2:
                self.meet.set()
        try:
            if self.meet is not None:
                self.meet.wait(30)
            return self.exe.run(feeds)
        finally:
            with self.lock:
                self.tally["now"] -= 1


class FakeLive:
    """A live executable (``target='auto'`` tuning online) whose serving candidate the test sets.

    Its calls run on what serves now: the plain executable or a :class:`ReplicaPool` of replicas of it.
    """

    def __init__(self, cm: CompiledModel) -> None:
        self.base = cm
        self.lock = threading.Lock()
        self.tally = {"now": 0, "most": 0}
        self.state, self.recheck_at_s = "decided", None
        self.serve("onnxruntime:cpu", 1)
        self.calls = 0

    def serve(self, label: str, replicas: int) -> None:
        self.tally.update(now=0, most=0)
        self.label = label
        self.replicas = [Counting(self.base.executable, self.tally, self.lock) for _ in range(replicas)]
        self.exe = ReplicaPool(self.replicas) if replicas > 1 else self.replicas[0]

    def meet(self) -> threading.Event:
        """From now on a call waits until another runs beside it (set once one does)."""
        met = threading.Event()
        for r in self.replicas:
            r.meet = met
        return met

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        self.calls += 1
        return self.exe.run(feeds)

    def view(self) -> ServingView:
        return ServingView("onnxruntime", "cpu", {}, self.base.plan, self.exe)

    def serving_for(self, feeds: Mapping[str, Any]) -> ServingView:
        return self.view()

    def status(self) -> tuple[BucketTuning, ...]:
        return (BucketTuning("x: Nx4", (("x", (8, 4)),), self.state, self.state, self.label, self.calls, None, None,
                             recheck_at_s=self.recheck_at_s),)

    def tune(self, samples, timeout_s=None, run=None):
        return self.status()

    def freeze(self):
        return self.status()

    def close(self) -> None:
        self.base.close()


def live_model(tmp_path, **settings):
    base = compile_model(relu_model(tmp_path / "relu.onnx"), target="onnxruntime")
    live = FakeLive(base)
    cm = CompiledModel(base.model, live, base.plan, "onnxruntime", "cpu", target="auto")
    model = ServedModel("m", "1", cm, BatchSettings(max_batch=4, batch_timeout=0.0, **settings),
                        runner_policy=EVERY_BATCH)
    return model, live


async def requesters(model, n=16, each=12, seed=0):
    """``n`` concurrent requesters, each sending ``each`` requests one after the other; every answer checked."""
    rng = np.random.default_rng(seed)

    async def one(i):
        for _ in range(each):
            x = rng.standard_normal((1 + i % 2, 4)).astype(np.float32)
            out = await model.infer({"x": x})
            np.testing.assert_array_equal(out["y"], np.maximum(x, 0))  # its own answer, not a neighbour's
        return each

    return sum(await asyncio.gather(*(one(i) for i in range(n))))


def test_runners_grow_to_the_replicas_and_shrink_back_without_losing_or_misrouting_a_request(tmp_path):
    model, live = live_model(tmp_path)

    async def scenario():
        assert model.runners == 1
        assert await requesters(model) == 16 * 12
        assert live.tally["most"] == 1  # one runner: one batch at a time
        live.serve("onnxruntime:cpu@4x1", 4)  # the tuner decided a layout of 4 replicas
        await model.infer({"x": np.ones((1, 4), np.float32)})  # a batch ends: what serves is read
        assert model.runners == 4 and model._batcher.runners == 4
        meet = live.meet()
        assert await requesters(model, seed=1) == 16 * 12
        assert meet.is_set() and live.tally["most"] >= 2  # batches ran side by side on the replicas
        live.serve("onnxruntime:cpu", 1)  # back to the default layout
        await model.infer({"x": np.ones((1, 4), np.float32)})
        assert model.runners == 1 and model._batcher.runners == 1
        assert await requesters(model, seed=2) == 16 * 12
        assert live.tally["most"] == 1  # the runners past the count ended: one batch at a time again

    try:
        asyncio.run(scenario())
        assert model.report()["layout"] == "default" and model.report()["runners"] == 1
    finally:
        model.close()


def test_concurrency_set_by_the_user_wins_over_the_layout(tmp_path):
    model, live = live_model(tmp_path, concurrency=1)

    async def scenario():
        live.serve("onnxruntime:cpu@4x1", 4)
        await model.infer({"x": np.ones((1, 4), np.float32)})
        assert await requesters(model) == 16 * 12
        assert model.runners == 1 and model._batcher.runners == 1 and live.tally["most"] == 1

    try:
        asyncio.run(scenario())
        assert model.serving_layout()["runners_by"] == "settings"
    finally:
        model.close()


def test_an_instance_group_count_in_config_pbtxt_wins_over_the_layout(tmp_path):
    from tests.test_serve_triton import TINY_IO, repo_with

    from hybrid.serve import build_registry

    repo = repo_with(tmp_path, "max_batch_size: 8\ndynamic_batching { }\ninstance_group [ { count: 3 } ]\n" + TINY_IO)
    registry = build_registry([repo], target="onnxruntime")
    try:
        model = registry.get("tiny")
        assert model.settings.concurrency == 3 and model.runners == 3
        assert model._runners.after_batch(True) == 3  # a backlog moves nothing the configuration set
        assert model.serving_layout()["runners_by"] == "settings"
    finally:
        registry.close()


def test_a_model_without_a_concurrency_runs_one_runner_per_replica_of_a_plain_executable(tmp_path):
    model = ServedModel("m", "1", compile_model(relu_model(tmp_path / "r.onnx"), target="onnxruntime"),
                        BatchSettings(max_batch=4))
    try:
        assert model.settings.concurrency is None and model.runners == 1
        assert model.serving_layout() == {"layout": "default", "serving": "", "replicas": 1, "runners": 1,
                                          "runners_by": "layout"}
    finally:
        model.close()


def test_serving_now_reads_the_busiest_buckets_layout_and_whether_the_tuner_may_still_change_it(tmp_path):
    model, live = live_model(tmp_path)
    try:
        live.serve("onnxruntime:cpu@2x1", 2)
        live.state, live.recheck_at_s = "decided", None
        assert serving_now(model.compiled) == Serving("onnxruntime:cpu@2x1", "2x1", 2, False, False)
        live.recheck_at_s = 60.0
        assert serving_now(model.compiled).tuning and not serving_now(model.compiled).deciding
        live.state = "tuning"
        assert serving_now(model.compiled).deciding
    finally:
        model.close()


# ---------------------------------------------------------------------------------------------- the probe, scripted
class Script:
    """What serves, as the test scripts it."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    def __call__(self, compiled: Any) -> Serving:
        return self.serving


POLICY = RunnerPolicy(poll_s=1.0, backlog_share=0.5, probe_s=30.0)


def batches(runners, clock, n, waited, step=0.1):
    """``n`` batches ``step`` s apart, each ending with requests waiting (``waited``) or not; the last count."""
    count = runners.count
    for _ in range(n):
        clock.advance(step)
        count = runners.after_batch(waited)
    return count


def test_a_backlog_while_the_model_tunes_runs_a_probe_of_the_cores_then_settles_to_the_replicas():
    clock = ScriptedClock()
    script = Script(Serving("ort:cpu", "", 1, deciding=False, tuning=True))
    runners = Runners(None, "m:1", None, cores=4, policy=POLICY, clock=clock, read=script)
    assert runners.count == 1
    assert batches(runners, clock, 20, waited=True) == 4 and runners.probing  # requests queue: the probe
    assert runners.report()["runners_by"] == "probe"
    clock.advance(30.0)
    assert batches(runners, clock, 20, waited=True) == 1  # the probe is over, nothing was being decided
    clock.advance(300.0)
    assert batches(runners, clock, 20, waited=True) == 1  # once per serving candidate
    script.serving = Serving("ort:cpu@2x1", "2x1", 2, deciding=False, tuning=True)  # the tuner decided a layout
    assert batches(runners, clock, 20, waited=True) == 2 and not runners.probing
    assert runners.report() == {"layout": "2x1", "serving": "ort:cpu@2x1", "replicas": 2, "runners": 2,
                                "runners_by": "layout"}


def test_the_probe_lasts_while_the_bucket_is_decided_and_a_probe_after_whatever_the_backlog_does():
    clock = ScriptedClock()
    script = Script(Serving("ort:cpu", "", 1, deciding=True, tuning=True))
    runners = Runners(None, "m:1", None, cores=4, policy=POLICY, clock=clock, read=script)
    assert batches(runners, clock, 20, waited=True) == 4
    clock.advance(60.0)
    assert batches(runners, clock, 20, waited=True) == 4  # past probe_s, but its race is still on
    assert batches(runners, clock, 20, waited=False) == 4  # its runners absorb the backlog: the probe goes on
    script.serving = Serving("ort:cpu@2x1", "2x1", 2, deciding=False, tuning=False)
    assert batches(runners, clock, 20, waited=True) == 4  # a probe after the decision: the tuner's load windows
    clock.advance(30.0)
    assert batches(runners, clock, 20, waited=True) == 2


def test_a_lone_caller_or_a_model_that_no_longer_tunes_gets_no_probe():
    clock = ScriptedClock()
    script = Script(Serving("ort:cpu", "", 1, deciding=True, tuning=True))
    runners = Runners(None, "m:1", None, cores=4, policy=POLICY, clock=clock, read=script)
    assert batches(runners, clock, 50, waited=False) == 1  # a lone caller never leaves a request waiting
    script.serving = Serving("ort:cpu", "", 1, deciding=False, tuning=False)  # decided, nothing planned (frozen)
    assert batches(runners, clock, 50, waited=True) == 1


def test_the_backlog_is_the_share_of_batches_that_ended_with_requests_waiting():
    clock = ScriptedClock()
    script = Script(Serving("ort:cpu", "", 1, deciding=True, tuning=True))
    runners = Runners(None, "m:1", None, cores=3, policy=POLICY, clock=clock, read=script)
    for _ in range(30):  # one batch in three found requests waiting: less than backlog_share
        for waited in (True, False, False):
            clock.advance(0.1)
            runners.after_batch(waited)
    assert runners.count == 1
    for _ in range(30):  # two in three: a backlog
        for waited in (True, True, False):
            clock.advance(0.1)
            runners.after_batch(waited)
    assert runners.count == 3


def test_the_runners_are_read_at_most_once_a_poll():
    clock = ScriptedClock()
    reads = []

    def read(compiled):
        reads.append(clock())
        return Serving("ort:cpu@2x1", "2x1", 2)

    runners = Runners(None, "m:1", None, cores=2, policy=POLICY, clock=clock, read=read)
    assert len(reads) == 1 and runners.count == 2
    batches(runners, clock, 20, waited=False, step=0.25)  # 5 s of batches
    assert len(reads) == 1 + 5


def test_a_failed_read_keeps_the_runners(caplog):
    clock = ScriptedClock()
    script = Script(Serving("ort:cpu@2x1", "2x1", 2))
    runners = Runners(None, "m:1", None, cores=2, policy=POLICY, clock=clock, read=script)

    def broken(compiled):
        raise RuntimeError("gone")

    runners._read = broken
    assert batches(runners, clock, 30, waited=True) == 2


def test_a_change_of_layout_is_logged_once(caplog):
    clock = ScriptedClock()
    script = Script(Serving("ort:cpu", "", 1))
    runners = Runners(None, "m:1", None, cores=2, policy=POLICY, clock=clock, read=script)
    script.serving = Serving("ort:cpu@2x1", "2x1", 2)
    with caplog.at_level(logging.INFO, logger="hybrid.serve"):
        batches(runners, clock, 50, waited=False)
    lines = [r.getMessage() for r in caplog.records if "layout 2x1" in r.getMessage()]
    assert lines == ["model m:1: served by ort:cpu@2x1 (layout 2x1, 2 replicas): 2 runners (one per replica)"]


# ---------------------------------------------------------------------------------------------- what the server says
def test_statistics_and_metrics_name_the_layout_serving_and_the_runners(tmp_path):
    model, live = live_model(tmp_path)
    live.serve("onnxruntime:cpu@2x1", 2)
    with BackgroundServer(create_app(ModelRegistry([model]))) as server:
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, -2, 3, -4]}]})
        status, _, answer = request(server.url, "POST", "/v2/models/m/infer", body.encode())
        assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1, 0, 3, 0]
        stats = json.loads(request(server.url, "GET", "/v2/models/m/stats")[2])["model_stats"][0]["pyasc"]
        assert (stats["layout"], stats["replicas"], stats["runners"]) == ("2x1", 2, 2)
        assert stats["serving"] == "onnxruntime:cpu@2x1" and stats["runners_by"] == "layout"
        metrics = request(server.url, "GET", "/metrics")[2].decode()
        assert re.search(r'^pyasc_model_runners\{layout="2x1",model="m",version="1"\} 2\.0$', metrics, re.M)


# ---------------------------------------------------------------------------------------------- the batcher alone
def test_the_batcher_resized_after_every_batch_loses_and_misroutes_nothing_and_ends_the_runners_past_its_count():
    """Under 16 concurrent requesters the sizer swings the runners between 4 and 1 after every batch: each request
    gets its own answer, never more batches run at once than the most runners asked for, and the threads past
    the last count end."""
    from hybrid.serve.core.batcher import LoopBatcher

    lock, tally, sizes = threading.Lock(), {"now": 0, "most": 0}, []

    def execute(items):
        with lock:
            tally["now"] += 1
            tally["most"] = max(tally["most"], tally["now"])
        try:
            return [3 * x + 1 for x in items]
        finally:
            with lock:
                tally["now"] -= 1

    def sizer(waited):
        sizes.append(4 if len(sizes) % 2 == 0 else 1)
        return sizes[-1]

    batcher = LoopBatcher(lambda items: list(items), execute, lambda items, job, raw, started, run_s: raw,
                          max_batch=3, sizer=sizer, name="swing")

    async def scenario():
        async def one(i):
            for k in range(25):
                x = 1000 * i + k
                assert await batcher.acall(x, timeout=60) == 3 * x + 1
        await asyncio.gather(*(one(i) for i in range(16)))

    try:
        asyncio.run(scenario())
        assert len(sizes) >= 16 * 25 // 3 and tally["most"] <= 4 + 1  # (a full batch may be joined ahead)
    finally:
        batcher.close(timeout=30)
    assert batcher.runners == sizes[-1] and not any(t.is_alive() for t in batcher._threads)


def test_a_sizer_that_fails_leaves_no_caller_without_its_answer():
    from hybrid.serve.core.batcher import LoopBatcher

    def sizer(waited):
        raise RuntimeError("broken sizer")

    batcher = LoopBatcher(lambda items: list(items), lambda items: [x + 1 for x in items],
                          lambda items, job, raw, started, run_s: raw, max_batch=4, sizer=sizer, name="broken")

    async def scenario():
        return await asyncio.gather(*(batcher.acall(i, timeout=60) for i in range(16)))

    try:
        assert asyncio.run(scenario()) == [i + 1 for i in range(16)]
        assert batcher.runners == 1
    finally:
        batcher.close(timeout=30)


def test_a_full_batch_joined_ahead_of_a_busy_runner_counts_as_requests_waiting():
    """Under closed-loop load the requests that came during a batch are joined ahead as a full batch, so the queue
    is empty when the batch ends: they still waited for a runner (the backlog the probe answers)."""
    from hybrid.serve.core.batcher import LoopBatcher

    release, told = threading.Event(), []

    def execute(items):
        if items == [0]:
            release.wait(30)
        return [x + 1 for x in items]

    def sizer(waited):
        told.append(waited)
        return 1

    batcher = LoopBatcher(lambda items: list(items), execute, lambda items, job, raw, started, run_s: raw,
                          max_batch=8, sizer=sizer, name="ahead")

    async def scenario():
        first = asyncio.ensure_future(batcher.acall(0, timeout=60))
        while batcher.stats().running < 1:
            await asyncio.sleep(0)  # one loop turn: the lone request goes to the runner
        rest = [asyncio.ensure_future(batcher.acall(i, timeout=60)) for i in range(1, 9)]
        await asyncio.sleep(0)
        assert batcher.stats().queued == 8 and not batcher._queue  # a full batch, joined ahead of the busy runner
        release.set()
        return [await first, *await asyncio.gather(*rest)]

    try:
        assert asyncio.run(scenario()) == list(range(1, 10))
        assert told == [True, False]  # the first batch ended with 8 requests waiting, the second with none
    finally:
        batcher.close(timeout=30)


def _two_replica_layout(monkeypatch):
    """The tag of a 2-replica layout onnxruntime declares for 2 cores (any machine), else the test skips."""
    from hybrid.hal.registry import get_backend
    from hybrid.serve.core import runners as runners_module

    monkeypatch.setattr(runners_module, "usable_cores", lambda: 2)  # the layouts declared for 2 cores, any machine
    two = next((lay for lay in get_backend("onnxruntime").layouts("cpu", 2) if lay.replicas == 2), None)
    if two is None:  # the layouts a backend declares are its own; this one's are asked for 2 cores
        pytest.skip("onnxruntime declares no 2-replica layout")
    return two.tag


def _compiled_with_buckets(*buckets):
    """A stand-in compiled model whose ``cm.tuning`` holds ``(key, calls, serving[, state])`` buckets."""
    from types import SimpleNamespace

    class Live:
        def view(self):
            return SimpleNamespace(replicas=1)  # the 1-row bucket's candidate: the most calls in all

        def serving_for(self, feeds):
            return self.view()

        def status(self):
            return ()

        def tune(self, samples, timeout_s=None, run=None):
            return ()

        def freeze(self):
            return ()

    compiled = SimpleNamespace(executable=Live())

    def set_buckets(*bs):
        compiled.tuning = tuple(SimpleNamespace(key=b[0], calls=b[1], serving=b[2],
                                                state=b[3] if len(b) > 3 else "decided", recheck_at_s=None)
                                for b in bs)

    set_buckets(*buckets)
    return compiled, set_buckets


def test_the_runners_follow_the_most_replicas_among_the_buckets_called_lately(monkeypatch):
    """A server's 1-row bucket has the most calls in all (every lone client's requests), yet under 16 clients the
    8-row batches run too: their candidate's replicas are the runners (vs_triton crnn, 16 clients: the 8-row bucket
    served as 2 sessions x 1 thread ran on one runner, one replica idle). A bucket no longer called, once its
    window has passed, does not count."""
    tag = _two_replica_layout(monkeypatch)
    compiled, set_buckets = _compiled_with_buckets(("1", 5000, "onnxruntime:cpu"),
                                                   ("8", 400, f"onnxruntime:cpu@{tag}"))
    clock = ScriptedClock()
    lately = Lately(5.0, clock)
    first = serving_now(compiled, lately)  # the first read: every call is recent
    assert (first.label, first.layout, first.replicas) == (f"onnxruntime:cpu@{tag}", tag, 2)
    clock.advance(0.5)
    set_buckets(("1", 5010, "onnxruntime:cpu"), ("8", 700, f"onnxruntime:cpu@{tag}"))
    assert serving_now(compiled, lately).replicas == 2
    clock.advance(4.0)
    set_buckets(("1", 5200, "onnxruntime:cpu"), ("8", 700, f"onnxruntime:cpu@{tag}"))  # 8-row batches stopped
    assert serving_now(compiled, lately).replicas == 2  # within the window of its last call
    clock.advance(1.5)
    set_buckets(("1", 5300, "onnxruntime:cpu"), ("8", 700, f"onnxruntime:cpu@{tag}"))
    now = serving_now(compiled, lately)
    assert (now.label, now.replicas) == ("onnxruntime:cpu", 1)
    clock.advance(60.0)
    assert serving_now(compiled, lately).replicas == 2  # nothing called lately: every bucket counts, as without it
    assert serving_now(compiled).replicas == 2


def test_the_runners_hold_still_while_the_buckets_called_come_and_go_between_polls(monkeypatch):
    """At 4 clients the 2- and 4-row buckets see a call only now and then: a poll of 0.5 s finds the 2x1 bucket called
    in one read and not in the next. The runners stay at its replicas while it was called within the window. Before,
    they followed the busiest bucket and switched 1, 2, 1, 2 (the served crnn's log), and so did a window of one
    poll, so each bucket's race timed its candidates at a mix of one and two batches at once."""
    tag = _two_replica_layout(monkeypatch)
    compiled, set_buckets = _compiled_with_buckets(("1", 0, "onnxruntime:cpu"), ("2", 0, f"onnxruntime:cpu@{tag}"))
    clock = ScriptedClock()
    lately = Lately(5.0, clock)
    ones, twos, counts = 1000, 0, []  # the 1-row bucket keeps the most calls in all (the stand-in's view)
    for poll in range(8):
        clock.advance(0.5)
        ones, twos = ones + 20, twos + (3 if poll % 2 else 0)  # the 2-row bucket called in every other poll
        set_buckets(("1", ones, "onnxruntime:cpu"), ("2", twos, f"onnxruntime:cpu@{tag}"))
        counts.append(serving_now(compiled, lately).replicas)
    assert counts[1:] == [2] * 7


def test_a_bucket_called_lately_that_is_being_decided_makes_the_model_deciding(monkeypatch):
    tag = _two_replica_layout(monkeypatch)
    compiled, set_buckets = _compiled_with_buckets(("1", 50, "onnxruntime:cpu", "tuning"),
                                                   ("8", 40, f"onnxruntime:cpu@{tag}"))
    clock = ScriptedClock()
    lately = Lately(5.0, clock)
    now = serving_now(compiled, lately)
    assert now.replicas == 2 and now.deciding and now.tuning
    clock.advance(10.0)
    set_buckets(("1", 50, "onnxruntime:cpu", "tuning"), ("8", 90, f"onnxruntime:cpu@{tag}"))  # only 8 called
    now = serving_now(compiled, lately)
    assert not now.deciding and not now.tuning


def test_a_race_under_a_backlog_runs_a_probe_again_a_planned_re_check_alone_does_not():
    """A re-check races the serving candidate's layouts again; with one runner (its default layout settled there)
    they would race at one batch at a time, however many requests wait, and the default wins every time (the served
    crnn: every bucket back on the default after its re-checks). Before, a probe ran once per serving candidate."""
    clock = ScriptedClock()
    script = Script(Serving("ort:cpu", "", 1, deciding=True, tuning=True))
    runners = Runners(None, "m:1", None, cores=4, policy=POLICY, clock=clock, read=script)
    assert batches(runners, clock, 20, waited=True) == 4  # the first race's probe
    script.serving = Serving("ort:cpu", "", 1, deciding=False, tuning=True)  # decided, a re-check planned
    clock.advance(31.0)
    assert batches(runners, clock, 20, waited=True) == 1  # the probe ran its course after the decision
    clock.advance(60.0)
    assert batches(runners, clock, 20, waited=True) == 1  # a planned re-check alone: no probe again
    script.serving = Serving("ort:cpu", "", 1, deciding=True, tuning=True)  # the re-check races
    assert batches(runners, clock, 20, waited=True) == 4 and runners.probing
    script.serving = Serving("ort:cpu", "", 1, deciding=False, tuning=True)
    clock.advance(31.0)
    assert batches(runners, clock, 20, waited=True) == 1


def test_a_one_executable_layout_decided_during_the_probe_keeps_the_probe_s_runners():
    """OpenVINO's throughput hint is one executable that takes several calls at once: decided while the probe ran
    2 runners, it was measured at 2; one runner after the probe would leave its streams idle (vs_triton crnn at
    4 clients: x0.72 of Triton's best with its bucket on openvino:cpu@throughput and one runner)."""
    clock = ScriptedClock()
    script = Script(Serving("ov:cpu", "", 1, deciding=True, tuning=True))
    runners = Runners(None, "m:1", None, cores=2, policy=POLICY, clock=clock, read=script)
    assert batches(runners, clock, 20, waited=True) == 2  # the probe
    script.serving = Serving("ov:cpu@throughput", "throughput", 1, deciding=False, tuning=False)
    assert batches(runners, clock, 20, waited=True) == 2
    clock.advance(60.0)
    assert batches(runners, clock, 20, waited=False) == 2 and not runners.probing  # kept after the probe
    script.serving = Serving("ov:cpu", "", 1, deciding=False, tuning=False)  # the default: one runner again
    assert batches(runners, clock, 20, waited=False) == 1


def test_the_free_batch_blocks_kept_follow_the_runners(tmp_path):
    """A probe runs one batch per core; once it settles, the blocks kept for batches in flight shrink with it (a
    many-core server would otherwise hold a probe's worth of batch memory for good)."""
    model = ServedModel("m", "1", compile_model(relu_model(tmp_path / "r.onnx"), target="onnxruntime"),
                        BatchSettings(max_batch=4))
    try:
        clock = ScriptedClock()
        script = Script(Serving("ort:cpu", "", 1, deciding=False, tuning=True))
        model._runners = Runners(None, "m:1", None, cores=16, policy=POLICY, clock=clock, read=script)
        assert model._buffers.keep == 3  # one runner, one batch joined ahead, one ending
        for _ in range(20):
            clock.advance(0.1)
            model._size_runners(True)  # requests queue behind the runner while it tunes: the probe
        assert model._runners.count == 16 and model._buffers.keep == 18
        clock.advance(60.0)
        for _ in range(20):
            clock.advance(0.1)
            model._size_runners(False)
        assert model._runners.count == 1 and model._buffers.keep == 3
    finally:
        model.close()
