"""One test (or a few) per pass: the structural change it must make, and the numbers it must keep."""

from __future__ import annotations

import collections
import gc

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import hybrid
from hybrid.passes import (
    FoldConstants,
    NormalizeInitializers,
    PassManager,
    cancel_transposes,
    deduplicate_initializers,
    eliminate_common_subexpressions,
    eliminate_identity,
    evaluate_node,
    fold_shapes,
    fuse_operators,
    infer_shapes,
    lift_constants,
    remove_dead_code,
    remove_noops,
    simplify,
)

F = TensorProto.FLOAT


@pytest.fixture(autouse=True)
def _verify(monkeypatch):
    monkeypatch.setenv("HYBRID_VERIFY_PASSES", "1")


def vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def build(nodes, inputs, outputs, inits=None, opset=17, ir_version=8):
    graph = helper.make_graph(nodes, "t", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in (inits or {}).items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    return hybrid.Model.load(proto)


def run(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # test our rewrites, not ORT's
    session = ort.InferenceSession(model.to_bytes(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def apply(model, *passes):
    work = model.ir.clone()
    PassManager(list(passes), verify=True)(work)
    return hybrid.Model(work)


def ops(model):
    return collections.Counter(n.op_type for n in model.graph)


def same(model, new, feeds, rtol=1e-5):
    for a, b in zip(run(model, feeds), run(new, feeds)):
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol * max(1.0, float(np.max(np.abs(a)))))


# ------------------------------------------------------------------ folding
def test_fold_constants_folds_a_constant_chain(rng):
    c = rng.standard_normal((4,)).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32(2.0))),
             helper.make_node("Mul", ["c", "k"], ["ck"]),
             helper.make_node("Exp", ["ck"], ["e"]),
             helper.make_node("Add", ["x", "e"], ["y"])]
    model = build(nodes, [vi("x", [3, 4])], [vi("y", [3, 4])], {"c": c})
    new = apply(model, lift_constants(), FoldConstants(), remove_dead_code())
    assert ops(new) == {"Add": 1}
    folded = new.graph.node(0).inputs[1]
    np.testing.assert_allclose(folded.const_value.numpy(), np.exp(c * 2), rtol=1e-6)
    same(model, new, {"x": rng.standard_normal((3, 4)).astype(np.float32)})


def test_fold_constants_respects_the_size_limit():
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["big"],
                              value=numpy_helper.from_array(np.array([0.5], np.float32))),
             helper.make_node("Add", ["x", "big"], ["y"])]
    model = build(nodes, [vi("x", [512, 512])], [vi("y", [512, 512])], {"s": np.array([512, 512], np.int64)})
    kept = apply(model, FoldConstants(size_limit=512 * 512 * 4 - 1))
    assert ops(kept)["ConstantOfShape"] == 1  # 1 MiB result over a 1 MiB - 1 limit
    folded = apply(model, FoldConstants(size_limit=512 * 512 * 4))
    assert "ConstantOfShape" not in ops(folded)
    same(model, folded, {"x": np.ones((512, 512), np.float32)})


def test_fold_constants_keeps_quantization_boundaries_and_random_ops():
    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"]),
             helper.make_node("RandomUniform", [], ["r"], shape=[4], dtype=F),
             helper.make_node("Add", ["w", "r"], ["wr"]),
             helper.make_node("Mul", ["x", "wr"], ["y"])]
    model = build(nodes, [vi("x", [4])], [vi("y", [4])],
                  {"q": np.array([1, 2, 3, 4], np.int8), "s": np.float32(0.5), "z": np.int8(0)})
    new = apply(model, FoldConstants())
    assert ops(new) == ops(model)


def test_evaluate_node_uses_the_model_opset():
    # opset 9 Unsqueeze takes axes as an attribute (an input from opset 13)
    model = ir.serde.deserialize_model(helper.make_model(helper.make_graph(
        [helper.make_node("Unsqueeze", ["a"], ["b"], axes=[1, 2])], "t", [vi("a", [3])], [vi("b", [3, 1, 1])]),
        opset_imports=[helper.make_opsetid("", 9)]))
    (out,) = evaluate_node(model.graph.node(0), [np.arange(3, dtype=np.float32)])
    assert out.shape == (3, 1, 1)


