"""gRPC vs HTTP binary throughput, and the faults a Triton-style deployment meets, against ``pyasc serve``.

The server is ``pyasc serve`` (its command function, in its own process, HTTP and gRPC on free loopback
ports, onnxruntime on the CPU, ``--max-batch 8 --batch-timeout 0.005``) over a repository built here:

- ``squeezenet``: ONNX's light SqueezeNet made batch-dynamic (``hybrid.zoo.samples.light_model_batch_dynamic``);
- ``tiny``: y = (x @ W) * scale, s = sum(x) with a batch dim, so every answer can be checked against its
  own request (a misrouted answer would not match);
- ``poison``: a Gather whose run raises (ONNX Runtime: index out of bounds) for a request whose index
  is out of range, while the requests batched with it are valid.

Load comes from the unmodified tritonclient asyncio clients (``tritonclient.grpc.aio``,
``tritonclient.http.aio``), one client (one connection) per virtual user.

1. Throughput: 16 users on ``squeezenet``, gRPC (raw contents) and HTTP (binary tensors) phases
   interleaved (order alternating by round); requests per second per phase, the ratio gRPC / HTTP of
   the sums, every answer checked against a local run of its input.
2. The fault table: for each fault, requests sent / answered / failed by status, lost (no answer and no
   status within 60 s), misrouted (an answer that does not match its own request), the server alive
   after (``is_server_live`` over gRPC), the server's RSS before/after:

   - ``grpc disconnects``: gRPC calls whose client deadline (5-50 ms) expires while they are queued or
     running, mixed with normal calls; and streams cancelled after their first answer;
   - ``10x connections``: 160 concurrent gRPC connections (10x the 16 users of the throughput run, 20x
     the batch size) sending 3 requests each;
   - ``poison in a batch``: 16 users, one request in 8 raises in the model;
   - ``SIGTERM under load``: 16 gRPC + 16 HTTP users in a loop on ``squeezenet``; SIGTERM after 3 s;
     each user stops at its first refusal; reported: answered, refused with which status, the requests
     in flight at the signal (sent before, ended after) and how many of them were answered, the exit
     code of the server.

Run: ``flock /tmp/bench.lock python benchmarks/serving_grpc.py [--rounds 3] [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
import _results
from _harness import machine_info, table

USERS = 16
SERVER = ("import sys; from hybrid.cli.serve import serve; "
          "serve([sys.argv[1]], port=int(sys.argv[2]), grpc_port=int(sys.argv[3]), target='onnxruntime', "
          "max_batch=8, batch_timeout=0.005, log_level='warning')")
LOST = "lost (no answer in 60 s)"
W = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5.0) / 7.0


# ------------------------------------------------------------------------------------------------ models
def build_repository(root: Path) -> Path:
    from hybrid.zoo.samples import light_model_batch_dynamic

    repo = root / "repo"
    for name in ("squeezenet", "tiny", "poison"):
        (repo / name / "1").mkdir(parents=True)
    onnx.save(light_model_batch_dynamic("squeezenet"), repo / "squeezenet" / "1" / "model.onnx")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    scale = helper.make_tensor_value_info("scale", TensorProto.FLOAT, ["N", 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", 1])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Mul", ["xw", "scale"], ["y"]),
         helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=1)], "tiny", [x, scale], [y, s],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.array([1], np.int64), "ax")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              repo / "tiny" / "1" / "model.onnx")
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["N", 1])
    g = helper.make_tensor_value_info("g", TensorProto.FLOAT, ["N", 1, 4])
    table_ = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "i"], ["g"], axis=0)], "poison", [i], [g],
                              [table_])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              repo / "poison" / "1" / "model.onnx")
    return repo


# ------------------------------------------------------------------------------------------------ server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, repo: Path) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(repo), str(self.http_port),
                                      str(self.grpc_port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.http, self.grpc = f"127.0.0.1:{self.http_port}", f"127.0.0.1:{self.grpc_port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://{self.http}/v2/health/ready", timeout=2)
                return
            except OSError:
                time.sleep(0.3)
        self.proc.kill()
        raise RuntimeError("server did not start")

    def rss_mb(self) -> float:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024

    def metric(self, name: str, model: str) -> float:
        text = urllib.request.urlopen(f"http://{self.http}/metrics", timeout=30).read().decode()
        m = re.search(rf'^{name}{{model="{model}",version="1"}} ([0-9.e+]+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


# ------------------------------------------------------------------------------------------------ clients
def clients():
    import tritonclient.grpc.aio as tga
    import tritonclient.http.aio as tha

    return tga, tha


def tiny_request(mod, seed: int, binary: bool = True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1 + seed % 3, 4)).astype(np.float32)
    scale = rng.uniform(0.5, 2, (len(x), 1)).astype(np.float32)
    ins = [mod.InferInput("x", list(x.shape), "FP32"), mod.InferInput("scale", list(scale.shape), "FP32")]
    for inp, arr in zip(ins, (x, scale)):
        if "http" in mod.__name__:
            inp.set_data_from_numpy(arr, binary_data=binary)
        else:
            inp.set_data_from_numpy(arr)
    return ins, (x @ W) * scale


def status_of(e: BaseException) -> str:
    from tritonclient.utils import InferenceServerException

    if isinstance(e, asyncio.TimeoutError):
        return LOST
    if isinstance(e, InferenceServerException):
        code = re.search(r"\[(HYB-\d+)\]", e.message() or "")
        status = e.status() or ""
        status = status.replace("StatusCode.", "")
        return f"{status} {code.group(1) if code else (e.message() or '')[:40]}".strip()
    if type(e).__name__ == "ClientConnectorError":  # aiohttp: the listening socket is closed
        return "connection refused (HTTP listener closed)"
    return f"{type(e).__name__}: {str(e)[:60]}"


class Tally:
    def __init__(self) -> None:
        self.sent = self.answered = self.misrouted = 0
        self.failed: collections.Counter[str] = collections.Counter()

    async def run(self, call, check=None) -> bool:
        """Await one call and tally its outcome; True when it was answered."""
        self.sent += 1
        try:
            result = await asyncio.wait_for(call, 60)
        except Exception as e:  # every outcome is tallied
            self.failed[status_of(e)] += 1
            return False
        self.answered += 1
        if check is not None and not check(result):
            self.misrouted += 1
        return True

    @property
    def lost(self) -> int:
        return self.failed.get(LOST, 0) + self.sent - self.answered - sum(self.failed.values())

    def failures(self) -> str:
        return ", ".join(f"{n} {k}" for k, n in self.failed.most_common()) or "0"


# ------------------------------------------------------------------------------------------------ throughput
async def phase(kind: str, srv: Server, seconds: float, x: list[np.ndarray], expected: list[np.ndarray]) -> tuple:
    tga, tha = clients()
    mod = tga if kind == "grpc" else tha
    users = [mod.InferenceServerClient(srv.grpc if kind == "grpc" else srv.http) for _ in range(USERS)]
    done = bad = 0
    stop = time.perf_counter() + seconds

    async def user(k: int) -> None:
        nonlocal done, bad
        inp = mod.InferInput("data_0", list(x[k].shape), "FP32")
        if kind == "grpc":
            inp.set_data_from_numpy(x[k])
            out = [mod.InferRequestedOutput("softmaxout_1")]
        else:
            inp.set_data_from_numpy(x[k], binary_data=True)
            out = [mod.InferRequestedOutput("softmaxout_1", binary_data=True)]
        while time.perf_counter() < stop:
            r = await users[k].infer("squeezenet", [inp], outputs=out)
            done += 1
            if not np.allclose(r.as_numpy("softmaxout_1"), expected[k], rtol=1e-4, atol=1e-6):
                bad += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(user(k) for k in range(USERS)))
    elapsed = time.perf_counter() - t0
    for c in users:
        await c.close()
    return done, elapsed, bad


def throughput(srv: Server, rounds: int, seconds: float) -> list[list]:
    import hybrid
    from hybrid.zoo.samples import light_input

    base = light_input()
    x = [(base * (0.5 + k / USERS)).astype(np.float32) for k in range(USERS)]
    cm = hybrid.compile(str(srv.repo / "squeezenet" / "1" / "model.onnx"), target="onnxruntime")
    expected = [cm.run({"data_0": v})["softmaxout_1"] for v in x]
    for kind in ("grpc", "http"):  # warm-up, not counted: connections, thread pools, the model's first runs
        asyncio.run(phase(kind, srv, 1.0, x, expected))
    totals = {"grpc": [0, 0.0, 0], "http binary": [0, 0.0, 0]}
    per_round = []
    for r in range(rounds):
        order = ["grpc", "http binary"] if r % 2 == 0 else ["http binary", "grpc"]
        rates = {}
        for kind in order:
            done, elapsed, bad = asyncio.run(phase("grpc" if kind == "grpc" else "http", srv, seconds, x, expected))
            totals[kind][0] += done
            totals[kind][1] += elapsed
            totals[kind][2] += bad
            rates[kind] = done / elapsed
            time.sleep(0.5)
        per_round.append(rates["grpc"] / rates["http binary"])
    rows = [[kind, n, f"{n / t:.1f}", bad] for kind, (n, t, bad) in totals.items()]
    ratio = (totals["grpc"][0] / totals["grpc"][1]) / (totals["http binary"][0] / totals["http binary"][1])
    rows.append(["gRPC / HTTP", "", f"{ratio:.2f}x", f"per round {', '.join(f'{v:.2f}' for v in per_round)}"])
    return rows


# ------------------------------------------------------------------------------------------------ faults
async def live(srv: Server) -> bool:
    tga, _ = clients()
    c = tga.InferenceServerClient(srv.grpc)
    try:
        return bool(await c.is_server_live())
    except Exception:
        return False
    finally:
        await c.close()


async def fault_disconnects(srv: Server) -> Tally:
    tga, _ = clients()
    from hybrid.zoo.samples import light_input

    tally = Tally()
    pool = [tga.InferenceServerClient(srv.grpc) for _ in range(8)]
    x = light_input()
    calls = []
    for k in range(240):
        if k % 3 == 0:  # a normal call, checked
            ins, expected = tiny_request(tga, k)
            calls.append(tally.run(pool[k % 8].infer("tiny", ins),
                                   lambda r, e=expected: np.allclose(r.as_numpy("y"), e, rtol=1e-5, atol=1e-6)))
        else:  # a squeezenet call whose deadline expires while it is queued or running
            inp = tga.InferInput("data_0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            calls.append(tally.run(pool[k % 8].infer("squeezenet", [inp], client_timeout=(0.005, 0.02, 0.05)[k % 3])))
    await asyncio.gather(*calls)

    async def stream(k: int) -> None:  # a stream cancelled by its client after its first answer
        ins, expected = tiny_request(tga, 1000 + k)
        yielded = 0

        async def requests():
            nonlocal yielded
            for j in range(8):
                yielded += 1
                yield {"model_name": "tiny", "inputs": ins, "request_id": f"{k}-{j}"}
                await asyncio.sleep(0.002)

        responses = pool[k % 8].stream_infer(requests())
        answered = 0
        try:
            async for result, error in responses:
                if error is not None:
                    tally.failed[status_of(error)] += 1
                else:
                    answered += 1
                    if not np.allclose(result.as_numpy("y"), expected, rtol=1e-5, atol=1e-6):
                        tally.misrouted += 1
                break
        finally:
            responses.cancel()
        tally.sent += yielded
        tally.answered += answered
        tally.failed["stream cancelled by its client"] += yielded - answered

    await asyncio.wait_for(asyncio.gather(*(stream(k) for k in range(20))), 60)
    for c in pool:
        await c.close()
    return tally


async def fault_connections(srv: Server, connections: int = 160) -> Tally:
    tga, _ = clients()
    tally = Tally()
    pool = [tga.InferenceServerClient(srv.grpc) for _ in range(connections)]

    async def user(k: int) -> None:
        for j in range(3):
            ins, expected = tiny_request(tga, k * 3 + j)
            await tally.run(pool[k].infer("tiny", ins),
                            lambda r, e=expected: np.allclose(r.as_numpy("y"), e, rtol=1e-5, atol=1e-6))

    await asyncio.gather(*(user(k) for k in range(connections)))
    for c in pool:
        await c.close()
    return tally


async def fault_poison(srv: Server) -> tuple[Tally, Tally]:
    tga, _ = clients()
    good, poisoned = Tally(), Tally()
    pool = [tga.InferenceServerClient(srv.grpc) for _ in range(USERS)]

    async def user(k: int) -> None:
        for j in range(8):
            bad = (k + j) % 8 == 0
            idx = np.array([[20 if bad else (k + j) % 10]], np.int64)
            inp = tga.InferInput("i", [1, 1], "INT64")
            inp.set_data_from_numpy(idx)
            expected = np.arange(40, dtype=np.float32).reshape(10, 4)[idx[:, 0] % 10][:, None, :]
            await (poisoned if bad else good).run(pool[k].infer("poison", [inp]),
                                                  lambda r, e=expected: np.array_equal(r.as_numpy("g"), e))

    await asyncio.gather(*(user(k) for k in range(USERS)))
    for c in pool:
        await c.close()
    return good, poisoned


async def load_until_refused(srv: Server, sigterm_after: float, x: list[np.ndarray],
                             expected: list[np.ndarray]) -> tuple[Tally, int, list[int]]:
    tga, tha = clients()
    tally = Tally()
    answered_after = 0
    in_flight = [0, 0]  # sent before the signal and ended after it: [answered, all]
    signalled = asyncio.Event()

    async def user(k: int) -> None:
        nonlocal answered_after
        mod = tga if k % 2 else tha
        c = mod.InferenceServerClient(srv.grpc if k % 2 else srv.http)
        try:
            inp = mod.InferInput("data_0", list(x[k].shape), "FP32")
            if k % 2:
                inp.set_data_from_numpy(x[k])
            else:
                inp.set_data_from_numpy(x[k], binary_data=True)
            for _ in range(10_000):
                was_signalled = signalled.is_set()
                refused = not await tally.run(c.infer("squeezenet", [inp]), lambda r, e=expected[k]: np.allclose(
                    r.as_numpy("softmaxout_1"), e, rtol=1e-4, atol=1e-6))
                if signalled.is_set() and not was_signalled:
                    in_flight[0] += not refused
                    in_flight[1] += 1
                if refused:
                    return  # this user stops at its first refusal
                if was_signalled:
                    answered_after += 1
        finally:
            with contextlib.suppress(Exception):
                await c.close()

    async def terminate() -> None:
        await asyncio.sleep(sigterm_after)
        srv.proc.send_signal(signal.SIGTERM)
        signalled.set()

    await asyncio.gather(terminate(), *(user(k) for k in range(2 * USERS)))
    return tally, answered_after, in_flight


def fault_table(repo: Path) -> list[list]:
    rows = []
    srv = Server(repo)
    srv.repo = repo
    try:
        for name, run in (("grpc disconnects (deadlines 5-50 ms, streams cancelled)", fault_disconnects),
                          ("10x connections (160 gRPC channels x 3 requests)", fault_connections)):
            rss0 = srv.rss_mb()
            tally = asyncio.run(run(srv))
            rows.append([name, tally.sent, tally.answered, tally.failures(), tally.lost, tally.misrouted,
                         asyncio.run(live(srv)), f"{rss0:.0f} -> {srv.rss_mb():.0f}"])
        rss0 = srv.rss_mb()
        good, poisoned = asyncio.run(fault_poison(srv))
        rows.append(["poison in a batch: valid requests", good.sent, good.answered, good.failures(), good.lost,
                     good.misrouted, asyncio.run(live(srv)), f"{rss0:.0f} -> {srv.rss_mb():.0f}"])
        rows.append(["poison in a batch: poisoned requests", poisoned.sent, poisoned.answered,
                     poisoned.failures(), poisoned.lost, poisoned.misrouted, "", ""])
        success, failure = srv.metric("nv_inference_request_success", "tiny"), \
            srv.metric("nv_inference_request_failure", "tiny")
        rows.append(["(server's tiny counters so far)", "", f"success {success:.0f}", f"failure {failure:.0f}",
                     "", "", "", ""])
    finally:
        srv.stop()
    import hybrid
    from hybrid.zoo.samples import light_input

    x = [(light_input() * (0.5 + k / (2 * USERS))).astype(np.float32) for k in range(2 * USERS)]
    cm = hybrid.compile(str(repo / "squeezenet" / "1" / "model.onnx"), target="onnxruntime")
    expected = [cm.run({"data_0": v})["softmaxout_1"] for v in x]
    srv = Server(repo)
    rss0 = srv.rss_mb()
    tally, answered_after, in_flight = asyncio.run(load_until_refused(srv, 3.0, x, expected))
    try:  # the load sent the SIGTERM: wait for the drain to end (a second signal would cut it short)
        code = srv.proc.wait(90)
    except subprocess.TimeoutExpired:
        code = srv.stop()
    rows.append([f"SIGTERM under load (squeezenet, 16 gRPC + 16 HTTP users; in flight at the signal: {in_flight[0]} of "
                 f"{in_flight[1]} answered; {answered_after} sent after it answered)",
                 tally.sent, tally.answered, tally.failures(), tally.lost, tally.misrouted, f"exit {code}",
                 f"{rss0:.0f} -> (exited)"])
    return rows


async def soak(srv: Server, seconds: float) -> tuple[Tally, list[tuple[float, float]]]:
    """16 users for ``seconds``: gRPC and HTTP calls, one in four with a deadline that expires (a
    disconnect), every answer checked; the server's RSS sampled every 5 s."""
    tga, tha = clients()
    tally = Tally()
    samples: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    stop = t0 + seconds

    async def sample() -> None:
        while time.perf_counter() < stop:
            samples.append((time.perf_counter() - t0, srv.rss_mb()))
            await asyncio.sleep(5)
        samples.append((time.perf_counter() - t0, srv.rss_mb()))

    async def user(k: int) -> None:
        mod = tga if k % 2 else tha
        c = mod.InferenceServerClient(srv.grpc if k % 2 else srv.http)
        j = 0
        try:
            while time.perf_counter() < stop:
                j += 1
                ins, expected = tiny_request(mod, k * 1_000_000 + j)
                timeout = {"client_timeout": 0.002} if j % 4 == 0 else {}
                if timeout and mod is tha:
                    timeout = {"timeout": 1}  # HTTP: the server's own deadline (1 us): a refusal, not a hang
                await tally.run(c.infer("tiny", ins, **timeout),
                                lambda r, e=expected: np.allclose(r.as_numpy("y"), e, rtol=1e-5, atol=1e-6))
        finally:
            with contextlib.suppress(Exception):
                await c.close()

    await asyncio.gather(sample(), *(user(k) for k in range(USERS)))
    return tally, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--skip-faults", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--soak", type=float, default=0.0, help="seconds of soak with RSS sampled (0: none)")
    _results.add_argument(parser, "serving_grpc")
    args = parser.parse_args()
    print(machine_info())
    parts = []  # each part's heading and table, printed as it ends and written together with --write-results
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_repository(Path(tmp))
        if not args.skip_throughput:
            srv = Server(repo)
            srv.repo = repo
            try:
                rows = throughput(srv, args.rounds, args.seconds)
            finally:
                srv.stop()
            parts.append(f"Throughput, squeezenet (batch-dynamic, --max-batch 8), {USERS} users, {args.rounds} rounds "
                         f"of {args.seconds:g} s per protocol, interleaved\n\n"
                         + table(["protocol", "requests", "req/s", "bad answers"], rows))
            print("\n" + parts[-1])
        if not args.skip_faults:
            rows = fault_table(repo)
            parts.append("Faults\n\n" + table(["fault", "sent", "answered", "failed (status)", "lost", "misrouted",
                                               "alive after", "RSS MB"], rows))
            print("\n" + parts[-1])
        if args.soak:
            srv = Server(repo)
            try:
                tally, samples = asyncio.run(soak(srv, args.soak))
                alive = asyncio.run(live(srv))
            finally:
                srv.stop()
            warm = next((mb for t, mb in samples if t >= 10), samples[0][1])
            parts.append(f"Soak, {args.soak:g} s, {USERS} users (gRPC and HTTP, one call in four cut by a deadline)\n\n"
                         + table(["sent", "answered", "failed (status)", "lost", "misrouted", "alive after",
                                  "RSS MB at 10 s", "RSS MB at end", "max", "end / 10 s"],
                                 [[tally.sent, tally.answered, tally.failures(), tally.lost, tally.misrouted, alive,
                                   f"{warm:.0f}", f"{samples[-1][1]:.0f}", f"{max(mb for _, mb in samples):.0f}",
                                   f"{samples[-1][1] / warm:.3f}"]]))
            print("\n" + parts[-1])
    if args.write_results:
        _results.write_results(args.write_results, "Serving over gRPC, and faults (issue 15)", _results.command_line(),
                               "\n\n".join(parts))


if __name__ == "__main__":
    main()
