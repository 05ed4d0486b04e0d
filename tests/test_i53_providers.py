"""The two calls against the layer flow go through hybrid.providers, installed by the facade (issue 53 item 5).

``CompiledModel.save`` writes a bundle and constant folding evaluates nodes with the reference kernels, though
the runtime imports nothing of the bundle and the passes nothing of the backends. Each check runs in a fresh
interpreter that imports only the low module, so nothing imported earlier by the test session can stand in for
the facade's installation.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

import hybrid
from hybrid import providers


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_save_from_the_runtime_alone_writes_a_bundle_that_loads(tmp_path: Path) -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model_path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model_path)
    out = _run(f"""
        import sys
        from hybrid.runtime.compiler import compile_model
        cm = compile_model({str(model_path)!r}, target="cpu")
        print("hybrid.bundle" in sys.modules)
        cm.save({str(tmp_path / "m.hybrid")!r})
        print("hybrid.bundle" in sys.modules)
    """)
    assert out.split() == ["False", "True"]  # imported by the save, not before
    loaded = hybrid.load(str(tmp_path / "m.hybrid"), target="cpu")
    np.testing.assert_array_equal(loaded(np.array([-1.0, 2.0], np.float32)), [0.0, 2.0])


def test_folding_from_the_passes_alone_evaluates_with_the_reference_kernels() -> None:
    out = _run("""
        import sys
        import numpy as np
        import onnx_ir as ir
        from hybrid.passes.fold import evaluate_node
        print("hybrid.backends.reference.evaluate" in sys.modules)
        a, b = ir.Value(name="a"), ir.Value(name="b")
        node = ir.Node("", "Add", [a, b], num_outputs=1, version=17)
        print(evaluate_node(node, [np.array([1, 2], np.int64), np.array([10], np.int64)])[0].tolist())
        print("hybrid.backends.reference.evaluate" in sys.modules)
    """)
    assert out.splitlines() == ["False", "[11, 12]", "True"]


def test_the_installed_evaluator_is_the_reference_backends() -> None:
    from hybrid.backends.reference import custom_op

    # an op only hybrid's reference backend knows (ONNX's reference evaluator has no kernel for it)
    @custom_op("TimesThree", domain="test.i53")
    def _times_three(x: np.ndarray) -> np.ndarray:
        return x * 3

    x = ir.Value(name="x")
    node = ir.Node("test.i53", "TimesThree", [x], num_outputs=1, version=1)
    assert providers.evaluate_node(node, [np.array([2.0], np.float32)])[0].tolist() == [6.0]
