"""The native TensorRT backend without the hardware: options, build settings, caching, and the calls
it makes into TensorRT's API, checked against a recording stand-in of that API.

Nothing here runs TensorRT; engines were not built on this project's machines (docs/gpu.md).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from tests._models import matmul_add

import hybrid
from hybrid.backends.tensorrt import (
    BuildSettings,
    TensorRTBackend,
    build_settings,
    cache_key,
    configure_builder,
    engine_paths,
    profile_shapes,
)
from hybrid.errors import BackendError
from hybrid.hal import backend_class, backend_status

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


def test_registered_with_priority_before_the_other_gpu_backends():
    cls = backend_class("tensorrt")
    assert cls is TensorRTBackend
    assert cls.priority < backend_class("onnxruntime").priority < backend_class("torch").priority


def test_seed_set_backend_call_validates_without_tensorrt():
    code = ("import sys, hybrid\n"
            "hybrid.set_backend('tensorrt', config={'fp16_mode': True, 'max_workspace_size': 1 << 30})\n"
            "from hybrid.config import get_config\n"
            "assert get_config().backends['tensorrt'] == {'fp16_mode': True, 'max_workspace_size': 1 << 30}\n"
            "assert 'tensorrt' not in sys.modules and 'torch' not in sys.modules\n")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # the child asserts the config and what a fresh interpreter imported


@pytest.mark.parametrize("config", [{"fp16": True}, {"fp16_mode": 1}, {"max_workspace_size": "1GB"},
                                    {"builder_optimization_level": 7}])
def test_bad_options_are_rejected(config):
    with pytest.raises(BackendError) as e:
        hybrid.set_backend("tensorrt", config)
    assert e.value.code == "HYB-306"


@pytest.mark.skipif(HAS_TENSORRT, reason="tensorrt is installed here")
def test_probe_records_tensorrt_not_installed():
    status = backend_status("tensorrt")
    assert not status.available
    assert "tensorrt not installed" in status.reason
    with pytest.raises(BackendError) as e:
        hybrid.compile(matmul_add(), target="tensorrt")
    assert e.value.code == "HYB-302" and "pip install tensorrt" in (e.value.hint or "")


# ---------------------------------------------------------------------------------------------- settings
def test_build_settings_map_the_options():
    s = build_settings({"fp16_mode": True, "max_workspace_size": 1 << 30, "builder_optimization_level": 4,
                        "max_batch": 8, "dla_core": 1,
                        "profile_shapes": {"x": [(1, 4), (4, 4), (8, 4)]}})
    assert s == BuildSettings(fp16=True, workspace=1 << 30, optimization_level=4, max_batch=8, dla_core=1,
                              shapes=(("x", ((1, 4), (4, 4), (8, 4))),))
    assert build_settings({}) == BuildSettings()


@pytest.mark.parametrize("options", [{"max_workspace_size": 0}, {"max_batch": 0}, {"dla_core": -1},
                                     {"profile_shapes": {"x": [(4,), (2,), (8,)]}},
                                     {"profile_shapes": {"x": [(1, 4), (4,), (8, 4)]}}])
def test_build_settings_reject_bad_values(options):
    with pytest.raises(BackendError) as e:
        build_settings(options)
    assert e.value.code == "HYB-306"


def test_cache_key_depends_on_model_and_every_setting(tmp_path):
    model = hybrid.Model.load(matmul_add()).to_bytes()
    keys = {cache_key(model, BuildSettings()), cache_key(model, BuildSettings(fp16=True)),
            cache_key(model, BuildSettings(workspace=1 << 30)), cache_key(model + b"x", BuildSettings())}
    assert len(keys) == 4
    assert cache_key(model, BuildSettings()) == cache_key(model, BuildSettings())
    engine, timing = engine_paths(tmp_path, "f00d", "k1")
    assert engine == tmp_path / "tensorrt" / "f00d" / "k1.engine"
    assert timing == tmp_path / "tensorrt" / "f00d" / "timing.cache"


def test_profile_shapes_fill_a_dynamic_batch_and_refuse_other_dynamic_dims():
    s = BuildSettings(max_batch=16)
    assert profile_shapes([("x", (-1, 3, 224, 224)), ("k", (2,))], s) == {
        "x": ((1, 3, 224, 224), (16, 3, 224, 224), (16, 3, 224, 224))}
    given = BuildSettings(shapes=(("t", ((1, 1), (1, 64), (1, 128))),))
    assert profile_shapes([("t", (1, -1))], given) == {"t": ((1, 1), (1, 64), (1, 128))}
    with pytest.raises(BackendError) as e:
        profile_shapes([("t", (1, -1))], s)
    assert e.value.code == "HYB-304" and "'t'" in e.value.message


# ---------------------------------------------------------------------------------------------- the API calls
class _Recorder:
    """A recording stand-in for the TensorRT objects the backend touches: it stores every call and
    attribute assignment, so the test can check them against TensorRT's documented API."""

    def __init__(self, log: list, name: str, **returns) -> None:
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_returns", returns)

    def __getattr__(self, attr):
        def call(*args, **kwargs):
            self._log.append((f"{self._name}.{attr}", args, kwargs))
            value = self._returns.get(attr)
            return value(*args, **kwargs) if callable(value) else value
        return call

    def __setattr__(self, attr, value):
        self._log.append((f"{self._name}.{attr}=", (value,), {}))


