"""Shared fixtures: light models, their inputs and expected outputs, a clean config per test."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

# CI replays the same examples on every run (a failure then reproduces and never flickers a green build);
# `HYPOTHESIS_PROFILE=explore python -m pytest` draws fresh examples to look for new counterexamples.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _clean_config(tmp_path, monkeypatch):
    """Each test starts from the default configuration and its own cache folder."""
    from hybrid import config

    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path / "hybrid-cache"))
    config.reset()
    yield
    config.reset()
    from hybrid.hal import memory

    memory.configure_pools({})


@pytest.fixture(scope="session")
def light():
    """Access to ONNX's light models: ``light.path(name)``, ``light.input()``, ``light.expected(name)``."""
    from hybrid.zoo import samples

    return samples


@pytest.fixture
def rng():
    return np.random.default_rng(0)
