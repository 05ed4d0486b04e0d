"""``pyasc serve`` against the real Triton server, same model, same unmodified tritonclient load (gRPC or HTTP).

Triton: ``tritonserver`` 2.51 from the nvidia-pytriton wheel (tests/_triton_real.py), the model in a
``backend: "python"`` ``model.py`` that runs ONNX Runtime with 2 threads (the CPU-only Triton shop
without the native onnxruntime backend), ``max_batch_size: 8``, ``dynamic_batching
{ max_queue_delay_microseconds: 2000 }``, one instance. pyasc: ``pyasc serve cls=model.onnx --max-batch 8
--batch-timeout 0.002`` with ``--target onnxruntime`` (ORT with 2 threads: serving efficiency alone) and
with the default target (auto, after its warm-up: ``--warmup``). The model is hybrid.zoo's
``external_data`` shape classifier (x [N, 3, 96, 96] -> probs [N, 5], dynamic batch), built here and
re-saved as one file; nothing is downloaded.

Load: 1, 4 and 16 closed-loop client threads, one tritonclient.grpc client each (``--protocol http``:
tritonclient.http, with binary tensors both ways, Triton's perf_analyzer's default protocol; ``grpc-stream``: one
ModelStreamInfer stream per client; ``--shared-memory``: images and answers in system shared memory regions), one
image per request (``--cache N``: both servers keep a response cache and the clients send N distinct images in
turn, so that nearly every answer comes from the cache); ``--trace-rate N``: every server traces one request of
every N (Triton's trace extension: to a trace file, or with ``--trace-mode opentelemetry`` as spans to an
OTLP/HTTP endpoint in a child process that reads and drops them; Triton then runs untraced: exporting every
request, ``tritonserver`` 2.51 crashed or stopped answering under 16 gRPC clients in 2 of 3 runs).
Every (round, clients) block runs each server for ``--seconds``, in an order that alternates between rounds; the
ratios pyasc / Triton are paired within a block and the table gives their median over the rounds, with the p99
latencies (median over rounds). Run it under ``flock /tmp/coord/bench.lock``.

Where the CPU goes (Linux): per block, each server's CPU time per inference from ``/proc``, split by role: the
model's compute (pyasc's threads named ``pyasc-compute``: batch runners and the runtime's pools; Triton's
``triton_python_backend_stub``: ORT and the backend's Python and IPC) and the front end (the rest of the server:
pyasc's event loop and gRPC threads, ``tritonserver``'s own), with the load generator's CPU beside it.

    flock /tmp/coord/bench.lock python benchmarks/vs_triton.py --rounds 3 --seconds 6
    flock /tmp/coord/bench.lock python benchmarks/vs_triton.py --protocol http --servers triton,pyasc-ort
    flock /tmp/coord/bench.lock python benchmarks/vs_triton.py --shared-memory --servers triton,pyasc-ort
    flock /tmp/coord/bench.lock python benchmarks/vs_triton.py --trace-rate 1 --servers triton,pyasc-ort
    flock /tmp/coord/bench.lock python benchmarks/vs_triton.py --trace-rate 1 --trace-mode opentelemetry
    flock /tmp/coord/bench.lock python benchmarks/vs_triton.py --cache 64 --servers triton,pyasc-ort
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _triton_real as tr

MODEL = "cls"
MAX_BATCH, DELAY_S, THREADS = 8, 0.002, 2


def build_model(folder: Path) -> tuple[Path, np.ndarray]:
    import onnx

    from hybrid import zoo

    m = zoo.build("external_data")
    model = onnx.load(str(m.path))  # its weights come in from the .onnx.data file beside it
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    x = m.feeds(seed=0)["x"][:1].astype(np.float32)
    return path, x


def start_pyasc(model: Path, target: str | None, warmup: int, extra: tuple[str, ...] = (),
                source: Path | None = None, env: dict[str, str] | None = None,
                idle_tuning: bool = False) -> tuple[subprocess.Popen[bytes], str, str, str]:
    """A ``pyasc serve`` process; ``source``: the ``src`` folder of another checkout to run instead of this one;
    ``env``: variables set for it (e.g. ``HYBRID_CACHE_DIR``); ``idle_tuning``: leave ``pyasc serve``'s tuning
    while idle on. It is off by default here: between a benchmark's blocks a server is idle because the others
    are being measured, and its tuning would run beside them (serve_idle_tuning.py measures it)."""
    http, grpc = tr.free_port(), tr.free_port()
    served = f"{MODEL}={model}" if model.suffix == ".onnx" else str(model)  # a model file, or a repository
    cmd = [sys.executable, "-m", "hybrid", "serve", served, "--port", str(http), "--grpc-port", str(grpc),
           "--max-batch", str(MAX_BATCH), "--batch-timeout", str(DELAY_S), "--log-level", "warning",
           "--backend-config", json.dumps({"onnxruntime": {"intra_op_num_threads": THREADS}})]
    if target:
        cmd += ["--target", target]
    if warmup:
        cmd += ["--warmup", str(warmup)]
    if not idle_tuning and source is None:  # (an older checkout has no such option)
        cmd += ["--no-idle-tuning"]
    cmd += list(extra)
    log = tempfile.NamedTemporaryFile(prefix="pyasc-serve-", suffix=".log", delete=False)  # noqa: SIM115
    child = {**os.environ, **(env or {})}
    if source is not None:  # ahead of the editable install's path entry
        child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), child.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pyasc serve exited: {Path(log.name).read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, f"127.0.0.1:{grpc}", log.name, f"http://127.0.0.1:{http}"
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("pyasc serve was not ready")


SHARED_MEMORY = False  # --shared-memory: every client passes its image and gets its answer in system shared memory
OUTPUT_BYTES = 4 * 5  # probs [1, 5] FP32
DISTINCT = 0  # --cache N: the clients send N distinct images in turn (0: every request the same image)
CACHE_BYTES = 64 << 20  # --cache: each server's response cache


def images(x: np.ndarray) -> list[np.ndarray]:
    """The images the clients send: ``x`` alone, or ``DISTINCT`` images that differ from it in one pixel."""
    out = []
    for k in range(max(DISTINCT, 1)):
        image = x.copy()
        image.reshape(-1)[0] += k
        out.append(image)
    return out


def triton_repository(folder: Path, model: Path, threads: int, batching: str = "") -> Path:
    """Triton's repository: ``model`` as ``cls`` in a Python-backend model.py running ONNX Runtime with ``threads``,
    with the benchmark's batching and ``batching`` added inside its ``dynamic_batching { }``."""
    tr.write_model(folder, MODEL, model, [tr.TritonSpec("x", "TYPE_FP32", [3, 96, 96])],
                   [tr.TritonSpec("probs", "TYPE_FP32", [5])], max_batch_size=MAX_BATCH,
                   queue_delay_us=round(DELAY_S * 1e6), threads=threads)
    if batching:
        config = folder / MODEL / "config.pbtxt"
        config.write_text(config.read_text().replace("dynamic_batching { ", f"dynamic_batching {{ {batching} ", 1))
    return folder


