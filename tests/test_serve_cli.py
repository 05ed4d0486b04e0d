"""``pyasc serve`` through the real CLI: taken ports fail first (HYB-710, exit 1), the start-up table is
whole off a terminal; warm-up (``--warmup``, config.pbtxt's ``model_warmup``) and ``--precision`` /
``--min-cosine`` reach the models and their statistics."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _serve_support import request, tiny_model, wait_for
from _triton_real import free_port

from hybrid.serve import build_registry
from hybrid.serve.core.repository import compile_request
from hybrid.serve.core.warmup import pbtxt_samples, random_samples

pytestmark = pytest.mark.timeout(180)


def _cli(*args: str) -> subprocess.Popen[str]:
    support = Path(__file__).with_name("_serve_support.py")
    env = {**os.environ, "PYTHONPATH": str(support.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "COLUMNS": "80"}
    return subprocess.Popen([sys.executable, str(support), "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


@pytest.mark.parametrize("which", ["--port", "--grpc-port", "--metrics-port"])
def test_a_taken_port_is_hyb_710_with_exit_1_before_anything_serves(tmp_path: Path, which: str) -> None:
    model = tiny_model(tmp_path / "tiny.onnx")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = {"--port": ["--grpc-port", "0"], "--grpc-port": ["--port", "0"],
                 "--metrics-port": ["--port", "0", "--grpc-port", "0"]}[which]
        proc = _cli(str(model), which, str(port), *other, "--target", "onnxruntime")
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "HYB-710" in out and str(port) in out, out
    assert "serving at" not in out and "Uvicorn running" not in out, out


def test_the_start_up_table_is_not_cut_at_80_columns_off_a_terminal(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "a_model_with_a_rather_long_name_for_the_table.onnx")
    proc = _cli(str(model), "--port", "0", "--grpc-port", "0", "--target", "onnxruntime")
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or "Uvicorn running" in line:
                break
            lines.append(line)
    finally:
        proc.terminate()
        proc.wait(60)
        proc.stdout.close()
    text = "".join(lines)
    assert "a_model_with_a_rather_long_name_for_the_table" in text, text
    assert "float32[Nx4]" in text and "onnxruntime:cpu" in text, text  # no cell cut with '…'
    assert max(len(line.rstrip("\n")) for line in lines) > 80, text  # wider than the 80 columns of COLUMNS


def test_warmup_runs_random_samples_at_the_declared_shapes_before_the_model_serves(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    from hybrid.runtime.compiled import CompiledModel

    seen: list[list[tuple[int, ...]]] = []
    original = CompiledModel.tune

    def tune(self, samples, timeout_s=None):
        seen.append([s["x"].shape for s in samples])
        return original(self, samples, timeout_s=timeout_s)

    monkeypatch.setattr(CompiledModel, "tune", tune)
    registry = build_registry([tiny_model(tmp_path / "tiny.onnx")], target="onnxruntime", warmup=3,
                              overrides={"max_batch": 2})
    try:
        (model,) = list(registry)
        assert model.ready
        assert seen == [[(1, 4), (2, 4), (1, 4)]]  # batch sizes 1..max_batch_size in turn
        assert len(random_samples(model, 5)) == 5
    finally:
        registry.close()


def test_model_warmup_of_config_pbtxt(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "tiny" / "1").mkdir(parents=True)
    tiny_model(repo / "tiny" / "1" / "model.onnx")
    (repo / "tiny" / "warmup").mkdir()
    (repo / "tiny" / "warmup" / "scale.bin").write_bytes(np.full((3, 1), 2, np.float32).tobytes())
    (repo / "tiny" / "config.pbtxt").write_text(
        'max_batch_size: 8\ndynamic_batching { }\nmodel_warmup [ { name: "w" batch_size: 3 count: 2 inputs [\n'
        '  { key: "x" value: { data_type: TYPE_FP32 dims: [4] random_data: true } },\n'
        '  { key: "scale" value: { data_type: TYPE_FP32 dims: [1] input_data_file: "scale.bin" } } ] } ]\n')
    registry = build_registry([repo], target="onnxruntime")
    try:
        (model,) = list(registry)
        samples = pbtxt_samples(model, repo / "tiny")
        assert len(samples) == 2 and samples[0]["x"].shape == (3, 4)
        np.testing.assert_array_equal(samples[0]["scale"], np.full((3, 1), 2, np.float32))
        assert model.ready
    finally:
        registry.close()


def test_precision_and_min_cosine_reach_the_compile_and_the_statistics(tmp_path: Path) -> None:
    from hybrid.serve import BackgroundServer, create_app

    registry = build_registry([tiny_model(tmp_path / "tiny.onnx")], target="onnxruntime",
                              compile_options=compile_request("auto", 0.995, "test"))
    with BackgroundServer(create_app(registry)) as srv:
        status, _, body = request(srv.url, "GET", "/v2/models/tiny/stats")
    assert status == 200
    report = json.loads(body)["model_stats"][0]["pyasc"]
    assert report["requested"] == {"precision": "auto", "accuracy": {"min_cosine": 0.995}}
    assert set(report["precision"]) <= {"fp32", "fp16", "bf16"} and report["backend"] == "onnxruntime"
    assert isinstance(report["tuning"], list) and isinstance(report["accuracy"], list)


def test_a_folder_config_json_asks_for_its_own_precision(tmp_path: Path) -> None:
    from hybrid.serve.core.repository import discover

    repo = tmp_path / "repo"
    (repo / "tiny" / "1").mkdir(parents=True)
    tiny_model(repo / "tiny" / "1" / "model.onnx")
    (repo / "tiny" / "config.json").write_text(json.dumps({"precision": "auto", "min_cosine": 0.99}))
    (source,) = discover([repo])
    assert source.compile == {"precision": "auto", "accuracy": {"min_cosine": 0.99}}
    (repo / "tiny" / "config.json").write_text(json.dumps({"min_cosine": 2}))
    with pytest.raises(Exception, match="HYB-707"):
        discover([repo])


@contextlib.contextmanager
def _serving(http: int, *args: str) -> Iterator[Any]:
    """``pyasc serve ARGS --http-port HTTP`` in a child process: its tritonclient.http client once it is ready."""
    import tritonclient.http as th

    proc = _cli(*args, "--http-port", str(http))
    try:
        client = th.InferenceServerClient(f"127.0.0.1:{http}")

        def ready() -> bool:
            try:
                return bool(client.is_server_ready())
            except Exception:  # not listening yet
                return False

        # real time: a child process starts (or dies: then its output is shown)
        wait_for(lambda: proc.poll() is not None or ready(), "the server to be ready", limit=120, every=0.2)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        yield client
    finally:
        proc.terminate()
        proc.wait(60)
        if proc.stdout:
            proc.stdout.close()


def test_tritonserver_s_command_line_serves_as_it_does(tmp_path: Path) -> None:
    """``--model-repository``, ``--http-port``, ``--metrics-port``, ``--model-control-mode explicit`` and
    ``--load-model``: a tritonserver launch line runs with the binary's name changed."""
    repo = tmp_path / "repo"
    for name in ("first", "second"):
        (repo / name / "1").mkdir(parents=True)
        tiny_model(repo / name / "1" / "model.onnx")
    http, metrics = free_port(), free_port()
    explicit = ("--model-repository", str(repo), "--model-control-mode", "explicit", "--grpc-port", "0",
                "--target", "onnxruntime")
    with _serving(http, *explicit, "--load-model", "first", "--metrics-port", str(metrics), "--metrics-config",
                  "summary_latencies=true") as client:
        index = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
        assert index == {"first": "READY", "second": "UNAVAILABLE"}  # only --load-model's model at start
        client.load_model("second")
        assert client.is_model_ready("second")
        import tritonclient.http as th

        inputs = [th.InferInput("x", [1, 4], "FP32"), th.InferInput("scale", [1, 1], "FP32")]
        inputs[0].set_data_from_numpy(np.ones((1, 4), np.float32))
        inputs[1].set_data_from_numpy(np.ones((1, 1), np.float32))
        client.infer("first", inputs)
        status, _, body = request(f"127.0.0.1:{metrics}", "GET", "/metrics")
        assert status == 200 and b"nv_inference_request_success" in body
        assert b'nv_inference_request_summary_us{model="first",quantile="0.99",version="1"}' in body
    with _serving(http, *explicit) as client:  # no --load-model: no model at start, as tritonserver starts
        index = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
        assert index == {"first": "UNAVAILABLE", "second": "UNAVAILABLE"}
        client.load_model("first")
        assert client.is_model_ready("first")


