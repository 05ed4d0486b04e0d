"""The server as a Triton shop sees it: unmodified tritonclient.grpc and tritonclient.http (sync and asyncio)
against one in-process server on free loopback ports. gRPC inference (raw and typed contents, streaming),
model configuration, statistics, repository index / load / unload, auth, error statuses, and Triton's
metrics after a load."""

from __future__ import annotations

import asyncio
import queue
import re
import urllib.request

import numpy as np
import pytest
from tests._serve_support import dynamic_squeezenet, int_model, tiny_expected, tiny_model

import hybrid
from hybrid.serve import BackgroundServer, ServeOptions, build_registry, create_app

tg = pytest.importorskip("tritonclient.grpc")
import grpc  # noqa: E402
import tritonclient.grpc.aio as tga  # noqa: E402
import tritonclient.http as th  # noqa: E402
import tritonclient.http.aio as tha  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc as pb_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc-models")
    repo = root / "repo"
    (repo / "tiny" / "1").mkdir(parents=True)
    tiny_model(repo / "tiny" / "1" / "model.onnx")
    (repo / "ints" / "1").mkdir(parents=True)
    int_model(repo / "ints" / "1" / "model.onnx")
    return {"repo": repo, "squeezenet": dynamic_squeezenet(root / "squeezenet.onnx")}


def start(paths, **options):
    registry = build_registry(paths, target="onnxruntime")
    app = create_app(registry, ServeOptions(grpc_address="127.0.0.1:0", **options))
    srv = BackgroundServer(app).start()
    srv.grpc_url = f"127.0.0.1:{app.state.hybrid.grpc_port}"
    return srv


@pytest.fixture(scope="module")
def server(models):
    srv = start([models["repo"], models["squeezenet"]])
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def gclient(server):
    c = tg.InferenceServerClient(server.grpc_url)
    try:
        yield c
    finally:
        c.close()


def tiny_inputs(module, x, scale):
    ins = [module.InferInput("x", list(x.shape), "FP32"), module.InferInput("scale", list(scale.shape), "FP32")]
    ins[0].set_data_from_numpy(x)
    ins[1].set_data_from_numpy(scale)
    return ins


def feeds(seed, rows=2):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 4)).astype(np.float32), rng.uniform(0.5, 2, (rows, 1)).astype(np.float32)


def test_health_metadata_and_the_http_port_agree(gclient, server):
    assert gclient.is_server_live() and gclient.is_server_ready()
    assert gclient.is_model_ready("tiny") and gclient.is_model_ready("tiny", "1")
    assert not gclient.is_model_ready("absent")
    meta = gclient.get_server_metadata(as_json=True)
    assert meta["name"] == "pyasc" and meta["version"] == hybrid.__version__
    assert {"binary_tensor_data", "model_configuration", "statistics"} <= set(meta["extensions"])
    over_grpc = gclient.get_model_metadata("tiny", as_json=True)
    over_http = th.InferenceServerClient(server.url).get_model_metadata("tiny")
    assert over_grpc["name"] == "tiny" and over_grpc["versions"] == ["1"] and over_grpc["platform"] == "onnx"
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in over_grpc["inputs"]] == \
        [(t["name"], t["datatype"], t["shape"]) for t in over_http["inputs"]]


