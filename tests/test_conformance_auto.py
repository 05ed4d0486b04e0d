"""ONNX node conformance through target='auto' must match the best single backend (issue 4).

Auto times its candidates, and which of two answers within tolerance it serves is a matter of speed: on ONNX's
DFT/STFT cases ONNX Runtime's float32 FFT is 2e-5 off the expected values, inside the model-level tolerance auto
checks against but outside the node tests' atol of 1e-7, and the exact reference wins only while its timing ties.
A test that timed them failed whenever a loaded machine tipped 4 such ties (CI, 2026-12-07: 1874 of 1875). So the
timing here is scripted: every candidate takes the same time, every choice is a tie, and the tie goes to the answer
closest to the reference (docs/auto.md). What is left is auto's part that holds on any machine: the checks, the vote
against the reference and the tie rule. On ties the fastest by priority serves wherever its answer to the generated
samples is as exact as the reference's (within 0.01 tolerance units), so three cases go to ONNX Runtime whose test data
sit where its float32 kernels leave the node tests' atol (:data:`EXACT_ON_SAMPLES`): 1875 of 1884, the issue's goal.
"""

from __future__ import annotations

import importlib.util

import pytest
from tests._conformance import conformance
from tests.test_reference_conformance import RANDOM

FLOOR = 1875 if importlib.util.find_spec("PIL") else 1866
# exact on generated samples, outside the node test's atol on its own data: the inverse DFTs (ORT's float32 FFT, 2e-5
# off), and NMS at an IoU exactly on the threshold (a float32 comparison that rounds the other way)
EXACT_ON_SAMPLES = {"test_dft_inverse", "test_dft_inverse_opset19", "test_nonmaxsuppression_iou_threshold_boundary"}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_auto_conformance_matches_the_best_single_backend(monkeypatch):
    from hybrid.runtime.auto import search

    monkeypatch.setattr(search, "time_candidates", lambda runs, *a, **k: dict.fromkeys(runs, 1e-5))
    passed, failed = conformance("auto")
    assert passed >= FLOOR, f"auto: {passed} passed; failures: {failed}"
    known = RANDOM | EXACT_ON_SAMPLES | {f for f in failed if f.startswith("test_image_decoder")}  # those need Pillow
    assert not set(failed) - known, f"beyond the known failures: {sorted(set(failed) - known)}"
