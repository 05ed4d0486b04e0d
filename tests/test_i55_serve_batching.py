"""Issue 55: serve batches by max_batch_size as Triton does. With max_batch_size > 0 the first dim of every input and
output is the batch, whatever the model names it: a model whose inputs and outputs all have a dynamic first dim
batches (requests joined), its config says so, and an output that does not keep the batch's rows fails its requests
with a clear error instead of being sliced."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tests._serve_support import request
from tests.test_serve_batching import infer_while_busy

from hybrid.runtime.compiler import compile_model
from hybrid.serve import BackgroundServer, BatchSettings, ServedModel, build_registry, create_app
from hybrid.serve.triton.config import model_config

pytestmark = pytest.mark.timeout(120)


def _save(path, nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "m", inputs, outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def relu(path, x_dims, y_dims):
    """y = relu(x), with the input's and the output's dims named as given (the same dims, named apart)."""
    return _save(path, [helper.make_node("Relu", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)])


def doubled(path):
    """y = concat(x, x) along dim 0: its first dim ('K', twice x's 'N') is not the batch."""
    return _save(path, [helper.make_node("Concat", ["x", "x"], ["y"], axis=0)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["K", 3])])


def served(path, **settings):
    model = ServedModel("m", "1", compile_model(path, target="onnxruntime"), BatchSettings(**settings))
    runs = []
    run = model.compiled.run_checked

    def counted(feeds):  # the rows of every run of the model
        runs.append(int(next(iter(feeds.values())).shape[0]))
        return run(feeds)

    model.compiled.run_checked = counted
    return model, runs


@pytest.mark.parametrize("dims", [(["batch", 3], ["N", 3]), (["batch", "C"], ["unk__0", "unk__1"]),
                                  (["?", 3], ["N", 3])])
def test_a_model_whose_output_names_its_batch_dim_apart_batches(tmp_path, rng, dims):
    model, runs = served(relu(tmp_path / "relu.onnx", *dims), max_batch=8, batch_timeout=0.5)
    try:
        assert model.batch_symbol is not None  # was None: the first dims' names differ
        assert model.max_batch_size == 8 and model_config(model).max_batch_size == 8
        assert [list(t.dims) for t in model_config(model).output] == [[3] if dims[1][1] == 3 else [-1]]
        reqs = [{"x": rng.standard_normal((rows, 3)).astype(np.float32)} for rows in (1, 3, 2, 1, 1)]
        outs = asyncio.run(infer_while_busy(model, reqs))
        for r, out in zip(reqs, outs, strict=True):
            np.testing.assert_array_equal(out["y"], np.maximum(r["x"], 0))
        assert runs == [1, 8]  # the blocker, then the five requests joined into one run of 8 rows
        with pytest.raises(Exception) as e:  # Triton's max_batch_size bounds a request's rows
            asyncio.run(model.infer({"x": np.zeros((9, 3), np.float32)}))
        assert getattr(e.value, "code", None) == "HYB-405"
    finally:
        model.close()


def test_inputs_whose_first_dims_are_named_apart_must_agree_on_the_batch(tmp_path, rng):
    path = _save(tmp_path / "add.onnx", [helper.make_node("Add", ["a", "b"], ["y"])],
                 [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["A", 3]),
                  helper.make_tensor_value_info("b", TensorProto.FLOAT, ["B", 3])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["Y", 3])])
    model, _ = served(path, max_batch=8, batch_timeout=0.01)
    try:
        assert model.batch_symbol is not None
        a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((1, 3)).astype(np.float32)
        with pytest.raises(Exception) as e:  # one batch size per request, as Triton checks
            model.check({"a": a, "b": b})
        assert getattr(e.value, "code", None) == "HYB-405" and "'b'" in str(e.value)
        out = asyncio.run(model.infer({"a": a, "b": a[::-1].copy()}))
        np.testing.assert_allclose(out["y"], a + a[::-1], rtol=1e-6)
    finally:
        model.close()


def test_an_output_named_apart_that_does_not_keep_the_rows_is_served_request_by_request(tmp_path, rng, caplog):
    """Without a configuration, two runs at load tell a batch named apart from an output that is not the batch
    (boxes after NMS): such a model is served unbatched, each request getting the model's whole answer."""
    with caplog.at_level("WARNING", logger="hybrid"):
        model, runs = served(doubled(tmp_path / "doubled.onnx"), max_batch=8, batch_timeout=0.5)
    try:
        assert model.batch_symbol is None and model.max_batch_size == 0 and model_config(model).max_batch_size == 0
        assert "served request by request" in caplog.text and "output 'y'" in caplog.text
        reqs = [{"x": rng.standard_normal((rows, 3)).astype(np.float32)} for rows in (1, 2, 1)]

        async def all_of():
            return await asyncio.gather(*(model.infer(r) for r in reqs))

        for r, out in zip(reqs, asyncio.run(all_of()), strict=True):
            np.testing.assert_array_equal(out["y"], np.concatenate([r["x"], r["x"]]))
        assert sorted(runs) == [1, 1, 2]  # one run per request
    finally:
        model.close()


