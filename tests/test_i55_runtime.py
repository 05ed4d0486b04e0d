"""Issue 55, runtime items: index inputs checked against their table on every backend (a), per-request
isolation in @dynamic_batch (b), and the memory pool's scope said at init and in memory_summary (c)."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hybrid
from hybrid.errors import HybridError, RunError
from hybrid.hal import backend_status

VOCAB, HIDDEN, TYPES, SEQ = 30, 8, 2, 6


def bert_like(path=None) -> onnx.ModelProto:
    """BERT's embedding block: word, token-type and position embeddings gathered from initializer tables.

    ``input_ids`` feeds its Gather directly (as nn.Embedding exports), ``token_type_ids`` comes in as int32 and
    reaches its Gather through Cast and Unsqueeze/Reshape; ``position_ids`` feeds a Gather and, through a
    Slice, a second (larger) one, so only the direct table bounds it. ``mask`` is an int input no Gather reads.
    """
    rng = np.random.default_rng(0)
    words = numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "word_embeddings")
    types = numpy_helper.from_array(rng.standard_normal((TYPES, HIDDEN)).astype(np.float32), "type_embeddings")
    pos = numpy_helper.from_array(rng.standard_normal((SEQ, HIDDEN)).astype(np.float32), "position_embeddings")
    first = numpy_helper.from_array(rng.standard_normal((1, HIDDEN)).astype(np.float32), "first_position")
    shape = numpy_helper.from_array(np.array([-1, SEQ], np.int64), "ids_shape")
    axis1 = numpy_helper.from_array(np.array([1], np.int64), "axis1")
    start = numpy_helper.from_array(np.array([0], np.int64), "start")
    stop = numpy_helper.from_array(np.array([1], np.int64), "stop")
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", SEQ]),
              helper.make_tensor_value_info("token_type_ids", TensorProto.INT32, ["batch", SEQ]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, SEQ]),
              helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", SEQ])]
    nodes = [
        helper.make_node("Gather", ["word_embeddings", "input_ids"], ["w"], axis=0),
        helper.make_node("Cast", ["token_type_ids"], ["tt64"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["tt64", "axis1"], ["tt3"]),
        helper.make_node("Reshape", ["tt3", "ids_shape"], ["tt"]),
        helper.make_node("Gather", ["type_embeddings", "tt"], ["t"], axis=0),
        helper.make_node("Gather", ["position_embeddings", "position_ids"], ["p"], axis=0),
        # position 0 alone (a Slice drops the rest) reads a one-row table: that table bounds no other position
        helper.make_node("Slice", ["position_ids", "start", "stop", "axis1"], ["p0"]),
        helper.make_node("Gather", ["first_position", "p0"], ["pw"], axis=0),
        helper.make_node("Add", ["w", "t"], ["wt"]),
        helper.make_node("Add", ["wt", "p"], ["wtp"]),
        helper.make_node("Add", ["wtp", "pw"], ["emb"]),
        helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis_last"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["out"]),
    ]
    axis_last = numpy_helper.from_array(np.array([-1], np.int64), "axis_last")
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", SEQ, HIDDEN])
    graph = helper.make_graph(nodes, "bert_embeddings", inputs, [out],
                              [words, types, pos, first, shape, axis1, start, stop, axis_last])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, path)
    return model


def feeds(batch: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"input_ids": rng.integers(0, VOCAB, (batch, SEQ)).astype(np.int64),
            "token_type_ids": rng.integers(0, TYPES, (batch, SEQ)).astype(np.int32),
            "position_ids": np.arange(SEQ, dtype=np.int64)[None],
            "mask": np.ones((batch, SEQ), np.int64)}


def available(name: str) -> bool:
    return backend_status(name).available


TARGETS = [pytest.param(t, marks=pytest.mark.skipif(not available(t), reason=f"{t} not installed"))
           for t in ("reference", "onnxruntime", "openvino", "torch")]


# ------------------------------------------------------------------------------------------------ (a)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", TARGETS)
def test_out_of_vocabulary_ids_raise_418_on_every_backend(target):
    cm = hybrid.compile(bert_like(), target=target)
    good = feeds()
    expected = hybrid.compile(bert_like(), target="reference").run(good)["out"]
    np.testing.assert_allclose(cm.run(good)["out"], expected, rtol=1e-5, atol=1e-5)

    for name, value, table in [("input_ids", VOCAB, VOCAB), ("input_ids", -VOCAB - 1, VOCAB),
                               ("token_type_ids", TYPES, TYPES), ("position_ids", SEQ, SEQ)]:
        bad = {k: v.copy() for k, v in good.items()}
        bad[name][0, 3] = value
        with pytest.raises(RunError) as info:
            cm.run(bad)
        e = info.value
        assert e.code == "HYB-418", (target, name, e)
        assert repr(name) in e.message and str(value) in e.message and f"[-{table}, {table})" in e.message
        with pytest.raises(RunError, match="HYB-418"):  # the positional call is checked alike
            cm(*bad.values())


@pytest.mark.timeout(120)
def test_index_check_rejects_once_a_shape_has_passed_and_leaves_other_ints_alone():
    cm = hybrid.compile(bert_like(), target="reference")
    good = feeds()
    cm.run(good)  # the shapes are now known good: the range check must still run
    bad = dict(good, input_ids=np.full_like(good["input_ids"], VOCAB + 5))
    with pytest.raises(RunError, match=r"HYB-418.*'input_ids'.*35"):
        cm.run(bad)
    # negative ids count from the end (ONNX Gather); a mask no Gather reads may hold anything
    ok = dict(good, input_ids=np.full_like(good["input_ids"], -VOCAB), mask=np.full_like(good["mask"], 10**6))
    cm.run(ok)
    # empty inputs pass (no min/max of nothing)
    cm.run(dict(good, input_ids=np.zeros((0, SEQ), np.int64), token_type_ids=np.zeros((0, SEQ), np.int32),
                mask=np.zeros((0, SEQ), np.int64)))


@pytest.mark.timeout(120)
def test_index_bounds_found_once_from_the_graph():
    from hybrid.runtime.validate import index_bounds

    bounds = index_bounds(hybrid.Model.load(bert_like()))
    assert {name: b.size for name, b in bounds.items()} == {"input_ids": VOCAB, "token_type_ids": TYPES,
                                                           "position_ids": SEQ}
    assert "word_embeddings" in bounds["input_ids"].table


@pytest.mark.timeout(300)
def test_bert_from_a_config_refuses_an_out_of_vocabulary_id_on_openvino():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    if not available("openvino"):
        pytest.skip("openvino not installed")
    from hybrid.runtime.validate import index_bounds

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    example = torch.ones(1, 8, dtype=torch.int64)
    model = hybrid.export(transformers.BertModel(config).eval(), input_shape=[example, example],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})
    assert index_bounds(model)["input_ids"].size == 100
    cm = hybrid.compile(model, target="openvino")
    mask = np.ones((1, 8), np.int64)
    cm.run({"input_ids": np.full((1, 8), 99, np.int64), "attention_mask": mask})
    with pytest.raises(RunError, match=r"HYB-418.*'input_ids' holds 100"):
        cm.run({"input_ids": np.full((1, 8), 100, np.int64), "attention_mask": mask})


@pytest.mark.timeout(300)
def test_server_answers_418_as_a_400(tmp_path):
    from _serve_support import request, serving

    path = tmp_path / "emb.onnx"
    bert_like(path)
    bad = feeds(1)
    bad["input_ids"][0, 0] = VOCAB + 1
    with serving([path]) as srv:
        status, _, body = request(srv.url, "POST", "/v2/models/emb/infer", _json_body(bad))
        assert status == 400, body
        doc = json.loads(body)
        assert doc["code"] == "HYB-418" and "input_ids" in doc["error"] and str(VOCAB + 1) in doc["error"]
        status, _, body = request(srv.url, "POST", "/v2/models/emb/infer", _json_body(feeds(1)))
        assert status == 200, body


def _json_body(arrays: dict[str, np.ndarray]) -> bytes:
    dt = {np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}
    doc = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": dt[v.dtype], "data": v.reshape(-1).tolist()}
                      for k, v in arrays.items()]}
    return json.dumps(doc).encode()


# ------------------------------------------------------------------------------------------------ (b)
def classifier():
    """y = x @ W + b with x [N, 4] float32 (tests/_models.py's matmul_add), compiled on the reference backend."""
    from _models import matmul_add

    return hybrid.compile(matmul_add(), target="reference")


def recorded(fn):
    """``fn`` and the list of the batches it was called with."""
    seen: list[list] = []

    def batched(items):
        seen.append(list(items))
        return fn(items)

    return batched, seen


@pytest.mark.timeout(60)
def test_a_malformed_request_fails_alone_its_batch_is_rerun_one_by_one():
    model = classifier()
    batched, seen = recorded(lambda images: model(np.concatenate(images)))
    f = hybrid.dynamic_batch(batched, max_batch=8, timeout=5)  # the 8 submits below form one batch
    rows = [np.full((1, 4), i, np.float32) for i in range(8)]
    rows[5] = np.zeros((1, 5), np.float32)  # one feature too many: np.concatenate fails the batch
    futures = [f.submit(r) for r in rows]
    for i, fu in enumerate(futures):
        if i == 5:
            with pytest.raises(HybridError) as info:
                fu.result(10)
            assert info.value.code == "HYB-405"  # the model's own error for that request, not the batch's
        else:
            np.testing.assert_allclose(fu.result(10), model(rows[i])[0], rtol=1e-6)  # row i of the batch
    f.close()
    assert len(seen[0]) == 8 and all(len(b) == 1 for b in seen[1:])  # the batch, then each member alone
    stats = f.stats()
    assert stats.failed_batches == 1 and stats.retried_alone == 8


@pytest.mark.timeout(60)
def test_validate_with_the_model_refuses_a_bad_request_before_it_joins_a_batch():
    model = classifier()
    batched, seen = recorded(lambda images: model(np.concatenate(images)))
    f = hybrid.dynamic_batch(batched, max_batch=4, timeout=0.05, validate=model)
    good = np.ones((1, 4), np.float32)
    for bad, code in [(np.ones((1, 4), np.float64), "HYB-403"), (np.ones((1, 5), np.float32), "HYB-405"),
                      (np.ones((1, 1, 4), np.float32), "HYB-404"), ({"y": good}, "HYB-402"), ("text", "HYB-406")]:
        with pytest.raises(HybridError) as info:
            f.submit(bad)
        assert info.value.code == code, (bad, info.value)
    np.testing.assert_allclose(f(good, timeout=10), model(good)[0], rtol=1e-6)
    assert all(len(b) == 1 for b in seen) and sum(len(b) for b in seen) == 1  # only the good one ran
    f.close()


@pytest.mark.timeout(60)
def test_validate_with_the_model_takes_rows_without_the_batch_axis_and_named_inputs():
    model = classifier()
    f = hybrid.dynamic_batch(lambda reqs: model(np.stack([r["x"] for r in reqs])), max_batch=4, timeout=0.01,
                             validate=model)
    row = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(f({"x": row}, timeout=10), model(row[None])[0], rtol=1e-6)
    with pytest.raises(HybridError, match="HYB-405"):
        f({"x": np.arange(3, dtype=np.float32)})
    with pytest.raises(HybridError, match="HYB-401"):
        f({})
    f.close()


@pytest.mark.timeout(60)
def test_validate_takes_any_callable_and_rejects_what_is_neither():
    def positive(x):
        if x < 0:
            raise RunError("HYB-406", f"expected a positive number, got {x}")

    f = hybrid.dynamic_batch(lambda xs: [x * 2 for x in xs], max_batch=4, timeout=0.01, validate=positive)
    assert f(3, timeout=10) == 6
    with pytest.raises(RunError, match="positive"):
        f(-1)
    f.close()
    with pytest.raises(hybrid.HybridError, match="HYB-102"):
        hybrid.dynamic_batch(lambda xs: xs, validate=42)


@pytest.mark.timeout(60)
def test_isolate_false_keeps_the_whole_batch_failing():
    def fn(items):
        if "bad" in items:
            raise ValueError("poisoned")
        return items

    f = hybrid.dynamic_batch(fn, max_batch=4, timeout=5, isolate=False)
    futures = [f.submit(x) for x in ("a", "bad", "c", "d")]
    for fu in futures:
        with pytest.raises(RunError, match="HYB-408"):
            fu.result(10)
    assert f.stats().retried_alone == 0
    f.close()


# ------------------------------------------------------------------------------------------------ (c)
@pytest.fixture()
def no_pools():
    from hybrid.hal import memory

    memory.configure_pools({})
    yield
    memory.configure_pools({})


def _pool_backend():
    """A backend that declares it draws from the cpu pool: the capability, not its name, puts it in the scope."""
    from hybrid.hal import Backend

    class CpuPoolBackend(Backend):
        name = "i55_pool_user"
        memory_pools = {"cpu": "its test buffers"}

        def _probe(self):
            return []

        def version(self):
            return "0"

        def _compile(self, model, device, options):
            raise AssertionError("never compiled")

    return CpuPoolBackend


def test_init_says_which_backends_draw_from_the_pool(no_pools, caplog):
    from _backends import backend_registered

    with backend_registered(_pool_backend()), caplog.at_level(logging.INFO, logger="hybrid"):
        hybrid.init({"memory_pool": {"cpu": "1MB"}})
    (record,) = [r for r in caplog.records if "memory pool cpu" in r.getMessage()]
    text = record.getMessage()
    assert record.levelno == logging.WARNING  # some backends do not use it: the trap is said plainly
    drawn, _, own = text.partition("manage their own memory")[0].partition("drawn from by ")[2].partition(";")
    assert "reference" in drawn and "i55_pool_user" in drawn and "onnxruntime" not in drawn
    for name in ("onnxruntime", "openvino"):
        assert name in own, text


def test_memory_summary_has_a_line_per_backend_that_manages_its_own_memory(no_pools, capsys):
    hybrid.init({"memory_pool": {"cpu": "1MB"}, "backends": {"onnxruntime": {"enable_cpu_mem_arena": False}}})
    try:
        text = hybrid.utils.memory_summary("cpu")
    finally:
        hybrid.init({"backends": {"onnxruntime": {}}})
    (drawn,) = [line for line in text.splitlines() if line.strip().startswith("drawn from by")]
    assert "reference" in drawn and "onnxruntime" not in drawn
    own = [line for line in text.splitlines() if "own memory" in line]
    names = {line.split()[0] for line in own}
    assert {"onnxruntime", "openvino"} <= names and "reference" not in names
    ort = next(line for line in own if line.split()[0] == "onnxruntime")
    assert "enable_cpu_mem_arena=False" in ort and "enable_mem_pattern=True (default)" in ort  # its settings
    assert "0 B" in text  # the pool's own counters stay what they are: nothing faked
