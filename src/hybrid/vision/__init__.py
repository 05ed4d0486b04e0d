"""Vision tasks end to end: frames in, detections and labels out (``hybrid.vision``).

A bundle that declares ``task='detection'`` or ``'classification'`` with its preprocessing and
postprocessing (:mod:`hybrid.vision.spec`) loads as a :class:`TaskModel` (a CompiledModel whose call
takes frames; ``hybrid.load_task`` returns one typed as such): it takes frames of any size and returns
:class:`Detections` or :class:`Classification` answers, and a classifier can ``crop_and_classify`` a
detector's boxes. :class:`VideoSource` reads frames from a video file or
any iterable, in batches. See docs/vision.md.
"""

from hybrid.vision.nms import box_iou, nms
from hybrid.vision.preprocess import ImageInput, Placement, as_frames, image_input, prepare, prepare_crops
from hybrid.vision.results import Classification, Detection, Detections
from hybrid.vision.spec import (
    ClassificationPostprocess,
    DetectionPostprocess,
    Preprocess,
    declare,
    read_classes,
)
from hybrid.vision.tasks import Prepared, TaskModel, task_model
from hybrid.vision.video import VideoInfo, VideoSource, write_video
from hybrid.vision.yolo import decode

__all__ = [
    "Classification",
    "ClassificationPostprocess",
    "Detection",
    "DetectionPostprocess",
    "Detections",
    "ImageInput",
    "Placement",
    "Prepared",
    "Preprocess",
    "TaskModel",
    "VideoInfo",
    "VideoSource",
    "as_frames",
    "box_iou",
    "declare",
    "decode",
    "image_input",
    "nms",
    "prepare",
    "prepare_crops",
    "read_classes",
    "task_model",
    "write_video",
]
