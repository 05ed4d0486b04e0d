"""Long life of ``target='auto'`` (issue 54 item 3): a served model and a library model under steady load.

Two processes run side by side for ``--minutes``, each with a model compiled ``target='auto'`` with nothing
declared (so it tunes online, per shape bucket) and re-checks forced often (``recheck_after_s``, small, through
``hybrid.init``):

- ``server``: the public ``hybrid.serve`` API (``build_registry``, ``create_app``, ``run``) in a process of its
  own, loaded by ``--clients`` tritonclient.http clients, each sending one request after another (a short pause
  between them: a steady load, not a saturating one);
- ``library``: ``hybrid.compile(..., target='auto')`` called by ``--clients`` threads the same way.

The model (``x [N, L, 16] -> MatMul -> Relu -> ReduceMean over L -> y [N, 16]``) has two dynamic dims. Its
shape buckets (N and L rounded up to powers of two: N up to 8, the server's batch, L up to 4096; 52 in all) open
over the run: 8 at the start and ``--new-buckets-per-min`` more each minute (2: the last opens after 22 minutes),
each request drawing one of the open buckets and shapes inside it. So new buckets keep coming: each is checked
in the check process (ended when idle for 30 s and started again), its candidates compiled, raced, decided, released
once they serve no bucket, and compiled again for the next; decided buckets with runners-up are re-checked every
``recheck_after_s`` (doubling). Every answer is checked against numpy.

Every ``--sample-s`` (60 s) the driver reads each process's resident memory, threads, open file descriptors and
child processes (all descendants) from ``/proc`` (psutil is not needed), and prints the table. The bound, after
``--warmup-min`` minutes: threads and FDs within ``--max-threads-growth`` / ``--max-fds-growth`` of the first
sample after warm-up, at most ``--max-children`` children, RSS at the end within ``--max-rss-growth-mb`` of the
first sample after warm-up. ``--json`` writes the samples and the verdicts.

Run: ``flock /tmp/coord/bench.lock python benchmarks/auto_soak.py --minutes 30``. tests/test_i54_soak.py runs the
library path for under a minute (``--paths library --minutes 0.6 --sample-s 5``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _results
from _harness import machine_info, table

FEATURES = 16
BUCKETS = [(n, 1 << k) for n in (1, 2, 4, 8) for k in range(13)]  # the server's batch is at most 8 rows
random.Random(0).shuffle(BUCKETS)
FIRST_BUCKETS = 8


def draw(rng: random.Random, minute: float, per_min: float) -> tuple[int, int]:
    """A request's (N, L): one of the buckets open at ``minute``, a shape inside it."""
    n, length = rng.choice(BUCKETS[:min(len(BUCKETS), FIRST_BUCKETS + int(per_min * minute))])
    return rng.randint(n // 2 + 1, n), rng.randint(length // 2 + 1, length)

_AUTOTUNE = {"recheck_after_s": 2.0, "decide_within_s": 5.0, "overhead_cap": 0.5}

_SERVER = r'''
import json, sys
import hybrid
hybrid.init({"autotune": json.loads(sys.argv[3])})
from hybrid.serve import build_registry, create_app, run
run(create_app(build_registry([sys.argv[1]])), port=int(sys.argv[2]), log_level="warning")
'''

_LIBRARY = r'''
import json, random, sys, threading, time
import numpy as np
import hybrid
sys.path.insert(0, spec_dir := sys.argv[5])
from auto_soak import draw
hybrid.init({"autotune": json.loads(sys.argv[2])})
spec = json.loads(sys.argv[3])
weights = np.load(sys.argv[4])
cm = hybrid.compile(sys.argv[1], target="auto")
counts = {"calls": 0, "wrong": 0, "errors": 0}
stop = threading.Event()
t0 = time.monotonic()

def caller(seed):
    rng = random.Random(seed)
    while not stop.is_set():
        n, length = draw(rng, (time.monotonic() - t0) / 60, spec["per_min"])
        x = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(
            (n, length, spec["features"])).astype(np.float32)
        try:
            y = cm.run({"x": x})["y"]
            want = np.maximum(x @ weights, 0).mean(axis=1)
            counts["wrong" if not np.allclose(y, want, rtol=1e-3, atol=1e-4) else "calls"] += 1
        except Exception:
            counts["errors"] += 1
        time.sleep(spec["pause_s"])

threads = [threading.Thread(target=caller, args=(k,), daemon=True) for k in range(spec["clients"])]
for t in threads:
    t.start()
print("ready", flush=True)
for line in sys.stdin:  # one line a sample: answer with the counts and where tuning stands
    status = cm.tuning or ()
    print(json.dumps({**counts, "buckets": len(status), "decided": sum(s.state == "decided" for s in status)}),
          flush=True)
stop.set()
for t in threads:
    t.join()
cm.close()
'''


def make_model(folder: Path) -> tuple[Path, np.ndarray]:
    """The soak's model, written to ``folder``; its weights (for the numpy answer)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((FEATURES, FEATURES)).astype(np.float32) * 0.3
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["y"], axes=[1], keepdims=0)]
    graph = helper.make_graph(nodes, "soak", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                            ["N", "L", FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", FEATURES])],
                              [numpy_helper.from_array(w, "w")])
    path = folder / "soak.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    np.save(folder / "w.npy", w)
    return path, w


# ------------------------------------------------------------------------------------------- /proc
def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def stats(pid: int) -> dict[str, float]:
    """Resident memory (MB), threads, open FDs and descendant processes of ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {"rss_mb": int(fields["VmRSS"].split()[0]) / 1024, "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "children": len(descendants(pid))}


# ------------------------------------------------------------------------------------------- the two paths
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """The server process and its tritonclient.http clients."""

    name = "server"

    def __init__(self, model: Path, weights: np.ndarray, clients: int, pause_s: float, autotune: dict,
                 per_min: float) -> None:
        import tritonclient.http as httpclient

        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(model), str(self.port), json.dumps(autotune)])
        self.url = f"127.0.0.1:{self.port}"
        self.weights, self.pause_s, self.per_min = weights, pause_s, per_min
        self.counts = {"calls": 0, "wrong": 0, "errors": 0}
        client = httpclient.InferenceServerClient(self.url)
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(Exception):
                if client.is_model_ready("soak"):
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start (status {self.proc.poll()})")
            time.sleep(0.5)
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.threads = [threading.Thread(target=self._client, args=(k,), daemon=True) for k in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, seed: int) -> None:
        import tritonclient.http as httpclient

        rng = random.Random(seed)
        client = httpclient.InferenceServerClient(self.url, network_timeout=120.0, connection_timeout=120.0)
        while not self.stop.is_set():
            n, length = draw(rng, (time.monotonic() - self.t0) / 60, self.per_min)
            x = np.random.default_rng(rng.randrange(1 << 30)).standard_normal((n, length, FEATURES)).astype(np.float32)
            item = httpclient.InferInput("x", list(x.shape), "FP32")
            item.set_data_from_numpy(x, binary_data=True)
            try:
                y = client.infer("soak", [item]).as_numpy("y")
                want = np.maximum(x @ self.weights, 0).mean(axis=1)
                self.counts["wrong" if not np.allclose(y, want, rtol=1e-3, atol=1e-4) else "calls"] += 1
            except Exception as e:
                self.counts["errors"] += 1
                if self.counts["errors"] <= 3:
                    print(f"server error at shape {x.shape}: {e}", flush=True)
            time.sleep(self.pause_s)

    def sample(self) -> dict[str, float]:
        return {**stats(self.proc.pid), **self.counts}

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


