"""Item 4 of issue 52: ``CompiledModel.submit`` returns a ``concurrent.futures.Future`` a harness completes from."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hybrid
from hybrid.errors import ConfigError, RunError


def _model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture()
def cm():
    compiled = hybrid.compile(_model(), target="onnxruntime")
    yield compiled
    compiled.close()


def test_submit_returns_a_future_whose_callback_gets_the_outputs(cm) -> None:
    x = np.array([[-1, 2, -3, 4]], np.float32)
    got: list[dict] = []
    done = threading.Event()
    future = cm.submit({"x": x})
    assert isinstance(future, Future)
    future.add_done_callback(lambda f: (got.append(f.result()), done.set()))
    assert done.wait(10)
    np.testing.assert_array_equal(got[0]["y"], np.maximum(x, 0))
    assert future.result()["y"].shape == (1, 4)


def test_many_submits_complete_each_with_its_own_outputs(cm) -> None:
    xs = [np.full((1 + i % 3, 4), i - 5, np.float32) for i in range(12)]
    cm.submit_workers = 3
    futures = [cm.submit({"x": x}) for x in xs]
    for x, f in zip(xs, futures):
        np.testing.assert_array_equal(f.result(10)["y"], np.maximum(x, 0))


def test_bad_inputs_fail_in_the_caller_not_in_the_future(cm) -> None:
    with pytest.raises(RunError) as e:
        cm.submit({"x": np.zeros((1, 5), np.float32)})
    assert e.value.code == "HYB-405"
    with pytest.raises(ConfigError):
        cm.submit_workers = 0


def test_submit_on_a_stream_completes_the_same_future_type(cm) -> None:
    x = np.array([[1, -2, 3, -4]], np.float32)
    with hybrid.StreamContext() as s:
        future = cm.submit({"x": x}, stream=s)
    assert isinstance(future, Future)
    np.testing.assert_array_equal(future.result(10)["y"], np.maximum(x, 0))


def test_stream_result_has_done_callbacks() -> None:
    seen: list[int] = []
    with hybrid.StreamContext() as s:
        handle = s.submit(lambda: 7)
        handle.add_done_callback(lambda h: seen.append(h.result()))
    assert seen == [7]
    handle.add_done_callback(lambda h: seen.append(h.result() + 1))  # already done: called at once
    assert seen == [7, 8]


def test_submit_after_close_is_refused() -> None:
    compiled = hybrid.compile(_model(), target="onnxruntime")
    f = compiled.submit({"x": np.ones((2, 4), np.float32)})
    compiled.close()
    assert f.done()  # close finished the queued work first
    with pytest.raises(RunError) as e:
        compiled.submit({"x": np.ones((2, 4), np.float32)})
    assert e.value.code == "HYB-415"
