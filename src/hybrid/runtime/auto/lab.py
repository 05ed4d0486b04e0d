"""The work behind online tuning's decisions, off the callers' path: check, compile, cache (docs/auto.md).

The controller (:mod:`.controller`) asks a :class:`Lab` to check the candidates on a copy of a bucket's real
inputs (in the low-priority check process of :mod:`.worker`, or in the controller's thread where that process
cannot see a backend or an op), to compile and warm the ones that passed, to release those that serve no
bucket, and to read and write the decision cache per bucket. Tests give the controller a lab of their own.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from hybrid.hal import Candidate, accelerated_first, get_backend, is_fallback, is_installed_backend
from hybrid.hal.layout import LAYOUT_MARK, split_layout
from hybrid.hal.machine import usable_cores
from hybrid.ir import Model
from hybrid.runtime.auto import cache, judge, worker
from hybrid.runtime.auto.decision import decision_from_json
from hybrid.runtime.auto.router import Lane
from hybrid.runtime.auto.shapes import bucket_of
from hybrid.runtime.auto.status import Bucket
from hybrid.runtime.auto.tolerance import OutputRule
from hybrid.runtime.auto.trials import (
    OptionsOf,
    Search,
    Trial,
    check_trials,
    layout_of,
    offered_precisions,
    overridden,
    parse_cosine_note,
    trial_of,
)
from hybrid.runtime.traffic import collector

__all__ = ["CheckResult", "Confirmation", "Lab", "RealLab"]

logger = logging.getLogger("hybrid")

WARM_CALLS, WARM_S = 10, 0.2  # a candidate compiled here runs up to this many times (and this long) before its
# first turn: its first calls pay for lazy initialisation (OpenVINO compiles kernels over its first few calls of a
# new shape), and the fastest of the later ones estimates its speed, which paces the first round of turns


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The check of one bucket.

    The candidates that passed in priority order (with the CPU seconds of a warm run where measured), those rejected and
    why, the check's notes, the accuracy it measured for each reduced precision that passed, and the cores the check's
    process could spread a run over (a run's CPU seconds over them bound its wall time from below).
    """

    passed: tuple[tuple[str, float | None], ...]
    rejected: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    accuracy: tuple[tuple[str, str], ...] = ()  # (reduced-precision candidate, its min cosine vs fp32)
    cores: int = 1


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A decision made at compile whose near rivals take turns with it on its bucket's first real calls.

    Made from declared, sample or static shapes (docs/auto.md, "Decided at compile, near ties").

    Attributes:
        sample: The sample the candidates were timed on (its bucket is the one confirmed).
        rivals: Checked candidates, compiled, timed near the start at compile.
        save: Writes the confirmed winner as the compile's decision (the next compile starts on it).
        ratio: The rivals were timed within this of the winner (the timing policy's ``confirm_ratio``).
    """

    sample: Mapping[str, Any]
    rivals: tuple[Trial, ...]
    save: Callable[[Trial], Any]
    ratio: float = 1.5


class Lab(Protocol):
    """What the controller needs done (the production one is :class:`RealLab`)."""

    def check(self, sample: Mapping[str, Any], closing: Callable[[], bool], *,
              paced_for_s: float = math.inf) -> CheckResult:
        """Every candidate run on ``sample`` against the reference (given up early once ``closing()``).

        Paced to the policy's ``check_share`` for ``paced_for_s`` seconds, unpaced after.
        """

    def lane(self, label: str, sample: Mapping[str, Any] | None) -> Lane | None:
        """``label`` compiled in this process and warmed up on ``sample``; None when it cannot compile."""

    def release(self, label: str) -> None:
        """Close a candidate that serves no bucket any more (the start is kept: it is every bucket's fallback)."""

    def layouts(self, label: str) -> tuple[str, ...]:
        """The labels of the layouts ``label``'s backend offers for concurrent callers (none: only its default)."""

    def order(self) -> tuple[str, ...]:
        """The candidates' labels by priority (the fallback's order)."""

    def cached(self, key: Bucket) -> str | None:
        """The label of a decision made on real calls before, for bucket ``key`` (None: none)."""

    def persist(self, key: Bucket, label: str, accuracy: str | None = None) -> None:
        """Record ``label`` as bucket ``key``'s decision in the decision cache (with its measured accuracy)."""

    def accuracy_of(self, key: Bucket) -> str | None:
        """The accuracy recorded with bucket ``key``'s cached decision (reduced precisions), or None."""

    def close(self) -> None:
        """Close every compiled candidate."""


class RealLab:
    """The production lab of one model.

    Args:
        model: The model.
        start: The checked start (it serves every bucket until real calls decide).
        order: The candidates, in priority order.
        options_of: Backend options per candidate and precision.
        precision: 'fp32', or 'auto' with an explicit budget: the reduced precisions join the check.
        budget: The accuracy budget of reduced precisions (None at fp32).
        rtol: The model-level tolerance of the fp32 check.
        rules: Per-output rules of the check.
        key_base: What the decisions depend on besides the shapes (for the decision cache).
        check_share: The share of the wall time the check may run, in CPU time (it is paced to it).
        check_process: Whether to check in the worker process at all.
        confirm: Rivals of a decision made at compile (their bucket starts with them checked).
        replica_bytes: The weights a layout's extra replicas may hold in all (the policy's ``replica_bytes``).
        checks: The check process to ask (shared by the models of a process; None: one of its own).

    Attributes:
        checker: This model's use of the check process: the candidates blamed for ending or hanging it, and the
            artifacts it made (imported by :meth:`lane` instead of a compile).
        imported: Candidates imported from the check process's artifact.
        import_failures: Artifacts that failed to import (the candidate was compiled here instead).
    """

    def __init__(self, model: Model, start: Trial, order: list[Candidate], options_of: OptionsOf, precision: str,
                 budget: dict[str, float] | None, rtol: float, rules: Mapping[str, OutputRule],
                 key_base: Mapping[str, Any], check_share: float, check_process: bool,
                 confirm: Confirmation | None = None, replica_bytes: float = math.inf,
                 checks: worker.CheckProcess | None = None) -> None:
        self.model = model
        self.start = start
        self._order = order
        self._options_of = options_of
        self._precision = precision
        self._budget = budget
        self._rtol = rtol
        self._rules = dict(rules)
        self._share = check_share
        self._replica_bytes = replica_bytes
        self._weight_bytes: int | None = None  # counted when a layout is first asked for
        self.confirm = confirm
        self.trials: dict[str, Trial] = {start.label: start}
        self._compiled = {start.label: start.executable}
        for t in confirm.rivals if confirm else ():
            self.trials[t.label], self._compiled[t.label] = t, t.executable
        self._lock = threading.Lock()  # the fallback compiles in a caller's thread, the controller in its own
        self._index_key, self._index_material = cache.decision_key({**key_base, "online_buckets": True})
        self._index, self._accuracy = self._read_index()
        # the worker process sees the built-in and installed backends and the standard op domains only
        self._portable = check_process and all(
            n.domain in ("", "ai.onnx", "ai.onnx.ml", "com.microsoft") for n in model.graph.all_nodes()) and all(
            is_installed_backend(c.backend) for c in order)
        self.checker = worker.Checker(checks if checks is not None else worker.CheckProcess())
        self._artifacts: dict[str, str] = {}  # label -> the file the check process made of it
        self.imported = self.import_failures = 0
        # a model seen before (the decision cache holds its buckets) starts the check process only when a bucket
        # asks for a check: the prestart's imports run unpaced until a check waits, over a second of CPU beside
        # the first calls, which its cached buckets would pay for nothing (auto's SingleStream p90 under LoadGen)
        if self._portable and not self._index:
            self.checker.prestart(check_share, tuple(dict.fromkeys(c.backend for c in order)))

    # ------------------------------------------------------------------ candidates
    def order(self) -> tuple[str, ...]:
        """Every candidate label in the fallback's priority order: the accelerated ones, then the reference."""
        return tuple(dict.fromkeys(str(c) for c in accelerated_first(self._order)))

    def lane(self, label: str, sample: Mapping[str, Any] | None) -> Lane | None:
        """``label`` compiled in this process (once) and run up to :data:`WARM_CALLS` times on ``sample``."""
        with self._lock:
            exe = self._compiled.get(label)
            fresh = exe is None
            if fresh:
                if self.checker.blamed(self.model, label):  # it ended or hung the check process: never in this one
                    return None
                cand, precision, tag = _parse(label)
                layout = None
                if tag:
                    layout = layout_of(cand, tag, self._options_of(cand, precision), usable_cores())
                    if layout is None:
                        return None
                search = Search(self.model, self._order, self._options_of, precision, self._budget, None,
                                compiled=self._compiled)
                trial = self._imported(search, cand, precision, layout, split_layout(label)[0])
                if trial is None:
                    trial = search.single(cand, precision, layout)
                if trial is None:
                    return None
                self.trials[label], exe = trial, trial.executable
        warm: list[float] = []
        if fresh and sample is not None:
            with contextlib.suppress(Exception):  # a failure shows when it serves, and is handled there
                while len(warm) < WARM_CALLS and sum(warm) < WARM_S:
                    t0 = time.perf_counter()
                    exe.run(sample)
                    warm.append(time.perf_counter() - t0)
        return Lane(label, exe, min(warm[1:] or warm) if warm else None)  # the first call pays lazy initialisation

    def _imported(self, search: Search, cand: Candidate, precision: str, layout: Any, base: str) -> Trial | None:
        """``cand`` imported from the artifact the check process made of ``base`` (None: there is none, or it failed).

        A layout of the candidate imports the same artifact with its own options: a graph's optimizations do not
        depend on threads or streams. A failed import is counted (``import_failures``) and the caller compiles.
        """
        artifact = self._artifacts.get(base)
        if artifact is None:
            return None
        trial = search.single(cand, precision, layout, artifact=artifact)
        if trial is None:
            self.import_failures += 1
            logger.info("auto (online): %s: the artifact of %s did not import (%s); compiling it here", self.model.name,
                        base, search.notes[-1] if search.notes else "no reason given")
            return None
        self.imported += 1
        return trial

    def release(self, label: str) -> None:
        """Close a candidate that serves no bucket (its session holds the weights: tens to hundreds of MB)."""
        if label == self.start.label:
            return
        with self._lock:
            exe = self._compiled.pop(label, None)
            self.trials.pop(label, None)
            shared = exe is not None and any(e is exe for e in self._compiled.values())
        if exe is not None and not shared:
            exe.close()
            collector.thaw()  # where a server froze the candidate's objects, its cycles can be reclaimed again
            logger.info("auto (online): %s: released %s (it serves no bucket)", self.model.name, label)

    def layouts(self, label: str) -> tuple[str, ...]:
        """The labels of the layouts ``label``'s backend offers here, besides its default (none for the reference).

        A layout whose option the candidate's own options set otherwise is left out (the user's choice wins), and so is
        one whose extra replicas would hold more weights than ``replica_bytes``.
        """
        cand, precision, tag = _parse(label)
        if tag or is_fallback(cand.backend) or cand not in self._order:
            return ()
        options = self._options_of(cand, precision)
        out = []
        for layout in get_backend(cand.backend).layouts(cand.device, usable_cores()):
            if overridden(layout, options):
                continue
            if layout.replicas > 1 and (layout.replicas - 1) * self._weights() > self._replica_bytes:
                continue
            out.append(f"{label}{LAYOUT_MARK}{layout.tag}")
        return tuple(out)

    def _weights(self) -> int:
        """The bytes of the model's initializers (what each replica holds a copy of)."""
        if self._weight_bytes is None:
            self._weight_bytes = sum(v.const_value.nbytes for v in self.model.graph.initializers.values()
                                     if v.const_value is not None)
        return self._weight_bytes

    # ------------------------------------------------------------------ the check
    def check(self, sample: Mapping[str, Any], closing: Callable[[], bool], *,
              paced_for_s: float = math.inf) -> CheckResult:
        """Every candidate run on ``sample`` against the reference, as ``compile(shapes=...)`` checks them.

        Paced to ``check_share`` for ``paced_for_s`` seconds from now, unpaced after.
        """
        paced_until = time.perf_counter() + paced_for_s
        verdicts = self.checker.check_elsewhere(self._request(sample), paced_until) if self._portable else None
        if verdicts is not None:
            self._artifacts.update(verdicts.artifacts)
        if verdicts is None or any(partitioned for *_, partitioned in verdicts.results):
            if closing():  # the check process was ended by the stop (online.stop_all): nothing native starts here
                return CheckResult(())
            verdicts = self._check_here(sample, closing, paced_until)
        passed = [(lb, warm) for lb, why, warm, _ in verdicts.results if why is None]
        accelerated = [(lb, w) for lb, w in passed if not is_fallback(lb.partition(":")[0])]
        return CheckResult(tuple(accelerated or passed),
                           tuple((lb, why) for lb, why, _, _ in verdicts.results if why is not None), verdicts.notes,
                           tuple(found for found in map(parse_cosine_note, verdicts.notes) if found is not None),
                           usable_cores())

    def _labels(self) -> list[tuple[Candidate, str]]:
        reduced = self._precision == "auto" and self._budget is not None
        out = [(c, "fp32") for c in self._order]
        if reduced:
            out += [(c, p) for c in self._order if not is_fallback(c.backend) for p in offered_precisions(c)]
        return out

    def _request(self, sample: Mapping[str, Any]) -> worker.CheckRequest:
        options = {(str(c) if p == "fp32" else f"{c} {p}"): self._options_of(c, p) for c, p in self._labels()}
        reduced = self._precision == "auto" and self._budget is not None
        return worker.CheckRequest(
            self.model.to_bytes(), self.model.name, tuple(str(c) for c in self._order), options, self._rtol,
            {k: r.model_dump() for k, r in self._rules.items()}, dict(sample),
            "auto" if reduced else "fp32", self._budget if reduced else None, self._share)

    def _check_here(self, sample: Mapping[str, Any], closing: Callable[[], bool],
                    paced_until: float = math.inf) -> worker.Verdicts:
        """The check in the controller's thread (custom ops or backends the worker cannot see).

        It pauses after each candidate so that it runs at most ``check_share`` of the wall time (until
        ``paced_until``, ``time.perf_counter``'s).
        """
        reduced = self._precision == "auto" and self._budget is not None
        order = [c for c in self._order if not self.checker.blamed(self.model, str(c))]  # never one that ended it
        search = Search(self.model, order, self._options_of, "auto" if reduced else "fp32",
                        self._budget if reduced else None, sample, rtol=self._rtol, rules=self._rules,
                        compiled=self._compiled)

        def pace(busy_s: float) -> None:
            if self._share < 1.0 and time.perf_counter() < paced_until:
                time.sleep(min(2.0, busy_s * (1.0 / self._share - 1.0)))  # the controller's thread, not a caller

        tried, _ = check_trials(search, autotune=True, stop=closing, after_each=pace)
        judge.outvote(tried, search, self.model.name)
        for t in tried:
            self.trials.setdefault(t.label, t)
        return worker.Verdicts(tuple((t.label, t.rejected, None, t.partitioned) for t in tried), tuple(search.notes))

    # ------------------------------------------------------------------ the decision cache
    def cached(self, key: Bucket) -> str | None:
        """The label of a decision made on real calls before, for this bucket (None: none)."""
        decision = self._index.get(key)
        if decision is None:
            return None
        label = decision.label
        with self._lock:
            if label not in self._compiled:
                trial = trial_of(self.model, decision, self._order, self._options_of)
                if trial is None:
                    return None
                self._compiled[label], self.trials[label] = trial.executable, trial
        return label

    def persist(self, key: Bucket, label: str, accuracy: str | None = None) -> None:
        """Write the bucket's decision (and a confirmed compile-time decision) to the decision cache.

        ``accuracy`` (a reduced precision's measured cosine, in words) is kept with it, so a process that
        installs the decision from the cache still reports it.
        """
        trial = self.trials.get(label)
        if trial is None:
            return
        if self.confirm is not None and key == confirm_key(self.model, self.confirm):
            self.confirm.save(trial)
        known, measured = self._read_index()
        known[key] = trial.decision
        if accuracy:
            measured[key] = accuracy
        else:
            measured.pop(key, None)
        self._index, self._accuracy = known, measured
        buckets = [[[[n, list(s)] for n, s in k], d.to_json(), *([measured[k]] if k in measured else [])]
                   for k, d in known.items()]
        cache.save_decision(self._index_key, self._index_material, {"kind": "buckets", "buckets": buckets},
                            [f"online decisions of {self.model.name!r} per shape bucket"])

    def accuracy_of(self, key: Bucket) -> str | None:
        """The accuracy recorded with bucket ``key``'s cached decision (reduced precisions), or None."""
        return self._accuracy.get(key)

    def _read_index(self) -> tuple[dict[Bucket, Any], dict[Bucket, str]]:
        """The cached decisions per bucket, and the accuracy recorded with those of reduced precision."""
        record = cache.load_decision(self._index_key, self._index_material)
        out: dict[Bucket, Any] = {}
        measured: dict[Bucket, str] = {}
        for entry in (record or {}).get("decision", {}).get("buckets", []):
            try:
                bucket, decision, *rest = entry
                key = tuple((str(n), tuple(int(d) for d in s)) for n, s in bucket)
                out[key] = decision_from_json(decision)
            except (KeyError, TypeError, ValueError):
                continue
            if rest and isinstance(rest[0], str):
                measured[key] = rest[0]
        return out, measured

    def close(self) -> None:
        """Close every candidate compiled here (each once, however many labels share it)."""
        with self._lock:
            compiled, self._compiled = self._compiled, {}
        for exe in {id(e): e for e in compiled.values()}.values():
            with contextlib.suppress(Exception):
                exe.close()
        self.checker.close()


def _parse(label: str) -> tuple[Candidate, str, str]:
    """(candidate, precision, layout tag) of a candidate's label ('openvino:cpu bf16@throughput')."""
    base, tag = split_layout(label)
    name, _, precision = base.partition(" ")
    backend, _, device = name.partition(":")
    return Candidate(backend, device), precision or "fp32", tag


def confirm_key(model: Model, confirm: Confirmation) -> Bucket:
    """The bucket a :class:`Confirmation` is about."""
    return bucket_of(model.signature, confirm.sample)