class Library:
    """The library path in a process of its own (so that its threads, FDs and children are its own)."""

    name = "library"

    def __init__(self, model: Path, weights_path: Path, clients: int, pause_s: float, autotune: dict,
                 per_min: float) -> None:
        spec = {"clients": clients, "pause_s": pause_s, "per_min": per_min, "features": FEATURES}
        self.proc = subprocess.Popen([sys.executable, "-c", _LIBRARY, str(model), json.dumps(autotune),
                                      json.dumps(spec), str(weights_path), str(Path(__file__).parent)],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the library process did not start (status {self.proc.wait()})")

    def sample(self) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        measured = stats(self.proc.pid)
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return {**measured, **json.loads(self.proc.stdout.readline())}

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


# ------------------------------------------------------------------------------------------- the verdict
def verdicts(samples: list[dict], warmup_min: float, args: argparse.Namespace) -> list[dict]:
    """Per path, the bound after warm-up and whether it held."""
    out = []
    for path in dict.fromkeys(s["path"] for s in samples):
        mine = [s for s in samples if s["path"] == path]
        after = [s for s in mine if s["minute"] >= warmup_min] or mine[-1:]
        base = after[0]
        growth = {
            "threads": max(s["threads"] for s in after) - base["threads"],
            "fds": max(s["fds"] for s in after) - base["fds"],
            "children": max(s["children"] for s in after),
            "rss_mb": after[-1]["rss_mb"] - base["rss_mb"],
        }
        ok = (growth["threads"] <= args.max_threads_growth and growth["fds"] <= args.max_fds_growth
              and growth["children"] <= args.max_children and growth["rss_mb"] <= args.max_rss_growth_mb
              and mine[-1]["wrong"] == 0 and mine[-1]["errors"] == 0)
        out.append({"path": path, "from_minute": base["minute"], **growth, "wrong": mine[-1]["wrong"],
                    "errors": mine[-1]["errors"], "calls": mine[-1]["calls"], "ok": ok})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--warmup-min", type=float, default=5.0)
    parser.add_argument("--paths", default="server,library")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--pause-s", type=float, default=0.02)
    parser.add_argument("--recheck-after-s", type=float, default=_AUTOTUNE["recheck_after_s"])
    parser.add_argument("--new-buckets-per-min", type=float, default=2.0)
    parser.add_argument("--max-threads-growth", type=int, default=8)
    parser.add_argument("--max-fds-growth", type=int, default=16)
    parser.add_argument("--max-children", type=int, default=1)
    parser.add_argument("--max-rss-growth-mb", type=float, default=64.0)
    parser.add_argument("--json", type=Path)
    _results.add_argument(parser, "auto_soak")
    args = parser.parse_args()
    autotune = {**_AUTOTUNE, "recheck_after_s": args.recheck_after_s}
    folder = Path(tempfile.mkdtemp(prefix="auto-soak-"))
    model, weights = make_model(folder)
    env_note = f"HYBRID_CACHE_DIR={folder / 'cache'} (a fresh decision cache: every bucket is checked)"
    os.environ["HYBRID_CACHE_DIR"] = str(folder / "cache")
    print(machine_info(), "|", env_note, "| autotune", autotune, flush=True)
    runners: list = []
    try:
        for path in args.paths.split(","):
            if path == "server":
                runners.append(Served(model, weights, args.clients, args.pause_s, autotune, args.new_buckets_per_min))
            elif path == "library":
                runners.append(Library(model, folder / "w.npy", args.clients, args.pause_s, autotune,
                                       args.new_buckets_per_min))
            else:
                raise SystemExit(f"unknown path {path!r}: server or library")
        samples: list[dict] = []
        t0 = time.monotonic()
        while True:
            minute = (time.monotonic() - t0) / 60
            for r in runners:
                samples.append({"path": r.name, "minute": round(minute, 2), **r.sample()})
                s = samples[-1]
                print(f"{s['minute']:6.2f} min {r.name:8s} rss {s['rss_mb']:7.1f} MB threads {s['threads']:3d} "
                      f"fds {s['fds']:3d} children {s['children']} calls {s['calls']} wrong {s['wrong']} "
                      f"errors {s['errors']}" + (f" buckets {s['decided']}/{s['buckets']} decided"
                                                 if "buckets" in s else ""), flush=True)
            if minute >= args.minutes:
                break
            time.sleep(max(0.0, min(args.sample_s, args.minutes * 60 - (time.monotonic() - t0))))
    finally:
        for r in runners:
            with contextlib.suppress(Exception):
                r.close()
    found = verdicts(samples, args.warmup_min, args)
    results = (table(["minute", "path", "RSS MB", "threads", "FDs", "children", "right answers", "wrong", "errors"],
                     [[s["minute"], s["path"], s["rss_mb"], s["threads"], s["fds"], s["children"], s["calls"],
                       s["wrong"], s["errors"]] for s in samples])
               + "\n\n" + table(["path", "after minute", "threads +", "FDs +", "children max", "RSS + MB", "wrong",
                                  "errors", "within bound"],
                                 [[v["path"], v["from_minute"], v["threads"], v["fds"], v["children"], v["rss_mb"],
                                   v["wrong"], v["errors"], v["ok"]] for v in found]))
    print(results)
    if args.write_results:
        _results.write_results(args.write_results, "Long life of target='auto' (issue 54 item 3)",
                               _results.command_line(), results, notes=f"{env_note}; autotune {autotune}.")
    if args.json:
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps({"samples": samples, "verdicts": found, "autotune": autotune}, indent=1))
        tmp.replace(args.json)
    return 0 if all(v["ok"] for v in found) else 1


if __name__ == "__main__":
    raise SystemExit(main())
