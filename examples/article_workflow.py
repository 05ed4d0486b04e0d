"""The article's workflow, step by step, every answer compared with raw ONNX Runtime.

    python examples/article_workflow.py                 # 96x96 images, a few seconds per step
    python examples/article_workflow.py --size 64 --quiet

The steps are the ones of the original article (``../shared/seed/``, section 3 onwards), as literally
as the API allows:

1. ``hybrid.export(model, input_shape=..., opset_version=11, dynamic_axes={'input': {0: 'batch'}})`` of a
   ResNet-style CNN with BatchNorm that ends in a Softmax (as a classifier exported with its head);
2. ``hybrid.optimize`` with the article's ``graph_optimization`` config (operator fusion, constant folding);
3. ``hybrid.quantize`` static int8 (``activation_dtype: 'int8'``) with a torch DataLoader for calibration,
   on that opset-11 export;
4. ``@hybrid.jit(target='auto')`` around the torch model, and ``hybrid.compile(path, target='auto')``;
5. ``create_bundle(..., platform='jetson-xavier', optimize_level='O3')`` and an Ascend 910B bundle, each
   keeping the model's NCHW input contract; a YOLO-shaped detector bundled with its task;
6. ``hybrid.load`` of both, a ``Pipeline`` (preprocess -> inference -> postprocess), a ``StreamContext`` with
   ``detector(frames, stream=...)`` and ``classifier.crop_and_classify(dets, stream=...)``, and
   ``@hybrid.dynamic_batch`` called from several threads;
7. the bundles served (the KServe v2 / Triton protocol) and called with ``tritonclient`` over HTTP and gRPC.

Each step's answer is compared with raw ONNX Runtime running the same ONNX model (or torch, for the jit),
and a table says what matched. The exit status is 1 when anything did not. The weights are random (nothing
is downloaded): the point is that every path gives the answer the runtime gives.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

import hybrid
from hybrid.bundle import create_bundle

sys.path.insert(0, str(Path(__file__).resolve().parent))
from video_analytics import build_detector, squares_frames  # the detector of the other example

CLASSES = ["red", "green", "blue", "yellow"]
DETECTOR_CLASSES = ["box", "tile", "patch"]


@dataclass
class Check:
    """One comparison: what ran, against what, and how far apart they were."""

    step: str
    what: str
    detail: str
    ok: bool


class Report:
    """The comparisons of a run, printed as a table at the end."""

    def __init__(self, quiet: bool) -> None:
        self.checks: list[Check] = []
        self.quiet = quiet

    def close(self, step: str, what: str, got: Any, want: Any, rtol: float = 1e-3, atol: float = 1e-4) -> None:
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        same_shape = got.shape == want.shape
        err = float(np.max(np.abs(got - want))) if same_shape and got.size else float("nan")
        ok = same_shape and bool(np.allclose(got, want, rtol=rtol, atol=atol))
        self._add(Check(step, what, f"max |diff| {err:.2e}" if same_shape else f"shape {got.shape} vs {want.shape}",
                        ok))

    def similar(self, step: str, what: str, got: Any, want: Any, min_cosine: float) -> None:
        got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
        cos = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want) + 1e-30))
        self._add(Check(step, what, f"cosine {cos:.5f} (>= {min_cosine})", cos >= min_cosine))

    def equal(self, step: str, what: str, got: Any, want: Any) -> None:
        self._add(Check(step, what, f"{got!r}" if got == want else f"{got!r} != {want!r}", got == want))

    def _add(self, check: Check) -> None:
        self.checks.append(check)
        if not self.quiet:
            print(f"  {'ok  ' if check.ok else 'FAIL'} {check.step:<10} {check.what}: {check.detail}", flush=True)

    def table(self) -> str:
        rows = ["| step | compared | result | ok |", "|---|---|---|---|"]
        rows += [f"| {c.step} | {c.what} | {c.detail} | {'yes' if c.ok else '**no**'} |" for c in self.checks]
        return "\n".join(rows)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


# ------------------------------------------------------------------ models
def build_classifier(num_classes: int = len(CLASSES), seed: int = 0) -> Any:
    """A ResNet-style CNN (conv, BatchNorm, a residual block) whose head ends in a Softmax."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                      nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + self.body(x))

    class SmallResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
            self.blocks = nn.Sequential(Block(16), nn.Conv2d(16, 32, 3, 2, 1), Block(32))
            self.fc = nn.Linear(32, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.blocks(self.stem(x)).mean((2, 3))
            return torch.softmax(self.fc(y), dim=1)

    net = SmallResNet()
    with torch.no_grad():  # BatchNorm statistics that are not the identity, as after training
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
    return net.eval()


def images(n: int, size: int, seed: int) -> np.ndarray:
    """``n`` images in [0, 1] whose channels differ (so the classes differ)."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, 3, size, size), np.float32) * 0.3
    for i in range(n):
        x[i, i % 3] += 0.6
    return x


def ort_run(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Raw ONNX Runtime on an ONNX model (a path, a hybrid.Model or bytes): the reference of every check."""
    import onnxruntime as ort

    data = model.to_bytes() if hasattr(model, "to_bytes") else Path(model).read_bytes()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ------------------------------------------------------------------ the steps
def export_optimize_quantize(work: Path, size: int, report: Report) -> tuple[Any, Path, Path, Path]:
    """Steps 1-3: export at opset 11, optimize, quantize static int8; each compared with raw ORT."""
    import torch

    net = build_classifier()
    model = hybrid.export(net, input_shape=(1, 3, size, size), opset_version=11,
                          dynamic_axes={"input": {0: "batch"}}, input_names=["input"], output_names=["probs"])
    report.equal("export", "opset written", model.opset, 11)
    exported = work / "classifier.onnx"
    model.save(exported)
    x = images(4, size, seed=1)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    report.close("export", "raw ORT on the export vs torch", ort_run(exported, {"input": x})[0], want)

    optimized = hybrid.optimize(exported, level="O2", config={
        "graph_optimization": {"operator_fusion": True, "constant_folding": True}})
    opt_path = work / "classifier.opt.onnx"
    optimized.save(opt_path)
    report.close("optimize", "raw ORT, optimized vs exported", ort_run(opt_path, {"input": x})[0],
                 ort_run(exported, {"input": x})[0])

    loader = torch.utils.data.DataLoader(torch.from_numpy(images(32, size, seed=2)), batch_size=8)
    quantized = hybrid.quantize(optimized, {"quant_mode": "static", "activation_dtype": "int8",
                                            "calibration_dataset": loader})
    q_path = work / "classifier.int8.onnx"
    quantized.save(q_path)
    proto = quantized.to_onnx()
    consts = {t.name: t.data_type for t in proto.graph.initializer}
    zero_points = [consts.get(n.input[2]) for n in proto.graph.node
                   if n.op_type == "QuantizeLinear" and len(n.input) > 2]
    report.equal("quantize", "activations quantized to int8 (QuantizeLinear zero points)",
                 bool(zero_points) and set(zero_points) == {onnx.TensorProto.INT8}, True)
    report.equal("quantize", "opset upgraded for per-channel int8", quantized.opset >= 13, True)
    raw_q = ort_run(q_path, {"input": x})[0]
    cm_q = hybrid.compile(q_path, target="onnxruntime")
    report.close("quantize", "hybrid int8 (onnxruntime) vs raw ORT int8", cm_q(x), raw_q)
    report.similar("quantize", "raw ORT int8 vs fp32", raw_q, want, min_cosine=0.98)
    return net, exported, opt_path, q_path


def jit_and_auto(net: Any, exported: Path, size: int, report: Report) -> None:
    """Step 4: ``@hybrid.jit(target='auto')`` and ``hybrid.compile(path, target='auto')``."""
    import torch

    @hybrid.jit(target="auto")
    def infer(img_tensor: torch.Tensor) -> torch.Tensor:
        return net(img_tensor)

    x = images(2, size, seed=3)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    got = infer(torch.from_numpy(x))
    report.close("jit", "@hybrid.jit(target='auto') vs torch", np.asarray(got), want)

    cm = hybrid.compile(exported, target="auto")
    raw = ort_run(exported, {"input": x})[0]
    for _ in range(3):  # a few calls: auto may switch runtimes between them, each answer must hold
        report.close("compile", f"target='auto' ({cm.backend}) vs raw ORT", cm(x), raw)
    cm.close()


def bundles(work: Path, exported: Path, size: int, report: Report) -> tuple[Path, Path]:
    """Step 5: platform bundles that keep the model's contract, and a detector bundled with its task."""
    for platform in ("jetson-xavier", "ascend-910b"):
        path = work / f"classifier-{platform}.hybrid"
        create_bundle(exported, path, platform=platform, optimize_level="O3", task="classification",
                      task_options={"classes": CLASSES})
        loaded = hybrid.load(path, target="onnxruntime")
        report.equal("bundle", f"{platform} O3: input shape", loaded.signature.inputs[0].shape,
                     ("batch", 3, size, size))
        x = images(2, size, seed=4)
        report.close("bundle", f"{platform} O3 vs raw ORT", loaded.run({"input": x})["probs"],
                     ort_run(exported, {"input": x})[0])
        loaded.close()
    cls_path = work / "classifier-jetson-xavier.hybrid"

    det_onnx, det_path = work / "detector.onnx", work / "yolov5.hybrid"
    hybrid.export(build_detector("yolov5", len(DETECTOR_CLASSES), 160), input_shape=(1, 3, 160, 160),
                  opset_version=17, input_names=["images"], output_names=["output"],
                  dynamic_axes={"images": {0: "batch"}, "output": {0: "batch"}}).save(det_onnx)
    create_bundle(det_onnx, det_path, task="detection", task_options={
        "format": "yolov5", "classes": DETECTOR_CLASSES, "resize": "letterbox", "conf_threshold": 0.3})
    return det_path, cls_path


def load_and_run(work: Path, det_path: Path, cls_path: Path, size: int, report: Report) -> None:
    """Step 6: load, Pipeline, StreamContext with crop_and_classify, dynamic_batch."""
    detector = hybrid.load(det_path)
    classifier = hybrid.load(cls_path)
    frames = list(squares_frames(4, 200, 150, seed=5))

    # the classifier on whole frames: its scores are the model's own probabilities (not softmaxed twice)
    x, _ = hybrid.vision.prepare(frames, classifier.input)
    raw = ort_run(work / "classifier.onnx", {"input": x})[0]
    answers = classifier(frames, top_k=len(CLASSES))
    got = np.stack([a.scores[np.argsort(a.class_ids)] for a in answers])
    report.close("load", "classifier(frames) scores vs raw ORT probabilities", got, raw)

    # the detector's raw output on its prepared batch, then the answers it decodes
    xd, _ = hybrid.vision.prepare(frames, detector.input)
    raw_det = ort_run(work / "detector.onnx", {"images": xd})[0]
    report.close("load", "detector raw output vs raw ORT", detector.run({"images": xd})["output"], raw_det)

    pipeline = hybrid.Pipeline()
    pipeline.add_stage(detector.prepare, device="cpu")
    pipeline.add_stage(detector, device="cpu")
    pipeline.add_stage(lambda dets: [len(d) for d in dets], device="cpu")
    direct = [len(d) for d in detector(frames)]
    via_pipeline = next(iter(pipeline.run([frames])))
    pipeline.close()
    report.equal("pipeline", "detections per frame, Pipeline vs direct", via_pipeline, direct)

    with hybrid.StreamContext() as stream:
        dets = detector(frames, stream=stream)
        results = classifier.crop_and_classify(dets, stream=stream).result()
    plain = classifier.crop_and_classify(detector(frames))
    report.equal("stream", "crop_and_classify labels, stream vs direct",
                 [[lab.label for lab in r.labels] for r in results], [[lab.label for lab in r.labels] for r in plain])
    report.equal("stream", "boxes found on 4 frames of 3 squares", sum(len(r) for r in results) >= 4, True)

    cm = hybrid.compile(work / "classifier.onnx", target="onnxruntime")

    @hybrid.dynamic_batch(max_batch=16, timeout=0.1)
    def batch_infer(requests: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        inputs = np.stack([r["image"] for r in requests])
        return list(cm(inputs))

    singles = images(12, size, seed=6)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda img: batch_infer({"image": img}), singles))
    batch_infer.close()
    report.close("dyn-batch", "@dynamic_batch from 6 threads vs raw ORT", np.stack(outs),
                 ort_run(work / "classifier.onnx", {"input": singles})[0])
    cm.close()
    detector.close()
    classifier.close()