def test_normalize_initializers_turns_ir3_inputs_into_constants():
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    model = build(nodes, [vi("x", [2]), vi("w", [2])], [vi("y", [2])], {"w": np.ones(2, np.float32)},
                  opset=9, ir_version=3)
    new = apply(model, NormalizeInitializers(), FoldConstants())
    assert [v.name for v in new.graph.inputs] == ["x"] and new.ir.ir_version == 4
    assert new.signature.input_names == model.signature.input_names == ["x"]
    same(model, new, {"x": np.arange(2, dtype=np.float32)})


# ------------------------------------------------------------------ cleanup
def test_remove_noops_and_identity_elimination(rng):
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"]),
             helper.make_node("Identity", ["d"], ["i"]),
             helper.make_node("Concat", ["i"], ["c"], axis=0),
             helper.make_node("Cast", ["c"], ["k"], to=F),
             helper.make_node("Relu", ["k"], ["r"]),
             helper.make_node("Identity", ["r"], ["y"])]
    model = build(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])])
    new = apply(model, infer_shapes(), remove_noops(), eliminate_identity(), remove_dead_code())
    assert ops(new) == {"Relu": 1}
    assert new.signature.output_names == ["y"]  # the graph output keeps its name
    same(model, new, {"x": rng.standard_normal((2, 3)).astype(np.float32)})


def test_dropout_in_training_mode_stays():
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["y"])]
    model = build(nodes, [vi("x", [2])], [vi("y", [2])],
                  {"ratio": np.float32(0.5), "train": np.array(True)})
    assert ops(apply(model, remove_noops(), eliminate_identity())) == {"Dropout": 1}


def test_remove_dead_code_drops_unused_nodes_and_initializers(rng):
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("Mul", ["x", "w"], ["unused"]),
             helper.make_node("Exp", ["unused"], ["unused2"])]
    model = build(nodes, [vi("x", [3])], [vi("y", [3])], {"w": np.ones(3, np.float32)})
    new = apply(model, remove_dead_code())
    assert ops(new) == {"Relu": 1} and len(new.graph.initializers) == 0
    same(model, new, {"x": rng.standard_normal(3).astype(np.float32)})


def test_cse_merges_equal_nodes_and_equal_initializers(rng):
    w = rng.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "w1"], ["a"]),
             helper.make_node("Mul", ["x", "w2"], ["b"]),  # same as a once w1 and w2 are one tensor
             helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("Relu", ["b"], ["rb"]),
             helper.make_node("Sub", ["ra", "rb"], ["y"])]
    model = build(nodes, [vi("x", [4])], [vi("y", [4])], {"w1": w, "w2": w.copy()})
    new = apply(model, deduplicate_initializers(), eliminate_common_subexpressions(), remove_dead_code())
    assert ops(new) == {"Mul": 1, "Relu": 1, "Sub": 1} and len(new.graph.initializers) == 1
    same(model, new, {"x": rng.standard_normal(4).astype(np.float32)})


# ------------------------------------------------------------------ fusion
def _conv_model(rng, tail, extra_inits, out_shape=(1, 8, 6, 6)):
    inits = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
             "b": rng.standard_normal(8).astype(np.float32), **extra_inits}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), *tail]
    return build(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", list(out_shape))], inits)


def test_fuse_conv_batchnorm(rng):
    bn = {"s": rng.uniform(0.5, 2, 8).astype(np.float32), "bb": rng.standard_normal(8).astype(np.float32),
          "m": rng.standard_normal(8).astype(np.float32), "v": rng.uniform(0.5, 2, 8).astype(np.float32)}
    model = _conv_model(rng, [helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"],
                                               epsilon=1e-3)], bn)
    new = apply(model, fuse_operators(), remove_dead_code())
    assert ops(new) == {"Conv": 1} and new.signature.output_names == ["y"]
    same(model, new, {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)})


