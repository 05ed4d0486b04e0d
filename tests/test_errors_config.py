"""Error catalog, explain, and hybrid.init / set_backend / set_log_level validation."""

from __future__ import annotations

import logging
import pickle
import re

import pytest

import hybrid
from hybrid.config import get_config, parse_size
from hybrid.errors import CATALOG, ConfigError, HybridError, RunError, explain


def test_catalog_codes_are_stable_and_grouped():
    for code, info in CATALOG.items():
        assert re.fullmatch(r"HYB-[1-7]\d\d", code), code
        assert info.title and info.explanation


def test_error_carries_code_message_hint_and_pickles():
    err = RunError("HYB-401", "missing input 'x'", "pass it")
    assert isinstance(err, HybridError)
    assert err.code == "HYB-401" and "missing input 'x'" in str(err) and "hint: pass it" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is RunError and again.code == "HYB-401" and again.hint == "pass it"
    with pytest.raises(ValueError):
        HybridError("HYB-999", "nope")


def test_explain_accepts_short_and_full_codes():
    assert explain("301").startswith("HYB-301: unknown target")
    assert explain("hyb-401").startswith("HYB-401")
    with pytest.raises(KeyError):
        explain("HYB-999")


@pytest.mark.parametrize(("text", "expected"), [
    (0, 0), (1024, 1024), ("512MB", 512 << 20), ("4GB", 4 << 30), ("1.5GiB", int(1.5 * (1 << 30))),
    ("2k", 2048), ("100", 100), (" 3 G ", 3 << 30),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["4 gigs", "-1", -5, True, 1.5, None, "GB"])
def test_parse_size_rejects(bad):
    with pytest.raises(ConfigError) as e:
        parse_size(bad, "memory_pool.cpu")
    assert e.value.code == "HYB-103" and "memory_pool.cpu" in e.value.message


def test_init_rejects_unknown_keys_naming_valid_ones():
    with pytest.raises(ConfigError) as e:
        hybrid.init({"memory_poool": {}})
    assert e.value.code == "HYB-101" and "memory_poool" in e.value.message and "memory_pool" in e.value.message
    with pytest.raises(ConfigError) as e:
        hybrid.init({"memory_pool": {"tpu": "1GB"}})
    assert e.value.code == "HYB-101" and "memory_pool.tpu" in e.value.message and "gpu" in e.value.message


def test_init_validates_values():
    with pytest.raises(ConfigError) as e:
        hybrid.init({"device_fallback": "ignore"})
    assert e.value.code == "HYB-102" and "device_fallback" in e.value.message and "'ignore'" in e.value.message
    with pytest.raises(ConfigError) as e:
        hybrid.init(num_threads=0)
    assert e.value.code == "HYB-102" and "num_threads" in e.value.message
    with pytest.raises(ConfigError) as e:
        hybrid.init({"memory_pool": {"cpu": "lots"}})
    assert e.value.code == "HYB-103"


def test_init_keeps_unmentioned_keys_and_failed_init_changes_nothing():
    hybrid.init({"device_fallback": "error", "num_threads": 2})
    with pytest.raises(ConfigError):
        hybrid.init({"num_threads": 1, "bogus": 1})
    cfg = get_config()
    assert cfg.device_fallback == "error" and cfg.num_threads == 2
    hybrid.init(num_threads=1)
    assert get_config().device_fallback == "error" and get_config().num_threads == 1


def test_set_backend_validates_against_declared_options():
    hybrid.set_backend("onnxruntime", {"intra_op_num_threads": 1, "graph_optimization_level": "basic"})
    assert get_config().backends["onnxruntime"]["intra_op_num_threads"] == 1
    with pytest.raises(HybridError) as e:
        hybrid.set_backend("onnxruntime", {"threads": 2})
    assert e.value.code == "HYB-306" and "'threads'" in e.value.message and "intra_op_num_threads" in e.value.message
    with pytest.raises(HybridError) as e:
        hybrid.set_backend("onnxruntime", {"graph_optimization_level": "max"})
    assert e.value.code == "HYB-306" and "'max'" in e.value.message
    with pytest.raises(HybridError) as e:
        hybrid.set_backend("onnxruntime", {"intra_op_num_threads": "2"})
    assert e.value.code == "HYB-306" and "expected int" in e.value.message
    with pytest.raises(HybridError) as e:
        hybrid.set_backend("tpu-runtime", {})
    assert e.value.code == "HYB-301" and "tpu-runtime" in e.value.message and "onnxruntime" in e.value.message


def test_init_backends_section_is_validated():
    with pytest.raises(HybridError) as e:
        hybrid.init({"backends": {"openvino": {"inference_precision": "f8"}}})
    assert e.value.code == "HYB-306" and "inference_precision" in e.value.message
    hybrid.init({"backends": {"openvino": {"inference_precision": "bf16"}}})
    assert get_config().backends["openvino"] == {"inference_precision": "bf16"}


def test_set_log_level():
    hybrid.set_log_level("debug")
    assert logging.getLogger("hybrid").level == logging.DEBUG
    hybrid.set_log_level(logging.WARNING)
    assert logging.getLogger("hybrid").level == logging.WARNING
    with pytest.raises(ConfigError) as e:
        hybrid.set_log_level("loud")
    assert e.value.code == "HYB-104" and "'loud'" in e.value.message


def test_failed_pool_init_leaves_the_config_unchanged():
    if any(d.is_gpu for d in hybrid.devices()):
        pytest.skip("this machine has a GPU")
    hybrid.init({"device_fallback": "error"})
    with pytest.raises(HybridError) as e:
        hybrid.init({"memory_pool": {"cpu": "1MB", "gpu": "1GB"}})
    assert e.value.code == "HYB-307"
    assert get_config().memory_pool == {}
