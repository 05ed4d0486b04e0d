"""``pyasc serve`` against the real Triton server, same model, same unmodified tritonclient load (gRPC or HTTP).

Triton: ``tritonserver`` 2.51 from the nvidia-pytriton wheel (tests/_triton_real.py), the model in a
``backend: "python"`` ``model.py`` that runs ONNX Runtime (the CPU-only Triton shop without the native
onnxruntime backend), ``max_batch_size: 8``, ``dynamic_batching { max_queue_delay_microseconds: 2000 }``, in
one layout or several (``--triton-layouts 1x2,2x1,4x1``: ``instance_group`` count x ONNX Runtime intra-op threads,
one ``tritonserver`` per layout, named ``triton-1x2`` and so on, as Model Analyzer would search them; by default
``1x<--threads>`` alone). pyasc: ``pyasc serve cls=model.onnx --max-batch 8 --batch-timeout 0.002`` with
``--target onnxruntime`` and ORT with ``--threads`` (pyasc-ort: serving efficiency alone), with the default target
(pyasc-auto, after its warm-up: ``--warmup``), or with nothing configured at all (pyasc-plain: no target, no
backend options, no warm-up, idle tuning as it comes: only the ports and the benchmark's batching, as a user who
passes nothing; pyasc-plain-c2: the same with ``--concurrency 2``). The model is a ``hybrid.zoo`` model
(``--model``, default ``external_data``: x [N, 3, 96, 96] -> probs [N, 5]), built here and re-saved as one file;
its inputs, outputs, types and dims come from the ONNX file and each request sends the zoo's sample (one row where
the model's first dim is dynamic on every input and output; else the model is served unbatched, ``max_batch_size:
0``, by both servers). Nothing is downloaded.

Load: 1, 4 and 16 closed-loop client threads, one tritonclient.grpc client each (``--protocol http``:
tritonclient.http, with binary tensors both ways, Triton's perf_analyzer's default protocol; ``grpc-stream``: one
ModelStreamInfer stream per client; ``--shared-memory``: inputs and answers in system shared memory regions), one
sample per request (``--cache N``: every server keeps a response cache and the clients send N distinct samples in
turn, so that nearly every answer comes from the cache); ``--trace-rate N``: every server traces one request of
every N (Triton's trace extension: to a trace file, or with ``--trace-mode opentelemetry`` as spans to an
OTLP/HTTP endpoint in a child process that reads and drops them; Triton then runs untraced: exporting every
request, ``tritonserver`` 2.51 crashed or stopped answering under 16 gRPC clients in 2 of 3 runs).
``--settle-s N``: before the measured rounds each pyasc server in turn takes 16 clients for N seconds, untimed (a
server that tunes under the load does it there). Every (round, clients) block runs each server for ``--seconds``,
in an order that alternates between rounds. "Triton best" is, in each block, the fastest Triton layout of that
block; every pyasc server's ratio is paired with it within the block, and the table gives the median over the
rounds, with the p99 latencies (median over rounds) and which layout was best in each round. ``--json PATH``
writes every block's numbers (rewritten after each round). Run it under ``flock /tmp/coord/bench.lock``.

Where the CPU goes (Linux): per block, each server's CPU time per inference from ``/proc``, split by role: the
model's compute (pyasc's threads named ``pyasc-compute``: batch runners and the runtime's pools; Triton's
``triton_python_backend_stub``: ORT and the backend's Python and IPC) and the front end (the rest of the server:
pyasc's event loop and gRPC threads, ``tritonserver``'s own), with the load generator's CPU beside it, and the
CPU the other servers spent meanwhile (idle tuning, for one; a block where it is large was not measured alone).

    flock /tmp/coord/bench.lock python benchmarks/vs_triton.py --rounds 3 --seconds 6
    flock /tmp/coord/bench.lock python benchmarks/vs_triton.py --model crnn --triton-layouts 1x1,1x2,2x1,2x2,4x1,4x2 \\
        --servers triton,pyasc-plain,pyasc-plain-c2 --settle-s 30 --json /tmp/vs-triton-crnn.json
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _results
import _triton_real as tr

MODEL = "cls"
MAX_BATCH, DELAY_S, THREADS = 8, 0.002, 2


@dataclass(frozen=True)
class Tensor:
    """One input or output as both servers declare it: its name, tritonclient's datatype ('FP32', 'INT64') and
    its dims, without the batch dim where the model is batched (-1: dynamic)."""

    name: str
    datatype: str
    dims: tuple[int, ...]

    def spec(self) -> tr.TritonSpec:
        """The tensor in a Triton model config."""
        return tr.TritonSpec(self.name, "TYPE_STRING" if self.datatype == "BYTES" else f"TYPE_{self.datatype}",
                             list(self.dims))


@dataclass(frozen=True)
class Served:
    """The benchmark's model: its one-file ONNX path, what it takes and gives, whether it is batched (its first
    dim is dynamic on every input and output), one request's inputs, and ONNX Runtime's answer to them."""

    path: Path
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    batched: bool
    sample: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]

    @property
    def max_batch(self) -> int:
        """The config's ``max_batch_size``: the benchmark's where the model is batched, else 0."""
        return MAX_BATCH if self.batched else 0


def build_model(folder: Path, name: str = "external_data") -> Served:
    """``hybrid.zoo``'s model ``name`` re-saved as one file in ``folder``, described from its ONNX graph."""
    import onnx
    import onnxruntime as ort
    from tritonclient.utils import np_to_triton_dtype

    from hybrid import zoo

    m = zoo.build(name)
    model = onnx.load(str(m.path))  # weights kept beside it (external_data) come in here
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    feeds = m.feeds(seed=0)
    weights = {i.name for i in model.graph.initializer}  # (an IR 3 model lists its weights as inputs too)
    inputs = [v for v in model.graph.input if v.name not in weights]
    missing = sorted({v.name for v in inputs} - set(feeds))
    if missing:
        raise SystemExit(f"zoo model {name!r}: its sample has no {missing}")

    def dims(value: Any) -> list[int]:
        return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
                for d in value.type.tensor_type.shape.dim]

    def dtype(value: Any) -> str:
        return str(np_to_triton_dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)))

    every = [*inputs, *model.graph.output]
    batched = all(dims(v) and dims(v)[0] == -1 for v in every)
    sample = {v.name: feeds[v.name][:1] if batched else feeds[v.name] for v in inputs}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    answers = session.run(None, sample)
    cut = 1 if batched else 0
    return Served(path, tuple(Tensor(v.name, dtype(v), tuple(dims(v)[cut:])) for v in inputs),
                  tuple(Tensor(v.name, dtype(v), tuple(dims(v)[cut:])) for v in model.graph.output), batched, sample,
                  {o.name: a for o, a in zip(session.get_outputs(), answers, strict=True)})


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """``'1x2,2x1'`` -> [(1, 2), (2, 1)]: Triton's instance count x ONNX Runtime intra-op threads."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        count, _, threads = part.partition("x")
        if not (count.isdigit() and threads.isdigit() and int(count) > 0 and int(threads) > 0):
            raise ValueError(f"a Triton layout is COUNTxTHREADS (e.g. 2x1), not {part!r}")
        out.append((int(count), int(threads)))
    if not out or len(set(out)) != len(out):
        raise ValueError(f"--triton-layouts needs distinct layouts, got {text!r}")
    return out


def start_pyasc(model: Path, target: str | None, warmup: int, extra: tuple[str, ...] = (),
                source: Path | None = None, env: dict[str, str] | None = None,
                idle_tuning: bool = False, plain: bool = False) -> tuple[subprocess.Popen[bytes], str, str, str]:
    """A ``pyasc serve`` process; ``source``: the ``src`` folder of another checkout to run instead of this one;
    ``env``: variables set for it (e.g. ``HYBRID_CACHE_DIR``); ``idle_tuning``: leave ``pyasc serve``'s tuning
    while idle on. It is off by default here: between a benchmark's blocks a server is idle because the others
    are being measured, and its tuning would run beside them (serve_idle_tuning.py measures it). ``plain``:
    nothing configured but the ports and the benchmark's batching (no backend options, no log level, idle tuning
    as it comes; ``target`` and ``warmup`` must be None and 0): what a user who passes nothing runs."""
    http, grpc = tr.free_port(), tr.free_port()
    served = f"{MODEL}={model}" if model.suffix == ".onnx" else str(model)  # a model file, or a repository
    cmd = [sys.executable, "-m", "hybrid", "serve", served, "--port", str(http), "--grpc-port", str(grpc),
           "--max-batch", str(MAX_BATCH), "--batch-timeout", str(DELAY_S)]
    if plain:
        assert target is None and not warmup, "a plain server has no target and no warm-up"
    else:
        cmd += ["--log-level", "warning",
                "--backend-config", json.dumps({"onnxruntime": {"intra_op_num_threads": THREADS}})]
    if target:
        cmd += ["--target", target]
    if warmup:
        cmd += ["--warmup", str(warmup)]
    if not plain and not idle_tuning and source is None:  # (an older checkout has no such option)
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


SHARED_MEMORY = False  # --shared-memory: every client passes its inputs and gets its answer in system shared memory
DISTINCT = 0  # --cache N: the clients send N distinct samples in turn (0: every request the same sample)
CACHE_BYTES = 64 << 20  # --cache: each server's response cache


def samples(served: Served) -> list[dict[str, np.ndarray]]:
    """The inputs the clients send: the sample alone, or ``DISTINCT`` samples whose first floating-point input
    differs from the sample's in one element."""
    varied = next((t.name for t in served.inputs if t.datatype.startswith(("FP", "BF"))), None)
    out = []
    for k in range(max(DISTINCT, 1)):
        one = {n: v.copy() for n, v in served.sample.items()}
        if k and varied is not None:
            one[varied].reshape(-1)[0] += k
        out.append(one)
    return out


