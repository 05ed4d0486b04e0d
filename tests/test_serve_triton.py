"""config.pbtxt in a Triton-layout repository: parsed with protobuf's text format into Triton's ModelConfig,
the fields that map applied, the model checked against it, every field that does not map reported."""

from __future__ import annotations

import logging
import socket

import numpy as np
import pytest
from tests._serve_support import dynamic_squeezenet, tiny_expected, tiny_model
from typer.testing import CliRunner

from hybrid.errors import ServingError
from hybrid.serve import BackgroundServer, ServeOptions, build_registry, create_app, discover

pytest.importorskip("tritonclient.grpc")
import tritonclient.http as th
from tritonclient.grpc import model_config_pb2 as mc

from hybrid.serve.triton.config import model_config, settings_of, unmapped_fields

pytestmark = pytest.mark.timeout(180)

TINY_IO = """
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "scale" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def repo_with(tmp_path, config: str, name: str = "tiny"):
    (tmp_path / "repo" / name / "1").mkdir(parents=True)
    tiny_model(tmp_path / "repo" / name / "1" / "model.onnx")
    (tmp_path / "repo" / name / "config.pbtxt").write_text(config)
    return tmp_path / "repo"


def load_error(repo) -> ServingError:
    with pytest.raises(ServingError) as info:
        build_registry([repo], target="onnxruntime")
    assert info.value.code == "HYB-707"
    return info.value


def test_max_batch_size_0_turns_batching_off_and_is_reported(tmp_path):
    repo = repo_with(tmp_path, 'name: "tiny"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n' + TINY_IO.replace(
        "dims: [ 4 ]", "dims: [ -1, 4 ]").replace("dims: [ 1 ]", "dims: [ -1, 1 ]").replace("dims: [ 3 ]",
                                                                                           "dims: [ -1, 3 ]"))
    registry = build_registry([repo], target="onnxruntime")
    with BackgroundServer(create_app(registry)) as srv:
        model = registry.get("tiny")
        assert model.settings.max_batch == 0
        client = th.InferenceServerClient(srv.url)
        config = client.get_model_config("tiny")
        assert config["max_batch_size"] == 0 and config["platform"] == "onnxruntime_onnx"
        assert config["input"][0]["dims"] == [-1, 4]
        x, scale = np.ones((3, 4), np.float32), np.full((3, 1), 2, np.float32)
        ins = [th.InferInput("x", [3, 4], "FP32"), th.InferInput("scale", [3, 1], "FP32")]
        ins[0].set_data_from_numpy(x)
        ins[1].set_data_from_numpy(scale)
        np.testing.assert_allclose(client.infer("tiny", ins).as_numpy("y"), tiny_expected(x, scale)["y"], rtol=1e-6)


def test_dynamic_batching_and_instance_groups_become_serving_settings(tmp_path):
    repo = repo_with(tmp_path, "max_batch_size: 16\ndynamic_batching { preferred_batch_size: [ 4 ] "
                               "max_queue_delay_microseconds: 2500 default_queue_policy { max_queue_size: 32 } }\n"
                               "instance_group [ { count: 2 kind: KIND_CPU } ]\n" + TINY_IO)
    (source,) = discover([repo])
    assert source.settings == {"max_batch": 4, "batch_timeout": 0.0025, "max_queue": 32, "concurrency": 2}
    assert source.notes == ("instance_group.kind",)
    registry = build_registry([repo], target="onnxruntime")
    try:
        model = registry.get("tiny")
        assert (model.settings.max_batch, model.settings.batch_timeout, model.settings.concurrency) == (4, 0.0025, 2)
        reported = model_config(model)
        assert reported.max_batch_size == 16 and list(reported.dynamic_batching.preferred_batch_size) == [4]
        assert [o.name for o in reported.output] == ["y"]  # the configuration as written, completed
    finally:
        registry.close()


@pytest.mark.parametrize(("kind", "warned"), [("KIND_CPU", False), ("KIND_AUTO", False), ("KIND_GPU", True)])
def test_the_instance_kind_is_reported_only_where_the_model_runs_elsewhere(tmp_path, caplog, kind, warned):
    repo = repo_with(tmp_path, f"max_batch_size: 8\ninstance_group [ {{ count: 1 kind: {kind} }} ]\n" + TINY_IO)
    with caplog.at_level(logging.WARNING, logger="hybrid.serve"):
        build_registry([repo], target="onnxruntime:cpu").close()
    notes = [r.getMessage() for r in caplog.records if "config.pbtxt fields not applied" in r.getMessage()]
    assert bool(notes) is warned and all("instance_group.kind" in n for n in notes)


def test_max_batch_size_without_dynamic_batching_runs_requests_as_they_come():
    config = mc.ModelConfig(max_batch_size=8)
    assert settings_of(config, "here") == ({"max_batch": 0, "max_queue": None}, [])


def test_a_queue_without_a_size_is_unbounded_as_in_triton(tmp_path):
    config = mc.ModelConfig(max_batch_size=8)
    config.dynamic_batching.max_queue_delay_microseconds = 100
    assert settings_of(config, "here")[0]["max_queue"] is None
    config.dynamic_batching.default_queue_policy.max_queue_size = 5
    assert settings_of(config, "here")[0]["max_queue"] == 5
    repo = repo_with(tmp_path, "max_batch_size: 8\ndynamic_batching { }\n" + TINY_IO)
    for overrides, want in (({}, None), ({"max_queue": 64}, 64)):  # the command line still wins
        registry = build_registry([repo], target="onnxruntime", overrides=overrides)
        try:
            model = registry.get("tiny")
            assert model.settings.max_queue == want  # and the configuration the server reports says the same
            assert model_config(model).dynamic_batching.default_queue_policy.max_queue_size == (want or 0)
        finally:
            registry.close()


def test_command_line_settings_win_over_config_pbtxt(tmp_path):
    repo = repo_with(tmp_path, "max_batch_size: 0\n")
    registry = build_registry([repo], target="onnxruntime", overrides={"max_batch": 2})
    try:
        assert registry.get("tiny").settings.max_batch == 2
    finally:
        registry.close()


@pytest.mark.parametrize("config,expected", [
    ("max_batch_size: 8\n" + TINY_IO.replace("dims: [ 4 ]", "dims: [ 5 ]"),
     "input 'x' has dims [5] in config.pbtxt, the model's are [4]"),
    ("max_batch_size: 0\n" + TINY_IO, "input 'x' has dims [4] in config.pbtxt, the model's are ['N', 4]"),
    ("max_batch_size: 8\n" + TINY_IO.replace("name: \"x\" data_type: TYPE_FP32", "name: \"x\" data_type: TYPE_INT64"),
     "input 'x' is TYPE_INT64 in config.pbtxt, the model's is FP32"),
    ("max_batch_size: 8\n" + TINY_IO.replace('name: "y"', 'name: "z"'), "output 'z' is not an output of the model"),
    ('max_batch_size: 8\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]',
     "config.pbtxt lists no input 'scale'"),
    ('name: "other"\nmax_batch_size: 8', "differs from the model folder"),
    ("max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 32 ] }", "must lie in 1..max_batch_size"),
])
def test_a_config_that_does_not_match_the_model_is_refused_naming_the_mismatch(tmp_path, config, expected):
    assert expected in load_error(repo_with(tmp_path, config)).message


def test_a_static_batch_model_cannot_declare_max_batch_size(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "static", [x], [y])
    (tmp_path / "repo" / "relu" / "1").mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              tmp_path / "repo" / "relu" / "1" / "model.onnx")
    (tmp_path / "repo" / "relu" / "config.pbtxt").write_text("max_batch_size: 4\ndynamic_batching { }\n")
    assert "needs a batch dimension" in load_error(tmp_path / "repo").message


def test_unknown_fields_are_parse_errors_and_unmapped_ones_are_reported(tmp_path, caplog):
    bad = repo_with(tmp_path / "a", "max_batch_sizee: 0\n")
    error = load_error(bad)
    assert "config.pbtxt" in error.message and "max_batch_sizee" in error.message
    repo = repo_with(tmp_path / "b", "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 2, 4 ] }\n"
                                     "optimization { graph { level: 1 } }\n"
                                     "parameters { key: \"k\" value { string_value: \"v\" } }\n" + TINY_IO)
    with caplog.at_level(logging.WARNING, logger="hybrid.serve"):
        registry = build_registry([repo], target="onnxruntime")
    registry.close()
    (warning,) = [r.getMessage() for r in caplog.records if "config.pbtxt fields not applied" in r.getMessage()]
    for field in ("optimization", "parameters", "only the largest, 4, is used"):
        assert field in warning
    assert "optimization.graph" not in warning  # the outermost field only
    assert unmapped_fields(mc.ModelConfig(name="m", max_batch_size=1)) == []


def test_config_of_a_model_without_config_pbtxt_is_made_from_the_model(tmp_path):
    registry = build_registry([dynamic_squeezenet(tmp_path / "sq.onnx")], target="onnxruntime",
                              overrides={"max_batch": 4, "batch_timeout": 0.001})
    try:
        config = model_config(registry.get("sq"))
        assert config.max_batch_size == 4 and config.dynamic_batching.max_queue_delay_microseconds == 1000
        assert [(t.name, list(t.dims), mc.DataType.Name(t.data_type)) for t in config.input] == \
            [("data_0", [3, 224, 224], "TYPE_FP32")]
        assert config.version_policy.WhichOneof("policy_choice") == "all"  # without config.pbtxt: every version
    finally:
        registry.close()


def test_version_policies_pick_the_versions_served():
    from google.protobuf import text_format

    from hybrid.serve.triton.config import policy_versions

    def versions(policy: str) -> list[int]:
        return policy_versions(text_format.Parse(policy, mc.ModelConfig()), [3, 1, 10, 2], "m")

    assert versions("") == [10]  # Triton's default: the latest
    assert versions("version_policy { latest { num_versions: 2 } }") == [3, 10]
    assert versions("version_policy { all { } }") == [1, 2, 3, 10]
    assert versions("version_policy { specific { versions: [2, 1] } }") == [1, 2]
    for bad in ("version_policy { specific { versions: [4] } }", "version_policy { latest { num_versions: 0 } }"):
        with pytest.raises(ServingError) as info:
            versions(bad)
        assert info.value.code == "HYB-707", bad


def test_cli_grpc_port_option(tmp_path, monkeypatch):
    """--grpc-port reaches the server options (0: no gRPC); --model-control too."""
    import hybrid.serve.server as server_module

    seen = {}

    def fake_run(app, host, port, drain_timeout, log_level, **kwargs):
        seen["options"] = app.state.hybrid.options
        app.state.hybrid.registry.close()

    monkeypatch.setattr(server_module, "run", fake_run)
    import typer

    from hybrid.cli.serve import register

    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    model = tiny_model(tmp_path / "tiny.onnx")
    runner = CliRunner()
    result = runner.invoke(app, ["serve", str(model), "--target", "onnxruntime", "--grpc-port", "0", "--port", "0"])
    assert result.exit_code == 0, result.output
    assert seen["options"].grpc_address is None and not seen["options"].model_control
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
    result = runner.invoke(app, ["serve", str(model), "--target", "onnxruntime", "--model-control",
                                 "--grpc-port", str(port), "--port", "0"])
    assert result.exit_code == 0, result.output
    assert seen["options"].grpc_address == f"127.0.0.1:{port}" and seen["options"].model_control
    assert ServeOptions().grpc_address is None
    with socket.socket() as taken:  # a port in use is refused before any model loads
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = runner.invoke(app, ["serve", str(model), "--grpc-port", str(taken.getsockname()[1]), "--port", "0"])
    assert result.exit_code == 1 and "HYB-710" in result.output and "--grpc-port" in result.output
    monkeypatch.setenv("HYBRID_GC_MAX_PAUSE_MS", "soon")  # refused before any model loads
    monkeypatch.setattr("hybrid.serve.core.repository.build_registry", lambda *a, **k: pytest.fail("a model loaded"))
    result = runner.invoke(app, ["serve", str(model), "--grpc-port", "0", "--port", "0"])
    assert result.exit_code == 1 and "HYB-102" in result.output and "HYBRID_GC_MAX_PAUSE_MS" in result.output
