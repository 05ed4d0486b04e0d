"""Dynamic batching on the server: how requests are joined and split, and the bounded loopback load test
(32 concurrent clients x 100 requests, zero errors, every response matches its own request)."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import os
import re
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tests._scripted_time import ScriptedClock
from tests._serve_support import request, tiny_expected, tiny_model, wait_for

from hybrid.runtime.compiler import compile_model
from hybrid.runtime.traffic.batching import Batcher
from hybrid.serve import BackgroundServer, BatchSettings, ServedModel, build_registry, create_app

pytestmark = pytest.mark.timeout(300)


def relu_model(path, shape):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def served(path, **settings):
    batches = []
    model = ServedModel("m", "1", compile_model(path, target="onnxruntime"), BatchSettings(**settings),
                        observer=lambda m, size, waits, run_s: batches.append(size))
    return model, batches


async def infer_all(model, requests):
    return await asyncio.gather(*(model.infer(r) for r in requests))


async def infer_while_busy(model, requests):
    """Run a first request whose batch blocks until every one of ``requests`` is queued behind it: the
    requests then join one batch (a lone request on an idle model runs at once)."""
    release = threading.Event()
    run = model.compiled.run_checked
    first = [True]

    def held(feeds):
        if first[0]:
            first[0] = False
            release.wait(60)
        return run(feeds)

    model.compiled.run_checked = held
    blocker = asyncio.ensure_future(model.infer(requests[0]))
    await asyncio.to_thread(wait_for, lambda: model._batcher.stats().running == 1, "the first batch runs")
    rest = [asyncio.ensure_future(model.infer(r)) for r in requests]
    await asyncio.to_thread(wait_for, lambda: model.queued == len(requests), "every request is queued")
    release.set()
    await blocker
    return await asyncio.gather(*rest)


def test_requests_join_by_inner_shape_and_split_by_their_own_rows(tmp_path, rng):
    model, batches = served(relu_model(tmp_path / "relu.onnx", ["N", "C"]), max_batch=8, batch_timeout=0.5)
    try:
        reqs = [{"x": rng.standard_normal((rows, cols)).astype(np.float32)}
                for rows, cols in [(1, 2), (3, 2), (2, 5), (1, 2), (4, 5), (2, 2), (1, 5), (2, 2)]]
        outs = asyncio.run(infer_while_busy(model, reqs))
        for r, out in zip(reqs, outs):
            np.testing.assert_array_equal(out["y"], np.maximum(r["x"], 0))
        assert batches == [1, 8]  # the blocker, then one batch of 8 requests run as two groups (C=2 and C=5)
    finally:
        model.close()


def test_answers_that_are_their_batch_input_keep_their_values_when_the_next_batch_is_joined(tmp_path, rng):
    # the reference backend answers an Identity graph with its input array itself: the joined block is the answer
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "same", [x], [y])
    path = tmp_path / "same.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    model = ServedModel("m", "1", compile_model(path, target="reference"),
                        BatchSettings(max_batch=4, batch_timeout=0.5))
    try:
        rounds = []
        for _ in range(3):
            reqs = [{"x": rng.standard_normal((1 + i % 2, 3)).astype(np.float32)} for i in range(5)]
            rounds.append((reqs, asyncio.run(infer_while_busy(model, reqs))))
        for reqs, outs in rounds:  # earlier rounds' answers too, after later batches were joined
            for r, out in zip(reqs, outs, strict=True):
                np.testing.assert_array_equal(out["y"], r["x"])
    finally:
        model.close()


def test_a_run_gets_its_arrays_aligned_and_other_feeds_as_they_are():
    from hybrid.serve.core.model import _aligned

    values = np.arange(6, dtype=np.float32)
    view = np.frombuffer(b"\x00" + values.tobytes(), np.float32, 6, offset=1)  # a tensor at an odd offset of a body
    aligned, words = values.reshape(2, 3), ["a", "b"]
    feeds = {"x": aligned, "s": words}
    assert _aligned(feeds) is feeds  # nothing to copy
    out = _aligned({"x": view, "y": aligned, "s": words})
    assert out["x"].flags.aligned and out["y"] is aligned and out["s"] is words
    np.testing.assert_array_equal(out["x"], values)


def test_static_batch_model_runs_a_batch_request_by_request(tmp_path, rng):
    model, batches = served(relu_model(tmp_path / "relu1.onnx", [1, 3]), max_batch=4, batch_timeout=0.5)
    try:
        assert model.batch_symbol is None
        reqs = [{"x": rng.standard_normal((1, 3)).astype(np.float32)} for _ in range(4)]
        for r, out in zip(reqs, asyncio.run(infer_while_busy(model, reqs))):
            np.testing.assert_array_equal(out["y"], np.maximum(r["x"], 0))
        assert batches == [1, 4]
    finally:
        model.close()


def test_a_bad_request_fails_alone(tmp_path, rng):
    model, _ = served(tiny_model(tmp_path / "tiny.onnx"), max_batch=8, batch_timeout=0.3)
    try:
        good = {"x": rng.standard_normal((2, 4)).astype(np.float32), "scale": np.ones((2, 1), np.float32)}
        bad = {"x": np.zeros((2, 4), np.float32)}

        async def both():
            return await asyncio.gather(model.infer(good), model.infer(bad), return_exceptions=True)

        ok, err = asyncio.run(both())
        np.testing.assert_allclose(ok["y"], tiny_expected(good["x"], good["scale"])["y"], rtol=1e-5, atol=1e-5)
        assert getattr(err, "code", None) == "HYB-401"
    finally:
        model.close()


def test_load_32_clients_x_100_requests_zero_errors_each_answer_its_own(tmp_path):
    import tritonclient.http as th

    registry = build_registry([tiny_model(tmp_path / "tiny.onnx")], target="onnxruntime",
                              overrides={"max_batch": 32, "batch_timeout": 0.002, "max_queue": 1024})
    clients, per_client = 32, 100
    with BackgroundServer(create_app(registry)) as srv:
        def client_run(cid: int) -> int:
            c = th.InferenceServerClient(srv.url, network_timeout=120.0)
            mismatches = 0
            try:
                for k in range(per_client):
                    seed = cid * per_client + k
                    rows = 1 + seed % 3
                    x = np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)
                    scale = np.full((rows, 1), float(seed), np.float32)  # the request id is in the data
                    inputs = [th.InferInput("x", [rows, 4], "FP32"), th.InferInput("scale", [rows, 1], "FP32")]
                    inputs[0].set_data_from_numpy(x, binary_data=k % 2 == 0)
                    inputs[1].set_data_from_numpy(scale, binary_data=True)
                    result = c.infer("tiny", inputs, request_id=str(seed))
                    want = tiny_expected(x, scale)
                    same = (result.get_response()["id"] == str(seed)
                            and np.allclose(result.as_numpy("y"), want["y"], rtol=1e-5, atol=1e-4)
                            and np.allclose(result.as_numpy("s"), want["s"], rtol=1e-5, atol=1e-5))
                    mismatches += not same
            finally:
                c.close()
            return mismatches

        with cf.ThreadPoolExecutor(clients) as pool:
            mismatches = list(pool.map(client_run, range(clients)))  # any HTTP error raises here
        assert sum(mismatches) == 0
        text = request(srv.url, "GET", "/metrics")[2].decode()
    total = clients * per_client
    assert re.search(rf'pyasc_inference_requests_total\{{model="tiny",version="1"\}} {total}\.0', text)
    assert "pyasc_inference_failures_total{" not in text
    count = float(re.search(r'pyasc_batch_size_count\{model="tiny",version="1"\} ([0-9.e+]+)', text).group(1))
    summed = float(re.search(r'pyasc_batch_size_sum\{model="tiny",version="1"\} ([0-9.e+]+)', text).group(1))
    assert summed == total and count < total  # some requests really shared a batch


@pytest.mark.timeout(120)
def test_batching_settings_come_from_the_bundle_manifest(tmp_path):
    from tests._models import matmul_add

    import hybrid
    from hybrid.bundle import save_bundle
    from hybrid.errors import BundleError
    from hybrid.serve.core.repository import discover, load_model

    cm = hybrid.compile(matmul_add(), target="onnxruntime")
    path = tmp_path / "mm.hybrid"
    save_bundle(cm, path, serving={"max_batch": 3, "batch_timeout": 0.02})
    (source,) = discover([str(path)])
    served = load_model(source)
    try:
        assert served.settings.max_batch == 3 and served.settings.batch_timeout == 0.02
        assert served.settings.max_queue == 256  # left unset in the bundle: the server's default
    finally:
        served.close()
    overridden = load_model(source, overrides={"max_batch": 5})
    try:
        assert overridden.settings.max_batch == 5  # the command line wins over the bundle
    finally:
        overridden.close()
    with pytest.raises(BundleError) as e:
        save_bundle(cm, tmp_path / "bad.hybrid", serving={"max_batch": -1})
    assert e.value.code == "HYB-502" and "max_batch" in e.value.message
    assert not (tmp_path / "bad.hybrid").exists()


def test_a_lone_request_on_an_idle_batcher_does_not_wait_for_its_batch_to_fill():
    seen = []
    batcher = Batcher(lambda items: seen.append(len(items)) or items, max_batch=8, timeout=3600,
                      dispatch_when_idle=True)
    try:
        for i in range(3):  # a batch that cannot form would hold each call for the hour-long timeout
            assert batcher(i, timeout=60) == i
        assert seen == [1, 1, 1]
    finally:
        batcher.close()


def test_what_queues_while_the_runner_is_busy_goes_as_one_batch_when_it_frees():
    release, started, seen = threading.Event(), threading.Event(), []

    def fn(items):
        seen.append(list(items))
        if len(seen) == 1:
            started.set()
            release.wait(60)
        return items

    batcher = Batcher(fn, max_batch=4, timeout=3600, dispatch_when_idle=True)
    try:
        first = batcher.submit("a")
        assert started.wait(60)
        later = [batcher.submit(x) for x in "bcdefg"]
        wait_for(lambda: batcher.stats().queued == 6, "six requests queued behind the running batch")
        release.set()
        assert first.result(60) == "a" and [f.result(60) for f in later] == list("bcdefg")
        assert seen == [["a"], ["b", "c", "d", "e"], ["f", "g"]]  # max_batch still bounds a batch
    finally:
        batcher.close()


def test_without_dispatch_when_idle_a_batch_waits_to_fill():
    seen = []
    batcher = Batcher(lambda items: seen.append(len(items)) or items, max_batch=3, timeout=3600)
    try:
        futures = [batcher.submit(i) for i in range(3)]  # only a full batch goes before the timeout
        assert [f.result(60) for f in futures] == [0, 1, 2] and seen == [3]
    finally:
        batcher.close()


# ---------------------------------------------------------------------------- the server's batcher (serve/batcher.py)
def loop_batcher(execute, **kw):
    from hybrid.serve.core.batcher import LoopBatcher

    seen = []

    def split(items, job, raw, started, run_s):
        seen.append(list(items))
        return [raw] * len(items) if isinstance(raw, Exception) else list(raw)

    return LoopBatcher(lambda items: list(items), execute, split, **kw), seen


def test_the_server_batcher_runs_a_lone_request_at_once_even_with_a_long_timeout():
    batcher, seen = loop_batcher(lambda job: job, max_batch=8, max_delay=3600)

    async def main():
        return [await batcher.acall(i, timeout=60) for i in range(3)]

    try:
        assert asyncio.run(main()) == [0, 1, 2] and seen == [[0], [1], [2]]
    finally:
        batcher.close()


def test_the_server_batcher_joins_what_queues_while_busy_and_bounds_it_by_max_batch():
    release, started = threading.Event(), threading.Event()

    def execute(job):
        if job == ["a"]:
            started.set()
            release.wait(60)
        return job

    batcher, seen = loop_batcher(execute, max_batch=4, max_delay=0)

    async def main():
        first = asyncio.ensure_future(batcher.acall("a"))
        await asyncio.to_thread(started.wait, 60)
        later = [asyncio.ensure_future(batcher.acall(x)) for x in "bcdefg"]
        await asyncio.sleep(0)  # one loop turn, not time: the calls reach the batcher
        assert batcher.stats().queued == 6  # b..e handed over as a full batch, not begun; f, g queued
        release.set()
        return await first, await asyncio.gather(*later)

    try:
        assert asyncio.run(main()) == ("a", list("bcdefg"))
        assert seen == [["a"], ["b", "c", "d", "e"], ["f", "g"]]
    finally:
        batcher.close()


def test_the_server_batcher_lets_a_batch_fill_to_what_came_together_within_the_timeout():
    clock = ScriptedClock()

    def execute(job):  # a batch takes 1 ms of the batcher's clock
        clock.advance(0.001)
        return job

    batcher, seen = loop_batcher(execute, max_batch=8, max_delay=3600.0, clock=clock)

    async def main():
        await asyncio.gather(*(batcher.acall(i) for i in range(4)))  # one runs at once, 3 queue -> it expects 4
        seen.clear()
        first = asyncio.ensure_future(batcher.acall("x"))  # alone on an idle runner: held for the others
        rest = [asyncio.ensure_future(batcher.acall(y)) for y in "yzw"]
        await asyncio.gather(first, *rest)
        joined = list(seen)
        seen.clear()
        # the others do not come: the hold runs out after a batch's time (1 ms), not max_delay (an hour)
        await batcher.acall("alone")
        return joined

    try:
        joined = asyncio.run(asyncio.wait_for(main(), 30))  # a hold of max_delay would outlast this
        assert joined == [["x", "y", "z", "w"]]  # "x" was held until the others came
        assert seen == [["alone"]]
    finally:
        batcher.close()


def test_the_server_batcher_times_out_a_queued_request_and_fails_a_bad_batch_alone():
    from hybrid.errors import RunError

    release, started = threading.Event(), threading.Event()

    def execute(job):
        if job == ["slow"]:
            started.set()
            release.wait(60)
        if "bad" in job:
            raise ValueError("broken")
        return job

    batcher, _ = loop_batcher(execute, max_batch=8, max_queue=1)

    async def main():
        slow = asyncio.ensure_future(batcher.acall("slow"))
        assert await asyncio.to_thread(started.wait, 60)
        with pytest.raises(RunError) as e:
            await batcher.acall("late", timeout=0.05)  # queued behind the slow batch
        assert e.value.code == "HYB-411" and "withdrawn" in e.value.message
        queued = asyncio.ensure_future(batcher.acall("q"))
        await asyncio.sleep(0)  # one loop turn, not time: "q" fills the queue
        with pytest.raises(RunError) as full:
            await batcher.acall("over")
        assert full.value.code == "HYB-412"
        release.set()
        assert await slow == "slow" and await queued == "q"
        with pytest.raises(ValueError):
            await batcher.acall("bad")

    try:
        asyncio.run(main())
        assert batcher.stats().queued == 0
    finally:
        batcher.close()


def _may_set_batch_policy() -> bool:
    """Whether a thread may put itself in SCHED_BATCH here (Linux allows it unprivileged; sandboxes may not)."""
    if not hasattr(os, "SCHED_BATCH"):
        return False
    ok = []

    def probe():
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return bool(ok)


def _compute_nice():
    from hybrid.serve.core.batcher import COMPUTE_NICE

    return min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + COMPUTE_NICE)


def _os_thread_name() -> str | None:
    """The calling thread's name in the OS (None where there is no per-thread name file)."""
    try:
        return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()
    except OSError:
        return None


