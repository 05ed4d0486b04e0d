"""Triton's response cache (hybrid.serve.triton.response_cache): answers kept by inputs, for the models that enable it.

What must hold on any machine: a cached answer equals the model's, hits and misses are counted as Triton counts
them, the cache keeps within its size (least recently used answers dropped first), and models that do not
enable it, or have sequence batching, are never cached. ``tests/test_serve_vs_triton.py`` compares the counts
with the real Triton's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tests._serve_support import request, serving, stateful_repo, tiny_expected, tiny_model, v2_json
from typer.testing import CliRunner

from hybrid.errors import ConfigError
from hybrid.serve.triton.response_cache import ResponseCache, cache_size

pytestmark = pytest.mark.timeout(120)

X = np.arange(8, dtype=np.float32).reshape(2, 4)
SCALE = np.full((2, 1), 0.5, np.float32)
_PBTXT = """name: "{name}"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [4] }}, {{ name: "scale" data_type: TYPE_FP32 dims: [1] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [3] }}, {{ name: "s" data_type: TYPE_FP32 dims: [1] }} ]
{cache}"""


def test_cache_config_reads_triton_s_spelling():
    assert cache_size([]) == 0 and cache_size(["local,size=1048576"]) == 1 << 20
    for bad in ("redis,host=localhost", "local,size=0", "local,size=big", "local"):
        with pytest.raises(ConfigError) as info:
            cache_size([bad])
        assert info.value.code == "HYB-102", bad


def test_keys_tell_inputs_apart_by_name_type_shape_and_bytes():
    cache = ResponseCache(capacity=100)
    base = {"x": np.arange(4, dtype=np.float32)}
    key = cache.key("m", "1", base)
    assert key == cache.key("m", "1", {"x": np.arange(4, dtype=np.float32)}) and len(key) == 16
    others = [cache.key("m", "2", base), cache.key("n", "1", base),
              cache.key("m", "1", {"z": base["x"]}), cache.key("m", "1", {"x": base["x"] + 1}),
              cache.key("m", "1", {"x": base["x"].astype(np.float64)}),
              cache.key("m", "1", {"x": base["x"].reshape(2, 2)})]
    assert len({key, *others}) == 7
    text = [np.array([b"ab", b"c"], dtype=object), np.array([b"a", b"bc"], dtype=object)]
    assert cache.key("m", "1", {"t": text[0]}) != cache.key("m", "1", {"t": text[1]})
    # each cache draws its own seed: a key made outside the server's process tells nothing of its keys
    assert ResponseCache(capacity=100).key("m", "1", base) != key


def test_least_recently_used_answers_go_first_and_none_past_the_size():
    cache = ResponseCache(capacity=100)
    answer = {"y": np.zeros(10, np.float32)}  # 40 bytes
    assert cache.put(b"a", answer) and cache.put(b"b", answer)
    assert cache.get(b"a") is not None  # a is now the most recently used
    assert cache.put(b"c", answer)  # 120 > 100: b goes
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.get(b"c") is not None
    assert cache.used == 80 and len(cache) == 2
    assert not cache.put(b"big", {"y": np.zeros(30, np.float32)})  # larger than the whole cache
    kept = cache.get(b"a")
    assert kept is not None and not kept["y"].flags.writeable  # shared by every hit: read-only


def test_the_cache_counts_what_triton_s_gauges_report():
    ticks = iter(range(1000))
    cache = ResponseCache(capacity=100, clock=lambda: next(ticks) * 1e-3)  # scripted: each reading 1 ms after the last
    answer = {"y": np.zeros(10, np.float32)}  # 40 bytes
    key, found, seconds = cache.lookup("m", "1", {"x": np.ones(2, np.float32)})
    assert found is None and seconds == pytest.approx(1e-3)
    assert cache.insert(key, answer) == pytest.approx(1e-3)
    assert cache.lookup("m", "1", {"x": np.ones(2, np.float32)})[1] is not None
    cache.put(b"b", answer)
    cache.put(b"c", answer)  # 120 > 100: the least recently used goes
    counts = cache.counts()
    assert (counts.lookups, counts.hits, counts.misses, counts.evictions, counts.entries) == (2, 1, 1, 1, 2)
    assert counts.utilization == pytest.approx(0.8)
    assert (counts.lookup_us, counts.insertion_us) == (2000, 1000)


def _repo(root: Path) -> Path:
    repo = root / "repo"
    for name, cache in (("cached", "response_cache { enable: true }\n"), ("plain", "")):
        (repo / name / "1").mkdir(parents=True)
        tiny_model(repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(_PBTXT.format(name=name, cache=cache))
    return repo


def _stats(url: str, model: str) -> dict:
    status, _, body = request(url, "GET", f"/v2/models/{model}/stats")
    assert status == 200
    return json.loads(body)["model_stats"][0]


def _counts(stats: dict) -> dict[str, int]:
    phases = stats["inference_stats"]
    return {"hit": phases["cache_hit"]["count"], "miss": phases["cache_miss"]["count"],
            "success": phases["success"]["count"], "queue": phases["queue"]["count"],
            "compute": phases["compute_infer"]["count"], "inferences": stats["inference_count"],
            "executions": stats["execution_count"]}


def _ask(server, model: str, scale: np.ndarray = SCALE) -> np.ndarray:
    status, _, body = request(server.url, "POST", f"/v2/models/{model}/infer", v2_json({"x": X, "scale": scale}))
    assert status == 200, body
    y = next(o for o in json.loads(body)["outputs"] if o["name"] == "y")
    return np.array(y["data"], np.float32).reshape(2, 3)


def test_a_model_that_enables_the_cache_answers_seen_inputs_from_it(tmp_path):
    with serving([_repo(tmp_path), stateful_repo(tmp_path / "stateful")], response_cache=1 << 20) as server:
        want = tiny_expected(X, SCALE)["y"]
        for _ in range(3):
            np.testing.assert_allclose(_ask(server, "cached"), want, rtol=1e-6)
        np.testing.assert_allclose(_ask(server, "cached", SCALE * 2), tiny_expected(X, SCALE * 2)["y"], rtol=1e-6)
        client = grpcclient.InferenceServerClient(server.grpc_url)  # the same inputs over gRPC: the same key
        inputs = [grpcclient.InferInput("x", [2, 4], "FP32"), grpcclient.InferInput("scale", [2, 1], "FP32")]
        inputs[0].set_data_from_numpy(X)
        inputs[1].set_data_from_numpy(SCALE)
        np.testing.assert_allclose(client.infer("cached", inputs).as_numpy("y"), want, rtol=1e-6)
        # as Triton counts: every answer a success with a queue entry, hits without compute or inferences
        assert _counts(_stats(server.url, "cached")) == {"hit": 3, "miss": 2, "success": 5, "queue": 5,
                                                           "compute": 2, "inferences": 4, "executions": 2}
        for _ in range(2):
            _ask(server, "plain")
        assert _counts(_stats(server.url, "plain"))["hit"] == 0  # its config.pbtxt does not enable the cache
        stats = _stats(server.url, "cached")["inference_stats"]
        assert stats["cache_hit"]["ns"] > 0 and stats["cache_miss"]["ns"] > 0
        # /metrics: Triton's per-model cache counters for the cached model alone, and the cache's own gauges
        status, _, body = request(server.url, "GET", "/metrics")
        assert status == 200
        metrics = {(m.name, tuple(sorted(s.labels.items()))): s.value
                   for m in text_string_to_metric_families(body.decode()) for s in m.samples}
        cached = (("model", "cached"), ("version", "1"))
        assert metrics[("nv_cache_num_hits_per_model", cached)] == 3
        assert metrics[("nv_cache_num_misses_per_model", cached)] == 2
        assert metrics[("nv_cache_hit_duration_per_model", cached)] >= 0
        assert not any(name.endswith("_per_model") and dict(labels).get("model") == "plain"
                       for name, labels in metrics)
        gauges = {name: value for (name, labels), value in metrics.items() if not labels}
        assert (gauges["nv_cache_num_lookups"], gauges["nv_cache_num_hits"], gauges["nv_cache_num_misses"],
                gauges["nv_cache_num_entries"], gauges["nv_cache_num_evictions"]) == (5, 3, 2, 2, 0)
        assert 0 < gauges["nv_cache_util"] < 1


def test_without_a_cache_or_with_sequence_batching_nothing_is_cached(tmp_path):
    with serving([_repo(tmp_path)]) as server:  # no --cache-config
        for _ in range(2):
            _ask(server, "cached")
        assert _counts(_stats(server.url, "cached"))["hit"] == 0
    config = stateful_repo(tmp_path / "stateful") / "seq" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    with serving([config.parent.parent], response_cache=1 << 20) as server:
        model = server.server.state.registry.get("seq")
        assert not model.caches_responses  # a sequence's answers depend on its state


def test_cli_refuses_a_bad_cache_config(tmp_path):
    from tests.test_serve import serve_app

    result = CliRunner().invoke(serve_app(), ["serve", str(tiny_model(tmp_path / "t.onnx")), "--cache-config",
                                              "redis,host=localhost"])
    assert result.exit_code == 1 and "HYB-102" in result.output and "local,size=BYTES" in result.output
