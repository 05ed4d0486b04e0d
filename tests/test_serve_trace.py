"""Triton's trace extension (serve.observe.trace): settings, sampling, the trace file, and traced requests end to end.

The settings and the sampling run on a scripted clock; the end-to-end tests check what must hold of any traced
request on any machine: its entries, the order of its timestamps, and its tensors equal to what was sent and
answered. ``tests/test_serve_vs_triton.py`` compares the settings and the file with the real Triton's.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests._serve_support import OtlpReceiver, Span, serving, tiny_expected, tiny_model
from typer.testing import CliRunner

from hybrid.errors import ConfigError, ServingError
from hybrid.serve import BackgroundServer, ServeOptions, build_registry, create_app
from hybrid.serve.observe.trace import Trace, TraceConfig, Tracer

pytestmark = pytest.mark.timeout(120)

X = np.arange(8, dtype=np.float32).reshape(2, 4)
SCALE = np.full((2, 1), 0.5, np.float32)
HTTP_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
              "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "INFER_RESPONSE_COMPLETE", "COMPUTE_END", "REQUEST_END",
              "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_ORDER = ["GRPC_WAITREAD_END", *HTTP_ORDER[2:-2], "GRPC_SEND_START", "GRPC_SEND_END"]


def _config(tmp_path: Path, *options: str) -> TraceConfig:
    return TraceConfig.from_options([f"triton,file={tmp_path / 'trace.json'}", "level=TIMESTAMPS", *options])


def _clock() -> Any:
    ticks = itertools.count(1000, 10)
    return lambda: next(ticks)


def _traced(tracer: Tracer, model: str = "m", n: int = 1) -> list[Trace]:
    """Send ``n`` requests through the sampling; the traces taken, each finished as a transport would."""
    taken = []
    for _ in range(n):
        trace = tracer.sample(model)
        if trace is not None:
            trace.model_version = "1"
            trace.stamp("REQUEST_START")
            trace.finish()
            taken.append(trace)
    return taken


def _read(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------------------- settings
def test_a_trace_file_may_hold_a_comma(tmp_path):
    config = TraceConfig.from_options([f"triton,file={tmp_path}/a,b.json", "level=TIMESTAMPS"])
    assert config.file == f"{tmp_path}/a,b.json"
    assert TraceConfig.from_options([f"file={tmp_path}/c.json"]).file == f"{tmp_path}/c.json"


def test_trace_config_reads_triton_s_spelling(tmp_path):
    config = TraceConfig.from_options([f"triton,file={tmp_path}/t.json", "triton,log-frequency=50", "rate=100",
                                       "level=TIMESTAMPS", "level=tensors", "count=7", "mode=triton"])
    assert config == TraceConfig(level=("TIMESTAMPS", "TENSORS"), rate=100, count=7, log_frequency=50,
                                 file=str(tmp_path / "t.json"))
    assert config.document() == {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "100", "trace_count": "7",
                                 "log_frequency": "50", "trace_file": str(tmp_path / "t.json"),
                                 "trace_mode": "triton"}
    assert TraceConfig.from_options([]) == TraceConfig()  # Triton's defaults: off, one request in 1000
    assert TraceConfig().document()["trace_rate"] == "1000"


@pytest.mark.parametrize(("options", "says"), [
    (["level=TIMESTAMPS"], "needs a trace file"),
    (["file=/no/such/folder/t.json"], "does not exist"),
    (["opentelemetry,url=localhost:4318"], "not a setting of mode triton"),
    (["mode=opentelemetry", f"triton,file={Path.cwd()}/t.json"], "not a setting of mode opentelemetry"),
    (["mode=zipkin"], "expected one of triton, opentelemetry"),
    (["zipkin,url=x"], "MODE triton or opentelemetry"),
    (["mode=opentelemetry", "opentelemetry,bsp_max_queue_size=0"], "must be >= 1"),
    (["mode=opentelemetry", "opentelemetry,bsp_max_export_batch_size=64", "opentelemetry,bsp_max_queue_size=32"],
     "more than bsp_max_queue_size=32"),
    (["mode=opentelemetry", "opentelemetry,resource=edge"], "a resource is KEY=VALUE"),
    (["mode=opentelemetry", "opentelemetry,url="], "expected HOST:PORT/PATH"),
    (["sample=3"], "KEY one of"),
    (["rate"], "KEY=VALUE"),
    (["rate=0"], "'trace_rate' must be >= 1"),
    (["count=-2"], "'trace_count' must be >= -1"),
    (["rate=often"], "must be an integer"),
    (["level=OFF", "level=TIMESTAMPS"], "'OFF' must be the only one"),
    (["level=VERBOSE"], "unknown trace level"),
])
def test_bad_trace_config_is_hyb_102(options, says):
    with pytest.raises(ConfigError) as info:
        TraceConfig.from_options(options)
    assert info.value.code == "HYB-102" and says in info.value.message, info.value.message


def test_one_request_of_every_rate_is_traced_while_the_count_lasts(tmp_path):
    tracer = Tracer(_config(tmp_path, "rate=3", "count=2"), clock=_clock())
    taken = [tracer.sample("m") for _ in range(9)]
    assert [t is not None for t in taken] == [False, False, True, False, False, True, False, False, False]
    assert [t.id for t in taken if t is not None] == [1, 2]
    assert tracer.settings()["trace_count"] == "0"  # the traces left, as Triton reports it
    tracer.update(None, {"trace_count": "1"})
    assert len(_traced(tracer, n=3)) == 1


def test_a_model_s_settings_override_the_server_s_until_cleared(tmp_path):
    tracer = Tracer(_config(tmp_path, "rate=2", "count=10"), clock=_clock())
    doc = tracer.update("a", {"trace_rate": "1"})
    assert doc["trace_rate"] == "1" and doc["trace_count"] == "10"  # the rest is the server's
    assert tracer.settings("b") == tracer.settings() and tracer.settings()["trace_rate"] == "2"
    assert len(_traced(tracer, "a", 3)) == 3 and len(_traced(tracer, "b", 4)) == 2  # each its own rate counter
    assert tracer.settings()["trace_count"] == tracer.settings("a")["trace_count"] == "5"  # one count, the server's
    tracer.update("a", {"trace_count": "1"})  # its own count from now on
    assert len(_traced(tracer, "a", 3)) == 1 and tracer.settings()["trace_count"] == "5"
    tracer.update(None, {"trace_level": ["TIMESTAMPS", "TENSORS"]})  # what a model does not override follows
    assert tracer.settings("a")["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    tracer.update("a", {"trace_level": ["OFF"]})
    assert _traced(tracer, "a", 4) == [] and len(_traced(tracer, "b", 2)) == 1
    assert tracer.update("a", {"trace_level": None, "trace_rate": None, "trace_count": None}) == tracer.settings()
    tracer.update(None, {"trace_rate": None, "trace_count": None, "trace_level": None})  # the start-up values
    assert tracer.settings() == {**_config(tmp_path, "rate=2", "count=10").document()}


@pytest.mark.parametrize(("model", "changes", "says"), [
    (None, {"trace_rate": "0"}, ">= 1"),
    (None, {"trace_rate": 2.5}, "integer"),
    (None, {"trace_count": "-2"}, ">= -1"),
    (None, {"log_frequency": "-1"}, ">= 0"),
    (None, {"trace_level": "TIMESTAMPS"}, "list"),
    (None, {"trace_level": []}, "list"),
    (None, {"trace_level": ["OFF", "TIMESTAMPS"]}, "'OFF' must be the only one"),
    (None, {"trace_level": ["DETAILED"]}, "unknown trace level"),
    (None, {"trace_mode": "opentelemetry"}, "'triton'"),
    (None, {"trace_file": "/tmp/elsewhere.json"}, "cannot be changed over the network"),
    (None, {"sampling": "1"}, "unknown trace setting"),
    ("m", {"log_frequency": "5"}, "server's trace file"),
    (None, {"url": "collector:4318/v1/traces"}, "one of OpenTelemetry mode"),
    ("m", {"trace_rate": "x"}, "integer"),
])
def test_bad_updates_are_hyb_702_and_change_nothing(tmp_path, model, changes, says):
    tracer = Tracer(_config(tmp_path, "rate=5"))
    before = (tracer.settings(), tracer.settings("m"))
    with pytest.raises(ServingError) as info:
        tracer.update(model, {"trace_count": "3", **changes})
    assert info.value.code == "HYB-702" and says in info.value.message, info.value.message
    assert (tracer.settings(), tracer.settings("m")) == before


def test_the_same_trace_file_and_mode_are_accepted(tmp_path):
    tracer = Tracer(_config(tmp_path))
    doc = tracer.update(None, {"trace_file": str(tmp_path / "trace.json"), "trace_mode": "triton", "trace_rate": 4})
    assert doc["trace_rate"] == "4"


def test_a_server_without_a_trace_file_cannot_turn_tracing_on(tmp_path):
    tracer = Tracer(TraceConfig())
    with pytest.raises(ServingError, match="without a trace file") as info:
        tracer.update(None, {"trace_level": ["TIMESTAMPS"]})
    assert info.value.code == "HYB-702"
    with pytest.raises(ServingError, match="without a trace file"):
        tracer.update("m", {"trace_level": ["TENSORS"]})
    assert tracer.update(None, {"trace_rate": "1"})["trace_level"] == ["OFF"] and tracer.sample("m") is None


# ---------------------------------------------------------------------------------------------------- files
def test_traces_go_to_one_file_when_the_server_stops(tmp_path):
    tracer = Tracer(_config(tmp_path, "rate=1"), clock=_clock())
    _traced(tracer, n=3)
    never = tracer.sample("nope")  # a request that never reached a model (unknown): no trace
    never.stamp("HTTP_RECV_START")
    never.finish()
    assert not (tmp_path / "trace.json").exists()
    tracer.close()
    tracer.close()
    entries = _read(tmp_path / "trace.json")
    assert [e for e in entries if "model_name" in e] == [
        {"id": i, "model_name": "m", "model_version": 1} for i in (1, 2, 3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]  # no temporary file left behind
    (tmp_path / "plain").write_text("")  # the trace file gets the mode any file the process makes gets
    assert (tmp_path / "trace.json").stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777
    (tmp_path / "plain").unlink()
    _traced(tracer, n=1)  # after close: dropped, nothing rewritten
    assert _read(tmp_path / "trace.json") == entries


def test_with_a_log_frequency_every_n_traces_make_a_file_and_the_rest_the_next(tmp_path):
    tracer = Tracer(_config(tmp_path, "rate=1", "triton,log-frequency=2"), clock=_clock())
    _traced(tracer, n=5)
    tracer.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["trace.json.0", "trace.json.1", "trace.json.2"]
    ids = [sorted({e["id"] for e in _read(tmp_path / f)}) for f in files]
    assert ids == [[1, 2], [3, 4], [5]]  # Triton 2.51 drops the last, partial file's traces; pyasc writes them


def test_a_lower_log_frequency_writes_what_is_due_at_once(tmp_path):
    tracer = Tracer(_config(tmp_path, "rate=1", "triton,log-frequency=10"), clock=_clock())
    _traced(tracer, n=3)
    tracer.update(None, {"log_frequency": "2"})
    tracer.close()
    assert [sorted({e["id"] for e in _read(tmp_path / f"trace.json.{i}")}) for i in range(2)] == [[1, 2], [3]]


def test_tensors_are_written_as_triton_writes_them():
    tracer = Tracer(TraceConfig(level=("TENSORS",), rate=1, file="/unused"), clock=_clock())
    trace = tracer.sample("m")
    trace.model_version = "2"
    trace.request_id = "r7"
    trace.record_tensors("TENSOR_QUEUE_INPUT", {
        "f": np.array([[0.5, -2 / 7], [1e7, 3.0]], np.float32), "i": np.array([1, -2], np.int64),
        "b": np.array([True, False]), "t": np.array([b"ab", "c\u00e9".encode()], dtype=object),
        "h": np.array([1.5], np.float16)})
    head, *tensors = trace.entries()
    assert head == {"id": 1, "model_name": "m", "model_version": 2, "request_id": "r7"}
    assert [(e["activity"], e["tensor"]) for e in tensors] == [
        ("TENSOR_QUEUE_INPUT", {"name": "f", "data": "0.5,-0.285714,1e+07,3", "shape": "2,2", "dtype": "FP32"}),
        ("TENSOR_QUEUE_INPUT", {"name": "i", "data": "1,-2", "shape": "2", "dtype": "INT64"}),
        ("TENSOR_QUEUE_INPUT", {"name": "b", "data": "1,0", "shape": "2", "dtype": "BOOL"}),
        ("TENSOR_QUEUE_INPUT", {"name": "t", "data": "ab,c\u00e9", "shape": "2", "dtype": "BYTES"}),
        ("TENSOR_QUEUE_INPUT", {"name": "h", "data": "1.5", "shape": "1", "dtype": "FP16"})]
    timestamps_only = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=1, file="/unused")).sample("m")
    timestamps_only.record_tensors("TENSOR_QUEUE_INPUT", {"f": np.ones(2)})
    assert timestamps_only.entries()[1:] == []


# ---------------------------------------------------------------------------------------------------- end to end
def _names(entries: list[dict[str, Any]], trace_id: int) -> list[tuple[str, int]]:
    return [(t["name"], t["ns"]) for e in entries if e["id"] == trace_id for t in e.get("timestamps", [])]


def _check_trace(entries: list[dict[str, Any]], trace_id: int, order: list[str], request_id: str) -> None:
    head = next(e for e in entries if e["id"] == trace_id and "model_name" in e)
    assert head == {"id": trace_id, "model_name": "tiny", "model_version": 1, "request_id": request_id}
    stamps = _names(entries, trace_id)
    assert sorted(n for n, _ in stamps) == sorted(order), stamps
    ns = dict(stamps)
    assert [ns[n] for n in order] == sorted(ns[n] for n in order), stamps  # in the order a request meets them
    tensors = {(e["activity"], e["tensor"]["name"]): e["tensor"] for e in entries
               if e["id"] == trace_id and "tensor" in e}
    assert tensors[("TENSOR_QUEUE_INPUT", "x")] == {"name": "x", "data": ",".join(format(float(v), "g") for v in
                                                                                  X.reshape(-1)),
                                                    "shape": "2,4", "dtype": "FP32"}
    y = np.array([float(v) for v in tensors[("TENSOR_BACKEND_OUTPUT", "y")]["data"].split(",")]).reshape(2, 3)
    np.testing.assert_allclose(y, tiny_expected(X, SCALE)["y"], rtol=1e-5)


def _infer_all(http_url: str, grpc_url: str) -> None:
    hc = httpclient.InferenceServerClient(http_url)
    gc = grpcclient.InferenceServerClient(grpc_url)
    for client, name in ((hc, "http"), (gc, "grpc")):
        module = httpclient if client is hc else grpcclient
        inputs = [module.InferInput("x", [2, 4], "FP32"), module.InferInput("scale", [2, 1], "FP32")]
        inputs[0].set_data_from_numpy(X)
        inputs[1].set_data_from_numpy(SCALE)
        client.infer("tiny", inputs, request_id=name)
    results: list[Any] = []
    gc.start_stream(callback=lambda result, error: results.append(error or result))
    inputs = [grpcclient.InferInput("x", [2, 4], "FP32"), grpcclient.InferInput("scale", [2, 1], "FP32")]
    inputs[0].set_data_from_numpy(X)
    inputs[1].set_data_from_numpy(SCALE)
    gc.async_stream_infer("tiny", inputs, request_id="stream")
    gc.stop_stream()
    assert len(results) == 1 and not isinstance(results[0], Exception), results
    with pytest.raises(Exception, match="nope"):
        hc.infer("nope", [])  # an unknown model: no trace


@pytest.mark.parametrize("max_batch", [8, 0], ids=["batched", "unbatched"])
def test_traced_requests_over_http_grpc_and_a_stream(tmp_path, max_batch):
    model = tiny_model(tmp_path / "tiny.onnx")
    config = _config(tmp_path, "level=TENSORS", "rate=1")
    registry = build_registry([f"tiny={model}"], target="onnxruntime", overrides={"max_batch": max_batch})
    app = create_app(registry, ServeOptions(grpc_address="127.0.0.1:0", trace=config))
    with BackgroundServer(app) as server:
        _infer_all(server.url.removeprefix("http://"), f"127.0.0.1:{app.state.hybrid.grpc_port}")
        assert "trace" in httpclient.InferenceServerClient(server.url.removeprefix("http://")) \
            .get_server_metadata()["extensions"]
    entries = _read(tmp_path / "trace.json")  # written when the server stopped
    heads = {e["request_id"]: e["id"] for e in entries if "model_name" in e}
    assert sorted(heads) == ["grpc", "http", "stream"]
    _check_trace(entries, heads["http"], HTTP_ORDER, "http")
    _check_trace(entries, heads["grpc"], GRPC_ORDER, "grpc")
    _check_trace(entries, heads["stream"], GRPC_ORDER, "stream")


def test_settings_over_http_and_grpc(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    with serving([f"tiny={model}"], trace=_config(tmp_path)) as server:
        hc = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        gc = grpcclient.InferenceServerClient(server.grpc_url)
        assert hc.get_trace_settings()["trace_rate"] == "1000"
        assert hc.update_trace_settings(settings={"trace_rate": "10"})["trace_rate"] == "10"
        doc = gc.update_trace_settings(model_name="tiny", settings={"trace_level": ["TIMESTAMPS", "TENSORS"],
                                                                     "trace_count": "4"}, as_json=True)["settings"]
        assert doc["trace_level"]["value"] == ["TIMESTAMPS", "TENSORS"] and doc["trace_count"]["value"] == ["4"]
        assert hc.get_trace_settings("tiny")["trace_rate"] == "10"
        assert gc.get_trace_settings(as_json=True)["settings"]["trace_level"]["value"] == ["TIMESTAMPS"]
        doc = gc.update_trace_settings(model_name="tiny", settings={"trace_level": None, "trace_count": None},
                                       as_json=True)["settings"]
        assert doc["trace_level"]["value"] == ["TIMESTAMPS"] and doc["trace_count"]["value"] == ["-1"]
        for call, code in [(lambda: hc.update_trace_settings(settings={"trace_rate": "0"}), "400"),
                           (lambda: hc.get_trace_settings("nope"), "404"),
                           (lambda: gc.update_trace_settings(settings={"trace_rate": "0"}), "INVALID_ARGUMENT"),
                           (lambda: gc.update_trace_settings(settings={"trace_rate": ["1", "2"]}),
                            "INVALID_ARGUMENT"),
                           (lambda: gc.get_trace_settings(model_name="nope"), "NOT_FOUND")]:
            with pytest.raises(Exception) as info:
                call()
            assert code in str(info.value.status()), (code, info.value)


def test_a_server_without_the_extension_does_not_list_or_answer_it(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    with serving([f"tiny={model}"], trace=None) as server:
        hc = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        assert "trace" not in hc.get_server_metadata()["extensions"]
        with pytest.raises(Exception, match="HYB-702"):
            hc.get_trace_settings()
        with pytest.raises(Exception, match="HYB-702"):
            grpcclient.InferenceServerClient(server.grpc_url).get_trace_settings()


def test_cli_refuses_a_bad_trace_config(tmp_path):
    from tests.test_serve import serve_app

    model = tiny_model(tmp_path / "tiny.onnx")
    runner = CliRunner()
    result = runner.invoke(serve_app(), ["serve", "--help"])
    assert "--trace-config" in result.output
    result = runner.invoke(serve_app(), ["serve", str(model), "--trace-config", "level=TIMESTAMPS"])
    assert result.exit_code == 1 and "HYB-102" in result.output and "needs a trace file" in result.output
    result = runner.invoke(serve_app(), ["serve", str(model), "--trace-config", "mode=opentelemetry",
                                         "--trace-config", f"triton,file={tmp_path}/t.json"])
    assert result.exit_code == 1 and "HYB-102" in result.output and "not a setting of mode" in result.output
    result = runner.invoke(serve_app(), ["serve", str(model), "--ray", "--trace-config",
                                         f"triton,file={tmp_path}/t.json"])
    assert result.exit_code == 1 and "HYB-102" in result.output and "--ray" in result.output


# ---------------------------------------------------------------------------------------------------- OpenTelemetry
OTEL = ("mode=opentelemetry", "level=TIMESTAMPS", "rate=1")
REQUEST_EVENTS = ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
MODEL_EVENTS = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE_EVENTS = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"  # the client did not sample: the server decides


def test_opentelemetry_settings_read_triton_s_spelling():
    config = TraceConfig.from_options([*OTEL, "opentelemetry,url=collector:4318/v1/traces",
                                       "opentelemetry,resource=service.name=edge",
                                       "opentelemetry,bsp_schedule_delay=250",
                                       "opentelemetry,bsp_max_export_batch_size=64",
                                       "opentelemetry,bsp_max_queue_size=128"])
    assert config.document() == {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                                 "trace_mode": "opentelemetry", "url": "collector:4318/v1/traces",
                                 "resource": "service.name=edge", "bsp_schedule_delay": "250",
                                 "bsp_max_export_batch_size": "64", "bsp_max_queue_size": "128"}
    assert TraceConfig.from_options(["mode=opentelemetry"]).document() == {  # Triton's defaults, no resource
        "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "trace_mode": "opentelemetry",
        "url": "localhost:4318/v1/traces", "bsp_schedule_delay": "5000", "bsp_max_export_batch_size": "512",
        "bsp_max_queue_size": "2048"}


def _otel_tracer(*options: str) -> tuple[Tracer, Any]:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    return Tracer(TraceConfig.from_options([*OTEL, *options]), clock=_clock(), span_exporter=exporter), exporter


def _request(tracer: Tracer, stamps: list[str], request_id: str = "", carrier: dict[str, str] | None = None) -> None:
    """One sampled request stamped ``stamps`` in order (10 ns apart), finished as a transport would."""
    trace = tracer.sample("m")
    assert trace is not None
    trace.request_id, trace.carrier = request_id, carrier
    for name in stamps:
        if name == "REQUEST_START":
            trace.model_version = "3"
        trace.stamp(name)
    trace.finish()


def test_a_traced_request_is_three_spans_laid_out_as_triton_s():
    import time

    from opentelemetry.trace import SpanKind

    tracer, exporter = _otel_tracer()
    _request(tracer, HTTP_ORDER, "r1")
    finished = exporter.get_finished_spans()
    assert [s.name for s in finished] == ["compute", "m", "InferRequest"]  # children end first, as in Triton
    compute, model, request = finished
    assert request.parent is None and model.parent.span_id == request.context.span_id
    assert compute.parent.span_id == model.context.span_id
    assert len({s.context.trace_id for s in finished}) == 1 and all(s.kind == SpanKind.SERVER for s in finished)
    assert [e.name for e in request.events] == REQUEST_EVENTS
    assert [e.name for e in model.events] == MODEL_EVENTS and [e.name for e in compute.events] == COMPUTE_EVENTS
    assert dict(model.attributes) == {"triton.model_name": "m", "triton.model_version": 3, "triton.trace_id": 1,
                                      "triton.trace_parent_id": 0, "triton.request_id": "r1"}
    for span in finished:  # each from its first event to its last
        assert (span.start_time, span.end_time) == (span.events[0].timestamp, span.events[-1].timestamp)
    times = sorted(e.timestamp for s in finished for e in s.events)
    assert set(np.diff(times)) == {10}  # the stamps' clock, moved to the wall clock as one piece
    assert abs(times[0] - time.time_ns()) < 60e9
    assert dict(request.resource.attributes)["service.name"] == "pyasc"


def test_a_client_s_trace_context_is_continued():
    tracer, exporter = _otel_tracer("opentelemetry,resource=service.name=edge")
    _request(tracer, GRPC_ORDER, carrier={"traceparent": PARENT, "tracestate": "vendor=opaque"})
    _, model, request = exporter.get_finished_spans()
    assert dict(request.context.trace_state) == dict(model.context.trace_state) == {"vendor": "opaque"}
    assert format(request.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert format(request.parent.span_id, "016x") == "b7ad6b7169203331" and request.parent.is_remote
    assert [e.name for e in request.events] == ["GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
                                                "GRPC_SEND_END"]
    assert "triton.request_id" not in model.attributes  # the client sent none
    assert dict(request.resource.attributes)["service.name"] == "edge"


def test_without_timestamps_only_a_bare_request_span_is_exported():
    tracer, exporter = _otel_tracer()
    tracer.update(None, {"trace_level": ["TENSORS"]})  # Triton exports no tensors in this mode either
    _request(tracer, HTTP_ORDER)
    (span,) = exporter.get_finished_spans()
    assert span.name == "InferRequest" and not span.events and span.end_time > span.start_time


def test_a_request_that_never_reached_its_model_or_ended_after_the_stop_exports_nothing():
    tracer, exporter = _otel_tracer()
    trace = tracer.sample("m")
    assert trace is not None
    trace.stamp("HTTP_RECV_START")
    trace.finish()
    tracer.close()
    _request(tracer, HTTP_ORDER)
    assert not exporter.get_finished_spans()


@pytest.mark.parametrize(("changes", "says"), [
    ({"log_frequency": "10"}, "one of Triton's trace files"),
    ({"trace_file": "/tmp/t.json"}, "one of Triton's trace files"),
    ({"trace_mode": "triton"}, "is 'opentelemetry' on this server"),
    ({"url": "elsewhere:4318/v1/traces"}, "cannot be changed over the network"),
    ({"bsp_max_queue_size": "10"}, "cannot be changed over the network"),
])
def test_opentelemetry_settings_are_set_where_the_server_starts(changes, says):
    tracer, _ = _otel_tracer()
    with pytest.raises(ServingError) as info:
        tracer.update(None, changes)
    assert info.value.code == "HYB-702" and says in info.value.message, info.value.message
    same = {"url": "localhost:4318/v1/traces", "trace_mode": "opentelemetry", "bsp_max_queue_size": "2048",
            "trace_rate": "7"}
    assert tracer.update(None, same)["trace_rate"] == "7"
    assert tracer.update("m", {"trace_level": ["OFF"]})["trace_level"] == ["OFF"]  # no trace file needed
    with pytest.raises(ServingError, match="one of Triton's trace files"):
        tracer.update("m", {"log_frequency": "5"})


def _by_trace(spans: list[Span]) -> dict[str, dict[str, Span]]:
    traces: dict[str, dict[str, Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, {})[span.name] = span
    return traces


def test_spans_of_http_grpc_and_stream_requests_reach_an_otlp_collector(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    with OtlpReceiver() as collector:
        config = TraceConfig.from_options([*OTEL, f"opentelemetry,url={collector.url}",
                                           "opentelemetry,bsp_schedule_delay=50",
                                           "opentelemetry,resource=service.name=edge"])
        with serving([f"tiny={model}"], trace=config) as server:
            http_url = server.url.removeprefix("http://")
            _infer_all(http_url, server.grpc_url)  # request ids http, grpc, stream; an unknown model
            for client in (httpclient.InferenceServerClient(http_url),
                           grpcclient.InferenceServerClient(server.grpc_url)):
                module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
                inputs = [module.InferInput("x", [2, 4], "FP32"), module.InferInput("scale", [2, 1], "FP32")]
                inputs[0].set_data_from_numpy(X)
                inputs[1].set_data_from_numpy(SCALE)
                parent = PARENT.replace("0af7", "1af7" if module is grpcclient else "0af7")  # one trace each
                client.infer("tiny", inputs, request_id=f"{module.__name__}-child", headers={"traceparent": parent})
        spans = collector.wait_for(15)  # the server's stop exports what is queued
    traces = _by_trace(spans)
    assert len(spans) == 15 and all(set(t) == {"InferRequest", "tiny", "compute"} for t in traces.values())
    by_id = {t["tiny"].attributes.get("triton.request_id"): t for t in traces.values()}
    assert sorted(by_id) == ["grpc", "http", "stream", "tritonclient.grpc-child", "tritonclient.http-child"]
    for request_id, trace in by_id.items():
        request, served, compute = trace["InferRequest"], trace["tiny"], trace["compute"]
        over_http = request_id.startswith(("http", "tritonclient.http"))
        order = HTTP_ORDER if over_http else GRPC_ORDER
        assert [e for e, _ in request.events] == [e for e in order if e not in MODEL_EVENTS + COMPUTE_EVENTS]
        assert [e for e, _ in served.events] == MODEL_EVENTS and [e for e, _ in compute.events] == COMPUTE_EVENTS
        stamps = dict(request.events + served.events + compute.events)
        assert [stamps[e] for e in order] == sorted(stamps[e] for e in order), request_id  # the order met
        assert (served.parent_id, compute.parent_id) == (request.span_id, served.span_id)
        assert request.start <= served.start <= compute.start <= compute.end <= served.end <= request.end
        assert served.attributes["triton.model_name"] == "tiny" and served.attributes["triton.model_version"] == 1
        assert request.kind == served.kind == compute.kind == 2  # SERVER
        assert request.resource["service.name"] == "edge"
        if request_id.endswith("-child"):
            first = "0af7" if over_http else "1af7"
            assert (request.trace_id, request.parent_id) == (f"{first}651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
        else:
            assert request.parent_id == ""


def test_opentelemetry_mode_without_the_sdk_is_hyb_207(monkeypatch):
    import sys

    from hybrid.errors import ModelError

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ModelError) as info:
        Tracer(TraceConfig.from_options(list(OTEL)))
    assert info.value.code == "HYB-207" and "pyasc[serve]" in info.value.hint
