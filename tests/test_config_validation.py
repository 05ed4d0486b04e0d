"""Configuration is validated by one mechanism: pydantic section models (InitSettings, MemoryPoolSettings,
AutotuneSettings) whose errors become the HYB-101..104 ConfigErrors through config.config_error."""

from __future__ import annotations

import types

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import hybrid
from hybrid.config import InitSettings, backend_sections, config_error, get_config
from hybrid.errors import ConfigError


@pytest.mark.parametrize(("given", "code", "words"), [
    ({"memory_poool": {}}, "HYB-101", ["'memory_poool'", "memory_pool", "num_threads"]),
    ({"memory_pool": {"tpu": "1GB"}}, "HYB-101", ["'memory_pool.tpu'", "cpu, gpu, npu, pinned"]),
    ({"autotune": {"tie_ms": 1}}, "HYB-101", ["'autotune.tie_ms'", "tie_us"]),
    ({"num_threads": 1, "bogus": 1}, "HYB-101", ["'bogus'"]),  # an unknown key is named before a bad value
    ({"device_fallback": "ignore"}, "HYB-102", ["device_fallback: expected one of ('warn', 'error'), got 'ignore'"]),
    ({"num_threads": 0}, "HYB-102", ["num_threads: expected a positive int, got 0"]),
    ({"num_threads": True}, "HYB-102", ["num_threads: expected a positive int, got True"]),
    ({"num_threads": None}, "HYB-102", ["num_threads: expected a positive int, got None"]),
    ({"cache_dir": 3}, "HYB-102", ["cache_dir: expected a path string, got 3"]),
    ({"memory_pool": "2GB"}, "HYB-102", ["memory_pool: expected a mapping, got '2GB'"]),
    ({"backends": [1]}, "HYB-102", ["backends: expected a mapping, got [1]"]),
    ({"backends": {"onnxruntime": 3}}, "HYB-102", ["backends.onnxruntime: expected a mapping, got 3"]),
    ({"autotune": [1]}, "HYB-102", ["autotune: expected a mapping, got [1]"]),
    ({"autotune": {"tie_rel": 1.5}}, "HYB-102", ["autotune.tie_rel: expected less than 1, got 1.5"]),
    ({"memory_pool": {"cpu": "lots"}}, "HYB-103", ["memory_pool.cpu", "'lots'"]),
    ({"memory_pool": {"gpu": True}}, "HYB-103", ["memory_pool.gpu", "True"]),
    ({"log_level": "loud"}, "HYB-104", ["'loud'", "INFO"]),
])
def test_init_errors_name_the_key_what_was_expected_and_what_was_found(given, code, words):
    before = get_config()
    with pytest.raises(ConfigError) as e:
        hybrid.init(given)
    assert e.value.code == code, e.value
    assert all(w in e.value.message for w in words), e.value.message
    assert e.value.hint, "every configuration error says how to fix it"
    assert get_config() is before  # nothing half-applied


def test_init_keys_are_the_section_model_and_only_given_keys_apply():
    hybrid.init({"num_threads": 3, "device_fallback": "error"})
    new = hybrid.init({"memory_pool": types.MappingProxyType({}), "backends": {"onnxruntime": None},
                       "cache_dir": "/tmp/hybrid-cache-test", "autotune": {"tie_us": 10}})
    assert new.num_threads == 3 and new.device_fallback == "error"  # not given: kept
    assert new.backends["onnxruntime"] == {} and new.cache_dir == "/tmp/hybrid-cache-test"
    assert new.autotune == {"tie_us": 10.0} and new.memory_pool == {}
    assert set(InitSettings.model_fields) == {"log_level", "device_fallback", "memory_pool", "backends", "cache_dir",
                                              "num_threads", "autotune"}


def test_backend_sections_check_the_shape_only():
    assert backend_sections({"onnxruntime": {"x": 1}, "openvino": None}) == {"onnxruntime": {"x": 1}, "openvino": {}}
    with pytest.raises(ConfigError) as e:
        backend_sections({"onnxruntime": 3})
    assert e.value.code == "HYB-102" and "backends.onnxruntime: expected a mapping, got 3" in e.value.message
    assert "intra_op_num_threads" in (e.value.hint or "")


def test_serve_backend_config_goes_through_the_same_models():
    from hybrid.serve.core.repository import configure_backends

    with pytest.raises(ConfigError) as e:
        configure_backends({"onnxruntime": "fast"})  # type: ignore[dict-item]
    assert e.value.code == "HYB-102" and "backends.onnxruntime" in e.value.message


