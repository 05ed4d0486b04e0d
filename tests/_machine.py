"""What this machine offers, asked of the libraries themselves, for tests whose expectation depends on it.

A test asserts what holds on any machine; where the expected outcome legitimately differs (a CPU without
BF16 units refuses bf16), it asks here which outcome applies instead of assuming the development machine's.
"""

from __future__ import annotations


def openvino_cpu_offers(capability: str) -> bool:
    """Whether OpenVINO's CPU plugin lists ``capability`` ('BF16', 'FP16', 'INT8') in its
    OPTIMIZATION_CAPABILITIES (False when OpenVINO is not installed)."""
    try:
        import openvino
    except ImportError:
        return False
    return capability in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
