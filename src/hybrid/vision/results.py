"""What vision models answer: :class:`Classification` and :class:`Detections` (with :class:`Detection` rows)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Classification", "Detection", "Detections"]


def _read_only(a: np.ndarray) -> np.ndarray:
    view = np.asarray(a).view()  # a view: the caller's own array stays writable
    view.setflags(write=False)
    return view


@dataclass(frozen=True, slots=True, eq=False)
class Classification:
    """Top-k labels of one image, best first.

    Attributes:
        class_ids: (k,) int64.
        scores: (k,) float32 (probabilities when the model declares softmax or outputs them).
        names: The k class names (the ids as text when the model declares no names).
    """

    class_ids: np.ndarray
    scores: np.ndarray
    names: tuple[str, ...]

    @property
    def label(self) -> str:
        """The best class's name."""
        return self.names[0]

    @property
    def class_id(self) -> int:
        """The best class's id."""
        return int(self.class_ids[0])

    @property
    def score(self) -> float:
        """The best class's score."""
        return float(self.scores[0])

    def __repr__(self) -> str:
        top = ", ".join(f"{n} {s:.3f}" for n, s in zip(self.names, self.scores))
        return f"<Classification {top}>"


@dataclass(frozen=True, slots=True)
class Detection:
    """One detected object: box (x1, y1, x2, y2) in frame pixels, score, class, and a label once classified."""

    box: tuple[float, float, float, float]
    score: float
    class_id: int
    name: str
    label: Classification | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Detections:
    """The detections of one frame.

    Attributes:
        boxes: (K, 4) float32 xyxy in the source frame's pixels.
        scores: (K,) float32.
        class_ids: (K,) int64.
        names: K class names.
        frame: The source frame (the array the detector was given, not a copy).
        index: The frame's position in the batch it came in.
        labels: After ``crop_and_classify``: one :class:`Classification` per box; else None.
    """

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    names: tuple[str, ...]
    frame: np.ndarray | None = None
    index: int = 0
    labels: tuple[Classification, ...] | None = None

    def __post_init__(self) -> None:
        k = len(self.scores)
        if np.shape(self.boxes) != (k, 4) or np.shape(self.class_ids) != (k,) or len(self.names) != k:
            raise ValueError(f"Detections: boxes {np.shape(self.boxes)}, scores {np.shape(self.scores)}, "
                             f"class_ids {np.shape(self.class_ids)} and {len(self.names)} names disagree")
        if self.labels is not None and len(self.labels) != k:
            raise ValueError(f"Detections: {len(self.labels)} labels for {k} boxes")
        for name in ("boxes", "scores", "class_ids"):
            object.__setattr__(self, name, _read_only(getattr(self, name)))

    def __len__(self) -> int:
        return len(self.scores)

    def __getitem__(self, i: int) -> Detection:
        x1, y1, x2, y2 = (float(v) for v in self.boxes[i])
        return Detection((x1, y1, x2, y2), float(self.scores[i]), int(self.class_ids[i]), self.names[i],
                         None if self.labels is None else self.labels[i])

    def __iter__(self) -> Iterator[Detection]:
        return (self[i] for i in range(len(self)))

    def with_labels(self, labels: Sequence[Classification]) -> Detections:
        """A copy with one label per box attached."""
        return dataclasses.replace(self, labels=tuple(labels))

    def crops(self) -> list[np.ndarray]:
        """The pixels of each box (integer-aligned views of the frame, at least 1 x 1)."""
        if self.frame is None:
            raise ValueError("these detections do not hold their frame")
        h, w = self.frame.shape[:2]
        out = []
        for x1, y1, x2, y2 in self.boxes:
            c0 = min(max(0, int(np.floor(x1))), w - 1)
            r0 = min(max(0, int(np.floor(y1))), h - 1)
            out.append(self.frame[r0:max(r0 + 1, int(np.ceil(y2))), c0:max(c0 + 1, int(np.ceil(x2)))])
        return out

    def __repr__(self) -> str:
        shape = "x".join(str(d) for d in self.frame.shape[:2]) if self.frame is not None else "?"
        labelled = ", labelled" if self.labels is not None else ""
        return f"<Detections {len(self)} on frame {self.index} ({shape}){labelled}>"