def triton_repository(folder: Path, served: Served, threads: int, batching: str = "", instances: int = 1) -> Path:
    """Triton's repository: the model as ``cls`` in a Python-backend model.py running ONNX Runtime with ``threads``
    in ``instances`` instances, with the benchmark's batching (a batched model) and ``batching`` added inside its
    ``dynamic_batching { }``."""
    tr.write_model(folder, MODEL, served.path, [t.spec() for t in served.inputs], [t.spec() for t in served.outputs],
                   max_batch_size=served.max_batch, queue_delay_us=round(DELAY_S * 1e6) if served.batched else None,
                   threads=threads, instances=instances)
    if batching:
        config = folder / MODEL / "config.pbtxt"
        config.write_text(config.read_text().replace("dynamic_batching { ", f"dynamic_batching {{ {batching} ", 1))
    return folder


def pyasc_repository(folder: Path, served: Served) -> Path:
    """A repository serving the model as ``cls`` with the benchmark's batching and the response cache on."""
    (folder / MODEL / "1").mkdir(parents=True)
    (folder / MODEL / "1" / "model.onnx").write_bytes(served.path.read_bytes())
    lines = [f'name: "{MODEL}"', f"max_batch_size: {served.max_batch}",
             f"input [ {', '.join(t.spec().pbtxt() for t in served.inputs)} ]",
             f"output [ {', '.join(t.spec().pbtxt() for t in served.outputs)} ]"]
    if served.batched:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {round(DELAY_S * 1e6)} }}")
    (folder / MODEL / "config.pbtxt").write_text("\n".join([*lines, "response_cache { enable: true }"]) + "\n")
    return folder


