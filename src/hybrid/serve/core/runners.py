"""How many batches a served model runs at once: as many as the layout serving it has replicas (issue 50).

``target='auto'`` may serve a model with a layout of several replicas (``onnxruntime:cpu@2x1``: two sessions of one
thread, :class:`~hybrid.hal.layout.ReplicaPool`). One batch runner would use one of them; so a model's batcher runs
as many batches at once as the most replicas a layout serving one of its shape buckets called lately has (1 for a
plain executable), read again when the decision changes. The runners serve every bucket: a model whose 8-row
batches run on two sessions and whose 1-row requests on the default would otherwise switch between one runner and
two as its busiest bucket changes, and each bucket's race would time its candidates at whatever the other bucket
set (a served crnn under 16 clients switched every poll, and its 8-row bucket's layouts raced at a mix of 1 and 2
batches at once). ``--concurrency`` or a ``config.pbtxt``'s ``instance_group`` count sets the
number instead: the user's choice wins, and nothing here moves it.

Layouts race only where the compiled model sees its calls overlap (``TuningPolicy.concurrent_calls``), and with one
runner a server's calls never do, however many requests wait. So while the model still tunes online and requests
queue behind busy runners (a backlog), the batcher runs up to the usable cores' worth of batches at once (whatever
the backlog does meanwhile: the extra runners absorb it): the controller then sees the load the server has and lets
the layouts race. This lasts a probe (:attr:`RunnerPolicy.probe_s`), long enough for the controller's load windows,
once per serving candidate and again at every race under a backlog (a re-check: its layouts must race at the load
the server has, not at the one runner a default layout settles to); it goes on while a bucket called lately is
being decided and for a probe after; then the runners settle to the replicas of what was decided.

:class:`Runners` is read after each batch on the event loop (no lock); the compiled model's state is read at most
once per :attr:`RunnerPolicy.poll_s`, from its lock-free views (``cm.tuning`` and the serving view).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybrid.errors import HybridError
from hybrid.hal.layout import ReplicaPool, split_layout
from hybrid.hal.machine import usable_cores
from hybrid.hal.registry import get_backend
from hybrid.runtime.auto import TuningPolicy
from hybrid.runtime.compiled import LiveView

__all__ = ["Lately", "RunnerPolicy", "Runners", "Serving", "serving_now"]

logger = logging.getLogger("hybrid.serve")


@dataclass(frozen=True, slots=True)
class RunnerPolicy:
    """When a served model's runner count follows what serves it, and when it runs more to show its load.

    Attributes:
        poll_s: What serves the model is read again at most this often (after a batch). A decision takes seconds
            (``TuningPolicy.decide_within_s`` bounds it), so a fraction of a second adds nothing a client sees, and
            a batch costs no read of the tuner's state.
        backlog_share: Requests queue behind busy runners when at least this share of the batches of a poll ended
            with requests waiting for a runner. A lone caller in a loop never leaves one waiting (its next request
            follows its answer), two or more closed-loop callers on fewer runners leave one at every batch's end:
            half-way between, as ``TuningPolicy.concurrent_calls`` is for the calls in flight.
        probe_s: How long the extra runners stay once a backlog shows, once per serving candidate, and after the
            decision of a bucket called lately where it was being decided meanwhile. The controller reads the load of a
            decided bucket over windows of ``TuningPolicy.idle_poll_s``, restarted after four: a probe of six
            windows covers one whole window whatever its phase, with one to spare for the controller's own wake-up.
        lately_s: A shape bucket counts as called lately for this long after its last call seen (:class:`Lately`):
            one of the controller's load windows, over which it reads the calls in flight.
    """

    poll_s: float = 0.5
    backlog_share: float = 0.5
    probe_s: float = field(default_factory=lambda: 6 * TuningPolicy().idle_poll_s)
    lately_s: float = field(default_factory=lambda: TuningPolicy().idle_poll_s)


@dataclass(frozen=True, slots=True)
class Serving:
    """What serves a model now, as far as its runners care.

    Attributes:
        label: The candidate with the most replicas among those serving the shape buckets called lately, the busiest
            of them on a tie ('' for a model that does not tune online).
        layout: That candidate's layout tag ('2x1'), '' for its backend's default.
        replicas: Calls it runs at once without waiting for each other (1 for a plain executable).
        deciding: Whether a bucket called lately is being decided now (checked, compiled or raced).
        tuning: Whether the tuner may still change what serves a bucket called lately: it is being decided, or a
            re-check is planned.
    """

    label: str = ""
    layout: str = ""
    replicas: int = 1
    deciding: bool = False
    tuning: bool = False


class Lately:
    """Which shape buckets of a model were called within the last ``window_s``, read from their call counts.

    A bucket whose count moved since the last read was called now. The window spans several polls: a server's
    buckets of 2 or 4 rows see a call only now and then at 4 clients, and a window of one 0.5 s poll switched the
    runners between 1 and 2 as they came and went.

    Args:
        window_s: How long a bucket counts as called after its last call seen.
        clock: What the reads are timed on.
    """

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[Any, tuple[int, float]] = {}  # bucket -> (calls at the last read, when they last moved)

    def read(self, records: tuple[Any, ...]) -> dict[Any, int]:
        """The buckets of ``records`` called within the window, each with its calls since the last read."""
        now = self._clock()
        out: dict[Any, int] = {}
        for r in records:
            calls, moved = self._seen.get(r.key, (0, -math.inf))
            if r.calls != calls:
                moved = now
            self._seen[r.key] = (r.calls, moved)
            if now - moved <= self.window_s:
                out[r.key] = r.calls - calls
        return out


def serving_now(compiled: Any, lately: Lately | None = None) -> Serving:
    """What serves ``compiled`` now, as far as its runners care (:class:`Serving`).

    Read from the compiled model's lock-free views: ``cm.tuning`` (the per-bucket records) and, for the replicas,
    the serving view of the live executable, or the layout the candidate's backend declares (the HAL contract).

    Args:
        compiled: The compiled model.
        lately: The buckets called lately (a server's load moves between batch sizes as its clients come and go, and
            the bucket of lone requests, with the most calls in all, may see none now); the one with the most calls
            since the last read breaks a tie. None, or no bucket called within its window: every bucket, the most
            calls in all breaking a tie.
    """
    exe = getattr(compiled, "executable", None)
    if not isinstance(exe, LiveView):
        return Serving(replicas=len(exe.replicas) if isinstance(exe, ReplicaPool) else 1)
    view = exe.view()
    records = tuple(getattr(compiled, "tuning", ()) or ())
    if not records:  # no call yet: the start serves, nothing is decided
        return Serving(replicas=view.replicas, deciding=True, tuning=True)
    recent = lately.read(records) if lately is not None else {}
    called = [r for r in records if r.key in recent] or list(records)
    most = max(records, key=lambda r: r.calls)  # the view is this bucket's candidate: its pool's size
    replicas = {r.key: view.replicas if r is most else _replicas_of(r.serving) for r in called}
    chosen = max(called, key=lambda r: (replicas[r.key], recent.get(r.key, 0), r.calls))
    deciding = any(r.state != "decided" for r in called)
    tuning = deciding or any(r.recheck_at_s is not None for r in called)
    return Serving(chosen.serving, split_layout(chosen.serving)[1], replicas[chosen.key], deciding, tuning)


def _replicas_of(label: str) -> int:
    """The replicas of the layout in candidate label ``label`` ('onnxruntime:cpu@2x1'), as its backend declares it."""
    base, tag = split_layout(label)
    if not tag:
        return 1
    backend, _, device = base.partition(" ")[0].partition(":")
    try:
        declared = get_backend(backend).layouts(device, usable_cores())
    except HybridError:  # a backend no longer registered: one runner, as for an executable of its own
        return 1
    return next((lay.replicas for lay in declared if lay.tag == tag), 1)


class Runners:
    """The runner count of one served model's batcher; :meth:`after_batch` on its event loop only.

    Args:
        compiled: The compiled model (read through ``read``).
        name: The model as logs name it ('m:1').
        fixed: Runners the user set (``--concurrency``, ``instance_group``); None: they follow what serves.
        cores: The most runners a probe runs (the usable cores: more batches than cores only wait for a core).
        policy: See :class:`RunnerPolicy`.
        clock: What the polls and the probe are timed on (``time.monotonic``; tests script it).
        read: What serves the model (:func:`serving_now`; tests pass their own).
    """

    def __init__(self, compiled: Any, name: str, fixed: int | None, cores: int,
                 policy: RunnerPolicy | None = None, clock: Callable[[], float] = time.monotonic,
                 read: Callable[[Any], Serving] = serving_now) -> None:
        self._compiled = compiled
        self.name = name
        self.fixed = fixed
        self.cores = max(1, cores)
        self.policy = policy or RunnerPolicy()
        self._clock = clock
        self._lately = Lately(self.policy.lately_s, clock)  # the buckets called lately (serving_now's ``lately``)
        self._read = read if read is not serving_now else (lambda cm: serving_now(cm, self._lately))
        self.serving = Serving() if fixed is not None else self._safe_read(Serving())
        self.count = fixed if fixed is not None else self.serving.replicas
        self.probing = False  # runners beyond the replicas now, so that the tuner sees the load
        self._polled = clock()
        self._batches = self._waited = 0
        self._probe_until: float | None = None  # a probe runs (its window, then while its bucket is decided)
        self._probed: set[str] = set()  # serving candidates whose probe has run
        self._won_under: dict[str, int] = {}  # layouts decided during a probe -> the runners they were measured at

    def after_batch(self, waited: bool) -> int:
        """The runners to keep, told after each batch whether requests were waiting for a runner when it ended."""
        if self.fixed is not None:
            return self.fixed
        self._batches += 1
        self._waited += waited
        now = self._clock()
        if now - self._polled < self.policy.poll_s:
            return self.count
        backlog = self._waited >= self.policy.backlog_share * self._batches
        self._polled, self._batches, self._waited = now, 0, 0
        self._decide(self._safe_read(self.serving), backlog, now)
        return self.count

    def _decide(self, serving: Serving, backlog: bool, now: float) -> None:
        # a candidate of several replicas already runs that many batches at once: the tuner sees them overlap. A probe
        # runs once per serving candidate while a re-check is planned, and at every race (a re-check's included)
        if (backlog and serving.tuning and serving.replicas == 1 and self._probe_until is None
                and (serving.deciding or serving.label not in self._probed)):
            self._probed.add(serving.label)
            self._probe_until = now + self.policy.probe_s
        if self._probe_until is not None and serving.deciding:
            # the controller reads a decided bucket's load over windows after its decision: a whole probe after it
            self._probe_until = max(self._probe_until, now + self.policy.probe_s)
        if self._probe_until is not None and now >= self._probe_until:
            self._probe_until = None
        # once begun, a probe runs its course: its extra runners absorb the backlog that started it (16 closed-loop
        # clients on 2 runners of 8 leave none waiting), and with fewer callers they only wait idle
        probing = self._probe_until is not None
        if probing and not serving.deciding and serving.layout and serving.replicas == 1:
            # a layout of one executable decided while the probe ran (OpenVINO's throughput hint: it takes several
            # calls at once on streams of its own) was measured at the probe's runners: it keeps them, as a winner
            # keeps what it won under. A pool's replicas say its runners; the backend's default goes back to one
            # runner, as the server ran it before the probe
            self._won_under[serving.label] = self.cores
        count = (max(self.cores, serving.replicas) if probing
                 else max(serving.replicas, self._won_under.get(serving.label, 1)))
        # during a race the candidates take turns serving: a line when the runners change or a decision stands
        stood = (self.serving.label, self.serving.replicas)
        moved = not serving.deciding and (serving.label, serving.replicas) != stood
        if count != self.count or moved:
            why = "more while the tuner sees the load" if probing else "one per replica"
            logger.info("model %s: served by %s (layout %s, %d replica%s): %d runner%s (%s)", self.name,
                        serving.label or "its executable", serving.layout or "default", serving.replicas,
                        "" if serving.replicas == 1 else "s", count, "" if count == 1 else "s", why)
        self.serving, self.count, self.probing = serving, count, probing

    def _safe_read(self, last: Serving) -> Serving:
        try:
            return self._read(self._compiled)
        except Exception as e:  # what serves stays readable after a failed read: keep the last one
            logger.debug("model %s: what serves it could not be read (%s); the runners stay", self.name, e)
            return last

    def report(self) -> dict[str, Any]:
        """What the statistics and metrics say of the runners: the layout serving, its replicas, the runners now."""
        return {"layout": self.serving.layout or "default", "serving": self.serving.label,
                "replicas": self.serving.replicas, "runners": self.count,
                "runners_by": "settings" if self.fixed is not None else "probe" if self.probing else "layout"}