def test_grpc_raw_contents_equal_the_local_compiled_model(gclient, models, light):
    x = np.concatenate([light.light_input(), light.light_input()[:, :, ::-1] * 0.5]).astype(np.float32)
    local = hybrid.compile(models["squeezenet"], target="onnxruntime").run({"data_0": x})["softmaxout_1"]
    inp = tg.InferInput("data_0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = gclient.infer("squeezenet", [inp], outputs=[tg.InferRequestedOutput("softmaxout_1")], request_id="g1")
    got = result.as_numpy("softmaxout_1")
    assert got.dtype == np.float32 and got.shape == (2, 1000, 1, 1)
    np.testing.assert_array_equal(got, local)
    assert result.get_response().id == "g1"


def test_every_client_answers_bit_identical_to_the_local_compiled_model(server, models, light):
    """tritonclient.grpc and .http, sync and asyncio, JSON, binary and raw contents: the same bits as cm.run."""
    x = np.concatenate([light.light_input() * 0.75, light.light_input()[:, :, :, ::-1]]).astype(np.float32)
    local = hybrid.compile(models["squeezenet"], target="onnxruntime").run({"data_0": x})["softmaxout_1"]

    def request(module, binary=True):
        inp = module.InferInput("data_0", list(x.shape), "FP32")
        if module is th or module is tha:
            inp.set_data_from_numpy(x, binary_data=binary)
            return {"inputs": [inp], "outputs": [module.InferRequestedOutput("softmaxout_1", binary_data=binary)]}
        inp.set_data_from_numpy(x)
        return {"inputs": [inp], "outputs": [module.InferRequestedOutput("softmaxout_1")]}

    got = {"grpc": tg.InferenceServerClient(server.grpc_url).infer("squeezenet", **request(tg)),
           "http binary": th.InferenceServerClient(server.url).infer("squeezenet", **request(th, True)),
           "http json": th.InferenceServerClient(server.url).infer("squeezenet", **request(th, False))}

    async def aio():
        g, h = tga.InferenceServerClient(server.grpc_url), tha.InferenceServerClient(server.url)
        try:
            return await g.infer("squeezenet", **request(tga)), await h.infer("squeezenet", **request(tha, True))
        finally:
            await g.close()
            await h.close()

    got["grpc aio"], got["http aio"] = asyncio.run(aio())
    for how, result in got.items():
        assert np.array_equal(result.as_numpy("softmaxout_1"), local), how


def test_grpc_ints_bools_and_output_selection(gclient):
    i = np.array([[-2, 0, 5], [7, -1, 1 << 40]], np.int64)
    inp = tg.InferInput("i", [2, 3], "INT64")
    inp.set_data_from_numpy(i)
    result = gclient.infer("ints", [inp], outputs=[tg.InferRequestedOutput("twice")])
    np.testing.assert_array_equal(result.as_numpy("twice"), i + i)
    assert result.as_numpy("pos") is None  # not requested, not sent
    both = gclient.infer("ints", [inp])
    assert both.as_numpy("pos").dtype == np.bool_
    np.testing.assert_array_equal(both.as_numpy("pos"), i > 0)


def test_typed_contents_are_accepted(server):
    x, scale = feeds(3)
    request = pb.ModelInferRequest(model_name="tiny", id="typed")
    for name, arr in (("x", x), ("scale", scale)):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=list(arr.shape))
        tensor.contents.fp32_contents.extend(arr.reshape(-1).tolist())
    with grpc.insecure_channel(server.grpc_url) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert response.id == "typed" and [o.name for o in response.outputs] == ["y", "s"]
    y = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 3)
    np.testing.assert_allclose(y, tiny_expected(x, scale)["y"], rtol=1e-6)


def test_grpc_errors_carry_hyb_codes_and_statuses(gclient, server):
    x, scale = feeds(4)
    with pytest.raises(InferenceServerException) as info:
        gclient.infer("absent", tiny_inputs(tg, x, scale))
    assert info.value.status() == "StatusCode.NOT_FOUND" and "[HYB-701]" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        gclient.infer("tiny", tiny_inputs(tg, x, scale)[:1])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "[HYB-401]" in info.value.message()
    bad = pb.ModelInferRequest(model_name="tiny")
    bad.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    bad.inputs.add(name="scale", datatype="FP32", shape=[2, 1])
    bad.raw_input_contents.extend([x.tobytes()[:-4], scale.tobytes()])  # one float short
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as err:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(bad, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "[HYB-702]" in err.value.details() and "'x'" in err.value.details()
    assert ("hyb-code", "HYB-702") in err.value.trailing_metadata()


def test_streaming_infer_answers_every_request_by_id(gclient):
    answers: queue.Queue = queue.Queue()
    gclient.start_stream(callback=lambda result, error: answers.put((result, error)))
    sent = {}
    try:
        for k in range(6):
            x, scale = feeds(10 + k, rows=1 + k % 3)
            sent[f"s{k}"] = tiny_expected(x, scale)["y"]
            gclient.async_stream_infer("tiny", tiny_inputs(tg, x, scale), request_id=f"s{k}")
        gclient.async_stream_infer("absent", tiny_inputs(tg, x, scale), request_id="bad")
        got, errors = {}, []
        for _ in range(7):
            result, error = answers.get(timeout=60)
            if error is not None:
                errors.append(error)
            else:
                got[result.get_response().id] = result.as_numpy("y")
    finally:
        gclient.stop_stream()
    assert set(got) == set(sent) and len(errors) == 1 and "HYB-701" in str(errors[0])
    for key, y in got.items():
        np.testing.assert_allclose(y, sent[key], rtol=1e-6)


def test_model_config_statistics_and_index_over_grpc_and_http(gclient, server):
    x, scale = feeds(5)
    gclient.infer("tiny", tiny_inputs(tg, x, scale))
    config = gclient.get_model_config("tiny").config
    assert config.name == "tiny" and config.max_batch_size == 8 and config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in config.input] == [("x", [4]), ("scale", [1])]
    http = th.InferenceServerClient(server.url)
    as_json = http.get_model_config("tiny")
    assert as_json["max_batch_size"] == 8 and as_json["input"][0] == {**as_json["input"][0], "name": "x",
                                                                     "data_type": "TYPE_FP32", "dims": [4]}
    assert http.get_model_config("squeezenet")["input"][0]["dims"] == [3, 224, 224]
    stats = gclient.get_inference_statistics("tiny").model_stats
    assert len(stats) == 1 and stats[0].inference_stats.success.count >= 1
    http_stats = http.get_inference_statistics("tiny")["model_stats"][0]
    assert http_stats["name"] == "tiny" and isinstance(http_stats["inference_count"], int)
    assert http_stats["inference_stats"]["success"]["count"] >= 1
    assert {s["name"] for s in http.get_inference_statistics()["model_stats"]} == {"tiny", "ints", "squeezenet"}
    index = {(m["name"], m["version"], m["state"]) for m in http.get_model_repository_index()}
    assert ("tiny", "1", "READY") in index and ("ints", "1", "READY") in index
    assert {m.name for m in gclient.get_model_repository_index().models} >= {"tiny", "ints"}
    with pytest.raises(InferenceServerException, match="HYB-701"):
        http.get_model_config("absent")


