"""GPU and NPU wiring that can be checked without the hardware.

* ONNX Runtime's CUDA, TensorRT and CANN execution providers: the provider options hybrid builds,
  checked against the names and values ORT documents (its Python layer passes every value through
  ``str()``, and ORT's option parser reads bools as "True"/"False"/"1"/"0").
* ``target='gpu'``/``'cuda'``: the best GPU backend when there is a GPU; the device-fallback policy
  when there is none.

None of these providers ran here: the machines have no GPU and no Ascend NPU (docs/gpu.md).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from tests._models import matmul_add

import hybrid
from hybrid.backends.onnxruntime import provider_chain
from hybrid.errors import BackendError
from hybrid.hal import devices, resolve_target

ALL_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CANNExecutionProvider",
                 "CPUExecutionProvider"]
HAS_GPU = any(d.is_gpu for d in devices())


def _ort_options(**options):
    from hybrid.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend.validate_options(options)


# ---------------------------------------------------------------------------------------------- CUDA / TensorRT EPs
def test_tensorrt_ep_comes_first_with_its_documented_options(tmp_path):
    options = _ort_options(tensorrt=True, fp16=True, max_workspace_size=1 << 30, engine_cache_path=str(tmp_path),
                           gpu_mem_limit=2 << 30, cudnn_conv_algo_search="HEURISTIC")
    chain = provider_chain("cuda:1", options, ALL_PROVIDERS)
    assert [name for name, _ in chain] == ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                           "CPUExecutionProvider"]
    trt, cuda = chain[0][1], chain[1][1]
    assert trt == {"device_id": 1, "trt_fp16_enable": True, "trt_max_workspace_size": 1 << 30,
                   "trt_engine_cache_enable": True, "trt_engine_cache_path": str(tmp_path),
                   "trt_timing_cache_enable": True, "trt_timing_cache_path": str(tmp_path)}
    assert cuda == {"device_id": 1, "gpu_mem_limit": 2 << 30, "cudnn_conv_algo_search": "HEURISTIC"}
    # what ORT's option parser receives (onnxruntime_inference_collection normalizes with str())
    assert {k: str(v) for k, v in trt.items()}["trt_fp16_enable"] == "True"


def test_cuda_ep_alone_and_missing_providers_dropped():
    chain = provider_chain("cuda", _ort_options(tensorrt=True), ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert chain == [("CUDAExecutionProvider", {"device_id": 0}), ("CPUExecutionProvider", {})]
    assert provider_chain("cuda:0", {}, ["CPUExecutionProvider"]) == [("CPUExecutionProvider", {})]


def test_raw_provider_options_pass_through_over_mapped_ones():
    options = _ort_options(tensorrt=True, provider_options={"TensorrtExecutionProvider": {"trt_fp16_enable": False,
                                                                                           "trt_dla_enable": True}})
    trt = dict(provider_chain("cuda", options, ALL_PROVIDERS))["TensorrtExecutionProvider"]
    assert trt["trt_fp16_enable"] is False and trt["trt_dla_enable"] is True


# ---------------------------------------------------------------------------------------------- CANN EP
def test_cann_ep_maps_the_seed_compile_options_and_the_documented_ones():
    options = _ort_options(precision_mode="force_fp16", op_select_impl_mode="high_precision",
                           optypelist_for_implmode="Gelu", npu_mem_limit=8 << 30,
                           arena_extend_strategy="kSameAsRequested", enable_cann_graph=False, dump_graphs=True,
                           dump_om_model=True)
    chain = provider_chain("npu:2", options, ALL_PROVIDERS)
    assert [name for name, _ in chain] == ["CANNExecutionProvider", "CPUExecutionProvider"]
    assert chain[0][1] == {"device_id": 2, "precision_mode": "force_fp16", "op_select_impl_mode": "high_precision",
                           "optypelist_for_implmode": "Gelu", "npu_mem_limit": 8 << 30,
                           "arena_extend_strategy": "kSameAsRequested", "enable_cann_graph": False,
                           "dump_graphs": True, "dump_om_model": True}


def test_seed_ascend_config_compile_options_are_accepted(caplog):
    # the article's ascend_config: {'compile_options': {'aoe_mode': 'subgraph', 'precision_mode': 'force_fp16'}}
    options = _ort_options(aoe_mode="subgraph", precision_mode="force_fp16")
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        chain = provider_chain("npu", options, ALL_PROVIDERS)
    assert chain[0] == ("CANNExecutionProvider", {"device_id": 0, "precision_mode": "force_fp16"})
    # ORT's CANN EP has no AOE option: the warning says how AOE is run instead
    assert "--job_type=1" in caplog.text and "aoe" in caplog.text


@pytest.mark.parametrize("options", [{"precision_mode": "fp16"}, {"aoe_mode": "graph"},
                                     {"arena_extend_strategy": "grow"}, {"enable_cann_graph": 1}])
def test_cann_option_values_are_checked(options):
    with pytest.raises(BackendError) as e:
        _ort_options(**options)
    assert e.value.code == "HYB-306"


# ---------------------------------------------------------------------------------------------- targets
def test_one_device_fallback_policy_for_targets_streams_pipelines_and_tensors(caplog):
    from hybrid.hal import apply_device_fallback

    warned: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        apply_device_fallback("device 'npu:7'", present="cpu", warned=warned)
        apply_device_fallback("device 'npu:7'", present="cpu", warned=warned)
    assert caplog.text.count("device 'npu:7' is not present (present: cpu); falling back to cpu") == 1
    hybrid.init({"device_fallback": "error"})
    try:
        for use in (lambda: apply_device_fallback("device 'npu:7'"), lambda: hybrid.StreamContext("npu:7"),
                    lambda: resolve_target("npu:7")):
            with pytest.raises(BackendError) as e:
                use()
            assert e.value.code == "HYB-307" and "device_fallback is 'error'" in e.value.message
    finally:
        hybrid.init({"device_fallback": "warn"})


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("target", ["gpu", "cuda", "cuda:1"])
def test_gpu_target_without_a_gpu_falls_back_with_a_warning(target, caplog):
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        candidates = resolve_target(target)
    assert candidates and {c.device for c in candidates} == {"cpu"}
    assert "falling back to cpu" in caplog.text
    cm = hybrid.compile(matmul_add(), target=target)
    assert cm.device == "cpu"
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(cm(x), hybrid.compile(matmul_add(), target="onnxruntime")(x), rtol=1e-6)


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("target", ["gpu", "cuda", "torch:cuda", "npu"])
def test_gpu_target_without_a_gpu_under_error_policy_raises(target):
    hybrid.init({"device_fallback": "error"})
    with pytest.raises(BackendError) as e:
        resolve_target(target)
    assert e.value.code == "HYB-307"


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_backend_on_absent_gpu_falls_back_to_its_cpu():
    assert [str(c) for c in resolve_target("torch:cuda")] == ["torch:cpu"]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_gpu_target_picks_gpu_backends_in_priority_order():
    candidates = resolve_target("cuda")
    assert candidates and all(c.device.startswith("cuda") for c in candidates)
    names = [c.backend for c in candidates]
    order = {"tensorrt": 0, "onnxruntime": 1, "torch": 2}
    assert names == sorted(names, key=lambda n: order.get(n, 9))
    assert "torch" in names
    cm = hybrid.compile(matmul_add(), target="gpu")
    assert cm.device.startswith("cuda")
