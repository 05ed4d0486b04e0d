"""The differential protocol test: the same requests to the real Triton server and to ``pyasc serve``.

Triton is ``tritonserver`` 2.51 from the nvidia-pytriton wheel (tests/_triton_real.py), serving the same ONNX files
through a Python-backend ``model.py`` that runs ONNX Runtime, ``max_batch_size: 8``. Over HTTP (raw requests) and gRPC
(tritonclient.grpc) the status codes and the response structure must match: metadata, config, statistics (also of a
model or version not served), a good inference in JSON and binary, a wrong shape, a wrong dtype, an unknown input, an
unknown model, a batch over the maximum, BYTES tensors, the classification extension (top classes with config.pbtxt's
labels, JSON, binary and gRPC), the system shared memory extension (register, status, unregister, tensors read from
and written to regions, and their errors), the logging extension (the settings read and changed, over HTTP and gRPC),
compressed answers (Accept-Encoding) and the trace extension (the settings of the server and a model read and changed,
the trace files both servers write, and the spans both export to an OpenTelemetry collector). Values that differ by
nature (server name, platform, counters, timings) are not compared; where Triton's message names what it expected,
pyasc's names it the same way. Skipped, with the reason, only where the wheel cannot run.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import http.client
import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _triton_real as tr
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as tshm
from _serve_support import (
    STATEFUL_PBTXT,
    poll,
    shared_memory_objects,
    shared_memory_request,
    stateful_repo,
    tiny_expected,
    tiny_model,
    wait_for,
)
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from hybrid.serve import BackgroundServer, ServeOptions, build_registry, create_app
from hybrid.serve.observe.trace import TraceConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

_REASON = tr.unavailable_reason()


def _text_model(path: Path) -> Path:
    t = helper.make_tensor_value_info("t", TensorProto.STRING, ["N", 2])
    u = helper.make_tensor_value_info("u", TensorProto.STRING, ["N", 2])
    graph = helper.make_graph([helper.make_node("Identity", ["t"], ["u"])], "text", [t], [u])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


_STATEFUL_PY = """\
import os
import sys

sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            y = (get("x") + get("state_in")).astype(np.float32)
            ctl = np.concatenate([get("START"), get("READY"), get("END").astype(np.float32),
                                  get("CORRID").astype(np.float32)], axis=1).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y), pb_utils.Tensor("ctl", ctl),
                                                         pb_utils.Tensor("state_out", y)]))
        return responses
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, str]]]:
    if _REASON:
        pytest.skip(_REASON)
    root = tmp_path_factory.mktemp("vs_triton")
    tiny, text = tiny_model(root / "tiny.onnx"), _text_model(root / "text.onnx")
    repo = root / "triton"
    tr.write_model(repo, "tiny", tiny, [tr.TritonSpec("x", "TYPE_FP32", [4]), tr.TritonSpec("scale", "TYPE_FP32", [1])],
                   [tr.TritonSpec("y", "TYPE_FP32", [3]), tr.TritonSpec("s", "TYPE_FP32", [1])], threads=1)
    tr.write_model(repo, "text", text, [tr.TritonSpec("t", "TYPE_STRING", [2])],
                   [tr.TritonSpec("u", "TYPE_STRING", [2])], threads=1)
    # the classification extension's labels come from config.pbtxt: pyasc serves a Triton folder of its own
    labelled = root / "labelled"
    for folder in (repo, labelled):
        tr.write_model(folder, "tinyl", tiny, [tr.TritonSpec("x", "TYPE_FP32", [4]),
                                               tr.TritonSpec("scale", "TYPE_FP32", [1])],
                       [tr.TritonSpec("y", "TYPE_FP32", [3], "labels.txt"), tr.TritonSpec("s", "TYPE_FP32", [1])],
                       threads=1)
        (folder / "tinyl" / "labels.txt").write_text("cat\ndog\n")  # fewer labels than classes
    # a stateful model: pyasc serves the ONNX model with its sequence_batching, Triton a model.py that computes the
    # same from the controls and state its sequence batcher feeds
    stateful = stateful_repo(root / "stateful")
    (repo / "seq" / "1").mkdir(parents=True)
    (repo / "seq" / "config.pbtxt").write_text(STATEFUL_PBTXT.format(name="seq", idle_us=5_000_000)
                                               + 'backend: "python"\n')
    (repo / "seq" / "1" / "model.py").write_text(_STATEFUL_PY)
    registry = build_registry([f"tiny={tiny}", f"text={text}", labelled, stateful], target="onnxruntime",
                              overrides={"max_batch": 8, "batch_timeout": 0.002})
    with tr.TritonServer(repo) as triton, \
            BackgroundServer(create_app(registry, ServeOptions(grpc_address="127.0.0.1:0"))) as pyasc:
        yield _urls(triton, pyasc)


def _urls(triton: tr.TritonServer, pyasc: BackgroundServer) -> dict[str, tuple[str, str]]:
    """Each server's HTTP and gRPC address, by name."""
    return {"triton": (triton.http_url, triton.grpc_url),
            "pyasc": (pyasc.url, f"127.0.0.1:{pyasc.server.state.grpc_port}")}


