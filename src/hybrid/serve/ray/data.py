"""Batch inference over a data set on Ray Data: a callable class for ``Dataset.map_batches``.

::

    import ray
    from hybrid.serve.ray.data import HybridPredictor, batch_predict, consume

    ds = ray.data.from_numpy(images).rename_columns({"data": "data_0"})   # or read_images, read_parquet...
    out = batch_predict(ds, "squeezenet.onnx", target="onnxruntime", concurrency=2, batch_size=64,
                        num_cpus=1)
    report = consume(out, on_progress=lambda r: print(f"{r.rows}/{r.total} rows, {r.rows_per_s:.0f}/s"))
    report.decisions        # {actor: 'onnxruntime:cpu'}: what each actor's model runs on

Each actor (one per ``concurrency``) reads the model once from the package it is given (the file's bytes
and SHA-256, checked and cached per node like a Serve replica's, :mod:`hybrid.serve.ray.models`) and
compiles it once; every batch then runs on that compiled model. With ``target='auto'`` each actor makes
auto's decision on its own node; the decision comes back with the rows (column :data:`RUNTIME_COLUMN`,
``'<backend>:<device>'``) and :func:`consume` reports it per actor. Batches may be numpy (a dict of
columns) or pandas (a DataFrame whose tensor columns hold one array per row); the answer has the same
format, the input columns kept and one column per model output added.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.errors import ConfigError
from hybrid.serve.core.repository import discover
from hybrid.serve.ray.models import ModelPackage, materialize, pack

__all__ = ["RUNTIME_COLUMN", "BatchReport", "HybridPredictor", "batch_predict", "consume"]

RUNTIME_COLUMN = "pyasc_runtime"  # '<backend>:<device>@<node>/<pid>' of the actor that ran the row


def _package(model: str | Path | ModelPackage) -> ModelPackage:
    if isinstance(model, ModelPackage):
        return model
    sources = discover([model])
    if len(sources) != 1:
        raise ConfigError("HYB-102", f"batch inference runs one model, {model} holds {len(sources)} versions",
                          "pass the model file (or NAME=PATH) itself")
    return pack(sources)[0]


class HybridPredictor:
    """The callable class for ``map_batches``: compiles the model once per actor, then runs every batch.

    Args:
        model: The model file (``.onnx``/``.hybrid``, read where the class is built) or a package.
        target: Target of the compile ('auto': each actor decides on its node).
        inputs: Column name -> model input name, for columns named otherwise (default: the model's input
            names; a model with one input also takes a batch's only column).
        backend_config: Backend options for the actor's process, as for ``hybrid.set_backend``.
        report: Add :data:`RUNTIME_COLUMN` to every answer.
    """

    def __init__(self, model: str | Path | ModelPackage, target: str = "auto", inputs: Mapping[str, str] | None = None,
                 backend_config: Mapping[str, Mapping[str, Any]] | None = None, report: bool = True) -> None:
        from hybrid.serve.core.repository import configure_backends, load_model

        configure_backends(dict(backend_config) if backend_config else None)
        source = materialize(_package(model))
        t0 = time.perf_counter()
        self.served = load_model(source, target, {"max_batch": 0})  # the compiled model, no batcher
        self.compile_s = time.perf_counter() - t0
        self.model = self.served.compiled
        self.inputs = dict(inputs or {})
        self.report = report
        import ray

        node = ray.get_runtime_context().get_node_id()[:8] if ray.is_initialized() else "local"
        self.runtime = f"{self.model.backend}:{self.model.device}@{node}/{os.getpid()}"
        self.input_names = self.model.signature.input_names

    def _feeds(self, columns: Mapping[str, Any]) -> dict[str, np.ndarray]:
        mapping = {c: self.inputs.get(c, c) for c in columns}
        feeds = {name: columns[c] for c, name in mapping.items() if name in self.input_names}
        if not feeds and len(self.input_names) == 1 and len(columns) == 1:
            feeds = {self.input_names[0]: next(iter(columns.values()))}
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ConfigError("HYB-102", f"the batch has columns {sorted(columns)}, the model needs inputs "
                              f"{self.input_names} (missing {missing})",
                              "rename the columns or map them: HybridPredictor(..., inputs={'column': 'input'})")
        return {k: np.ascontiguousarray(v) for k, v in feeds.items()}

    def __call__(self, batch: Any) -> Any:
        """Run one batch: a dict of numpy columns, or a pandas DataFrame (answered in the same format)."""
        if isinstance(batch, Mapping):
            outputs = self.model.run(self._feeds(batch))
            answer = {**batch, **outputs}
            if self.report:
                answer[RUNTIME_COLUMN] = np.array([self.runtime] * len(next(iter(outputs.values()))))
            return answer
        columns = {c: np.stack(batch[c].to_numpy()) if batch[c].dtype == object else batch[c].to_numpy()
                   for c in batch.columns}
        outputs = self.model.run(self._feeds(columns))
        answer = batch.copy()
        for name, value in outputs.items():
            answer[name] = list(value) if value.ndim > 1 else value
        if self.report:
            answer[RUNTIME_COLUMN] = self.runtime
        return answer


def batch_predict(dataset: Any, model: str | Path | ModelPackage, *, target: str = "auto",
                  inputs: Mapping[str, str] | None = None, concurrency: int | tuple[int, int] = 1,
                  batch_size: int | None = 64, num_cpus: float = 1.0, batch_format: str = "numpy",
                  backend_config: Mapping[str, Mapping[str, Any]] | None = None, **map_batches: Any) -> Any:
    """``dataset.map_batches(HybridPredictor, ...)``: the model over every row, lazily (see :func:`consume`).

    ``concurrency`` (actors, or ``(min, max)`` for an autoscaling pool; passed as Ray Data's
    ``compute=ActorPoolStrategy(...)``), ``batch_size``, ``num_cpus`` and ``batch_format`` ('numpy' or
    'pandas') are passed through, as are other ``map_batches`` keywords. The model file is read once, here.
    Leave the pipeline's other tasks a CPU: actors holding every CPU starve the read tasks that feed them.
    """
    if batch_format not in ("numpy", "pandas"):
        raise ConfigError("HYB-102", f"batch_format must be 'numpy' or 'pandas', got {batch_format!r}",
                          "batch_format='numpy'")
    from ray.data import ActorPoolStrategy

    package = _package(model)
    if "compute" not in map_batches:  # Ray 2.51 deprecates map_batches(concurrency=) for compute=
        low, high = concurrency if isinstance(concurrency, tuple) else (concurrency, concurrency)
        map_batches["compute"] = ActorPoolStrategy(min_size=low, max_size=high)
    return dataset.map_batches(HybridPredictor, fn_constructor_args=(package,),
                               fn_constructor_kwargs={"target": target, "inputs": dict(inputs or {}),
                                                      "backend_config": backend_config},
                               batch_size=batch_size, num_cpus=num_cpus, batch_format=batch_format, **map_batches)


@dataclass
class BatchReport:
    """What :func:`consume` saw: rows, time, and each actor's runtime decision.

    Attributes:
        rows: Rows answered so far.
        total: Rows in the data set when Ray Data knows it beforehand, else None.
        seconds: Time since the first batch was asked for.
        decisions: Actor ('<node>/<pid>') -> '<backend>:<device>' its model runs on.
        rows_by_actor: Actor -> rows it answered.
    """

    rows: int = 0
    total: int | None = None
    seconds: float = 0.0
    decisions: dict[str, str] = field(default_factory=dict)
    rows_by_actor: dict[str, int] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        """Rows answered per second since the first batch was asked for."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def consume(dataset: Any, *, total: int | None = None, batch_size: int | None = None,
            on_progress: Callable[[BatchReport], None] | None = None,
            on_batch: Callable[[Mapping[str, np.ndarray]], None] | None = None) -> BatchReport:
    """Run the pipeline to the end, calling ``on_progress`` after every batch and ``on_batch`` with it.

    Args:
        dataset: The output of :func:`batch_predict` (numpy-format batches are read back).
        total: Rows expected (the input's ``count()``), for the progress figure ``rows/total``.
        batch_size: Rows per batch read back (None: as produced).
        on_progress: Called with the running :class:`BatchReport` (a progress figure: ``rows/total``).
        on_batch: Called with each answered batch (to check or store it).
    """
    report = BatchReport(total=total)
    t0 = time.perf_counter()
    batches: Iterator[Mapping[str, np.ndarray]] = dataset.iter_batches(batch_size=batch_size, batch_format="numpy")
    for batch in batches:
        if RUNTIME_COLUMN in batch:
            actors, counts = np.unique(batch[RUNTIME_COLUMN], return_counts=True)
            for entry, count in zip(actors.tolist(), counts.tolist()):
                decision, _, actor = str(entry).partition("@")
                report.decisions[actor] = decision
                report.rows_by_actor[actor] = report.rows_by_actor.get(actor, 0) + int(count)
        report.rows += len(next(iter(batch.values())))
        report.seconds = time.perf_counter() - t0
        if on_batch is not None:
            on_batch(batch)
        if on_progress is not None:
            on_progress(report)
    return report
