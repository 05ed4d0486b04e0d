"""Idle tuning (hybrid.serve.core.idle_tuning): a served model that tunes online decides its batch-size buckets on
random inputs while it has no requests. The rule on scripted time with a stand-in model; which models it runs on;
then the real thing: a registry whose model is decided before any request, and answers right afterwards."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from _serve_support import tiny_expected, tiny_model, wait_for

import hybrid
from hybrid.errors import RunError
from hybrid.runtime.auto.shapes import bucket_of
from hybrid.serve import build_registry
from hybrid.serve.core.idle_tuning import (
    IdleTuner,
    IdleTuningPolicy,
    idle_samples,
    learned_samples,
    random_inputs_unfit,
    start_idle_tuning,
)
from hybrid.serve.core.model import BatchSettings, ServedModel

pytestmark = pytest.mark.timeout(300)


def _record(key: Any, state: str, recheck_at_s: float | None = None, outcome: str = "slower") -> Any:
    return SimpleNamespace(key=key, state=state, recheck_at_s=recheck_at_s,
                           candidates=(SimpleNamespace(label="b:cpu", outcome=outcome),))


class _Tuning:
    """A compiled model's stand-in that tunes online: a bucket is decided after ``needs`` calls of it."""

    def __init__(self, signature: Any, needs: int = 2, fail: bool = False) -> None:
        self.signature = signature
        self.tunes_online = True
        self.needs = needs
        self.fail = fail
        self.calls: list[Any] = []

        self.records: dict[Any, Any] = {}  # a bucket's record as the test sets it, over the rule above

    @property
    def tuning(self) -> tuple[Any, ...]:
        keys = dict.fromkeys([*self.calls, *self.records])
        return tuple(self.records.get(k) or _record(k, "decided" if self.calls.count(k) >= self.needs else "tuning")
                     for k in keys)

    def run_checked(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.fail:
            raise RunError("HYB-408", "the backend failed")
        self.calls.append(bucket_of(self.signature, feeds))
        return {}

    def close(self) -> None:
        pass


class _Model:
    """What the idle tuner reads of a served model, on a scripted clock: busy or not, when it last ran."""

    def __init__(self, served: ServedModel) -> None:
        self.served = served
        self.name, self.version, self.signature = served.name, served.version, served.signature
        self.compiled = served.compiled
        self.batch_symbol, self.max_batch_size = served.batch_symbol, served.max_batch_size
        self.busy = False
        self.last_end = 0.0
        self.ready = True

    def check(self, feeds: dict[str, np.ndarray]) -> Any:
        return self.served.check(feeds)

    def idle_for(self, now: float) -> float | None:
        return None if self.busy else now - self.last_end


@pytest.fixture
def served(tmp_path: Path):
    real = hybrid.compile(str(tiny_model(tmp_path / "tiny.onnx")), target="onnxruntime")
    model = ServedModel("tiny", "1", _Tuning(real.signature), BatchSettings(max_batch=8))  # type: ignore[arg-type]
    yield model
    real.close()


def _keys(rows: list[int]) -> list[Any]:
    return [(("x", (r, 4)), ("scale", (r, 1))) for r in rows]


def test_random_inputs_at_the_batch_sizes_the_batcher_forms(served: ServedModel) -> None:
    samples = idle_samples(served)
    assert [s["x"].shape for s in samples] == [(1, 4), (2, 4), (4, 4), (8, 4)]
    assert [s["scale"].shape for s in samples] == [(1, 1), (2, 1), (4, 1), (8, 1)]
    assert all(s["x"].dtype == np.float32 for s in samples)
    served.settings = BatchSettings(max_batch=6)
    served._max_rows = None
    assert [s["x"].shape[0] for s in idle_samples(served)] == [1, 2, 4, 6]  # 6 rounds up to bucket 8: one sample
    served.settings = BatchSettings(max_batch=0)  # does not batch: one sample
    served._max_rows = None
    assert [s["x"].shape[0] for s in idle_samples(served)] == [1]


def test_only_where_random_inputs_stand_for_real_ones(served: ServedModel, tmp_path: Path) -> None:
    served.compile_request = {"precision": "auto", "accuracy": {"min_cosine": 0.995}}
    assert idle_samples(served) == []  # a reduced precision is judged on the first real input
    served.compile_request = {"precision": "fp32"}
    assert len(idle_samples(served)) == 4
    served.compiled.tunes_online = False  # type: ignore[attr-defined]
    assert idle_samples(served) == []  # nothing to decide
    fixed = hybrid.compile(str(tiny_model(tmp_path / "fixed.onnx")), target="onnxruntime")
    try:
        assert fixed.tunes_online is False
    finally:
        fixed.close()


def test_a_dynamic_dim_besides_the_batch_is_not_guessed(tmp_path: Path) -> None:
    from tests.test_auto_shapes import conv_net  # x: [N, 3, H, W]

    real = hybrid.compile(conv_net(), target="onnxruntime")
    try:
        model = ServedModel("conv", "1", _Tuning(real.signature), BatchSettings(max_batch=8))  # type: ignore[arg-type]
        assert idle_samples(model) == []
    finally:
        real.close()


@pytest.fixture
def conv(tmp_path: Path):
    """A stand-in tuning model with a dynamic image size besides the batch (x [N, 3, H, W])."""
    from tests.test_auto_shapes import conv_net

    real = hybrid.compile(conv_net(), target="onnxruntime")
    yield ServedModel("conv", "1", _Tuning(real.signature), BatchSettings(max_batch=8))  # type: ignore[arg-type]
    real.close()


def _image(rows: int, h: int, w: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).random((rows, 3, h, w), np.float32)}


