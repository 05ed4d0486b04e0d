"""The pass manager, graph verification, the optimize facade and its configuration."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import hybrid
from hybrid.errors import ConfigError, HybridError, ModelError
from hybrid.passes import (
    LEVELS,
    GraphInvalid,
    HybridPass,
    OnnxIrPass,
    PassManager,
    PassResult,
    build_passes,
    parse_options,
    verify_enabled,
    verify_model,
)


def _conv_bn_model(path=None):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([4, 1, 1], np.int64), "bshape")]
    nodes = [helper.make_node("ConstantOfShape", ["bshape"], ["k"],
                              value=numpy_helper.from_array(np.array([0.5], np.float32))),
             helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Mul", ["c", "k"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if path is not None:
        onnx.save(proto, path)
    return proto


class _Counting(HybridPass):
    """Reports a change ``times`` times, then none."""

    name = "counting"

    def __init__(self, times):
        super().__init__()
        self.times = times
        self.calls = 0

    def call(self, model):
        self.calls += 1
        return PassResult(model, self.calls <= self.times)


class _Raising(HybridPass):
    name = "raising"

    def call(self, model):
        raise RuntimeError("boom")


class _Breaking(HybridPass):
    """Appends a node that reads a value defined nowhere."""

    name = "breaking"

    def call(self, model):
        model.graph.append(ir.Node("", "Relu", [ir.Value(name="ghost")], outputs=[ir.Value(name="ghost_out")]))
        return PassResult(model, True)


class _NotInPlace(HybridPass):
    name = "liar"

    def call(self, model):
        return PassResult(model.clone(), True)


def _ir_model():
    return ir.serde.deserialize_model(_conv_bn_model())


def test_manager_repeats_to_a_fixpoint_and_records_history():
    counting = _Counting(times=3)
    manager = PassManager([counting], max_iterations=10, verify=True)
    assert manager(_ir_model()).modified
    assert counting.calls == 4  # three changes, then one quiet round
    assert manager.history == [(0, "counting"), (1, "counting"), (2, "counting")]
    capped = _Counting(times=100)
    PassManager([capped], max_iterations=5)(_ir_model())
    assert capped.calls == 5


def test_manager_names_the_failing_pass():
    with pytest.raises(ModelError) as info:
        PassManager([_Counting(1), _Raising()])(_ir_model())
    assert info.value.code == "HYB-208" and "'raising'" in str(info.value) and "boom" in str(info.value)
    assert "counting" in str(info.value)  # what ran before it
    assert isinstance(info.value.__cause__, RuntimeError)


def test_verification_catches_a_broken_graph(monkeypatch):
    with pytest.raises(ModelError) as info:
        PassManager([_Breaking()], verify=True)(_ir_model())
    assert info.value.code == "HYB-208" and "'breaking'" in str(info.value) and "ghost" in str(info.value)
    PassManager([_Breaking()], max_iterations=1, verify=False)(_ir_model())  # unchecked when off
    monkeypatch.setenv("HYBRID_VERIFY_PASSES", "1")
    assert verify_enabled() and not verify_enabled(False)
    with pytest.raises(ModelError):
        PassManager([_Breaking()], max_iterations=1)(_ir_model())


def test_manager_enforces_the_in_place_promise():
    with pytest.raises(ModelError) as info:
        PassManager([_NotInPlace()])(_ir_model())
    assert info.value.code == "HYB-208" and "liar" in str(info.value)


def test_verify_model_checks_order_names_and_outputs():
    model = _ir_model()
    verify_model(model)
    conv, mul = model.graph.node(1), model.graph.node(2)
    model.graph.remove(mul)  # unsafe removal: the graph output is now produced by nothing in the graph
    with pytest.raises(GraphInvalid, match="output 'y'"):
        verify_model(model)
    model = _ir_model()
    model.graph.node(2).outputs[0].name = "c"  # two values named c
    with pytest.raises(GraphInvalid, match="'c'"):
        verify_model(model)
    model = _ir_model()
    conv = model.graph.node(1)
    model.graph.remove(conv)
    model.graph.append(conv)  # Conv now after its user
    with pytest.raises(GraphInvalid, match="topological"):
        verify_model(model)


def test_onnx_ir_pass_adapter_can_ignore_annotation_changes():
    class Annotating(ir.passes.InPlacePass):
        def call(self, model):
            return PassResult(model, True)

    assert OnnxIrPass("a", Annotating())(_ir_model()).modified
    assert not OnnxIrPass("a", Annotating(), counts=False)(_ir_model()).modified


# ------------------------------------------------------------------ the facade
def test_optimize_accepts_every_model_source_and_never_mutates_it(tmp_path):
    path = tmp_path / "m.onnx"
    proto = _conv_bn_model(path)
    before = proto.SerializeToString()
    model = hybrid.Model.load(proto)
    ir_model = ir.serde.deserialize_model(proto)
    for source in (proto, before, str(path), path, model, ir_model):
        out = hybrid.optimize(source, "O2")
        assert isinstance(out, hybrid.Model) and out is not source
        assert [n.op_type for n in out.graph] == ["Conv"]
    assert proto.SerializeToString() == before
    assert [n.op_type for n in model.graph] == ["ConstantOfShape", "Conv", "Mul"]
    assert len(ir_model.graph) == 3
    assert hybrid.optimize is hybrid.passes.optimize


def test_o0_is_a_copy():
    model = hybrid.Model.load(_conv_bn_model())
    out = hybrid.optimize(model, "O0")
    assert out is not model and out.ir is not model.ir
    assert [n.op_type for n in out.graph] == [n.op_type for n in model.graph]


def test_levels_are_explicit_lists():
    assert LEVELS["O0"] == ()
    assert set(LEVELS["O1"]) < set(LEVELS["O2"]) < set(LEVELS["O3"])
    names = [p.name for p in build_passes(parse_options("O2"))]
    assert names == list(LEVELS["O2"])
    assert parse_options(2).level == parse_options("o2").level == "O2"


def test_seed_config_switches():
    model = hybrid.Model.load(_conv_bn_model())
    seed = hybrid.optimize(model, config={"graph_optimization": {"operator_fusion": True, "constant_folding": True}})
    assert [n.op_type for n in seed.graph] == ["Conv"]
    no_fusion = hybrid.optimize(model, config={"graph_optimization": {"operator_fusion": False}})
    assert [n.op_type for n in no_fusion.graph] == ["Conv", "Mul"]
    no_folding = hybrid.optimize(model, config={"graph_optimization": {"constant_folding": False}})
    assert "ConstantOfShape" in [n.op_type for n in no_folding.graph]
    disabled = hybrid.optimize(model, config={"disabled_passes": ["fuse_operators"]})
    assert [n.op_type for n in disabled.graph] == ["Conv", "Mul"]
    limited = hybrid.optimize(model, config={"fold_size_limit": "8B"})  # the 16-byte constant stays
    assert "ConstantOfShape" in [n.op_type for n in limited.graph]


@pytest.mark.parametrize(("level", "config", "code", "words"), [
    ("O4", None, "HYB-102", "O0, O1, O2, O3"),
    ("O2", {"graph_optimisation": {}}, "HYB-101", "graph_optimization"),
    ("O2", {"graph_optimization": {"fusion": True}}, "HYB-101", "operator_fusion"),
    ("O2", {"graph_optimization": {"operator_fusion": "yes"}}, "HYB-102", "True or False"),
    ("O2", {"disabled_passes": ["fold_everything"]}, "HYB-102", "fold_constants"),
    ("O2", {"layout": "NCWH"}, "HYB-102", "NHWC"),
    ("O2", {"layout": "NHWC"}, "HYB-102", "O3"),
    ("O2", {"dynamic_batch": 3}, "HYB-102", "dynamic_batch"),
    ("O2", {"fold_size_limit": "lots"}, "HYB-103", "fold_size_limit"),
    ("O2", {"max_iterations": 0}, "HYB-102", "max_iterations"),
])
def test_config_is_validated(level, config, code, words):
    with pytest.raises(ConfigError) as info:
        hybrid.optimize(_conv_bn_model(), level, config)
    assert info.value.code == code and words in str(info.value)


def test_bad_models_raise_model_errors(tmp_path):
    with pytest.raises(ModelError) as info:
        hybrid.optimize(tmp_path / "missing.onnx")
    assert info.value.code == "HYB-201"
    with pytest.raises(HybridError) as info:
        hybrid.optimize(b"not a model")
    assert info.value.code == "HYB-202"
    broken = _conv_bn_model()
    broken.graph.node[1].input[0] = "nowhere"
    with pytest.raises(ModelError) as info:
        hybrid.optimize(broken, config={"verify": True})
    assert info.value.code == "HYB-205" and "nowhere" in str(info.value)
