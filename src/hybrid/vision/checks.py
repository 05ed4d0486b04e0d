"""Checking task declarations against a model, and what ``create_bundle`` writes for them.

Used when a bundle is written (:func:`declarations`) and when a TaskModel is built (on load): a
declaration that does not fit the model fails with HYB-502 naming the key, before anything runs.
What the declarations leave open is resolved here from the model itself, once: whether the scores
need a softmax (:func:`scores_activation`) and how many labels an answer carries by default.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hybrid.errors import BundleError, HybridError
from hybrid.vision.preprocess import ImageInput, image_input, prepare
from hybrid.vision.spec import ClassificationPostprocess, DetectionPostprocess, Postprocess, Preprocess, declare
from hybrid.vision.yolo import OTHER_FORMAT, candidates, num_classes

if TYPE_CHECKING:
    from hybrid.ir import Model

__all__ = ["DEFAULT_TOP_K", "TaskFit", "check_declarations", "declarations", "scores_activation"]

logger = logging.getLogger("hybrid")

DEFAULT_TOP_K = 5
"""Labels per classification answer when neither the bundle nor the call says (fewer classes: all of them)."""

# ops that pass a tensor's values through unchanged (reshaping, renaming): a Softmax before them still makes
# the output probabilities
_PASS_THROUGH = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast", "CastLike"})
_SCORE_OPS = frozenset({"Softmax", "Sigmoid"})


@dataclass(frozen=True, slots=True)
class TaskFit:
    """What the declarations resolve to on one model.

    Attributes:
        input: The image input (size, layout, dtype, max_batch).
        output: The output holding the answers.
        classes: Classes of that output when its shape says (else None).
        softmax: Classification: whether answers apply a softmax to the output (False for detection).
        top_k: Classification: labels per answer by default; None: min(5, classes), read from each output.
    """

    input: ImageInput
    output: str
    classes: int | None
    softmax: bool
    top_k: int | None


def scores_activation(model: Model, output: str) -> str | None:
    """'Softmax' or 'Sigmoid' when ``output`` comes out of one (through reshapes and casts), else None.

    A classifier exported with its final Softmax (torchvision's weights with a softmax head, most
    PaddleClas and Keras exports) already outputs probabilities: a second softmax would flatten them
    (0.9997 -> 0.731 on 1000 classes).
    """
    values = {v.name: v for v in model.graph.outputs}
    value = values.get(output)
    for _ in range(64):  # a bounded walk: a chain of reshapes is short
        node = value.producer() if value is not None else None
        if node is None:
            return None
        if node.op_type in _SCORE_OPS and node.domain in ("", "ai.onnx"):
            return node.op_type
        if node.op_type not in _PASS_THROUGH or not node.inputs:
            return None
        value = node.inputs[0]
    return None


def _softmax(model: Model, post: ClassificationPostprocess, output: str, name: str) -> bool:
    found = scores_activation(model, output)
    if post.softmax is None:
        return found is None
    if post.softmax and found is not None:
        raise BundleError("HYB-502", f"softmax=true was declared, but output {output!r} of {name!r} comes out of a "
                          f"{found}: its scores are probabilities already, and a second softmax would flatten "
                          "them", "leave softmax out (it is read from the graph) or declare softmax=false")
    return post.softmax


def check_declarations(model: Model, preprocess: Preprocess, postprocess: Postprocess,
                       name: str) -> TaskFit:
    """Check task declarations against a model; return what they resolve to on it.

    Raises:
        BundleError: HYB-502 naming what does not fit (inputs, output name, sizes, class count, a
            softmax declared on probabilities).
    """
    task = postprocess.task
    signature = model.signature
    if len(signature.inputs) != 1:
        raise BundleError("HYB-502", f"task {task!r} needs a model with one image input; {name!r} has "
                          f"{len(signature.inputs)} ({signature})", "export the model with the image as its only input")
    inp = image_input(preprocess, signature.inputs[0])
    names = signature.output_names
    output = postprocess.output or names[0]
    if output not in names:
        raise BundleError("HYB-502", f"postprocess output {output!r} is not an output of {name!r} (outputs: "
                          f"{names})", "declare one of the model's outputs")
    shape = signature.outputs[names.index(output)].shape
    if isinstance(postprocess, ClassificationPostprocess):
        dims = [d for d in (shape or ())[1:] if d != 1]
        found = dims[0] if len(dims) == 1 and isinstance(dims[0], int) else None
    else:
        found = num_classes(shape, postprocess.format)
        if found is not None and found < 1:
            other = OTHER_FORMAT[postprocess.format]
            raise BundleError("HYB-502", f"output {output!r} of shape {shape} is not a {postprocess.format} output "
                              "(no class scores)", f"declare the output's format (--format {other}?)")
    declared = len(postprocess.class_names or ())
    if found is not None and declared and found != declared:
        raise BundleError("HYB-502", f"{declared} class names declared, but output {output!r} of shape {shape} "
                          f"has {found} classes", "give one name per class, in class-id order")
    classes = found if found is not None else (declared or None)
    if not isinstance(postprocess, ClassificationPostprocess):
        return TaskFit(inp, output, classes, softmax=False, top_k=None)
    if postprocess.top_k is not None and classes is not None and postprocess.top_k > classes:
        raise BundleError("HYB-502", f"top_k {postprocess.top_k} exceeds the {classes} classes of output {output!r}",
                          f"declare top_k between 1 and {classes}, or leave it out (min({DEFAULT_TOP_K}, classes))")
    top_k = postprocess.top_k or (min(DEFAULT_TOP_K, classes) if classes is not None else None)
    return TaskFit(inp, output, classes, _softmax(model, postprocess, output, name), top_k)


def declarations(task: str | None, options: Mapping[str, Any] | None, model: Model,
                 name: str) -> dict[str, Any]:
    """The manifest's ``preprocess`` / ``postprocess`` fields for a task and its flat options.

    Empty for a task that is not a vision task (a plain label). Without options, a vision task gets
    the default declarations when they fit the model (an image classifier), and stays a plain label
    otherwise (a text classifier; a detector, which needs its ``format``), with a warning saying so.
    Used by ``create_bundle``.

    Raises:
        BundleError: HYB-502 for invalid options or options that do not fit the model.
    """
    try:
        decl = declare(task, options)
        if decl is None:
            return {}
        fit = check_declarations(model, *decl, name)
    except BundleError as e:
        if options:
            raise
        logger.warning("task %r of %r is recorded as a label only: %s (pass task options to declare its "
                       "processing)", task, name, e.message)
        return {}
    if isinstance(decl[1], DetectionPostprocess):
        _probe_detection(model, fit, decl[1], name)
    return {"preprocess": decl[0], "postprocess": decl[1]}


def _probe_detection(model: Model, fit: TaskFit, post: DetectionPostprocess, name: str) -> None:
    """Run the detector once on a gray frame and check its output reads as the declared format.

    A shape cannot tell the two YOLO layouts apart (both are rank 3, and the box count is often
    dynamic); the values can: read in the wrong layout, pixel coordinates land where the scores
    (probabilities) should be. A model that does not run here (a platform's own operators) is
    written unchecked, with a warning; the same check runs on every answer.

    Raises:
        BundleError: HYB-502 when the output is not in the declared format.
    """
    from hybrid.runtime.compiler import compile_model  # only a bundle's creation compiles here

    inp = fit.input
    frame = np.full((inp.height, inp.width, inp.channels), 114, np.uint8)
    try:
        cm = compile_model(model, target="cpu")
        try:
            x, _ = prepare([frame], inp)
            if inp.static_batch is not None and inp.static_batch > 1:
                x = np.concatenate([x] * inp.static_batch)
            out = np.asarray(cm.run({inp.name: x})[fit.output])
        finally:
            cm.close()
    except HybridError as e:
        logger.warning("could not run %r here to check that its output is %s (%s); it is written unchecked, and "
                       "every answer checks its scores", name, post.format, e.message)
        return
    candidates(out, post.format, post.conf_threshold)  # HYB-502 when the scores are not probabilities
