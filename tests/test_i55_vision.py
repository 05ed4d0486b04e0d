"""Issue 55, vision: task bundles serve and run as tensors; scores are never softmaxed twice; top_k fits the
classes; a detector declared in the wrong YOLO format is refused instead of answering garbage."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests._serve_support import serving
from tests._vision_models import constant_detector

import hybrid
from hybrid.bundle import create_bundle
from hybrid.errors import BundleError
from hybrid.runtime.compiled import CompiledModel
from hybrid.vision import TaskModel

pytestmark = pytest.mark.timeout(180)

# 4 classes from 3 channel means: W mixes them so that every class wins somewhere
W = np.array([[4.0, 0.0, 0.0, 1.5], [0.0, 4.0, 0.0, 1.5], [0.0, 0.0, 4.0, 1.5]], np.float32)


def scores_model(head: str | None, tail: str | None = None) -> onnx.ModelProto:
    """[N, 3, 16, 16] -> [N, 4]: the channel means times W, then ``head`` ('Softmax', 'Sigmoid' or None), then
    ``tail`` (a shape-only op after the head, as exporters leave them)."""
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 16, 16])
    y = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("ReduceMean", ["image"], ["mean"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["mean", "W"], ["logits"])]
    last = "logits"
    if head is not None:
        nodes.append(helper.make_node(head, [last], ["probs"], **({"axis": -1} if head == "Softmax" else {})))
        last = "probs"
    if tail == "Flatten":
        nodes.append(helper.make_node("Flatten", [last], ["flat"], axis=1))
        last = "flat"
    nodes.append(helper.make_node("Identity", [last], ["scores"]))
    graph = helper.make_graph(nodes, "scores", [x], [y], [numpy_helper.from_array(W, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def frames() -> list[np.ndarray]:
    out = []
    for ch in range(3):
        f = np.full((20, 30, 3), 30, np.uint8)
        f[..., ch] = 230
        out.append(f)
    return out


def raw_scores(proto: onnx.ModelProto, cls: TaskModel, batch: list[np.ndarray]) -> np.ndarray:
    """What raw ONNX Runtime outputs for the frames the task model prepared."""
    x, _ = hybrid.vision.prepare(batch, cls.input)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"image": x})[0]


# ------------------------------------------------------------------------------------------------ classification
@pytest.mark.parametrize(("head", "tail"), [("Softmax", None), ("Softmax", "Flatten"), ("Sigmoid", None)])
def test_a_classifier_that_ends_in_probabilities_answers_them_unchanged(tmp_path, head, tail):
    proto = scores_model(head, tail)
    create_bundle(proto, tmp_path / "cls.hybrid", task="classification")
    cls = hybrid.load(tmp_path / "cls.hybrid", target="onnxruntime")
    assert isinstance(cls, TaskModel) and cls.fit.softmax is False
    batch = frames()
    answers = cls(batch)
    raw = raw_scores(proto, cls, batch)
    for a, row in zip(answers, raw):
        assert len(a.class_ids) == 4  # 4 classes: top_k min(5, 4), not refused
        np.testing.assert_allclose(a.scores, row[a.class_ids], rtol=1e-5)
        assert a.class_ids[0] == int(np.argmax(row))


def test_a_classifier_that_ends_in_logits_gets_its_softmax(tmp_path):
    proto = scores_model(None)
    cls = TaskModel.from_options(hybrid.compile(proto, target="onnxruntime"), "classification")
    batch = frames()
    raw = raw_scores(proto, cls, batch)
    p = np.exp(raw - raw.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    for a, row in zip(cls(batch), p):
        np.testing.assert_allclose(a.scores, row[a.class_ids], rtol=1e-5)
    assert cls.fit.softmax is True and cls.fit.top_k == 4


def test_softmax_declared_on_probabilities_is_refused_and_false_is_kept(tmp_path):
    proto = scores_model("Softmax")
    with pytest.raises(BundleError) as info:
        create_bundle(proto, tmp_path / "x.hybrid", task="classification", task_options={"softmax": True})
    assert info.value.code == "HYB-502" and "Softmax" in info.value.message and not (tmp_path / "x.hybrid").exists()
    cls = TaskModel.from_options(hybrid.compile(scores_model(None), target="onnxruntime"), "classification",
                                 softmax=False, top_k=2)
    raw = raw_scores(scores_model(None), cls, frames())
    for a, row in zip(cls(frames()), raw):  # logits kept as they are, when asked
        np.testing.assert_allclose(a.scores, np.sort(row)[::-1][:2], rtol=1e-5)


def test_top_k_beyond_the_classes_is_named_at_creation(tmp_path):
    with pytest.raises(BundleError) as info:
        create_bundle(scores_model("Softmax"), tmp_path / "x.hybrid", task="classification",
                      task_options={"top_k": 5})
    assert info.value.code == "HYB-502" and "top_k 5 exceeds the 4 classes" in info.value.message


# ------------------------------------------------------------------------------------------------ detection format
def yolo_rows(fmt: str) -> np.ndarray:
    """Three boxes in input pixels (64 x 64) with class probabilities, in ``fmt``'s field order, and nine under
    the threshold (enough boxes that the shape alone does not give the format away)."""
    rows = []
    for i, (cx, cy) in enumerate(((16.0, 16.0), (40.0, 30.0), (50.0, 52.0))):
        cls = [0.02, 0.02]
        cls[i % 2] = 0.9
        rows.append([cx, cy, 10.0, 12.0] + ([0.95] if fmt == "yolov5" else []) + cls)
    for i in range(9):
        rows.append([5.0 + 6 * i, 60.0, 4.0, 4.0] + ([0.1] if fmt == "yolov5" else []) + [0.01, 0.02])
    return np.array(rows, np.float32)


@pytest.mark.parametrize(("actual", "declared"), [("yolov8", "yolov5"), ("yolov5", "yolov8")])
def test_a_detector_declared_in_the_other_yolo_format_is_refused(tmp_path, actual, declared):
    proto = constant_detector(yolo_rows(actual), actual)
    with pytest.raises(BundleError) as info:
        create_bundle(proto, tmp_path / "det.hybrid", task="detection", task_options={"format": declared})
    assert info.value.code == "HYB-502" and f"not a {declared} output" in info.value.message
    assert f"--format {actual}" in info.value.hint and not (tmp_path / "det.hybrid").exists()
    # the same check on every answer, for a model wrapped without a bundle
    det = TaskModel.from_options(hybrid.compile(proto, target="onnxruntime"), "detection", format=declared)
    with pytest.raises(BundleError) as info:
        det(np.zeros((64, 64, 3), np.uint8))
    assert info.value.code == "HYB-502"
    good = TaskModel.from_options(hybrid.compile(proto, target="onnxruntime"), "detection", format=actual)
    assert len(good(np.zeros((64, 64, 3), np.uint8))) == 3


# ------------------------------------------------------------------------------------------------ raw tensors
def test_every_tensor_level_call_of_a_compiled_model_works_on_a_loaded_task_bundle(tmp_path):
    """The server runs a model through run_checked, a deployment script warms it with tune: on a task bundle too."""
    proto = scores_model("Softmax")
    create_bundle(proto, tmp_path / "cls.hybrid", task="classification")
    cls = hybrid.load(tmp_path / "cls.hybrid", target="onnxruntime")
    x = np.random.default_rng(0).random((2, 3, 16, 16), np.float32)
    want = raw_scores_from(proto, x)
    np.testing.assert_allclose(cls.run_checked({"image": x})["scores"], want, rtol=1e-5)
    np.testing.assert_allclose(cls.run({"image": x})["scores"], want, rtol=1e-5)
    assert cls.tune({"image": x}) == () and cls.tuning == () and cls.tunes_online is False
    np.testing.assert_allclose(cls.submit({"image": x}).result(timeout=60)["scores"], want, rtol=1e-5)
    for name in dir(CompiledModel):  # nothing of CompiledModel's is left unreachable on a TaskModel
        if not name.startswith("__"):
            getattr(cls, name)


def raw_scores_from(proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"image": x})[0]


def test_task_bundles_serve_as_tensors_over_the_v2_protocol(tmp_path):
    tg = pytest.importorskip("tritonclient.grpc")
    import tritonclient.http as th

    det_proto = constant_detector(yolo_rows("yolov8"), "yolov8")
    create_bundle(det_proto, tmp_path / "det.hybrid", task="detection", task_options={"format": "yolov8"})
    cls_proto = scores_model("Softmax")
    create_bundle(cls_proto, tmp_path / "cls.hybrid", task="classification")
    x_det = np.random.default_rng(1).random((1, 3, 64, 64), np.float32)
    x_cls = np.random.default_rng(2).random((3, 3, 16, 16), np.float32)
    sess = ort.InferenceSession(det_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want_det = sess.run(None, {"images": x_det})[0]
    want_cls = raw_scores_from(cls_proto, x_cls)
    with serving([tmp_path / "det.hybrid", tmp_path / "cls.hybrid"]) as srv:
        http = th.InferenceServerClient(srv.url)
        grpc = tg.InferenceServerClient(srv.grpc_url)
        for module, client in ((th, http), (tg, grpc)):
            for model, name, x, out, want in (("det", "images", x_det, "output", want_det),
                                              ("cls", "image", x_cls, "scores", want_cls)):
                inp = module.InferInput(name, list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                got = client.infer(model, [inp]).as_numpy(out)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
