"""Scale-out on Ray: replicas killed under load, 2 replicas on 2 raylets vs 1, Ray Data vs an in-process loop.

Everything runs on this machine, on loopback addresses only (the two raylets of
``tests/_serve_ray_cluster.py``: 127.0.0.2 and 127.0.0.3, one CPU each); the machine is shared with other
sessions, so absolute figures swing and only ratios of interleaved blocks are quoted.

- ``chaos``: 2 replicas (one per raylet) of ONNX's light SqueezeNet (batch-dynamic); 8 tritonclient.http
  clients (binary tensors) send their own inputs for the whole run, every answer compared with a local run
  of that input. At fixed times one replica is killed, then (once Serve has restarted it) both at once.
  Reported: answered, wrong, failed (by what the client got), and when the failures happened relative to
  the kills.
- ``throughput``: the same model and clients; the application redeployed with 1 replica and with 2 replicas
  (each replica one CPU, ONNX Runtime on one thread) in interleaved blocks; the median of the paired ratios.
- ``data``: 2,000 images (3x224x224, generated per row inside the pipeline) through SqueezeNet: Ray Data with
  2 actors (``batch_predict``, batch 64, one CPU each, ONNX Runtime on one thread) vs one in-process loop
  over the same batches (ONNX Runtime on its default threads), interleaved; the ratio and each actor's
  decision (target 'auto').

Run: ``flock /tmp/coord/bench.lock python benchmarks/ray_scale.py [chaos] [throughput] [data]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
import tritonclient.http as th  # noqa: E402
from ray import serve  # noqa: E402
from tests._serve_ray_cluster import LocalCluster, free_port  # noqa: E402
from tests._serve_support import dynamic_squeezenet  # noqa: E402

import hybrid  # noqa: E402
from hybrid.serve.ray import deployment as ray_serve  # noqa: E402

APP = "bench"
ORT_ONE_THREAD = {"onnxruntime": {"intra_op_num_threads": 1, "inter_op_num_threads": 1}}


# ----------------------------------------------------------------------------- load
class Load:
    """``clients`` threads sending their own inputs until stopped; each answer checked."""

    def __init__(self, url: str, model_path: Path, clients: int = 8, distinct: int = 16) -> None:
        self.url = url
        rng = np.random.default_rng(0)
        self.inputs = [rng.random((1, 3, 224, 224), dtype=np.float32) for _ in range(distinct)]
        local = hybrid.compile(str(model_path), target="onnxruntime")
        self.expected = [local.run({"data_0": x})["softmaxout_1"] for x in self.inputs]
        local.close()
        self.clients = clients
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answered = self.wrong = 0
        self.failures: list[tuple[float, str]] = []
        self.t0 = time.monotonic()
        self.threads: list[threading.Thread] = []

    def _client(self, index: int) -> None:
        client = th.InferenceServerClient(self.url, network_timeout=120.0, connection_timeout=120.0)
        i = index
        while not self.stop.is_set():
            k = i % len(self.inputs)
            i += self.clients
            inp = th.InferInput("data_0", [1, 3, 224, 224], "FP32")
            inp.set_data_from_numpy(self.inputs[k], binary_data=True)
            try:
                got = client.infer("squeezenet", [inp]).as_numpy("softmaxout_1")
            except Exception as e:  # counted, with what the client saw
                text = str(e).replace("\n", " ")
                code = next((w.strip("[]:,") for w in text.split() if w.strip("[]:,").startswith("HYB-")), None)
                with self.lock:
                    self.failures.append((time.monotonic() - self.t0, code or text[:90]))
                time.sleep(0.05)
                continue
            ok = np.allclose(got, self.expected[k], rtol=1e-4, atol=1e-6)
            with self.lock:
                self.answered += 1
                self.wrong += not ok

    def start(self) -> Load:
        self.t0 = time.monotonic()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.clients)]
        for t in self.threads:
            t.start()
        return self

    def count(self) -> int:
        with self.lock:
            return self.answered

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(150)


def replicas() -> list[dict]:
    from ray._private.state import actors

    return [{"name": a["Name"], "id": a["ActorID"], "node": a["Address"]["NodeID"]}
            for a in actors(actor_state_name="ALIVE").values()
            if a["ActorClassName"] == f"ServeReplica:{APP}:{APP}-models"]


def wait_replicas(count: int, exclude: set[str] = frozenset(), timeout: float = 180.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        alive = [a for a in replicas() if a["id"] not in exclude]
        if len(alive) >= count and serve.status().applications[APP].status == "RUNNING":
            return time.monotonic() - t0
        time.sleep(0.2)
    raise TimeoutError(f"{count} replicas not running within {timeout} s")


def deploy(model: Path, count: int, http_port: int) -> None:
    ray_serve.deploy([model], target="onnxruntime", replicas=count, replica_cpus=1, port=http_port,
                     proxy_location="HeadOnly", app_name=APP, backend_config=ORT_ONE_THREAD,
                     overrides={"max_batch": 8, "batch_timeout": 0.002})
    wait_replicas(count)


# ----------------------------------------------------------------------------- chaos
def chaos(model: Path, http_port: int, seconds_between: float) -> None:
    deploy(model, 2, http_port)
    load = Load(f"127.0.0.1:{http_port}", model).start()
    events: list[tuple[float, str]] = []

    def kill(actors: list[dict], what: str) -> set[str]:
        events.append((time.monotonic() - load.t0, what))
        for a in actors:
            ray.kill(ray.get_actor(a["name"], namespace="serve"), no_restart=True)
        return {a["id"] for a in actors}

    time.sleep(seconds_between)
    first = replicas()
    gone = kill(first[:1], "kill 1 of 2 replicas")
    back = wait_replicas(2, exclude=gone)
    events.append((time.monotonic() - load.t0, f"2 replicas running again ({back:.1f} s after the kill)"))
    time.sleep(seconds_between)
    both = replicas()
    gone = kill(both, "kill both replicas")
    back = wait_replicas(1, exclude=gone)
    events.append((time.monotonic() - load.t0, f"first replica back ({back:.1f} s after the kill)"))
    wait_replicas(2, exclude=gone)
    events.append((time.monotonic() - load.t0, "2 replicas running again"))
    time.sleep(seconds_between)
    load.finish()
    elapsed = time.monotonic() - load.t0
    print(f"\n### chaos: 8 clients, {elapsed:.0f} s, SqueezeNet, 2 replicas on 2 raylets")
    print(f"answered {load.answered}, wrong {load.wrong}, failed {len(load.failures)}")
    for t, what in events:
        print(f"  t={t:6.1f} s  {what}")
    kinds: dict[str, list[float]] = {}
    for t, what in load.failures:
        kinds.setdefault(what, []).append(t)
    for what, times in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(times):4d} x {what!r} at t={min(times):.1f}..{max(times):.1f} s")
    serve.delete(APP)


# ----------------------------------------------------------------------------- throughput
def throughput(model: Path, http_port: int, blocks: int, seconds: float) -> None:
    rates: dict[int, list[float]] = {1: [], 2: []}
    order = [c for p in range(blocks) for c in ((1, 2) if p % 2 == 0 else (2, 1))]  # A B B A ...
    for i, count in enumerate(order):
        deploy(model, count, http_port)
        load = Load(f"127.0.0.1:{http_port}", model).start()
        time.sleep(2.0)  # warm: connections open, batches forming
        start_n, t0 = load.count(), time.monotonic()
        time.sleep(seconds)
        rate = (load.count() - start_n) / (time.monotonic() - t0)
        load.finish()
        assert load.wrong == 0 and not load.failures, (load.wrong, load.failures[:3])
        rates[count].append(rate)
        print(f"  block {i}: {count} replica(s): {rate:.1f} req/s")
    pairs = [b / a for a, b in zip(rates[1], rates[2])]
    print(f"\n### throughput: 8 clients, SqueezeNet, {blocks} pairs of {seconds:.0f} s blocks")
    print(f"1 replica: median {statistics.median(rates[1]):.1f} req/s; 2 replicas on 2 raylets: median "
          f"{statistics.median(rates[2]):.1f} req/s; median paired ratio {statistics.median(pairs):.2f}x "
          f"(pairs {', '.join(f'{p:.2f}' for p in pairs)})")
    serve.delete(APP)


# ----------------------------------------------------------------------------- Ray Data
ROWS, BATCH = 2000, 64


def make_images(batch: dict) -> dict:
    ids = batch["id"]
    images = np.stack([np.random.default_rng(int(i)).random((3, 224, 224), dtype=np.float32) for i in ids])
    return {"id": ids, "data_0": images}


def data(model: Path, reps: int) -> None:
    from hybrid.serve.ray.data import batch_predict, consume

    ray.data.DataContext.get_current().enable_progress_bars = False
    local = hybrid.compile(str(model), target="onnxruntime")
    times: dict[str, list[float]] = {"loop": [], "ray": []}
    steady: list[float] = []  # Ray Data rows/s after its first answered batch (actors started, models compiled)
    first_batch: list[float] = []
    decisions: dict[str, str] = {}
    checked = compared = 0
    loop_top = None
    for rep in range(reps):
        for kind in (["loop", "ray"] if rep % 2 == 0 else ["ray", "loop"]):
            t0 = time.perf_counter()
            if kind == "loop":
                top = np.empty(ROWS, np.int64)
                for start in range(0, ROWS, BATCH):
                    b = make_images({"id": np.arange(start, min(start + BATCH, ROWS))})
                    top[b["id"]] = local.run({"data_0": b["data_0"]})["softmaxout_1"].reshape(len(b["id"]), -1)\
                        .argmax(1)
            else:
                ds = ray.data.range(ROWS, override_num_blocks=ROWS // BATCH).map_batches(make_images,
                                                                                         batch_size=BATCH)
                out = batch_predict(ds, model, target="auto", concurrency=2, batch_size=BATCH, num_cpus=1,
                                    backend_config=ORT_ONE_THREAD)
                got = np.full(ROWS, -1, np.int64)

                def keep(b: dict, got: np.ndarray = got) -> None:
                    got[b["id"]] = b["softmaxout_1"].reshape(len(b["id"]), -1).argmax(1)

                marks: list[tuple[float, int]] = []
                report = consume(out.drop_columns(["data_0"]), total=ROWS, on_batch=keep,
                                 on_progress=lambda r, m=marks: m.append((time.perf_counter(), r.rows)))
                first_batch.append(marks[0][0] - t0)
                steady.append((marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0]))
                decisions.update(report.decisions)
                assert report.rows == ROWS
                if loop_top is not None:
                    checked += int((got == loop_top).sum())
                    compared += ROWS
            times[kind].append(time.perf_counter() - t0)
            if kind == "loop" and loop_top is None:
                loop_top = top
            print(f"  rep {rep} {kind}: {times[kind][-1]:.1f} s")
    pairs = [lo / ra for lo, ra in zip(times["loop"], times["ray"])]
    print(f"\n### Ray Data: {ROWS} images 3x224x224, SqueezeNet, batch {BATCH}, {reps} interleaved pairs")
    print(f"in-process loop median {statistics.median(times['loop']):.1f} s; Ray Data 2 actors median "
          f"{statistics.median(times['ray']):.1f} s; speed-up (loop / ray) median {statistics.median(pairs):.2f}x "
          f"(pairs {', '.join(f'{p:.2f}' for p in pairs)}); top-1 equal to the loop's on {checked} of "
          f"{compared} rows compared")
    loop_rate = [ROWS / t for t in times["loop"]]
    print(f"Ray Data: first answered batch after median {statistics.median(first_batch):.1f} s (actors start, "
          f"each compiles with target 'auto'); after it {statistics.median(steady):.0f} rows/s vs the loop's "
          f"{statistics.median(loop_rate):.0f} rows/s "
          f"({statistics.median(steady) / statistics.median(loop_rate):.2f}x)")
    print(f"per-actor decisions: {decisions}")
    local.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["chaos", "throughput", "data"])
    parser.add_argument("--blocks", type=int, default=3, help="throughput: pairs of blocks")
    parser.add_argument("--seconds", type=float, default=15.0, help="throughput: seconds per block")
    parser.add_argument("--between", type=float, default=10.0, help="chaos: seconds between kills")
    parser.add_argument("--reps", type=int, default=3, help="data: interleaved pairs")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ray-scale-"))
    model = dynamic_squeezenet(tmp / "squeezenet.onnx")
    previous = signal.getsignal(signal.SIGTERM)
    if "data" in args.parts:  # one local Ray instance on 127.0.0.2: 2 actors of one CPU, one more for the reads
        ray.init(num_cpus=3, include_dashboard=False, object_store_memory=1 << 30, log_to_driver=False,
                 configure_logging=False, _node_ip_address="127.0.0.2")
        signal.signal(signal.SIGTERM, previous)
        try:
            data(model, args.reps)
        finally:
            ray.shutdown()
    cluster_parts = [p for p in args.parts if p in ("chaos", "throughput")]
    if cluster_parts:
        proxy = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": ray_serve.PROXY_CALLBACK}  # Serve's errors as HYB JSON
        cluster = LocalCluster(tmp, {"head": proxy, "worker": proxy})
        try:
            cluster.start()
            ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
            signal.signal(signal.SIGTERM, previous)
            cluster.wait_nodes(2)
            http_port = free_port()
            if "chaos" in cluster_parts:
                chaos(model, http_port, args.between)
            if "throughput" in cluster_parts:
                throughput(model, http_port, args.blocks, args.seconds)
        finally:
            ray.shutdown()
            cluster.stop()


if __name__ == "__main__":
    main()
