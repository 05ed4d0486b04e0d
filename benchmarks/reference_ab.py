"""Two versions of hybrid side by side: this checkout against a git commit, call by call.

Each version runs in a worker process of its own (``PYTHONPATH`` on its source tree, ``git archive`` of
``--base`` for the old one), sets up the same work and waits; the driver asks them for one call at a
time, interleaved in blocks (the shared harness), so both meet the same load on this shared VM within a
second of each other. ``--mode reference`` (default): a light model run on ``target='reference'``;
``load``: ``hybrid.load`` of a bundle each version saved itself (ONNX Runtime, its compiled cache
inside), then close; ``vision``: the video example's detector -> ``crop_and_classify`` on one frame.
Quoted: the median over blocks of the per-block ratio new / old, the setup-time ratio (compile, or
export and bundle), and the largest difference between the two versions' answers relative to their
scale (numerics unchanged: float32 rounding at most).

Run: ``flock /tmp/coord/bench.lock python benchmarks/reference_ab.py --base COMMIT [--mode M] [model ...]``;
``--new COMMIT`` runs that commit as the new side instead of the checkout (to bisect).
"""

from __future__ import annotations

import argparse
import os
import pickle
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _harness import interleave, machine_info, paired_ratio, table

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ("resnet50", "densenet121", "squeezenet", "inception_v1", "shufflenet")

_WORKER = r"""
import pickle, struct, sys, tempfile, time
from pathlib import Path
import numpy as np
import hybrid
from hybrid.zoo import samples
inp, out = sys.stdin.buffer, sys.stdout.buffer
def send(obj):
    data = pickle.dumps(obj)
    out.write(struct.pack("<I", len(data)) + data)
    out.flush()
mode, name, examples = sys.argv[1:4]
work = Path(tempfile.mkdtemp(prefix="hybrid-ab-"))
t0 = time.perf_counter()
if mode == "reference":
    cm = hybrid.compile(str(samples.light_model_path(name)), target="reference")
    feeds = {cm.signature.inputs[0].name: samples.light_input()}
    call = lambda: cm.run(feeds)
    answer = lambda: [np.asarray(v) for v in cm.run(feeds).values()]
    steps = len(cm.executable.program.steps)
elif mode == "load":  # hybrid.load of a bundle saved here (its compiled cache inside), then close
    hybrid.compile(str(samples.light_model_path(name)), target="onnxruntime").save(str(work / "m.hybrid"))
    def call():
        hybrid.load(work / "m.hybrid").close()
    feeds = {"x": samples.light_input()}
    def answer():
        m = hybrid.load(work / "m.hybrid")
        try:
            return [np.asarray(v) for v in m.run({m.signature.inputs[0].name: feeds["x"]}).values()]
        finally:
            m.close()
    steps = 0
else:  # vision: the example's detector -> crop_and_classify on one 640x480 frame
    sys.path.insert(0, examples)
    import video_analytics as va
    det_path, cls_path = va.bundle_models(work)
    opts = {"onnxruntime": {"allow_spinning": False}}
    det, cls = hybrid.load(det_path, config=opts), hybrid.load(cls_path, config=opts)
    frame = next(iter(va.squares_frames(1, 640, 480)))
    call = lambda: cls.crop_and_classify(det(frame))
    def answer():
        d = cls.crop_and_classify(det(frame))
        return [np.asarray(d.boxes, np.float64), np.asarray([l.class_ids[0] for l in d.labels], np.float64)]
    steps = 0
setup_s = time.perf_counter() - t0
send((setup_s, answer(), steps))
while inp.read(1):
    call()
    send(None)
"""


class Worker:
    """One version of hybrid in its own process, holding one compiled model."""

    def __init__(self, src: Path, mode: str, model: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(src)}
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, mode, model, str(ROOT / "examples")],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, cwd=tempfile.gettempdir())
        self.compile_s, self.outputs, self.steps = self._receive()

    def _receive(self):
        header = self.proc.stdout.read(4)
        if len(header) < 4:
            raise RuntimeError("the worker died (see its stderr above)")
        (n,) = struct.unpack("<I", header)
        return pickle.loads(self.proc.stdout.read(n))

    def call(self) -> None:
        self.proc.stdin.write(b"r")
        self.proc.stdin.flush()
        self._receive()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _archive(commit: str, into: Path) -> Path:
    """``src/`` of ``commit`` extracted under ``into`` (``git archive``); its path."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    parser.add_argument("--base", required=True, help="the commit to compare with (git archive of its src/)")
    parser.add_argument("--new", default=None,
                        help="a commit to run as the new side instead of this checkout (bisecting)")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--per-block", type=int, default=3)
    parser.add_argument("--mode", choices=("reference", "load", "vision"), default="reference",
                        help="reference: a run on target='reference'; load: hybrid.load of a saved bundle (ONNX "
                             "Runtime, cache inside) and close; vision: detector -> crop_and_classify, one frame")
    args = parser.parse_args()
    print(machine_info())
    rows = []
    with tempfile.TemporaryDirectory(prefix="hybrid-ab-") as tmp:
        trees = {"old": _archive(args.base, Path(tmp) / "old"),
                 "new": ROOT / "src" if args.new is None else _archive(args.new, Path(tmp) / "new")}
        for model in args.models:
            workers = {k: Worker(src, args.mode, model) for k, src in trees.items()}
            try:
                old, new = workers["old"], workers["new"]
                scale = max(float(np.max(np.abs(o))) for o in old.outputs) or 1.0
                diff = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                           for a, b in zip(old.outputs, new.outputs))
                times = interleave({k: w.call for k, w in workers.items()}, blocks=args.blocks,
                                   per_block=args.per_block, warmup=2, pause=0.1)
                ratio = paired_ratio(times, "new", "old", args.per_block)
                med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
                rows.append([model, old.steps, new.steps, med["old"], med["new"], ratio,
                             new.compile_s / old.compile_s, f"{diff / scale:.1e}"])
                print(f"{model}: new/old {ratio:.3f} (steps {old.steps} -> {new.steps}), "
                      f"max |new - old| / max|old| {diff / scale:.2e}", flush=True)
            finally:
                for w in workers.values():
                    w.close()
    print()
    print(table(["model", "steps old", "steps new", "old ms", "new ms", "new / old (paired)",
                 "setup new / old", "max diff / max|out|"], rows))


if __name__ == "__main__":
    main()
