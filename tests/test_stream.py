"""hybrid.StreamContext: asynchronous calls, submission order, synchronization, errors, fallback."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import hybrid
from hybrid.errors import BackendError, RunError


def _double_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double", [x], [y], [two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.timeout(60)
def test_model_calls_on_a_stream_return_handles_and_the_block_waits():
    cm = hybrid.compile(_double_model(), "onnxruntime")
    inputs = [np.full((2, 4), i, np.float32) for i in range(20)]
    with hybrid.StreamContext() as s:
        handles = [cm(x, stream=s) for x in inputs]
        assert s.device == "cpu"
    assert all(h.done() for h in handles)
    for x, h in zip(inputs, handles):
        np.testing.assert_array_equal(h.result(), x * 2)
        np.testing.assert_array_equal(h.numpy(), x * 2)


@pytest.mark.timeout(30)
def test_submit_returns_at_once_and_work_runs_in_order():
    gate = threading.Event()
    order: list[int] = []
    s = hybrid.StreamContext()
    first = s.submit(lambda: (gate.wait(10), order.append(0))[1])
    rest = [s.submit(order.append, i) for i in range(1, 10)]
    assert not first.done()  # submit did not wait
    with pytest.raises(RunError) as info:
        first.result(timeout=0.05)  # (the caller's own wait: the first work cannot end before the gate opens)
    assert info.value.code == "HYB-411"
    assert not any(h.done() for h in rest) and order == []  # nothing overtook the blocked first work
    gate.set()
    s.synchronize(timeout=10)
    assert all(h.done() for h in rest)
    assert order == list(range(10))
    s.close()
    with pytest.raises(RunError, match="HYB-415"):
        s.submit(print)


@pytest.mark.timeout(30)
def test_an_error_stays_with_its_handle():
    s = hybrid.StreamContext()
    bad = s.submit(lambda: 1 / 0)
    good = s.submit(lambda a, b=0: a + b, 1, b=2)
    assert good.result(5) == 3
    with pytest.raises(ZeroDivisionError):
        bad.result(5)
    assert isinstance(bad.exception(), ZeroDivisionError)
    s.close()


@pytest.mark.timeout(30)
def test_stream_is_reusable_after_the_block_and_keeps_order():
    s = hybrid.StreamContext()
    order = []
    # real time in this test: work still running when a block ends, so that leaving the block must wait for it
    # (a short sleep makes an exit that does not wait visible; the test passes on a machine of any speed)
    with s:
        s.submit(lambda: (time.sleep(0.02), order.append("a")))  # real time: see above
    with s:
        s.submit(order.append, "b")
    assert order == ["a", "b"]
    with s:
        slow = s.submit(lambda: (time.sleep(0.05), order.append("c")))  # real time: see above
        s._stop(None)  # stop and restart inside the block: the new thread waits for the old one
        s.submit(order.append, "d")
    assert slow.done() and order == ["a", "b", "c", "d"]
    s.close()


@pytest.mark.timeout(30)
def test_handles_can_be_awaited_and_tuples_convert_to_numpy():
    s = hybrid.StreamContext()

    async def main():
        return await s.submit(lambda: (np.ones(2), [1, 2]))

    a, b = asyncio.run(main())
    np.testing.assert_array_equal(a, np.ones(2))
    assert b == [1, 2]
    arrays = s.submit(lambda: (np.ones(2), [1, 2])).numpy()
    assert isinstance(arrays, tuple) and isinstance(arrays[1], np.ndarray)
    s.close()


@pytest.mark.timeout(30)
def test_absent_device_follows_the_fallback_policy(caplog):
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        s = hybrid.StreamContext("cuda:0")
    assert s.device == "cpu" and "not present" in caplog.text
    assert s.submit(lambda: 7).result(5) == 7
    s.close()
    hybrid.init({"device_fallback": "error"})
    with pytest.raises(BackendError) as info:
        hybrid.StreamContext("gpu")
    assert info.value.code == "HYB-307"


class _FakeCuda:
    """torch.cuda's stream API as the stream uses it, recording what happens (no GPU here)."""

    def __init__(self):
        self.log: list[str] = []
        self.current = None
        cuda = self

        class Stream:
            def __init__(self, device):
                self.device = device

            def synchronize(self):
                cuda.log.append("stream.synchronize")

        class Event:
            def record(self, stream):
                cuda.log.append(f"record on {stream.device} (issued on {cuda.current})")

            def synchronize(self):
                cuda.log.append("event.synchronize")

        self.Stream, self.Event = Stream, Event

    def stream(self, s):
        import contextlib

        @contextlib.contextmanager
        def issuing():
            self.current = s.device
            yield
            self.current = None

        return issuing()


def test_work_on_a_device_stream_is_issued_on_it_and_waits_for_its_event(monkeypatch):
    from types import SimpleNamespace

    from hybrid.hal import interop
    from hybrid.runtime.traffic import stream as stream_module

    cuda = _FakeCuda()
    fake = interop.DeviceStream(SimpleNamespace(cuda=cuda), "cuda:0")
    monkeypatch.setattr(stream_module, "device_stream", lambda device: fake)
    s = hybrid.StreamContext("cpu")
    handle = s.submit(lambda: cuda.current)
    assert handle.result(timeout=30) == "cuda:0"  # the work ran inside the device stream
    assert cuda.log == ["record on cuda:0 (issued on cuda:0)", "event.synchronize"]
    s.synchronize()
    assert cuda.log[-1] == "stream.synchronize"
    s.close()


def test_results_come_back_to_the_host_from_framework_tensors():
    torch = pytest.importorskip("torch")
    from hybrid.hal.interop import device_stream, host_array, is_framework_tensor

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).requires_grad_()
    assert is_framework_tensor(t) and not is_framework_tensor(np.zeros(2))
    np.testing.assert_array_equal(host_array(t), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert device_stream("cpu") is None