def _http(url: str, method: str, path: str, body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    host, _, port = url.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body, headers or {})
        r = conn.getresponse()
        return r.status, r.read(), {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()


def _both(servers: dict[str, tuple[str, str]], method: str, path: str, body: Any = None,
          headers: dict[str, str] | None = None) -> dict[str, tuple[int, bytes, dict[str, str]]]:
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    return {name: _http(urls[0], method, path, data, headers) for name, urls in servers.items()}


def _keys(doc: Any) -> Any:
    """The structure of a JSON document: the keys of its objects, recursively (first element of lists)."""
    if isinstance(doc, dict):
        return {k: _keys(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_keys(doc[0])] if doc and isinstance(doc[0], (dict, list)) else []
    return None


X = np.arange(8, dtype=np.float32).reshape(2, 4)
SCALE = np.full((2, 1), 0.5, np.float32)
GOOD = [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": X.reshape(-1).tolist()},
        {"name": "scale", "shape": [2, 1], "datatype": "FP32", "data": SCALE.reshape(-1).tolist()}]


def test_metadata_config_and_statistics_have_triton_s_structure(servers) -> None:
    for path in ("/v2/models/tiny", "/v2/models/tiny/config", "/v2/models/tiny/stats", "/v2/models/text"):
        got = _both(servers, "GET", path)
        assert got["pyasc"][0] == got["triton"][0] == 200, path
        mine, theirs = (json.loads(got[k][1]) for k in ("pyasc", "triton"))
        if path.endswith("/config"):
            assert set(mine) >= set(theirs) - {"runtime", "model_transaction_policy"}, path
            assert mine["max_batch_size"] == theirs["max_batch_size"] == 8
            assert [(t["name"], t["data_type"], t["dims"]) for t in mine["input"]] == \
                   [(t["name"], t["data_type"], t["dims"]) for t in theirs["input"]]
        elif path.endswith("/stats"):
            assert set(mine["model_stats"][0]) >= set(theirs["model_stats"][0]), path
            assert set(mine["model_stats"][0]["inference_stats"]) == set(theirs["model_stats"][0]["inference_stats"])
        else:
            assert _keys(mine) == _keys(theirs), path
            assert mine["inputs"] == theirs["inputs"] and mine["outputs"] == theirs["outputs"]


@pytest.mark.parametrize(("path", "says"), [
    ("/v2/models/nope/ready", "Model version not ready"),
    ("/v2/models/tiny/versions/9/ready", "Model version not ready"),
    ("/v2/models/nope/stats", "requested model 'nope' is not available"),
    ("/v2/models/tiny/versions/9/stats", "requested model version is not available for model 'tiny'"),
    ("/v2/models/nope/config", "nope"),
    ("/v2/models/nope", "nope"),
])
def test_a_model_not_served_answers_as_triton_s(servers, path, says) -> None:
    got = _both(servers, "GET", path)
    assert got["pyasc"][0] == got["triton"][0], (path, got)
    for name, (_, data, _) in got.items():
        assert says in json.loads(data)["error"], (name, path, data)
    ready = _grpc(servers, lambda c: (c.is_model_ready("nope"), c.is_model_ready("tiny", "9")))
    assert ready["pyasc"] == ready["triton"] == (False, False)
    for model, version, words in [("nope", "", "requested model 'nope' is not available"),
                                  ("tiny", "9", "requested model version is not available for model 'tiny'")]:
        stats = _grpc(servers, lambda c, m=model, v=version: c.get_inference_statistics(m, v))
        assert all(isinstance(e, InferenceServerException) for e in stats.values()), stats
        assert stats["pyasc"].status() == stats["triton"].status() == "StatusCode.INVALID_ARGUMENT"
        assert all(words in e.message() for e in stats.values()), stats


def test_load_and_unload_without_model_control_answer_as_triton_s(servers) -> None:
    # tritonserver's default (--model-control-mode none) and pyasc's (no --model-control): refused, 503 / UNAVAILABLE
    for action in ("load", "unload"):
        got = _both(servers, "POST", f"/v2/repository/models/tiny/{action}", {})
        assert got["pyasc"][0] == got["triton"][0] == 503, (action, got)
        for name, (_, data, _) in got.items():
            assert isinstance(json.loads(data).get("error"), str), (name, data)
    refused = _grpc(servers, lambda c: c.unload_model("tiny"))
    assert all(isinstance(e, InferenceServerException) for e in refused.values()), refused
    assert refused["pyasc"].status() == refused["triton"].status() == "StatusCode.UNAVAILABLE"
    ready = _grpc(servers, lambda c: c.is_model_ready("tiny"))
    assert ready == {"triton": True, "pyasc": True}  # still served


def test_good_inference_json_and_binary_match(servers) -> None:
    want = tiny_expected(X, SCALE)
    got = _both(servers, "POST", "/v2/models/tiny/infer", {"inputs": GOOD})
    docs = {k: json.loads(v[1]) for k, v in got.items()}
    assert got["pyasc"][0] == got["triton"][0] == 200
    assert _keys(docs["pyasc"]) == _keys(docs["triton"])
    for doc in docs.values():
        np.testing.assert_allclose(np.array(doc["outputs"][0]["data"]).reshape(2, 3), want["y"], rtol=1e-5)

    head = json.dumps({"inputs": [{**{k: v for k, v in t.items() if k != "data"},
                                   "parameters": {"binary_data_size": 4 * len(t["data"])}} for t in GOOD],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    body = head + X.tobytes() + SCALE.tobytes()
    got = _both(servers, "POST", "/v2/models/tiny/infer", body, {"Inference-Header-Content-Length": str(len(head))})
    for status, data, headers in got.values():
        assert status == 200
        n = int(headers["inference-header-content-length"])
        doc = json.loads(data[:n])
        assert [(o["name"], o["shape"], o["parameters"]["binary_data_size"]) for o in doc["outputs"]] == \
               [("y", [2, 3], 24)]
        np.testing.assert_allclose(np.frombuffer(data[n:], np.float32).reshape(2, 3), want["y"], rtol=1e-5)


@pytest.mark.parametrize(("case", "inputs", "model", "says"), [
    ("wrong shape", [{**GOOD[0], "shape": [2, 5], "data": [0.0] * 10}, GOOD[1]], "tiny", "Expected [-1,4], got [2,5]"),
    ("wrong dtype", [{**GOOD[0], "datatype": "FP64"}, GOOD[1]], "tiny", "data-type is 'FP64'"),
    ("unknown input", [*GOOD, {"name": "z", "shape": [2, 1], "datatype": "FP32", "data": [1.0, 1.0]}], "tiny", "'z'"),
    ("unknown model", GOOD, "nope", "nope"),
    ("batch over the maximum", [{"name": "x", "shape": [9, 4], "datatype": "FP32", "data": [0.0] * 36},
                                {"name": "scale", "shape": [9, 1], "datatype": "FP32", "data": [1.0] * 9}],
     "tiny", "inference request batch-size must be <= 8"),
])
def test_bad_requests_answer_like_triton_over_http(servers, case, inputs, model, says) -> None:
    got = _both(servers, "POST", f"/v2/models/{model}/infer", {"inputs": inputs})
    assert got["pyasc"][0] == got["triton"][0], (case, got)
    assert got["triton"][0] in (400, 404)
    for name, (_, data, _) in got.items():
        doc = json.loads(data)
        assert isinstance(doc.get("error"), str), (name, doc)
        assert says in doc["error"], (name, case, doc["error"])


def test_bytes_tensors_round_trip_on_both(servers) -> None:
    got = _both(servers, "POST", "/v2/models/text/infer",
                {"inputs": [{"name": "t", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "é"]}]})
    docs = {k: json.loads(v[1]) for k, v in got.items()}
    assert got["pyasc"][0] == got["triton"][0] == 200
    assert docs["pyasc"]["outputs"] == docs["triton"]["outputs"] == [
        {"name": "u", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "é"]}]


def _grpc_inputs(x: np.ndarray, scale: np.ndarray, extra: bool = False, dtype: Any = None) -> list[Any]:
    arrays = {"x": x if dtype is None else x.astype(dtype), "scale": scale, **({"z": scale} if extra else {})}
    inputs = []
    for name, arr in arrays.items():
        inp = grpcclient.InferInput(name, list(arr.shape), "FP64" if arr.dtype == np.float64 else "FP32")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def _grpc(servers, call) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (_, url) in servers.items():
        client = grpcclient.InferenceServerClient(url)
        try:
            out[name] = call(client)
        except InferenceServerException as e:
            out[name] = e
        finally:
            client.close()
    return out


def test_grpc_answers_like_triton(servers) -> None:
    meta = _grpc(servers, lambda c: c.get_model_metadata("tiny", as_json=True))
    assert meta["pyasc"]["inputs"] == meta["triton"]["inputs"] and set(meta["pyasc"]) == set(meta["triton"])
    config = _grpc(servers, lambda c: c.get_model_config("tiny", as_json=True))
    assert config["pyasc"]["config"]["max_batch_size"] == config["triton"]["config"]["max_batch_size"] == 8
    stats = _grpc(servers, lambda c: c.get_inference_statistics("tiny", as_json=True))
    assert set(stats["pyasc"]["model_stats"][0]) >= set(stats["triton"]["model_stats"][0]) - {"memory_usage"}

    good = _grpc(servers, lambda c: c.infer("tiny", _grpc_inputs(X, SCALE)))
    for result in good.values():
        np.testing.assert_allclose(result.as_numpy("y"), tiny_expected(X, SCALE)["y"], rtol=1e-5)
    assert [o["name"] for o in good["pyasc"].get_response(as_json=True)["outputs"]] == \
           [o["name"] for o in good["triton"].get_response(as_json=True)["outputs"]]
    text = _grpc(servers, lambda c: c.infer("text", [_bytes_input()]))
    for result in text.values():
        assert result.as_numpy("u").tolist() == [[b"a", "é".encode()]]

    nine = np.zeros((9, 4), np.float32), np.ones((9, 1), np.float32)
    for case, call, says in [
            ("wrong shape", lambda c: c.infer("tiny", _grpc_inputs(np.zeros((2, 5), np.float32), SCALE)),
             "Expected [-1,4], got [2,5]"),
            ("wrong dtype", lambda c: c.infer("tiny", _grpc_inputs(X, SCALE, dtype=np.float64)), "data-type is 'FP64'"),
            ("unknown input", lambda c: c.infer("tiny", _grpc_inputs(X, SCALE, extra=True)), "'z'"),
            ("unknown model", lambda c: c.infer("nope", _grpc_inputs(X, SCALE)), "nope"),
            ("batch over the maximum", lambda c: c.infer("tiny", _grpc_inputs(*nine)),
             "inference request batch-size must be <= 8"),
            ("unknown model metadata", lambda c: c.get_model_metadata("nope"), "nope")]:
        got = _grpc(servers, call)
        assert all(isinstance(e, InferenceServerException) for e in got.values()), (case, got)
        assert got["pyasc"].status() == got["triton"].status(), (case, got)
        for name, e in got.items():
            assert says in e.message(), (name, case, e.message())


def _bytes_input() -> Any:
    inp = grpcclient.InferInput("t", [1, 2], "BYTES")
    inp.set_data_from_numpy(np.array([[b"a", "é".encode()]], dtype=object))
    return inp


CLASSIFY = [[{"name": "y", "parameters": {"classification": 2}}],
            [{"name": "y", "parameters": {"classification": 5}}],  # more than the 3 classes
            [{"name": "y", "parameters": {"classification": 0}}],  # 0: the values
            [{"name": "s", "parameters": {"classification": 1}}, {"name": "y"}]]


@pytest.mark.parametrize("model", ["tiny", "tinyl"])
@pytest.mark.parametrize("outputs", CLASSIFY)
def test_classification_answers_as_triton_s_over_http(servers, model, outputs) -> None:
    got = _both(servers, "POST", f"/v2/models/{model}/infer", {"inputs": GOOD, "outputs": outputs})
    assert got["pyasc"][0] == got["triton"][0] == 200
    mine, theirs = ({o["name"]: o for o in json.loads(got[k][1])["outputs"]} for k in ("pyasc", "triton"))
    assert mine.keys() == theirs.keys()
    for name, out in theirs.items():
        if out["datatype"] == "BYTES":
            assert mine[name] == out, (model, outputs)  # the strings themselves: "%f:index[:label]"
        else:
            assert (mine[name]["datatype"], mine[name]["shape"]) == (out["datatype"], out["shape"])
            np.testing.assert_allclose(mine[name]["data"], out["data"], rtol=1e-6)

    head = json.dumps({"inputs": GOOD, "outputs": [{**o, "parameters": {**o.get("parameters", {}), "binary_data": True}}
                                                   for o in outputs]}).encode()
    got = _both(servers, "POST", f"/v2/models/{model}/infer", head)
    answers = {}
    for name, (status, data, headers) in got.items():
        assert status == 200
        n = int(headers["inference-header-content-length"])
        answers[name] = (json.loads(data[:n])["outputs"], data[n:])
    if all(o["datatype"] == "BYTES" for o in answers["triton"][0]):
        assert answers["pyasc"] == answers["triton"]


def test_classification_answers_as_triton_s_over_grpc(servers) -> None:
    for model in ("tiny", "tinyl"):
        got = _grpc(servers, lambda c, m=model: c.infer(m, _grpc_inputs(X, SCALE), outputs=[
            grpcclient.InferRequestedOutput("y", class_count=2), grpcclient.InferRequestedOutput("s")]))
        assert got["pyasc"].as_numpy("y").tolist() == got["triton"].as_numpy("y").tolist(), model
        assert [(o.name, o.datatype, list(o.shape)) for o in got["pyasc"].get_response().outputs] == \
               [(o.name, o.datatype, list(o.shape)) for o in got["triton"].get_response().outputs]
    negative = grpcclient.InferRequestedOutput("y")
    negative._output.parameters["classification"].int64_param = -2
    got = _grpc(servers, lambda c: c.infer("tiny", _grpc_inputs(X, SCALE), outputs=[negative]))
    assert all(isinstance(e, InferenceServerException) for e in got.values()), got
    assert got["pyasc"].status() == got["triton"].status() == "StatusCode.INVALID_ARGUMENT"


@pytest.fixture
def regions(servers) -> Iterator[tuple[str, dict[str, Any]]]:
    """Shared memory objects a client made (tritonclient's utilities), nothing registered with either server."""
    with shared_memory_objects({"x": 16 + X.nbytes, "s": SCALE.nbytes, "y": 64}) as made:
        handles = {name: handle for name, (_, handle) in made.items()}
        tshm.set_shared_memory_region(handles["x"], [X], offset=16)
        tshm.set_shared_memory_region(handles["s"], [SCALE])
        try:
            yield {name: key for name, (key, _) in made.items()}, handles
        finally:
            for name in servers:
                _http(servers[name][0], "POST", "/v2/systemsharedmemory/unregister")


def test_system_shared_memory_answers_as_triton_s_over_http(servers, regions) -> None:
    keys, handles = regions
    register = [("in_x", keys["x"], 16 + X.nbytes), ("in_s", keys["s"], SCALE.nbytes), ("out_y", keys["y"], 64)]
    for name, key, size in register:
        got = _both(servers, "POST", f"/v2/systemsharedmemory/region/{name}/register",
                    {"key": key, "offset": 0, "byte_size": size})
        assert got["pyasc"][:2] == got["triton"][:2] == (200, b"")
    for path, body, status in [
            ("/v2/systemsharedmemory/region/in_x/register", {"key": keys["x"], "byte_size": 8}, 400),
            ("/v2/systemsharedmemory/region/nokey/register", {"offset": 0, "byte_size": 8}, 400)]:
        got = _both(servers, "POST", path, body)
        assert got["pyasc"][0] == got["triton"][0] == status, (path, got)
    got = _both(servers, "GET", "/v2/systemsharedmemory/status")
    assert json.loads(got["pyasc"][1]) == json.loads(got["triton"][1]) == [
        {"name": n, "key": k, "offset": 0, "byte_size": b} for n, k, b in sorted(register)]
    got = _both(servers, "GET", "/v2/systemsharedmemory/region/in_x/status")
    assert json.loads(got["pyasc"][1]) == json.loads(got["triton"][1])
    assert _both(servers, "GET", "/v2/systemsharedmemory/region/zzz/status")["pyasc"][0] == 404

    def request(change: Any = None) -> dict[str, Any]:
        doc = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {
                   "shared_memory_region": "in_x", "shared_memory_byte_size": X.nbytes, "shared_memory_offset": 16}},
                          {"name": "scale", "shape": [2, 1], "datatype": "FP32", "parameters": {
                   "shared_memory_region": "in_s", "shared_memory_byte_size": SCALE.nbytes}}],
               "outputs": [{"name": "y", "parameters": {"shared_memory_region": "out_y", "shared_memory_byte_size": 40,
                                                        "shared_memory_offset": 8}}, {"name": "s"}]}
        if change:
            change(doc)
        return doc

    written = {}
    for name, (url, _) in servers.items():
        tshm.set_shared_memory_region(handles["y"], [np.zeros(16, np.float32)])
        status, data, _ = _http(url, "POST", "/v2/models/tiny/infer", json.dumps(request()).encode())
        assert status == 200
        written[name] = (json.loads(data)["outputs"], tshm.get_contents_as_numpy(handles["y"], np.float32, [2, 3], 8))
    assert written["pyasc"][0] == written["triton"][0]  # no data for 'y', in its region
    np.testing.assert_allclose(written["pyasc"][1], tiny_expected(X, SCALE)["y"], rtol=1e-5)
    np.testing.assert_allclose(written["triton"][1], written["pyasc"][1], rtol=1e-6)

    for case, change, status in [
            ("byte size", lambda d: d["inputs"][0]["parameters"].update(shared_memory_byte_size=28), 400),
            ("no byte size", lambda d: d["inputs"][0]["parameters"].pop("shared_memory_byte_size"), 400),
            ("offset past the region", lambda d: d["inputs"][0]["parameters"].update(shared_memory_offset=40), 400),
            ("unknown region", lambda d: d["inputs"][0]["parameters"].update(shared_memory_region="nope"), 404),
            ("data and region", lambda d: d["inputs"][0].update(data=[0.0] * 8), 400),
            ("region and classification", lambda d: d["outputs"][0]["parameters"].update(classification=2), 400),
            ("region and binary", lambda d: d["outputs"][0]["parameters"].update(binary_data=True), 400)]:
        got = _both(servers, "POST", "/v2/models/tiny/infer", request(change))
        assert got["pyasc"][0] == got["triton"][0] == status, (case, got)

    for path in ("/v2/systemsharedmemory/region/in_x/unregister", "/v2/systemsharedmemory/region/zzz/unregister",
                 "/v2/systemsharedmemory/unregister"):
        got = _both(servers, "POST", path)
        assert got["pyasc"][:2] == got["triton"][:2] == (200, b""), path
    got = _both(servers, "GET", "/v2/systemsharedmemory/status")
    assert json.loads(got["pyasc"][1]) == json.loads(got["triton"][1]) == []