def test_where_random_inputs_are_unfit_it_learns_the_shapes_of_the_requests(conv: ServedModel) -> None:
    now = [100.0]
    model = _Model(conv)
    tuner = IdleTuner(model, [], IdleTuningPolicy(quiet_s=1.0, max_learned_shapes=2),  # type: ignore[arg-type]
                      clock=lambda: now[0], learn=True)
    compiled: Any = conv.compiled
    assert tuner.step() == 3600.0 and compiled.calls == []  # no request yet: nothing to guess, waits for one
    first = _image(3, 20, 24)
    tuner.saw(first)
    first["x"][:] = -1.0  # the request's own arrays (views of its body) may go: the tuner kept a copy
    tuner.saw(_image(1, 20, 24, seed=1))  # the same shape but the batch: nothing new
    model.busy = True  # the request runs
    assert tuner.step() == IdleTuningPolicy().poll_s and compiled.calls == []
    model.busy, model.last_end = False, 100.0
    now[0] = 101.0
    while (wait := tuner.step()) == 0.0:
        pass
    assert wait == 3600.0 and not tuner.done  # every bucket of that shape decided; it stays on for new shapes
    assert compiled.calls == [(("x", (r, 3, 32, 32)),) for r in (1, 2, 4, 8) for _ in range(2)]
    tuner.saw(_image(1, 40, 40))
    tuner.saw(_image(1, 60, 60))  # past max_learned_shapes: not kept
    while tuner.step() == 0.0:
        pass
    assert compiled.calls[8:] == [(("x", (r, 3, 64, 64)),) for r in (1, 2, 4, 8) for _ in range(2)]
    assert len(tuner.shapes) == 2
    tuner.stop()
    assert tuner.step() is None and tuner.done


def test_a_learned_request_is_repeated_to_each_batch_size(conv: ServedModel) -> None:
    request = _image(3, 20, 24)
    samples = learned_samples(conv, request)
    assert [s["x"].shape[0] for s in samples] == [1, 2, 4, 8]
    for s in samples:  # its own rows, in order, cycled
        np.testing.assert_array_equal(s["x"], request["x"][np.arange(len(s["x"])) % 3])
    conv.settings = BatchSettings(max_batch=0)  # does not batch: the request itself
    conv._max_rows = None
    conv.batch_symbol = None
    (alone,) = learned_samples(conv, request)
    assert alone["x"] is request["x"]


def test_a_reduced_precision_learns_from_the_requests_which_every_served_request_is_shown(
        served: ServedModel) -> None:
    served.compile_request = {"precision": "auto", "accuracy": {"min_cosine": 0.995}}
    tuner = start_idle_tuning(served, idle_for=lambda now: None)  # never idle here: it only learns
    try:
        assert tuner is not None and tuner.learn and idle_samples(served) == []
        x = np.ones((2, 4), np.float32)
        asyncio.run(served.infer({"x": x, "scale": np.ones((2, 1), np.float32)}))
        assert tuner.shapes == {(("x", (4,)), ("scale", (1,)))}
    finally:
        if tuner is not None:
            tuner.stop()
        served.close()


