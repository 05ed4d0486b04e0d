"""Checking task declarations against a model's signature, and what ``create_bundle`` writes for them.

Used when a bundle is written (:func:`declarations`) and when a TaskModel is built (on load): a
declaration that does not fit the model fails with HYB-502 naming the key, before anything runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hybrid.errors import BundleError
from hybrid.vision.preprocess import ImageInput, image_input
from hybrid.vision.spec import ClassificationPostprocess, Postprocess, Preprocess, declare
from hybrid.vision.yolo import num_classes

if TYPE_CHECKING:
    from hybrid.ir import Signature

__all__ = ["check_declarations", "declarations"]

logger = logging.getLogger("hybrid")


def check_declarations(signature: Signature, preprocess: Preprocess, postprocess: Postprocess,
                       name: str) -> tuple[ImageInput, str]:
    """Check task declarations against a model's signature; return its image input and answer output.

    Raises:
        BundleError: HYB-502 naming what does not fit (inputs, output name, sizes, class count).
    """
    task = postprocess.task
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
            raise BundleError("HYB-502", f"output {output!r} of shape {shape} is not a {postprocess.format} output "
                              "(no class scores)", "declare the right format (yolov5 or yolov8)")
    declared = len(postprocess.class_names or ())
    if found is not None and declared and found != declared:
        raise BundleError("HYB-502", f"{declared} class names declared, but output {output!r} of shape {shape} "
                          f"has {found} classes", "give one name per class, in class-id order")
    return inp, output


def declarations(task: str | None, options: Mapping[str, Any] | None, signature: Signature,
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
        check_declarations(signature, *decl, name)
    except BundleError as e:
        if options:
            raise
        logger.warning("task %r of %r is recorded as a label only: %s (pass task options to declare its "
                       "processing)", task, name, e.message)
        return {}
    return {"preprocess": decl[0], "postprocess": decl[1]}
