"""The parts of the Ray deployment that need no running Ray: model packages (digest, per-node cache), the
health probe and warm-up, the gRPC adapter over Serve's context, and the ``serve deploy`` builder."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import pickle

import grpc
import numpy as np
import onnx
import pytest
from tests._serve_support import tiny_expected, tiny_model

from hybrid.errors import HybridError

pytest.importorskip("ray.serve")
pytest.importorskip("tritonclient.grpc")

from hybrid.serve.core.repository import build_registry, discover
from hybrid.serve.ray.models import ModelPackage, cache_dir, materialize, pack


def test_packages_carry_the_bytes_and_replicas_check_and_cache_them_by_digest(tmp_path):
    tiny = tiny_model(tmp_path / "tiny.onnx")
    (package,) = pack(discover([tiny]))
    assert package.sha256 == hashlib.sha256(tiny.read_bytes()).hexdigest() and package.suffix == ".onnx"
    assert "bytes" in repr(package) and str(package.data[:8]) not in repr(package)
    package = pickle.loads(pickle.dumps(package))  # what Serve stores and hands to each replica
    tiny.unlink()  # the driver's file is gone: the package is enough
    cache = tmp_path / "cache"
    source = materialize(package, cache)
    assert source.path == str(cache / f"{package.sha256}.onnx") and source.name == "tiny"
    mtime = (cache / f"{package.sha256}.onnx").stat().st_mtime_ns
    assert materialize(package, cache).path == source.path  # the second replica on the node reuses it
    assert (cache / f"{package.sha256}.onnx").stat().st_mtime_ns == mtime
    (cache / f"{package.sha256}.onnx").write_bytes(b"garbage")  # a damaged cache file is replaced
    materialize(package, cache)
    assert hashlib.sha256((cache / f"{package.sha256}.onnx").read_bytes()).hexdigest() == package.sha256
    registry = build_registry([], target="onnxruntime", sources=[source])
    try:
        x, scale = np.ones((1, 4), np.float32), np.full((1, 1), 2, np.float32)
        out = registry.get("tiny").compiled.run({"x": x, "scale": scale})
        np.testing.assert_allclose(out["y"], tiny_expected(x, scale)["y"], rtol=1e-6)
    finally:
        registry.close()


def test_bytes_that_do_not_match_the_digest_are_refused(tmp_path):
    (package,) = pack(discover([tiny_model(tmp_path / "tiny.onnx")]))
    broken = dataclasses.replace(package, data=package.data[:-1] + b"\0")
    with pytest.raises(HybridError) as e:
        materialize(broken, tmp_path / "cache")
    assert e.value.code == "HYB-503" and package.sha256 in e.value.message
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_cache_folder_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PYASC_RAY_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"


def test_too_large_or_external_data_models_are_refused_on_the_driver(tmp_path):
    tiny = tiny_model(tmp_path / "tiny.onnx")
    with pytest.raises(HybridError) as e:
        pack(discover([tiny]), max_inline=100)
    assert e.value.code == "HYB-707" and "100 bytes" in e.value.message
    model = onnx.load(tiny)
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, size_threshold=0, location="ext.data")
    with pytest.raises(HybridError) as e:
        pack(discover([tmp_path / "ext.onnx"]))
    assert e.value.code == "HYB-707" and "external data" in e.value.message and "bundle" in e.value.hint


def test_a_repository_travels_with_its_settings(tmp_path):
    (tmp_path / "repo" / "m" / "1").mkdir(parents=True)
    tiny_model(tmp_path / "repo" / "m" / "1" / "model.onnx")
    (tmp_path / "repo" / "m" / "config.json").write_text('{"max_batch": 3, "target": "onnxruntime"}')
    (package,) = pack(discover([tmp_path / "repo"]))
    source = materialize(pickle.loads(pickle.dumps(package)), tmp_path / "cache")
    assert (source.name, source.version, source.settings, source.target) == ("m", "1", {"max_batch": 3},
                                                                                "onnxruntime")


def test_health_probe_warm_up_and_check(tmp_path):
    from hybrid.serve.ray.health import ReplicaHealth, probe_feeds

    registry = build_registry([tiny_model(tmp_path / "tiny.onnx")], target="onnxruntime")
    try:
        model = registry.get("tiny")
        feeds = probe_feeds(model)
        assert {k: v.shape for k, v in feeds.items()} == {"x": (1, 4), "scale": (1, 1)}
        health = ReplicaHealth(registry)
        health.warm_up(2)
        asyncio.run(health.check(draining=False))
        model.close()  # a model that is gone fails the check: Serve restarts the replica
        with pytest.raises(HybridError):
            asyncio.run(health.check(draining=False))
        asyncio.run(health.check(draining=True))  # a draining replica is on its way out: healthy
    finally:
        registry.close()


class _FakeServeContext:
    """What Serve's RayServegRPCContext offers the replica."""

    def __init__(self, metadata=()):
        self.metadata, self.code, self.details, self.trailing = list(metadata), None, None, None

    def invocation_metadata(self):
        return self.metadata

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details

    def set_trailing_metadata(self, metadata):
        self.trailing = metadata