def test_it_calls_only_while_the_model_is_idle_one_bucket_after_the_other(served: ServedModel) -> None:
    now = [100.0]
    model = _Model(served)
    model.last_end = 100.0
    tuner = IdleTuner(model, idle_samples(served), IdleTuningPolicy(quiet_s=1.0, poll_s=0.25),  # type: ignore[arg-type]
                      clock=lambda: now[0])
    compiled = served.compiled
    assert tuner.step() == pytest.approx(1.0)  # a request just ended: wait for the quiet second
    assert compiled.calls == []  # type: ignore[attr-defined]
    now[0] = 100.6
    assert tuner.step() == pytest.approx(0.4)
    now[0] = 101.0
    assert tuner.step() == 0.0 and tuner.step() == 0.0  # idle: call, call
    model.busy = True  # a request came
    assert tuner.step() == 0.25  # looked at again later, no call meanwhile
    model.busy, model.last_end = False, 105.0
    now[0] = 105.5
    assert tuner.step() == pytest.approx(0.5)
    now[0] = 106.0
    while (wait := tuner.step()) is not None:
        assert wait == 0.0
    assert compiled.calls == [k for k in _keys([1, 2, 4, 8]) for _ in range(2)]  # type: ignore[attr-defined]
    assert tuner.done and tuner.calls == 8
    assert tuner.step() is None


def test_a_candidate_left_untimed_is_raced_at_its_recheck_while_idle_and_a_tie_is_left_to_the_traffic(
        served: ServedModel) -> None:
    now = [0.0]
    compiled: Any = served.compiled
    compiled.needs = 1
    (one,) = _keys([1])
    tuner = IdleTuner(_Model(served), idle_samples(served)[:1], IdleTuningPolicy(quiet_s=1.0),  # type: ignore[arg-type]
                      clock=lambda: now[0])
    now[0] = 10.0
    assert tuner.step() == 0.0 and compiled.calls == [one]  # its first call, at 10 s
    compiled.records[one] = _record(one, "decided", recheck_at_s=60.0, outcome="open")  # b:cpu races at 10 + 60 s
    assert tuner.step() == pytest.approx(60.0) and len(compiled.calls) == 1  # waits, no calls meanwhile
    now[0] = 70.0
    assert tuner.step() == pytest.approx(0.025)  # due: the controller starts the re-check on time
    compiled.records[one] = _record(one, "tuning", recheck_at_s=60.0, outcome="open")  # racing
    assert tuner.step() == 0.0 and len(compiled.calls) == 2  # fed while idle
    compiled.records[one] = _record(one, "decided", recheck_at_s=180.0, outcome="tie")  # a tie: the long run's
    assert tuner.step() is None and tuner.done
    late = IdleTuner(_Model(served), idle_samples(served)[:1], clock=lambda: now[0])  # type: ignore[arg-type]
    compiled.records.clear()
    compiled.calls.clear()
    assert late.step() == 0.0
    compiled.records[one] = _record(one, "decided", recheck_at_s=60.0, outcome="open")
    now[0] = 70.0 + 60.0 + 5.0  # due at 130 s, never begun: given up after the grace
    assert late.step() is None


def test_the_models_of_a_server_race_one_at_a_time(served: ServedModel, tmp_path: Path) -> None:
    import threading

    real = hybrid.compile(str(tiny_model(tmp_path / "other.onnx")), target="onnxruntime")
    try:
        other = ServedModel("other", "1", _Tuning(real.signature), BatchSettings(max_batch=2))  # type: ignore[arg-type]
        turn = threading.Lock()
        first = IdleTuner(_Model(served), idle_samples(served), clock=lambda: 1e6, turn=turn)  # type: ignore[arg-type]
        second = IdleTuner(_Model(other), idle_samples(other), clock=lambda: 1e6, turn=turn)  # type: ignore[arg-type]
        assert first.step() == 0.0  # it races: it holds the turn
        assert second.step() == IdleTuningPolicy().poll_s and other.compiled.calls == []  # type: ignore[attr-defined]
        while first.step() is not None:
            pass
        assert first.calls == 8 and not turn.locked()  # all its buckets decided: the turn is free
        while second.step() is not None:
            pass
        assert second.calls == 4 and not turn.locked()  # buckets 1 and 2, two calls each
    finally:
        real.close()


