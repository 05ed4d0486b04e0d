"""@hybrid.jit: one trace per input signature, cache hits afterwards, torch in/torch out."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import hybrid  # noqa: E402
from hybrid.errors import ModelError  # noqa: E402
from hybrid.frontends.jit import JitFunction  # noqa: E402


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


def _close(a, b) -> bool:
    return bool(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5))


def test_one_trace_per_signature_then_cache_hits(net):
    body_runs = []

    @hybrid.jit(target="onnxruntime")
    def f(x):
        body_runs.append(tuple(x.shape))  # the Python body runs only while tracing
        return net(x)

    x = torch.randn(3, 8)
    y = f(x)
    info = f.cache_info()
    assert (info.traces, info.hits, info.entries) == (1, 0, 1)
    traced_runs = len(body_runs)
    assert traced_runs >= 1

    y2 = f(x)  # same signature: cache hit, the body does not run
    assert f.cache_info().traces == 1 and f.cache_info().hits == 1
    assert len(body_runs) == traced_runs
    assert _close(y, y2)

    f(torch.randn(5, 8))  # another batch size: the batch dim is dynamic, still a hit
    assert f.cache_info().traces == 1 and f.cache_info().hits == 2
    assert len(body_runs) == traced_runs

    f(torch.randn(2, 3, 8))  # a new signature (rank): traced once
    f(torch.randn(2, 3, 8))
    info = f.cache_info()
    assert (info.traces, info.entries, info.hits) == (2, 2, 3)


def test_torch_in_torch_out_numpy_in_numpy_out(net):
    f = hybrid.jit(net, target="onnxruntime")
    x = torch.randn(4, 8)
    out = f(x)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (4, 4)
    with torch.no_grad():
        assert _close(out, net(x))
    arr = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    out_np = f(arr)
    assert isinstance(out_np, np.ndarray) and out_np.shape == (6, 4)
    with torch.no_grad():
        assert _close(out_np, net(torch.from_numpy(arr)))


def test_output_structure_and_constants(net):
    @hybrid.jit(target="onnxruntime")
    def f(x, scale=1.0):
        y = net(x) * scale
        return {"y": y, "parts": (y.sum(-1), y.amax(-1))}

    x = torch.randn(2, 8)
    out = f(x)
    assert set(out) == {"y", "parts"} and isinstance(out["parts"], tuple) and len(out["parts"]) == 2
    with torch.no_grad():
        assert _close(out["parts"][0], (net(x)).sum(-1))
    doubled = f(x, scale=2.0)  # a constant is part of the signature
    assert f.cache_info().traces == 2
    assert _close(doubled["y"], out["y"] * 2)
    f(x, scale=2.0)
    assert f.cache_info().traces == 2


def test_recompile_limit_warns_once_then_reuses_the_dynamic_build(net):
    @hybrid.jit(target="onnxruntime", cache_size_limit=1)
    def f(x):
        return net(x).relu()

    f(torch.randn(2, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = torch.randn(2, 3, 8)
        out_a = f(a)  # over the limit: warns, builds the all-dynamic model
        out_b = f(torch.randn(4, 5, 8))  # served by the dynamic build, no new trace
        f(torch.randn(1, 2, 7, 8))  # another rank: the dynamic build is per rank, traced once more
    ours = [w for w in caught if "cache_size_limit" in str(w.message)]
    assert len(ours) == 1
    info = f.cache_info()
    assert info.dynamic and info.traces == 3
    assert out_b.shape == (4, 5, 4)
    with torch.no_grad():
        assert _close(out_a, net(a).relu())


def test_decorator_forms_and_bad_arguments(net):
    assert isinstance(hybrid.jit(net), JitFunction)
    assert isinstance(hybrid.jit()(net), JitFunction)

    @hybrid.jit
    def g(x, options):
        return net(x)

    with pytest.raises(ModelError) as e:
        g(torch.randn(1, 8), {"unhashable": []})
    assert e.value.code == "HYB-210"
    with pytest.raises(ModelError):
        hybrid.jit(net, cache_size_limit=0)


def test_compiled_for_exposes_the_compiled_model(net):
    f = hybrid.jit(net, target="openvino") if _has("openvino") else hybrid.jit(net, target="onnxruntime")
    cm = f.compiled_for(torch.randn(3, 8))
    assert isinstance(cm, hybrid.CompiledModel)
    assert cm.signature.inputs[0].shape[0] == "batch"
    f.cache_clear()
    assert f.cache_info().entries == 0


def _has(backend: str) -> bool:
    from hybrid.hal import backend_status

    return backend_status(backend).available
