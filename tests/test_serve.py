"""The server end to end through tritonclient.http (unmodified): health, metadata, JSON and binary inference,
compression, versions and repositories, metrics, the CLI command."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import typer
from tests._serve_support import dynamic_squeezenet, error_of, int_model, request, tiny_expected, tiny_model, v2_json
from typer.testing import CliRunner

import hybrid
from hybrid.errors import ConfigError, ModelError, ServingError
from hybrid.serve import BackgroundServer, BatchSettings, ServeOptions, build_registry, create_app, discover

th = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-models")
    return {"tiny": tiny_model(root / "tiny.onnx"), "ints": int_model(root / "ints.onnx"),
            "squeezenet": dynamic_squeezenet(root / "squeezenet.onnx")}


@pytest.fixture(scope="module")
def server(models):
    registry = build_registry(list(models.values()), target="onnxruntime")
    srv = BackgroundServer(create_app(registry)).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def client(server):
    c = th.InferenceServerClient(server.url, network_timeout=60.0)
    try:
        yield c
    finally:
        c.close()


def infer_input(name, array, binary):
    inp = th.InferInput(name, list(array.shape), {np.float32: "FP32", np.int64: "INT64"}[array.dtype.type])
    inp.set_data_from_numpy(array, binary_data=binary)
    return inp


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny") and client.is_model_ready("tiny", "1")
    assert not client.is_model_ready("absent")
    meta = client.get_server_metadata()
    assert meta["name"] == "pyasc" and meta["version"] == hybrid.__version__
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata(client):
    meta = client.get_model_metadata("tiny")
    assert meta == {"name": "tiny", "versions": ["1"], "platform": "onnx",
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                               {"name": "scale", "datatype": "FP32", "shape": [-1, 1]}],
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]},
                                {"name": "s", "datatype": "FP32", "shape": [-1, 1]}]}
    assert client.get_model_metadata("squeezenet", "1")["inputs"][0]["shape"] == [-1, 3, 224, 224]
    with pytest.raises(InferenceServerException, match="HYB-701"):
        client.get_model_metadata("tiny", "9")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_squeezenet_results_equal_the_local_compiled_model(client, models, binary, light):
    x = np.concatenate([light.light_input(), light.light_input()[:, :, ::-1] * 0.5]).astype(np.float32)
    local = hybrid.compile(models["squeezenet"], target="onnxruntime").run({"data_0": x})["softmaxout_1"]
    out = th.InferRequestedOutput("softmaxout_1", binary_data=binary)
    result = client.infer("squeezenet", [infer_input("data_0", x, binary)], outputs=[out], request_id="sq-1")
    got = result.as_numpy("softmaxout_1")
    assert got.dtype == np.float32 and got.shape == (2, 1000, 1, 1)
    np.testing.assert_array_equal(got, local)  # same runtime, same inputs: bit-identical (JSON floats round-trip)
    assert result.get_response()["id"] == "sq-1"
    np.testing.assert_allclose(got[:1], light.light_expected("squeezenet"), rtol=1e-3, atol=1e-7)


def test_hybrid_bundles_served_alone_and_in_a_repository_equal_hybrid_load(tmp_path, models, light):
    bundle = tmp_path / "sq.hybrid"
    hybrid.compile(models["squeezenet"], target="onnxruntime").save(str(bundle))
    (tmp_path / "repo" / "squeeze" / "3").mkdir(parents=True)
    hybrid.compile(models["squeezenet"], target="onnxruntime").save(str(tmp_path / "repo" / "squeeze" / "3" /
                                                                        "model.hybrid"))
    x = np.concatenate([light.light_input(), light.light_input() * 0.25]).astype(np.float32)
    local = hybrid.load(str(bundle), target="onnxruntime").run({"data_0": x})["softmaxout_1"]
    registry = build_registry([bundle, tmp_path / "repo"], target="onnxruntime")
    with BackgroundServer(create_app(registry)) as srv:
        c = th.InferenceServerClient(srv.url)
        try:
            assert c.get_model_metadata("sq")["platform"] == "hybrid"
            for name, version in (("sq", "1"), ("squeeze", "3")):
                assert c.is_model_ready(name, version)
                for binary in (True, False):
                    out = th.InferRequestedOutput("softmaxout_1", binary_data=binary)
                    got = c.infer(name, [infer_input("data_0", x, binary)], outputs=[out]).as_numpy("softmaxout_1")
                    np.testing.assert_array_equal(got, local)
        finally:
            c.close()


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compressed_requests_and_default_binary_outputs(client, compression, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    scale = rng.standard_normal((3, 1)).astype(np.float32)
    result = client.infer("tiny", [infer_input("x", x, True), infer_input("scale", scale, False)],
                          request_compression_algorithm=compression)
    want = tiny_expected(x, scale)
    np.testing.assert_allclose(result.as_numpy("y"), want["y"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("s"), want["s"], rtol=1e-6, atol=1e-6)
    assert all("parameters" in o for o in result.get_response()["outputs"])  # no outputs named: all binary


def test_integer_and_bool_tensors(client):
    i = np.array([[1, -2, 0], [5, 0, -7]], np.int64)
    for binary in (True, False):
        outs = [th.InferRequestedOutput("pos", binary_data=binary), th.InferRequestedOutput("twice", binary_data=False)]
        result = client.infer("ints", [infer_input("i", i, binary)], outputs=outs)
        np.testing.assert_array_equal(result.as_numpy("pos"), i > 0)
        np.testing.assert_array_equal(result.as_numpy("twice"), i * 2)


def _tiny_counts(url: str) -> tuple[int, int, int]:
    stats = json.loads(request(url, "GET", "/v2/models/tiny/stats")[2])["model_stats"][0]
    return stats["inference_stats"]["success"]["count"], stats["inference_stats"]["fail"]["count"], \
        stats["execution_count"]


def test_inputs_that_do_not_fit_the_model_are_400_with_the_run_code(server, client):
    before = _tiny_counts(server.url)
    x = np.zeros((2, 4), np.float64)
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer",
                              json.dumps({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP64",
                                                      "data": x.reshape(-1).tolist()}]}).encode())
    assert status == 400 and error_of(body) in ("HYB-401", "HYB-403")
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer",
                              v2_json({"x": np.zeros((2, 5), np.float32), "scale": np.ones((2, 1), np.float32)}))
    assert status == 400 and error_of(body) == "HYB-405"
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer",
                              v2_json({"x": np.zeros((2, 4), np.float32), "scale": np.ones((2, 1), np.float32)},
                                      outputs=[{"name": "nope"}]))
    assert status == 400 and error_of(body) == "HYB-702"
    assert b"unexpected inference output 'nope' for model 'tiny'" in body  # Triton's words, before the run
    status, _, body = request(server.url, "GET", "/v2/nothing/here")
    assert status == 404 and error_of(body) == "HYB-701"
    with pytest.raises(InferenceServerException, match=r"\[HYB-401\]"):
        client.infer("tiny", [infer_input("x", np.zeros((1, 4), np.float32), True)])
    # none of them reached the model: Triton's statistics count none of them (no run, no failure)
    assert _tiny_counts(server.url) == before


def test_metrics_count_requests_failures_batches_and_pool(server, client, rng):
    from hybrid.hal import memory

    memory.configure_pools({"cpu": 1 << 20})
    try:
        x = rng.standard_normal((1, 4)).astype(np.float32)
        for _ in range(3):
            client.infer("tiny", [infer_input("x", x, True), infer_input("scale", np.ones((1, 1), np.float32), True)])
        with pytest.raises(InferenceServerException):
            client.infer("tiny", [infer_input("x", x, True)])
        status, headers, body = request(server.url, "GET", "/metrics")
    finally:
        memory.configure_pools({})
    assert status == 200 and headers["content-type"].startswith("text/plain")
    text = body.decode()

    def value(pattern: str) -> float:
        m = re.search(pattern + r" ([0-9.e+]+)$", text, re.MULTILINE)
        assert m, pattern
        return float(m.group(1))

    assert value(r'pyasc_inference_requests_total\{model="tiny",version="1"\}') >= 4
    assert value(r'pyasc_inference_failures_total\{code="HYB-401",model="tiny",version="1"\}') >= 1
    assert value(r'pyasc_batch_size_count\{model="tiny",version="1"\}') >= 3
    assert value(r'pyasc_queue_duration_seconds_count\{model="tiny",version="1"\}') >= 3
    assert value(r'pyasc_request_duration_seconds_bucket\{le="\+Inf",model="tiny",version="1"\}') >= 4
    assert value(r'pyasc_queue_depth\{model="tiny",version="1"\}') == 0
    assert value(r'pyasc_pool_bytes\{device="cpu",kind="reserved"\}') >= 1 << 20


def test_a_metrics_port_answers_metrics_alone(models):
    registry = build_registry([models["tiny"]], target="onnxruntime")
    options = ServeOptions(metrics_address="127.0.0.1:0", auth_token="s3cret")
    with BackgroundServer(create_app(registry, options)) as srv:
        port = srv.server.state.metrics_port
        assert port and port != srv.port
        auth = {"Authorization": "Bearer s3cret"}
        status, headers, body = request(f"127.0.0.1:{port}", "GET", "/metrics", headers=auth)
        assert status == 200 and headers["content-type"].startswith("text/plain")
        assert b"nv_inference_request_success" in body
        assert request(f"127.0.0.1:{port}", "GET", "/metrics")[0] == 401  # behind the token, as the API is
        for path in ("/v2/health/ready", "/v2/models/tiny", "/"):  # as Triton's metrics port: nothing else
            status, _, body = request(f"127.0.0.1:{port}", "GET", path, headers=auth)
            assert status == 404 and error_of(body) == "HYB-701", path
        assert request(srv.url, "GET", "/metrics", headers=auth)[0] == 200  # the server's own port keeps it
        assert request(srv.url, "GET", "/v2/health/ready", headers=auth)[0] == 200


def test_repository_versions_config_and_default_version(tmp_path, rng):
    repo = tmp_path / "repo"
    for version, factor in (("1", 1.0), ("2", 3.0), ("10", -1.0)):
        (repo / "lin" / version).mkdir(parents=True)
        tiny_model(repo / "lin" / version / "model.onnx", factor)
    (repo / "lin" / "config.json").write_text(json.dumps({"max_batch": 4, "batch_timeout": 0.001,
                                                          "target": "onnxruntime"}))
    (repo / ".git").mkdir()  # hidden entries are skipped
    assert [(s.name, s.version) for s in discover([repo])] == [("lin", "1"), ("lin", "2"), ("lin", "10")]
    registry = build_registry([repo], overrides={"max_queue": 7})
    assert registry.get("lin").version == "10"  # highest number, not highest string
    assert registry.get("lin", "2").settings == BatchSettings(max_batch=4, batch_timeout=0.001, max_queue=7)
    with BackgroundServer(create_app(registry)) as srv:
        c = th.InferenceServerClient(srv.url)
        try:
            assert c.get_model_metadata("lin")["versions"] == ["1", "2", "10"]  # lowest first, as Triton lists
            x = rng.standard_normal((2, 4)).astype(np.float32)
            scale = np.ones((2, 1), np.float32)
            for version, factor in (("", -1.0), ("1", 1.0), ("2", 3.0)):
                got = c.infer("lin", [infer_input("x", x, True), infer_input("scale", scale, True)],
                              model_version=version).as_numpy("y")
                np.testing.assert_allclose(got, tiny_expected(x, scale, factor)["y"], rtol=1e-5, atol=1e-5)
        finally:
            c.close()


def test_discovery_errors(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        discover([tmp_path / "missing.onnx"])
    model = tiny_model(tmp_path / "tiny.onnx")
    with pytest.raises(ServingError, match="served twice") as info:
        discover([model, model])
    assert info.value.code == "HYB-707"
    assert [(s.name, s.version) for s in discover([f"renamed={model}"])] == [("renamed", "1")]
    (tmp_path / "repo" / "m" / "1").mkdir(parents=True)
    with pytest.raises(ServingError, match="exactly one"):
        discover([tmp_path / "repo"])
    tiny_model(tmp_path / "repo" / "m" / "1" / "model.onnx")
    (tmp_path / "repo" / "m" / "config.json").write_text('{"max_batchh": 3}')
    with pytest.raises(ConfigError, match="max_batchh"):
        discover([tmp_path / "repo"])
    (tmp_path / "repo" / "m" / "config.json").write_text('{"max_batch": -3}')
    with pytest.raises(ConfigError, match="max_batch"):
        discover([tmp_path / "repo"])


def serve_app() -> typer.Typer:
    from hybrid.cli.serve import register

    app = typer.Typer(add_completion=False)

    @app.callback()
    def _root() -> None:
        """test app"""

    register(app)
    return app


def test_cli_help_and_errors(tmp_path):
    runner = CliRunner()
    result = runner.invoke(serve_app(), ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--max-batch", "--batch-timeout", "--max-queue", "--request-timeout", "--auth-token",
                   "PYASC_AUTH_TOKEN", "--max-body", "--ray", "--replicas", "--autoscaling"):
        assert option in result.output
    result = runner.invoke(serve_app(), ["serve", str(tmp_path / "missing.onnx")])
    assert result.exit_code == 1 and "HYB-201" in result.output
    model = tiny_model(tmp_path / "tiny.onnx")
    result = runner.invoke(serve_app(), ["serve", str(model), "--max-batch", "-2"])
    assert result.exit_code == 1 and "HYB-102" in result.output
    result = runner.invoke(serve_app(), ["serve", str(model), "--ray", "--autoscaling", "{bad"])
    assert result.exit_code == 1 and "HYB-102" in result.output
    result = runner.invoke(serve_app(), ["serve", str(model), "--backend-config", '{"onnxruntime": {"spin": 1}}'])
    assert result.exit_code == 1 and "HYB-306" in result.output


def test_server_backend_defaults_turn_spinning_off_unless_asked():
    from hybrid.config import get_config
    from hybrid.serve.core.repository import configure_backends

    configure_backends(None)
    assert get_config().backends["onnxruntime"]["allow_spinning"] is False
    if "openvino" in get_config().backends:  # installed: its threads are left unpinned beside the front end
        assert get_config().backends["openvino"]["cpu_pinning"] is False
    merged = configure_backends({"onnxruntime": {"allow_spinning": True, "intra_op_num_threads": 1}})
    assert merged["onnxruntime"] == {"allow_spinning": True, "intra_op_num_threads": 1}
    with pytest.raises(ConfigError):
        configure_backends({"onnxruntime": 3})


def test_unbatched_mode_serves_each_request_alone(models, rng):
    registry = build_registry([models["tiny"]], target="onnxruntime", overrides={"max_batch": 0})
    with BackgroundServer(create_app(registry, ServeOptions())) as srv:
        c = th.InferenceServerClient(srv.url)
        try:
            x = rng.standard_normal((2, 4)).astype(np.float32)
            scale = np.full((2, 1), 2.0, np.float32)
            got = c.infer("tiny", [infer_input("x", x, True), infer_input("scale", scale, True)]).as_numpy("y")
            np.testing.assert_allclose(got, tiny_expected(x, scale)["y"], rtol=1e-5, atol=1e-5)
        finally:
            c.close()