def test_tritonserver_s_poll_mode_serves_what_the_repository_holds(tmp_path: Path) -> None:
    """``--model-control-mode poll --repository-poll-secs``: a model folder added is served, one removed is not,
    and the load/unload endpoints are off, as in tritonserver's poll mode."""
    import shutil

    from tritonclient.utils import InferenceServerException

    repo = tmp_path / "repo"
    (repo / "first" / "1").mkdir(parents=True)
    tiny_model(repo / "first" / "1" / "model.onnx")
    http = free_port()

    def ready(client: Any, name: str) -> bool:
        try:
            return client.is_model_ready(name)
        except InferenceServerException:
            return False

    with _serving(http, "--model-repository", str(repo), "--model-control-mode", "poll", "--repository-poll-secs",
                  "0.2", "--grpc-port", "0", "--target", "onnxruntime") as client:
        assert ready(client, "first") and not ready(client, "second")
        staged = tmp_path / "staged" / "second"  # written whole, then moved in: a poll never sees half a folder
        (staged / "1").mkdir(parents=True)
        tiny_model(staged / "1" / "model.onnx")
        staged.rename(repo / "second")
        wait_for(lambda: ready(client, "second"), "the added model to be served", every=0.1)
        shutil.rmtree(repo / "first")
        wait_for(lambda: not ready(client, "first"), "the removed model to be unloaded", every=0.1)
        with pytest.raises(InferenceServerException, match="HYB-709"):
            client.load_model("first")


@pytest.mark.parametrize(("args", "says"), [
    ((), "none were named"),
    (("--model-control-mode", "pull"), "expected none, explicit or poll"),
    (("--model-control-mode", "poll", "--load-model", "tiny"), "cannot be combined"),
    (("--model-control-mode", "poll", "--repository-poll-secs", "0"), "--repository-poll-secs must be > 0"),
    (("--load-model", "tiny"), "--load-model needs --model-control"),
    (("--model-control", "--load-model", "nope"), "no such model"),
    (("--metrics-port", "8000"), "port of another service"),
    (("--metrics-config", "histogram_latencies=true"), "unknown setting"),
])
def test_tritonserver_s_options_refused_with_hyb_102(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    repo = tmp_path / "repo"
    (repo / "tiny" / "1").mkdir(parents=True)
    tiny_model(repo / "tiny" / "1" / "model.onnx")
    where = () if args == () else ("--model-repository", str(repo))
    proc = _cli(*where, *args, "--port", "8000", "--grpc-port", "0", "--target", "onnxruntime")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "HYB-102" in out and says in out, out
