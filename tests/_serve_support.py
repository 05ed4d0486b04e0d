"""Models and helpers for the serving tests (built in the test, never committed).

Run as a script it is the ``pyasc`` CLI with only the ``serve`` command registered, as the lead will
wire it: ``python tests/_serve_support.py serve MODEL ...`` (used by the SIGTERM test).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

T = TypeVar("T")
W = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5.0) / 7.0


def tiny_model(path: Path, factor: float = 1.0) -> Path:
    """Two inputs, two outputs, rows independent, batch dim 'N': y = (x @ W) * scale * factor, s = sum(x)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    scale = helper.make_tensor_value_info("scale", TensorProto.FLOAT, ["N", 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", 1])
    inits = [numpy_helper.from_array(W * np.float32(factor), "W"),
             numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Mul", ["xw", "scale"], ["y"]),
             helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=1)]
    graph = helper.make_graph(nodes, "tiny", [x, scale], [y, s], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def tiny_repo(root: Path) -> Path:
    """``root/repo``: a repository holding :func:`tiny_model` as model ``tiny``, version 1."""
    (root / "repo" / "tiny" / "1").mkdir(parents=True)
    tiny_model(root / "repo" / "tiny" / "1" / "model.onnx")
    return root / "repo"


STATEFUL_PBTXT = """name: "{name}"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [2] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [2] }}, {{ name: "ctl" data_type: TYPE_FP32 dims: [4] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  oldest {{ max_queue_delay_microseconds: 1000 }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [0, 1] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  state [ {{ input_name: "state_in" output_name: "state_out" data_type: TYPE_FP32 dims: [2]
            initial_state: {{ data_type: TYPE_FP32 dims: [2] zero_data: true name: "zero" }} }} ]
}}
"""


def stateful_model(path: Path) -> Path:
    """A stateful model for sequence batching: y = x + state_in, state_out = y, ctl = [START, READY, END, CORRID].

    Inputs x [N, 2] and the server's: START, READY [N, 1] (FP32), END [N, 1] (INT32), CORRID [N, 1] (UINT64),
    state_in [N, 2]; outputs y, state_out [N, 2] and ctl [N, 4] (the controls as FP32).
    """
    spec = helper.make_tensor_value_info
    inputs = [spec("x", TensorProto.FLOAT, ["N", 2]), spec("START", TensorProto.FLOAT, ["N", 1]),
              spec("READY", TensorProto.FLOAT, ["N", 1]), spec("END", TensorProto.INT32, ["N", 1]),
              spec("CORRID", TensorProto.UINT64, ["N", 1]), spec("state_in", TensorProto.FLOAT, ["N", 2])]
    outputs = [spec("y", TensorProto.FLOAT, ["N", 2]), spec("state_out", TensorProto.FLOAT, ["N", 2]),
               spec("ctl", TensorProto.FLOAT, ["N", 4])]
    nodes = [helper.make_node("Add", ["x", "state_in"], ["y"]), helper.make_node("Identity", ["y"], ["state_out"]),
             helper.make_node("Cast", ["END"], ["end_f"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["CORRID"], ["corrid_f"], to=TensorProto.FLOAT),
             helper.make_node("Concat", ["START", "READY", "end_f", "corrid_f"], ["ctl"], axis=1)]
    model = helper.make_model(helper.make_graph(nodes, "stateful", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def stateful_repo(root: Path, name: str = "seq", idle_us: int = 5_000_000) -> Path:
    """``root/repo``: :func:`stateful_model` as model ``name`` with its ``sequence_batching`` configuration."""
    folder = root / "repo" / name
    (folder / "1").mkdir(parents=True)
    stateful_model(folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(STATEFUL_PBTXT.format(name=name, idle_us=idle_us))
    return root / "repo"


@contextlib.contextmanager
def serving(paths: Sequence[Any], **options: Any) -> Iterator[Any]:
    """An in-process server over ``paths`` (ONNX Runtime), gRPC on a free port as ``.grpc_url``; stopped after.

    ``options`` are :class:`hybrid.serve.ServeOptions` fields.
    """
    from hybrid.serve import BackgroundServer, ServeOptions, build_registry, create_app

    app = create_app(build_registry(list(paths), target="onnxruntime"),
                     ServeOptions(**{"grpc_address": "127.0.0.1:0", **options}))
    srv = BackgroundServer(app).start()
    srv.grpc_url = f"127.0.0.1:{app.state.hybrid.grpc_port}"
    try:
        yield srv
    finally:
        srv.stop()


def shared_memory_request(module: Any) -> tuple[list[Any], list[Any]]:
    """:func:`tiny_model`'s inputs and outputs, tritonclient's (``module``: http or grpc), read from and written to
    the regions ``in_x`` (offset 16), ``in_s`` and ``out_y`` (24 bytes at offset 8); ``s`` comes in the answer."""
    inputs = [module.InferInput("x", [2, 4], "FP32"), module.InferInput("scale", [2, 1], "FP32")]
    inputs[0].set_shared_memory("in_x", 2 * 4 * 4, offset=16)
    inputs[1].set_shared_memory("in_s", 2 * 4)
    y = module.InferRequestedOutput("y")
    y.set_shared_memory("out_y", 24, offset=8)
    return inputs, [y, module.InferRequestedOutput("s")]


@contextlib.contextmanager
def shared_memory_objects(sizes: Mapping[str, int]) -> Iterator[dict[str, tuple[str, Any]]]:
    """Shared memory objects made as a client makes them (tritonclient's utilities), destroyed after.

    Yields, per name of ``sizes``, the object's key (unique to this call) and its tritonclient handle.
    """
    import os
    import uuid

    import tritonclient.utils.shared_memory as tshm

    tag = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    made: dict[str, tuple[str, Any]] = {}
    try:
        for name, size in sizes.items():
            key = f"/pyasc_test_{name}_{tag}"
            made[name] = (key, tshm.create_shared_memory_region(f"{name}{tag}", key, size))
        yield made
    finally:
        for _, handle in made.values():
            tshm.destroy_shared_memory_region(handle)


def tiny_expected(x: np.ndarray, scale: np.ndarray, factor: float = 1.0) -> dict[str, np.ndarray]:
    return {"y": (x @ (W * np.float32(factor))) * scale, "s": x.sum(axis=1, keepdims=True)}


def int_model(path: Path) -> Path:
    """INT64 in, BOOL and INT64 out: pos = i > 0, twice = i + i."""
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["N", 3])
    pos = helper.make_tensor_value_info("pos", TensorProto.BOOL, ["N", 3])
    twice = helper.make_tensor_value_info("twice", TensorProto.INT64, ["N", 3])
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    nodes = [helper.make_node("Greater", ["i", "zero"], ["pos"]), helper.make_node("Add", ["i", "i"], ["twice"])]
    graph = helper.make_graph(nodes, "ints", [i], [pos, twice], [zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    return path


def dynamic_squeezenet(path: Path) -> Path:
    """ONNX's light SqueezeNet with a symbolic batch ('N'), saved to ``path``."""
    from hybrid.zoo.samples import light_model_batch_dynamic

    onnx.save(light_model_batch_dynamic("squeezenet"), path)
    return path


def v2_json(inputs: Mapping[str, np.ndarray], **extra: Any) -> bytes:
    """A JSON-only v2 request body."""
    dt = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
    doc = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": dt[v.dtype], "data": v.reshape(-1).tolist()}
                      for k, v in inputs.items()], **extra}
    return json.dumps(doc).encode()


@contextlib.contextmanager
def connection(url: str, timeout: float = 30.0) -> Iterator[http.client.HTTPConnection]:
    host, _, port = url.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        yield conn
    finally:
        conn.close()


def request(url: str, method: str, path: str, body: bytes | None = None,
            headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP request (no client-side normalization of the path); returns status, headers, body."""
    with connection(url) as conn:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()


def error_of(body: bytes) -> str:
    """The HybridError code of an error response, checking the {"error": "[HYB-...] ..."} shape."""
    doc = json.loads(body)
    assert doc["error"].startswith(f"[{doc['code']}] ")
    return doc["code"]


def poll(check: Callable[[], T], limit: float, every: float = 0.002) -> T | None:
    """``check()``'s first truthy result, looking every ``every`` seconds for ``limit`` seconds; None if none came.

    The one wait on the wall clock that the tests share: for what a real thread, process, socket or server does on
    its own clock (code that takes a clock is tested on tests/_scripted_time.py instead).
    """
    deadline = time.monotonic() + limit
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            return None
        time.sleep(every)  # real time: what is watched runs on its own clock


def wait_for(condition: Any, what: str, limit: float = 60.0, every: float = 0.002) -> None:
    """Wait until ``condition()`` holds, looking every ``every`` seconds; fail naming ``what`` after ``limit``."""
    assert poll(condition, limit, every), f"timed out waiting for {what}"


@dataclass
class Span:
    """One exported span, in a form both OTLP encodings give alike (ids in hex, times in ns)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, int]]
    start: int
    end: int
    resource: dict[str, Any]


def _value(value: Mapping[str, Any]) -> Any:
    (kind, v), = value.items()
    return int(v) if kind == "intValue" else v


def _spans_of(content_type: str, body: bytes) -> list[Span]:
    """The spans of one OTLP/HTTP export: protobuf (the Python SDK's) or JSON (the C++ SDK's, Triton's)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    if content_type.startswith("application/json"):
        doc, hexed = json.loads(body), True
    else:
        doc = MessageToDict(ExportTraceServiceRequest.FromString(body), use_integers_for_enums=True)
        hexed = False

    def ident(text: str) -> str:
        return text if hexed or not text else base64.b64decode(text).hex()

    return [Span(s["name"], ident(s["traceId"]), ident(s["spanId"]), ident(s.get("parentSpanId", "")),
                 int(s.get("kind", 0)), {a["key"]: _value(a["value"]) for a in s.get("attributes", [])},
                 [(e["name"], int(e["timeUnixNano"])) for e in s.get("events", [])],
                 int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]),
                 {a["key"]: _value(a["value"]) for a in resource.get("resource", {}).get("attributes", [])})
            for resource in doc.get("resourceSpans", []) for scope in resource.get("scopeSpans", [])
            for s in scope.get("spans", [])]


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint on loopback that keeps what it is sent (``url``: Triton's spelling)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.spans: list[Span] = []
        self.resources: list[dict[str, Any]] = []
        self._lock = threading.Condition()  # notified as spans come
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                spans = _spans_of(self.headers.get("Content-Type", ""), body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver._lock.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"127.0.0.1:{self._server.server_address[1]}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Span]:
        """The spans received once there are ``count`` of them (all there are after ``timeout`` seconds)."""
        with self._lock:
            self._lock.wait_for(lambda: len(self.spans) >= count, timeout)
            return list(self.spans)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> None:
    import typer

    from hybrid.cli.serve import register

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        """pyasc (serve only)."""

    register(app)
    app(args=list(argv) if argv is not None else None)


if __name__ == "__main__":
    main()
