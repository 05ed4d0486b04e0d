"""How long ``import hybrid`` takes in a fresh interpreter, next to the libraries it must not import.

Each sample is one new interpreter that times its own import (interpreter start-up is not counted);
contenders are interleaved in blocks so that a busy machine slows them alike. The goal, once a test
threshold (import < 0.3 s), is that ``import hybrid`` costs a small fraction of ``import numpy``: the
facade loads only ``hybrid``, ``hybrid._version`` and ``hybrid.errors`` (tests/test_compile.py checks
that structurally, on any machine).

Run: ``python benchmarks/import_time.py [--blocks 5]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _harness as h
import _results

CONTENDERS = {"hybrid": "import hybrid", "hybrid + lazy names": "import hybrid; hybrid.compile; hybrid.load",
              "numpy": "import numpy", "onnx": "import onnx", "onnxruntime": "import onnxruntime"}


def timed_import(statement: str) -> float:
    """Seconds ``statement`` takes in a new interpreter, measured inside it."""
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return float(out.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=5)
    _results.add_argument(parser, "import_time")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    names = list(CONTENDERS)
    for b in range(args.blocks):
        for name in names[b % len(names):] + names[:b % len(names)]:
            samples[name].append(timed_import(CONTENDERS[name]))
    numpy_ms = h.median_ms(samples["numpy"])
    rows = [[name, f"{h.median_ms(s):.1f}", f"{h.median_ms(s) / numpy_ms:.2f}"] for name, s in samples.items()]
    results = h.table(["import", "median ms", "vs numpy"], rows)
    print(results)
    if args.write_results:
        _results.write_results(args.write_results, "Import cost", _results.command_line(), results,
                               notes=f"Each sample a fresh interpreter timing its own import; {args.blocks} blocks, "
                               "contenders interleaved.")


if __name__ == "__main__":
    main()