def pyasc_repository(folder: Path, model: Path) -> Path:
    """A repository serving ``model`` as ``cls`` with the benchmark's batching and the response cache on."""
    (folder / MODEL / "1").mkdir(parents=True)
    (folder / MODEL / "1" / "model.onnx").write_bytes(model.read_bytes())
    (folder / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nmax_batch_size: {MAX_BATCH}\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [3, 96, 96] } ]\n'
        'output [ { name: "probs" data_type: TYPE_FP32 dims: [5] } ]\n'
        f"dynamic_batching {{ max_queue_delay_microseconds: {round(DELAY_S * 1e6)} }}\n"
        "response_cache { enable: true }\n")
    return folder


def load(url: str, x: np.ndarray, clients: int, seconds: float, protocol: str = "grpc") -> tuple[float, float]:
    """Closed-loop load: (inferences per second, p99 latency in ms)."""
    every, elapsed = latencies(url, x, clients, seconds, protocol)
    return len(every) / elapsed, 1e3 * float(np.percentile(every, 99))


def _client(url: str, x: np.ndarray, protocol: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """One tritonclient client of ``protocol`` ('grpc', or 'http' with binary tensors): its close and its call.

    With ``SHARED_MEMORY`` the client makes two system shared memory regions of its own (tritonclient's
    utilities), registers them, and each call names them: the image is read from one, the answer written to
    the other (perf_analyzer's ``--shared-memory system``).
    """
    if protocol in ("http", "http-json"):
        import tritonclient.http as module

        binary = protocol == "http"
        c = module.InferenceServerClient(url.removeprefix("http://"))
        inp = module.InferInput("x", list(x.shape), "FP32")
        out = module.InferRequestedOutput("probs", binary_data=binary)
    else:
        import tritonclient.grpc as module  # type: ignore[no-redef]

        binary = True
        c = module.InferenceServerClient(url)
        inp = module.InferInput("x", list(x.shape), "FP32")
        out = module.InferRequestedOutput("probs")
    if protocol == "grpc-stream":  # one bidirectional stream per client, one request in flight on it
        import queue

        answers: queue.Queue[Any] = queue.Queue()
        c.start_stream(callback=lambda result, error: answers.put(error or result))
        inp.set_data_from_numpy(x)

        def call() -> Any:
            c.async_stream_infer(MODEL, [inp], outputs=[out])
            answer = answers.get()
            if isinstance(answer, Exception):
                raise answer
            return answer

        def close() -> None:
            c.stop_stream()
            c.close()

        return close, call
    if not SHARED_MEMORY:
        if DISTINCT:  # one input per image, sent in turn from a place of the client's own
            inputs = []
            for image in images(x):
                one = module.InferInput("x", list(image.shape), "FP32")
                if binary:
                    one.set_data_from_numpy(image)
                else:
                    one.set_data_from_numpy(image, binary_data=False)
                inputs.append(one)
            turn = [int.from_bytes(os.urandom(2), "little")]

            def rotating() -> Any:
                turn[0] += 1
                return c.infer(MODEL, [inputs[turn[0] % len(inputs)]], outputs=[out])

            return c.close, rotating
        if binary:
            inp.set_data_from_numpy(x)
        else:
            inp.set_data_from_numpy(x, binary_data=False)
        return c.close, lambda: c.infer(MODEL, [inp], outputs=[out])
    import uuid

    import tritonclient.utils.shared_memory as tshm

    tag = uuid.uuid4().hex[:12]
    names = {"in": (f"in{tag}", f"/vs_in_{tag}", x.nbytes), "out": (f"out{tag}", f"/vs_out_{tag}", OUTPUT_BYTES)}
    handles = {k: tshm.create_shared_memory_region(*v) for k, v in names.items()}
    tshm.set_shared_memory_region(handles["in"], [x])
    for name, key, size in names.values():
        c.register_system_shared_memory(name, key, size)
    inp.set_shared_memory(names["in"][0], x.nbytes)
    out.set_shared_memory(names["out"][0], OUTPUT_BYTES)

    def close() -> None:
        for name, _, _ in names.values():
            c.unregister_system_shared_memory(name)
        for handle in handles.values():
            tshm.destroy_shared_memory_region(handle)
        c.close()

    return close, lambda: c.infer(MODEL, [inp], outputs=[out])


def latencies(url: str, x: np.ndarray, clients: int, seconds: float,
              protocol: str = "grpc") -> tuple[list[float], float]:
    """Closed-loop load: every request's latency in seconds, and the seconds the load ran.

    ``protocol``: 'grpc' (``url`` host:port of the gRPC server) or 'http' (of the HTTP server; binary tensors).
    """
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]
    lat: list[list[float]] = [[] for _ in range(clients)]

    def client(i: int) -> None:
        close, call = _client(url, x, protocol)
        call()  # connect
        start.wait()
        mine = lat[i]
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at[0]:
                break
            call()
            mine.append(time.perf_counter() - t0)
        close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + 1e9
    start.wait()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    for t in threads:
        t.join()
    return [v for mine in lat for v in mine], time.perf_counter() - t0


