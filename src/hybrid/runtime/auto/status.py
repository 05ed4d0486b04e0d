"""What online tuning reports: ``cm.tuning``, one frozen record per shape bucket (docs/auto.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["Bucket", "BucketTuning", "CandidateResult", "bucket_label", "shapes_label"]

Bucket = tuple[tuple[str, tuple[int, ...]], ...]  # input name -> shape, dynamic dims rounded up to powers of two


def bucket_label(key: Bucket) -> str:
    """``'x: 1x3x512x1024'`` for a bucket (``'scalars'`` for a model without shaped inputs)."""
    return ", ".join(f"{n}: {'x'.join(map(str, s))}" for n, s in key) or "scalars"


def shapes_label(feeds: Mapping[str, Any]) -> str:
    """``'x: 1x3x480x640'``: the exact shapes of a call's inputs."""
    return ", ".join(f"{n}: {'x'.join(map(str, v.shape))}" for n, v in feeds.items() if hasattr(v, "shape"))


@dataclass(frozen=True, slots=True)
class CandidateResult:
    """One candidate of a bucket: its measured speed, or why it was left out.

    Attributes:
        label: ``'backend:device'``, with the precision after a space when reduced (``'openvino:cpu bf16'``).
        ratio: Its call time over the serving candidate's, from the paired turns (None: not timed yet; for one
            left untimed, the check's estimate).
        outcome: What the rule said: 'faster', 'slower', 'tie', 'open' (still under test, or left untimed and
            waiting for the re-check), 'serving', 'rejected' or 'failed'.
        reason: Why it was rejected or failed (the check's words); for a judgement that is provisional, what
            qualifies it (not timed; replaced at the time bound and re-checked later); else ''.
    """

    label: str
    ratio: float | None
    outcome: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class BucketTuning:
    """Where tuning stands for one shape bucket.

    Attributes:
        bucket: The bucket, as shown (``'x: 1x3x512x1024'``: dynamic dims rounded up to powers of two).
        key: The bucket as data (input name -> rounded shape).
        state: 'tuning' (checked, compiled or raced now) or 'decided' (one candidate serves it; a re-check by
            the same rule may follow, see ``recheck_at_s``).
        phase: The controller's state in finer grain: 'new', 'checking', 'compiling', 'racing', 'installing',
            'decided'.
        serving: The candidate answering the bucket's calls now.
        calls: Calls of the bucket so far.
        decided_after_calls: The bucket's call count when it was decided (None: not yet).
        decided_after_s: Seconds from its first call to the decision (None: not yet).
        candidates: Every candidate of the bucket, with its ratio or the reason it was left out.
        recheck_at_s: Seconds after the first call at which the next re-check starts (None: none planned).
        first_shapes: The exact input shapes of the bucket's first call (``'x: 1x3x480x640'``).
    """

    bucket: str
    key: Bucket
    state: Literal["tuning", "decided"]
    phase: str
    serving: str
    calls: int
    decided_after_calls: int | None
    decided_after_s: float | None
    candidates: tuple[CandidateResult, ...] = ()
    recheck_at_s: float | None = None
    first_shapes: str = ""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what the server's statistics and ``pyasc compile --explain --json`` show)."""
        out = asdict(self)
        out["key"] = [[n, list(s)] for n, s in self.key]
        out["candidates"] = [asdict(c) for c in self.candidates]
        return out