def test_the_reference_backend_folds_with_the_rule_table(rng):
    """One home for Conv + BN folding: the reference compiles fold_into_weights' copy, the model stays as given."""
    from hybrid.passes.fuse import FUSION_RULES, WEIGHT_FOLDING_RULES, fold_into_weights

    assert set(WEIGHT_FOLDING_RULES) < set(FUSION_RULES)
    bn = {"s": rng.uniform(0.5, 2, 8).astype(np.float32), "bb": rng.standard_normal(8).astype(np.float32),
          "m": rng.standard_normal(8).astype(np.float32), "v": rng.uniform(0.5, 2, 8).astype(np.float32),
          "k": rng.uniform(0.5, 2, (8, 1, 1)).astype(np.float32)}
    model = _conv_model(rng, [helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
                              helper.make_node("Mul", ["n", "k"], ["y"])], bn)
    folded = fold_into_weights(model.ir)
    assert ops(model) == {"Conv": 1, "BatchNormalization": 1, "Mul": 1}  # the given model is not touched
    assert collections.Counter(n.op_type for n in folded.graph) == {"Conv": 1}
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    fused = hybrid.compile(model, target="reference")
    plain = hybrid.compile(model, target="reference", config={"fuse": False})
    assert [s.op_type for s in fused.executable.program.steps] == ["Conv"]
    assert len(plain.executable.program.steps) == 3
    np.testing.assert_allclose(fused(x), plain(x), rtol=1e-5, atol=1e-5)


def _arrays_in(objects):
    """The numpy arrays among ``objects`` and what they refer to directly (an ir.Tensor's array)."""
    found = {}
    for obj in objects:
        for item in (obj, *gc.get_referents(obj)):
            if isinstance(item, np.ndarray):
                found[id(item)] = item
    return found


