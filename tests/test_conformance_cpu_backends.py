"""ONNX node conformance through hybrid's onnxruntime and openvino targets must not regress.

Measured on the same comparison (onnx 1.23, 1884 cases): raw onnxruntime 1526, raw openvino 1396.
hybrid feeds inputs by the graph's declared names, which is why it passes more cases than raw ORT
fed by session input order.
"""

from __future__ import annotations

import pytest
from tests._conformance import conformance

# counts measured through hybrid (README); raw runtimes: onnxruntime 1526, openvino 1396
EXPECTED = {"onnxruntime": 1589, "openvino": 1396}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("target", sorted(EXPECTED))
def test_conformance_does_not_regress(target):
    passed, failed = conformance(target)
    assert passed >= EXPECTED[target], f"{target}: {passed} passed; failures: {failed}"