def serve(work: Path, det_path: Path, cls_path: Path, size: int, report: Report) -> None:
    """Step 7: the bundles served over the v2 protocol, called with tritonclient."""
    import tritonclient.grpc as tg
    import tritonclient.http as th

    from hybrid.serve import BackgroundServer, ServeOptions, build_registry, create_app

    app = create_app(build_registry([det_path, cls_path]), ServeOptions(grpc_address="127.0.0.1:0"))
    with BackgroundServer(app) as srv:
        clients = ((th, th.InferenceServerClient(srv.url)),
                   (tg, tg.InferenceServerClient(f"127.0.0.1:{app.state.hybrid.grpc_port}")))
        x_cls = images(3, size, seed=7)
        x_det = np.random.default_rng(8).random((2, 3, 160, 160), np.float32)
        cases = ((cls_path.stem, "input", x_cls, "probs", work / "classifier.onnx"),
                 (det_path.stem, "images", x_det, "output", work / "detector.onnx"))
        for module, client in clients:
            for model, name, x, out, onnx_path in cases:
                inp = module.InferInput(name, list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                got = client.infer(model, [inp]).as_numpy(out)
                report.close("serve", f"{module.__name__.split('.')[-1]} {model} vs raw ORT", got,
                             ort_run(onnx_path, {name: x})[0])


def main(argv: list[str] | None = None) -> int:
    """Run every step; print the table; return 0 when every answer matched raw ONNX Runtime."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=96, help="classifier input height and width")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the models and bundles here")
    parser.add_argument("--quiet", action="store_true", help="print only the table")
    args = parser.parse_args(argv)
    report = Report(args.quiet)
    with tempfile.TemporaryDirectory(prefix="pyasc-article-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        net, exported, _, _ = export_optimize_quantize(work, args.size, report)
        jit_and_auto(net, exported, args.size, report)
        det_path, cls_path = bundles(work, exported, args.size, report)
        load_and_run(work, det_path, cls_path, args.size, report)
        serve(work, det_path, cls_path, args.size, report)
    print(report.table())
    print(f"\n{sum(c.ok for c in report.checks)} of {len(report.checks)} answers matched raw ONNX Runtime")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