def test_load_and_unload_are_refused_without_model_control(gclient, server):
    with pytest.raises(InferenceServerException) as info:
        gclient.unload_model("tiny")
    assert "[HYB-709]" in info.value.message() and info.value.status() == "StatusCode.UNAVAILABLE"
    with pytest.raises(InferenceServerException, match="HYB-709"):
        th.InferenceServerClient(server.url).load_model("tiny")
    assert gclient.is_model_ready("tiny")


def test_model_control_unloads_and_loads_from_the_repository(models):
    srv = start([models["repo"]], model_control=True)
    try:
        g, h = tg.InferenceServerClient(srv.grpc_url), th.InferenceServerClient(srv.url)
        x, scale = feeds(6)
        g.unload_model("ints")
        assert not g.is_model_ready("ints") and not h.is_model_ready("ints")
        assert {(m["name"], m["state"]) for m in h.get_model_repository_index()} == {("tiny", "READY"),
                                                                                    ("ints", "UNAVAILABLE")}
        h.load_model("ints")
        assert g.is_model_ready("ints")
        i = np.arange(6, dtype=np.int64).reshape(2, 3) - 2
        inp = th.InferInput("i", [2, 3], "INT64")
        inp.set_data_from_numpy(i)
        np.testing.assert_array_equal(h.infer("ints", [inp]).as_numpy("twice"), i + i)
        h.unload_model("tiny")
        with pytest.raises(InferenceServerException, match="HYB-701"):
            g.infer("tiny", tiny_inputs(tg, x, scale))
        g.load_model("tiny")
        np.testing.assert_allclose(g.infer("tiny", tiny_inputs(tg, x, scale)).as_numpy("y"),
                                   tiny_expected(x, scale)["y"], rtol=1e-6)
        with pytest.raises(InferenceServerException, match="HYB-701"):
            g.load_model("absent")
    finally:
        srv.stop()


