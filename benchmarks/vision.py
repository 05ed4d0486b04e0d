"""Video analytics throughput: detector -> classifier on a 640x480 video, batched on a stream vs frame by frame.

The models and the video come from ``examples/video_analytics.py`` (a YOLOv5-shaped detector at 640x640
letterbox input and a 64x64 CNN classifier, random weights, bundled with their task declarations; a
video of colored squares encoded with PyAV). Every contender decodes the same video and runs the same
two loaded bundles end to end (decode, preprocess, run, NMS, crops, classify):

- ``loop 1 frame``: a plain loop, one frame at a time: ``detector(frame)`` then
  ``classifier.crop_and_classify(dets)``;
- ``stream batch 4``: ``VideoSource.batches(4)``, both calls queued on one ``hybrid.StreamContext``
  (decoding goes on while the stream works), the crops of 4 frames classified together;
- ``pipeline batch 4``: the same work as three ``hybrid.Pipeline`` stages (``detector.prepare`` |
  ``detector`` | ``classifier.crop_and_classify``) fed by the decoder, so decoding, preprocessing and the
  runs of consecutive batches overlap;
- ``raw ORT loop 1 frame``: the plain loop on two bare ``onnxruntime.InferenceSession`` with the same
  preprocessing/decoding functions, to show what the TaskModel wrapper costs.

Both bundles load with ``allow_spinning=False`` (every contender alike): two ONNX Runtime sessions and a
decoder share 2 cores, and spinning intra-op threads of one session would starve the other work
(DESIGN section 4). Contenders alternate in blocks with pauses (benchmarks/_harness.py).

Run: ``flock /tmp/bench.lock python benchmarks/vision.py [--frames 48 --blocks 11]``.
Goal: stream (or pipeline) FPS >= 1.3 x the plain loop's FPS.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _harness as h
import _results

import hybrid
from hybrid.vision import VideoSource, decode, prepare, prepare_crops

ROOT = Path(__file__).resolve().parent.parent


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("video_analytics", ROOT / "examples" / "video_analytics.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loop(detector: Any, classifier: Any, video: Path) -> int:
    n = 0
    for frame in VideoSource(video):
        classifier.crop_and_classify(detector(frame))
        n += 1
    return n


def stream(detector: Any, classifier: Any, video: Path, batch: int) -> int:
    n, pending = 0, []
    with hybrid.StreamContext() as s:
        for frames in VideoSource(video).batches(batch):
            pending.append(classifier.crop_and_classify(detector(frames, stream=s), stream=s))
            n += len(frames)
    for handle in pending:
        handle.result()
    return n


def pipeline(detector: Any, classifier: Any, video: Path, batch: int) -> int:
    with hybrid.Pipeline(queue_size=2) as p:
        p.add_stage(detector.prepare, name="preprocess").add_stage(detector, name="detect")
        p.add_stage(classifier.crop_and_classify, name="classify")
        return sum(len(r) for r in p.run(VideoSource(video).batches(batch)))


def raw_loop(det_sess: Any, cls_sess: Any, detector: Any, classifier: Any, video: Path) -> int:
    """The plain loop on bare InferenceSessions: hybrid.vision's functions, no TaskModel, no validation."""
    n = 0
    di, ci = detector.input, classifier.input
    for frame in VideoSource(video):
        x, placements = prepare([frame], di)
        raw = decode(det_sess.run(None, {di.name: x})[0], detector.postprocess)[0]
        boxes = placements[0].to_frame(raw.boxes)
        if len(boxes):
            crops, _ = prepare_crops([frame], np.zeros(len(boxes), np.intp), boxes, ci)
            logits = cls_sess.run(None, {ci.name: crops})[0]
            np.argsort(-logits, axis=1)[:, :1]
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=11)
    _results.add_argument(parser, "vision")
    args = parser.parse_args()
    ex = _example()
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="hybrid-bench-vision-") as tmp:
        work = Path(tmp)
        det_path, cls_path = ex.bundle_models(work, "yolov5", 640)
        video = ex.make_video(work / "squares.mp4", args.frames, 640, 480)
        config = {"onnxruntime": {"allow_spinning": False}}
        detector = hybrid.load(det_path, config=config)
        classifier = hybrid.load(cls_path, config=config)
        so = ort.SessionOptions()
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        det_sess = ort.InferenceSession(str(work / "detector-yolov5.onnx"), so, providers=["CPUExecutionProvider"])
        cls_sess = ort.InferenceSession(str(work / "classifier.onnx"), so, providers=["CPUExecutionProvider"])
        dets = sum(len(d) for batch in VideoSource(video).batches(8) for d in detector(batch))
        contenders = {
            "loop 1 frame": lambda: loop(detector, classifier, video),
            f"stream batch {args.batch}": lambda: stream(detector, classifier, video, args.batch),
            f"pipeline batch {args.batch}": lambda: pipeline(detector, classifier, video, args.batch),
            "raw ORT loop 1 frame": lambda: raw_loop(det_sess, cls_sess, detector, classifier, video),
        }
        times = h.interleave(contenders, blocks=args.blocks, per_block=1, warmup=1, pause=0.5)
    loop_times = times["loop 1 frame"]
    base = statistics.median(loop_times)
    rows = []
    for name, samples in times.items():
        med = statistics.median(samples)
        # each block runs every contender once, close in time: the per-block ratio cancels load drift
        paired = statistics.median(a / b for a, b in zip(loop_times, samples))
        rows.append([name, med * 1e3, args.frames / med, base / med, paired])
    print(f"\n{h.machine_info()}")
    setup = (f"{args.frames} frames 640x480 (mpeg4), {dets} detections, detector input 640x640 letterbox, "
             f"classifier 64x64; medians of {args.blocks} blocks (one video per contender per block)")
    results = h.table(["contender", "ms per video", "FPS", "x loop 1 frame", "x loop, per block"], rows)
    best = max(r[4] for r in rows[1:3])
    summary = f"best of stream/pipeline vs plain loop (median of per-block ratios): {best:.2f}x (goal >= 1.3x)"
    print(f"{setup}\n")
    print(results)
    print(f"\n{summary}")
    if args.write_results:
        _results.write_results(args.write_results, "Vision: detector -> classifier on a video",
                               _results.command_line(), results, notes=f"{setup}. {summary}.")


if __name__ == "__main__":
    main()