def _fake_trt(log: list, parse_ok: bool = True, dynamic: bool = True):
    trt = types.SimpleNamespace(
        __version__="10.3.0",
        MemoryPoolType=types.SimpleNamespace(WORKSPACE="WORKSPACE"),
        BuilderFlag=types.SimpleNamespace(FP16="FP16", BF16="BF16", GPU_FALLBACK="GPU_FALLBACK"),
        DeviceType=types.SimpleNamespace(DLA="DLA"),
    )
    shape = (-1, 4) if dynamic else (2, 4)
    net_input = types.SimpleNamespace(name="x", shape=shape)
    cache = _Recorder(log, "timing_cache", serialize=lambda: b"timings")
    config = _Recorder(log, "config", create_timing_cache=lambda data: cache, get_timing_cache=lambda: cache)
    profile = _Recorder(log, "profile")
    network = _Recorder(log, "network", get_input=lambda i: net_input)
    object.__setattr__(network, "num_inputs", 1)
    builder = _Recorder(log, "builder", create_network=lambda flags: network,
                        create_builder_config=lambda: config, create_optimization_profile=lambda: profile,
                        build_serialized_network=lambda n, c: b"PLAN")
    object.__setattr__(builder, "platform_has_fast_fp16", True)
    parser = _Recorder(log, "parser", parse=lambda data: parse_ok, get_error=lambda i: f"error {i}")
    object.__setattr__(parser, "num_errors", 0 if parse_ok else 2)
    trt.Builder = lambda logger: builder
    trt.OnnxParser = lambda net, logger: parser
    return trt


def _calls(log, name):
    return [(args, kwargs) for n, args, kwargs in log if n == name]


def test_configure_builder_uses_tensorrt_api_names():
    log: list = []
    trt = _fake_trt(log)
    builder, config = trt.Builder(None), _Recorder(log, "config")
    configure_builder(trt, builder, config, BuildSettings(fp16=True, workspace=1 << 30, optimization_level=3,
                                                          dla_core=0))
    assert _calls(log, "config.set_memory_pool_limit") == [(("WORKSPACE", 1 << 30), {})]
    assert {a[0] for a, _ in _calls(log, "config.set_flag")} == {"FP16", "GPU_FALLBACK"}
    assert _calls(log, "config.builder_optimization_level=") == [((3,), {})]
    assert _calls(log, "config.default_device_type=") == [(("DLA",), {})]
    assert _calls(log, "config.DLA_core=") == [((0,), {})]


def test_build_parses_profiles_and_keeps_the_timing_cache(tmp_path):
    log: list = []
    backend = TensorRTBackend()
    backend._logger = object()
    timing = tmp_path / "tensorrt" / "fp" / "timing.cache"
    settings = build_settings({"fp16_mode": True, "max_workspace_size": 1 << 30, "max_batch": 4})
    plan = backend._build(_fake_trt(log), b"onnx bytes", settings, timing, "m")
    assert plan == b"PLAN"
    assert _calls(log, "builder.create_network") == [((0,), {})]  # TensorRT 10: explicit batch always
    assert _calls(log, "parser.parse") == [((b"onnx bytes",), {})]
    assert _calls(log, "profile.set_shape") == [(("x", (1, 4), (4, 4), (4, 4)), {})]
    assert len(_calls(log, "config.add_optimization_profile")) == 1
    assert _calls(log, "config.create_timing_cache") == [((b"",), {})]
    assert _calls(log, "config.set_timing_cache")[0][1] == {"ignore_mismatch": False}
    assert timing.read_bytes() == b"timings"
    # the next build starts from the saved timings
    log.clear()
    backend._build(_fake_trt(log), b"onnx bytes", settings, timing, "m")
    assert _calls(log, "config.create_timing_cache") == [((b"timings",), {})]


def test_build_reports_parser_errors(tmp_path):
    backend = TensorRTBackend()
    backend._logger = object()
    with pytest.raises(BackendError) as e:
        backend._build(_fake_trt([], parse_ok=False), b"x", BuildSettings(), Path(tmp_path / "t.cache"), "m")
    assert e.value.code == "HYB-304" and "error 0; error 1" in e.value.message


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TENSORRT, reason="needs tensorrt and an NVIDIA GPU")
def test_engine_runs_and_is_cached(tmp_path):
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    options = {"cache_dir": str(tmp_path), "max_batch": 4}
    cm = hybrid.compile(matmul_add(), target="tensorrt", config=options)
    ref = hybrid.compile(matmul_add(), target="onnxruntime")(x)
    np.testing.assert_allclose(cm(x), ref, rtol=1e-3, atol=1e-4)
    assert list(tmp_path.glob("tensorrt/*/*.engine"))
