"""``hybrid.load`` returns one declared type: a CompiledModel, of which a vision TaskModel is a subclass whose
call takes frames; ``hybrid.load_task`` returns a TaskModel typed as one. No attribute forwarding."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from tests._models import matmul_add
from tests._vision_models import mean_color_classifier

import hybrid
from hybrid.bundle import create_bundle, load_task, load_with_info, save_bundle
from hybrid.bundle.load import load
from hybrid.errors import BundleError, ConfigError, ModelError
from hybrid.runtime.profiler import profile as runtime_profile
from hybrid.vision import TaskModel

SHARED = ("model", "signature", "executable", "plan", "backend", "device", "options", "target")


def test_load_declares_compiled_model_and_every_bundle_is_one(tmp_path):
    assert inspect.signature(load).return_annotation == "CompiledModel"
    assert inspect.signature(hybrid.load).return_annotation == "CompiledModel"
    create_bundle(matmul_add(), tmp_path / "plain.hybrid")
    create_bundle(mean_color_classifier(), tmp_path / "cls.hybrid", task="classification")
    plain = hybrid.load(tmp_path / "plain.hybrid")
    cls = hybrid.load(tmp_path / "cls.hybrid")
    assert type(plain) is hybrid.CompiledModel
    assert isinstance(cls, TaskModel) and isinstance(cls, hybrid.CompiledModel)
    assert issubclass(hybrid.TaskModel, hybrid.CompiledModel)


def test_task_model_has_explicit_members_read_live(tmp_path):
    assert "__getattr__" not in vars(TaskModel)
    create_bundle(mean_color_classifier(), tmp_path / "cls.hybrid", task="classification")
    cls = load_task(tmp_path / "cls.hybrid")
    assert isinstance(cls, TaskModel)
    for name in SHARED:
        assert getattr(cls, name) is getattr(cls.compiled, name), name
    with pytest.raises(AttributeError):
        cls.no_such_attribute  # noqa: B018 - nothing is forwarded any more
    # online tuning switches the compiled model's backend in place: the task model reports the switch
    cls.compiled.backend, cls.compiled.device = "elsewhere", "dev9"
    assert (cls.backend, cls.device) == ("elsewhere", "dev9")
    cls.options = {"k": 1}
    assert cls.compiled.options == {"k": 1}
    # run is the raw model (input name -> array); a call takes frames
    x = np.full((1, 3, 16, 16), 0.5, np.float32)
    raw = cls.run({cls.signature.inputs[0].name: x})
    assert list(raw) == cls.signature.output_names
    frame = np.zeros((20, 30, 3), np.uint8)
    frame[..., 1] = 200
    assert int(cls(frame).class_ids[0]) == 1  # the green channel dominates


def test_load_task_refuses_a_bundle_without_a_task(tmp_path):
    assert inspect.signature(load_task).return_annotation == "TaskModel"
    create_bundle(matmul_add(), tmp_path / "plain.hybrid")
    with pytest.raises(BundleError) as e:
        load_task(tmp_path / "plain.hybrid")
    assert e.value.code == "HYB-502" and "declares no vision task" in e.value.message
    assert "hybrid.load" in (e.value.hint or "")


def test_the_model_says_what_its_bundle_keeps(tmp_path):
    """save_bundle asks the model (``task_declarations``); TaskModel has no ``save`` of its own."""
    assert hybrid.load_task is load_task
    assert "save" not in vars(TaskModel)
    create_bundle(matmul_add(), tmp_path / "plain.hybrid")
    assert hybrid.load(tmp_path / "plain.hybrid").task_declarations() is None
    create_bundle(mean_color_classifier(), tmp_path / "cls.hybrid", task="classification")
    cls = load_task(tmp_path / "cls.hybrid")
    task, options = cls.task_declarations()
    assert task == "classification" and options == cls.task_options()
    cls.save(str(tmp_path / "again.hybrid"))  # CompiledModel.save -> save_bundle(cls) -> cls.task_declarations()
    again = load_task(tmp_path / "again.hybrid")
    assert again.task_declarations() == (task, options)
    save_bundle(cls, tmp_path / "plain-again.hybrid", task="regression", task_options={})  # given: given wins
    assert type(hybrid.load(tmp_path / "plain-again.hybrid")) is hybrid.CompiledModel


def test_bundles_are_profiled_through_the_facade(tmp_path):
    create_bundle(matmul_add(), tmp_path / "plain.hybrid")
    report = hybrid.profile(tmp_path / "plain.hybrid", duration=0.05, output=None, node_runs=0, quiet=True)
    assert report.runs >= 1
    with pytest.raises(ModelError) as e:  # the runtime's profiler takes compiled models and models, not bundles
        runtime_profile(tmp_path / "plain.hybrid", duration=0.05, output=None, quiet=True)
    assert e.value.code == "HYB-203" and "hybrid.profile" in (e.value.hint or "")
    with pytest.raises(ConfigError):  # bad arguments are refused before the bundle is loaded
        hybrid.profile(tmp_path / "plain.hybrid", duration=0, output=None, quiet=True)


def test_load_info_carries_the_verified_manifest(tmp_path):
    create_bundle(matmul_add(), tmp_path / "m.hybrid")
    cm, info = load_with_info(tmp_path / "m.hybrid")
    assert info.manifest.name == cm.model.name and info.manifest.model.outputs[0].name == cm.signature.output_names[0]


def test_serve_reads_the_manifest_only_through_the_verified_reader(tmp_path):
    import hybrid.serve.core.repository as repo

    assert "zipfile" not in inspect.getsource(repo)  # no second, unverified read of the archive
    assert inspect.signature(repo._manifest_serving).parameters["manifest"].annotation == "Manifest"
    create_bundle(matmul_add(), tmp_path / "m.hybrid", serving={"max_batch": 3})
    _, info = load_with_info(tmp_path / "m.hybrid")
    assert repo._manifest_serving(info.manifest) == {"max_batch": 3}  # unset keys keep the server's values
    create_bundle(matmul_add(), tmp_path / "bare.hybrid")
    assert repo._manifest_serving(load_with_info(tmp_path / "bare.hybrid")[1].manifest) == {}
