"""The partitioner, the partitioned executor, supports() of each backend, and `pyasc compile --explain`."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from tests._auto_models import CUSTOM_DOMAIN, chain, fallback_expected, fallback_model, register_swish

import hybrid
from hybrid.errors import BackendError
from hybrid.hal import Candidate, get_backend
from hybrid.hal.backend import Executable
from hybrid.runtime.executor import PartitionedExecutable
from hybrid.runtime.partition import partition_graph, typed_model

A, B, REF = Candidate("a", "cpu"), Candidate("b", "cpu"), Candidate("reference", "cpu")
ORDER = [A, B, REF]


def _graph(edges: list[list[int]], n_inputs: int = 1) -> ir.Graph:
    """Node i adds the values it reads: graph inputs are -1, -2, ...; node outputs are their index."""
    def name(k: int) -> str:
        return f"in{-k - 1}" if k < 0 else f"v{k}"

    nodes = [helper.make_node("Sum", [name(k) for k in reads], [f"v{i}"], name=f"n{i}")
             for i, reads in enumerate(edges)]
    used = {k for reads in edges for k in reads}
    outs = [f"v{i}" for i in range(len(edges)) if i not in used] or [f"v{len(edges) - 1}"]
    vi = [helper.make_tensor_value_info(f"in{j}", TensorProto.FLOAT, [2]) for j in range(n_inputs)]
    g = helper.make_graph(nodes, "g", vi, [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2]) for o in outs])
    return ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph


def _check_invariants(graph: ir.Graph, able, partition) -> None:
    nodes = list(graph)
    seen: dict[int, Candidate] = {}
    available = {v.name for v in graph.inputs}
    for k, part in enumerate(partition.parts):
        if k:
            assert part.label != partition.parts[k - 1].label, "neighbouring partitions would have merged"
        for name in part.inputs:
            assert name in available, f"partition {k} reads {name} before it exists (a cycle)"
        for i in part.nodes:
            assert i not in seen
            seen[i] = part.label
            assert part.label in able[i]
            if part.label.backend == "reference":
                assert all(c.backend == "reference" for c in able[i]), "fallback took a node others run"
        available.update(v.name for i in part.nodes for v in nodes[i].outputs)
    assert sorted(seen) == list(range(len(nodes)))


def test_contiguous_nodes_merge_and_the_fallback_takes_only_what_nobody_runs():
    # in0 -> n0 -> n1(custom) -> n2 -> n4 ; in0 -> n3 -> n4
    graph = _graph([[-1], [0], [1], [-1], [2, 3]])
    able = [(A, REF), (REF,), (A, REF), (A, REF), (A, REF)]
    p = partition_graph(graph, able, ORDER)
    assert [(part.label, part.nodes) for part in p.parts] == [(A, (0, 3)), (REF, (1,)), (A, (2, 4))]
    assert p.parts[0].outputs == ("v0", "v3") and p.parts[1].inputs == ("v0",) and p.parts[2].inputs == ("v1", "v3")
    _check_invariants(graph, able, p)


def test_merging_never_creates_a_cycle():
    # n0 (a) feeds n1 (b) and n2 (a); n2 also reads n1: n0 and n2 cannot share a partition
    graph = _graph([[-1], [0], [0, 1]])
    able = [(A,), (B,), (A,)]
    p = partition_graph(graph, able, ORDER)
    assert [part.nodes for part in p.parts] == [(0,), (1,), (2,)]
    _check_invariants(graph, able, p)


def test_the_backend_that_absorbs_more_nodes_wins_a_tie_goes_by_priority():
    graph = _graph([[-1], [0], [1], [2]])
    p = partition_graph(graph, [(A, B), (A, B), (B,), (A, B)], ORDER)
    assert [(part.label, part.nodes) for part in p.parts] == [(B, (0, 1, 2, 3))]
    p = partition_graph(graph, [(A, B)] * 4, ORDER)
    assert [(part.label, part.nodes) for part in p.parts] == [(A, (0, 1, 2, 3))]


def test_a_node_nobody_supports_is_a_coded_error_naming_it():
    graph = _graph([[-1], [0]])
    with pytest.raises(BackendError) as e:
        partition_graph(graph, [(A,), ()], ORDER)
    assert e.value.code == "HYB-305" and "'n1'" in e.value.message and "Sum" in e.value.message


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_graphs_partition_into_a_valid_order(data):
    n = data.draw(st.integers(1, 14))
    edges = []
    for i in range(n):
        pool = list(range(-2, i))
        edges.append(sorted(set(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3)))))
    subsets = [(A, REF), (B, REF), (A, B, REF), (REF,)]
    able = [data.draw(st.sampled_from(subsets)) for _ in range(n)]
    graph = _graph(edges, n_inputs=2)
    _check_invariants(graph, able, partition_graph(graph, able, ORDER))


# ------------------------------------------------------------------------------------------- supports()
def _typed_nodes(model: onnx.ModelProto) -> dict[str, ir.Node]:
    typed = typed_model(hybrid.Model.load(model))
    return {n.name: n for n in typed.graph}


def test_supports_answers_per_backend():
    register_swish()
    nodes = _typed_nodes(fallback_model())
    ort, ov, ref = get_backend("onnxruntime"), get_backend("openvino"), get_backend("reference")
    assert ort.supports(nodes["conv"]) and ov.supports(nodes["conv"]) and ref.supports(nodes["conv"])
    assert not ort.supports(nodes["erf64"])  # no double Erf kernel in ORT's CPU provider
    assert ov.supports(nodes["erf64"])
    assert not ort.supports(nodes["swish"]) and not ov.supports(nodes["swish"])
    assert ref.supports(nodes["swish"])


def test_onnxruntime_probes_once_per_op_signature():
    ort = get_backend("onnxruntime")
    nodes = list(typed_model(hybrid.Model.load(chain(["Relu", "Relu", "Relu", "Sigmoid"]))).graph)
    ort.__dict__.pop("_supports_cache", None)
    assert all(ort.supports(n) for n in nodes)
    assert len(ort._supports_cache) == 2


# ------------------------------------------------------------------------------------------- end to end
def test_custom_op_and_an_op_onnxruntime_lacks_run_under_auto_with_the_split_in_the_plan():
    register_swish()
    cm = hybrid.compile(fallback_model(), target="auto", autotune=False)
    plan = cm.plan
    # which accelerator takes which run depends on the machine (a GPU changes the candidates); what holds
    # everywhere: every node once, in order, on a backend that supports it there, neighbours on different
    # backends, and the reference fallback holding only the op nobody else runs
    sample = {"x": np.ones((1, 3, 8, 8), np.float32)}  # types the values after the custom op, as compile does
    nodes = {n.name: n for n in typed_model(hybrid.Model.load(fallback_model()), sample).graph}
    assert [n for s in plan.segments for n in s.nodes] == list(nodes)
    for s in plan.segments:
        assert all(get_backend(s.backend).supports(nodes[n], s.device) for n in s.nodes), s
    assert all((a.backend, a.device) != (b.backend, b.device) for a, b in zip(plan.segments, plan.segments[1:]))
    assert [s.nodes for s in plan.segments if s.backend == "reference"] == [("swish",)]
    assert len(plan.segments) >= 3  # conv before and relu after the custom op run on an accelerator
    assert cm.backend == "+".join(dict.fromkeys(s.backend for s in plan.segments))
    assert cm.device == "+".join(dict.fromkeys(s.device for s in plan.segments))
    where = {p.node: p for p in plan.placements}
    assert [(p.node, p.backend, p.device) for p in plan.placements] == [
        (n, s.backend, s.device) for s in plan.segments for n in s.nodes]
    if where["erf64"].device == "cpu":  # ONNX Runtime's CPU provider has no double Erf
        assert where["erf64"].backend != "onnxruntime" and "not supported by onnxruntime:cpu" in where["erf64"].reason
    assert "custom op" in where["swish"].reason and where["swish"].op_type == f"{CUSTOM_DOMAIN}.Swish"
    text = plan.explain()
    assert "erf64" in text and "reference:cpu" in text and "in:  e" in text
    for batch in (1, 3):  # the symbolic batch survives partitioning
        x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
        np.testing.assert_allclose(cm(x), fallback_expected(x), rtol=1e-4, atol=1e-4)


def test_a_cached_partition_decision_rebuilds_the_same_split_without_checks(monkeypatch):
    from hybrid.runtime.auto import search, trials

    register_swish()
    first = hybrid.compile(fallback_model(), target="auto", autotune=False)

    def boom(*args, **kwargs):
        raise AssertionError("checked or timed although the decision is cached")

    monkeypatch.setattr(search, "time_candidates", boom)
    monkeypatch.setattr(trials.Search, "check", boom)
    second = hybrid.compile(fallback_model(), target="auto", autotune=False)
    assert [s.nodes for s in second.plan.segments] == [s.nodes for s in first.plan.segments]
    assert second.plan.notes[0].startswith("decision read from the autotune cache")
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(second(x), fallback_expected(x), rtol=1e-4, atol=1e-4)


def test_onnxruntime_does_not_spin_next_to_other_runtimes():
    register_swish()
    cm = hybrid.compile(fallback_model(), target="auto", autotune=False)
    ort_steps = [s.executable for s in cm.executable.steps if type(s.executable).__name__ == "OnnxRuntimeExecutable"]
    assert ort_steps
    for exe in ort_steps:
        cfg = exe.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
        assert cfg == "0"


def test_non_auto_targets_partition_only_when_no_single_backend_compiles():
    register_swish()
    cm = hybrid.compile(fallback_model(), target="cpu")
    assert len(cm.plan.segments) >= 2 and "reference" in cm.plan.backends
    x = np.ones((2, 3, 8, 8), np.float32)
    np.testing.assert_allclose(cm(x), fallback_expected(x), rtol=1e-4, atol=1e-4)
    assert hybrid.compile(chain(["Relu"]), target="cpu").plan.segments[0].backend == "onnxruntime"


class _Recorder(Executable):
    """Records the arrays it is given, returns ``fn`` of them."""

    def __init__(self, ins, outs, fn):
        self.input_names, self.output_names, self.fn, self.seen = list(ins), list(outs), fn, []

    def run(self, feeds):
        self.seen.append(dict(feeds))
        return self.fn(*[feeds[n] for n in self.input_names])


def test_boundary_values_are_handed_over_without_copies_and_freed_after_last_use():
    first = _Recorder(["x"], ["h"], lambda x: [x * 2])
    second = _Recorder(["h"], ["y"], lambda h: [h + 1])
    exe = PartitionedExecutable([(first, ["x"], ["h"]), (second, ["h"], ["y"])], ["x"], ["y", "x"])
    x = np.arange(4.0)
    y, x_out = exe.run({"x": x})
    assert first.seen[0]["x"] is x and x_out is x
    produced = first.fn(x)[0]
    np.testing.assert_array_equal(second.seen[0]["h"], produced)
    assert exe.steps[1].free == ("h",) and exe.steps[0].free == ()
    np.testing.assert_array_equal(y, x * 2 + 1)


# ------------------------------------------------------------------------------------------- CLI
def test_pyasc_compile_explain_shows_each_node(tmp_path):
    import typer
    from typer.testing import CliRunner

    from hybrid.cli.compile import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps 'compile' a subcommand
    onnx.save(chain(["Relu", "Sigmoid"]), tmp_path / "m.onnx")
    r = CliRunner().invoke(app, ["compile", str(tmp_path / "m.onnx"), "--target", "onnxruntime", "--explain",
                                 "--per-node"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "onnxruntime:cpu" in r.output and "n0" in r.output and "Sigmoid" in r.output
    r = CliRunner().invoke(app, ["compile", str(tmp_path / "nope.onnx")])
    assert r.exit_code == 1 and "HYB-201" in r.output
