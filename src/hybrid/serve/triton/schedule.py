"""Triton's schedule policy for a model served from a ``config.pbtxt``: priority levels and queue policies.

Triton's dynamic batcher keeps one queue per priority level (``priority_levels``; 1 is the highest) and a
queue policy per level (``priority_queue_policy``, else ``default_queue_policy``): how many requests may wait
(``max_queue_size``), how long (``default_timeout_microseconds``, which a request's own ``timeout`` may lower
where ``allow_timeout_override`` is set) and what happens past it (``timeout_action``: ``REJECT`` the request,
or ``DELAY`` it behind the requests of its level that are still in time). A request picks its level with the
``priority`` parameter (the schedule-policy extension): 0, or a level above ``priority_levels``, means
``default_priority_level``, as Triton reads it. A model without priority levels has a single level.

These are plain values; the queue that applies them is :class:`hybrid.serve.core.batcher.LoopBatcher` and the
configuration they come from is read by :func:`hybrid.serve.triton.config.schedule_policy`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["QueuePolicy", "SchedulePolicy"]


@dataclass(frozen=True)
class QueuePolicy:
    """The queue policy of one priority level: how long a request may wait in the queue, and what then.

    A model with a configuration treats a request's own ``timeout`` as Triton does: it applies only where the
    policy allows an override (``allow_timeout_override``), and then only to lower the policy's timeout; with
    no timeout in the policy it is ignored. Models served without a configuration honour it as pyasc always
    has (:meth:`hybrid.serve.core.model.ServedModel.run`).

    Attributes:
        timeout_s: Longest wait in the queue; None: no bound.
        allow_override: Whether a request's own, shorter, timeout applies.
        delay: Past the timeout the request waits on behind the requests of its level still in time
            (``timeout_action: DELAY``) instead of being rejected (HYB-714, ``REJECT``).
        max_queue: Most requests waiting at this level (``max_queue_size``) when the model has priority levels;
            None: no bound of the level's own (a model without levels is bounded by its ``max_queue`` setting).
    """

    timeout_s: float | None = None
    allow_override: bool = False
    delay: bool = False
    max_queue: int | None = None

    def queue_timeout(self, requested_s: float | None) -> float | None:
        """The longest wait in the queue for a request that asked for ``requested_s`` seconds (None: nothing)."""
        if self.timeout_s is None:
            return None
        if self.allow_override and requested_s is not None:
            return min(self.timeout_s, requested_s)
        return self.timeout_s


@dataclass(frozen=True)
class SchedulePolicy:
    """A model's priority levels and the queue policy of each.

    Attributes:
        default: The queue policy of a level without one of its own (``default_queue_policy``).
        levels: ``priority_levels``; 0: one level, and a request's priority is ignored.
        default_level: The level of a request that names none (``default_priority_level``, 1..levels).
        per_level: Level -> its own queue policy (``priority_queue_policy``).
    """

    default: QueuePolicy = QueuePolicy()
    levels: int = 0
    default_level: int = 0
    per_level: Mapping[int, QueuePolicy] = field(default_factory=dict)

    @property
    def reorders(self) -> bool:
        """Whether requests may change places in the queue: priority levels, or a level that delays late ones."""
        return bool(self.levels) or self.default.delay or any(p.delay for p in self.per_level.values())

    def level_of(self, priority: int) -> int:
        """The level a request with ``priority`` waits at: 0 without levels; 0 or out of range: the default."""
        if not self.levels:
            return 0
        if priority < 1 or priority > self.levels:
            return self.default_level
        return priority

    def policy(self, level: int) -> QueuePolicy:
        """The queue policy of ``level``."""
        return self.per_level.get(level, self.default)
