"""Batch inference on Ray Data: HybridPredictor through map_batches, numpy and pandas batches, 2 actors, the
per-actor decision and the progress figure; answers equal to the reference. Ray runs on 127.0.0.2 (loopback)."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from tests._serve_support import tiny_expected, tiny_model

from hybrid.errors import HybridError

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pd = pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "disabled")
    mp.setenv("PYASC_RAY_CACHE", str(tmp_path_factory.mktemp("cache")))
    previous = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 << 20, log_to_driver=False,
             configure_logging=False, _node_ip_address="127.0.0.2")
    signal.signal(signal.SIGTERM, previous)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()
        mp.undo()


def _rows(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 4)).astype(np.float32), rng.integers(1, 5, (n, 1)).astype(np.float32)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_map_batches_numpy_two_actors_decisions_and_progress(tmp_path, local_ray):
    from hybrid.serve.ray.data import RUNTIME_COLUMN, batch_predict, consume

    model = tiny_model(tmp_path / "tiny.onnx")
    x, scale = _rows(96)
    ds = ray.data.from_items([{"x": x[i], "scale": scale[i], "row": i} for i in range(len(x))])
    out = batch_predict(ds, model, target="onnxruntime", concurrency=2, batch_size=16, num_cpus=0.5)
    model.unlink()  # the actors get the packed bytes, not the path
    seen: list[tuple[int, int | None]] = []
    got = np.zeros((len(x), 3), np.float32)

    def keep(batch):
        got[batch["row"]] = batch["y"]
        assert all(str(r).startswith("onnxruntime:cpu@") for r in batch[RUNTIME_COLUMN])

    report = consume(out, total=len(x), on_progress=lambda r: seen.append((r.rows, r.total)), on_batch=keep)
    np.testing.assert_allclose(got, tiny_expected(x, scale)["y"], rtol=1e-5, atol=1e-5)
    assert report.rows == len(x) and sum(report.rows_by_actor.values()) == len(x)
    assert 1 <= len(report.decisions) <= 2 and set(report.decisions.values()) == {"onnxruntime:cpu"}
    assert [r for r, _ in seen] == sorted(r for r, _ in seen) and seen[-1] == (len(x), len(x))
    assert report.rows_per_s > 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_map_batches_pandas_and_column_mapping(tmp_path, local_ray):
    from hybrid.serve.ray.data import batch_predict, consume

    model = tiny_model(tmp_path / "tiny.onnx")
    x, scale = _rows(40, seed=1)
    frame = pd.DataFrame({"features": list(x), "s": list(scale), "row": np.arange(len(x))})
    ds = ray.data.from_pandas(frame)
    out = batch_predict(ds, model, target="onnxruntime", inputs={"features": "x", "s": "scale"},
                        batch_format="pandas", concurrency=1, batch_size=8, num_cpus=0.5)
    got = np.zeros((len(x), 3), np.float32)
    report = consume(out, on_batch=lambda b: got.__setitem__(b["row"], b["y"]))
    np.testing.assert_allclose(got, tiny_expected(x, scale)["y"], rtol=1e-5, atol=1e-5)
    assert report.rows == len(x) and len(report.decisions) == 1 and report.total is None


def test_predictor_in_process_and_its_errors(tmp_path):
    """The class itself, without Ray: the same answers, and a batch without the model's inputs refused."""
    from hybrid.serve.ray.data import HybridPredictor, batch_predict

    predictor = HybridPredictor(str(tiny_model(tmp_path / "tiny.onnx")), target="onnxruntime")
    x, scale = _rows(5)
    answer = predictor({"x": x, "scale": scale})
    np.testing.assert_allclose(answer["y"], tiny_expected(x, scale)["y"], rtol=1e-6)
    assert answer["pyasc_runtime"][0].startswith("onnxruntime:cpu@")
    with pytest.raises(HybridError) as e:
        predictor({"image": x})
    assert e.value.code == "HYB-102" and "missing" in e.value.message
    with pytest.raises(HybridError) as e:
        batch_predict(None, tmp_path / "tiny.onnx", batch_format="arrow")
    assert e.value.code == "HYB-102"
