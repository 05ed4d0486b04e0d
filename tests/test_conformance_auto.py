"""ONNX node conformance through target='auto' must match the best single backend (issue 4).

Measured (onnx 1.23, 1884 cases, `python ../shared/tools/conformance.py auto --failures`): 1878, the
reference backend's count, in two runs (one with the test suite running alongside); only the six
Bernoulli cases fail. With the steady-state timing (2026-12-03): 1877 in two runs, the seventh failure
a bf16 attention case (tie bound under 0.1 ms), then test_stft_with_window (under 0.15 ms): tiny
graphs where the exact reference wins a 7-17 us tie only while its timing shows it within 20 us.
Auto times candidates, so a loaded machine can tip a near-tie the other way: the floor is the issue's
goal, 1875, and at most 3 cases beyond the known-random ones may fail.
"""

from __future__ import annotations

import importlib.util

import pytest
from tests._conformance import conformance
from tests.test_reference_conformance import RANDOM

FLOOR = 1875 if importlib.util.find_spec("PIL") else 1866


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_auto_conformance_matches_the_best_single_backend():
    passed, failed = conformance("auto")
    assert passed >= FLOOR, f"auto: {passed} passed; failures: {failed}"
    known = RANDOM | {f for f in failed if f.startswith("test_image_decoder")}  # those need Pillow
    assert len(set(failed) - known) <= 3, f"beyond the known failures: {sorted(set(failed) - known)}"
