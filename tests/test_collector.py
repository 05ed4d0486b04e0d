"""The server's garbage-collector policy (hybrid.runtime.traffic.collector): long-lived objects leave full passes."""

from __future__ import annotations

import gc

import pytest
from tests._serve_support import tiny_model

from hybrid.errors import ConfigError
from hybrid.runtime.traffic import collector
from hybrid.runtime.traffic.collector import CollectorPolicy, policy_from_env
from hybrid.serve.core.repository import build_registry


@pytest.fixture(autouse=True)
def clean_collector():
    """Whatever a test does, the process's collector is as Python set it afterwards."""
    collector.uninstall()
    gc.unfreeze()
    yield
    collector.uninstall()
    gc.unfreeze()


class ScriptedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def collect(policy: CollectorPolicy, clock: ScriptedClock, generation: int, pause_s: float) -> None:
    """What gc.callbacks sees of one collection that lasts ``pause_s`` on the scripted clock."""
    policy("start", {"generation": generation, "collected": 0, "uncollectable": 0})
    clock.now += pause_s
    policy("stop", {"generation": generation, "collected": 0, "uncollectable": 0})


def test_a_full_collection_longer_than_the_bound_freezes_its_survivors():
    clock = ScriptedClock()
    policy = CollectorPolicy(max_pause_s=0.02, clock=clock)
    collect(policy, clock, 2, 0.015)
    assert policy.freezes == 0 and gc.get_freeze_count() == 0 and policy.longest_s == pytest.approx(0.015)
    collect(policy, clock, 1, 0.5)  # a young generation's pass, however long, is not the full one
    collect(policy, clock, 0, 0.5)
    assert policy.freezes == 0 and gc.get_freeze_count() == 0
    collect(policy, clock, 2, 0.15)
    assert policy.freezes == 1 and gc.get_freeze_count() > 0 and policy.longest_s == pytest.approx(0.15)


def test_installed_it_acts_on_the_real_collector_and_a_thaw_returns_the_objects():
    kept = [[i] for i in range(20000)]  # tracked objects that survive
    collector.install(CollectorPolicy(max_pause_s=0.0), freeze_now=False)  # every full pass is "too long"
    assert collector.installed() is not None and gc.get_freeze_count() == 0
    gc.collect()
    policy = collector.installed()
    assert policy is not None and policy.freezes == 1 and gc.get_freeze_count() >= len(kept)
    collector.thaw()
    assert gc.get_freeze_count() == 0
    collector.uninstall()
    assert collector.installed() is None and policy not in gc.callbacks


def test_install_freezes_what_is_alive_at_start_up_and_a_thaw_needs_an_installed_policy():
    gc.freeze()
    collector.thaw()  # no policy: someone else's frozen objects stay frozen
    assert gc.get_freeze_count() > 0
    gc.unfreeze()
    collector.install(CollectorPolicy(max_pause_s=10.0))
    assert gc.get_freeze_count() > 0 and collector.installed().freezes == 0


def test_unloading_a_model_thaws_the_frozen_objects(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tiny" / "1").mkdir(parents=True)
    tiny_model(repo / "tiny" / "1" / "model.onnx")
    registry = build_registry([repo], target="onnxruntime")
    try:
        collector.install(CollectorPolicy())
        assert gc.get_freeze_count() > 0
        registry.unload("tiny")
        assert gc.get_freeze_count() == 0
    finally:
        registry.close()


def test_the_bound_comes_from_the_environment():
    assert policy_from_env({}).max_pause_s == pytest.approx(0.02)
    assert policy_from_env({collector.ENV_MAX_PAUSE_MS: "5"}).max_pause_s == pytest.approx(0.005)
    assert policy_from_env({collector.ENV_MAX_PAUSE_MS: " OFF "}) is None
    for bad in ("fast", "-1", "nan"):
        with pytest.raises(ConfigError) as info:
            policy_from_env({collector.ENV_MAX_PAUSE_MS: bad})
        assert info.value.code == "HYB-102" and collector.ENV_MAX_PAUSE_MS in info.value.message


def test_releasing_a_tuning_candidate_thaws_the_frozen_objects():
    import numpy as np
    from tests._models import matmul_add

    import hybrid

    compiled = hybrid.compile(matmul_add(), target="auto")
    try:
        lab = compiled.executable.lab  # the online tuner's candidates
        others = [label for label in lab.order() if label != lab.start.label]
        if not others:
            pytest.skip("one backend installed: no candidate beside the start to release")
        lane = lab.lane(others[0], {"x": np.ones((2, 4), np.float32)})
        assert lane is not None
        collector.install(CollectorPolicy())
        assert gc.get_freeze_count() > 0
        lab.release(lab.start.label)  # the start serves every bucket's fallback: never released, nothing thawed
        assert gc.get_freeze_count() > 0
        lab.release(others[0])
        assert gc.get_freeze_count() == 0
    finally:
        compiled.close()