@pytest.mark.skipif(not _may_set_batch_policy(), reason="no SCHED_BATCH for threads on this platform")
def test_a_model_loaded_from_the_batch_policy_front_end_builds_in_the_models_scheduling():
    """What in_compute_policy runs (a model load) and the threads it starts are in the normal policy, COMPUTE_NICE
    below the process, even when called from a SCHED_BATCH thread (the front end); its errors reach the caller,
    and the caller's own scheduling is unchanged."""
    from hybrid.serve.core.batcher import COMPUTE_THREAD_NAME, in_compute_policy

    seen = {}
    names = {}

    def load():
        seen["load"] = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
        names["load"] = _os_thread_name()
        pool = threading.Thread(target=lambda: (seen.__setitem__(
            "pool", (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))),
            names.__setitem__("pool", _os_thread_name())))
        pool.start()
        pool.join()
        return "loaded"

    def fail():
        raise ValueError("bad model")

    def front_end():
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        seen["front"] = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
        seen["result"] = in_compute_policy(load)
        with pytest.raises(ValueError, match="bad model"):
            in_compute_policy(fail)
        seen["front after"] = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
        names["front"] = _os_thread_name()

    base = os.getpriority(os.PRIO_PROCESS, 0)
    t = threading.Thread(target=front_end)
    t.start()
    t.join()
    compute = (os.SCHED_OTHER, _compute_nice())
    assert seen == {"front": (os.SCHED_BATCH, base), "load": compute, "pool": compute, "result": "loaded",
                    "front after": (os.SCHED_BATCH, base)}
    if names["front"] is not None:  # Linux: the load and the pool it starts carry the models' name, the caller not
        assert names == {"load": COMPUTE_THREAD_NAME, "pool": COMPUTE_THREAD_NAME, "front": names["front"]}
        assert names["front"] != COMPUTE_THREAD_NAME


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="no per-thread scheduling on this platform")
def test_the_batch_runner_computes_in_the_models_scheduling_whatever_its_creator_runs_in():
    """The runner thread of a batcher started from a SCHED_BATCH front end runs the model in the normal policy,
    COMPUTE_NICE below the process; the front end keeps its own."""
    seen = {}

    def execute(job):
        seen["runner"] = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
        return job

    batcher, _ = loop_batcher(execute, max_batch=4)

    def front_end():
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        seen["result"] = asyncio.run(batcher.acall("x"))
        seen["front"] = os.getpriority(os.PRIO_PROCESS, 0)

    base = os.getpriority(os.PRIO_PROCESS, 0)
    t = threading.Thread(target=front_end)
    t.start()
    t.join()
    batcher.close()
    assert seen == {"runner": (os.SCHED_OTHER, _compute_nice()), "result": "x", "front": base}