def load(url: str, served: Served, clients: int, seconds: float, protocol: str = "grpc") -> tuple[float, float]:
    """Closed-loop load: (inferences per second, p99 latency in ms)."""
    every, elapsed = latencies(url, served, clients, seconds, protocol)
    return len(every) / elapsed, 1e3 * float(np.percentile(every, 99))


def _client(url: str, served: Served, protocol: str,
            rotate: bool = True) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """One tritonclient client of ``protocol`` ('grpc', or 'http' with binary tensors): its close and its call;
    ``rotate``: with ``DISTINCT``, send the distinct samples in turn (else the sample alone).

    With ``SHARED_MEMORY`` the client makes a system shared memory region of its own for every input and output
    (tritonclient's utilities), registers them, and each call names them: the inputs are read from the ones, the
    answers written to the others (perf_analyzer's ``--shared-memory system``).
    """
    if protocol in ("http", "http-json"):
        import tritonclient.http as module

        binary = protocol == "http"
        c = module.InferenceServerClient(url.removeprefix("http://"))
        outs = [module.InferRequestedOutput(t.name, binary_data=binary) for t in served.outputs]
    else:
        import tritonclient.grpc as module  # type: ignore[no-redef]

        binary = True
        c = module.InferenceServerClient(url)
        outs = [module.InferRequestedOutput(t.name) for t in served.outputs]

    def inputs(values: dict[str, np.ndarray]) -> list[Any]:
        made = []
        for t in served.inputs:
            one = module.InferInput(t.name, list(values[t.name].shape), t.datatype)
            if binary:
                one.set_data_from_numpy(values[t.name])
            else:
                one.set_data_from_numpy(values[t.name], binary_data=False)
            made.append(one)
        return made

    if protocol == "grpc-stream":  # one bidirectional stream per client, one request in flight on it
        import queue

        answers: queue.Queue[Any] = queue.Queue()
        c.start_stream(callback=lambda result, error: answers.put(error or result))
        streamed = inputs(served.sample)

        def call() -> Any:
            c.async_stream_infer(MODEL, streamed, outputs=outs)
            answer = answers.get()
            if isinstance(answer, Exception):
                raise answer
            return answer

        def close() -> None:
            c.stop_stream()
            c.close()

        return close, call
    if not SHARED_MEMORY:
        if DISTINCT and rotate:  # one set of inputs per sample, sent in turn from a place of the client's own
            every = [inputs(one) for one in samples(served)]
            turn = [int.from_bytes(os.urandom(2), "little")]

            def rotating() -> Any:
                turn[0] += 1
                return c.infer(MODEL, every[turn[0] % len(every)], outputs=outs)

            return c.close, rotating
        sent = inputs(served.sample)
        return c.close, lambda: c.infer(MODEL, sent, outputs=outs)
    import uuid

    import tritonclient.utils.shared_memory as tshm

    tag = uuid.uuid4().hex[:12]
    regions: list[tuple[str, Any]] = []  # (registered name, handle)
    sent = []

    def region(kind: str, k: int, size: int) -> tuple[str, Any]:
        name, key = f"{kind}{k}{tag}", f"/vs_{kind}{k}_{tag}"
        handle = tshm.create_shared_memory_region(name, key, size)
        c.register_system_shared_memory(name, key, size)
        regions.append((name, handle))
        return name, handle

    for k, t in enumerate(served.inputs):
        value = served.sample[t.name]
        name, handle = region("in", k, value.nbytes)
        tshm.set_shared_memory_region(handle, [value])
        one = module.InferInput(t.name, list(value.shape), t.datatype)
        one.set_shared_memory(name, value.nbytes)
        sent.append(one)
    for k, (t, out) in enumerate(zip(served.outputs, outs, strict=True)):
        size = served.reference[t.name].nbytes
        out.set_shared_memory(region("out", k, size)[0], size)

    def close() -> None:
        for name, handle in regions:
            c.unregister_system_shared_memory(name)
            tshm.destroy_shared_memory_region(handle)
        c.close()

    return close, lambda: c.infer(MODEL, sent, outputs=outs)