def test_the_reference_compile_leaves_no_weights_to_the_cyclic_collector(rng):
    """Issue 27: the folded copy is a web of reference cycles, freed only by a full collection; it must not
    hold arrays the program does not (the unfused weights constant folding computed). Held there, they
    kept megabytes in the heap, a run's temporaries then moved glibc's heap top and every run page-faulted
    them in again (shufflenet 1.3x slower on the reference backend)."""
    from hybrid.passes.fuse import fold_into_weights

    bn = {"s": rng.uniform(0.5, 2, 8).astype(np.float32), "bb": rng.standard_normal(8).astype(np.float32),
          "m": rng.standard_normal(8).astype(np.float32), "v": rng.uniform(0.5, 2, 8).astype(np.float32),
          "flat": rng.standard_normal(8 * 3 * 3 * 3).astype(np.float32),
          "wshape": np.array([8, 3, 3, 3], np.int64)}
    nodes = [helper.make_node("Reshape", ["flat", "wshape"], ["w"]),  # a weight computed: constant folding's
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"])]
    model = build(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", [1, 8, 6, 6])], bn)
    folded = fold_into_weights(model.ir)
    assert [n.op_type for n in folded.graph] == ["Conv"]
    assert all(v.uses() for v in folded.graph.initializers.values())  # the unfused weight is gone
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        compiled = hybrid.compile(model, target="reference")
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        garbage = _arrays_in(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    program = compiled.executable.program
    held = _arrays_in([*program._template, *(s.run for s in program.steps)])
    held |= {id(a.base): a.base for a in held.values() if isinstance(a.base, np.ndarray)}
    stray = [a.shape for i, a in garbage.items() if i not in held and a.nbytes > 64]
    assert not stray, f"arrays only the compile's cyclic garbage holds: {stray}"
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(compiled(x), hybrid.compile(model, target="reference", config={"fuse": False})(x),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Mul", "Add", "Sub", "Div"])
def test_fuse_conv_per_channel_affine(rng, op):
    c = rng.uniform(0.5, 2, (8, 1, 1)).astype(np.float32)
    model = _conv_model(rng, [helper.make_node(op, ["c", "k"], ["y"])], {"k": c})
    new = apply(model, fuse_operators(), remove_dead_code())
    assert ops(new) == {"Conv": 1}
    same(model, new, {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)})


def test_fuse_leaves_what_it_must(rng):
    spatial = rng.standard_normal((8, 6, 6)).astype(np.float32)  # not per channel
    model = _conv_model(rng, [helper.make_node("Mul", ["c", "k"], ["y"])], {"k": spatial})
    assert ops(apply(model, fuse_operators())) == {"Conv": 1, "Mul": 1}
    reversed_sub = _conv_model(rng, [helper.make_node("Sub", ["k", "c"], ["y"])],
                               {"k": np.ones((8, 1, 1), np.float32)})
    assert ops(apply(reversed_sub, fuse_operators())) == {"Conv": 1, "Sub": 1}
    shared = _conv_model(rng, [helper.make_node("Mul", ["c", "k"], ["m"]), helper.make_node("Add", ["m", "c"], ["y"])],
                         {"k": np.full((8, 1, 1), 2, np.float32)})  # the Conv output has two users
    assert ops(apply(shared, fuse_operators())) == {"Conv": 1, "Mul": 1, "Add": 1}


def test_fuse_batchnorm_with_following_scale(rng):
    bn = {"s": rng.uniform(0.5, 2, 4).astype(np.float32), "bb": rng.standard_normal(4).astype(np.float32),
          "m": rng.standard_normal(4).astype(np.float32), "v": rng.uniform(0.5, 2, 4).astype(np.float32),
          "k": rng.standard_normal((4, 1, 1)).astype(np.float32),
          "t": rng.standard_normal((4, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["n"]),
             helper.make_node("Mul", ["n", "k"], ["nk"]),
             helper.make_node("Add", ["nk", "t"], ["y"])]
    model = build(nodes, [vi("x", [2, 4, 5, 5])], [vi("y", [2, 4, 5, 5])], bn)
    new = apply(model, infer_shapes(), fuse_operators(), remove_dead_code())
    assert ops(new) == {"BatchNormalization": 1}
    same(model, new, {"x": rng.standard_normal((2, 4, 5, 5)).astype(np.float32)})


def test_fuse_matmul_add_to_gemm(rng):
    inits = {"w": rng.standard_normal((16, 8)).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["b", "m"], ["y"])]
    model = build(nodes, [vi("x", ["batch", 16])], [vi("y", ["batch", 8])], inits)
    new = apply(model, infer_shapes(), fuse_operators(), remove_dead_code())
    assert ops(new) == {"Gemm": 1}
    same(model, new, {"x": rng.standard_normal((5, 16)).astype(np.float32)})
    # a 3-D MatMul is not a Gemm
    model3 = build(nodes, [vi("x", [2, 5, 16])], [vi("y", [2, 5, 8])], inits)
    assert ops(apply(model3, infer_shapes(), fuse_operators())) == {"MatMul": 1, "Add": 1}
    # an addend that would widen the result is not Gemm's one-way C
    wide = build(nodes, [vi("x", [1, 16])], [vi("y", [3, 8])],
                 {"w": inits["w"], "b": rng.standard_normal((3, 8)).astype(np.float32)})
    assert ops(apply(wide, infer_shapes(), fuse_operators())) == {"MatMul": 1, "Add": 1}


# ------------------------------------------------------------------ shapes
def test_fold_shapes_static_and_symbolic(rng):
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["d0"]),  # the batch: symbolic, stays computed
             helper.make_node("Gather", ["s", "i1"], ["d1"]),  # 4: folds
             helper.make_node("Gather", ["s", "i2"], ["d2"]),  # 6: folds
             helper.make_node("Mul", ["d1", "d2"], ["d12"]),
             helper.make_node("Unsqueeze", ["d0", "ax"], ["u0"]),
             helper.make_node("Unsqueeze", ["d12", "ax"], ["u12"]),
             helper.make_node("Concat", ["u0", "u12"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = {"i0": np.int64(0), "i1": np.int64(1), "i2": np.int64(2), "ax": np.array([0], np.int64)}
    model = build(nodes, [vi("x", ["N", 4, 6])], [vi("y", ["N", 24])], inits)
    new = apply(model, infer_shapes(), fold_shapes(), FoldConstants(), remove_dead_code())
    assert ops(new) == {"Shape": 1, "Gather": 1, "Unsqueeze": 1, "Concat": 1, "Reshape": 1}
    same(model, new, {"x": rng.standard_normal((3, 4, 6)).astype(np.float32)})
    static = build(nodes, [vi("x", [2, 4, 6])], [vi("y", [2, 24])], inits)
    new_static = apply(static, infer_shapes(), fold_shapes(), FoldConstants(), remove_dead_code())
    assert ops(new_static) == {"Reshape": 1}
    assert new_static.graph.node(0).inputs[1].const_value.numpy().tolist() == [2, 24]


def test_fold_shapes_merges_reshapes_and_drops_noops(rng):
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]),
             helper.make_node("Reshape", ["a", "s2"], ["b"]),
             helper.make_node("Reshape", ["b", "s3"], ["y"])]  # to the shape b already has
    inits = {"s1": np.array([6, 4], np.int64), "s2": np.array([0, 2, 2], np.int64),
             "s3": np.array([6, -1, 2], np.int64)}
    model = build(nodes, [vi("x", [2, 3, 4])], [vi("y", [6, 2, 2])], inits)
    new = apply(model, infer_shapes(), fold_shapes(), eliminate_identity(), remove_dead_code())
    assert ops(new) == {"Reshape": 1}
    same(model, new, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})