def test_a_load_may_carry_the_configuration_that_stands_for_config_pbtxt(models, tmp_path):
    import json

    srv = start([models["repo"], models["squeezenet"]], model_control=True)
    try:
        g, h = tg.InferenceServerClient(srv.grpc_url), th.InferenceServerClient(srv.url)
        x, scale = feeds(5, rows=5)
        h.load_model("tiny", config=json.dumps({"max_batch_size": 4, "dynamic_batching": {}}))
        assert h.get_model_config("tiny")["max_batch_size"] == 4
        with pytest.raises(InferenceServerException, match="batch-size must be <= 4"):
            g.infer("tiny", tiny_inputs(tg, x, scale))
        g.load_model("tiny", config=json.dumps({"name": "tiny", "max_batch_size": 2, "dynamic_batching": {}}))
        assert g.get_model_config("tiny", as_json=True)["config"]["max_batch_size"] == 2
        h.load_model("tiny")  # without one: the repository's own again (no config.pbtxt there)
        assert h.get_model_config("tiny")["max_batch_size"] == 8
        np.testing.assert_allclose(g.infer("tiny", tiny_inputs(tg, x, scale)).as_numpy("y"),
                                   tiny_expected(x, scale)["y"], rtol=1e-6)
        for config, says in [("{not json", "not a Triton model configuration"),
                             (json.dumps({"max_batch_size": 4, "flavour": 1}), "not a Triton model configuration"),
                             (json.dumps({"name": "ints"}), "names model 'ints', not 'tiny'"),
                             (json.dumps({"input": [{"name": "nope", "data_type": "TYPE_FP32", "dims": [4]}]}),
                              "'nope' is not an input of the model")]:
            for client in (g, h):
                with pytest.raises(InferenceServerException, match=re.escape(says)):
                    client.load_model("tiny", config=config)
        with pytest.raises(InferenceServerException, match="not supported"):
            h.load_model("tiny", config=json.dumps({}), files={"directory:1": b"x"})
        with pytest.raises(InferenceServerException, match="served from a file"):
            g.load_model("squeezenet", config=json.dumps({"max_batch_size": 4}))
        assert h.get_model_config("tiny")["max_batch_size"] == 8  # a refused load changes nothing
    finally:
        srv.stop()


def test_bearer_token_guards_grpc_but_liveness(models):
    srv = start([models["repo"]], auth_token="s3cret")
    try:
        g = tg.InferenceServerClient(srv.grpc_url)
        assert g.is_server_live()
        with pytest.raises(InferenceServerException) as info:
            g.get_model_metadata("tiny")
        assert info.value.status() == "StatusCode.UNAUTHENTICATED" and "[HYB-703]" in info.value.message()
        headers = {"authorization": "Bearer s3cret"}
        assert g.get_model_metadata("tiny", headers=headers).name == "tiny"
        x, scale = feeds(7)
        y = g.infer("tiny", tiny_inputs(tg, x, scale), headers=headers).as_numpy("y")
        np.testing.assert_allclose(y, tiny_expected(x, scale)["y"], rtol=1e-6)
    finally:
        srv.stop()


def test_a_draining_server_refuses_grpc_calls_with_unavailable(models):
    srv = start([models["repo"]])
    try:
        g = tg.InferenceServerClient(srv.grpc_url)
        x, scale = feeds(8)
        assert g.infer("tiny", tiny_inputs(tg, x, scale)).as_numpy("y").shape == (2, 3)
        srv.server.state.begin_drain()  # what SIGTERM does first
        assert g.is_server_live() and not g.is_server_ready() and not g.is_model_ready("tiny")
        with pytest.raises(InferenceServerException) as info:
            g.infer("tiny", tiny_inputs(tg, x, scale))
        assert info.value.status() == "StatusCode.UNAVAILABLE" and "[HYB-706]" in info.value.message()
    finally:
        srv.stop()


def test_asyncio_clients_grpc_and_http(server):
    async def run():
        g = tga.InferenceServerClient(server.grpc_url)
        h = tha.InferenceServerClient(server.url)
        try:
            assert await g.is_server_ready() and await h.is_server_ready()
            sent = [feeds(20 + k, rows=1 + k % 2) for k in range(8)]
            calls = [g.infer("tiny", tiny_inputs(tg, x, s)) for x, s in sent[:4]]
            calls += [h.infer("tiny", tiny_inputs(th, x, s)) for x, s in sent[4:]]
            results = await asyncio.gather(*calls)
            for (x, s), r in zip(sent, results):
                np.testing.assert_allclose(r.as_numpy("y"), tiny_expected(x, s)["y"], rtol=1e-6)
            assert (await g.get_model_config("tiny")).config.max_batch_size == 8
            assert (await h.get_model_config("tiny"))["max_batch_size"] == 8
            assert (await h.get_inference_statistics("tiny"))["model_stats"][0]["name"] == "tiny"
            assert len((await g.get_model_repository_index()).models) >= 2
        finally:
            await g.close()
            await h.close()

    asyncio.run(run())


