"""Video analytics: a detector and a classifier chained on a stream of frames (the seed's example, made real).

    python examples/video_analytics.py                      # 640x480, 64 frames, batch 4
    python examples/video_analytics.py --frames 16 --width 160 --height 120 --input-size 160

What it does, end to end:

1. builds two small torch models with random weights and exports them with ``hybrid.export``:
   a YOLO-shaped detector (a stride-32 backbone and a YOLOv5/YOLOv8 detect head whose objectness
   peaks where the frame is most colorful, so each colored object is found) and a CNN classifier;
2. bundles them with their task declarations (``create_bundle(..., task='detection',
   task_options={'format': 'yolov5', 'classes': [...], 'resize': 'letterbox'})``);
3. writes a video of colored squares moving over a dark gray background (PyAV);
4. runs ``detector -> classifier.crop_and_classify`` over ``VideoSource(video).batches(4)`` on one
   ``hybrid.StreamContext`` (decoding goes on while the stream works) and prints per-stage times and FPS.

The labels are those of random weights: the point is the plumbing and its speed, not the answers.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import hybrid
from hybrid.bundle import create_bundle
from hybrid.vision import VideoSource, write_video

DETECTOR_CLASSES = ["box", "tile", "patch"]
CLASSIFIER_CLASSES = ["red", "green", "blue", "yellow", "cyan", "magenta"]
COLORS = np.array([[255, 70, 60], [90, 255, 110], [120, 140, 255], [255, 240, 80], [80, 255, 255],
                   [255, 90, 255]], np.uint8)


# ------------------------------------------------------------------ models
def build_detector(fmt: str = "yolov5", num_classes: int = 3, input_size: int = 640, seed: int = 0) -> Any:
    """A YOLO-shaped torch detector (random weights; objectness = peaks of color saturation)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    stride, anchors = 32, torch.tensor([[4.0, 4.0], [5.0, 3.2], [3.2, 5.0]]) * 32

    def conv(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, 2, 1), nn.SiLU())

    class TinyYolo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = nn.Sequential(conv(3, 8), conv(8, 16), conv(16, 32), conv(32, 32), conv(32, 64))
            self.head = nn.Conv2d(64, 3 * (5 + num_classes), 1)
            # small random weights, as a detect head starts in training: boxes sit on their anchors;
            # a class bias shared by the anchors makes a class dominate each cell
            nn.init.normal_(self.head.weight, std=0.01)
            bias = torch.zeros(3, 5 + num_classes)
            bias[:, 5:] = torch.randn(num_classes)
            self.head.bias.data = bias.view(-1)
            g = input_size // stride
            yv, xv = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
            self.register_buffer("grid", torch.stack([xv, yv], -1).float().view(1, 1, g, g, 2))
            self.register_buffer("anchors", anchors.view(1, 3, 1, 1, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            g = input_size // stride
            p = self.head(self.backbone(x)).view(-1, 3, 5 + num_classes, g, g).permute(0, 1, 3, 4, 2).sigmoid()
            # a stand-in for a trained objectness: colorful cells (the background is gray) that are the
            # local maximum of their neighbourhood, so an object lights up one cell, as after training
            saturation = x.amax(1, keepdim=True) - x.amin(1, keepdim=True)
            cell = nn.functional.avg_pool2d(nn.functional.avg_pool2d(saturation, stride), 3, 1, 1)  # (B, 1, g, g)
            peak = (cell >= nn.functional.max_pool2d(cell, 3, 1, 1)).float()
            obj = (torch.sigmoid(40 * (cell - 0.15)) * peak).unsqueeze(-1).expand(-1, 3, g, g, 1)
            xy = (p[..., 0:2] * 2 - 0.5 + self.grid) * stride  # the YOLOv5 detect head's own decoding
            wh = (p[..., 2:4] * 2) ** 2 * self.anchors
            if fmt == "yolov5":
                return torch.cat([xy, wh, obj, p[..., 5:]], -1).view(-1, 3 * g * g, 5 + num_classes)
            rows = torch.cat([xy, wh, p[..., 5:] * obj], -1).view(-1, 3 * g * g, 4 + num_classes)
            return rows.permute(0, 2, 1)  # YOLOv8 layout: (B, 4 + classes, boxes)

    return TinyYolo().eval()


def build_classifier(num_classes: int = len(CLASSIFIER_CLASSES), seed: int = 1) -> Any:
    """A small CNN classifier (random weights) for 64x64 crops."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.SiLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.SiLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes)).eval()


def export_models(workdir: Path, fmt: str = "yolov5", input_size: int = 640) -> tuple[Path, Path]:
    """Export both models to ONNX (batch dimension dynamic); return their paths."""
    det, cls = workdir / f"detector-{fmt}.onnx", workdir / "classifier.onnx"
    hybrid.export(build_detector(fmt, len(DETECTOR_CLASSES), input_size), input_shape=(1, 3, input_size, input_size),
                  opset_version=17, input_names=["images"], output_names=["output"],
                  dynamic_axes={"images": {0: "batch"}, "output": {0: "batch"}}).save(det)
    hybrid.export(build_classifier(), input_shape=(1, 3, 64, 64), opset_version=17, input_names=["input"],
                  output_names=["logits"], dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}).save(cls)
    return det, cls


def bundle_models(workdir: Path, fmt: str = "yolov5", input_size: int = 640) -> tuple[Path, Path]:
    """Export and bundle both models with their task declarations; return the bundle paths."""
    det_onnx, cls_onnx = export_models(workdir, fmt, input_size)
    det, cls = workdir / f"{det_onnx.stem}.hybrid", workdir / "classifier.hybrid"
    create_bundle(det_onnx, det, task="detection", task_options={
        "format": fmt, "classes": DETECTOR_CLASSES, "resize": "letterbox", "conf_threshold": 0.3,
        "iou_threshold": 0.45, "max_det": 100, "max_batch": 8})
    create_bundle(cls_onnx, cls, task="classification", task_options={
        "classes": CLASSIFIER_CLASSES, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
        "max_batch": 32, "top_k": 3})
    return det, cls


# ------------------------------------------------------------------ video
def squares_frames(n: int, width: int, height: int, objects: int = 3, seed: int = 0) -> Any:
    """``n`` frames of colored squares moving over a dark gray, slightly noisy background."""
    rng = np.random.default_rng(seed)
    side = max(40, min(width, height) // 5)
    pos = rng.uniform([0, 0], [width - side, height - side], size=(objects, 2))
    vel = rng.uniform(-1, 1, size=(objects, 2)) * side / 6
    colors = COLORS[rng.choice(len(COLORS), objects, replace=False)]
    for _ in range(n):
        frame = np.repeat(rng.integers(10, 40, size=(height, width, 1), dtype=np.uint8), 3, axis=2)
        for (x, y), color in zip(pos.astype(int), colors):
            frame[y:y + side, x:x + side] = color
        pos += vel
        bounce = (pos < 0) | (pos > [width - side, height - side])
        vel[bounce] *= -1
        np.clip(pos, 0, [width - side, height - side], out=pos)
        yield frame


def make_video(path: Path, frames: int, width: int, height: int, seed: int = 0) -> Path:
    write_video(path, squares_frames(frames, width, height, seed=seed), fps=25)
    return path


# ------------------------------------------------------------------ the chain
def run_chain(detector: Any, classifier: Any, video: Any, batch: int = 4, max_pending: int = 8) -> dict[str, Any]:
    """Detector -> crop_and_classify over a video on one stream; return counts and timings.

    The stream runs each batch's detection and classification in order on its own thread while this
    thread decodes the next frames; ``max_pending`` bounds how many batches are in flight.
    """
    detector.reset_stats()
    classifier.reset_stats()
    frames = detections = 0
    labels: collections.Counter[str] = collections.Counter()
    pending: collections.deque = collections.deque()
    decode_s = 0.0

    def collect(handle: Any) -> None:
        nonlocal detections
        for dets in handle.result():
            detections += len(dets)
            labels.update(d.label.label for d in dets)

    t0 = time.perf_counter()
    with hybrid.StreamContext() as stream:
        source = iter(VideoSource(video).batches(batch))
        while True:
            t = time.perf_counter()
            group = next(source, None)
            decode_s += time.perf_counter() - t
            if group is None:
                break
            frames += len(group)
            dets = detector(group, stream=stream)
            pending.append(classifier.crop_and_classify(dets, stream=stream))
            while len(pending) > max_pending:
                collect(pending.popleft())
        while pending:
            collect(pending.popleft())
    wall = time.perf_counter() - t0
    return {"frames": frames, "detections": detections, "labels": dict(labels), "seconds": wall,
            "fps": frames / wall if wall else float("inf"), "decode_s": decode_s,
            "detector": detector.stats(), "classifier": classifier.stats()}


def report(summary: dict[str, Any]) -> str:
    """Per-stage times and FPS as a Markdown table."""
    lines = ["| stage | calls | items | total ms | ms per frame |", "|---|---:|---:|---:|---:|"]
    n = max(1, summary["frames"])
    lines.append(f"| decode (main thread) | - | {summary['frames']} | {summary['decode_s'] * 1e3:.1f} | "
                 f"{summary['decode_s'] * 1e3 / n:.2f} |")
    for model in ("detector", "classifier"):
        for stage, row in summary[model].items():
            lines.append(f"| {model} {stage} | {row['calls']} | {row['items']} | {row['seconds'] * 1e3:.1f} | "
                         f"{row['seconds'] * 1e3 / n:.2f} |")
    lines.append(f"\n{summary['frames']} frames, {summary['detections']} detections in {summary['seconds']:.2f} s: "
                 f"**{summary['fps']:.1f} FPS** end to end; labels {summary['labels']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--input-size", type=int, default=640, help="detector input (square, multiple of 32)")
    parser.add_argument("--format", choices=("yolov5", "yolov8"), default="yolov5")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the models, bundles and video here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hybrid-video-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        det_path, cls_path = bundle_models(workdir, args.format, args.input_size)
        video = make_video(workdir / "squares.mp4", args.frames, args.width, args.height)
        print(f"built {det_path.name}, {cls_path.name} and {video.name} in {time.perf_counter() - t:.1f} s")
        # two ONNX Runtime sessions and the decoder share the cores: idle intra-op threads must not spin
        config = {"onnxruntime": {"allow_spinning": False}}
        detector = hybrid.load(det_path, config=config)
        classifier = hybrid.load(cls_path, config=config)
        print(detector)
        print(classifier)
        summary = run_chain(detector, classifier, video, args.batch)
        print(report(summary))
        return summary


if __name__ == "__main__":
    main(sys.argv[1:])
