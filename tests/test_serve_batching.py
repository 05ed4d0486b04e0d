"""Dynamic batching on the server: how requests are joined and split, and the bounded loopback load test
(32 concurrent clients x 100 requests, zero errors, every response matches its own request)."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tests._serve_support import request, tiny_expected, tiny_model

from hybrid.runtime.compiler import compile_model
from hybrid.serve import BackgroundServer, BatchSettings, ServedModel, build_registry, create_app

pytestmark = pytest.mark.timeout(300)


def relu_model(path, shape):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def served(path, **settings):
    batches = []
    model = ServedModel("m", "1", compile_model(path, target="onnxruntime"), BatchSettings(**settings),
                        observer=lambda m, size, waits, run_s: batches.append(size))
    return model, batches


async def infer_all(model, requests):
    return await asyncio.gather(*(model.infer(r) for r in requests))


def test_requests_join_by_inner_shape_and_split_by_their_own_rows(tmp_path, rng):
    model, batches = served(relu_model(tmp_path / "relu.onnx", ["N", "C"]), max_batch=8, batch_timeout=0.5)
    try:
        reqs = [{"x": rng.standard_normal((rows, cols)).astype(np.float32)}
                for rows, cols in [(1, 2), (3, 2), (2, 5), (1, 2), (4, 5), (2, 2), (1, 5), (2, 2)]]
        outs = asyncio.run(infer_all(model, reqs))
        for r, out in zip(reqs, outs):
            np.testing.assert_array_equal(out["y"], np.maximum(r["x"], 0))
        assert batches == [8]  # one batch of 8 requests, run as two groups (C=2 and C=5)
    finally:
        model.close()


def test_static_batch_model_runs_a_batch_request_by_request(tmp_path, rng):
    model, batches = served(relu_model(tmp_path / "relu1.onnx", [1, 3]), max_batch=4, batch_timeout=0.5)
    try:
        assert model.batch_symbol is None
        reqs = [{"x": rng.standard_normal((1, 3)).astype(np.float32)} for _ in range(4)]
        for r, out in zip(reqs, asyncio.run(infer_all(model, reqs))):
            np.testing.assert_array_equal(out["y"], np.maximum(r["x"], 0))
        assert batches == [4]
    finally:
        model.close()


def test_a_bad_request_fails_alone(tmp_path, rng):
    model, _ = served(tiny_model(tmp_path / "tiny.onnx"), max_batch=8, batch_timeout=0.3)
    try:
        good = {"x": rng.standard_normal((2, 4)).astype(np.float32), "scale": np.ones((2, 1), np.float32)}
        bad = {"x": np.zeros((2, 4), np.float32)}

        async def both():
            return await asyncio.gather(model.infer(good), model.infer(bad), return_exceptions=True)

        ok, err = asyncio.run(both())
        np.testing.assert_allclose(ok["y"], tiny_expected(good["x"], good["scale"])["y"], rtol=1e-5, atol=1e-5)
        assert getattr(err, "code", None) == "HYB-401"
    finally:
        model.close()


def test_load_32_clients_x_100_requests_zero_errors_each_answer_its_own(tmp_path):
    import tritonclient.http as th

    registry = build_registry([tiny_model(tmp_path / "tiny.onnx")], target="onnxruntime",
                              overrides={"max_batch": 32, "batch_timeout": 0.002, "max_queue": 1024})
    clients, per_client = 32, 100
    with BackgroundServer(create_app(registry)) as srv:
        def client_run(cid: int) -> int:
            c = th.InferenceServerClient(srv.url, network_timeout=120.0)
            mismatches = 0
            try:
                for k in range(per_client):
                    seed = cid * per_client + k
                    rows = 1 + seed % 3
                    x = np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)
                    scale = np.full((rows, 1), float(seed), np.float32)  # the request id is in the data
                    inputs = [th.InferInput("x", [rows, 4], "FP32"), th.InferInput("scale", [rows, 1], "FP32")]
                    inputs[0].set_data_from_numpy(x, binary_data=k % 2 == 0)
                    inputs[1].set_data_from_numpy(scale, binary_data=True)
                    result = c.infer("tiny", inputs, request_id=str(seed))
                    want = tiny_expected(x, scale)
                    same = (result.get_response()["id"] == str(seed)
                            and np.allclose(result.as_numpy("y"), want["y"], rtol=1e-5, atol=1e-4)
                            and np.allclose(result.as_numpy("s"), want["s"], rtol=1e-5, atol=1e-5))
                    mismatches += not same
            finally:
                c.close()
            return mismatches

        with cf.ThreadPoolExecutor(clients) as pool:
            mismatches = list(pool.map(client_run, range(clients)))  # any HTTP error raises here
        assert sum(mismatches) == 0
        text = request(srv.url, "GET", "/metrics")[2].decode()
    total = clients * per_client
    assert re.search(rf'pyasc_inference_requests_total\{{model="tiny",version="1"\}} {total}\.0', text)
    assert "pyasc_inference_failures_total{" not in text
    count = float(re.search(r'pyasc_batch_size_count\{model="tiny",version="1"\} ([0-9.e+]+)', text).group(1))
    summed = float(re.search(r'pyasc_batch_size_sum\{model="tiny",version="1"\} ([0-9.e+]+)', text).group(1))
    assert summed == total and count < total  # some requests really shared a batch


@pytest.mark.timeout(120)
def test_batching_settings_come_from_the_bundle_manifest(tmp_path):
    from tests._models import matmul_add

    import hybrid
    from hybrid.bundle import save_bundle
    from hybrid.errors import BundleError
    from hybrid.serve.repository import discover, load_model

    cm = hybrid.compile(matmul_add(), target="onnxruntime")
    path = tmp_path / "mm.hybrid"
    save_bundle(cm, path, serving={"max_batch": 3, "batch_timeout": 0.02})
    (source,) = discover([str(path)])
    served = load_model(source)
    try:
        assert served.settings.max_batch == 3 and served.settings.batch_timeout == 0.02
        assert served.settings.max_queue == 256  # left unset in the bundle: the server's default
    finally:
        served.close()
    overridden = load_model(source, overrides={"max_batch": 5})
    try:
        assert overridden.settings.max_batch == 5  # the command line wins over the bundle
    finally:
        overridden.close()
    with pytest.raises(BundleError) as e:
        save_bundle(cm, tmp_path / "bad.hybrid", serving={"max_batch": -1})
    assert e.value.code == "HYB-502" and "max_batch" in e.value.message
    assert not (tmp_path / "bad.hybrid").exists()