def poison_model(path):
    """g = (table + 0)[i]: ONNX Runtime raises for an index out of range (only for the request that sends one).

    The table is computed, not a constant, so the validator's index check (HYB-418, which reads constant tables)
    leaves the request to the model: what is tested is a run that raises inside a batch.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["N", 1])
    g = helper.make_tensor_value_info("g", TensorProto.FLOAT, ["N", 1, 4])
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    zero = numpy_helper.from_array(np.zeros(4, np.float32), "zero")
    graph = helper.make_graph([helper.make_node("Add", ["table", "zero"], ["computed"]),
                               helper.make_node("Gather", ["computed", "i"], ["g"], axis=0)], "poison", [i], [g],
                              [table, zero])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_a_request_that_makes_the_model_raise_fails_alone_in_its_batch(tmp_path):
    registry = build_registry([poison_model(tmp_path / "poison.onnx")], target="onnxruntime",
                              overrides={"max_batch": 8, "batch_timeout": 0.2})
    app = create_app(registry, ServeOptions(grpc_address="127.0.0.1:0"))
    with BackgroundServer(app) as srv:
        async def send():
            g = tga.InferenceServerClient(f"127.0.0.1:{app.state.hybrid.grpc_port}")
            try:
                calls = []
                for k in range(8):
                    inp = tga.InferInput("i", [1, 1], "INT64")
                    inp.set_data_from_numpy(np.array([[50 if k == 3 else k]], np.int64))
                    calls.append(g.infer("poison", [inp]))
                return await asyncio.gather(*calls, return_exceptions=True)
            finally:
                await g.close()

        results = asyncio.run(send())
        assert isinstance(results[3], InferenceServerException) and "[HYB-408]" in results[3].message()
        assert results[3].status() == "StatusCode.INTERNAL"
        table = np.arange(40, dtype=np.float32).reshape(10, 4)
        for k, r in enumerate(results):
            if k != 3:
                np.testing.assert_array_equal(r.as_numpy("g"), table[[k]][None])
        assert tg.InferenceServerClient(f"127.0.0.1:{app.state.hybrid.grpc_port}").is_server_live()
        del srv


def _metric(text, name, model):
    found = re.search(rf'^{name}{{model="{model}",version="1"}} ([0-9.e+]+)$', text, re.M)
    assert found, f"{name} for {model} missing"
    return float(found.group(1))


def test_triton_metrics_count_successes_failures_and_executed_batches(models):
    srv = start([models["repo"]])
    try:
        async def load():
            g = tga.InferenceServerClient(srv.grpc_url)
            h = tha.InferenceServerClient(srv.url)
            try:
                calls = []
                for k in range(40):
                    x, s = feeds(k, rows=1 + k % 3)
                    ins = tiny_inputs(tg if k % 2 else th, x, s)
                    if k % 5 == 0:
                        ins = ins[:1]  # a missing input: fails
                    calls.append((g if k % 2 else h).infer("tiny", ins))
                return await asyncio.gather(*calls, return_exceptions=True)
            finally:
                await g.close()
                await h.close()

        results = asyncio.run(load())
        failed = sum(isinstance(r, Exception) for r in results)
        assert failed == 8
        client = tg.InferenceServerClient(srv.grpc_url)  # an output the model does not have: refused before it runs
        with pytest.raises(InferenceServerException, match="unexpected inference output 'nope' for model 'tiny'"):
            client.infer("tiny", tiny_inputs(tg, *feeds(0)), outputs=[tg.InferRequestedOutput("nope")])
        text = urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode()
        assert "# TYPE nv_inference_request_success counter" in text
        success = _metric(text, "nv_inference_request_success", "tiny")
        assert success == 32
        # as Triton counts: a request refused by the checks never reached the model, so it is no failure
        # there; pyasc's own counter has it by error code
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
            found = re.search(rf'^nv_inference_request_failure{{model="tiny",reason="{reason}",version="1"}} '
                              r'([0-9.e+]+)$', text, re.M)
            assert found and float(found.group(1)) == 0, reason
        refused = re.search(r'^pyasc_inference_failures_total{code="HYB-401",model="tiny",version="1"} ([0-9.e+]+)$',
                            text, re.M)
        assert refused and float(refused.group(1)) == 8, text
        executed = _metric(text, "nv_inference_exec_count", "tiny")
        assert _metric(text, "pyasc_batch_size_count", "tiny") == executed
        assert _metric(text, "pyasc_batch_size_sum", "tiny") == success  # the failures never reached the model
        assert _metric(text, "nv_inference_count", "tiny") == sum(1 + k % 3 for k in range(40) if k % 5)
        for name in ("request_duration_us", "queue_duration_us", "compute_infer_duration_us"):
            assert _metric(text, f"nv_inference_{name}", "tiny") > 0
        stats = th.InferenceServerClient(srv.url).get_inference_statistics("tiny")["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == success
        assert stats["execution_count"] == executed
        assert sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == executed
    finally:
        srv.stop()


def test_a_load_may_carry_the_model_s_files(models, tmp_path):
    import json
    import tempfile
    from pathlib import Path

    from tests._serve_support import error_of, request

    def ours() -> set[Path]:
        return set(Path(tempfile.gettempdir()).glob("pyasc-load-*"))

    before = ours()
    srv = start([models["repo"]], model_control=True)
    registry = srv.server.state.registry
    try:
        g, h = tg.InferenceServerClient(srv.grpc_url), th.InferenceServerClient(srv.url)
        x, scale = feeds(7)

        def y(model: str = "tiny") -> np.ndarray:
            return g.infer(model, tiny_inputs(tg, x, scale)).as_numpy("y")

        doubled = tiny_model(tmp_path / "doubled.onnx", factor=2.0).read_bytes()
        tripled = tiny_model(tmp_path / "tripled.onnx", factor=3.0).read_bytes()
        config = json.dumps({"max_batch_size": 4, "dynamic_batching": {}})
        big = bytes(200_000)  # a load's files may pass the 64 KiB of other control requests, up to --max-body
        h.load_model("tiny", config=config, files={"file:1/model.onnx": doubled, "file:1/notes.bin": big})
        assert request(srv.url, "POST", "/v2/logging", json.dumps({"log_info": True, "pad": "x" * 70_000})
                       .encode())[0] == 413
        np.testing.assert_allclose(y(), tiny_expected(x, scale, 2.0)["y"], rtol=1e-6)
        assert h.get_model_config("tiny")["max_batch_size"] == 4
        first = registry.override_folders["tiny"]
        assert (first / "tiny" / "1" / "model.onnx").read_bytes() == doubled
        g.load_model("tiny", config=config, files={"file:1/model.onnx": doubled, "file:2/model.onnx": tripled})
        np.testing.assert_allclose(y(), tiny_expected(x, scale, 3.0)["y"], rtol=1e-6)  # the highest version
        # the configuration has no version_policy: Triton's default serves the latest version alone
        assert g.is_model_ready("tiny", "2") and not g.is_model_ready("tiny", "1")
        assert not first.exists()  # the files of the load before are gone
        g.load_model("fresh", config=config, files={"file:1/model.onnx": doubled})  # no repository holds it
        np.testing.assert_allclose(y("fresh"), tiny_expected(x, scale, 2.0)["y"], rtol=1e-6)
        second = registry.override_folders["tiny"]
        h.load_model("tiny")  # without files: the repository's model again, and its folder goes
        np.testing.assert_allclose(y(), tiny_expected(x, scale)["y"], rtol=1e-6)
        assert not second.exists() and set(registry.override_folders) == {"fresh"}
        for files, given, says in [({"file:1/model.onnx": doubled}, None, "needs its 'config' parameter"),
                                   ({"file:../x.onnx": doubled}, config, "relative path inside the model's folder"),
                                   ({"file:/etc/x.onnx": doubled}, config, "relative path inside the model's folder"),
                                   ({"file:config.pbtxt": b"max_batch_size: 2"}, config, "'config' parameter"),
                                   ({"file:model.onnx": doubled}, config, "no version folder"),
                                   ({"file:1/model.onnx": b"not onnx"}, config, "files of the load do not load")]:
            for client in (g, h):
                with pytest.raises(InferenceServerException, match=re.escape(says)):
                    client.load_model("tiny", config=given, files=files)
        body = json.dumps({"parameters": {"config": config, "file:1/model.onnx": "!not base64!"}}).encode()
        with pytest.raises(InferenceServerException) as info:  # a client's mistake: a 400, not a server error
            g.load_model("tiny", config=config, files={"file:1/model.onnx": b"not onnx"})
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        status, _, answer = request(srv.url, "POST", "/v2/repository/models/tiny/load", body)
        assert status == 400 and error_of(answer) == "HYB-702" and b"not base64" in answer
        np.testing.assert_allclose(y(), tiny_expected(x, scale)["y"], rtol=1e-6)  # refused loads change nothing
        assert set(registry.override_folders) == {"fresh"} and len(ours() - before) == 1  # nothing left behind
    finally:
        srv.stop()
    assert ours() == before  # the server's stop removed the last one
