"""Safety rules of the server, one test each: body limit (also after decompression), shapes, JSON, auth,
names that try to leave the repository, backpressure, timeouts, and the graceful drain on shutdown."""

from __future__ import annotations

import concurrent.futures as cf
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from tests._serve_support import connection, error_of, request, tiny_expected, tiny_model, v2_json, wait_for

from hybrid.errors import ServingError
from hybrid.serve import BackgroundServer, Limits, ServeOptions, build_registry, create_app, discover

pytestmark = pytest.mark.timeout(180)

LIMIT = 1 << 20


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("safety") / "tiny.onnx")


def start(model_path, overrides=None, **options):
    registry = build_registry([model_path], target="onnxruntime", overrides=overrides)
    return BackgroundServer(create_app(registry, ServeOptions(**options))).start()


def hold_first_batch(srv, seconds=60.0, entered: threading.Event | None = None):
    """Make the served model's first batch wait (for ``release.set()`` or ``seconds``): a lone request on
    an idle model runs at once, so the requests sent after it queue behind it. ``entered`` is set when
    that batch reaches the runner."""
    (model,) = list(srv.server.state.registry)
    release, run, first = threading.Event(), model.compiled.run_checked, [True]

    def held(feeds):
        if first[0]:
            first[0] = False
            if entered is not None:
                entered.set()
            release.wait(seconds)
        return run(feeds)

    model.compiled.run_checked = held
    return release


@pytest.fixture(scope="module")
def server(model_path):
    srv = start(model_path, limits=Limits(max_body=LIMIT, max_json_depth=16))
    try:
        yield srv
    finally:
        srv.stop()


def feeds(seed: int, rows: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, 4)).astype(np.float32),
            "scale": rng.standard_normal((rows, 1)).astype(np.float32)}


def check_answer(status: int, body: bytes, sent: dict[str, np.ndarray]) -> None:
    assert status == 200, body
    out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in json.loads(body)["outputs"]}
    want = tiny_expected(sent["x"], sent["scale"])
    np.testing.assert_allclose(out["y"], want["y"], rtol=1e-5, atol=1e-5)


def infer(url: str, sent: dict[str, np.ndarray], headers=None, path="/v2/models/tiny/infer"):
    return request(url, "POST", path, v2_json(sent), headers)


