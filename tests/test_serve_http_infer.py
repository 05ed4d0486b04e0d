"""The HTTP inference route answered below FastAPI (hybrid.serve.http.infer, issue 25).

What it must keep: the route's answers and errors as the app gives them, its place inside the token check, the
header of a binary request parsed once, and only size-proportional decoding sent to a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _serve_support import connection, error_of, request, tiny_expected, tiny_model, v2_json

import hybrid.serve.core.protocol as protocol
import hybrid.serve.http.infer as http_infer
from hybrid.serve import BackgroundServer, ServeOptions, build_registry, create_app
from hybrid.serve.core.model import BatchSettings
from hybrid.serve.http.infer import PARSE_INLINE, _costly, _disconnected, infer_target


def _scope(path: str, method: str = "POST", root: str = "") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": root}


@pytest.mark.parametrize(("path", "want"), [
    ("/v2/models/m/infer", ("m", None)),
    ("/v2/models/m/versions/2/infer", ("m", "2")),
    ("/v2/models/stats/infer", ("stats", None)),  # a model may be called so: /v2/models/stats is a GET
    ("/v2/models//infer", None),
    ("/v2/models/m/infer/", None),  # the app's routing answers these (a redirect, a 404)
    ("/v2/models/m/versions//infer", None),
    ("/v2/models/m/ready", None),
    ("/v2/models/a/b/infer", None),
    ("/v2/models/m/v/2/infer", None),
    ("/v1/models/m/infer", None),
])
def test_the_inference_route_is_recognized_as_the_apps_routes_match_it(path: str, want: Any) -> None:
    assert infer_target(_scope(path)) == want


def test_only_a_post_under_the_mount_point_is_the_inference_route() -> None:
    assert infer_target(_scope("/v2/models/m/infer", "GET")) is None
    assert infer_target({"type": "websocket", "path": "/v2/models/m/infer"}) is None
    assert infer_target(_scope("/svc/v2/models/m/infer", root="/svc")) == ("m", None)  # a Ray Serve route prefix


def test_only_decoding_proportional_to_the_size_leaves_the_event_loop() -> None:
    big = PARSE_INLINE + 1
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [big // 4],
                                   "parameters": {"binary_data_size": big // 4 * 4}}]}).encode()
    assert not _costly(head + bytes(big), len(head))  # binary tensors become views of the body
    words = head.replace(b'"FP32"', b'"BYTES"')
    assert _costly(words + bytes(big), len(words))  # BYTES elements are decoded one by one
    assert not _costly(words + bytes(16), len(words))
    assert _costly(b" " * big, None)  # a JSON body
    assert not _costly(b"{}", None)
    assert _costly(b" " * big + bytes(8), big)  # a JSON header that large
    assert _costly(bytes(big), 0) and _costly(bytes(big), big + 1)  # a wrong length: parse_request refuses it


def test_a_disconnect_is_seen_without_waiting_for_one() -> None:
    async def main() -> tuple[bool, bool, bool, int]:
        event = asyncio.Event()

        async def waits() -> dict[str, Any]:
            await event.wait()
            return {"type": "http.disconnect"}

        async def gone() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        async def more() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        still = await _disconnected(waits)
        return still, await _disconnected(gone), await _disconnected(more), len(event._waiters or ())

    still, gone, more, waiters = asyncio.run(main())
    assert (still, gone, more) == (False, True, False)
    assert waiters == 0  # the receive left waiting was closed: nothing of it stays behind


@pytest.fixture
def server(tmp_path: Path):
    registry = build_registry([tiny_model(tmp_path / "tiny.onnx")], target="onnxruntime",
                              defaults=BatchSettings(max_batch=0))  # no batch limit: requests of any size
    with BackgroundServer(create_app(registry, ServeOptions())) as srv:
        yield srv


def _binary_request(x: np.ndarray, scale: np.ndarray) -> tuple[bytes, dict[str, str]]:
    head = json.dumps({"inputs": [
        {"name": "x", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}},
        {"name": "scale", "shape": list(scale.shape), "datatype": "FP32",
         "parameters": {"binary_data_size": scale.nbytes}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    return head + x.tobytes() + scale.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


def test_a_large_binary_request_is_decoded_once_on_the_loop(server, monkeypatch: pytest.MonkeyPatch) -> None:
    offloaded: list[object] = []
    parses: list[int] = []  # JSON texts parsed (each is first checked for its depth)
    real_pool, real_depth = http_infer.run_in_threadpool, protocol.check_json_depth

    async def pool(fn: Any, *args: Any) -> Any:
        offloaded.append(fn)
        return await real_pool(fn, *args)

    def depth(text: bytes, limit: int) -> None:
        parses.append(len(text))
        real_depth(text, limit)

    monkeypatch.setattr(http_infer, "run_in_threadpool", pool)
    monkeypatch.setattr(protocol, "check_json_depth", depth)
    rows = PARSE_INLINE // 16 + 64  # x alone is past the inline bound
    x = np.linspace(-1, 1, rows * 4, dtype=np.float32).reshape(rows, 4)
    scale = np.full((rows, 1), 0.5, np.float32)
    body, headers = _binary_request(x, scale)
    status, got, answer = request(server.url, "POST", "/v2/models/tiny/infer", body, headers)
    assert status == 200, answer
    assert got["content-type"] == "application/octet-stream"
    length = int(got["inference-header-content-length"])
    np.testing.assert_allclose(np.frombuffer(answer[length:], np.float32).reshape(rows, 3),
                               tiny_expected(x, scale)["y"], rtol=1e-5, atol=1e-6)
    assert offloaded == []  # views of the body, whatever its size
    assert len(parses) == 1  # the JSON header, as it arrived; parse_request reused it

    json_body = v2_json({"x": x, "scale": scale})
    assert len(json_body) > PARSE_INLINE
    parses.clear()
    status, got, answer = request(server.url, "POST", "/v2/models/tiny/infer", json_body)
    assert status == 200 and got["content-type"] == "application/json"
    doc = json.loads(answer)
    np.testing.assert_allclose(np.array(doc["outputs"][0]["data"], np.float32).reshape(rows, 3),
                               tiny_expected(x, scale)["y"], rtol=1e-5, atol=1e-6)
    assert offloaded == [protocol.parse_request] and len(parses) == 1  # JSON text: in a worker thread


def test_the_route_answers_errors_as_every_route_does(server) -> None:
    x = np.zeros((2, 4), np.float32)
    status, headers, body = request(server.url, "POST", "/v2/models/nope/infer", v2_json({"x": x}))
    assert status == 404 and error_of(body) == "HYB-701" and headers["content-type"] == "application/json"
    status, _, body = request(server.url, "POST", "/v2/models/tiny/versions/9/infer", v2_json({"x": x}))
    assert status == 404 and error_of(body) == "HYB-701"
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", b"{not json")
    assert status == 400 and error_of(body) == "HYB-702"
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer",
                              v2_json({"x": np.zeros((2, 5), np.float32), "scale": np.ones((2, 1), np.float32)}))
    assert status == 400 and error_of(body) == "HYB-405" and b"Expected [-1,4]" in body  # Triton's dims
    body_, headers_ = _binary_request(x, np.ones((2, 1), np.float32))
    headers_["Content-Encoding"] = "br"
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", body_, headers_)
    assert status == 400 and error_of(body) == "HYB-702"
    status, _, body = request(server.url, "GET", "/v2/models/tiny/infer")  # the app's routing: not a POST
    assert status == 405 and error_of(body) == "HYB-702"
    status, _, body = request(server.url, "GET", "/metrics")
    assert status == 200 and b'pyasc_http_errors_total{code="HYB-701"} 2.0' in body
    assert b'pyasc_http_errors_total{code="HYB-405"} 1.0' in body


def test_a_version_in_the_path_and_an_id_are_answered(server) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    scale = np.full((2, 1), 2, np.float32)
    with connection(server.url) as conn:  # one kept-alive connection for several requests
        for path in ("/v2/models/tiny/versions/1/infer", "/v2/models/tiny/infer"):
            conn.request("POST", path, v2_json({"x": x, "scale": scale}, id="r-7"))
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            assert resp.status == 200 and doc["id"] == "r-7" and doc["model_version"] == "1"
            out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in doc["outputs"]}
            np.testing.assert_allclose(out["y"], tiny_expected(x, scale)["y"], rtol=1e-5)


@pytest.mark.parametrize(("accept", "coding"), [
    (None, None), ("", None), ("gzip", "gzip"), ("deflate", "deflate"), ("gzip, deflate", "gzip"),
    ("deflate;q=0.5, gzip", "deflate"), ("gzip;q=0, deflate", "deflate"), ("GZIP;Q=0.1", "gzip"),
    ("gzip;q=0", None), ("br", None), ("identity", None), ("*", None), ("gzip;q=x", None),
])
def test_the_answer_s_coding_follows_accept_encoding_as_triton_s(accept: str | None, coding: str | None) -> None:
    assert http_infer.response_coding(accept) == coding


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_compressed_answer_keeps_the_uncompressed_json_length_and_tritonclient_reads_it(server, coding) -> None:
    import zlib

    import tritonclient.http as th

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    scale = np.full((2, 1), 2, np.float32)
    body, headers = _binary_request(x, scale)
    status, got, data = request(server.url, "POST", "/v2/models/tiny/infer", body,
                                {**headers, "Accept-Encoding": coding})
    assert status == 200 and got["content-encoding"] == coding and int(got["content-length"]) == len(data)
    plain = zlib.decompress(data, 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS)
    n = int(got["inference-header-content-length"])
    assert json.loads(plain[:n])["outputs"][0]["parameters"]["binary_data_size"] == len(plain) - n
    np.testing.assert_allclose(np.frombuffer(plain[n:], np.float32).reshape(2, 3), tiny_expected(x, scale)["y"],
                               rtol=1e-5)

    client = th.InferenceServerClient(server.url.removeprefix("http://"))
    inputs = [th.InferInput("x", [2, 4], "FP32"), th.InferInput("scale", [2, 1], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(scale)
    result = client.infer("tiny", inputs, response_compression_algorithm=coding)
    np.testing.assert_allclose(result.as_numpy("y"), tiny_expected(x, scale)["y"], rtol=1e-5)


def test_a_large_answer_is_compressed_off_the_loop(server, monkeypatch: pytest.MonkeyPatch) -> None:
    offloaded: list[Any] = []
    real = http_infer.run_in_threadpool

    async def spy(fn: Any, *args: Any) -> Any:
        offloaded.append(fn)
        return await real(fn, *args)

    monkeypatch.setattr(http_infer, "run_in_threadpool", spy)
    rows = PARSE_INLINE // 12 + 1  # y is rows x 3 FP32: more than PARSE_INLINE bytes of answer
    x, scale = np.ones((rows, 4), np.float32), np.ones((rows, 1), np.float32)
    body, headers = _binary_request(x, scale)
    status, got, _ = request(server.url, "POST", "/v2/models/tiny/infer", body, {**headers, "Accept-Encoding": "gzip"})
    assert status == 200 and got["content-encoding"] == "gzip"
    assert offloaded == [http_infer.compress]