def answer_error(url: str, served: Served, protocol: str) -> float:
    """The largest absolute difference between a server's answer to the sample and ONNX Runtime's (NaN under
    ``SHARED_MEMORY``, where the answer stays in the region)."""
    close, call = _client(url, served, protocol, rotate=False)
    try:
        result = call()
    finally:
        close()
    if SHARED_MEMORY:
        return float("nan")
    worst = 0.0
    for t in served.outputs:
        got, want = result.as_numpy(t.name), served.reference[t.name]
        if got is None or got.shape != want.shape:
            return float("inf")
        if want.dtype.kind in "fiub":
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0)))
    return worst


def latencies(url: str, served: Served, clients: int, seconds: float,
              protocol: str = "grpc") -> tuple[list[float], float]:
    """Closed-loop load: every request's latency in seconds, and the seconds the load ran.

    ``protocol``: 'grpc' (``url`` host:port of the gRPC server) or 'http' (of the HTTP server; binary tensors).
    """
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]
    lat: list[list[float]] = [[] for _ in range(clients)]

    def client(i: int) -> None:
        close, call = _client(url, served, protocol)
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


def decision(http: str) -> dict[str, Any]:
    """What a pyasc server runs the model on, from its statistics: backend, precision, accuracy where given, and
    each shape bucket's tuning (what serves it, since when, and every candidate's ratio or outcome)."""
    report = model_stats(http).get("pyasc", {})
    keep = {k: report.get(k) for k in ("backend", "device", "precision", "accuracy")}
    keep["tuning"] = [{**{k: t.get(k) for k in ("bucket", "state", "serving", "decided_after_s")},
                       "candidates": [{k: c.get(k) for k in ("label", "ratio", "outcome")}
                                      for c in t.get("candidates", [])]}
                      for t in report.get("tuning", [])]
    return keep


def decision_of(http: str) -> str:
    """:func:`decision` on one line (without the candidates)."""
    keep = decision(http)
    keep["tuning"] = [{k: v for k, v in t.items() if k != "candidates"} for t in keep["tuning"]]
    return json.dumps(keep)[:800]


def runs_in(stats: dict[str, Any]) -> tuple[int, int]:
    """(inferences, executions) in a model's statistics entry (:func:`model_stats`)."""
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def counts_of(http: str) -> tuple[int, int]:
    """A server's (inferences, executions) of the model so far, from its statistics (Triton's fields)."""
    return runs_in(model_stats(http))


def machine() -> dict[str, Any]:
    """The CPU this ran on: its model name, logical cores, and whether it has AMX (Linux ``/proc/cpuinfo``)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return {"cpu": name, "cores": os.cpu_count(), "amx": "amx_tile" in flags, "avx512": "avx512f" in flags}


def quiet(cpu_s: dict[str, Callable[[], float]], limit_s: float, window_s: float = 2.0,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Wait, up to ``limit_s``, until the servers of ``cpu_s`` (name -> CPU seconds so far) together spend under 2%
    of a core over ``window_s`` while idle; the seconds waited, or None if they never did."""
    start = clock()
    while clock() - start < limit_s:
        before = {s: f() for s, f in cpu_s.items()}
        sleep(window_s)
        if sum(cpu_s[s]() - v for s, v in before.items()) < 0.02 * window_s:
            return clock() - start
    return None