def test_grpc_methods_answer_and_map_errors_on_serves_context(tmp_path):
    from tritonclient.grpc import service_pb2 as pb

    from hybrid.serve.app import ServeOptions, create_app
    from hybrid.serve.grpc.server import GrpcService
    from hybrid.serve.ray.grpc_methods import UNARY_METHODS, GrpcMethods

    registry = build_registry([tiny_model(tmp_path / "tiny.onnx")], target="onnxruntime")
    app = create_app(registry, ServeOptions(auth_token="s3cret"))

    class Replica(GrpcMethods):
        grpc_service = GrpcService(app.state.hybrid)

    replica = Replica()
    assert all(callable(getattr(replica, name)) for name in UNARY_METHODS)
    x, scale = np.ones((2, 4), np.float32), np.full((2, 1), 3, np.float32)
    request = pb.ModelInferRequest(model_name="tiny", raw_input_contents=[x.tobytes(), scale.tobytes()])
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    request.inputs.add(name="scale", datatype="FP32", shape=[2, 1])
    try:
        context = _FakeServeContext([("authorization", "Bearer s3cret")])
        answer = asyncio.run(replica.ModelInfer(request, grpc_context=context))
        y = np.frombuffer(answer.raw_output_contents[[o.name for o in answer.outputs].index("y")], np.float32)
        np.testing.assert_allclose(y.reshape(2, 3), tiny_expected(x, scale)["y"], rtol=1e-6)
        assert context.code is None
        denied = _FakeServeContext()
        assert asyncio.run(replica.ModelInfer(request, grpc_context=denied)) == pb.ModelInferResponse()
        assert denied.code == grpc.StatusCode.UNAUTHENTICATED and denied.details.startswith("[HYB-703]")
        assert ("hyb-code", "HYB-703") in denied.trailing
        missing = _FakeServeContext([("authorization", "Bearer s3cret")])
        asyncio.run(replica.ModelMetadata(pb.ModelMetadataRequest(name="absent"), grpc_context=missing))
        assert missing.code == grpc.StatusCode.NOT_FOUND and missing.details.startswith("[HYB-701]")
        live = asyncio.run(replica.ServerLive(pb.ServerLiveRequest(), grpc_context=_FakeServeContext()))
        assert live.live
    finally:
        registry.close()


def test_requests_pickle_by_a_module_name_that_resolves():
    from tritonclient.grpc import service_pb2 as pb

    import hybrid.serve.ray.servicer  # noqa: F401  (makes 'grpc_service_pb2' importable)

    request = pb.ModelInferRequest(model_name="m")
    assert pickle.loads(pickle.dumps(request)) == request


def test_app_builder_refuses_unknown_arguments_and_builds_an_application(tmp_path):
    from hybrid.serve.ray.deployment import app_builder

    with pytest.raises(HybridError) as e:
        app_builder({"models": [str(tmp_path)], "replica": 2})
    assert e.value.code == "HYB-101" and "replica" in e.value.message
    with pytest.raises(HybridError) as e:
        app_builder({"models": "m.onnx"})
    assert e.value.code == "HYB-102"
    with pytest.raises(HybridError) as e:
        app_builder({"models": [str(tiny_model(tmp_path / "t.onnx"))], "warmup": -1})
    assert e.value.code == "HYB-102"
    from ray.serve import Application

    built = app_builder({"models": [str(tmp_path / "t.onnx")], "replicas": 2, "overrides": {"max_batch": 4}})
    assert isinstance(built, Application)
    assert isinstance(built._bound_deployment.init_args[0][0], ModelPackage)


def test_connect_passes_the_cluster_token_to_ray(monkeypatch):
    import hybrid.serve.ray.deployment as ray_serve

    seen = {}
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(ray_serve.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_serve.ray, "init", lambda **kw: seen.update(kw, env=(
        __import__("os").environ.get("RAY_AUTH_TOKEN"), __import__("os").environ.get("RAY_AUTH_MODE"))))
    ray_serve.connect("127.0.0.2:6390", {"num_cpus": 1}, auth_token="t0ken")
    assert seen == {"address": "127.0.0.2:6390", "num_cpus": 1, "env": ("t0ken", "token")}