_SINK = """\
import http.server, sys
class Drop(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Drop).serve_forever()
"""


def otlp_sink() -> tuple[str, subprocess.Popen[bytes]]:
    """An OTLP/HTTP traces endpoint (``host:port/v1/traces``) in a child process that reads what it is sent and
    drops it: the servers pay for their spans, the collector's CPU counts for neither."""
    port = tr.free_port()
    proc = subprocess.Popen([sys.executable, "-c", _SINK, str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", b"", method="POST"),
                                   timeout=1).close()
            return f"127.0.0.1:{port}/v1/traces", proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the OTLP sink did not start")


def paired(ratios: list[float]) -> str:
    """Ratios paired round by round, and their median: '1.02, 0.97, 1.05 (median x1.02)'."""
    return f"{', '.join(f'{r:.2f}' for r in ratios)} (median x{statistics.median(ratios):.2f})"


def _processes(root: int) -> list[int]:
    """``root`` and its descendants (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def cpu_by_role(root: int | None) -> dict[str, float]:
    """CPU seconds so far of a server process tree by role, 'compute' and 'front end' (empty without ``/proc``).

    A process's total counts its threads that have ended too (a worker thread that decoded a request); the
    compute threads are long-lived and summed one by one, and the front end is the rest.
    """
    out = {"front end": 0.0, "compute": 0.0}
    if root is None or not Path(f"/proc/{root}/task").is_dir():
        return {}
    tick = os.sysconf("SC_CLK_TCK")

    def seconds(stat: str) -> float:
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    for pid in _processes(root):
        try:
            total = seconds(Path(f"/proc/{pid}/stat").read_text())
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        compute = 0.0
        for task in tasks:
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue  # ended meanwhile
            if stat[stat.index("(") + 1:stat.rindex(")")].startswith(("pyasc-compute", "triton_python")):
                compute += seconds(stat)
        out["compute"] += compute
        out["front end"] += max(total - compute, 0.0)
    return out


def model_stats(http: str) -> dict[str, Any]:
    """The model's entry of a server's statistics (``GET /v2/models/cls/stats``, Triton's fields); {} if none."""
    with urllib.request.urlopen(f"{http}/v2/models/{MODEL}/stats", timeout=10) as r:
        return (json.loads(r.read()).get("model_stats") or [{}])[0]


def decision_of(http: str) -> str:
    """What a pyasc server runs the model on, from its statistics (backend, precision, accuracy where given)."""
    report = model_stats(http).get("pyasc", {})
    keep = {k: report.get(k) for k in ("backend", "device", "precision", "accuracy")}
    keep["tuning"] = [{k: t.get(k) for k in ("state", "serving", "decided_after_s")} for t in report.get("tuning", [])]
    return json.dumps(keep)[:800]


def runs_in(stats: dict[str, Any]) -> tuple[int, int]:
    """(inferences, executions) in a model's statistics entry (:func:`model_stats`)."""
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def counts_of(http: str) -> tuple[int, int]:
    """A server's (inferences, executions) of the model so far, from its statistics (Triton's fields)."""
    return runs_in(model_stats(http))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--servers", default="triton,pyasc-ort,pyasc-auto",
                    help="of triton, pyasc-ort, pyasc-auto, pyasc-precision (--precision auto --min-cosine 0.995)")
    ap.add_argument("--warmup", type=int, default=200, help="pyasc serve --warmup for the default target (0: it "
                                                              "tunes under the load, as a user who passes nothing)")
    ap.add_argument("--protocol", choices=("grpc", "grpc-stream", "http", "http-json"), default="grpc",
                    help="the clients' protocol: tritonclient.grpc, tritonclient.grpc over one ModelStreamInfer "
                         "stream per client (perf_analyzer's --streaming), tritonclient.http with binary tensors, "
                         "or tritonclient.http with the tensors as JSON")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (both servers)")
    ap.add_argument("--shared-memory", action="store_true",
                    help="the clients pass images and answers in system shared memory regions (perf_analyzer's "
                         "--shared-memory system), over --protocol grpc or http")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="the src folder of another checkout (e.g. `git archive <commit> src | tar -x -C /tmp/base`): "
                         "adds pyasc-ort-base, --target onnxruntime from that code, paired with the others")
    ap.add_argument("--trace-rate", type=int, default=0,
                    help="every server but pyasc-ort-base traces one request of every N (Triton's --trace-config "
                         "level=TIMESTAMPS rate=N, to a file in the work folder; pyasc serve takes the same flags); "
                         "0: no tracing. With --baseline, pyasc-ort / pyasc-ort-base is then the cost of tracing")
    ap.add_argument("--cache", type=int, default=0, metavar="N",
                    help="both servers keep a response cache (Triton's local cache; pyasc's --cache-config) and "
                         "the clients send N distinct images in turn: after the first N requests every answer "
                         "comes from the cache (grpc or http)")
    ap.add_argument("--trace-mode", choices=("triton", "opentelemetry"), default="triton",
                    help="with --trace-rate: Triton's trace files, or spans exported over OTLP/HTTP to a local sink")
    args = ap.parse_args()
    if args.trace_rate < 0:
        ap.error("--trace-rate must be >= 0")
    if args.shared_memory and args.protocol not in ("grpc", "http"):
        ap.error("--shared-memory goes with --protocol grpc or http")
    if args.cache and (args.shared_memory or args.protocol not in ("grpc", "http")):
        ap.error("--cache goes with --protocol grpc or http, without --shared-memory")
    global THREADS, SHARED_MEMORY, DISTINCT
    THREADS, SHARED_MEMORY, DISTINCT = args.threads, args.shared_memory, args.cache
    counts = [int(c) for c in args.clients.split(",")]
    names = args.servers.split(",")
    work = Path(tempfile.mkdtemp(prefix="vs-triton-"))
    model, x = build_model(work)
    repo = triton_repository(work / "triton", model, args.threads)
    caching: list[str] = []
    served = model
    if args.cache:
        caching = ["--cache-config", f"local,size={CACHE_BYTES}"]
        config = repo / MODEL / "config.pbtxt"
        config.write_text(config.read_text() + "response_cache { enable: true }\n")
        served = pyasc_repository(work / "pyasc", model)
    servers: dict[str, str] = {}
    https: dict[str, str] = {}  # each server's HTTP address, for its statistics
    pids: dict[str, int] = {}
    stops = []
    try:
        sink = None
        if args.trace_rate and args.trace_mode == "opentelemetry":
            sink, sink_proc = otlp_sink()
            stops.append(sink_proc.kill)

        def tracing(name: str) -> list[str]:
            if not args.trace_rate or name == "pyasc-ort-base":  # the baseline's code may not know the flags
                return []
            if name == "triton" and sink is not None:  # tritonserver 2.51 exporting every request to
                return []  # OpenTelemetry crashed or hung under 16 gRPC clients in 2 of 3 runs: it runs untraced
            options = ["level=TIMESTAMPS", f"rate={args.trace_rate}"]
            options += ([f"triton,file={work / name}-trace.json"] if sink is None else
                        ["mode=opentelemetry", f"opentelemetry,url={sink}"])
            return [a for option in options for a in ("--trace-config", option)]

        if "triton" in names:
            cache_home = ["--cache-directory", str(tr.triton_home() / "caches")] if caching else []
            triton = tr.TritonServer(repo, extra_args=[*tracing("triton"), *caching, *cache_home]).start()
            stops.append(triton.stop)
            servers["triton"] = triton.grpc_url if args.protocol.startswith("grpc") else triton.http_url
            pids["triton"] = triton.process.pid if triton.process is not None else 0
            https["triton"] = f"http://{triton.http_url}"
        chosen: dict[str, str] = {}
        if args.baseline is not None and "pyasc-ort-base" not in names:
            names.append("pyasc-ort-base")
        for name, target, warm, extra in (("pyasc-ort", "onnxruntime", 0, ()), ("pyasc-ort-base", "onnxruntime", 0, ()),
                                          ("pyasc-auto", None, args.warmup, ()),
                                          ("pyasc-precision", None, args.warmup,
                                           ("--precision", "auto", "--min-cosine", "0.995"))):
            if name in names:
                source = args.baseline if name == "pyasc-ort-base" else None
                proc, url, _, http = start_pyasc(served, target, warm, (*extra, *tracing(name), *caching), source)
                stops.append(lambda p=proc: (p.terminate(), p.wait(60)))
                servers[name] = url if args.protocol.startswith("grpc") else http
                chosen[name] = http
                https[name] = http
                pids[name] = proc.pid
        for name, http in chosen.items():  # what each pyasc server decided (its model statistics)
            print(f"{name}: {decision_of(http)}", flush=True)
        for url in servers.values():  # first calls: connections, sessions, allocators
            load(url, x, 4, 2.0, args.protocol)
        results: dict[tuple[str, int], list[tuple[float, float]]] = {}
        cpu: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        batch: dict[tuple[str, int], list[float]] = {}  # mean rows per model execution in a block
        for r in range(args.rounds):
            for n in counts:
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order:
                    runs = counts_of(https[name])
                    before, mine = cpu_by_role(pids.get(name)), os.times()
                    rate, p99 = load(servers[name], x, n, args.seconds, args.protocol)
                    after, mine_after = cpu_by_role(pids.get(name)), os.times()
                    runs_after = counts_of(https[name])
                    if runs_after[1] > runs[1]:
                        batch.setdefault((name, n), []).append((runs_after[0] - runs[0]) / (runs_after[1] - runs[1]))
                    results.setdefault((name, n), []).append((rate, p99))
                    if before and after and rate > 0:  # microseconds of CPU per inference
                        per = 1e6 / (rate * args.seconds)
                        client = (mine_after.user + mine_after.system - mine.user - mine.system) * per
                        cpu.setdefault((name, n), []).append(((after["front end"] - before["front end"]) * per,
                                                              (after["compute"] - before["compute"]) * per, client))
                    print(f"round {r} clients {n:2d} {name:11s} {rate:7.1f} inf/s  p99 {p99:6.1f} ms", flush=True)
        for name, http in chosen.items():  # again after the load: a server without --warmup tuned under it
            print(f"{name} after the rounds: {decision_of(http)}", flush=True)
        print()
        print("| clients | Triton inf/s | p99 ms | " + " | ".join(f"{s} inf/s | ratio | p99 ms"
                                                        for s in servers if s != "triton") + " |")
        print("|---" * (3 + 3 * (len(servers) - 1)) + "|")
        for n in counts:
            base = results[("triton", n)]
            row = [str(n), f"{statistics.median(v[0] for v in base):.0f}",
                   f"{statistics.median(v[1] for v in base):.1f}"]
            for s in servers:
                if s == "triton":
                    continue
                mine = results[(s, n)]
                ratios = [a[0] / b[0] for a, b in zip(mine, base, strict=True)]
                row += [f"{statistics.median(v[0] for v in mine):.0f}", f"x{statistics.median(ratios):.2f}",
                        f"{statistics.median(v[1] for v in mine):.1f}"]
            print("| " + " | ".join(row) + " |")
        if cpu:
            print()
            print("| clients | server | front end us/inf | compute us/inf | load generator us/inf | rows per run |")
            print("|---|---|---|---|---|---|")
            for n in counts:
                for s in servers:
                    if (s, n) in cpu:
                        front, compute, client = (statistics.median(v[i] for v in cpu[(s, n)]) for i in range(3))
                        rows = statistics.median(batch[(s, n)]) if (s, n) in batch else float("nan")
                        print(f"| {n} | {s} | {front:.0f} | {compute:.0f} | {client:.0f} | {rows:.2f} |")
        if "pyasc-ort-base" in servers and "pyasc-ort" in servers:
            print()
            for n in counts:  # the change measured against its baseline, paired within each block
                ratios = [a[0] / b[0] for a, b in zip(results[("pyasc-ort", n)], results[("pyasc-ort-base", n)],
                                                      strict=True)]
                print(f"clients {n:2d}: pyasc-ort / pyasc-ort-base {paired(ratios)}")
    finally:
        for stop in reversed(stops):  # the servers (they export what they hold as they stop), then the sink
            stop()


if __name__ == "__main__":
    main()
