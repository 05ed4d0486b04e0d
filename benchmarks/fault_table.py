"""The fault plugin's table (issue 54 item 2): each fault, what the callers got, what ``cm.tuning`` says.

Runs the scenario of tests/test_i54_faults.py (a dynamic model compiled ``target='auto'`` with nothing given, two
shape buckets called until decided, then both called on for a few seconds; every answer checked against numpy) once
per fault of the ``faulty`` backend (tests/plugins/hybrid_faults, found through the ``hybrid.backends`` entry point),
and prints a Markdown table.

Run: ``python benchmarks/fault_table.py`` (from the repository root; about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
import _results
from _harness import machine_info, table
from tests.test_i54_faults import plugin_environment, scenario

FAULTS = [  # (HYBRID_FAULT, what it does, the scenario's knobs)
    ("none", "nothing (the control)", {}),
    ("compile-exit", "compile: os._exit(70)", {}),
    ("compile-segv", "compile: SIGSEGV", {}),
    ("compile-hang", "compile: never returns", {"limit_s": 2.0}),
    ("compile-oom", "compile: MemoryError (1 PiB refused)", {}),
    ("compile-slow:2", "check process SIGKILLed mid-check (2 s compile)", {"kill": 1.0}),
    ("run-raise:3", "run: raises after 3 runs", {"linger_s": 4.0}),
    ("run-raise:30", "run: raises after 30 runs", {"linger_s": 4.0}),
    ("run-nan:4", "run: NaN every 4th run", {"linger_s": 4.0}),
    ("run-shape", "run: output loses its last column", {"linger_s": 4.0}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _results.add_argument(ap, "fault_table")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fault-table-"))
    env = plugin_environment(work / "site")
    rows = []
    for k, (fault, what, knobs) in enumerate(FAULTS):
        report = scenario(env, work / f"cache{k}", fault, **knobs)
        said = "; ".join(f"{s['bucket']}: {c['outcome']}" + (f" ({c['reason']})" if c["reason"] else "")
                         for s in report["tuning"] for c in s["candidates"] if c["label"] == "faulty:cpu")
        serving = ", ".join(sorted({s["serving"] for s in report["tuning"]}))
        rows.append([what, report["calls"], report["wrong"], len(report["errors"]), serving,
                     report["worker_pids"], said or "-"])
        print(fault, rows[-1], flush=True)
    print(machine_info())
    results = table(["fault", "calls", "wrong", "errors", "serving", "check processes", "faulty:cpu in cm.tuning"],
                    rows)
    print(results)
    if args.write_results:
        _results.write_results(args.write_results, "Faults in a candidate (issue 54 item 2)", _results.command_line(),
                               results)
    return 0 if all(r[2] == 0 and r[3] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