def test_cli_refuses_a_bad_proxy_location(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("_serve_support.py")
    done = subprocess.run([sys.executable, str(script), "serve", str(tiny_model(tmp_path / "t.onnx")), "--ray",
                           "--ray-proxy-location", "Nowhere"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "HYB-102" in done.stdout + done.stderr


def _asgi(status: int, body: bytes, ctype: bytes):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": body})
    return app


def _call(app) -> tuple[int, dict, bytes]:
    from hybrid.serve.ray.proxy import ServeErrorsAsHyb

    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(ServeErrorsAsHyb(app)({"type": "http"}, None, send))
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


@pytest.mark.parametrize(("status", "code"), [(500, "HYB-708"), (503, "HYB-706"), (408, "HYB-411"),
                                              (404, "HYB-701"), (418, "HYB-708")])
def test_serves_own_plain_text_errors_become_hyb_json(status, code):
    import json

    got, headers, body = _call(_asgi(status, b"Internal Server Error\nRayActorError...", b"text/plain"))
    doc = json.loads(body)
    assert got == status and headers[b"content-type"] == b"application/json"
    assert doc["code"] == code and doc["error"].startswith(f"[{code}] ") and "Internal Server Error" in doc["error"]
    assert int(headers[b"content-length"]) == len(body)


def test_no_answer_at_all_becomes_a_hyb_708():
    async def silent(scope, receive, send):  # Serve's proxy when the replica died holding the request
        return None

    status, _, body = _call(silent)
    assert status == 500 and __import__("json").loads(body)["code"] == "HYB-708"


def test_json_answers_and_successes_pass_through():
    mine = b'{"error": "[HYB-702] bad", "code": "HYB-702"}'
    assert _call(_asgi(400, mine, b"application/json"))[2] == mine
    assert _call(_asgi(200, b"plain ok", b"text/plain"))[2] == b"plain ok"


def test_models_by_uri_are_read_by_each_node_and_checked(tmp_path):
    import functools
    import http.server
    import threading

    from hybrid.serve.ray.models import is_uri, package_uri

    tiny = tiny_model(tmp_path / "tiny.onnx")
    digest = hashlib.sha256(tiny.read_bytes()).hexdigest()
    assert is_uri("m=s3://b/m.hybrid") and not is_uri(str(tiny))
    by_file = package_uri(f"m={tiny.as_uri()}", tmp_path / "scratch")  # the driver read it once for the digest
    assert (by_file.source.name, by_file.sha256, by_file.data, by_file.size) == ("m", digest, None,
                                                                                   tiny.stat().st_size)
    assert "from file://" in repr(pickle.loads(pickle.dumps(by_file)))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/tiny.onnx"
        by_http = package_uri(f"{url}#sha256={digest}")  # digest given: the driver reads nothing
        assert (by_http.source.name, by_http.nbytes) == ("tiny", 0)
        source = materialize(by_http, tmp_path / "cache")
        assert source.path == str(tmp_path / "cache" / f"{digest}.onnx")
        registry = build_registry([], target="onnxruntime", sources=[source])
        registry.close()
        tiny_model(tiny, factor=3.0)  # the file at the URI changed after the deployment
        with pytest.raises(HybridError) as e:
            materialize(by_http, tmp_path / "other-node")
        assert e.value.code == "HYB-503" and url in e.value.message
        assert not [p for p in (tmp_path / "other-node").iterdir() if not p.name.startswith(".")]
    finally:
        server.shutdown()
    with pytest.raises(HybridError) as e:
        package_uri("m=https://example.invalid/model.txt")
    assert e.value.code == "HYB-707"
    memory = pytest.importorskip("fsspec").filesystem("memory")
    memory.pipe("/models/tiny.onnx", tiny.read_bytes())
    by_fsspec = package_uri("memory://models/tiny.onnx", tmp_path / "scratch")
    assert materialize(by_fsspec, tmp_path / "cache2").name == "tiny"


def test_app_builder_takes_uris(tmp_path):
    from hybrid.serve.ray.deployment import app_builder

    tiny = tiny_model(tmp_path / "tiny.onnx")
    built = app_builder({"models": [f"web={tiny.as_uri()}", str(tiny)]})
    packages = built._bound_deployment.init_args[0]
    assert [(p.source.name, p.data is None) for p in packages] == [("tiny", False), ("web", True)]


def _run_proxy(app, messages):
    from hybrid.serve.ray.proxy import ServeErrorsAsHyb

    sent, incoming = [], list(messages)

    async def receive():
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()  # no more messages: waits until cancelled

    async def send(message):
        sent.append(message)

    asyncio.run(ServeErrorsAsHyb(app)({"type": "http", "method": "POST"}, receive, send))
    return sent


def test_a_request_whose_replica_died_is_sent_again():
    calls = []

    async def app(scope, receive, send):  # Serve's proxy: the first replica dies holding the request
        body = (await receive())["body"]
        calls.append(body)
        if len(calls) == 1:
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"answer to " + body})

    sent = _run_proxy(app, [{"type": "http.request", "body": b"req", "more_body": False}])
    assert calls == [b"req", b"req"] and sent[0]["status"] == 200 and sent[1]["body"] == b"answer to req"


def test_retries_are_bounded_and_a_gone_client_is_not_retried():
    import json

    from hybrid.serve.ray.proxy import RETRIES

    calls = []

    async def silent(scope, receive, send):
        calls.append((await receive())["type"])

    sent = _run_proxy(silent, [{"type": "http.request", "body": b"x", "more_body": False}])
    assert len(calls) == RETRIES + 1 and json.loads(sent[1]["body"])["code"] == "HYB-708"
    calls.clear()

    async def reads_to_disconnect(scope, receive, send):
        calls.append([(await receive())["type"], (await receive())["type"]])

    _run_proxy(reads_to_disconnect, [{"type": "http.request", "body": b"x", "more_body": False},
                                     {"type": "http.disconnect"}])
    assert calls == [["http.request", "http.disconnect"]]
