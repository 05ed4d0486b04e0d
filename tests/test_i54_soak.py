"""Issue 54, item 3: long life stays flat, in short (the 30-minute run: ``benchmarks/auto_soak.py``, RESULTS.md).

The library path of ``benchmarks/auto_soak.py`` for about 40 s: a dynamic model compiled ``target='auto'`` with
nothing declared, called by two threads on random shapes (dozens of shape buckets, each checked in the check
process, its candidates compiled, raced, decided, released) with re-checks every 0.5 s (doubling), sampled every
5 s from ``/proc``. After a 15 s warm-up its threads and open file descriptors grow by no more than a few (a
runtime's pool may start a thread late), and it never has more than one child (the check process, ended when idle
and started again). Resident memory is reported, not asserted: how much of it a machine's allocator keeps is no
invariant.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

SOAK = Path(__file__).parent.parent / "benchmarks" / "auto_soak.py"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the soak reads /proc")
def test_the_library_path_stays_flat_in_threads_fds_and_children(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(SOAK), "--paths", "library", "--minutes", "0.7", "--sample-s", "5",
                           "--warmup-min", "0.25", "--recheck-after-s", "0.5", "--max-rss-growth-mb", "1e9",
                           "--json", str(out)], capture_output=True, text=True, timeout=240)
    assert out.exists(), done.stdout[-2000:] + done.stderr[-4000:]
    found = json.loads(out.read_text())
    samples, (verdict,) = found["samples"], found["verdicts"]
    assert len(samples) >= 8 and samples[-1]["buckets"] >= 8  # it ran, and tuned many buckets
    assert verdict["wrong"] == 0 and verdict["errors"] == 0 and verdict["calls"] > 100
    assert verdict["threads"] <= 8 and verdict["fds"] <= 16 and verdict["children"] <= 1, verdict
    assert done.returncode == 0, done.stdout[-3000:]
