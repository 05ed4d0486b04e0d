"""``TaskModel``: a compiled model that takes frames and returns answers (detections, labels).

``hybrid.load`` returns one when the bundle declares a vision task (see :mod:`hybrid.vision.spec`);
``hybrid.load_task`` (:func:`hybrid.bundle.load_task`) does the same and says so to a type checker (it
refuses a bundle without a task); ``TaskModel.from_options(cm, 'detection', format='yolov8', ...)`` wraps
any compiled model. A TaskModel is a :class:`~hybrid.runtime.compiled.CompiledModel` (what ``hybrid.load``
declares): the attributes (``signature``, ``backend``, ``plan``...), ``run`` and ``close`` are the compiled
model's, read live, and ``save`` is CompiledModel's (the bundle keeps the declarations
:meth:`TaskModel.task_declarations` returns); only a call differs, taking frames and returning answers. Calls
queue preprocessing, the run and postprocessing together on a stream when given ``stream=`` (as
``CompiledModel.__call__`` does), so a detector and a classifier chained on one stream stay in order
while the caller goes on decoding frames. Raw tensors stay available through :meth:`TaskModel.run`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hybrid.errors import BundleError, ConfigError, RunError
from hybrid.runtime.compiled import CompiledModel
from hybrid.vision.checks import DEFAULT_TOP_K, TaskFit, check_declarations, declarations
from hybrid.vision.preprocess import ImageInput, Placement, as_frames, input_shape, prepare, prepare_crops
from hybrid.vision.results import Classification, Detections
from hybrid.vision.spec import (
    ClassificationPostprocess,
    DetectionPostprocess,
    Postprocess,
    Preprocess,
    declare,
    flat_options,
)
from hybrid.vision.yolo import decode

if TYPE_CHECKING:
    from hybrid.hal.backend import Executable
    from hybrid.ir import Model, Signature
    from hybrid.runtime.plan import Plan

# declarations: re-exported for create_bundle
__all__ = ["Prepared", "TaskFit", "TaskModel", "check_declarations", "declarations", "task_model"]

_STAGES = ("preprocess", "run", "postprocess")


class _StageTimes:
    """Seconds and items per stage, summed across calls and threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._data = {s: [0, 0, 0.0] for s in _STAGES}

    def add(self, items: int, *marks: float, first: int = 0) -> None:
        """Record consecutive stages from ``_STAGES[first]``: stage i took ``marks[i + 1] - marks[i]``."""
        with self._lock:
            for stage, t0, t1 in zip(_STAGES[first:], marks, marks[1:]):
                row = self._data[stage]
                row[0] += 1
                row[1] += items
                row[2] += t1 - t0

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {s: {"calls": c, "items": n, "seconds": t} for s, (c, n, t) in self._data.items()}


class _Buffers:
    """Input batches whose run is over, reused by the next call of the same size.

    Touching a fresh array of several MB costs about as much as filling it (page faults, on every
    call): a 640x640 batch of one frame is 4.9 MB. Only buffers the caller never saw are recycled,
    and only when the model's output does not share their memory.
    """

    def __init__(self, keep: int = 4) -> None:
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []
        self._keep = keep

    def take(self, shape: tuple[int, ...]) -> np.ndarray | None:
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.shape == shape:
                    return self._free.pop(i)
        return None

    def give(self, buf: np.ndarray, output: np.ndarray) -> None:
        if buf.dtype != np.float32 or np.may_share_memory(buf, output):
            return
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buf)


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    """Frames preprocessed by :meth:`TaskModel.prepare`, ready for that model's ``__call__``.

    Attributes:
        tensor: The input batch (None for no frames).
        placements: Where each frame landed in the input.
        frames: The source frames.
        single: Whether one frame (not a batch) was given.
        input: The image input they were prepared for.
    """

    tensor: np.ndarray | None
    placements: tuple[Placement, ...]
    frames: tuple[np.ndarray, ...]
    single: bool
    input: ImageInput


def _check_color(color: str) -> None:
    if color not in ("rgb", "bgr"):
        raise ConfigError("HYB-102", f"color: expected 'rgb' or 'bgr' (the frames' channel order), got {color!r}")


