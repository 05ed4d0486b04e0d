"""Sequence batching (hybrid.serve.triton.sequences): stateful models served as Triton serves them.

The settings are read from ``config.pbtxt`` and checked against the model; the sequences' order, controls, state
and idle release run on a scripted clock; end to end, HTTP, gRPC and a gRPC stream carry sequences whose answers
must equal the running sums the stateful model computes, whatever the batching. ``tests/test_serve_vs_triton.py``
compares the answers and errors with the real Triton's.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tests._serve_support import STATEFUL_PBTXT, serving, stateful_model, stateful_repo, tiny_model
from tritonclient.grpc import model_config_pb2 as mc

from hybrid.errors import ServingError
from hybrid.runtime.compiler import compile_model
from hybrid.serve import build_registry
from hybrid.serve.triton.sequences import Control, SequenceFlags, Sequences, SequenceSettings, sequence_flags

pytestmark = pytest.mark.timeout(120)


def _config(text: str = "", idle_us: int = 5_000_000) -> mc.ModelConfig:
    return text_format.Parse(text or STATEFUL_PBTXT.format(name="seq", idle_us=idle_us), mc.ModelConfig())


@pytest.fixture(scope="module")
def signature(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = stateful_model(tmp_path_factory.mktemp("seq") / "model.onnx")
    compiled = compile_model(path, target="onnxruntime")
    yield compiled.signature
    compiled.close()


# ---------------------------------------------------------------------------------------------------- parameters
def test_sequence_parameters():
    assert sequence_flags(None, None, None) is None
    assert sequence_flags(7, True, None) == SequenceFlags(7, start=True, end=False)
    assert sequence_flags("abc", None, True) == SequenceFlags("abc", start=False, end=True)
    assert sequence_flags(None, True, None) == SequenceFlags(0, start=True)  # refused by a sequence model
    for bad in ({"sequence_id": -1}, {"sequence_id": 1 << 64}, {"sequence_id": 1.5}, {"sequence_id": True},
                {"sequence_id": 3, "start": 1}, {"sequence_id": 3, "end": "yes"}):
        with pytest.raises(ServingError) as info:
            sequence_flags(bad["sequence_id"], bad.get("start"), bad.get("end"))
        assert info.value.code == "HYB-702"


# ---------------------------------------------------------------------------------------------------- settings
def test_settings_from_config(signature, tmp_path):
    settings = SequenceSettings.from_config(_config(), signature, "seq", tmp_path)
    assert [(c.name, c.kind, str(c.dtype), c.false_true) for c in settings.controls] == [
        ("START", "START", "float32", (0.0, 1.0)), ("READY", "READY", "float32", (0.0, 1.0)),
        ("END", "END", "int32", (0, 1)), ("CORRID", "CORRID", "uint64", (0, 1))]
    assert settings.idle_s == 5.0 and settings.server_inputs == {"START", "READY", "END", "CORRID", "state_in"}
    assert settings.hidden_outputs == {"state_out"}  # config.pbtxt does not list it as an output
    state = settings.states[0]
    assert (state.input_name, state.output_name, state.initial.tolist()) == ("state_in", "state_out", [0.0, 0.0])
    assert SequenceSettings.from_config(mc.ModelConfig(), signature, "seq") is None


def test_an_initial_state_file_is_read_from_the_model_folder(signature, tmp_path):
    text = STATEFUL_PBTXT.format(name="seq", idle_us=1000).replace("zero_data: true", 'data_file: "init.bin"')
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init.bin").write_bytes(np.array([1.5, -2], "<f4").tobytes())
    settings = SequenceSettings.from_config(_config(text), signature, "seq", tmp_path)
    assert settings.states[0].initial.tolist() == [1.5, -2.0]
    (tmp_path / "initial_state" / "init.bin").write_bytes(b"\0" * 4)
    with pytest.raises(ServingError, match="holds 4 bytes"):
        SequenceSettings.from_config(_config(text), signature, "seq", tmp_path)
    with pytest.raises(ServingError, match="not a file"):
        SequenceSettings.from_config(_config(text.replace("init.bin", "../model.onnx")), signature, "seq", tmp_path)


@pytest.mark.parametrize(("old", "new", "says"), [
    ('name: "START"', 'name: "BEGIN"', "not an input of the model"),
    ("fp32_false_true: [0, 1] } ] },\n    { name: \"READY\"", "} ] },\n    { name: \"READY\"", "needs one of"),
    ("data_type: TYPE_UINT64 }", "}", "needs a data_type"),
    ("int32_false_true: [0, 1]", "fp32_false_true: [0, 1]", "the model's input is int32"),
    ('output_name: "state_out"', 'output_name: "y_state"', "must name an input and an output"),
    ("{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }",
     "{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }, { kind: CONTROL_SEQUENCE_END fp32_false_true: [0, 1] }",
     "exactly one control"),
    ("zero_data: true", "zero_data: true dims: [-1]", "needs fixed dims"),
])
def test_bad_sequence_settings_are_hyb_707(signature, tmp_path, old, new, says):
    text = STATEFUL_PBTXT.format(name="seq", idle_us=1000)
    assert old in text
    with pytest.raises(ServingError) as info:
        SequenceSettings.from_config(_config(text.replace(old, new, 1)), signature, "seq", tmp_path)
    assert info.value.code == "HYB-707" and says in info.value.message, info.value.message


# ---------------------------------------------------------------------------------------------------- scripted
class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _sequences(signature: Any, clock: _Clock, idle_us: int = 1_000_000) -> Sequences:
    return Sequences(SequenceSettings.from_config(_config(idle_us=idle_us), signature, "seq"), "seq", True, clock)


def _step(seqs: Sequences, flags: SequenceFlags | None, x: float, rows: int = 1) -> dict[str, np.ndarray]:
    """Run one request through ``seqs`` with a model that does what the stateful model does."""
    feeds = {"x": np.full((rows, 2), x, np.float32)}

    async def queue() -> dict[str, np.ndarray]:
        y = feeds["x"] + feeds["state_in"]
        ctl = np.concatenate([feeds["START"], feeds["READY"], feeds["END"].astype(np.float32),
                              feeds["CORRID"].astype(np.float32)], axis=1)
        return {"y": y, "state_out": y, "ctl": ctl}

    return asyncio.run(seqs.run(flags, rows, feeds, queue))


def _refused(seqs: Sequences, flags: SequenceFlags | None, says: str, rows: int = 1) -> None:
    with pytest.raises(ServingError) as info:
        _step(seqs, flags, 1.0, rows)
    assert info.value.code == "HYB-702" and says in info.value.message, info.value.message


def test_a_sequence_keeps_its_state_and_controls_until_it_ends(signature):
    seqs = _sequences(signature, _Clock())
    _refused(seqs, None, "must specify a non-zero or non-empty correlation ID")
    _refused(seqs, SequenceFlags(0, start=True), "non-zero")
    _refused(seqs, SequenceFlags(7), "must specify the START flag on the first request of the sequence")
    out = _step(seqs, SequenceFlags(7, start=True), 1.0)
    assert out["y"].tolist() == [[1.0, 1.0]] and out["ctl"].tolist() == [[1, 1, 0, 7]]
    assert "state_out" not in out  # not an output the configuration lists
    _refused(seqs, SequenceFlags(7), "batch-size 1 due to requirements of sequence batcher", rows=2)
    assert _step(seqs, SequenceFlags(7), 2.0)["y"].tolist() == [[3.0, 3.0]]
    assert _step(seqs, SequenceFlags(8, start=True), 10.0)["y"].tolist() == [[10.0, 10.0]]  # another, its own
    out = _step(seqs, SequenceFlags(7, end=True), 3.0)
    assert out["y"].tolist() == [[6.0, 6.0]] and out["ctl"].tolist() == [[0, 1, 1, 7]]
    _refused(seqs, SequenceFlags(7), "START flag")
    assert _step(seqs, SequenceFlags(7, start=True), 1.0)["y"].tolist() == [[1.0, 1.0]]  # a new one, from zero
    assert _step(seqs, SequenceFlags(7, start=True), 5.0)["y"].tolist() == [[5.0, 5.0]]  # START again: reset
    assert len(seqs) == 2
    _refused(seqs, SequenceFlags("abc", start=True), "is a string, but model 'seq' takes its correlation id as uint64")
    assert len(seqs) == 2  # refused before it started
    assert _step(seqs, SequenceFlags((1 << 64) - 1, start=True), 1.0)["ctl"][0, 3] == float((1 << 64) - 1)


def test_a_sequence_id_must_fit_the_correlation_id():
    narrow = Sequences(SequenceSettings(controls=(Control("CORRID", "CORRID", np.dtype(np.int32)),)), "m", True)

    async def queue() -> dict[str, np.ndarray]:
        return {}

    with pytest.raises(ServingError, match=r"does not fit model 'm'.s correlation id, int32") as info:
        asyncio.run(narrow.run(SequenceFlags(1 << 40, start=True), 1, {}, queue))
    assert info.value.code == "HYB-702" and len(narrow) == 0
    feeds: dict[str, np.ndarray] = {}
    asyncio.run(narrow.run(SequenceFlags(5, start=True), 1, feeds, queue))
    assert feeds["CORRID"].tolist() == [[5]] and feeds["CORRID"].dtype == np.int32


def test_a_failed_request_leaves_the_state_and_an_end_releases_it(signature):
    seqs = _sequences(signature, _Clock())
    _step(seqs, SequenceFlags(3, start=True), 2.0)

    async def failing() -> dict[str, np.ndarray]:
        raise RuntimeError("the model failed")

    with pytest.raises(RuntimeError):
        asyncio.run(seqs.run(SequenceFlags(3), 1, {"x": np.ones((1, 2), np.float32)}, failing))
    assert _step(seqs, SequenceFlags(3), 1.0)["y"].tolist() == [[3.0, 3.0]]
    with pytest.raises(RuntimeError):
        asyncio.run(seqs.run(SequenceFlags(3, end=True), 1, {"x": np.ones((1, 2), np.float32)}, failing))
    _refused(seqs, SequenceFlags(3), "START flag")
    assert len(seqs) == 0


def test_an_idle_sequence_is_released(signature):
    clock = _Clock()
    seqs = _sequences(signature, clock, idle_us=200_000)
    _step(seqs, SequenceFlags(1, start=True), 1.0)
    _step(seqs, SequenceFlags(2, start=True), 1.0)
    clock.now += 0.15
    _step(seqs, SequenceFlags(2), 1.0)  # within the limit
    clock.now += 0.1
    _refused(seqs, SequenceFlags(1), "START flag")  # idle 0.25 s > 0.2 s
    assert _step(seqs, SequenceFlags(2), 1.0)["y"].tolist() == [[3.0, 3.0]]
    clock.now += 1.0
    _step(seqs, SequenceFlags(9, start=True), 1.0)  # a sweep drops what went idle, without a request to it
    assert len(seqs) == 1


def test_requests_of_one_sequence_run_in_order_one_at_a_time(signature):
    seqs = _sequences(signature, _Clock())
    running, seen = [], []

    async def main() -> list[Any]:
        async def one(k: int) -> Any:
            feeds = {"x": np.full((1, 2), float(k), np.float32)}

            async def queue() -> dict[str, np.ndarray]:
                running.append(k)
                assert len(running) == 1, running  # never two of one sequence at once
                for _ in range(5 - k):  # loop turns, not time: later ones would finish first if they could overtake
                    await asyncio.sleep(0)
                seen.append(k)
                running.remove(k)
                y = feeds["x"] + feeds["state_in"]
                return {"y": y, "state_out": y, "ctl": np.zeros((1, 4), np.float32)}

            return (await seqs.run(SequenceFlags(4, start=k == 0), 1, feeds, queue))["y"][0, 0]

        return await asyncio.gather(*(one(k) for k in range(5)))

    assert asyncio.run(main()) == [0.0, 1.0, 3.0, 6.0, 10.0] and seen == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------------------------------------- end to end
def _x(module: Any, value: float, rows: int = 1) -> list[Any]:
    inp = module.InferInput("x", [rows, 2], "FP32")
    inp.set_data_from_numpy(np.full((rows, 2), value, np.float32))
    return [inp]


def test_sequences_over_http_grpc_and_a_stream(tmp_path):
    with serving([stateful_repo(tmp_path)]) as server:
        hc = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        gc = grpcclient.InferenceServerClient(server.grpc_url)
        assert "sequence" in hc.get_server_metadata()["extensions"]
        meta = hc.get_model_metadata("seq")
        assert [i["name"] for i in meta["inputs"]] == ["x"] and [o["name"] for o in meta["outputs"]] == ["y", "ctl"]
        assert hc.get_model_config("seq")["sequence_batching"]["state"][0]["input_name"] == "state_in"
        assert hc.infer("seq", _x(httpclient, 1), sequence_id=5, sequence_start=True).as_numpy("y").tolist() == \
            [[1.0, 1.0]]
        result = gc.infer("seq", _x(grpcclient, 2), sequence_id=5)  # one sequence over both protocols
        assert result.as_numpy("y").tolist() == [[3.0, 3.0]] and result.as_numpy("ctl").tolist() == [[0, 1, 0, 5]]
        with pytest.raises(Exception, match="START flag"):
            gc.infer("seq", _x(grpcclient, 1), sequence_id=12345)
        with pytest.raises(Exception, match="batch-size 1"):
            hc.infer("seq", _x(httpclient, 1, rows=2), sequence_id=5)
        with pytest.raises(Exception, match="non-zero or non-empty correlation ID"):
            hc.infer("seq", _x(httpclient, 1))
        # a stream sends a sequence's requests without waiting: they still run in order
        results: list[Any] = []
        done = threading.Event()

        def callback(result: Any, error: Any) -> None:
            results.append(error or result)
            if len(results) == 6:
                done.set()

        gc.start_stream(callback=callback)
        for k in range(6):
            gc.async_stream_infer("seq", _x(grpcclient, k + 1), sequence_id=9, sequence_start=k == 0,
                                  sequence_end=k == 5, request_id=str(k))
        assert done.wait(30)
        gc.stop_stream()
        sums = sorted(float(r.as_numpy("y")[0, 0]) for r in results)
        assert sums == [1.0, 3.0, 6.0, 10.0, 15.0, 21.0], results


def test_concurrent_sequences_batch_together_and_keep_their_own_state(tmp_path):
    with serving([stateful_repo(tmp_path)]) as server:
        failures: list[Any] = []

        def client(seq_id: int) -> None:
            gc = grpcclient.InferenceServerClient(server.grpc_url)
            total = 0.0
            try:
                for k in range(15):
                    value = float(seq_id * 100 + k)
                    out = gc.infer("seq", _x(grpcclient, value), sequence_id=seq_id, sequence_start=k == 0,
                                   sequence_end=k == 14)
                    total += value
                    if out.as_numpy("y").tolist() != [[total, total]] or out.as_numpy("ctl")[0, 3] != seq_id:
                        failures.append((seq_id, k, out.as_numpy("y").tolist(), total))
            except Exception as e:  # reported below
                failures.append((seq_id, repr(e)))
            finally:
                gc.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(1, 9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert failures == []
        stats = httpclient.InferenceServerClient(server.url.removeprefix("http://")).get_inference_statistics("seq")
        assert stats["model_stats"][0]["inference_count"] == 8 * 15


def test_a_stateful_model_warms_up_and_a_stateless_one_ignores_sequence_parameters(tmp_path):
    repo = stateful_repo(tmp_path)
    tiny_model(tmp_path / "tiny.onnx")
    registry = build_registry([repo, f"tiny={tmp_path / 'tiny.onnx'}"], target="onnxruntime", warmup=2)
    try:
        assert registry.get("seq").ready and registry.get("seq").sequences is not None
    finally:
        registry.close()
    with serving([f"tiny={tmp_path / 'tiny.onnx'}"]) as server:
        gc = grpcclient.InferenceServerClient(server.grpc_url)
        inputs = [grpcclient.InferInput("x", [1, 4], "FP32"), grpcclient.InferInput("scale", [1, 1], "FP32")]
        inputs[0].set_data_from_numpy(np.ones((1, 4), np.float32))
        inputs[1].set_data_from_numpy(np.ones((1, 1), np.float32))
        assert gc.infer("tiny", inputs, sequence_id=3).as_numpy("y").shape == (1, 3)


def test_a_config_with_both_batchers_is_refused(tmp_path):
    repo = stateful_repo(tmp_path)
    config = repo / "seq" / "config.pbtxt"
    config.write_text(config.read_text() + "dynamic_batching { }\n")
    with pytest.raises(ServingError, match="oneof") as info:  # Triton's model_config.proto says so
        build_registry([repo], target="onnxruntime")
    assert info.value.code == "HYB-707"


def test_the_pbtxt_lists_only_what_clients_send(tmp_path):
    repo = stateful_repo(tmp_path)
    registry = build_registry([repo], target="onnxruntime")
    try:
        model = registry.get("seq")
        assert model.signature.input_names == ["x"] and model.signature.output_names == ["y", "ctl"]
        assert model.compiled.signature.input_names == ["x", "START", "READY", "END", "CORRID", "state_in"]
    finally:
        registry.close()


def test_a_ray_deployment_refuses_a_stateful_model(tmp_path):
    from hybrid.serve import discover
    from hybrid.serve.ray.models import pack

    with pytest.raises(ServingError, match="sequence batching") as info:
        pack(discover([stateful_repo(tmp_path)]))
    assert info.value.code == "HYB-707"
    with serving([tiny_model(tmp_path / "tiny.onnx")], sequences=False) as server:
        assert "sequence" not in httpclient.InferenceServerClient(server.url.removeprefix("http://")) \
            .get_server_metadata()["extensions"]  # what a Ray deployment's options say


_VAD_PBTXT = """name: "vad"
max_batch_size: 0
input [ { name: "audio" data_type: TYPE_FP32 dims: [1, -1] } ]
output [ { name: "prob" data_type: TYPE_FP32 dims: [-1, 1] } ]
sequence_batching {
  state [ { input_name: "h" output_name: "hn" data_type: TYPE_FP32 dims: [2, 1, 64] },
          { input_name: "c" output_name: "cn" data_type: TYPE_FP32 dims: [2, 1, 64] } ]
}
"""


def test_a_stateful_voice_activity_model_streams_as_its_explicit_state_chain(tmp_path):
    """hybrid.zoo's LSTM VAD, its h/c state kept by the server: each chunk's answer is what the chain of calls
    that pass h/c by hand gives, for two streams interleaved."""
    from hybrid import zoo

    built = zoo.build("vad_lstm", folder=tmp_path / "zoo")
    folder = tmp_path / "repo" / "vad"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(Path(built.path).read_bytes())
    (folder / "config.pbtxt").write_text(_VAD_PBTXT)
    rng = np.random.default_rng(0)
    chunks = {stream: [rng.normal(0, 0.3, (1, 512)).astype(np.float32) for _ in range(4)] for stream in (1, 2)}
    compiled = compile_model(built.path, target="onnxruntime")
    expected = {}
    try:
        for stream, audio in chunks.items():
            h = c = np.zeros((2, 1, 64), np.float32)
            expected[stream] = []
            for chunk in audio:
                out = compiled.run({"audio": chunk, "h": h, "c": c})
                h, c = out["hn"], out["cn"]
                expected[stream].append(out["prob"])
        zeros = np.zeros((2, 1, 64), np.float32)
        lone = compiled.run({"audio": chunks[1][3], "h": zeros, "c": zeros})["prob"]
    finally:
        compiled.close()
    with serving([tmp_path / "repo"]) as server:
        gc = grpcclient.InferenceServerClient(server.grpc_url)
        meta = gc.get_model_metadata("vad", as_json=True)
        assert [i["name"] for i in meta["inputs"]] == ["audio"] and [o["name"] for o in meta["outputs"]] == ["prob"]
        for k in range(4):
            for stream in (1, 2):
                audio = grpcclient.InferInput("audio", [1, 512], "FP32")
                audio.set_data_from_numpy(chunks[stream][k])
                prob = gc.infer("vad", [audio], sequence_id=stream, sequence_start=k == 0,
                                sequence_end=k == 3).as_numpy("prob")
                np.testing.assert_allclose(prob, expected[stream][k], rtol=1e-5, atol=1e-6)
    assert not np.allclose(expected[1][3], lone, rtol=1e-5, atol=1e-6)  # the state matters: not a lone call
