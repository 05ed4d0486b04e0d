"""The lifecycle of a shape bucket under online tuning: its phases, the transitions allowed, its record.

``new`` -> ``checking`` (every candidate on a copy of the bucket's first real inputs, against the reference)
-> ``compiling`` (those that passed, in this process, while the start keeps serving) -> ``racing`` (rounds of
paired turns on real calls, judged by :mod:`.rule`) -> ``decided``; ``new`` -> ``installing`` -> ``decided``
for a decision read from the cache; ``decided`` -> ``racing`` for a re-check. Only the controller
(:mod:`.controller`) moves a bucket, and only along :data:`TRANSITIONS`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from hybrid.runtime.auto.race import Race
from hybrid.runtime.auto.router import Lane
from hybrid.runtime.auto.status import Bucket, CandidateResult, bucket_label

__all__ = ["TRANSITIONS", "BucketRecord", "Phase", "enter"]


class Phase(enum.Enum):
    """Where a bucket is in its lifecycle (module doc)."""

    NEW = "new"
    CHECKING = "checking"
    COMPILING = "compiling"
    RACING = "racing"
    INSTALLING = "installing"
    DECIDED = "decided"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.NEW: frozenset({Phase.CHECKING, Phase.INSTALLING, Phase.RACING, Phase.DECIDED}),
    Phase.INSTALLING: frozenset({Phase.DECIDED, Phase.CHECKING}),
    Phase.CHECKING: frozenset({Phase.COMPILING, Phase.DECIDED}),
    Phase.COMPILING: frozenset({Phase.RACING, Phase.DECIDED}),
    Phase.RACING: frozenset({Phase.DECIDED}),
    Phase.DECIDED: frozenset({Phase.RACING}),
}


@dataclass(slots=True)
class BucketRecord:
    """The controller's own record of one bucket (never read by another thread)."""

    key: Bucket
    sample: dict[str, Any] | None
    phase: Phase = Phase.NEW
    incumbent: str = ""
    lanes: dict[str, Lane] = field(default_factory=dict)  # the candidates compiled for it, the incumbent included
    results: dict[str, CandidateResult] = field(default_factory=dict)
    runners: list[str] = field(default_factory=list)  # re-checked later: tied, untimed, or replaced at the bound
    untimed: dict[str, float | None] = field(default_factory=dict)  # runners the last race left untimed -> the
    # check's estimate of their ratio (untimed again, they leave)
    race: Race | None = None  # while racing (:mod:`.race`)
    race_from: float = 0.0  # the first call, or the start of a re-check: the deadline counts from here
    decided_at: float | None = None
    decided_calls: int | None = None
    recheck_at: float | None = None
    recheck_every: float = 0.0
    first_shapes: str = ""
    accuracy: dict[str, str] = field(default_factory=dict)  # reduced-precision candidate -> its check's cosine
    layouts_tried: bool = False  # the layouts for concurrent callers joined a race (they do once per bucket)
    load_mark: tuple[float, float] | None = None  # (clock, the model's call seconds) the load is measured from
    paused_s: float = 0.0  # seconds of the race without a call: its bound moves by them (Controller._count_pause)
    seen: tuple[int, float] | None = None  # (calls, clock) at the controller's last look at the race


def enter(b: BucketRecord, phase: Phase) -> None:
    """Move ``b`` to ``phase``.

    Raises:
        RuntimeError: When :data:`TRANSITIONS` has no such move from where the bucket is (a controller bug).
    """
    if phase not in TRANSITIONS[b.phase]:
        raise RuntimeError(f"online tuning: bucket {bucket_label(b.key)} cannot go from {b.phase.value} "
                           f"to {phase.value}")
    b.phase = phase