class TaskModel(CompiledModel):
    """A compiled image model with its declared pre- and postprocessing.

    A CompiledModel whose call takes frames and returns answers; ``run`` stays the raw model.

    Attributes:
        compiled: The CompiledModel it runs. ``model``, ``signature``, ``executable``, ``plan``,
            ``backend``, ``device``, ``options`` and ``target`` are its attributes, read (and written)
            through: online tuning that switches the compiled model's backend shows here too.
        task: 'detection' or 'classification'.
        preprocess, postprocess: The declarations (see :mod:`hybrid.vision.spec`).
        input: The image input they resolve to (size, layout, dtype, max_batch).
        fit: What the declarations resolve to on this model (:class:`~hybrid.vision.checks.TaskFit`):
            the answer output, its classes, whether a softmax is applied, the default top_k.
        class_names: Names by class id (empty when none are declared).

    Raises:
        BundleError: HYB-502 when the declarations do not fit the model.
    """

    def __init__(self, compiled: CompiledModel, preprocess: Preprocess, postprocess: Postprocess) -> None:
        # no CompiledModel.__init__: the state is the wrapped model's, reached through the properties below
        self.compiled = compiled
        self.preprocess = preprocess
        self.postprocess = postprocess
        self.task = postprocess.task
        self.fit = check_declarations(compiled.model, preprocess, postprocess, compiled.model.name)
        self.input: ImageInput = self.fit.input
        self.output: str = self.fit.output
        self.class_names: tuple[str, ...] = tuple(postprocess.class_names or ())
        self._times = _StageTimes()
        self._buffers = _Buffers()

    @classmethod
    def from_options(cls, compiled: CompiledModel, task: str, **options: Any) -> TaskModel:
        """Wrap a compiled model with flat task options (the keys of ``pyasc bundle create``).

        ``TaskModel.from_options(cm, 'detection', format='yolov8', classes=['cat', 'dog'])``
        """
        decl = declare(task, options)
        if decl is None:
            raise BundleError("HYB-502", f"task {task!r} is not a vision task", "use 'detection' or 'classification'")
        return cls(compiled, *decl)

    # ------------------------------------------------------------------ the compiled model's state
    @property
    def model(self) -> Model:
        """The hybrid.Model it was compiled from."""
        return self.compiled.model

    @model.setter
    def model(self, value: Model) -> None:
        self.compiled.model = value

    # pyright takes a property over an annotated attribute for a different symbol; it is the same one, settable
    @property
    def signature(self) -> Signature:
        """The raw model's inputs and outputs."""
        return self.compiled.signature

    @signature.setter
    def signature(self, value: Signature) -> None:  # pyright: ignore[reportIncompatibleVariableOverride]
        self.compiled.signature = value

    @property
    def executable(self) -> Executable:
        """The backend's executable."""
        return self.compiled.executable

    @executable.setter
    def executable(self, value: Executable) -> None:
        self.compiled.executable = value

    @property
    def plan(self) -> Plan:
        """Which nodes run where."""
        return self.compiled.plan

    @plan.setter
    def plan(self, value: Plan) -> None:
        self.compiled.plan = value

    @property
    def backend(self) -> str:
        """Backend name."""
        return self.compiled.backend

    @backend.setter
    def backend(self, value: str) -> None:
        self.compiled.backend = value

    @property
    def device(self) -> str:
        """Device name."""
        return self.compiled.device

    @device.setter
    def device(self, value: str) -> None:
        self.compiled.device = value

    @property
    def options(self) -> dict[str, Any]:
        """The backend options the executable was built with."""
        return self.compiled.options

    @options.setter
    def options(self, value: dict[str, Any]) -> None:  # pyright: ignore[reportIncompatibleVariableOverride]
        self.compiled.options = value

    @property
    def target(self) -> str:
        """The target it was compiled for."""
        return self.compiled.target

    @target.setter
    def target(self, value: str) -> None:
        self.compiled.target = value

    @property
    def tunes_online(self) -> bool:
        """Whether the compiled model decides its shape buckets on its calls (``target='auto'``)."""
        return self.compiled.tunes_online

    @property
    def tuning(self) -> tuple[Any, ...]:
        """The compiled model's per-bucket tuning records."""
        return self.compiled.tuning

    # ------------------------------------------------------------------ raw tensors: the compiled model's calls
    # Every tensor-level call of CompiledModel is forwarded, so code written for a CompiledModel (the server's
    # batcher calls run_checked, a deployment script calls tune) runs a TaskModel's raw model unchanged.
    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """The raw model: input name -> array in, output name -> array out (no pre/postprocessing)."""
        return self.compiled.run(feeds)

    def run_checked(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """The raw model on feeds already checked against :attr:`signature` (what the server runs)."""
        return self.compiled.run_checked(feeds)

    def submit(self, feeds: Mapping[str, Any], *, stream: Any = None) -> Future[dict[str, Any]]:
        """The raw model, asynchronously (see ``CompiledModel.submit``): a future of its outputs."""
        return self.compiled.submit(feeds, stream=stream)

    @property
    def submit_workers(self) -> int:
        """Threads the compiled model's :meth:`submit` runs work on."""
        return self.compiled.submit_workers

    @submit_workers.setter
    def submit_workers(self, value: int) -> None:
        self.compiled.submit_workers = value

    def tune(self, samples: Any, timeout_s: float | None = None) -> tuple[Any, ...]:
        """Decide the raw model's shape buckets on these input samples (see ``CompiledModel.tune``)."""
        return self.compiled.tune(samples, timeout_s)

    def freeze(self) -> tuple[Any, ...]:
        """Stop the raw model's tuning (see ``CompiledModel.freeze``)."""
        return self.compiled.freeze()

    def _execute(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return self.compiled._execute(feeds)

    def image_input_shapes(self, batch: int = 1) -> dict[str, tuple[int, ...]]:
        """The image input's shape for ``batch`` images at the declared size (a fixed batch stays fixed).

        What a tool that makes its own inputs runs this model at (``hybrid.profile``, ``pyasc profile``).
        """
        return {self.input.name: input_shape(self.input.static_batch or batch, self.input)}

    @property
    def max_batch(self) -> int:
        """Most images in one run of the model."""
        return self.input.max_batch

    def _infer(self, x: np.ndarray) -> np.ndarray:
        """Run a prepared batch in chunks of ``max_batch``; return the declared output."""
        inp = self.input
        parts = []
        for start in range(0, len(x), inp.max_batch):
            chunk = x[start:start + inp.max_batch]
            n = len(chunk)
            if inp.static_batch is not None and n < inp.static_batch:  # a fixed batch: pad the last chunk
                chunk = np.concatenate([chunk, np.zeros((inp.static_batch - n, *chunk.shape[1:]), chunk.dtype)])
            parts.append(np.asarray(self.compiled.run({inp.name: chunk})[self.output])[:n])
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    # ------------------------------------------------------------------ answers
    def prepare(self, frames: Any, *, color: str = "rgb") -> Prepared:
        """Preprocess frames for this model without running it: ``model(prepared)`` finishes the work.

        A pipeline can give preprocessing a stage of its own, overlapping it with the runs of the
        previous frames (``Pipeline().add_stage(det.prepare).add_stage(det)...``).
        """
        _check_color(color)
        return self._prepare(frames, color, recycle=False)

    def _prepare(self, frames: Any, color: str, recycle: bool) -> Prepared:
        batch, single = as_frames(frames)
        t0 = time.perf_counter()
        buffer = self._buffers.take(input_shape(len(batch), self.input)) if recycle else None
        x, placements = prepare(batch, self.input, color, buffer) if batch else (None, [])
        self._times.add(len(batch), t0, time.perf_counter())
        return Prepared(x, tuple(placements), tuple(batch), single, self.input)

    def __call__(self, frames: Any, stream: Any = None, *, color: str = "rgb", top_k: int | None = None) -> Any:
        """Answer for one frame or a batch of frames (any sizes).

        Args:
            frames: One H x W x C frame, an N x H x W x C array, a list of frames, or what
                :meth:`prepare` returned.
            stream: A ``hybrid.StreamContext``: queue the whole call on it and return its handle.
            color: The frames' channel order, 'rgb' (as VideoSource gives them) or 'bgr' (OpenCV).
            top_k: Classification only: labels per answer (default: the declared top_k).

        Returns:
            Detection: a :class:`Detections` per frame; classification: a :class:`Classification`
            per frame. One answer for one frame, else a list.
        """
        _check_color(color)
        if stream is not None:
            return stream.submit(self._answer, frames, color, top_k)
        return self._answer(frames, color, top_k)

    def _answer(self, frames: Any, color: str, top_k: int | None) -> Any:
        internal = not isinstance(frames, Prepared)
        if internal:
            frames = self._prepare(frames, color, recycle=True)
        elif frames.input is not self.input:
            raise RunError("HYB-405", f"these frames were prepared for another model's input, not "
                           f"{self.compiled.model.name!r} ({self.input.height}x{self.input.width})",
                           "prepare them with this model's prepare()")
        batch, single, placements, tensor = frames.frames, frames.single, frames.placements, frames.tensor
        if not batch or tensor is None:
            return []
        t1 = time.perf_counter()
        out = self._infer(tensor)
        if internal:  # nobody else holds this input batch: the next call may fill it again
            self._buffers.give(tensor, out)
        t2 = time.perf_counter()
        post = self.postprocess
        if isinstance(post, DetectionPostprocess):
            answers: list[Any] = []
            for i, raw in enumerate(decode(out, post)):
                answers.append(Detections(placements[i].to_frame(raw.boxes), raw.scores, raw.class_ids,
                                          self._names(raw.class_ids), frame=batch[i], index=i))
        else:
            answers = self._top_k(out, top_k)
        self._times.add(len(batch), t1, t2, time.perf_counter(), first=1)
        return answers[0] if single else answers

    def _names(self, ids: np.ndarray) -> tuple[str, ...]:
        names = self.class_names
        return tuple(names[i] if i < len(names) else str(i) for i in ids.tolist())

    def _top_k(self, out: np.ndarray, top_k: int | None) -> list[Classification]:
        post = self.postprocess
        if not isinstance(post, ClassificationPostprocess):
            raise ConfigError("HYB-102", f"top_k applies to classification; {self.compiled.model.name!r} is a "
                              f"{self.task} model", "call a classification model with top_k")
        scores = np.asarray(out, np.float32).reshape(len(out), -1)
        k = top_k if top_k is not None else self.fit.top_k or min(DEFAULT_TOP_K, scores.shape[1])
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ConfigError("HYB-102", f"top_k: expected a positive int, got {k!r}")
        if self.fit.softmax:
            scores = np.exp(scores - scores.max(axis=1, keepdims=True))
            scores /= scores.sum(axis=1, keepdims=True)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        best = np.take_along_axis(scores, order, axis=1)
        return [Classification(ids.astype(np.int64), s, self._names(ids)) for ids, s in zip(order, best)]

    def crop_and_classify(self, detections: Any, stream: Any = None, top_k: int = 1, *,
                          color: str = "rgb") -> Any:
        """Classify the pixels of every detection and attach the labels.

        Every box is cropped from the frame its Detections remembers, preprocessed as this model
        declares (resize or letterbox to the input), and the crops of all frames run together in
        batches of up to ``max_batch``.

        Args:
            detections: A :class:`Detections`, a list of them, or the stream handle a detector
                returned for either.
            stream: Queue the work on this stream and return its handle at once.
            top_k: Labels per box.
            color: The frames' channel order.

        Returns:
            The detections (same structure: one or a list) with ``labels`` set.
        """
        if self.task != "classification":
            raise ConfigError("HYB-102", f"crop_and_classify needs a classification model; "
                              f"{self.compiled.model.name!r} is a {self.task} model",
                              "load a bundle declared with task='classification'")
        _check_color(color)
        if stream is not None:
            return stream.submit(self._crop_and_classify, detections, top_k, color)
        return self._crop_and_classify(detections, top_k, color)

    def _crop_and_classify(self, detections: Any, top_k: int, color: str) -> Any:
        dets, single = _as_detections(detections)
        frames: list[np.ndarray] = []
        slot: dict[int, int] = {}
        frame_ids, rects = [], []
        for d in dets:
            if d.frame is None:
                raise RunError("HYB-406", "crop_and_classify: these Detections do not hold their frame",
                               "pass the detections a detector returned (they remember their frames)")
            fid = slot.setdefault(id(d.frame), len(frames))
            if fid == len(frames):
                frames.append(np.asarray(d.frame))
            frame_ids.append(np.full(len(d), fid, np.intp))
            rects.append(_crop_rects(d.boxes, d.frame.shape[:2]))
        total = sum(len(d) for d in dets)
        if total == 0:
            out = [d.with_labels(()) for d in dets]
            return out[0] if single else out
        t0 = time.perf_counter()
        x, _ = prepare_crops(frames, np.concatenate(frame_ids), np.concatenate(rects), self.input, color)
        t1 = time.perf_counter()
        logits = self._infer(x)
        t2 = time.perf_counter()
        labels = self._top_k(logits, top_k)
        out, start = [], 0
        for d in dets:
            out.append(d.with_labels(labels[start:start + len(d)]))
            start += len(d)
        self._times.add(total, t0, t1, t2, time.perf_counter())
        return out[0] if single else out

    # ------------------------------------------------------------------ bookkeeping
    def stats(self) -> dict[str, dict[str, float]]:
        """Per stage ('preprocess', 'run', 'postprocess'): calls, items (frames or crops), seconds."""
        return self._times.snapshot()

    def reset_stats(self) -> None:
        """Zero the per-stage statistics."""
        self._times.reset()

    def task_options(self) -> dict[str, Any]:
        """The flat task options that declare this model (as ``pyasc bundle create`` takes them)."""
        return flat_options(self.preprocess, self.postprocess)

    def task_declarations(self) -> tuple[str, dict[str, Any]]:
        """The task and its flat options: ``save`` (``save_bundle``) writes them to the bundle's manifest."""
        return self.task, self.task_options()

    def close(self) -> None:
        """Release the compiled model's native resources."""
        self.compiled.close()

    def __repr__(self) -> str:
        inp = self.input
        return (f"<hybrid.vision.TaskModel {self.task} {self.compiled.model.name!r} on {self.compiled.backend}:"
                f"{self.compiled.device}, input {inp.height}x{inp.width} {inp.layout} {inp.resize}>")


def _crop_rects(boxes: np.ndarray, frame_hw: tuple[int, int]) -> np.ndarray:
    """Boxes clipped to the frame, each at least one pixel wide and high."""
    h, w = frame_hw
    r = np.asarray(boxes, np.float64).reshape(-1, 4).copy()
    for lo, hi, size in ((0, 2, w), (1, 3, h)):
        r[:, lo] = np.clip(r[:, lo], 0.0, size)
        r[:, hi] = np.clip(r[:, hi], 0.0, size)
        thin = r[:, hi] - r[:, lo] < 1.0
        if thin.any():
            start = np.clip((r[thin, lo] + r[thin, hi]) / 2 - 0.5, 0.0, size - 1.0)
            r[thin, lo], r[thin, hi] = start, start + 1.0
    return r


def _as_detections(value: Any) -> tuple[list[Detections], bool]:
    if not isinstance(value, (Detections, list, tuple)) and callable(getattr(value, "result", None)):
        value = value.result()  # a stream handle: on the same stream this work is already done
    if isinstance(value, Detections):
        return [value], True
    if isinstance(value, Sequence) and all(isinstance(d, Detections) for d in value):
        return list(value), False
    raise RunError("HYB-406", f"crop_and_classify: expected Detections, a list of them or a stream handle of "
                   f"those, got {type(value).__name__}", "pass what a detection model returned")


def task_model(compiled: CompiledModel, task: str | None, preprocess: Preprocess | None,
               postprocess: Postprocess | None) -> CompiledModel:
    """What ``hybrid.load`` returns: a TaskModel when the bundle declares processing, else ``compiled``.

    Raises:
        BundleError: HYB-502 when only one of the two sections is present, or they disagree with
            the manifest's task or the model.
    """
    if preprocess is None and postprocess is None:
        return compiled
    if preprocess is None or postprocess is None:
        missing = "preprocess" if preprocess is None else "postprocess"
        raise BundleError("HYB-502", f"the manifest declares task processing without {missing!r}",
                          "rebuild the bundle with pyasc bundle create --task ...")
    if task != postprocess.task:
        raise BundleError("HYB-502", f"the manifest's task {task!r} differs from its postprocess task "
                          f"{postprocess.task!r}", "rebuild the bundle with pyasc bundle create --task ...")
    return TaskModel(compiled, preprocess, postprocess)

