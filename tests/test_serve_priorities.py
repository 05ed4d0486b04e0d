"""Triton's schedule policy on a served model: priority levels, a queue policy per level, ``timeout_action: DELAY``.

Each test holds the model's first batch in its runner, queues requests behind it and reads the order in which the
model then runs them (every batch holds one request: ``preferred_batch_size: [1]``); waits are on the server's
own state (what its queue holds), never on a fixed sleep.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
from collections.abc import Callable

import grpc
import numpy as np
import pytest
from google.protobuf import text_format
from tests._serve_support import error_of, request, tiny_expected, tiny_model, v2_json, wait_for
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from hybrid.errors import ServingError
from hybrid.serve import BackgroundServer, ServeOptions, build_registry, create_app
from hybrid.serve.triton.config import schedule_policy, settings_of
from hybrid.serve.triton.schedule import QueuePolicy, SchedulePolicy

pytestmark = pytest.mark.timeout(120)

_PBTXT = """name: "tiny"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [4] }}, {{ name: "scale" data_type: TYPE_FP32 dims: [1] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [3] }}, {{ name: "s" data_type: TYPE_FP32 dims: [1] }} ]
dynamic_batching {{ preferred_batch_size: [1] {batching} }}
"""


class _Held:
    """A server over ``tiny`` with ``batching`` in its config.pbtxt, whose first batch waits for :meth:`release`.

    ``ran`` lists the marker (``x[0, 0]``) of each request in the order the model ran them.
    """

    def __init__(self, root, batching: str) -> None:
        folder = root / "repo" / "tiny"
        (folder / "1").mkdir(parents=True)
        tiny_model(folder / "1" / "model.onnx")
        (folder / "config.pbtxt").write_text(_PBTXT.format(batching=batching))
        registry = build_registry([root / "repo"], target="onnxruntime")
        self.server = BackgroundServer(create_app(registry, ServeOptions(grpc_address="127.0.0.1:0"))).start()
        (self.model,) = list(registry)
        self.ran: list[float] = []
        self._entered, self._release = threading.Event(), threading.Event()
        run = self.model.compiled.run_checked

        def held(feeds):
            self.ran.extend(float(v) for v in feeds["x"][:, 0])
            if not self._entered.is_set():
                self._entered.set()
                self._release.wait(60)
            return run(feeds)

        self.model.compiled.run_checked = held
        self.pool = cf.ThreadPoolExecutor(8)

    def send(self, marker: float, priority: int | None = None) -> cf.Future:
        """Send a request marked ``marker``; once the first one runs, wait until the model's queue holds it."""
        queued = self.model.queued
        params = {} if priority is None else {"parameters": {"priority": priority}}
        future = self.pool.submit(request, self.server.url, "POST", "/v2/models/tiny/infer",
                                  v2_json(_feeds(marker), **params))
        if not self._entered.is_set():
            assert self._entered.wait(30), "the first request never reached the model"
        else:
            _until(lambda: self.model.queued > queued or future.done(), "the request to queue")
        return future

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self._release.set()
        self.pool.shutdown()
        self.server.stop()


def _until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    wait_for(condition, what, limit=timeout, every=0.005)


def _feeds(marker: float) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 4), marker, np.float32), "scale": np.ones((1, 1), np.float32)}


def _answered(future: cf.Future, marker: float) -> None:
    status, _, body = future.result(60)
    assert status == 200, body
    y = json.loads(body)["outputs"][0]["data"]
    np.testing.assert_allclose(y, tiny_expected(**_feeds(marker))["y"].reshape(-1), rtol=1e-5)


def test_higher_priorities_run_first_and_the_rest_in_order(tmp_path):
    held = _Held(tmp_path, "priority_levels: 2 default_priority_level: 2")
    try:
        sent = {0.0: held.send(0.0)}  # runs, and waits in the model
        for marker, priority in [(1.0, 2), (2.0, None), (3.0, 1), (4.0, 7), (5.0, 1), (6.0, 0)]:
            sent[marker] = held.send(marker, priority)  # 0 and 7 (no such level): the default level, 2
        held.release()
        for marker, future in sent.items():
            _answered(future, marker)
        assert held.ran == [0.0, 3.0, 5.0, 1.0, 2.0, 4.0, 6.0]
    finally:
        held.close()


def test_a_level_s_own_queue_bound(tmp_path):
    held = _Held(tmp_path, "priority_levels: 2 default_priority_level: 2 "
                           "priority_queue_policy { key: 1 value { max_queue_size: 1 } }")
    try:
        first, one = held.send(0.0), held.send(1.0, 1)
        status, _, body = held.pool.submit(request, held.server.url, "POST", "/v2/models/tiny/infer",
                                           v2_json(_feeds(2.0), parameters={"priority": 1})).result(60)
        assert status == 503 and error_of(body) == "HYB-705", body  # Triton: "Exceeds maximum queue size"
        assert b"Exceeds maximum queue size" in body and b"priority level 1" in body
        others = [held.send(m, 2) for m in (3.0, 4.0)]  # level 2 has no bound of its own
        held.release()
        for marker, future in zip((0.0, 1.0, 3.0, 4.0), (first, one, *others), strict=True):
            _answered(future, marker)
        assert held.ran == [0.0, 1.0, 3.0, 4.0]
    finally:
        held.close()