# ------------------------------------------------------------------------------------------------ body size
def test_oversized_body_is_413_by_content_length_and_by_stream(server):
    big = b'{"inputs": [], "pad": "' + b"a" * LIMIT + b'"}'
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", big)
    assert status == 413 and error_of(body) == "HYB-704"
    with connection(server.url) as conn:  # chunked: no Content-Length to refuse up front
        conn.request("POST", "/v2/models/tiny/infer", body=iter([big[i:i + 65536] for i in range(0, len(big), 65536)]),
                     encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413 and error_of(resp.read()) == "HYB-704"
    status, _, body = infer(server.url, feeds(0))  # still serving
    check_answer(status, body, feeds(0))


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_limit_applies_after_decompression(server, encoding):
    bomb_plain = b'{"inputs": [], "pad": "' + b"0" * (64 * LIMIT) + b'"}'
    bomb = gzip.compress(bomb_plain) if encoding == "gzip" else zlib.compress(bomb_plain)
    assert len(bomb) < LIMIT // 4
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", bomb, {"Content-Encoding": encoding})
    assert status == 413 and error_of(body) == "HYB-704"
    ok = v2_json(feeds(1))
    packed = gzip.compress(ok) if encoding == "gzip" else zlib.compress(ok)
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", packed, {"Content-Encoding": encoding})
    check_answer(status, body, feeds(1))
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", packed[:-8], {"Content-Encoding": encoding})
    assert status == 400 and error_of(body) == "HYB-702"
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", ok, {"Content-Encoding": "br"})
    assert status == 400 and error_of(body) == "HYB-702"


# ------------------------------------------------------------------------------------------------ content
def test_overflowing_and_negative_shapes_are_400_before_allocation(server):
    header = {"inputs": [{"name": "x", "shape": [1 << 31, 1 << 31, 1 << 31], "datatype": "FP32",
                          "parameters": {"binary_data_size": 16}}, ]}
    head = json.dumps(header).encode()
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", head + bytes(16),
                              {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and error_of(body) == "HYB-702" and b"exceeds" in body
    for shape in ([1 << 16, 1 << 16], [-1, 4], [1, "4"]):
        doc = {"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": [0.0]}]}
        status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", json.dumps(doc).encode())
        assert status == 400 and error_of(body) == "HYB-702", shape
    head = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 12}}]}).encode()
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", head + bytes(12),
                              {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and error_of(body) == "HYB-702" and b"needs 16" in body


def test_bad_json_and_nesting_are_400(server):
    deep = b'{"inputs": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    for bad in (b"{nope", b"", b"\xff\xfe", b"[" * 50 + b"]" * 50, deep):
        status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", bad)
        assert status == 400 and error_of(body) == "HYB-702", bad[:20]
    status, _, body = request(server.url, "POST", "/v2/models/tiny/infer", b"{}",
                              {"Inference-Header-Content-Length": "many"})
    assert status == 400 and error_of(body) == "HYB-702"


# ------------------------------------------------------------------------------------------------ auth
def test_bearer_token_guards_everything_but_liveness(model_path):
    srv = start(model_path, auth_token="s3cret")
    try:
        for path in ("/v2", "/v2/health/ready", "/v2/models/tiny", "/v2/models/tiny/ready", "/metrics"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                status, resp_headers, body = request(srv.url, "GET", path, headers=headers)
                assert status == 401 and error_of(body) == "HYB-703", (path, headers)
                assert resp_headers["www-authenticate"] == "Bearer"
            assert request(srv.url, "GET", path, headers={"Authorization": "Bearer s3cret"})[0] == 200
        status, _, body = infer(srv.url, feeds(2), {"Authorization": "Bearer nope"})
        assert status == 401 and error_of(body) == "HYB-703"
        status, _, body = infer(srv.url, feeds(2), {"Authorization": "Bearer s3cret"})
        check_answer(status, body, feeds(2))
        assert request(srv.url, "GET", "/v2/health/live")[0] == 200
        import tritonclient.http as th

        c = th.InferenceServerClient(srv.url)
        try:
            assert c.is_server_ready(headers={"Authorization": "Bearer s3cret"})
            assert not c.is_server_ready()
        finally:
            c.close()
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------------ names
@pytest.mark.parametrize("path", ["/v2/models/../ready", "/v2/models/..", "/v2/models/.hidden/ready",
                                  "/v2/models/..%2F..%2Fetc%2Fpasswd/ready", "/v2/models/%2e%2e/infer",
                                  "/v2/models/tiny/versions/..%2F1/ready", "/v2/models/tiny/versions/01",
                                  "/v2/models/a%00b"])
def test_traversal_names_are_refused(server, path):
    method = "POST" if path.endswith("infer") else "GET"
    status, _, body = request(server.url, method, path, b"{}" if method == "POST" else None)
    assert status in (400, 404) and error_of(body) in ("HYB-701", "HYB-702")
    assert b"root:" not in body


def test_repository_links_cannot_leave_the_repository(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    tiny_model(outside / "model.onnx")
    repo = tmp_path / "repo"
    (repo / "ok" / "1").mkdir(parents=True)
    tiny_model(repo / "ok" / "1" / "model.onnx")
    assert [s.name for s in discover([repo])] == ["ok"]
    (repo / "linked" / "1").mkdir(parents=True)
    (repo / "linked" / "1" / "model.onnx").symlink_to(outside / "model.onnx")
    with pytest.raises(ServingError, match="outside the repository") as info:
        discover([repo])
    assert info.value.code == "HYB-707"
    (repo / "linked" / "1" / "model.onnx").unlink()
    (repo / "linked" / "1").rmdir()
    (repo / "linked" / "1").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ServingError, match="outside the repository"):
        discover([repo])
    (repo / "linked" / "1").unlink()
    (repo / "linked").rmdir()
    (repo / "bad name").mkdir()
    with pytest.raises(ServingError, match="invalid model name"):
        discover([repo])


# ------------------------------------------------------------------------------------------------ load
def test_backpressure_rejects_with_503_and_stays_live(model_path):
    # the first batch is held in the runner: 4 requests fill the queue behind it, the rest are turned away
    srv = start(model_path, overrides={"max_batch": 64, "batch_timeout": 1.5, "max_queue": 4})
    entered = threading.Event()
    release = hold_first_batch(srv, entered=entered)
    try:
        with cf.ThreadPoolExecutor(12) as pool:
            first = pool.submit(infer, srv.url, feeds(100))
            assert entered.wait(30), "the first request never reached the runner"
            rest = [pool.submit(infer, srv.url, feeds(100 + i)) for i in range(1, 12)]
            refused = 11 - 4  # the queue holds 4 behind the held batch
            wait_for(lambda: sum(f.done() for f in rest) >= refused, "the requests past the queue to be refused",
                     limit=30, every=0.01)
            release.set()
            results = [(0, first.result())] + [(i, f.result()) for i, f in enumerate(rest, 1)]
        codes = []
        for i, (status, headers, body) in results:
            if status == 200:
                check_answer(status, body, feeds(100 + i))
            else:
                assert status == 503 and headers["retry-after"] == "1"
                codes.append(error_of(body))
        assert codes and set(codes) == {"HYB-705"}
        assert 12 - len(codes) >= 4
        assert request(srv.url, "GET", "/v2/health/live")[0] == 200
        assert request(srv.url, "GET", "/v2/health/ready")[0] == 200
        status, _, body = infer(srv.url, feeds(7))
        check_answer(status, body, feeds(7))
        metrics = request(srv.url, "GET", "/metrics")[2].decode()
        assert re.search(r'pyasc_inference_failures_total\{code="HYB-705",model="tiny",version="1"\} ' +
                         f"{len(codes)}.0", metrics)
        # Triton counts a request its full queue turned away nowhere (tritonserver 2.51: "Exceeds maximum
        # queue size", no failure): only the answered ones, as successes
        assert triton_failures(metrics) == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
        assert f'nv_inference_request_success{{model="tiny",version="1"}} {12 - len(codes) + 1}.0' in metrics
    finally:
        srv.stop()


def triton_failures(metrics: str) -> dict[str, int]:
    """``nv_inference_request_failure`` of the tiny model by reason, from /metrics' text."""
    return {m.group(1): int(float(m.group(2))) for m in re.finditer(
        r'^nv_inference_request_failure\{model="tiny",reason="([A-Z]+)",version="1"\} ([0-9.e+]+)$', metrics, re.M)}


def test_request_timeout_is_504(model_path):
    srv = start(model_path, overrides={"max_batch": 64, "batch_timeout": 20.0, "request_timeout": 0.2})
    release = hold_first_batch(srv)
    try:
        status, _, body = infer(srv.url, feeds(3))
        assert status == 504 and error_of(body) == "HYB-411"
        # a request whose time ran out once the model had it: Triton's REJECTED (its queue's timeout)
        assert triton_failures(request(srv.url, "GET", "/metrics")[2].decode())["REJECTED"] == 1
    finally:
        release.set()
        srv.stop()


def test_a_failed_run_counts_as_a_backend_failure(model_path):
    srv = start(model_path, overrides={"max_batch": 0})
    (model,) = list(srv.server.state.registry)

    def broken(feeds):
        raise RuntimeError("the runtime failed")

    model.compiled.run_checked = broken
    try:
        status, _, body = infer(srv.url, feeds(5))
        assert status == 500 and error_of(body) == "HYB-408"
        text = request(srv.url, "GET", "/metrics")[2].decode()
        assert triton_failures(text) == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
        stats = json.loads(request(srv.url, "GET", "/v2/models/tiny/stats")[2])["model_stats"][0]["inference_stats"]
        assert (stats["fail"]["count"], stats["success"]["count"]) == (1, 0)
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------------ shutdown
def wait_queued(url: str, n: int, limit: float = 30.0) -> None:
    """Wait until the tiny model's queue holds ``n`` requests (read from /metrics)."""
    wait_for(lambda: f'pyasc_queue_depth{{model="tiny",version="1"}} {n}.0' in
             request(url, "GET", "/metrics")[2].decode(), f"{n} queued requests", limit=limit, every=0.05)


def wait_arrived(url: str, n: int, limit: float = 30.0) -> None:
    """Wait until the tiny model has received ``n`` requests."""
    wait_for(lambda: f'pyasc_inference_requests_total{{model="tiny",version="1"}} {n}.0' in
             request(url, "GET", "/metrics")[2].decode(), f"{n} requests to arrive", limit=limit, every=0.01)


def test_drain_finishes_in_flight_requests_and_refuses_new_ones(model_path):
    # batch_timeout 60 s: the requests finish quickly only because the drain flushes the queue
    srv = start(model_path, overrides={"max_batch": 64, "batch_timeout": 60.0})
    url = srv.url
    entered = threading.Event()
    release = hold_first_batch(srv, entered=entered)
    try:
        with cf.ThreadPoolExecutor(4) as pool:
            first = pool.submit(infer, url, feeds(199))
            assert entered.wait(30), "the first request never reached the runner"
            futures = [pool.submit(infer, url, feeds(200 + i)) for i in range(3)]
            wait_queued(url, 3)
            t0 = time.monotonic()
            stopper = threading.Thread(target=srv.stop)
            stopper.start()
            release.set()
            check_answer(*first.result(timeout=30)[::2], feeds(199))
            for i, fut in enumerate(futures):
                status, _, body = fut.result(timeout=30)
                check_answer(status, body, feeds(200 + i))
            assert time.monotonic() - t0 < 30
            stopper.join(30)
        assert not stopper.is_alive()
        with pytest.raises(ConnectionError):
            request(url, "GET", "/v2/health/live")
    finally:
        srv.stop()  # a no-op once stopped; stops it when an assertion above failed


def test_draining_server_is_not_ready_and_refuses_inference(model_path):
    srv = start(model_path)
    try:
        status, _, body = infer(srv.url, feeds(4))
        check_answer(status, body, feeds(4))
        app_state = srv.server.state
        app_state.begin_drain()
        assert request(srv.url, "GET", "/v2/health/live")[0] == 200
        status, _, body = request(srv.url, "GET", "/v2/health/ready")
        assert status == 503 and error_of(body) == "HYB-706"
        status, _, body = infer(srv.url, feeds(4))
        assert status == 503 and error_of(body) == "HYB-706"
    finally:
        srv.stop()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_drains_the_cli_server_and_exits_0(model_path):
    support = Path(__file__).with_name("_serve_support.py")
    env = {**os.environ, "PYTHONPATH": str(support.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(support), "serve", str(model_path), "--port", "0", "--target",
                             "onnxruntime", "--max-batch", "64", "--batch-timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = None
        lines = []
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"Uvicorn running on http://(127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url, "".join(lines)
        with cf.ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(infer, url, feeds(300 + i)) for i in range(3)]
            # a lone request on an idle model runs at once (no queue to wait for): signal once all three
            # reached the server; whatever is still in flight or queued must be answered
            wait_arrived(url, 3)
            proc.send_signal(signal.SIGTERM)
            for i, fut in enumerate(futures):
                status, _, body = fut.result(timeout=30)
                check_answer(status, body, feeds(300 + i))
        assert proc.wait(timeout=30) == 0
        with pytest.raises(ConnectionError):
            request(url, "GET", "/v2/health/live")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()


# ------------------------------------------------------------------------------------------------ queue policy
_POLICY_PBTXT = """name: "tiny"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [4] }}, {{ name: "scale" data_type: TYPE_FP32 dims: [1] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [3] }}, {{ name: "s" data_type: TYPE_FP32 dims: [1] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000 {policy} }}
"""


def _policy_repo(root, policy: str):
    (root / "repo" / "tiny" / "1").mkdir(parents=True)
    tiny_model(root / "repo" / "tiny" / "1" / "model.onnx")
    (root / "repo" / "tiny" / "config.pbtxt").write_text(_POLICY_PBTXT.format(policy=policy))
    return root / "repo"


def _while_held(srv, sent_feeds, **extra):
    """The answer to a request sent while the model's first batch is held (released a second later: a margin over
    the 0.1 s policies of the tests below, for a slow machine)."""
    entered = threading.Event()
    release = hold_first_batch(srv, entered=entered)
    with cf.ThreadPoolExecutor(2) as pool:
        first = pool.submit(infer, srv.url, feeds(1))
        assert entered.wait(30), "the first request never reached the runner"
        second = pool.submit(request, srv.url, "POST", "/v2/models/tiny/infer", v2_json(sent_feeds, **extra))
        time.sleep(1.0)  # real time: the server's queue policy times the second request out on its own clock
        release.set()
        status, _, body = first.result()
        check_answer(status, body, feeds(1))
        return second.result()


def test_a_queue_policy_timeout_rejects_a_queued_request_as_triton_does(tmp_path):
    repo = _policy_repo(tmp_path, "default_queue_policy { default_timeout_microseconds: 100000 }")
    srv = start(repo)
    try:
        status, _, body = _while_held(srv, feeds(2))
        assert status == 503 and error_of(body) == "HYB-714", body  # Triton: 503 "Request timeout expired"
        assert b"Request timeout expired" in body
        metrics = request(srv.url, "GET", "/metrics")[2].decode()
        assert triton_failures(metrics) == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
        status, _, body = infer(srv.url, feeds(3))  # an idle queue: no wait
        check_answer(status, body, feeds(3))
    finally:
        srv.stop()


def test_a_request_s_own_timeout_follows_the_queue_policy(tmp_path):
    # without a timeout in its policy a configured model ignores the request's own (as Triton 2.51 does) ...
    srv = start(_policy_repo(tmp_path / "a", "default_queue_policy { allow_timeout_override: true }"))
    try:
        status, _, body = _while_held(srv, feeds(2), parameters={"timeout": 1000})
        check_answer(status, body, feeds(2))
    finally:
        srv.stop()
    # ... with one, an override may lower it
    srv = start(_policy_repo(tmp_path / "b", "default_queue_policy { default_timeout_microseconds: 60000000 "
                                             "allow_timeout_override: true }"))
    try:
        status, _, body = _while_held(srv, feeds(2), parameters={"timeout": 1000})
        assert status == 503 and error_of(body) == "HYB-714", body
    finally:
        srv.stop()
