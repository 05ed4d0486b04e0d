"""``--model-control-mode poll`` (:mod:`hybrid.serve.core.polling`): each poll is called directly, on a real
repository, so that nothing waits on the interval."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from _serve_support import tiny_model

from hybrid.errors import ServingError
from hybrid.serve import build_registry
from hybrid.serve.core.polling import RepositoryPoller

pytestmark = pytest.mark.timeout(180)


def _add(repo: Path, name: str, version: str = "1", factor: float = 1.0) -> None:
    folder = repo / name / version
    folder.mkdir(parents=True, exist_ok=True)
    tiny_model(folder / "model.onnx", factor)


@pytest.fixture
def served(tmp_path: Path):
    """A repository holding model ``a``, and a registry serving it (closed after the test)."""
    repo = tmp_path / "repo"
    _add(repo, "a")
    registry = build_registry([repo], target="onnxruntime")
    try:
        yield repo, registry
    finally:
        registry.close()


def _touch_later(path: Path) -> None:
    """Move ``path``'s modification time on (a file system may keep coarse times: a rewrite alone may not show)."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000_000))


def test_a_poll_loads_what_appeared_or_changed_and_unloads_what_is_gone(served) -> None:
    repo, registry = served
    poller = RepositoryPoller(registry, interval_s=3600)
    report = poller.poll()
    assert (report.loaded, report.unloaded, report.failed) == ([], [], {})  # as loaded: nothing to do

    _add(repo, "b", factor=2.0)
    assert poller.poll().loaded == ["b"] and registry.versions("b") == ["1"]

    first = registry.get("a")
    _add(repo, "a", factor=3.0)  # the same file written again, with other weights
    _touch_later(repo / "a" / "1" / "model.onnx")
    assert poller.poll().loaded == ["a"] and registry.get("a") is not first and not first.ready
    _add(repo, "a", version="2")  # a version added: loaded again, both served (no config.pbtxt)
    assert poller.poll().loaded == ["a"] and registry.versions("a") == ["2", "1"]

    (repo / "c" / "1").mkdir(parents=True)  # no model file: it does not load, the others serve on
    report = poller.poll()
    assert report.loaded == [] and "c" in report.failed and "HYB-707" in report.failed["c"]
    assert poller.poll().failed == {}  # not tried again until its files change
    tiny_model(repo / "c" / "1" / "model.onnx")
    assert poller.poll().loaded == ["c"]

    shutil.rmtree(repo / "b")
    assert poller.poll().unloaded == ["b"]
    with pytest.raises(ServingError) as info:
        registry.get("b")
    assert info.value.code == "HYB-701"
    assert sorted({m.name for m in registry}) == ["a", "c"]


def test_a_failed_reload_keeps_the_versions_served(served) -> None:
    repo, registry = served
    poller = RepositoryPoller(registry, interval_s=3600)
    model = registry.get("a")
    (repo / "a" / "config.pbtxt").write_text("max_batch_size: -3\n")
    report = poller.poll()
    assert "a" in report.failed and registry.get("a") is model and model.ready


def test_a_repository_gone_unloads_nothing(served, tmp_path: Path) -> None:
    repo, registry = served
    poller = RepositoryPoller(registry, interval_s=3600)
    repo.rename(tmp_path / "elsewhere")  # e.g. a volume unmounted
    report = poller.poll()
    assert (report.loaded, report.unloaded) == ([], []) and registry.versions("a") == ["1"]
    (tmp_path / "elsewhere").rename(repo)
    assert poller.poll().unloaded == []


def test_a_poll_changes_nothing_once_the_server_drains(served) -> None:
    repo, registry = served
    serving = [True]
    poller = RepositoryPoller(registry, interval_s=3600, serving=lambda: serving[0])
    serving[0] = False
    _add(repo, "b")
    assert poller.poll().loaded == [] and registry.versions("b") == []


def test_a_load_reads_its_own_folder_alone(served) -> None:
    """A broken model folder beside it no longer stands in the way of loading a model (explicit mode too)."""
    repo, registry = served
    (repo / "broken" / "1").mkdir(parents=True)
    _add(repo, "b")
    assert [m.name for m in registry.load("b")] == ["b"]
    with pytest.raises(ServingError) as info:
        registry.load("broken")
    assert info.value.code == "HYB-707"


def test_polling_and_model_control_do_not_go_together(served) -> None:
    from hybrid.errors import ConfigError
    from hybrid.serve import ServeOptions, create_app

    _, registry = served
    for options in (ServeOptions(model_control=True, repository_poll_s=1.0), ServeOptions(repository_poll_s=0)):
        with pytest.raises(ConfigError) as info:
            create_app(registry, options)
        assert info.value.code == "HYB-102"
