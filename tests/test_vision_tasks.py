"""TaskModel: frames in, Detections / Classifications out; crop_and_classify; streams; bundles; the CLI."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import typer
from tests._bundle_tools import members_of, rebuild
from tests._models import matmul_add, two_inputs
from tests._vision_models import constant_detector, mean_color_classifier
from typer.testing import CliRunner

import hybrid
from hybrid.bundle import create_bundle
from hybrid.errors import BundleError, ConfigError, RunError
from hybrid.vision import Classification, Detections, TaskModel

GRAY = (60, 60, 60)
# colored squares of the test frame (100 x 60): x1, y1, x2, y2 and the channel that dominates
SQUARES = [((10, 10, 30, 30), 0), ((60, 20, 90, 50), 1), ((40, 40, 55, 58), 2)]
NAMES = ["red", "green", "blue"]


def _frame(w=100, h=60):
    f = np.zeros((h, w, 3), np.uint8)
    f[:] = GRAY
    for (x1, y1, x2, y2), ch in SQUARES:
        f[y1:y2, x1:x2] = 0
        f[y1:y2, x1:x2, ch] = 220
    return f


def _rows(fmt, frame_hw=(60, 100), size=64):
    """The squares as predictions in the input pixels of a ``size`` letterbox of a ``frame_hw`` frame."""
    h, w = frame_hw
    r = min(size / h, size / w)
    nw, nh = round(w * r), round(h * r)
    left, top = (size - nw) // 2, (size - nh) // 2
    rows = []
    for i, ((x1, y1, x2, y2), _) in enumerate(SQUARES):
        bx1, bx2 = left + x1 * nw / w, left + x2 * nw / w
        by1, by2 = top + y1 * nh / h, top + y2 * nh / h
        cls = np.full(3, 0.01)
        cls[i] = 0.9 - 0.1 * i
        head = [(bx1 + bx2) / 2, (by1 + by2) / 2, bx2 - bx1, by2 - by1] + ([1.0] if fmt == "yolov5" else [])
        rows.append(head + cls.tolist())
    rows.append([5, 5, 4, 4] + ([1.0] if fmt == "yolov5" else []) + [0.05, 0.01, 0.01])  # under the threshold
    return np.array(rows, np.float32)


def _compile(proto):
    return hybrid.compile(hybrid.Model.load(proto), target="onnxruntime:cpu")


def _detector(fmt="yolov5", **options):
    opts = {"format": fmt, "classes": ["sq0", "sq1", "sq2"], "resize": "letterbox", **options}
    return TaskModel.from_options(_compile(constant_detector(_rows(fmt), fmt)), "detection", **opts)


def _classifier(batch="N", **options):
    opts = {"classes": NAMES, "size": None, "top_k": 3, **options}
    opts.pop("size")
    return TaskModel.from_options(_compile(mean_color_classifier(batch=batch)), "classification", **opts)


@pytest.mark.parametrize("fmt", ["yolov5", "yolov8"])
def test_detector_answers_in_frame_coordinates(fmt):
    det = _detector(fmt)
    frame = _frame()
    d = det(frame)
    assert isinstance(d, Detections) and d.frame is frame and d.index == 0
    np.testing.assert_allclose(d.boxes, [s for s, _ in SQUARES], atol=1e-3)
    assert d.names == ("sq0", "sq1", "sq2") and d.class_ids.tolist() == [0, 1, 2]
    np.testing.assert_allclose(d.scores, [0.9, 0.8, 0.7], atol=1e-6)
    assert d[1].box == pytest.approx((60, 20, 90, 50), abs=1e-3) and d[1].name == "sq1" and d[1].label is None
    batch = det([frame, frame[:, :50], frame])
    assert [x.index for x in batch] == [0, 1, 2] and batch[1].frame.shape == (60, 50, 3)
    np.testing.assert_allclose(batch[2].boxes, d.boxes)
    x, _ = hybrid.vision.prepare([frame], det.input)
    raw = det.run({"images": x})["output"]  # raw tensors stay available
    assert raw.shape == ((1, 4, 8) if fmt == "yolov5" else (1, 7, 4))
    assert det.signature.inputs[0].name == "images" and det.backend == "onnxruntime"
    assert det([]) == []


def test_classifier_top_k():
    cls = _classifier()
    frames = [np.full((20, 30, 3), 0, np.uint8) for _ in range(3)]
    for ch, f in enumerate(frames):
        f[..., ch] = 200
    answers = cls(frames)
    assert [a.label for a in answers] == NAMES
    assert all(isinstance(a, Classification) and len(a.names) == 3 for a in answers)
    one = cls(frames[2], top_k=2)
    assert one.names == ("blue", "red") and one.class_ids.tolist() == [2, 0]  # tie of red/green: lower id first
    p = np.exp(10 * np.array([0, 0, 200 / 255]))
    assert one.score == pytest.approx((p / p.sum())[2], rel=1e-5)
    with pytest.raises(ConfigError) as info:
        cls(frames, top_k=0)
    assert info.value.code == "HYB-102"


@pytest.mark.parametrize("classifier_batch", ["N", 1])
def test_crop_and_classify_labels_every_box_with_its_own_pixels(classifier_batch):
    det, frame = _detector(), _frame()
    cls = _classifier(classifier_batch, **({"max_batch": 2} if classifier_batch == "N" else {}))
    assert cls.max_batch == (2 if classifier_batch == "N" else 1)  # several runs for 3 or 6 crops
    labelled = cls.crop_and_classify(det(frame))
    assert [d.label.label for d in labelled] == NAMES and labelled.frame is frame
    many = cls.crop_and_classify(det([frame, _frame()]), top_k=2)
    # a crop holds its square only: the other two channels tie at 0, and ties go to the lower class id
    assert [[lab.names for lab in d.labels] for d in many] == [[("red", "green"), ("green", "red"),
                                                                ("blue", "red")]] * 2
    empty = Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), (), frame)
    assert cls.crop_and_classify(empty).labels == ()


def test_crops_ignore_pixels_outside_the_box():
    frame = np.zeros((40, 40, 3), np.uint8)
    frame[:, :20, 0] = 255  # red left half, green right half
    frame[:, 20:, 1] = 255
    cls = _classifier()
    box = Detections(np.array([[20, 0, 21, 40], [19, 0, 20, 40]], np.float32), np.ones(2, np.float32),
                     np.zeros(2, np.int64), ("x", "x"), frame)
    got = cls.crop_and_classify(box)
    assert [d.label.label for d in got] == ["green", "red"]


def test_streams_keep_order_and_results():
    det, cls, frame = _detector("yolov8"), _classifier(), _frame()
    direct = cls.crop_and_classify(det([frame, frame]))
    with hybrid.StreamContext() as s:
        handles = []
        for _ in range(3):
            handles.append(cls.crop_and_classify(det([frame, frame], stream=s), stream=s))
    with hybrid.StreamContext() as s1, hybrid.StreamContext() as s2:  # a handle of another stream is waited on
        other = cls.crop_and_classify(det(frame, stream=s1), stream=s2)
    for h in handles:
        got = h.result()
        assert [d.label.label for d in got[0]] == [d.label.label for d in direct[0]]
        np.testing.assert_array_equal(got[1].boxes, direct[1].boxes)
    assert [d.label.label for d in other.result()] == NAMES
    stats = det.stats()
    assert stats["run"]["calls"] == 5 and stats["preprocess"]["items"] == 9  # frames
    assert cls.stats()["run"]["items"] == 27 and stats["postprocess"]["seconds"] > 0  # crops
    det.reset_stats()
    assert det.stats()["run"]["calls"] == 0


def test_prepare_then_call_in_a_pipeline():
    det, cls, frame = _detector(), _classifier(), _frame()
    prepared = det.prepare([frame, frame[:, :50]])
    assert prepared.tensor.shape == (2, 3, 64, 64) and prepared.frames[0] is frame and not prepared.single
    direct = det([frame, frame[:, :50]])
    for a, b in zip(det(prepared), direct):
        np.testing.assert_array_equal(a.boxes, b.boxes)
    assert isinstance(det(det.prepare(frame)), Detections) and det(det.prepare([])) == []
    with hybrid.Pipeline() as p:
        p.add_stage(det.prepare).add_stage(det).add_stage(cls.crop_and_classify)
        results = list(p.run([[frame]] * 3))
    assert [[d.label.label for d in r[0]] for r in results] == [NAMES] * 3
    with pytest.raises(RunError) as info:
        cls(prepared)
    assert info.value.code == "HYB-405" and "another model" in info.value.message


def test_input_buffers_are_recycled_only_when_nobody_holds_them():
    from hybrid.vision.tasks import _Buffers

    pool, buf = _Buffers(keep=1), np.zeros((1, 3, 4, 4), np.float32)
    pool.give(buf, buf[0])  # the output is a view of the input: keep out
    assert pool.take(buf.shape) is None
    pool.give(buf.astype(np.float16), np.zeros(1))
    assert pool.take(buf.shape) is None
    pool.give(buf, np.zeros(1))
    pool.give(np.zeros_like(buf), np.zeros(1))  # over the limit
    assert pool.take((2, 3, 4, 4)) is None and pool.take(buf.shape) is buf and pool.take(buf.shape) is None
    det = _detector()
    prepared = det.prepare(_frame())
    before = prepared.tensor.copy()
    for _ in range(3):
        det(_frame()[::-1])  # recycled buffers never touch a Prepared the caller holds
    np.testing.assert_array_equal(prepared.tensor, before)


def test_wrong_uses_are_named():
    det, cls = _detector(), _classifier()
    with pytest.raises(ConfigError) as info:
        det.crop_and_classify([])
    assert info.value.code == "HYB-102" and "classification" in info.value.message
    with pytest.raises(ConfigError):
        det(_frame(), color="hsv")
    with pytest.raises(RunError) as info:
        cls.crop_and_classify("boxes")
    assert info.value.code == "HYB-406"
    no_frame = Detections(np.zeros((1, 4), np.float32), np.ones(1, np.float32), np.zeros(1, np.int64), ("x",))
    with pytest.raises(RunError) as info:
        cls.crop_and_classify(no_frame)
    assert info.value.code == "HYB-406" and "frame" in info.value.message
    with pytest.raises(RunError) as info:
        det([np.zeros((4, 4, 2), np.uint8)])
    assert info.value.code == "HYB-404"


@pytest.mark.parametrize(("model", "task", "options", "words"), [
    (constant_detector(_rows("yolov5"), "yolov5"), "detection", {"format": "yolov5", "colour": "rgb"},
     "unknown key(s) ['colour']"),
    (constant_detector(_rows("yolov5"), "yolov5"), "detection", {"classes": ["a", "b", "c"]}, "format="),
    (constant_detector(_rows("yolov5"), "yolov5"), "detection", {"format": "yolov5", "classes": ["a", "b"]},
     "2 class names declared"),
    (constant_detector(_rows("yolov8"), "yolov8"), "detection", {"format": "yolov8", "conf_threshold": 2},
     "conf_threshold"),
    (constant_detector(_rows("yolov5"), "yolov5"), "detection", {"format": "yolov5", "output": "boxes"},
     "'boxes' is not an output"),
    (mean_color_classifier(), "classification", {"classes": NAMES, "top_k": 4}, "top_k 4 exceeds"),
    (mean_color_classifier(), "classification", {"format": "yolov5"}, "unknown key(s) ['format']"),
    (two_inputs(), "classification", {"top_k": 1}, "one image input"),
    (matmul_add(), "regression", {"top_k": 1}, "declares no processing"),
])
def test_bad_declarations_fail_at_creation(tmp_path, model, task, options, words):
    with pytest.raises(BundleError) as info:
        create_bundle(model, tmp_path / "m.hybrid", task=task, task_options=options, caches=False)
    assert info.value.code == "HYB-502" and words in info.value.message, info.value.message
    assert not (tmp_path / "m.hybrid").exists()


def test_bundle_round_trip(tmp_path, caplog):
    onnx_path = tmp_path / "det.onnx"
    hybrid.Model.load(constant_detector(_rows("yolov8"), "yolov8")).save(onnx_path)
    (tmp_path / "classes.txt").write_text("sq0\n\nsq1\nsq2\n")
    manifest = create_bundle(onnx_path, tmp_path / "det.hybrid", task="detection", task_options={
        "format": "yolov8", "classes": str(tmp_path / "classes.txt"), "resize": "letterbox", "max_det": 2})
    assert manifest.postprocess.class_names == ["sq0", "sq1", "sq2"] and manifest.preprocess.resize == "letterbox"
    doc, _ = members_of((tmp_path / "det.hybrid").read_bytes())
    assert doc["postprocess"]["format"] == "yolov8" and doc["postprocess"]["max_det"] == 2
    det = hybrid.load(tmp_path / "det.hybrid")
    assert isinstance(det, TaskModel) and det.task == "detection"
    d = det(_frame())
    np.testing.assert_allclose(d.boxes, [s for s, _ in SQUARES[:2]], atol=1e-3)
    det.save(str(tmp_path / "again.hybrid"))
    again = hybrid.load(tmp_path / "again.hybrid")
    assert again.task_options() == det.task_options() and again.task_options()["max_det"] == 2
    # a label that declares nothing loads as a plain CompiledModel; an image-less classifier stays a label
    create_bundle(matmul_add(), tmp_path / "plain.hybrid", task="regression")
    assert isinstance(hybrid.load(tmp_path / "plain.hybrid"), hybrid.CompiledModel)
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        manifest = create_bundle(matmul_add(), tmp_path / "text.hybrid", task="classification")
    assert manifest.postprocess is None and "label only" in caplog.text
    assert isinstance(hybrid.load(tmp_path / "text.hybrid"), hybrid.CompiledModel)
    manifest = create_bundle(mean_color_classifier(), tmp_path / "cls.hybrid", task="classification")
    assert manifest.preprocess is not None and isinstance(hybrid.load(tmp_path / "cls.hybrid"), TaskModel)


@pytest.mark.parametrize(("edit", "words"), [
    (lambda m, mem: m.pop("postprocess"), "without 'postprocess'"),
    (lambda m, mem: m.update(task="classification"), "differs from its postprocess task"),
    (lambda m, mem: m["postprocess"].update(nms="fast"), "postprocess"),
    (lambda m, mem: m["preprocess"].update(size=[0, 64]), "preprocess"),
    (lambda m, mem: m["postprocess"].update(class_names=["a"]), "1 class names declared"),
])
def test_edited_manifest_declarations_are_refused(tmp_path, edit, words):
    create_bundle(constant_detector(_rows("yolov5"), "yolov5"), tmp_path / "m.hybrid", task="detection",
                  task_options={"format": "yolov5"}, caches=False)
    (tmp_path / "bad.hybrid").write_bytes(rebuild((tmp_path / "m.hybrid").read_bytes(), edit))
    with pytest.raises(BundleError) as info:
        hybrid.load(tmp_path / "bad.hybrid")
    assert info.value.code == "HYB-502" and words in info.value.message, info.value.message


def _app() -> typer.Typer:
    from hybrid.cli import bundle

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    bundle.register(app)
    return app


def test_cli_create_with_task_options(tmp_path):
    onnx_path = tmp_path / "det.onnx"
    hybrid.Model.load(constant_detector(_rows("yolov8"), "yolov8")).save(onnx_path)
    (tmp_path / "classes.txt").write_text("a\nb\nc\n")
    out = tmp_path / "det.hybrid"
    runner = CliRunner()
    result = runner.invoke(_app(), ["bundle", "create", str(onnx_path), "-o", str(out), "--task", "detection",
                                    "--format", "yolov8", "--classes", str(tmp_path / "classes.txt"),
                                    "--conf-threshold", "0.4", "--iou-threshold", "0.5", "--max-det", "7",
                                    "--agnostic", "--resize", "letterbox", "--input-size", "64x64", "--color", "bgr",
                                    "--scale", "1", "--mean", "0,0,0", "--std", "255", "--task-option", "max_nms=99",
                                    "--task-option", "max_batch=4"])
    assert result.exit_code == 0, result.output
    doc, _ = members_of(out.read_bytes())
    assert doc["task"] == "detection"
    assert {k: doc["postprocess"][k] for k in ("format", "class_names", "conf_threshold", "iou_threshold", "max_det",
                                               "agnostic", "max_nms")} == {
        "format": "yolov8", "class_names": ["a", "b", "c"], "conf_threshold": 0.4, "iou_threshold": 0.5,
        "max_det": 7, "agnostic": True, "max_nms": 99}
    assert {k: doc["preprocess"][k] for k in ("resize", "size", "color", "scale", "mean", "std", "max_batch")} == {
        "resize": "letterbox", "size": [64, 64], "color": "bgr", "scale": 1.0, "mean": [0.0, 0.0, 0.0],
        "std": [255.0], "max_batch": 4}
    doc = json.loads(runner.invoke(_app(), ["bundle", "inspect", str(out), "--json"]).output)
    assert doc["postprocess"]["format"] == "yolov8" and doc["preprocess"]["color"] == "bgr"
    text = runner.invoke(_app(), ["bundle", "inspect", str(out)]).output
    assert "postprocess" in text and "yolov8" in text
    det = hybrid.load(out)
    assert det(_frame()).names == ("a", "b", "c")  # scores 0.9, 0.8, 0.7 pass 0.4; apart, NMS keeps them
    for args, words in ((["--format", "yolov9"], "format"), (["--input-size", "64x"], "--input-size"),
                        (["--classes", str(tmp_path / "none.txt")], "classes"), (["--task-option", "top_k"], "KEY")):
        result = runner.invoke(_app(), ["bundle", "create", str(onnx_path), "-o", str(tmp_path / "x.hybrid"),
                                        "--task", "detection", *args])
        assert result.exit_code == 1 and "HYB-502" in result.output and words in result.output, result.output


def test_a_task_model_stands_in_for_its_compiled_model(tmp_path):
    """Code written for CompiledModel (the profiler, the server) reads the same attributes off a TaskModel."""
    create_bundle(mean_color_classifier(), tmp_path / "cls.hybrid", task="classification")
    cls = hybrid.load(tmp_path / "cls.hybrid")
    assert isinstance(cls, TaskModel)
    for name in ("model", "signature", "backend", "device", "plan", "options", "executable", "target"):
        assert getattr(cls, name) is getattr(cls.compiled, name), name
    report = hybrid.profile(tmp_path / "cls.hybrid", duration=0.1, output=None, quiet=True)
    assert report is not None


def test_options_round_trip_through_json():
    det = _detector("yolov8", conf_threshold=0.3, mean=0.5, size=64)
    opts = det.task_options()
    assert opts["format"] == "yolov8" and opts["mean"] == [0.5] and opts["size"] == [64, 64]
    assert json.loads(json.dumps(opts)) == opts
    assert TaskModel.from_options(det.compiled, "detection", **opts).task_options() == opts
