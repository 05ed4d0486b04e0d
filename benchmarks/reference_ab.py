"""The reference backend of two versions of hybrid side by side: this checkout against a git commit.

Each version runs in a worker process of its own (``PYTHONPATH`` on its source tree, ``git archive`` of
``--base`` for the old one), compiles the same light model with ``target='reference'`` and waits; the
driver asks them for one call at a time, interleaved in blocks (the shared harness), so both meet the
same load on this shared VM within a second of each other. Quoted: the median over blocks of the
per-block latency ratio new / old, the compile-time ratio, and the largest difference between the two
versions' outputs relative to the output's scale (numerics unchanged: it should be float32 rounding).

Run: ``flock /tmp/coord/bench.lock python benchmarks/reference_ab.py --base COMMIT [model ...]``.
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
import pickle, struct, sys, time
import numpy as np
from hybrid import samples
import hybrid
inp, out = sys.stdin.buffer, sys.stdout.buffer
def send(obj):
    data = pickle.dumps(obj)
    out.write(struct.pack("<I", len(data)) + data)
    out.flush()
name = sys.argv[1]
t0 = time.perf_counter()
cm = hybrid.compile(str(samples.light_model_path(name)), target="reference")
compile_s = time.perf_counter() - t0
feeds = {cm.signature.inputs[0].name: samples.light_input()}
first = cm.run(feeds)
send((compile_s, [np.asarray(v) for v in first.values()], len(cm.executable.program.steps)))
while inp.read(1):
    cm.run(feeds)
    send(None)
"""


class Worker:
    """One version of hybrid in its own process, holding one compiled model."""

    def __init__(self, src: Path, model: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(src)}
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, model], stdin=subprocess.PIPE,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    parser.add_argument("--base", required=True, help="the commit to compare with (git archive of its src/)")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--per-block", type=int, default=3)
    args = parser.parse_args()
    print(machine_info())
    rows = []
    with tempfile.TemporaryDirectory(prefix="hybrid-ab-") as tmp:
        base = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base, "src"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        trees = {"old": base / "src", "new": ROOT / "src"}
        for model in args.models:
            workers = {k: Worker(src, model) for k, src in trees.items()}
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
                 "compile new / old", "max diff / max|out|"], rows))


if __name__ == "__main__":
    main()
