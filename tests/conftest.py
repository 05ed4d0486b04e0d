"""Shared fixtures: light models, their inputs and expected outputs, a clean config per test."""

from __future__ import annotations

import numpy as np
import pytest


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
    from hybrid import samples

    return samples


@pytest.fixture
def rng():
    return np.random.default_rng(0)