def test_system_shared_memory_answers_as_triton_s_over_grpc(servers, regions) -> None:
    keys, handles = regions

    def flow(client: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        client.register_system_shared_memory("in_x", keys["x"], 16 + X.nbytes)
        client.register_system_shared_memory("in_s", keys["s"], SCALE.nbytes)
        client.register_system_shared_memory("out_y", keys["y"], 64)
        out["status"] = client.get_system_shared_memory_status(as_json=True)
        for case, call in [("twice", lambda: client.register_system_shared_memory("in_x", keys["x"], 8)),
                           ("unknown status", lambda: client.get_system_shared_memory_status("zzz"))]:
            try:
                call()
                out[case] = "ok"
            except InferenceServerException as e:
                out[case] = e.status()
        tshm.set_shared_memory_region(handles["y"], [np.zeros(16, np.float32)])
        inputs, outputs = shared_memory_request(grpcclient)
        result = client.infer("tiny", inputs, outputs=outputs)
        response = result.get_response()
        out["outputs"] = [(o.name, o.datatype, list(o.shape)) for o in response.outputs]
        out["raw"] = [len(r) for r in response.raw_output_contents]
        out["y"] = tshm.get_contents_as_numpy(handles["y"], np.float32, [2, 3], 8).tolist()
        mixed = [grpcclient.InferInput("x", [2, 4], "FP32"), grpcclient.InferInput("scale", [2, 1], "FP32")]
        mixed[0].set_data_from_numpy(X)
        mixed[1].set_shared_memory("in_s", SCALE.nbytes)
        out["mixed"] = client.infer("tiny", mixed).as_numpy("y").tolist()
        client.unregister_system_shared_memory("zzz")
        client.unregister_system_shared_memory()
        out["after"] = client.get_system_shared_memory_status(as_json=True)
        return out

    got = _grpc(servers, flow)
    assert not isinstance(got["pyasc"], Exception) and not isinstance(got["triton"], Exception), got
    mine, theirs = got["pyasc"], got["triton"]
    for key in ("status", "twice", "unknown status", "outputs", "raw", "after"):
        assert mine[key] == theirs[key], key
    assert theirs["twice"] == "StatusCode.ALREADY_EXISTS" and theirs["unknown status"] == "StatusCode.NOT_FOUND"
    for key in ("y", "mixed"):
        np.testing.assert_allclose(mine[key], theirs[key], rtol=1e-6)


@pytest.fixture
def hybrid_log_level() -> Iterator[None]:
    """The in-process pyasc server's log settings are this process's ``hybrid`` logger: put its level back."""
    level = logging.getLogger("hybrid").level
    try:
        yield
    finally:
        logging.getLogger("hybrid").setLevel(level)


def test_log_settings_answer_as_triton_s(servers, hybrid_log_level) -> None:
    everything = {"log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0}
    for change in (everything, {"log_info": False}, {"log_info": True, "log_verbose_level": 1}, everything):
        got = _both(servers, "POST", "/v2/logging", change)
        assert got["pyasc"][0] == got["triton"][0] == 200, change
        assert json.loads(got["pyasc"][1]) == json.loads(got["triton"][1]), change
    got = _both(servers, "GET", "/v2/logging")
    assert json.loads(got["pyasc"][1]) == json.loads(got["triton"][1])
    got = _both(servers, "POST", "/v2/logging", {"log_file": "/tmp/pyasc-vs-triton.log"})
    assert got["pyasc"][0] >= 400 and got["triton"][0] >= 400  # neither moves its log file over the network

    def flow(client: Any) -> list[Any]:
        return [client.update_log_settings({"log_info": False}, as_json=True),
                client.update_log_settings({"log_info": True}, as_json=True), client.get_log_settings(as_json=True)]

    got = _grpc(servers, flow)
    assert got["pyasc"] == got["triton"]


@pytest.mark.parametrize("accept", ["gzip", "deflate", "gzip;q=0, deflate", "br", "*"])
def test_answers_are_compressed_as_triton_s(servers, accept) -> None:
    import zlib

    body = json.dumps({"inputs": GOOD, "outputs": [{"name": "y", "parameters": {"binary_data": True}},
                                                   {"name": "s"}]}).encode()
    got = _both(servers, "POST", "/v2/models/tiny/infer", body, {"Accept-Encoding": accept})
    codings = {name: headers.get("content-encoding") for name, (_, _, headers) in got.items()}
    assert codings["pyasc"] == codings["triton"], codings
    for name, (status, data, headers) in got.items():
        assert status == 200
        if codings[name]:
            data = zlib.decompress(data, 16 + zlib.MAX_WBITS if codings[name] == "gzip" else zlib.MAX_WBITS)
        n = int(headers["inference-header-content-length"])  # the JSON part before compression, in both
        doc = json.loads(data[:n])
        assert sorted(o["name"] for o in doc["outputs"]) == ["s", "y"]
        np.testing.assert_allclose(np.frombuffer(data[n:], np.float32).reshape(2, 3), tiny_expected(X, SCALE)["y"],
                                   rtol=1e-5)


def _tiny_pair(tmp_path: Path) -> tuple[Path, Any]:
    """The tiny model as a Triton repository (Python backend, one ORT thread) and as pyasc's registry (ORT)."""
    tiny = tiny_model(tmp_path / "tiny.onnx")
    repo = tmp_path / "repo"
    tr.write_model(repo, "tiny", tiny, [tr.TritonSpec("x", "TYPE_FP32", [4]), tr.TritonSpec("scale", "TYPE_FP32", [1])],
                   [tr.TritonSpec("y", "TYPE_FP32", [3]), tr.TritonSpec("s", "TYPE_FP32", [1])], threads=1)
    return repo, build_registry([f"tiny={tiny}"], target="onnxruntime",
                                overrides={"max_batch": 8, "batch_timeout": 0.002})


def _without_file(doc: dict[str, Any]) -> dict[str, Any]:
    """A trace settings document without ``trace_file`` (each server writes its own)."""
    settings = doc.get("settings", doc)
    out = {k: v for k, v in settings.items() if k != "trace_file"}
    return {"settings": out} if "settings" in doc else out


def _traces(path: Path) -> dict[int, dict[str, Any]]:
    """A trace file by trace id: its request, its timestamps' names, its tensors."""
    traces: dict[int, dict[str, Any]] = {}
    for entry in json.loads(path.read_text()):
        trace = traces.setdefault(entry["id"], {"head": None, "stamps": set(), "tensors": {}})
        if "model_name" in entry:
            trace["head"] = entry
        elif "timestamps" in entry:
            trace["stamps"].update(t["name"] for t in entry["timestamps"])
        else:
            tensor = entry["tensor"]
            trace["tensors"][(entry["activity"], tensor["name"])] = tensor
    return traces


def test_trace_settings_and_files_as_triton_s(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    repo, registry = _tiny_pair(tmp_path)
    files = {name: tmp_path / name / "trace.json" for name in ("triton", "pyasc")}
    for path in files.values():
        path.parent.mkdir()
    options = ["level=TIMESTAMPS", "rate=1"]
    flags = [a for o in [f"triton,file={files['triton']}", *options] for a in ("--trace-config", o)]
    config = TraceConfig.from_options([f"triton,file={files['pyasc']}", *options])
    with tr.TritonServer(repo, extra_args=flags) as triton, \
            BackgroundServer(create_app(registry, ServeOptions(grpc_address="127.0.0.1:0", trace=config))) as pyasc:
        servers = _urls(triton, pyasc)
        steps = [("GET", "/v2/trace/setting", None), ("GET", "/v2/models/tiny/trace/setting", None),
                 ("POST", "/v2/trace/setting", {"trace_rate": "5", "trace_count": "20"}),
                 ("POST", "/v2/models/tiny/trace/setting", {"trace_count": "3", "trace_level": ["TENSORS"]}),
                 ("GET", "/v2/models/tiny/trace/setting", None), ("GET", "/v2/trace/setting", None),
                 ("POST", "/v2/trace/setting", {"trace_rate": "7"}), ("GET", "/v2/models/tiny/trace/setting", None),
                 ("POST", "/v2/models/tiny/trace/setting", {"trace_count": None, "trace_level": None}),
                 ("POST", "/v2/trace/setting", {"trace_rate": None, "trace_count": None}),
                 ("POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS", "TENSORS"], "log_frequency": "0"})]
        for method, path, body in steps:
            got = _both(servers, method, path, body)
            assert got["pyasc"][0] == got["triton"][0] == 200, (path, body, got)
            assert _without_file(json.loads(got["pyasc"][1])) == _without_file(json.loads(got["triton"][1])), \
                (path, body, got)
        for body in ({"trace_file": str(tmp_path / "elsewhere.json")}, {"trace_rate": "often"},
                     {"trace_level": ["OFF", "TIMESTAMPS"]}, {"trace_count": "-2"}):
            got = _both(servers, "POST", "/v2/trace/setting", body)
            assert got["pyasc"][0] >= 400 and got["triton"][0] >= 400, (body, got)

        def flow(client: Any) -> list[Any]:
            return [_without_file(client.update_trace_settings(settings={"trace_rate": "2"}, as_json=True)),
                    _without_file(client.update_trace_settings(model_name="tiny", settings={"trace_count": "9"},
                                                               as_json=True)),
                    _without_file(client.update_trace_settings(model_name="tiny", settings={"trace_count": None},
                                                               as_json=True)),
                    _without_file(client.update_trace_settings(settings={"trace_rate": "1"}, as_json=True)),
                    _without_file(client.get_trace_settings(model_name="tiny", as_json=True))]

        got = _grpc(servers, flow)
        assert got["pyasc"] == got["triton"]
        for k in range(2):
            for name, (http_url, grpc_url) in servers.items():
                body = {"id": f"h{k}", "inputs": GOOD}
                assert _http(http_url, "POST", "/v2/models/tiny/infer", json.dumps(body).encode())[0] == 200, name
                client = grpcclient.InferenceServerClient(grpc_url)
                client.infer("tiny", _grpc_inputs(X, SCALE), request_id=f"g{k}")
                client.close()
    traces = {name: _traces(path) for name, path in files.items()}  # both write their file as they stop
    assert [t["head"] for t in traces["pyasc"].values()] == [t["head"] for t in traces["triton"].values()]
    assert [t["head"]["request_id"] for t in traces["pyasc"].values()] == ["h0", "g0", "h1", "g1"]
    for (mine, theirs) in zip(traces["pyasc"].values(), traces["triton"].values(), strict=True):
        if mine["head"]["request_id"].startswith("h"):
            assert mine["stamps"] == theirs["stamps"]
        else:  # grpcio hands pyasc a request already read: when the read began is not known
            assert theirs["stamps"] - mine["stamps"] == {"GRPC_WAITREAD_START"} and mine["stamps"] <= theirs["stamps"]
        assert mine["tensors"].keys() == theirs["tensors"].keys()
        for key, tensor in mine["tensors"].items():
            other = theirs["tensors"][key]
            assert (tensor["shape"], tensor["dtype"]) == (other["shape"], other["dtype"]), key
            np.testing.assert_allclose(np.array(tensor["data"].split(","), float),
                                       np.array(other["data"].split(","), float), rtol=1e-5, err_msg=str(key))


def _span_tree(spans: list[Any]) -> dict[str, dict[str, Any]]:
    """Exported spans by request (its ``triton.request_id``; ``"-"`` for a trace without a model span), each span
    as what both servers must agree on: its parent (another span's name, the client's span id, or none), kind,
    attributes and event names (``GRPC_WAITREAD_START`` left out: grpcio does not show it to pyasc)."""
    traces: dict[str, list[Any]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    out: dict[str, dict[str, Any]] = {}
    for members in traces.values():
        names = {span.span_id: span.name for span in members}
        model = [span for span in members if "triton.model_name" in span.attributes]
        key = model[0].attributes.get("triton.request_id", "") if model else "-"
        out[key] = {span.name: (names.get(span.parent_id, span.parent_id), span.kind, span.attributes,
                                [e for e, _ in span.events if e != "GRPC_WAITREAD_START"],
                                span.trace_id if span.parent_id and span.parent_id not in names else None)
                    for span in members}
    return out


def test_opentelemetry_spans_as_triton_s(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    from _serve_support import OtlpReceiver

    repo, registry = _tiny_pair(tmp_path)
    options = ["mode=opentelemetry", "level=TIMESTAMPS", "rate=1", "opentelemetry,bsp_schedule_delay=50",
               "opentelemetry,resource=service.name=vs-triton"]
    parents = {"http": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
               "grpc": "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"}
    with OtlpReceiver() as theirs, OtlpReceiver() as mine:
        flags = [a for o in [*options, f"opentelemetry,url={theirs.url}"] for a in ("--trace-config", o)]
        config = TraceConfig.from_options([*options, f"opentelemetry,url={mine.url}"])
        with tr.TritonServer(repo, extra_args=flags) as triton, \
                BackgroundServer(create_app(registry, ServeOptions(grpc_address="127.0.0.1:0", trace=config))) as pyasc:
            servers = _urls(triton, pyasc)
            steps = [("GET", "/v2/trace/setting", None), ("GET", "/v2/models/tiny/trace/setting", None),
                     ("POST", "/v2/models/tiny/trace/setting", {"trace_rate": "3", "trace_count": "5"}),
                     ("POST", "/v2/trace/setting", {"trace_rate": "2"}),
                     ("POST", "/v2/models/tiny/trace/setting", {"trace_rate": None, "trace_count": None}),
                     ("POST", "/v2/trace/setting", {"trace_rate": "1"})]
            for method, path, body in steps:
                got = _both(servers, method, path, body)
                assert got["pyasc"][0] == got["triton"][0] == 200, (path, body, got)
                docs = [{k: v for k, v in json.loads(got[name][1]).items() if k != "url"} for name in got]
                assert docs[0] == docs[1], (path, body, docs)
            got = _both(servers, "POST", "/v2/trace/setting", {"trace_file": str(tmp_path / "t.json")})
            assert got["pyasc"][0] >= 400 and got["triton"][0] >= 400, got
            got = _grpc(servers, lambda c: {k: v for k, v in c.get_trace_settings(as_json=True)["settings"].items()
                                            if k != "url"})
            assert got["pyasc"] == got["triton"]
            for name, (http_url, grpc_url) in servers.items():
                for k in range(2):
                    headers = {"traceparent": parents["http"]} if k else {}
                    status, *_ = _http(http_url, "POST", "/v2/models/tiny/infer",
                                       json.dumps({"id": f"h{k}", "inputs": GOOD}).encode(), headers)
                    assert status == 200, name
                client = grpcclient.InferenceServerClient(grpc_url)
                client.infer("tiny", _grpc_inputs(X, SCALE), request_id="g0")
                client.infer("tiny", _grpc_inputs(X, SCALE), request_id="g1", headers={"traceparent": parents["grpc"]})
                client.close()
                bad = json.dumps({"id": "bad", "inputs": GOOD[:1]}).encode()  # refused before the model: no spans
                assert _http(http_url, "POST", "/v2/models/tiny/infer", bad)[0] == 400, name
            assert {name: _both(servers, "POST", "/v2/trace/setting", {"trace_level": ["TENSORS"]})[name][0]
                    for name in servers} == {"triton": 200, "pyasc": 200}
            for name, (http_url, _) in servers.items():
                body = json.dumps({"id": "t", "inputs": GOOD}).encode()
                assert _http(http_url, "POST", "/v2/models/tiny/infer", body)[0] == 200, name
            spans = {"triton": theirs.wait_for(13), "pyasc": mine.wait_for(13)}
    assert len(spans["triton"]) == len(spans["pyasc"]) == 13, spans
    trees = {name: _span_tree(found) for name, found in spans.items()}
    assert trees["pyasc"] == trees["triton"]
    assert sorted(trees["pyasc"]) == ["-", "g0", "g1", "h0", "h1"]
    assert trees["pyasc"]["h1"]["InferRequest"][0] == "b7ad6b7169203331"  # the client's span, continued
    assert trees["pyasc"]["g1"]["InferRequest"][4] == "1af7651916cd43dd8448eb211c80319c"
    for span in spans["pyasc"]:
        assert span.resource["service.name"] == "vs-triton"
        assert span.start <= min((t for _, t in span.events), default=span.start)
        assert max((t for _, t in span.events), default=span.end) <= span.end


def _sequence_body(sequence: dict[str, Any], rows: int = 1) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "shape": [rows, 2], "datatype": "FP32", "data": [1.5] * 2 * rows}],
            "parameters": sequence}


