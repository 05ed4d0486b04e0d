"""Scale-out on a real two-raylet Ray cluster (one machine, loopback only): `pyasc serve --ray` deploys two
replicas on the two nodes; the driver's model files are deleted and every replica actor is killed; Serve
restarts them from the models the deployment carries, and they answer correctly over HTTP and gRPC;
SIGTERM drains (queued requests answered, new ones HYB-706) and the command exits 0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tests._serve_ray_cluster import LocalCluster, free_port
from tests._serve_support import poll, tiny_expected, tiny_model

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
tg = pytest.importorskip("tritonclient.grpc")

ROOT = Path(__file__).resolve().parents[1]
APP = "pyasc"


def _repository(root: Path) -> Path:
    """tiny (answers at once) and slow (waits 3 s for its batch to fill: a request stays in flight)."""
    for name, config in (("tiny", None), ("slow", {"max_batch": 64, "batch_timeout": 3.0})):
        (root / name / "1").mkdir(parents=True)
        tiny_model(root / name / "1" / "model.onnx", factor=2.0 if name == "slow" else 1.0)
        if config:
            (root / name / "config.json").write_text(json.dumps(config))
    return root


def _body(seed: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    scale = np.full((2, 1), seed % 7, np.float32)
    doc = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.ravel().tolist()},
                      {"name": "scale", "shape": [2, 1], "datatype": "FP32", "data": scale.ravel().tolist()}]}
    return json.dumps(doc).encode(), x, scale


def _post(url: str, body: bytes, timeout: float = 30.0) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"text": text.decode(errors="replace")}


def _http_answer(base: str, model: str, seed: int, factor: float = 1.0) -> None:
    body, x, scale = _body(seed)
    status, doc = _post(f"{base}/v2/models/{model}/infer", body)
    assert status == 200, doc
    y = np.array(next(o for o in doc["outputs"] if o["name"] == "y")["data"], np.float32).reshape(2, 3)
    np.testing.assert_allclose(y, tiny_expected(x, scale, factor)["y"], rtol=1e-5, atol=1e-5)


def _grpc_answer(client: tg.InferenceServerClient, seed: int) -> None:
    _, x, scale = _body(seed)
    inputs = [tg.InferInput("x", [2, 4], "FP32"), tg.InferInput("scale", [2, 1], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(scale)
    got = client.infer("tiny", inputs, client_timeout=30.0).as_numpy("y")
    np.testing.assert_allclose(got, tiny_expected(x, scale)["y"], rtol=1e-5, atol=1e-5)


def _until(what: str, check, timeout: float, every: float = 0.5):
    """``check()``'s first result that is not False (None counts: an answer checked by asserts); a raise is
    "not yet", and the last one is reported on timeout."""
    last: BaseException | None = None

    def attempt() -> tuple | None:
        nonlocal last
        try:
            result = check()
        except Exception as e:
            last = e
            return None
        return (result,) if result is not False else None  # a one-tuple is true even around None

    got = poll(attempt, timeout, every)
    if got is not None:
        return got[0]
    state = "(no driver)"
    if ray.is_initialized():
        from ray import serve

        state = f"replicas {_replicas()}; {serve.status()}"
    pytest.fail(f"{what} within {timeout} s (last: {last!r}); {state}")


def _replicas() -> list[dict]:
    """The live replica actors: name, actor id, node id (from the GCS's actor table; no dashboard here)."""
    from ray._private.state import actors

    return [{"name": a["Name"], "id": a["ActorID"], "node": a["Address"]["NodeID"]}
            for a in actors(actor_state_name="ALIVE").values()
            if a["ActorClassName"] == f"ServeReplica:{APP}:{APP}-models"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_raylets_replicas_restart_without_the_driver_files_and_sigterm_drains(tmp_path):
    caches = {node: tmp_path / f"cache-{node}" for node in ("head", "worker")}
    proxy = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "hybrid.serve.ray.proxy:middlewares"}
    cluster = LocalCluster(tmp_path, {node: {"PYASC_RAY_CACHE": str(path), **proxy} for node, path in caches.items()})
    serve_proc = None
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        cluster.start()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        signal.signal(signal.SIGTERM, previous_sigterm)  # ray.init's handler would exit pytest
        cluster.wait_nodes(2)
        repo = _repository(tmp_path / "repo")
        http_port, grpc_port = free_port(), free_port()
        base = f"http://127.0.0.1:{http_port}"
        cmd = [sys.executable, str(ROOT / "tests" / "_serve_support.py"), "serve", str(repo), "--ray",
               "--ray-address", cluster.address, "--replicas", "2", "--replica-cpus", "1", "--port", str(http_port),
               "--grpc-port", str(grpc_port), "--ray-proxy-location", "HeadOnly", "--target", "onnxruntime",
               "--max-batch", "8"]
        serve_proc = subprocess.Popen(cmd, cwd=ROOT, env=cluster.env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(serve_proc.stdout), daemon=True)
        reader.start()

        def ready() -> bool:  # answering, and deployed: replicas killed while Serve still deploys fail the deploy
            if serve_proc.poll() is not None:
                pytest.fail(f"pyasc serve --ray exited {serve_proc.returncode}:\n{''.join(output)}")
            return _post(f"{base}/v2/models/tiny/infer", _body(0)[0], 5)[0] == 200 and \
                any("serving on Ray Serve" in line for line in list(output))

        _until("pyasc serve --ray answers and says it serves", ready, 150)

        def spread() -> list[dict] | bool:
            found = _replicas()
            return found if len(found) == 2 and len({a["node"] for a in found}) == 2 else False

        first = _until("two replicas running, one per raylet", spread, 60)
        for seed in range(6):
            _http_answer(base, "tiny", seed)
        client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert client.is_server_live() and client.is_server_ready()
        _grpc_answer(client, 1)
        for path in caches.values():  # each node checked and cached both models' files
            assert len(list(path.glob("*.onnx"))) == 2, list(path.iterdir())

        # the driver's files go, and every node's cache: restarted replicas load what the deployment carries
        shutil.rmtree(repo)
        for path in caches.values():
            shutil.rmtree(path)
        for actor in first:
            ray.kill(ray.get_actor(actor["name"], namespace="serve"), no_restart=True)
        killed = {a["id"] for a in first}

        def restarted() -> bool:  # alive actors, one per node, and both constructed (Serve's RUNNING)
            from ray import serve

            fresh = _replicas()
            running = serve.status().applications[APP].deployments[f"{APP}-models"].replica_states
            return len(fresh) == 2 and not killed & {a["id"] for a in fresh} and \
                len({a["node"] for a in fresh}) == 2 and running == {"RUNNING": 2}

        _until("Serve restarted both replicas, one per node", restarted, 120)
        for seed in range(6, 12):
            _until("HTTP answers after the restart", lambda s=seed: _http_answer(base, "tiny", s), 60)
        _until("gRPC answers after the restart", lambda: _grpc_answer(client, 2), 60)
        _until("each node cached both files again",  # checked and written by the restarted replicas
               lambda: all(len(list(path.glob("*.onnx"))) == 2 for path in caches.values()), 30)
        client.close()

        # SIGTERM: the request queued on 'slow' (3 s batch timeout) is answered, new ones get HYB-706
        queued: list[tuple[int, dict]] = []
        body, x, scale = _body(3)
        sender = threading.Thread(target=lambda: queued.append(_post(f"{base}/v2/models/slow/infer", body, 60)))
        sender.start()
        time.sleep(1.0)  # real time: the request reaches the replica on another node and waits in its batch
        serve_proc.send_signal(signal.SIGTERM)
        refused: list[tuple[int, dict]] = []
        deadline = time.monotonic() + 30
        while serve_proc.poll() is None and time.monotonic() < deadline:
            try:
                status, doc = _post(f"{base}/v2/models/tiny/infer", _body(4)[0], 5)
            except OSError:
                continue
            if status != 200:
                refused.append((status, doc))
            time.sleep(0.02)  # real time: requests paced over the drain of a real cluster
        assert serve_proc.wait(60) == 0, "".join(output)
        sender.join(30)
        assert queued and queued[0][0] == 200, queued
        y = np.array(next(o for o in queued[0][1]["outputs"] if o["name"] == "y")["data"], np.float32)
        np.testing.assert_allclose(y.reshape(2, 3), tiny_expected(x, scale, 2.0)["y"], rtol=1e-5, atol=1e-5)
        assert any(s == 503 and d.get("code") == "HYB-706" for s, d in refused), refused[:5]
        # every refusal carries a HYB code: 503 HYB-706 from a draining replica, or (Serve's own 404 once the
        # application is gone, rewritten by the proxy middleware) 404 HYB-701
        assert all((s, d.get("code")) in ((503, "HYB-706"), (404, "HYB-701")) for s, d in refused), refused[:5]
        # the application is deleted (and Serve shut down, no other application being left): no replica lives
        _until("no replica left", lambda: not _replicas(), 30)
    finally:
        if serve_proc is not None and serve_proc.poll() is None:
            serve_proc.kill()
        try:
            ray.shutdown()
        finally:
            signal.signal(signal.SIGTERM, previous_sigterm)
            cluster.stop()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_token_cluster_takes_pyasc_serve_with_ray_auth_token(tmp_path):
    """Both raylets in Ray's token mode; `pyasc serve --ray --ray-auth-token` (no token in its environment or
    home) joins, serves, and drains to exit 0."""
    token = "pyasc-test-token-" + "0123456789abcdef" * 2
    node = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    cluster = LocalCluster(tmp_path, {"head": node, "worker": node})
    serve_proc = None
    try:
        cluster.start()
        tiny = tiny_model(tmp_path / "tiny.onnx")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
        env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token to fall back on
        cmd = [sys.executable, str(ROOT / "tests" / "_serve_support.py"), "serve", str(tiny), "--ray",
               "--ray-address", cluster.address, "--ray-auth-token", token, "--port", str(port), "--grpc-port", "0",
               "--replica-cpus", "0.5", "--ray-proxy-location", "HeadOnly", "--target", "onnxruntime"]
        serve_proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)

        def answers() -> bool:
            if serve_proc.poll() is not None:
                pytest.fail(f"pyasc serve --ray exited {serve_proc.returncode}:\n{serve_proc.stdout.read()}")
            _http_answer(f"http://127.0.0.1:{port}", "tiny", 5)
            return True

        _until("pyasc serve --ray on a token cluster answers", answers, 120)
        serve_proc.send_signal(signal.SIGTERM)
        assert serve_proc.wait(60) == 0
    finally:
        if serve_proc is not None and serve_proc.poll() is None:
            serve_proc.kill()
        cluster.stop()