def test_config_error_turns_any_section_models_errors_into_the_same_form():
    class Section(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        depth: int = Field(1, ge=1, description="a whole number >= 1", examples=[3])
        name: str = "x"

    with pytest.raises(ValidationError) as v:
        Section.model_validate({"depth": 0})
    err = config_error(v.value, Section, "demo")
    assert (err.code, err.message, err.hint) == ("HYB-102", "demo.depth: expected a whole number >= 1, got 0",
                                                 "e.g. depth=3")
    with pytest.raises(ValidationError) as v:
        Section.model_validate({"name": 5})
    assert config_error(v.value, Section, "demo").message == "demo.name: expected a valid string, got 5"
    with pytest.raises(ValidationError) as v:
        Section.model_validate({"nme": "y", "depth": 0})
    err = config_error(v.value, Section, "demo")
    assert err.code == "HYB-101" and err.message == "unknown configuration key 'demo.nme'; valid keys: depth, name"


def test_serving_settings_and_connection_limits_are_config_sections():
    from hybrid.config import ConfigSection
    from hybrid.serve import BatchSettings, ConnectionLimits

    assert issubclass(BatchSettings, ConfigSection) and issubclass(ConnectionLimits, ConfigSection)
    assert BatchSettings().merged({"max_queue": None}, "here").max_queue is None
    for overrides, code, words in (({"max_batch": -2}, "HYB-102", "here: max_batch: expected an int >= 0, got -2"),
                                   ({"max_batch": True}, "HYB-102", "max_batch: expected an int >= 0, got True"),
                                   ({"batch_timeout": float("nan")}, "HYB-102", "batch_timeout: expected seconds >= 0"),
                                   ({"mx": 1}, "HYB-101", "here: unknown configuration key 'mx'; valid keys: ")):
        with pytest.raises(ConfigError) as e:
            BatchSettings().merged(overrides, "here")
        assert e.value.code == code and words in e.value.message, e.value
    with pytest.raises(ConfigError) as e:
        BatchSettings(concurrency=0)  # construction checks too: no unchecked settings object exists
    assert e.value.code == "HYB-102" and "concurrency: expected an int >= 1, got 0" in e.value.message
    assert ConnectionLimits(header_timeout=30).header_timeout == 30.0
    for bad in ({"header_timeout": 0}, {"keep_alive_timeout": 0}, {"max_connections": 1.5}, {"body_timeout": -1.0}):
        with pytest.raises(ConfigError) as e:
            ConnectionLimits(**bad)
        assert e.value.code == "HYB-102" and next(iter(bad)) in e.value.message and e.value.hint


def test_memory_pools_are_checked_by_the_same_section_model():
    from hybrid.config import pool_sizes
    from hybrid.hal import memory

    assert pool_sizes(types.MappingProxyType({"cpu": "1KB", "gpu": 0})) == {"cpu": 1024, "gpu": 0}
    for bad, code, words in (({"tpu": 1}, "HYB-101", "'memory_pool.tpu'; valid keys: cpu, gpu, npu, pinned"),
                             ({"cpu": "x"}, "HYB-103", "memory_pool.cpu"),
                             (3, "HYB-102", "memory_pool: expected a mapping, got 3")):
        with pytest.raises(ConfigError) as e:
            memory.configure_pools(bad)  # type: ignore[arg-type]
        assert e.value.code == code and words in e.value.message, e.value


def test_optimize_config_is_a_section_model():
    from hybrid.passes import GRAPH_OPTIMIZATION, parse_options
    from hybrid.passes.optimize import GraphOptimization, OptimizeConfig

    assert set(GraphOptimization.model_fields) == set(GRAPH_OPTIMIZATION)  # every switch names its passes
    options = parse_options("O3", {"graph_optimization": types.MappingProxyType({"operator_fusion": False}),
                                   "disabled_passes": ("simplify",), "layout": "NHWC", "dynamic_batch": True,
                                   "fold_size_limit": "1MB", "verify": True, "max_iterations": 3})
    assert options.disabled == {"fuse_operators", "simplify"} and options.dynamic_batch == "N"
    assert options.fold_size_limit == 1 << 20 and (options.layout, options.verify, options.max_iterations) == (
        "NHWC", True, 3)
    for config, code, words in (
            ({"graph_optimization": {"operator_fusion": "yes"}}, "HYB-102",
             "optimize.graph_optimization.operator_fusion: expected True or False, got 'yes'"),
            ({"dynamic_batch": 3}, "HYB-102", "optimize.dynamic_batch: expected True, False or the name"),
            ({"dynamic_batch": ""}, "HYB-102", "optimize.dynamic_batch"),
            ({"disabled_passes": "fuse_operators"}, "HYB-102", "expected a list of pass names"),
            ({"lyout": "NHWC"}, "HYB-101", "'optimize.lyout'; valid keys: disabled_passes"),
            (5, "HYB-102", "optimize: expected a mapping, got 5")):
        with pytest.raises(ConfigError) as e:
            parse_options("O2", config)  # type: ignore[arg-type]
        assert e.value.code == code and words in e.value.message and e.value.hint, e.value
    assert set(OptimizeConfig.model_fields) >= {"graph_optimization", "layout", "max_iterations"}