def test_sequences_answer_as_triton_s(servers) -> None:
    got = _both(servers, "GET", "/v2/models/seq")
    mine, theirs = (json.loads(got[k][1]) for k in ("pyasc", "triton"))
    assert (mine["inputs"], mine["outputs"]) == (theirs["inputs"], theirs["outputs"])  # no control, no state
    # Triton's Python backend does not carry implicit state from one request to the next (its state input stays
    # the initial one), so the answers compared are the controls the sequence batcher fed and the errors
    steps = [("no sequence id", {}, 1), ("not started", {"sequence_id": 41}, 1),
             ("start", {"sequence_id": 41, "sequence_start": True}, 1), ("next", {"sequence_id": 41}, 1),
             ("two rows", {"sequence_id": 41}, 2), ("end", {"sequence_id": 41, "sequence_end": True}, 1),
             ("after its end", {"sequence_id": 41}, 1),
             ("start and end at once", {"sequence_id": 42, "sequence_start": True, "sequence_end": True}, 1)]
    for case, sequence, rows in steps:
        got = _both(servers, "POST", "/v2/models/seq/infer", _sequence_body(sequence, rows))
        assert got["pyasc"][0] == got["triton"][0], (case, got)
        mine, theirs = (json.loads(got[k][1]) for k in ("pyasc", "triton"))
        if got["triton"][0] == 200:
            ctl = {name: next(o["data"] for o in doc["outputs"] if o["name"] == "ctl")
                   for name, doc in (("pyasc", mine), ("triton", theirs))}
            assert ctl["pyasc"] == ctl["triton"], (case, ctl)
        else:
            assert theirs["error"] in mine["error"], (case, mine, theirs)

    def flow(client: Any) -> list[Any]:
        def call(**sequence: Any) -> Any:
            try:
                return client.infer("seq", _x_input(), **sequence).as_numpy("ctl").tolist()
            except InferenceServerException as e:
                return e.status(), e.message().rpartition("] ")[2].split(" (hint")[0]

        return [call(), call(sequence_id=51), call(sequence_id=51, sequence_start=True), call(sequence_id=51),
                call(sequence_id=51, sequence_end=True), call(sequence_id=51)]

    got = _grpc(servers, flow)
    assert got["pyasc"] == got["triton"]
    assert got["pyasc"][2:5] == [[[1.0, 1.0, 0.0, 51.0]], [[0.0, 1.0, 0.0, 51.0]], [[0.0, 1.0, 1.0, 51.0]]]
    # a model without sequence batching takes the parameters and ignores them, as Triton's
    got = _both(servers, "POST", "/v2/models/tiny/infer", {"inputs": GOOD, "parameters": {"sequence_id": 5}})
    assert got["pyasc"][0] == got["triton"][0] == 200