def test_buckets_decided_already_cost_no_call_and_a_closed_or_failing_model_ends_it(served: ServedModel) -> None:
    compiled = served.compiled
    compiled.calls = [k for k in _keys([1, 2, 4, 8]) for _ in range(2)]  # type: ignore[attr-defined]
    tuner = IdleTuner(_Model(served), idle_samples(served), clock=lambda: 1e6)  # type: ignore[arg-type]
    assert tuner.step() is None and tuner.calls == 0  # e.g. decided by --warmup, or read from the cache
    compiled.calls = []  # type: ignore[attr-defined]
    model = _Model(served)
    model.ready = False  # closed
    assert IdleTuner(model, idle_samples(served), clock=lambda: 1e6).step() is None  # type: ignore[arg-type]
    compiled.fail = True  # type: ignore[attr-defined]
    failing = IdleTuner(_Model(served), idle_samples(served), clock=lambda: 1e6)  # type: ignore[arg-type]
    assert failing.step() is None and failing.done and failing.calls == 0


def test_a_served_model_is_idle_between_requests_and_never_once_closed(tmp_path: Path) -> None:
    registry = build_registry([tiny_model(tmp_path / "tiny.onnx")], target="onnxruntime")
    (model,) = list(registry)
    try:
        x, scale = np.ones((2, 4), np.float32), np.ones((2, 1), np.float32)
        before = time.monotonic()
        asyncio.run(model.infer({"x": x, "scale": scale}))
        ended = time.monotonic()
        idle = model.idle_for(ended + 5.0)  # counted from the end of the request, within the call
        assert idle is not None and 5.0 <= idle <= 5.0 + (ended - before)
        assert start_idle_tuning(model) is None  # a fixed target decides nothing
    finally:
        registry.close()
    assert model.idle_for(time.monotonic() + 5.0) is None


def test_the_server_is_idle_only_while_none_of_its_models_runs_a_request(tmp_path: Path) -> None:
    registry = build_registry([f"a={tiny_model(tmp_path / 'a.onnx')}", f"b={tiny_model(tmp_path / 'b.onnx')}"],
                              target="onnxruntime")
    a, b = registry.get("a"), registry.get("b")
    x, scale = np.ones((1, 4), np.float32), np.ones((1, 1), np.float32)

    async def one_request_to_a() -> None:
        task = asyncio.ensure_future(a.infer({"x": x, "scale": scale}))
        await asyncio.sleep(0)  # one loop turn, not time: in a's queue now
        assert registry.idle_for(time.monotonic()) is None and a.idle_for(time.monotonic()) is None
        assert b.idle_for(time.monotonic()) is not None  # b alone would call itself idle
        await task

    try:
        asyncio.run(one_request_to_a())
        assert registry.idle_for(time.monotonic()) is not None
        # a tuner told the server's idleness waits on a request to another model
        tuner = IdleTuner(_Model(b), [{"x": x, "scale": scale}], idle_for=lambda now: None)  # type: ignore[arg-type]
        assert tuner.step() == IdleTuningPolicy().poll_s
    finally:
        registry.close()


def test_a_served_auto_model_is_decided_while_idle_and_then_answers(tmp_path: Path) -> None:
    hybrid.init({"autotune": {"decide_within_s": 6.0, "overhead_cap": 1.0}})
    path = tiny_model(tmp_path / "tiny.onnx")
    registry = build_registry([path], target="auto", overrides={"max_batch": 4}, idle_tuning=True)
    (model,) = list(registry)
    try:
        assert model.compiled.tunes_online
        # real time: the tuner's thread compiles and races real candidates on the real clock (the steps themselves
        # are tested on a scripted one above); looked at every half second, for at most four minutes
        wait_for(lambda: len(model.compiled.tuning) == 3 and all(t.state == "decided" for t in model.compiled.tuning),
                 "the idle tuner to decide the three buckets", limit=240, every=0.5)
        assert {t.key for t in model.compiled.tuning} == set(_keys([1, 2, 4]))
        x = np.random.default_rng(1).random((3, 4), np.float32)
        scale = np.full((3, 1), 2.0, np.float32)
        out = asyncio.run(model.infer({"x": x, "scale": scale}))
        for name, want in tiny_expected(x, scale).items():
            np.testing.assert_allclose(out[name], want, rtol=1e-4, atol=1e-5)
        (fresh,) = registry.load("tiny")  # a reload tunes while idle too (the decisions now come from the cache)
        assert fresh is not model and registry.get("tiny") is fresh
        wait_for(lambda: len(fresh.compiled.tuning) == 3 and all(t.state == "decided" for t in fresh.compiled.tuning),
                 "the reloaded model's buckets to be decided", limit=240, every=0.5)
    finally:
        registry.close()