def summarize(blocks: list[dict[str, Any]], counts: list[int], servers: list[str]) -> list[dict[str, Any]]:
    """Per client count: Triton's best layout in each round's block (its rate and p99), and every other server's
    rate, p99 and ratio to that block's best, paired round by round; medians over the rounds."""
    at = {(b["round"], b["clients"], b["server"]): b for b in blocks}
    rounds = sorted({b["round"] for b in blocks})
    tritons = [s for s in servers if s.startswith("triton")]
    rows = []
    for n in counts:
        done = [r for r in rounds if all((r, n, s) in at for s in servers)]
        if not done:
            continue
        row: dict[str, Any] = {"clients": n, "rounds": done, "servers": {}}
        best = [max((at[(r, n, s)] for s in tritons), key=lambda b: b["inf_s"]) for r in done] if tritons else []
        if best:
            row["triton_best"] = {"servers": [b["server"] for b in best], "inf_s": [b["inf_s"] for b in best],
                                  "p99_ms": [b["p99_ms"] for b in best],
                                  "median_inf_s": statistics.median(b["inf_s"] for b in best),
                                  "median_p99_ms": statistics.median(b["p99_ms"] for b in best)}
        for s in servers:
            mine = [at[(r, n, s)] for r in done]
            entry: dict[str, Any] = {"median_inf_s": statistics.median(b["inf_s"] for b in mine),
                                     "median_p99_ms": statistics.median(b["p99_ms"] for b in mine)}
            if best:
                entry["ratios"] = [a["inf_s"] / b["inf_s"] for a, b in zip(mine, best, strict=True)]
                entry["median_ratio"] = statistics.median(entry["ratios"])
            row["servers"][s] = entry
        rows.append(row)
    return rows


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """``doc`` to ``path`` as JSON (a temp file beside it, then renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def tables(summary: list[dict[str, Any]], servers: list[str]) -> str:
    """The Markdown tables of :func:`summarize`'s rows: pyasc against Triton's best layout, then every server."""
    out = []
    others = [s for s in servers if not s.startswith("triton")]
    if any("triton_best" in row for row in summary):
        out.append("| clients | Triton best inf/s | best layout per round | p99 ms | "
                   + " | ".join(f"{s} inf/s | x best | p99 ms" for s in others) + " |")
        out.append("|---" * (4 + 3 * len(others)) + "|")
        for row in summary:
            best = row["triton_best"]
            cells = [str(row["clients"]), f"{best['median_inf_s']:.0f}",
                     ", ".join(s.removeprefix("triton-") for s in best["servers"]), f"{best['median_p99_ms']:.1f}"]
            for s in others:
                e = row["servers"][s]
                cells += [f"{e['median_inf_s']:.0f}", f"x{e['median_ratio']:.2f}", f"{e['median_p99_ms']:.1f}"]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out.append("| clients | server | inf/s | p99 ms | / Triton best (paired, per round) |")
    out.append("|---|---|---|---|---|")
    for row in summary:
        for s in servers:
            e = row["servers"][s]
            ratio = (f"{', '.join(f'{r:.2f}' for r in e['ratios'])} (median x{e['median_ratio']:.2f})"
                     if "ratios" in e else "")
            out.append(f"| {row['clients']} | {s} | {e['median_inf_s']:.0f} | {e['median_p99_ms']:.1f} | {ratio} |")
    return "\n".join(out)


def results_section(protocol: str, layouts: bool, model: str) -> tuple[str, str]:
    """The section of benchmarks/RESULTS.md a run writes (name, title): one per protocol, layouts apart."""
    suffix = "" if protocol == "grpc" else "_" + protocol.replace("-", "_")
    name = "vs_triton" + ("_layouts" if layouts else "") + suffix
    title = (f"pyasc serve vs the real Triton server, {protocol}, model {model}"
             + (", each round against Triton's best layout" if layouts else ""))
    return name, title


# pyasc servers: name -> (target, warm-up calls (None: --warmup), more flags, plain: nothing configured)
PYASC: dict[str, tuple[str | None, int | None, tuple[str, ...], bool]] = {
    "pyasc-ort": ("onnxruntime", 0, (), False),
    "pyasc-ort-base": ("onnxruntime", 0, (), False),
    "pyasc-auto": (None, None, (), False),
    "pyasc-precision": (None, None, ("--precision", "auto", "--min-cosine", "0.995"), False),
    "pyasc-plain": (None, 0, (), True),
    "pyasc-plain-base": (None, 0, (), True),  # pyasc-plain from --baseline's code
    "pyasc-plain-c2": (None, 0, ("--concurrency", "2"), True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--model", default="external_data",
                    help="the hybrid.zoo model served (its inputs, outputs and dims come from its ONNX file)")
    ap.add_argument("--servers", default="triton,pyasc-ort,pyasc-auto",
                    help="of triton (one server per --triton-layouts layout), pyasc-ort, pyasc-auto, "
                         "pyasc-precision (--precision auto --min-cosine 0.995), pyasc-plain (nothing configured), "
                         "pyasc-plain-c2 (nothing configured but --concurrency 2)")
    ap.add_argument("--triton-layouts", default=None, metavar="CxT,...",
                    help="Triton's layouts, instance_group count x ONNX Runtime intra-op threads, one tritonserver "
                         "each (e.g. 1x1,1x2,2x1,2x2,4x1,4x2, as Model Analyzer would search); default 1x<--threads>")
    ap.add_argument("--settle-s", type=float, default=0.0,
                    help="before the rounds, each pyasc server in turn takes 16 clients for this long, untimed")
    ap.add_argument("--plain-idle-tuning", action=argparse.BooleanOptionalAction, default=True,
                    help="pyasc-plain's idle tuning (on: as a user who passes nothing; it may run while the other "
                         "servers are measured, which each block's 'the others used' line shows)")
    ap.add_argument("--json", type=Path, default=None, help="write every block's numbers here (after each round)")
    ap.add_argument("--warmup", type=int, default=200, help="pyasc serve --warmup for the default target (0: it "
                                                              "tunes under the load, as a user who passes nothing)")
    ap.add_argument("--protocol", choices=("grpc", "grpc-stream", "http", "http-json"), default="grpc",
                    help="the clients' protocol: tritonclient.grpc, tritonclient.grpc over one ModelStreamInfer "
                         "stream per client (perf_analyzer's --streaming), tritonclient.http with binary tensors, "
                         "or tritonclient.http with the tensors as JSON")
    ap.add_argument("--threads", type=int, default=2,
                    help="ONNX Runtime intra-op threads (pyasc-ort, pyasc-auto; Triton's default layout)")
    ap.add_argument("--shared-memory", action="store_true",
                    help="the clients pass inputs and answers in system shared memory regions (perf_analyzer's "
                         "--shared-memory system), over --protocol grpc or http")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="the src folder of another checkout (e.g. `git archive <commit> src | tar -x -C /tmp/base`): "
                         "adds pyasc-ort-base, --target onnxruntime from that code, paired with the others; "
                         "pyasc-plain-base in --servers runs pyasc-plain from that code")
    ap.add_argument("--trace-rate", type=int, default=0,
                    help="every server but pyasc-ort-base traces one request of every N (Triton's --trace-config "
                         "level=TIMESTAMPS rate=N, to a file in the work folder; pyasc serve takes the same flags); "
                         "0: no tracing. With --baseline, pyasc-ort / pyasc-ort-base is then the cost of tracing")
    ap.add_argument("--cache", type=int, default=0, metavar="N",
                    help="every server keeps a response cache (Triton's local cache; pyasc's --cache-config) and "
                         "the clients send N distinct samples in turn: after the first N requests every answer "
                         "comes from the cache (grpc or http)")
    ap.add_argument("--trace-mode", choices=("triton", "opentelemetry"), default="triton",
                    help="with --trace-rate: Triton's trace files, or spans exported over OTLP/HTTP to a local sink")
    _results.add_argument(ap)
    args = ap.parse_args()
    if args.trace_rate < 0:
        ap.error("--trace-rate must be >= 0")
    if args.settle_s < 0:
        ap.error("--settle-s must be >= 0")
    if args.shared_memory and args.protocol not in ("grpc", "http"):
        ap.error("--shared-memory goes with --protocol grpc or http")
    if args.cache and (args.shared_memory or args.protocol not in ("grpc", "http")):
        ap.error("--cache goes with --protocol grpc or http, without --shared-memory")
    from hybrid import zoo

    if args.model not in zoo.NAMES:
        ap.error(f"--model is one of {', '.join(zoo.NAMES)}, not {args.model!r}")
    try:
        layouts = parse_layouts(args.triton_layouts or f"1x{args.threads}")
    except ValueError as e:
        ap.error(str(e))
    names: list[str] = []
    for token in args.servers.split(","):
        if token == "triton":
            names += [f"triton-{count}x{threads}" for count, threads in layouts]
        elif token in PYASC:
            names.append(token)
        else:
            ap.error(f"--servers takes triton, {', '.join(PYASC)}; not {token!r}")
    if args.baseline is not None and not {"pyasc-ort-base", "pyasc-plain-base"} & set(names):
        names.append("pyasc-ort-base")
    if "pyasc-plain-base" in names and args.baseline is None:
        ap.error("pyasc-plain-base runs --baseline's code: give --baseline")
    global THREADS, SHARED_MEMORY, DISTINCT
    THREADS, SHARED_MEMORY, DISTINCT = args.threads, args.shared_memory, args.cache
    counts = [int(c) for c in args.clients.split(",")]
    work = Path(tempfile.mkdtemp(prefix="vs-triton-"))
    served = build_model(work, args.model)
    if args.cache and not any(t.datatype.startswith(("FP", "BF")) for t in served.inputs):
        ap.error(f"--cache varies a floating-point input, and {args.model} has none")
    if args.shared_memory and any(t.datatype == "BYTES" for t in served.inputs):
        ap.error("--shared-memory takes fixed-size inputs, and this model has strings")
    host = machine()
    print(f"machine: {host['cpu']}, {host['cores']} cores, AMX {'yes' if host['amx'] else 'no'}", flush=True)
    print(f"model {args.model}: {', '.join(f'{t.name} {t.datatype} {list(t.dims)}' for t in served.inputs)} -> "
          f"{', '.join(f'{t.name} {t.datatype} {list(t.dims)}' for t in served.outputs)}, "
          f"{'batched (max_batch_size ' + str(MAX_BATCH) + ')' if served.batched else 'unbatched'}; request "
          f"{', '.join(f'{n} {list(v.shape)}' for n, v in served.sample.items())}", flush=True)
    caching: list[str] = []
    pyasc_model = served.path
    if args.cache:
        caching = ["--cache-config", f"local,size={CACHE_BYTES}"]
        pyasc_model = pyasc_repository(work / "pyasc", served)
    servers: dict[str, str] = {}
    https: dict[str, str] = {}  # each server's HTTP address, for its statistics
    pids: dict[str, int] = {}
    commands: dict[str, Any] = {}
    stops = []
    doc: dict[str, Any] = {"machine": host, "model": args.model, "batched": served.batched,
                           "inputs": {n: list(v.shape) for n, v in served.sample.items()},
                           "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                           "servers": commands, "decisions": {}, "answer_error": {}, "blocks": []}
    try:
        sink = None
        if args.trace_rate and args.trace_mode == "opentelemetry":
            sink, sink_proc = otlp_sink()
            stops.append(sink_proc.kill)

        def tracing(name: str) -> list[str]:
            if not args.trace_rate or name.endswith("-base"):  # the baseline's code may not know the flags
                return []
            if name.startswith("triton") and sink is not None:  # tritonserver 2.51 exporting every request to
                return []  # OpenTelemetry crashed or hung under 16 gRPC clients in 2 of 3 runs: it runs untraced
            options = ["level=TIMESTAMPS", f"rate={args.trace_rate}"]
            options += ([f"triton,file={work / name}-trace.json"] if sink is None else
                        ["mode=opentelemetry", f"opentelemetry,url={sink}"])
            return [a for option in options for a in ("--trace-config", option)]

        for count, threads in layouts:
            name = f"triton-{count}x{threads}"
            if name not in names:
                continue
            repo = triton_repository(work / name, served, threads, instances=count)
            cache_home = ["--cache-directory", str(tr.triton_home() / "caches")] if caching else []
            if caching:
                config = repo / MODEL / "config.pbtxt"
                config.write_text(config.read_text() + "response_cache { enable: true }\n")
            triton = tr.TritonServer(repo, extra_args=[*tracing(name), *caching, *cache_home]).start()
            stops.append(triton.stop)
            servers[name] = triton.grpc_url if args.protocol.startswith("grpc") else triton.http_url
            pids[name] = triton.process.pid if triton.process is not None else 0
            https[name] = f"http://{triton.http_url}"
            commands[name] = {"kind": "triton", "instances": count, "threads": threads}
        chosen: dict[str, str] = {}
        for name, (target, warm, extra, plain) in PYASC.items():
            if name in names:
                source = args.baseline if name.endswith("-base") else None
                flags = (*extra, *tracing(name), *caching,
                         *(() if not plain or args.plain_idle_tuning else ("--no-idle-tuning",)))
                # a plain server gets a decision cache of its own, empty: it tunes from nothing, and never starts
                # from what another one decided (pyasc-plain and pyasc-plain-base are paired); the others keep the
                # caller's HYBRID_CACHE_DIR (the issue-25 tables serve pyasc-auto from its decisions)
                cache = {"HYBRID_CACHE_DIR": str(work / f"cache-{name}")} if plain else None
                proc, url, log, http = start_pyasc(pyasc_model, target, args.warmup if warm is None else warm, flags,
                                                   source, env=cache, plain=plain)
                stops.append(lambda p=proc: (p.terminate(), p.wait(60)))
                servers[name] = url if args.protocol.startswith("grpc") else http
                chosen[name] = http
                https[name] = http
                pids[name] = proc.pid
                commands[name] = {"kind": "pyasc", "target": target, "warmup": args.warmup if warm is None else warm,
                                  "flags": list(flags), "plain": plain, "log": log}
        order0 = [n for n in names if n in servers]  # the order given (layouts in --triton-layouts' order)

        def decisions(when: str) -> None:
            for name, http in chosen.items():  # what each pyasc server decided (its model statistics)
                doc["decisions"].setdefault(name, {})[when] = decision(http)
                print(f"{name} {when}: {decision_of(http)}", flush=True)

        decisions("at start")
        for name in order0:  # first calls: connections, sessions, allocators; and the answers are right
            load(servers[name], served, 4, 2.0, args.protocol)
            doc["answer_error"][name] = error = answer_error(servers[name], served, args.protocol)
            print(f"{name}: largest |answer - ONNX Runtime's| {error:.3g}", flush=True)
        if args.settle_s and chosen:
            for name in chosen:  # untimed: a server that tunes under the load does it here
                rate, _ = load(servers[name], served, 16, args.settle_s, args.protocol)
                print(f"{name} settling: {rate:.1f} inf/s at 16 clients for {args.settle_s:g} s", flush=True)
        cpu_s = {name: (lambda pid=pid: sum(cpu_by_role(pid).values())) for name, pid in pids.items()}
        if args.settle_s and chosen:  # and what they do once idle (their idle tuning) ends before the rounds
            waited = quiet({name: cpu_s[name] for name in chosen}, args.settle_s)
            print(f"the servers were quiet after {waited:.0f} s idle" if waited is not None else
                  f"the servers still used CPU after {args.settle_s:g} s idle", flush=True)
            decisions("after settling")
        for r in range(args.rounds):
            for n in counts:
                order = order0 if r % 2 == 0 else list(reversed(order0))
                for position, name in enumerate(order):
                    runs = counts_of(https[name])
                    others = {s: f() for s, f in cpu_s.items() if s != name}
                    before, mine = cpu_by_role(pids.get(name)), os.times()
                    every, elapsed = latencies(servers[name], served, n, args.seconds, args.protocol)
                    after, mine_after = cpu_by_role(pids.get(name)), os.times()
                    others_s = {s: round(cpu_s[s]() - v, 3) for s, v in others.items()}
                    runs_after = counts_of(https[name])
                    rate = len(every) / elapsed
                    block: dict[str, Any] = {
                        "round": r, "clients": n, "server": name, "position": position, "inferences": len(every),
                        "seconds": elapsed, "inf_s": rate, "p50_ms": 1e3 * float(np.percentile(every, 50)),
                        "p99_ms": 1e3 * float(np.percentile(every, 99)), "others_cpu_s": others_s}
                    spent = sum(others_s.values())
                    if runs_after[1] > runs[1]:
                        block["rows_per_run"] = (runs_after[0] - runs[0]) / (runs_after[1] - runs[1])
                    if before and after and rate > 0:  # microseconds of CPU per inference
                        per = 1e6 / len(every)
                        block["front_us"] = (after["front end"] - before["front end"]) * per
                        block["compute_us"] = (after["compute"] - before["compute"]) * per
                        block["client_us"] = (mine_after.user + mine_after.system - mine.user - mine.system) * per
                    doc["blocks"].append(block)
                    busy = (f"  (meanwhile the others used {spent:.2f} CPU-s, most {max(others_s, key=others_s.get)})"
                            if spent > 0.05 * elapsed else "")
                    print(f"round {r} clients {n:2d} {name:15s} {rate:7.1f} inf/s  p99 {block['p99_ms']:6.1f} ms"
                          f"{busy}", flush=True)
            if args.json:
                doc["summary"] = summarize(doc["blocks"], counts, order0)
                write_json(args.json, doc)
        decisions("after the rounds")  # a server without --warmup tuned under the load
        doc["summary"] = summarize(doc["blocks"], counts, order0)
        if args.json:
            write_json(args.json, doc)
        print()
        print(tables(doc["summary"], order0))
        if args.write_results is not None:
            name, title = results_section(args.protocol, bool(args.triton_layouts), args.model)
            _results.write_results(args.write_results or name, title, _results.command_line(),
                                   tables(doc["summary"], order0))
        cpu = [b for b in doc["blocks"] if "front_us" in b]
        if cpu:
            print()
            print("| clients | server | front end us/inf | compute us/inf | load generator us/inf | rows per run |")
            print("|---|---|---|---|---|---|")
            for n in counts:
                for s in order0:
                    mine_blocks = [b for b in cpu if b["clients"] == n and b["server"] == s]
                    if mine_blocks:
                        front, compute, client = (statistics.median(b[k] for b in mine_blocks)
                                                  for k in ("front_us", "compute_us", "client_us"))
                        rows = [b["rows_per_run"] for b in doc["blocks"]
                                if b["clients"] == n and b["server"] == s and "rows_per_run" in b]
                        batch = statistics.median(rows) if rows else float("nan")
                        print(f"| {n} | {s} | {front:.0f} | {compute:.0f} | {client:.0f} | {batch:.2f} |")
        rate = {(b["server"], b["clients"], b["round"]): b["inf_s"] for b in doc["blocks"]}
        for new in ("pyasc-ort", "pyasc-plain"):
            if f"{new}-base" in servers and new in servers:
                print()
                for n in counts:  # the change measured against its baseline, paired within each block
                    ratios = [rate[(new, n, r)] / rate[(f"{new}-base", n, r)] for r in range(args.rounds)]
                    print(f"clients {n:2d}: {new} / {new}-base {paired(ratios)}")
    finally:
        for stop in reversed(stops):  # the servers (they export what they hold as they stop), then the sink
            stop()


if __name__ == "__main__":
    main()