def _x_input() -> list[Any]:
    inp = grpcclient.InferInput("x", [1, 2], "FP32")
    inp.set_data_from_numpy(np.full((1, 2), 1.5, np.float32))
    return [inp]


@contextlib.contextmanager
def _controlled(tmp_path: Path) -> Iterator[dict[str, tuple[str, str]]]:
    """Triton in explicit model-control mode and pyasc with ``--model-control``, each over its own copy of one
    repository holding the tiny model (Python backend for Triton)."""
    tiny = tiny_model(tmp_path / "tiny.onnx")
    folders = {name: tmp_path / name for name in ("triton", "pyasc")}
    for folder in folders.values():  # the same Triton repository, one copy each
        tr.write_model(folder, "tiny", tiny, [tr.TritonSpec("x", "TYPE_FP32", [4]),
                                              tr.TritonSpec("scale", "TYPE_FP32", [1])],
                       [tr.TritonSpec("y", "TYPE_FP32", [3]), tr.TritonSpec("s", "TYPE_FP32", [1])], threads=1)
    registry = build_registry([folders["pyasc"]], target="onnxruntime")
    app = create_app(registry, ServeOptions(grpc_address="127.0.0.1:0", model_control=True))
    with tr.TritonServer(folders["triton"], extra_args=["--model-control-mode", "explicit", "--load-model",
                                                        "tiny"]) as triton, BackgroundServer(app) as pyasc:
        yield _urls(triton, pyasc)


