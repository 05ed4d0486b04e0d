"""Scale-out: the same v2 API deployed on a local Ray Serve instance with 2 replicas, reached by tritonclient
over HTTP and gRPC (Serve's gRPC proxy). Ray's node address is 127.0.0.2: Ray rewrites 127.0.0.1 into the
machine's interface address, and these tests send traffic to loopback only."""

from __future__ import annotations

import hashlib
import signal
import socket

import numpy as np
import pytest
from tests._serve_support import dynamic_squeezenet, tiny_expected, tiny_model

import hybrid

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
th = pytest.importorskip("tritonclient.http")
tg = pytest.importorskip("tritonclient.grpc")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_replicas_on_ray_serve_answer_tritonclient(tmp_path, light, monkeypatch):
    from ray import serve

    from hybrid.serve.ray.deployment import deploy, shutdown

    tiny = tiny_model(tmp_path / "tiny.onnx")
    squeezenet = dynamic_squeezenet(tmp_path / "squeezenet.onnx")
    port, grpc_port = free_port(), free_port()
    # 2 cores here: Ray gets both, each replica reserves a quarter core; no dashboard, a small object store
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("PYASC_RAY_CACHE", str(tmp_path / "cache"))
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 << 20, log_to_driver=False,
             configure_logging=False, _node_ip_address="127.0.0.2")
    signal.signal(signal.SIGTERM, previous_sigterm)
    client = None
    try:
        deploy([tiny, squeezenet], target="onnxruntime", overrides={"max_batch": 4, "batch_timeout": 0.002},
               replicas=2, replica_cpus=0.25, port=port, grpc_port=grpc_port, app_name="pyasc-test")
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.2"}
        status = serve.status().applications["pyasc-test"]
        assert status.deployments["pyasc-test-models"].replica_states == {"RUNNING": 2}
        client = th.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60.0)
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("squeezenet")
        assert client.get_model_metadata("tiny")["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": [-1, 4]}
        x = light.light_input()
        local = hybrid.compile(squeezenet, target="onnxruntime").run({"data_0": x})["softmaxout_1"]
        for binary in (True, False):
            inp = th.InferInput("data_0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = th.InferRequestedOutput("softmaxout_1", binary_data=binary)
            got = client.infer("squeezenet", [inp], outputs=[out]).as_numpy("softmaxout_1")
            np.testing.assert_array_equal(got, local)
        for seed in range(8):  # spread over both replicas by Serve's router
            rng = np.random.default_rng(seed)
            xs = rng.standard_normal((2, 4)).astype(np.float32)
            scale = np.full((2, 1), seed, np.float32)
            inputs = [th.InferInput("x", [2, 4], "FP32"), th.InferInput("scale", [2, 1], "FP32")]
            inputs[0].set_data_from_numpy(xs)
            inputs[1].set_data_from_numpy(scale)
            got = client.infer("tiny", inputs).as_numpy("y")
            np.testing.assert_allclose(got, tiny_expected(xs, scale)["y"], rtol=1e-5, atol=1e-5)
        with pytest.raises(th.InferenceServerException, match="HYB-701"):
            client.get_model_metadata("absent")
        grpc_client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert grpc_client.is_server_live() and grpc_client.is_model_ready("squeezenet")
        inp = tg.InferInput("data_0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(grpc_client.infer("squeezenet", [inp]).as_numpy("softmaxout_1"), local)
        assert grpc_client.get_model_metadata("tiny").inputs[0].shape == [-1, 4]
        assert grpc_client.get_model_config("tiny").config.name == "tiny"
        with pytest.raises(tg.InferenceServerException, match=r"StatusCode.NOT_FOUND\] \[HYB-701\]"):
            grpc_client.get_model_metadata("absent")
        bad = tg.InferInput("x", [2, 5], "FP32")
        bad.set_data_from_numpy(np.zeros((2, 5), np.float32))
        with pytest.raises(tg.InferenceServerException, match=r"INVALID_ARGUMENT\] \[HYB-40"):
            grpc_client.infer("tiny", [bad])
        grpc_client.close()
        # every replica checked the shipped files against their digests and cached them once, by digest
        cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
        assert cached == sorted(f"{hashlib.sha256(p.read_bytes()).hexdigest()}.onnx" for p in (tiny, squeezenet))
    finally:
        if client is not None:
            client.close()
        try:
            shutdown(None)
        finally:
            ray.shutdown()
