"""KServe: the ClusterServingRuntime and the Dockerfile say what the issue asks, and the container's command
line, run here against /mnt/models-shaped folders (loose files, a repository, an unpacked bundle), serves
HTTP and gRPC, passes the manifest's probes and drains on SIGTERM. No cluster and no docker engine here:
the image build and KServe's own wiring (storage initializer, Knative) are not exercised."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest
from tests._serve_support import tiny_expected, tiny_model, wait_for

import hybrid

yaml = pytest.importorskip("yaml")
tg = pytest.importorskip("tritonclient.grpc")

ROOT = Path(__file__).resolve().parents[1]
KSERVE = ROOT / "deploy" / "kserve"


def _runtime() -> dict:
    return yaml.safe_load((KSERVE / "cluster-serving-runtime.yaml").read_text())


def test_cluster_serving_runtime_manifest():
    doc = _runtime()
    assert (doc["apiVersion"], doc["kind"]) == ("serving.kserve.io/v1alpha1", "ClusterServingRuntime")
    spec = doc["spec"]
    assert spec["supportedModelFormats"] == [{"name": "hybrid", "version": "1", "autoSelect": True}]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    line = container["command"] + container["args"]
    assert line[:3] == ["pyasc", "serve", "/mnt/models"]
    args = dict(zip(line[3::2], line[4::2]))
    assert args == {"--host": "0.0.0.0", "--port": "8080", "--grpc-port": "8081"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http1", 8080)]
    grpc_isvc = yaml.safe_load((KSERVE / "inference-service-grpc.yaml").read_text())
    model = grpc_isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "hybrid" and model["protocolVersion"] == "grpc-v2"
    assert [(p["name"], p["containerPort"]) for p in model["ports"]] == [("h2c", 8081)]  # Knative: h2c
    http_isvc = yaml.safe_load((KSERVE / "inference-service.yaml").read_text())
    assert http_isvc["spec"]["predictor"]["model"]["modelFormat"]["name"] == "hybrid"


def test_dockerfile_runs_the_runtimes_command():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    (container,) = _runtime()["spec"]["containers"]
    assert entry == container["command"] and cmd == container["args"]
    assert re.search(r'^RUN pip install "\.\[serve\]"', text, re.M) and "EXPOSE 8080 8081" in text


# ----------------------------------------------------------------------------- the command line, run here
def _mnt_models(tmp_path: Path, layout: str) -> tuple[Path, str]:
    """A folder as KServe's storage initializer leaves it, and the name the model is served under."""
    mnt = tmp_path / "mnt" / "models"
    mnt.mkdir(parents=True)
    onnx_path = tiny_model(tmp_path / "tiny.onnx")
    if layout == "files":
        hybrid.compile(str(onnx_path), target="onnxruntime").save(str(mnt / "tiny.hybrid"))
        return mnt, "tiny"
    if layout == "repository":
        (mnt / "tiny" / "1").mkdir(parents=True)
        hybrid.compile(str(onnx_path), target="onnxruntime").save(str(mnt / "tiny" / "1" / "model.hybrid"))
        return mnt, "tiny"
    bundle = tmp_path / "tiny.hybrid"
    hybrid.compile(str(onnx_path), target="onnxruntime").save(str(bundle))
    with zipfile.ZipFile(bundle) as zf:  # unpacked, as a storageUri pointing at the bundle's folder leaves it
        zf.extractall(mnt)
    name = json.loads((mnt / "manifest.json").read_text())["name"]
    return mnt, name


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", ["files", "repository", "bundle"])
def test_container_command_serves_mnt_models(tmp_path, layout):
    from tests._serve_ray_cluster import free_port

    mnt, name = _mnt_models(tmp_path, layout)
    (container,) = _runtime()["spec"]["containers"]
    http_port, grpc_port = free_port(), free_port()
    local = {"/mnt/models": str(mnt), "0.0.0.0": "127.0.0.1", "8080": str(http_port), "8081": str(grpc_port)}
    args = [local.get(a, a) for a in container["args"]]  # loopback only here
    assert container["command"] == ["pyasc"]
    proc = subprocess.Popen([sys.executable, "-c", "from hybrid.cli.main import main; main()", *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        probe = container["readinessProbe"]["httpGet"]

        def ready() -> bool:
            try:
                return _get(f"http://127.0.0.1:{http_port}{probe['path']}") == 200
            except OSError:
                return False

        # real time: a child process starts (or dies: then its output is shown)
        wait_for(lambda: proc.poll() is not None or ready(), "the readiness probe", limit=120, every=0.3)
        assert proc.poll() is None, proc.stdout.read()
        live = container["livenessProbe"]["httpGet"]["path"]
        assert _get(f"http://127.0.0.1:{http_port}{live}") == 200
        x, scale = np.ones((2, 4), np.float32), np.full((2, 1), 3, np.float32)
        client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        inputs = [tg.InferInput("x", [2, 4], "FP32"), tg.InferInput("scale", [2, 1], "FP32")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(scale)
        got = client.infer(name, inputs).as_numpy("y")
        np.testing.assert_allclose(got, tiny_expected(x, scale)["y"], rtol=1e-5, atol=1e-5)
        assert client.get_model_metadata(name).platform == "hybrid"
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_folder_layouts_and_their_errors(tmp_path):
    from hybrid.errors import HybridError
    from hybrid.serve.core.repository import build_registry, discover

    with pytest.raises(HybridError) as e:
        discover([tmp_path])
    assert e.value.code == "HYB-707" and "holds no model" in e.value.message
    mnt, name = _mnt_models(tmp_path / "b", "bundle")
    (source,) = discover([mnt])
    assert source.name == name and source.path.endswith(f"{name}.hybrid")
    weights = next(p for p in (mnt / "model").iterdir() if p.suffix == ".onnx")
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")  # a damaged member: the bundle's hashes
    (source,) = discover([mnt])
    with pytest.raises(HybridError) as e:
        build_registry([], sources=[source], target="onnxruntime")
    assert e.value.code == "HYB-503"
    (mnt / "link").symlink_to(weights)
    with pytest.raises(HybridError) as e:
        discover([mnt])
    assert e.value.code == "HYB-707" and "links" in e.value.message
