"""examples/article_workflow.py on a fresh process: the article's workflow, every answer equal to raw ONNX Runtime.

Export at opset 11 -> optimize -> quantize static int8 -> jit and compile auto -> platform bundles -> load ->
Pipeline / StreamContext / crop_and_classify / dynamic_batch -> serve -> tritonclient (issue 55).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(600)


def test_the_article_workflow_gives_raw_onnx_runtime_answers_at_every_step(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("tritonclient.grpc")
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "article_workflow.py"), "--size", "64",
                             "--quiet", "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=540,
                            cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    for step in ("export", "optimize", "quantize", "jit", "compile", "bundle", "load", "pipeline", "stream",
                 "dyn-batch", "serve"):
        assert f"| {step} |" in result.stdout, (step, out[-3000:])
    assert "**no**" not in result.stdout
    assert (tmp_path / "yolov5.hybrid").is_file() and (tmp_path / "classifier-ascend-910b.hybrid").is_file()
