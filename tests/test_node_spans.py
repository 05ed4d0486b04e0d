"""The built-in backends' ``Executable.node_spans`` readers, on synthetic profiler output (any machine)."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest

from hybrid.backends.onnxruntime import ort_node_spans
from hybrid.backends.openvino import layer_spans


def _ort_events() -> list[dict]:
    """Three ORT runs of 100 us (ORT's clock) with two kernels each, plus noise ORT also writes."""
    events = [{"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 50}]
    for r in range(3):
        t = 1000 * (r + 1)
        events.append({"cat": "Session", "name": "model_run", "ts": t, "dur": 100})
        events.append({"cat": "Node", "name": "conv_fence_before", "ts": t + 5, "dur": 0})
        events.append({"cat": "Node", "name": "conv_kernel_time", "ts": t + 10, "dur": 60,
                       "args": {"op_name": "Conv", "provider": "CPUExecutionProvider",
                                "output_type_shape": [{"float": [1, 8]}], "thread_scheduling_stats": {}}})
        events.append({"cat": "Node", "name": "relu_kernel_time", "ts": t + 75, "dur": 20,
                       "args": {"op_name": "Relu", "provider": "CPUExecutionProvider"}})
    return events


def test_ort_spans_take_the_last_runs_and_centre_them_in_their_calls():
    # two profiled calls (the first of ORT's three runs was a warm-up), each 200 us on hybrid's clock
    calls = [(1_000_000, 1_200_000), (2_000_000, 2_200_000)]
    spans = ort_node_spans(_ort_events(), calls)
    assert [(s.name, s.op_type, s.call) for s in spans] == [("conv", "Conv", 0), ("relu", "Relu", 0),
                                                            ("conv", "Conv", 1), ("relu", "Relu", 1)]
    # model_run (100 us) centred in a 200 us call: 50 us lead, then the kernel's offset in the run
    assert [s.offset_us for s in spans[:2]] == [pytest.approx(60.0), pytest.approx(125.0)]
    assert [s.dur_us for s in spans[:2]] == [60, 20]
    assert spans[0].args == {"provider": "CPUExecutionProvider", "output_type_shape": [{"float": [1, 8]}]}
    assert ort_node_spans(_ort_events(), []) == []


def test_ort_spans_with_more_calls_than_runs_align_at_the_end():
    calls = [(i * 1_000_000, i * 1_000_000 + 100_000) for i in range(5)]
    spans = ort_node_spans(_ort_events(), calls)
    assert sorted({s.call for s in spans}) == [2, 3, 4]
    assert all(s.offset_us >= 0 for s in spans)


def test_openvino_layers_end_to_end_and_shrunk_to_their_call():
    def rec(name, kind, us, status="EXECUTED", exec_type="jit_avx2_FP32"):
        return SimpleNamespace(node_name=name, node_type=kind, real_time=datetime.timedelta(microseconds=us),
                               status=status, exec_type=exec_type)

    info = [rec("conv", "Convolution", 30), rec("skip", "Reorder", 5, "NOT_RUN"), rec("relu", "Relu", 10),
            rec("gone", "Const", 0), rec("out", "Result", 0, "OPTIMIZED_OUT")]
    spans = layer_spans(info, 3, span_us=100.0)  # fits: drawn as reported
    assert [(s.name, s.op_type, s.call) for s in spans] == [("conv", "Convolution", 3), ("relu", "Relu", 3)]
    assert [(s.offset_us, s.dur_us) for s in spans] == [(0.0, 30.0), (30.0, 10.0)]
    assert spans[0].args == {"real_us": 30.0, "exec_type": "jit_avx2_FP32"}
    shrunk = layer_spans(info, 0, span_us=20.0)  # layers overlapped on threads: scaled into the call
    assert sum(s.dur_us for s in shrunk) == pytest.approx(20.0)
    assert [s.args["real_us"] for s in shrunk] == [30.0, 10.0]