def test_a_delayed_request_waits_behind_those_still_in_time(tmp_path):
    # a second: the one sent in time must still be in time when the first batch ends, on a slow machine too
    held = _Held(tmp_path, "default_queue_policy { default_timeout_microseconds: 1000000 timeout_action: DELAY }")
    try:
        first, late = held.send(0.0), held.send(1.0)
        batcher = held.model._batcher
        _until(lambda: batcher._queue and batcher._queue[0].rank & 1, "the request's queue timeout (1 s)")
        in_time = held.send(2.0)
        held.release()
        for marker, future in ((0.0, first), (1.0, late), (2.0, in_time)):
            _answered(future, marker)  # DELAY: answered all the same (REJECT would be HYB-714)
        assert held.ran == [0.0, 2.0, 1.0]  # the late one went behind the one still in time
    finally:
        held.close()


def test_a_priority_that_is_not_an_unsigned_integer_is_refused(tmp_path):
    held = _Held(tmp_path, "priority_levels: 2 default_priority_level: 1")
    held.release()
    try:
        for bad in (-1, "1", 1.5, True):
            status, _, body = request(held.server.url, "POST", "/v2/models/tiny/infer",
                                      v2_json(_feeds(1.0), parameters={"priority": bad}))
            assert status == 400 and error_of(body) == "HYB-702" and b"'parameters.priority'" in body, (bad, body)
        msg = pb.ModelInferRequest(model_name="tiny")
        for name, arr in _feeds(1.0).items():
            msg.inputs.add(name=name, datatype="FP32", shape=list(arr.shape))
            msg.raw_input_contents.append(arr.tobytes())
        msg.parameters["priority"].int64_param = -2
        grpc_url = f"127.0.0.1:{held.server.server.state.grpc_port}"
        with grpc.insecure_channel(grpc_url) as channel, pytest.raises(grpc.RpcError) as err:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(msg, timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "[HYB-702]" in err.value.details()
        msg.parameters["priority"].uint64_param = 2  # what tritonclient sends
        with grpc.insecure_channel(grpc_url) as channel:
            answer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(msg, timeout=60)
        assert [o.name for o in answer.outputs] == ["y", "s"]
    finally:
        held.close()


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_schedule_policies_read_as_triton_applies_them():
    batched = "max_batch_size: 8 dynamic_batching { "
    assert schedule_policy(_config(batched + "}")) == SchedulePolicy()
    assert schedule_policy(_config("max_batch_size: 0")) == SchedulePolicy()
    reject = schedule_policy(_config(batched + "default_queue_policy { default_timeout_microseconds: 2000 "
                                     "allow_timeout_override: true max_queue_size: 3 } }"))
    assert reject == SchedulePolicy(QueuePolicy(0.002, True))  # one level: max_queue is the model's setting
    assert reject.level_of(1) == 0 and reject.policy(0).queue_timeout(0.001) == 0.001
    assert QueuePolicy(0.002, False).queue_timeout(0.001) == 0.002  # no override: the request's is ignored
    assert QueuePolicy(None, True).queue_timeout(0.001) is None  # no timeout to lower: ignored
    delay = schedule_policy(_config(batched + "default_queue_policy { timeout_action: DELAY "
                                    "default_timeout_microseconds: 2000 } }"))
    assert delay.default == QueuePolicy(0.002, delay=True)
    levels = _config(batched + "priority_levels: 3 default_priority_level: 2 default_queue_policy { "
                     "max_queue_size: 4 } priority_queue_policy { key: 1 value { max_queue_size: 2 "
                     "default_timeout_microseconds: 100000 timeout_action: DELAY } } }")
    policy = schedule_policy(levels)
    assert [policy.level_of(p) for p in (0, 1, 2, 3, 4, 2**40)] == [2, 1, 2, 3, 2, 2]
    assert policy.policy(1) == QueuePolicy(0.1, delay=True, max_queue=2)
    assert policy.policy(2) == policy.policy(3) == QueuePolicy(max_queue=4)
    mapped, notes = settings_of(levels, "m")
    assert mapped["max_queue"] is None and not notes  # each level is bounded by its own policy
    # levels without priority_levels are ignored, as Triton loads them
    assert schedule_policy(_config(batched + "default_priority_level: 1 }")).levels == 0


@pytest.mark.parametrize(("batching", "says"), [
    ("priority_levels: 3", "default priority level must be in range [1, 3]"),
    ("priority_levels: 3 default_priority_level: 4", "default priority level must be in range [1, 3]"),
    ("priority_levels: 3 default_priority_level: 1 priority_queue_policy { key: 5 value { max_queue_size: 1 } }",
     "priority queue policy must have priority level in range [1, 3]"),
])
def test_priority_levels_triton_refuses_to_load_are_refused(tmp_path, batching, says):
    # Triton 2.51's words for each (its load fails: "Poll failed for model directory ...")
    with pytest.raises(ServingError) as info:
        schedule_policy(_config(f"max_batch_size: 8 dynamic_batching {{ {batching} }}"), "tiny")
    assert info.value.code == "HYB-707" and says in info.value.message
    folder = tmp_path / "repo" / "tiny"
    (folder / "1").mkdir(parents=True)
    tiny_model(folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(_PBTXT.format(batching=batching).replace("preferred_batch_size: [1] ", ""))
    with pytest.raises(ServingError) as info:
        build_registry([tmp_path / "repo"], target="onnxruntime")
    assert info.value.code == "HYB-707" and says in info.value.message