def test_a_served_auto_model_with_an_image_size_is_decided_at_its_first_request_s_shape(tmp_path: Path) -> None:
    import onnx
    from tests.test_auto_shapes import conv_net, reference_answer

    hybrid.init({"autotune": {"decide_within_s": 6.0, "overhead_cap": 1.0}})
    onnx.save(conv_net(), tmp_path / "conv.onnx")
    registry = build_registry([tmp_path / "conv.onnx"], target="auto", overrides={"max_batch": 4}, idle_tuning=True)
    (model,) = list(registry)
    try:
        # an image size would be a guess: the tuner has no sample of its own, so nothing runs before a request
        # (its steps without one: test_where_random_inputs_are_unfit_it_learns_the_shapes_of_the_requests)
        assert random_inputs_unfit(model) is not None and idle_samples(model) == []
        assert _idle_threads(model) == 1 and model.compiled.tuning == ()
        first = _image(1, 20, 24)
        out = asyncio.run(model.infer(first))
        np.testing.assert_allclose(out["logits"], reference_answer(conv_net(), first["x"]), rtol=1e-4,
                                   atol=1e-5)
        want = {(("x", (r, 3, 32, 32)),) for r in (1, 2, 4)}
        # real time: real candidates compiled and raced by the tuner's thread (as above)
        wait_for(lambda: {t.key for t in model.compiled.tuning} == want
                 and all(t.state == "decided" for t in model.compiled.tuning),
                 "the buckets of the first request's shape to be decided", limit=240, every=0.5)
        batch = _image(3, 30, 17, seed=2)  # another image of the same bucket, three rows at once
        out = asyncio.run(model.infer(batch))
        np.testing.assert_allclose(out["logits"], reference_answer(conv_net(), batch["x"]), rtol=1e-4,
                                   atol=1e-5)
    finally:
        registry.close()


def _idle_threads(model: ServedModel) -> int:
    """How many idle tuners run for ``model`` (their threads' names: :func:`start_idle_tuning`)."""
    return sum(t.name == f"hybrid-serve-{model.name}-idle" and t.is_alive() for t in threading.enumerate())


def test_without_idle_tuning_nothing_runs_before_the_first_request(tmp_path: Path) -> None:
    hybrid.init({"autotune": {"decide_within_s": 6.0, "overhead_cap": 1.0}})
    registry = build_registry([tiny_model(tmp_path / "tiny.onnx")], target="auto")
    (model,) = list(registry)
    try:
        assert _idle_threads(model) == 0  # no tuner runs beside it: nothing can call it before a request
        assert model.compiled.tunes_online and model.compiled.tuning == ()
    finally:
        registry.close()


def test_pyasc_serve_tunes_while_idle_unless_told_not_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import typer
    from typer.testing import CliRunner

    from hybrid.cli.serve import register
    from hybrid.errors import ConfigError

    seen: list[bool] = []

    def build(*args: Any, idle_tuning: bool = False, **kwargs: Any) -> Any:
        seen.append(idle_tuning)
        raise ConfigError("HYB-102", "recorded; nothing loads in this test")

    monkeypatch.setattr("hybrid.serve.core.repository.build_registry", build)
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    model = str(tiny_model(tmp_path / "tiny.onnx"))
    runner = CliRunner()
    for extra, want in (((), True), (("--no-idle-tuning",), False)):
        result = runner.invoke(app, ["serve", model, "--grpc-port", "0", "--port", "0", *extra])
        assert result.exit_code == 1 and "recorded" in result.output, result.output
        assert seen[-1] is want