def test_a_load_with_a_config_as_triton_s(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    with _controlled(tmp_path) as servers:
        given = json.loads(_both(servers, "GET", "/v2/models/tiny/config")["triton"][1])
        small = {"name": "tiny", "backend": "python", "max_batch_size": 4, "input": given["input"],
                 "output": given["output"], "dynamic_batching": {}}

        def max_batch_sizes() -> dict[str, int]:
            got = _both(servers, "GET", "/v2/models/tiny/config")
            return {name: json.loads(body)["max_batch_size"] for name, (_, body, _) in got.items()}

        got = _both(servers, "POST", "/v2/repository/models/tiny/load", {"parameters": {"config": json.dumps(small)}})
        assert got["pyasc"][0] == got["triton"][0] == 200, got
        assert max_batch_sizes() == {"pyasc": 4, "triton": 4}
        five = [{"name": "x", "shape": [5, 4], "datatype": "FP32", "data": [0.0] * 20},
                {"name": "scale", "shape": [5, 1], "datatype": "FP32", "data": [1.0] * 5}]
        got = _both(servers, "POST", "/v2/models/tiny/infer", {"inputs": five})
        assert got["pyasc"][0] == got["triton"][0] == 400
        assert "inference request batch-size must be <= 4" in json.loads(got["pyasc"][1])["error"]
        # a load without a config: pyasc reloads from the repository (its config.pbtxt again); Triton 2.51 reloads
        # only a model whose files changed, and keeps serving the last load's config (a deliberate difference)
        got = _both(servers, "POST", "/v2/repository/models/tiny/load", {})
        assert got["pyasc"][0] == got["triton"][0] == 200 and max_batch_sizes() == {"pyasc": 8, "triton": 4}
        got = _both(servers, "POST", "/v2/repository/models/tiny/load", {"parameters": {"config": "{not json"}})
        assert got["pyasc"][0] == 400 and got["triton"][0] == 500  # a client's mistake: 400 in pyasc
        assert max_batch_sizes() == {"pyasc": 8, "triton": 4}  # a refused load changes nothing

        def flow(client: Any) -> int:
            client.load_model("tiny", config=json.dumps({**small, "max_batch_size": 2}))
            return client.get_model_config("tiny", as_json=True)["config"]["max_batch_size"]

        assert _grpc(servers, flow) == {"pyasc": 2, "triton": 2}


def test_a_load_with_files_as_triton_s(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    import base64

    doubled = tiny_model(tmp_path / "doubled.onnx", factor=2.0).read_bytes()
    with _controlled(tmp_path) as servers:
        config = json.loads(_both(servers, "GET", "/v2/models/tiny/config")["triton"][1])
        model_py = (tmp_path / "triton" / "tiny" / "1" / "model.py").read_bytes()  # Triton's backend needs it
        files = {"file:1/model.py": base64.b64encode(model_py).decode(),
                 "file:1/model.onnx": base64.b64encode(doubled).decode()}
        got = _both(servers, "POST", "/v2/repository/models/tiny/load",
                    {"parameters": {"config": json.dumps(config), **files}})
        assert got["pyasc"][0] == got["triton"][0] == 200, got
        # pyasc serves the files' model (Triton 2.51 answers 200 but, with the Python backend, keeps the model it
        # had: a load with files of a loaded model is not compared further)
        body = json.dumps({"inputs": GOOD}).encode()
        answer = json.loads(_http(servers["pyasc"][0], "POST", "/v2/models/tiny/infer", body)[1])
        y = next(o for o in answer["outputs"] if o["name"] == "y")
        np.testing.assert_allclose(np.reshape(y["data"], (2, 3)), tiny_expected(X, SCALE, 2.0)["y"], rtol=1e-5)
        for parameters in ({**files}, {"config": json.dumps(config), "file:../x.onnx": files["file:1/model.onnx"],
                                       **files}):
            got = _both(servers, "POST", "/v2/repository/models/tiny/load", {"parameters": parameters})
            assert got["pyasc"][0] == 400 and got["triton"][0] == 500, got  # a client's mistake: 400 in pyasc

        def flow(client: Any) -> bool:
            client.load_model("tiny", config=json.dumps(config),
                              files={"file:1/model.py": model_py, "file:1/model.onnx": doubled})
            return client.is_model_ready("tiny")

        assert _grpc(servers, flow) == {"pyasc": True, "triton": True}


def _same_answer(mine: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert mine.keys() == theirs.keys(), (mine, theirs)
    for key, value in theirs.items():
        if isinstance(value, (float, list)) and not (isinstance(value, list) and value and isinstance(value[0], str)):
            np.testing.assert_allclose(mine[key], value, rtol=1e-6, err_msg=key)
        else:
            assert mine[key] == value, key


def test_generate_answers_as_triton_s(servers) -> None:
    row = X[0].tolist()
    for model, doc in [("tiny", {"x": row, "scale": [0.5], "id": "g1"}), ("tiny", {"x": row, "scale": 0.5,
                                                                                   "not_an_input": 1}),
                       ("text", {"t": ["a", "é"]})]:
        got = _both(servers, "POST", f"/v2/models/{model}/generate", doc)
        assert got["pyasc"][0] == got["triton"][0] == 200, (doc, got)
        _same_answer(json.loads(got["pyasc"][1]), json.loads(got["triton"][1]))
    got = _both(servers, "POST", "/v2/models/tiny/versions/1/generate_stream", {"x": row, "scale": [2]})
    for name, (status, body, headers) in got.items():
        assert status == 200 and headers["content-type"].startswith("text/event-stream"), name
        assert body.startswith(b"data: ") and body.endswith(b"\n\n") and body.count(b"data: ") == 1, (name, body)
    _same_answer(*(json.loads(got[name][1][len(b"data: "):]) for name in ("pyasc", "triton")))
    for model, doc, status in [("tiny", {"x": [row], "scale": [1]}, 400), ("tiny", {"x": row[:3], "scale": [1]}, 400),
                               ("text", {"t": "ab"}, 400), ("tiny", {"x": row}, 400), ("absent", {"x": row}, 404)]:
        got = _both(servers, "POST", f"/v2/models/{model}/generate", doc)
        assert got["pyasc"][0] == got["triton"][0] == status, (doc, got)
        assert "error" in json.loads(got["pyasc"][1]) and "error" in json.loads(got["triton"][1])
    got = _both(servers, "POST", "/v2/models/tiny/generate", [row])  # a client's mistake: 400 in pyasc
    assert got["pyasc"][0] == 400 and got["triton"][0] == 500


def test_the_response_cache_counts_as_triton_s(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    tiny = tiny_model(tmp_path / "tiny.onnx")
    folders = {name: tmp_path / name for name in ("triton", "pyasc")}
    for folder in folders.values():  # the same repository, the model enabling the cache
        tr.write_model(folder, "tiny", tiny, [tr.TritonSpec("x", "TYPE_FP32", [4]),
                                              tr.TritonSpec("scale", "TYPE_FP32", [1])],
                       [tr.TritonSpec("y", "TYPE_FP32", [3]), tr.TritonSpec("s", "TYPE_FP32", [1])], threads=1)
        config = folder / "tiny" / "config.pbtxt"
        config.write_text(config.read_text() + "response_cache { enable: true }\n")
    registry = build_registry([folders["pyasc"]], target="onnxruntime")
    app = create_app(registry, ServeOptions(grpc_address="127.0.0.1:0", response_cache=1 << 20))
    flags = ["--cache-config", f"local,size={1 << 20}", "--cache-directory", str(tr.triton_home() / "caches")]
    with tr.TritonServer(folders["triton"], extra_args=flags) as triton, BackgroundServer(app) as pyasc:
        servers = _urls(triton, pyasc)
        other = [GOOD[0], {**GOOD[1], "data": [3.0, 3.0]}]
        for inputs in (GOOD, GOOD, GOOD, other):
            got = _both(servers, "POST", "/v2/models/tiny/infer", {"inputs": inputs})
            assert got["pyasc"][0] == got["triton"][0] == 200, got
            answers = [{o["name"]: o["data"] for o in json.loads(got[name][1])["outputs"]} for name in got]
            np.testing.assert_allclose(answers[0]["y"], answers[1]["y"], rtol=1e-6)
        _grpc(servers, lambda client: client.infer("tiny", _grpc_inputs(X, SCALE)).as_numpy("y"))

        def counts(body: bytes) -> dict[str, int]:
            stats = json.loads(body)["model_stats"][0]
            phases = stats["inference_stats"]
            return {**{p: phases[p]["count"] for p in ("cache_hit", "cache_miss", "success", "queue",
                                                       "compute_input", "compute_infer", "compute_output")},
                    "inference_count": stats["inference_count"], "execution_count": stats["execution_count"]}

        got = _both(servers, "GET", "/v2/models/tiny/stats")
        assert counts(got["pyasc"][1]) == counts(got["triton"][1])
        assert counts(got["pyasc"][1])["cache_hit"] == 3


_HOST_ONLY = ("nv_pinned_memory_pool_", "nv_gpu_", "nv_energy_")  # Triton's CUDA and GPU metrics: pyasc has none
_COUNTED = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
            "nv_inference_exec_count", "nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model",
            "nv_inference_pending_request_count", "nv_cache_num_entries", "nv_cache_num_hits", "nv_cache_num_misses",
            "nv_cache_num_lookups", "nv_cache_num_evictions")


def _families(text: str) -> dict[str, tuple[str, str, dict[tuple[tuple[str, str], ...], float]]]:
    """Triton's metric families in a /metrics text: name -> (type, help, value by sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {m.name: (m.type, m.documentation, {tuple(sorted(s.labels.items())): s.value for s in m.samples})
            for m in text_string_to_metric_families(text)
            if m.name.startswith("nv_") and not m.name.startswith(_HOST_ONLY)}


def _tiny_in_both(tmp_path: Path) -> dict[str, Path]:
    """One repository per server holding ``tiny`` as a Triton folder (pyasc serves the same config.pbtxt)."""
    tiny = tiny_model(tmp_path / "tiny.onnx")
    folders = {name: tmp_path / name for name in ("triton", "pyasc")}
    for folder in folders.values():
        tr.write_model(folder, "tiny", tiny, [tr.TritonSpec("x", "TYPE_FP32", [4]),
                                              tr.TritonSpec("scale", "TYPE_FP32", [1])],
                       [tr.TritonSpec("y", "TYPE_FP32", [3]), tr.TritonSpec("s", "TYPE_FP32", [1])], threads=1)
    return folders


def test_prometheus_metrics_as_triton_s(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    tiny = tiny_model(tmp_path / "tiny.onnx")
    folders = {name: tmp_path / name for name in ("triton", "pyasc")}
    for folder in folders.values():  # the same repository: one model caching its answers, one not
        for name, cache in (("tiny", True), ("plain", False)):
            tr.write_model(folder, name, tiny, [tr.TritonSpec("x", "TYPE_FP32", [4]),
                                                tr.TritonSpec("scale", "TYPE_FP32", [1])],
                           [tr.TritonSpec("y", "TYPE_FP32", [3]), tr.TritonSpec("s", "TYPE_FP32", [1])], threads=1)
            if cache:
                config = folder / name / "config.pbtxt"
                config.write_text(config.read_text() + "response_cache { enable: true }\n")
    registry = build_registry([folders["pyasc"]], target="onnxruntime")
    app = create_app(registry, ServeOptions(grpc_address="127.0.0.1:0", response_cache=1 << 20))
    flags = ["--cache-config", f"local,size={1 << 20}", "--cache-directory", str(tr.triton_home() / "caches"),
             "--allow-metrics", "true", "--metrics-interval-ms", "100"]
    with tr.TritonServer(folders["triton"], extra_args=flags) as triton, BackgroundServer(app) as pyasc:
        servers = _urls(triton, pyasc)
        wrong_shape = [{**GOOD[0], "shape": [2, 5], "data": list(range(10))}, GOOD[1]]
        for model, body, status in (("tiny", {"inputs": GOOD}, 200), ("tiny", {"inputs": GOOD}, 200),
                                    ("tiny", {"inputs": wrong_shape}, 400), ("tiny", {"inputs": GOOD[:1]}, 400),
                                    ("tiny", {"inputs": GOOD, "outputs": [{"name": "nope"}]}, 400),
                                    ("plain", {"inputs": GOOD}, 200)):
            got = _both(servers, "POST", f"/v2/models/{model}/infer", body)
            assert got["pyasc"][0] == got["triton"][0] == status, got
        refused = _grpc(servers, lambda c: c.infer("tiny", _grpc_inputs(X, SCALE),
                                                   outputs=[grpcclient.InferRequestedOutput("nope")]))
        assert all(isinstance(e, InferenceServerException) and "unexpected inference output 'nope'" in str(e)
                   for e in refused.values()), refused
        _grpc(servers, lambda client: client.infer("tiny", _grpc_inputs(X, SCALE)).as_numpy("y"))  # a hit
        # Triton refreshes its cache gauges every --metrics-interval-ms, on a thread that a loaded machine may run
        # late: read until they stop differing from pyasc's (current when read), for at most 15 s

        def read() -> dict[str, str]:
            return {"triton": _http(f"127.0.0.1:{triton.metrics_port}", "GET", "/metrics")[1].decode(),
                    "pyasc": _http(pyasc.url, "GET", "/metrics")[1].decode()}

        def agreed() -> dict[str, str] | None:
            texts = read()
            gauges = [{k: v[2] for k, v in _families(text).items() if k.startswith("nv_cache")}
                      for text in texts.values()]
            return texts if gauges[0] == gauges[1] else None

        texts = poll(agreed, 15.0, every=0.2) or read()  # if they never agree, the checks below say where
    families = {name: _families(text) for name, text in texts.items()}
    # the same families (CPU metrics where the machine tells them), types, descriptions and label sets
    assert set(families["pyasc"]) == set(families["triton"])
    for name, (kind, doc, samples) in families["triton"].items():
        mine = families["pyasc"][name]
        assert (mine[0], mine[1]) == (kind, doc), name
        assert set(mine[2]) == set(samples), name
    # the same counts: refused requests (wrong shape, missing input, unknown output) count nowhere; every
    # reason of a failure listed at 0; two answers from the cache and one miss for the model that caches
    for name in _COUNTED:
        assert families["pyasc"][name][2] == families["triton"][name][2], name
    hits = families["pyasc"]["nv_cache_num_hits_per_model"][2]
    assert hits == {(("model", "tiny"), ("version", "1")): 2.0}


def test_latency_summaries_as_triton_s(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    from prometheus_client.parser import text_string_to_metric_families

    from hybrid.serve.observe.latency_summary import MetricsConfig

    settings = ["summary_latencies=true", "counter_latencies=false", "summary_quantiles=0.5:0.05,0.99:0.001"]
    folders = _tiny_in_both(tmp_path)
    registry = build_registry([folders["pyasc"]], target="onnxruntime")
    app = create_app(registry, ServeOptions(metrics=MetricsConfig.from_options(settings)))
    flags = ["--allow-metrics", "true", *(a for s in settings for a in ("--metrics-config", s))]
    def seen(texts: dict[str, str]) -> dict[str, Any]:
        out = {}
        for name, text in texts.items():
            families = [f for f in text_string_to_metric_families(text)
                        if f.name.startswith("nv_inference") and not f.name.startswith(_HOST_ONLY)]
            out[name] = {f.name: (f.type, f.documentation,
                                  sorted((s.name, tuple(sorted(s.labels.items()))) for s in f.samples),
                                  {s.name: s.value for s in f.samples if s.name.endswith("_count")})
                         for f in families}
        return out

    with tr.TritonServer(folders["triton"], extra_args=flags) as triton, BackgroundServer(app) as pyasc:
        servers = _urls(triton, pyasc)

        def scrape() -> dict[str, Any]:
            return seen({"triton": _http(f"127.0.0.1:{triton.metrics_port}", "GET", "/metrics")[1].decode(),
                         "pyasc": _http(pyasc.url, "GET", "/metrics")[1].decode()})

        before = scrape()  # a model loaded and not yet asked: its metrics are listed at 0 by both
        for _ in range(5):
            got = _both(servers, "POST", "/v2/models/tiny/infer", {"inputs": GOOD})
            assert got["pyasc"][0] == got["triton"][0] == 200
        after = scrape()
    # the same families (no duration counters; five summaries), HELP texts, samples with their quantile labels,
    # and counts
    for now in (before, after):
        assert now["pyasc"] == now["triton"], (now["pyasc"], now["triton"])
    assert before["triton"]["nv_inference_request_summary_us"][3] == {"nv_inference_request_summary_us_count": 0.0}
    assert after["triton"]["nv_inference_request_summary_us"][3] == {"nv_inference_request_summary_us_count": 5.0}
    assert not any(n.endswith("_duration_us") for n in after["triton"])


def test_metrics_of_an_unloaded_and_reloaded_model_as_triton_s(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    folders = _tiny_in_both(tmp_path)
    registry = build_registry([folders["pyasc"]], target="onnxruntime")
    app = create_app(registry, ServeOptions(model_control=True))
    flags = ["--allow-metrics", "true", "--model-control-mode", "explicit", "--load-model", "tiny"]
    with tr.TritonServer(folders["triton"], extra_args=flags) as triton, BackgroundServer(app) as pyasc:
        servers = _urls(triton, pyasc)

        def successes() -> dict[str, list[float]]:
            texts = {"triton": _http(f"127.0.0.1:{triton.metrics_port}", "GET", "/metrics")[1].decode(),
                     "pyasc": _http(pyasc.url, "GET", "/metrics")[1].decode()}
            return {name: [v for labels, v in _families(text).get("nv_inference_request_success",
                                                                   ("", "", {}))[2].items()
                           if ("model", "tiny") in labels] for name, text in texts.items()}

        for _ in range(2):
            assert {k: v[0] for k, v in _both(servers, "POST", "/v2/models/tiny/infer",
                                              {"inputs": GOOD}).items()} == {"triton": 200, "pyasc": 200}
        assert successes() == {"triton": [2.0], "pyasc": [2.0]}
        for action in ("unload", "load"):
            got = _both(servers, "POST", f"/v2/repository/models/tiny/{action}", {})
            assert got["pyasc"][0] == got["triton"][0] == 200, got
            if action == "unload":  # gone from the metrics and from the statistics of every model
                # real time: Triton unloads in the background
                wait_for(lambda: successes() == {"triton": [], "pyasc": []}, "the unload to reach the metrics",
                         limit=30, every=0.2)
                stats = _both(servers, "GET", "/v2/models/stats")
                assert [json.loads(v[1])["model_stats"] for v in stats.values()] == [[], []]
        assert successes() == {"triton": [0.0], "pyasc": [0.0]}  # loaded again: from 0


def test_version_policies_serve_the_versions_triton_serves(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    import shutil

    tiny = tiny_model(tmp_path / "tiny.onnx")
    policies = {"latest1": "", "all": "version_policy { all { } }",
                "specific": "version_policy { specific { versions: [1, 3] } }",
                "latest2": "version_policy { latest { num_versions: 2 } }"}
    folders = {name: tmp_path / name for name in ("triton", "pyasc")}
    for folder in folders.values():  # the same repository: four models of three versions, one policy each
        for name, policy in policies.items():
            model = tr.write_model(folder, name, tiny, [tr.TritonSpec("x", "TYPE_FP32", [4]),
                                                        tr.TritonSpec("scale", "TYPE_FP32", [1])],
                                   [tr.TritonSpec("y", "TYPE_FP32", [3]), tr.TritonSpec("s", "TYPE_FP32", [1])],
                                   threads=1)
            for version in ("2", "3"):
                shutil.copytree(model / "1", model / version)
            (model / "config.pbtxt").write_text((model / "config.pbtxt").read_text() + policy + "\n")
    registry = build_registry([folders["pyasc"]], target="onnxruntime")
    with tr.TritonServer(folders["triton"]) as triton, BackgroundServer(create_app(registry)) as pyasc:
        servers = _urls(triton, pyasc)
        for name in policies:
            got = _both(servers, "GET", f"/v2/models/{name}")
            assert json.loads(got["pyasc"][1])["versions"] == json.loads(got["triton"][1])["versions"], name
            for version in ("1", "2", "3"):  # a version the policy leaves out: unknown to both (404)
                got = _both(servers, "POST", f"/v2/models/{name}/versions/{version}/infer", {"inputs": GOOD})
                assert got["pyasc"][0] == got["triton"][0] in (200, 404), (name, version, got)
            config = _both(servers, "GET", f"/v2/models/{name}/config")
            assert (json.loads(config["pyasc"][1])["version_policy"]
                    == json.loads(config["triton"][1])["version_policy"]), name
        index = _both(servers, "POST", "/v2/repository/index", {})
        assert json.loads(index["pyasc"][1]) == json.loads(index["triton"][1])  # names, versions, states: equal
        versions = {name: json.loads(_both(servers, "GET", f"/v2/models/{name}")["pyasc"][1])["versions"]
                    for name in policies}
    assert versions == {"latest1": ["3"], "all": ["1", "2", "3"], "specific": ["1", "3"], "latest2": ["2", "3"]}


_ORDER_PY = """\
import os
import sys
import time

sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.ran = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if x[0, 0] == 0:
                time.sleep({hold})  # real time: Triton's own process holds its first request
            self.ran += 1
            rows = x.shape[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("y", np.zeros((rows, 3), np.float32)),
                pb_utils.Tensor("s", np.full((rows, 1), self.ran, np.float32))]))
        return responses
"""


def _order_of_runs(tmp_path: Path, batching: str, hold: float,
                   sends: list[tuple[float, int | None, float]]) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """The order in which each server runs requests queued while its first one is held ``hold`` seconds, and
    what each reports: the model's ``dynamic_batching`` and whether the server lists ``schedule_policy``.

    Both serve one model with ``max_batch_size: 1`` and ``dynamic_batching { batching }``; Triton's ``model.py``
    sleeps on a request whose ``x[0, 0]`` is 0 and answers each request's run count in ``s``, pyasc's model is held
    the same way in process. ``sends``: (marker, priority or None, seconds after the first request) each.
    """
    tiny = tiny_model(tmp_path / "tiny.onnx")
    pbtxt = (
        'name: "order"\nmax_batch_size: 1\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [4] }, { name: "scale" data_type: TYPE_FP32 dims: [1] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [3] }, { name: "s" data_type: TYPE_FP32 dims: [1] } ]\n'
        f"dynamic_batching {{ {batching} }}\n")
    folders = {name: tmp_path / name / "order" for name in ("triton", "pyasc")}
    for name, folder in folders.items():
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(pbtxt + ('backend: "python"\n' if name == "triton" else ""))
    (folders["triton"] / "1" / "model.py").write_text(_ORDER_PY.format(hold=hold))
    shutil.copy(tiny, folders["pyasc"] / "1" / "model.onnx")
    registry = build_registry([folders["pyasc"].parent], target="onnxruntime")
    (model,) = list(registry)
    ran: list[float] = []
    run = model.compiled.run_checked

    def held(feeds):
        marker = float(feeds["x"][0, 0])
        if marker == 0:
            time.sleep(hold)  # real time: held as Triton's model is, so both servers queue the same requests
        ran.append(marker)
        return run(feeds)

    model.compiled.run_checked = held
    order: dict[str, list[float]] = {}
    reported: dict[str, Any] = {}
    with tr.TritonServer(folders["triton"].parent) as triton, BackgroundServer(create_app(registry)) as pyasc:
        for name, (url, _) in _urls(triton, pyasc).items():
            reported[name] = (json.loads(_http(url, "GET", "/v2/models/order/config")[1])["dynamic_batching"],
                              "schedule_policy" in json.loads(_http(url, "GET", "/v2")[1])["extensions"])
            def send(marker: float, priority: int | None, url: str = url) -> tuple[float, Any]:
                body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [marker] * 4},
                                   {"name": "scale", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
                if priority is not None:
                    body["parameters"] = {"priority": priority}
                return marker, _http(url, "POST", "/v2/models/order/infer", json.dumps(body).encode())

            start = time.monotonic()
            with cf.ThreadPoolExecutor(len(sends) + 1) as pool:
                futures = [pool.submit(send, 0.0, None)]
                for marker, priority, at in sends:
                    time.sleep(max(0.0, start + at - time.monotonic()))  # real time: sent to real servers
                    futures.append(pool.submit(send, marker, priority))
                answers = [f.result() for f in futures]
            assert all(status == 200 for _, (status, _, _) in answers), (name, answers)
            if name == "triton":  # its model answered each request's run count
                counts = {m: json.loads(data)["outputs"][1]["data"][0] for m, (_, data, _) in answers}
                order[name] = sorted(counts, key=counts.__getitem__)
            else:
                order[name] = list(ran)
    return order, reported


def test_priority_levels_order_the_runs_as_triton_s(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    # the first request is held 3 s; the others arrive 0.2 s apart (an arrival order that holds on a busy machine)
    # at levels 2, default (2), 1, 0 (default), 1 and 7 (no such level: the default); both servers run level 1
    # first, then level 2, each in arrival order
    sends = [(1.0, 2, 0.3), (2.0, None, 0.5), (3.0, 1, 0.7), (4.0, 0, 0.9), (5.0, 1, 1.1), (6.0, 7, 1.3)]
    order, reported = _order_of_runs(tmp_path, "priority_levels: 2 default_priority_level: 2 priority_queue_policy "
                                           "{ key: 1 value { max_queue_size: 4 } }", 3.0, sends)
    assert order["pyasc"] == order["triton"] == [0.0, 3.0, 5.0, 1.0, 2.0, 4.0, 6.0], order
    batching = {name: {k: v for k, v in doc.items() if "priority" in k or "queue_policy" in k}
                for name, (doc, _) in reported.items()}
    assert batching["pyasc"] == batching["triton"] and batching["pyasc"]["priority_levels"] == 2, batching
    assert reported["pyasc"][1] and reported["triton"][1]  # both list the schedule_policy extension


def test_a_delayed_request_runs_after_those_in_time_as_in_triton(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    # held 6 s; request 1 arrives at 0.3 s and is late from 3.3 s (DELAY: not rejected); request 2 arrives at
    # 4.3 s and is still in time (until 7.3 s) when the first run ends: both servers run 2 before 1 (margins of a
    # second either side, for a busy machine)
    order, reported = _order_of_runs(tmp_path, "default_queue_policy { default_timeout_microseconds: 3000000 "
                                               "timeout_action: DELAY }", 6.0, [(1.0, None, 0.3), (2.0, None, 4.3)])
    assert reported["pyasc"][0]["default_queue_policy"] == reported["triton"][0]["default_queue_policy"]
    assert order["pyasc"] == order["triton"] == [0.0, 2.0, 1.0], order


def test_poll_mode_serves_what_the_repository_holds_as_triton_s(tmp_path) -> None:
    if _REASON:
        pytest.skip(_REASON)
    tiny = tiny_model(tmp_path / "tiny.onnx")
    specs = ([tr.TritonSpec("x", "TYPE_FP32", [4]), tr.TritonSpec("scale", "TYPE_FP32", [1])],
             [tr.TritonSpec("y", "TYPE_FP32", [3]), tr.TritonSpec("s", "TYPE_FP32", [1])])
    repos = {name: tmp_path / name for name in ("triton", "pyasc")}
    for repo in repos.values():
        tr.write_model(repo, "first", tiny, *specs, threads=1)
    registry = build_registry([repos["pyasc"]], target="onnxruntime")
    with tr.TritonServer(repos["triton"], extra_args=["--model-control-mode", "poll", "--repository-poll-secs",
                                                      "1"]) as triton, \
            BackgroundServer(create_app(registry, ServeOptions(repository_poll_s=0.2))) as pyasc:
        servers = _urls(triton, pyasc)

        def index() -> dict[str, Any]:
            return {name: sorted((m["name"], m.get("state")) for m in json.loads(data))
                    for name, (_, data, _) in _both(servers, "POST", "/v2/repository/index", {}).items()}

        def until(want: list[tuple[str, str]]) -> dict[str, Any]:
            # real time: both servers poll their repositories on their own clocks
            wait_for(lambda: index() == {"triton": want, "pyasc": want}, f"the index {want}", limit=90, every=0.2)
            return index()

        until([("first", "READY")])
        for repo in repos.values():  # a model added (written whole, then moved in)
            staged = tr.write_model(tmp_path / "staged", "second", tiny, *specs, threads=1)
            staged.rename(repo / "second")
        until([("first", "READY"), ("second", "READY")])
        got = _both(servers, "POST", "/v2/models/second/infer", {"inputs": GOOD})
        assert got["pyasc"][0] == got["triton"][0] == 200
        for repo in repos.values():  # a model removed
            shutil.rmtree(repo / "first")
        until([("second", "READY")])
        # Triton leaves the index first, and its model a moment later
        wait_for(lambda: {k: v[0] for k, v in _both(servers, "POST", "/v2/models/first/infer",
                                                     {"inputs": GOOD}).items()} == {"triton": 404, "pyasc": 404},
                 "the removed model to be gone from both", limit=60, every=0.2)
        got = _both(servers, "GET", "/v2/models/first/ready")
        assert got["pyasc"][0] == got["triton"][0] == 400  # "Model version not ready"
        got = _both(servers, "POST", "/v2/repository/models/second/unload", {})  # no explicit control
        assert got["triton"][0] == got["pyasc"][0] == 503, got
        for _, data, _ in got.values():
            assert "explicit model load / unload is not allowed if polling is enabled" in json.loads(data)["error"]