# ------------------------------------------------------------------ transposes
def test_cancel_transposes(rng):
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 3, 1]),
             helper.make_node("Relu", ["t1"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t2"], perm=[0, 3, 1, 2]),  # cancels t1 around the Relu
             helper.make_node("Transpose", ["t2"], ["t3"], perm=[1, 0, 2, 3]),
             helper.make_node("Transpose", ["t3"], ["t4"], perm=[0, 1, 3, 2]),  # t3, t4 merge into one
             helper.make_node("Transpose", ["t4"], ["y"], perm=[0, 1, 2, 3])]   # identity
    model = build(nodes, [vi("x", [2, 3, 4, 5])], [vi("y", [3, 2, 5, 4])])
    new = apply(model, cancel_transposes(), eliminate_identity(), remove_dead_code())
    assert ops(new) == {"Relu": 1, "Transpose": 1}
    assert [list(a.as_ints()) for a in (n.attributes.get("perm") for n in new.graph) if a] == [[1, 0, 3, 2]]
    same(model, new, {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32)})


# ------------------------------------------------------------------ O3 simplification
def test_simplify_is_exact(rng):
    nodes = [helper.make_node("Mul", ["x", "one"], ["a"]),
             helper.make_node("Relu", ["a"], ["r1"]),
             helper.make_node("Relu", ["r1"], ["r2"]),
             helper.make_node("Unsqueeze", ["r2", "ax"], ["u"]),
             helper.make_node("Squeeze", ["u", "ax"], ["s"]),
             helper.make_node("Concat", ["s", "x"], ["c1"], axis=1),
             helper.make_node("Concat", ["c1", "x"], ["y"], axis=-1)]
    inits = {"one": np.ones((1, 4), np.float32), "ax": np.array([0], np.int64)}
    model = build(nodes, [vi("x", [3, 4])], [vi("y", [3, 12])], inits)
    new = apply(model, infer_shapes(), simplify(), eliminate_identity(), remove_dead_code())
    assert ops(new) == {"Relu": 1, "Concat": 1}
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run(new, {"x": x})[0], run(model, {"x": x})[0])  # bit for bit


def test_output_is_standard_onnx(rng):
    model = _conv_model(rng, [helper.make_node("Relu", ["c"], ["y"])], {})
    new = hybrid.optimize(model, "O3")
    onnx.checker.check_model(new.to_onnx(), full_check=True)