def test_an_output_without_the_batch_rows_fails_its_requests_instead_of_being_sliced(tmp_path, rng):
    """A batch the configuration declares is trusted (Triton's rule); an output without its rows is HYB-413."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse("max_batch_size: 8 dynamic_batching { }", mc.ModelConfig())
    model = ServedModel("m", "1", compile_model(doubled(tmp_path / "doubled.onnx"), target="onnxruntime"),
                        BatchSettings(max_batch=8, batch_timeout=0.5), model_config=config)
    try:
        assert model.max_batch_size == 8
        reqs = [{"x": rng.standard_normal((rows, 3)).astype(np.float32)} for rows in (1, 2, 1)]

        async def all_of():
            return await asyncio.gather(*(model.infer(r) for r in reqs), return_exceptions=True)

        for err in asyncio.run(all_of()):
            assert getattr(err, "code", None) == "HYB-413", err
            assert "'y'" in str(err) and "max_batch_size" in str(err)
    finally:
        model.close()
    # served without batching (max_batch_size 0), the model's whole answer is each request's
    model, _ = served(doubled(tmp_path / "doubled.onnx"), max_batch=0)
    try:
        assert model.max_batch_size == 0 and model_config(model).max_batch_size == 0
        x = rng.standard_normal((2, 3)).astype(np.float32)
        np.testing.assert_array_equal(asyncio.run(model.infer({"x": x}))["y"], np.concatenate([x, x]))
    finally:
        model.close()


def test_a_config_with_max_batch_size_and_no_dynamic_batching_checks_the_same(tmp_path, rng):
    # Triton: requests carry their own batch (up to max_batch_size rows), each run alone; outputs keep the batch
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from hybrid.serve.triton.config import check_signature

    config = text_format.Parse("max_batch_size: 4", mc.ModelConfig())
    cases = ((relu(tmp_path / "relu.onnx", ["batch", 3], ["N", 3]), True), (doubled(tmp_path / "d.onnx"), False))
    for path, ok in cases:
        compiled = compile_model(path, target="onnxruntime")
        check_signature(config, compiled.signature, "config.pbtxt")  # a dynamic first dim everywhere: accepted
        model = ServedModel("m", "1", compiled, BatchSettings(max_batch=0), model_config=config)
        try:
            assert model.batch_symbol is not None and model.max_batch_size == 4
            x = rng.standard_normal((3, 3)).astype(np.float32)
            if ok:
                np.testing.assert_array_equal(asyncio.run(model.infer({"x": x}))["y"], np.maximum(x, 0))
            else:
                with pytest.raises(Exception) as e:
                    asyncio.run(model.infer({"x": x}))
                assert getattr(e.value, "code", None) == "HYB-413"
            with pytest.raises(Exception) as e:
                model.check({"x": np.zeros((5, 3), np.float32)})
            assert getattr(e.value, "code", None) == "HYB-405"
        finally:
            model.close()


def test_the_server_answers_config_and_errors_as_triton(tmp_path, rng):
    registry = build_registry([relu(tmp_path / "relu.onnx", ["batch", 3], ["N", 3]), doubled(tmp_path / "dbl.onnx")],
                              target="onnxruntime")
    with BackgroundServer(create_app(registry)) as srv:
        status, _, body = request(srv.url, "GET", "/v2/models/relu/config")
        assert status == 200 and json.loads(body)["max_batch_size"] > 0
        x = rng.standard_normal((2, 3)).astype(np.float32)
        doc = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": x.ravel().tolist()}]}
        status, _, body = request(srv.url, "POST", "/v2/models/relu/infer", json.dumps(doc).encode())
        assert status == 200
        assert np.allclose(json.loads(body)["outputs"][0]["data"], np.maximum(x, 0).ravel())
        status, _, body = request(srv.url, "GET", "/v2/models/dbl/config")  # not the batch: served unbatched
        assert status == 200 and json.loads(body)["max_batch_size"] == 0
        status, _, body = request(srv.url, "POST", "/v2/models/dbl/infer", json.dumps(doc).encode())
        assert status == 200
        assert np.allclose(json.loads(body)["outputs"][0]["data"], np.concatenate([x, x]).ravel())
