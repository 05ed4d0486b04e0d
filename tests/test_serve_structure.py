"""The serving package's structure and its one check per request (issue 25).

No import circle inside ``hybrid.serve`` (the transports sit above ``serve.state`` and never import each
other); each inference request is checked against the model's signature once, plus the cheap check of
its declared inputs before an HTTP body is decoded, over HTTP (JSON and binary) and gRPC.
"""

from __future__ import annotations

import json
from pathlib import Path

import grimp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from _serve_support import connection, tiny_expected, tiny_model, v2_json

from hybrid.runtime.validate import InputValidator
from hybrid.serve import BackgroundServer, ServeOptions, build_registry, create_app


def test_no_import_cycle_inside_hybrid_serve() -> None:
    graph = grimp.build_graph("hybrid")  # imports under TYPE_CHECKING and inside functions count too
    modules = sorted(m for m in graph.modules if m == "hybrid.serve" or m.startswith("hybrid.serve."))
    cycles = [(a, b) for a in modules for b in graph.find_modules_directly_imported_by(a)
              if b.startswith("hybrid.serve.") and b != a and graph.chain_exists(importer=b, imported=a)]
    assert cycles == []
    # the transports share serve.state and never import each other
    for transport, other in [("hybrid.serve.grpc.server", "hybrid.serve.app"),
                             ("hybrid.serve.app", "hybrid.serve.grpc.server"),
                             ("hybrid.serve.http.extensions", "hybrid.serve.app"),
                             ("hybrid.serve.http.infer", "hybrid.serve.app"),
                             ("hybrid.serve.http.infer", "hybrid.serve.grpc.server"),
                             ("hybrid.serve.grpc.server", "hybrid.serve.http.infer")]:
        assert not graph.chain_exists(importer=transport, imported=other), (transport, other)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = InputValidator.feeds

    def feeds(self: InputValidator, given: object) -> object:
        calls.append(1)
        return original(self, given)

    monkeypatch.setattr(InputValidator, "feeds", feeds)
    return calls


def test_one_signature_check_per_request(tmp_path: Path, counting: list[int]) -> None:
    registry = build_registry([tiny_model(tmp_path / "tiny.onnx")], target="onnxruntime")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    scale = np.full((2, 1), 2, np.float32)
    want = tiny_expected(x, scale)
    with BackgroundServer(create_app(registry, ServeOptions(grpc_address="127.0.0.1:0"))) as srv:
        port = srv.server.state.grpc_port
        with connection(srv.url) as conn:
            counting.clear()
            conn.request("POST", "/v2/models/tiny/infer", v2_json({"x": x, "scale": scale}))
            doc = json.loads(conn.getresponse().read())
            np.testing.assert_allclose(np.array(doc["outputs"][0]["data"]).reshape(2, 3), want["y"], rtol=1e-5)
            assert len(counting) == 2  # the declared inputs before decoding, then the decoded request once

            head = json.dumps({"inputs": [
                {"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": 32}},
                {"name": "scale", "shape": [2, 1], "datatype": "FP32", "parameters": {"binary_data_size": 8}}],
                "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
            counting.clear()
            conn.request("POST", "/v2/models/tiny/infer", head + x.tobytes() + scale.tobytes(),
                         {"Inference-Header-Content-Length": str(len(head))})
            body = conn.getresponse().read()
            length = int(json.loads(body[:body.index(b"}]}") + 3])["outputs"][0]["parameters"]["binary_data_size"])
            np.testing.assert_allclose(np.frombuffer(body[-length:], np.float32).reshape(2, 3), want["y"], rtol=1e-5)
            assert len(counting) == 2  # the JSON header as it arrived, then the decoded request once

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        inputs = [grpcclient.InferInput("x", [2, 4], "FP32"), grpcclient.InferInput("scale", [2, 1], "FP32")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(scale)
        counting.clear()
        result = client.infer("tiny", inputs)
        np.testing.assert_allclose(result.as_numpy("y"), want["y"], rtol=1e-5)
        assert len(counting) == 1  # protobuf decoded the message: the request is checked once
        client.close()
