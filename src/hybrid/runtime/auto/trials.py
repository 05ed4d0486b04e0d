"""The candidates of one auto-selection: compiled as trials, checked, and kept with their answers.

Trials, in priority order: every accelerated candidate that compiles the whole graph (fp32); a
partitioned plan when none does; the reference backend; with ``precision='auto'`` the reduced
precisions each accelerated backend offers (:meth:`hybrid.hal.Backend.precisions`). Each trial runs
the sample inputs and is checked by the :class:`~.verify.Verifier`: fp32 against the reference
backend at model-level tolerance, reduced precisions against fp32 within the accuracy budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hybrid.errors import HybridError
from hybrid.hal import Candidate, fallback_backend, get_backend, is_fallback, split_fallback
from hybrid.hal.backend import Executable
from hybrid.hal.layout import Layout, ReplicaPool
from hybrid.hal.machine import usable_cores
from hybrid.ir import Model
from hybrid.runtime.auto import accuracy
from hybrid.runtime.auto import tolerance as checks
from hybrid.runtime.auto.decision import Decision, PartitionDecision, SingleDecision
from hybrid.runtime.auto.samples import make_samples
from hybrid.runtime.auto.shapes import ShapeRange
from hybrid.runtime.auto.verify import Verifier
from hybrid.runtime.executor import compile_partitioned
from hybrid.runtime.partition import supporters, typed_model
from hybrid.runtime.plan import Plan

__all__ = ["OptionsOf", "Search", "Trial", "build_partition", "check_trials", "cosine_note", "layout_of",
           "offered_precisions", "overridden",
           "parse_cosine_note", "trial_of", "trials"]

OptionsOf = Callable[[Candidate, str], dict[str, Any]]

_COSINE = ": min cosine vs fp32 "


def cosine_note(label: str, cosine: float) -> str:
    """The check's note of a reduced precision's accuracy: ``'openvino:cpu bf16: min cosine vs fp32 0.999987'``."""
    return f"{label}{_COSINE}{cosine:.6f}"


def parse_cosine_note(note: str) -> tuple[str, str] | None:
    """(label, cosine as written) of a :func:`cosine_note`; None for any other note."""
    label, sep, cosine = note.partition(_COSINE)
    return (label, cosine) if sep else None


@dataclass(slots=True)
class Trial:
    """One candidate under test: its compiled executable, and what the check found."""

    label: str
    backend: str
    device: str
    precision: str
    options: dict[str, Any]
    executable: Executable
    decision: Decision
    plan: Plan | None = None
    outputs: list[Any] | None = None
    rejected: str | None = None
    disputed: bool = False
    answers: tuple[list[Any], ...] = ()
    layout: Layout | None = None  # how it runs, besides the backend's default (``options`` are the candidate's own)

    @property
    def partitioned(self) -> bool:
        """Whether the trial splits the graph across candidates."""
        return isinstance(self.decision, PartitionDecision)

    @property
    def independent(self) -> bool:
        """An accelerated whole-graph answer: one opinion of its own in a vote against the reference."""
        return not self.partitioned and not is_fallback(self.backend)


def offered_precisions(cand: Candidate) -> tuple[str, ...]:
    """The reduced precisions a candidate's backend offers on its device (none when it is unknown)."""
    try:
        return get_backend(cand.backend).precisions(cand.device)
    except HybridError:
        return ()


class Search:
    """State of one search: the model, the candidates, the verifier, the notes for the plan."""

    def __init__(self, model: Model, order: list[Candidate], options_of: OptionsOf, precision: str,
                 budget: dict[str, float] | None, sample_inputs: Any, *,
                 ranges: Mapping[str, ShapeRange] | None = None, rtol: float = 0.0,
                 rules: Mapping[str, checks.OutputRule] | None = None,
                 compiled: dict[str, Executable] | None = None) -> None:
        self.model = model
        self.order = order
        self.options_of = options_of
        self.precision = precision
        self.notes: list[str] = []
        self.compiled = compiled  # label -> executable: compile each candidate once across searches
        reference = compiled.get(str(Candidate(fallback_backend(), "cpu"))) if compiled is not None else None
        self.verifier = Verifier(model, sample_inputs, budget, self.notes, ranges=ranges, rtol=rtol, rules=rules,
                                 reference=reference)
        self.fp32_outputs: dict[Candidate, list[Any]] = {}

    def single(self, cand: Candidate, precision: str, layout: Layout | None = None,
               artifact: str | None = None) -> Trial | None:
        """``cand`` compiled for the whole graph at ``precision``; None (with a note) when it cannot be.

        With a ``layout``, its options are merged over the candidate's and its replicas are compiled into one
        :class:`~hybrid.hal.layout.ReplicaPool`. With an ``artifact`` (what the check process made of the candidate,
        :meth:`~hybrid.hal.backend.Backend.prepare_artifact`), each is imported from it instead of compiled.
        """
        decision = SingleDecision(cand.backend, cand.device, precision, layout.tag if layout else "")
        label = decision.label
        try:
            options = self.options_of(cand, precision)  # the candidate's: what a bundle of it keeps (no layout)
            exe = self.compiled.get(label) if self.compiled is not None else None
            if exe is None:
                ref = self.verifier.reference_executable() if is_fallback(cand.backend) and not options else None
                exe = ref or _compile_replicas(self.model, cand, {**options, **(layout.options if layout else {})},
                                               layout.replicas if layout else 1, artifact)
            if self.compiled is not None:
                self.compiled[label] = exe
        except HybridError as e:
            if e.code == "HYB-306":
                raise
            self.notes.append(f"{label} could not compile the model: {e.message}")
            return None
        return Trial(label, cand.backend, cand.device, precision, options, exe, decision, layout=layout)

    def partitioned(self) -> Trial | None:
        """The graph partitioned across the candidates (each node on the first that supports it)."""
        try:
            typed = typed_model(self.model, self.verifier.samples)
            able = supporters(list(typed.graph), self.order)
            return build_partition(self.model, typed, able, self.order, lambda c: self.options_of(c, "fp32"),
                                   self.notes)
        except HybridError as e:
            self.notes.append(f"partitioning failed: {e.message}")
            return None

    def check(self, trial: Trial) -> str | None:
        """Why ``trial`` must not win (None: it may); records its outputs and first-run time."""
        truth = self.fp32_outputs.get(Candidate(trial.backend, trial.device))
        verdict = self.verifier.check(trial.executable, trial.precision, truth)
        trial.outputs = verdict.outputs
        trial.disputed = verdict.disputed and trial.independent
        trial.answers = verdict.answers
        if verdict.why is None and trial.precision != "fp32" and trial.outputs is not None:
            cases = self.verifier.cases
            base = cases[0].expected if cases else truth
            if base is not None:
                cos = accuracy.cosine(base, trial.outputs, self.verifier.names)
                self.notes.append(cosine_note(trial.label, cos))
        return verdict.why


def _compile_replicas(model: Model, cand: Candidate, options: Mapping[str, Any], replicas: int,
                      artifact: str | None = None) -> Executable:
    """One executable, or ``replicas`` of them in a pool (each closed again when a later one fails).

    ``artifact``: each is imported from it (:meth:`~hybrid.hal.backend.Backend.compile`).
    """
    backend = get_backend(cand.backend)
    if replicas == 1:
        return backend.compile(model, cand.device, options, artifact=artifact)
    done: list[Executable] = []
    try:
        for _ in range(replicas):
            done.append(backend.compile(model, cand.device, options, artifact=artifact))
    except BaseException:
        for exe in done:
            exe.close()
        raise
    return ReplicaPool(done)


def overridden(layout: Layout, options: Mapping[str, Any]) -> bool:
    """Whether the candidate's own options set one of ``layout``'s options to another value.

    The user's explicit choice (``compile(config=...)``, ``hybrid.init``'s ``backends``, a server's shared options)
    wins over a layout; the same value (a server's ``allow_spinning: False``) does not conflict.
    """
    return any(k in options and options[k] != v for k, v in layout.options.items())


def layout_of(cand: Candidate, tag: str, options: Mapping[str, Any], cores: int) -> Layout | None:
    """The layout ``tag`` of ``cand``'s backend, unless the candidate's own options set one of its options otherwise."""
    for layout in get_backend(cand.backend).layouts(cand.device, cores):
        if layout.tag == tag:
            return None if overridden(layout, options) else layout
    return None


def build_partition(model: Model, typed: Any, able: list[tuple[Candidate, ...]], order: list[Candidate],
                    options_of: Callable[[Candidate], dict[str, Any]], notes: list[str]) -> Trial:
    """Partition and compile (see :func:`hybrid.runtime.executor.compile_partitioned`) as a trial."""
    exe, plan, partition = compile_partitioned(model, typed, able, order, options_of, notes)
    labels = list(dict.fromkeys(p.label for p in partition.parts))
    backends = "+".join(dict.fromkeys(c.backend for c in labels))
    devices = "+".join(dict.fromkeys(c.device for c in labels))
    decision = PartitionDecision(tuple(str(a) for a in partition.assignment))
    return Trial("partition(" + " + ".join(map(str, labels)) + ")", backends, devices, "fp32", {}, exe, decision,
                 plan)


def trials(search: Search, autotune: bool) -> Iterator[Trial]:
    """The trials of ``search`` in the order they are checked (see the module doc)."""
    order = search.order
    accelerated, fallback = split_fallback(order)
    precision = search.precision
    reduced = {c: offered_precisions(c) for c in accelerated} if precision == "auto" else {}
    if precision in ("fp16", "bf16"):  # an explicit reduced precision: only who offers it
        for c in accelerated:
            if precision in offered_precisions(c) and (t := search.single(c, precision)):
                yield t
        return
    if precision == "auto" and not autotune:  # nothing is timed: a reduced precision within budget first
        for c in accelerated:
            for p in reduced[c]:
                if t := search.single(c, p):
                    yield t
    compiled_any = False
    for c in accelerated:
        if t := search.single(c, "fp32"):
            compiled_any = True
            yield t
    if not compiled_any and len(order) > 1 and (t := search.partitioned()):
        yield t
    for c in fallback:
        if t := search.single(c, "fp32"):
            yield t
    if precision == "auto" and autotune:
        for c in accelerated:
            if c in search.fp32_outputs or search.verifier.samples is None:
                for p in reduced[c]:
                    if t := search.single(c, p):
                        yield t


def trial_of(model: Model, decision: Decision, order: list[Candidate], options_of: OptionsOf,
             sample_inputs: Any = None) -> Trial | None:
    """Compile a decision again (from the cache); None when it no longer applies here."""
    if isinstance(decision, SingleDecision):
        if decision.candidate not in order:
            return None
        layout = None
        if decision.layout:
            layout = layout_of(decision.candidate, decision.layout, options_of(decision.candidate, decision.precision),
                               usable_cores())
            if layout is None:  # the layout is no longer offered here (other cores, or the user set its option)
                return None
        return Search(model, order, options_of, "fp32", None, sample_inputs).single(decision.candidate,
                                                                                    decision.precision, layout)
    typed = typed_model(model, make_samples(model, sample_inputs))
    if len(decision.assignment) != len(typed.graph):
        return None
    able = [(c,) for c in decision.candidates]
    if any(a[0] not in order for a in able):
        return None
    return build_partition(model, typed, able, order, lambda c: options_of(c, "fp32"), [])


def check_trials(search: Search, autotune: bool, *, first_accelerated: bool = False,
                 stop: Callable[[], bool] | None = None, after_each: Callable[[float], None] | None = None,
                 log: Callable[[str], None] | None = None) -> tuple[list[Trial], Trial | None]:
    """Check the trials of ``search`` in order.

    The one loop of the offline search, the check process and the in-thread check. Returns them with ``rejected`` set,
    and the first accelerated trial that passed when ``first_accelerated`` (the loop stops there: nothing is timed).

    Args:
        search: The search.
        autotune: Whether the trials will be timed (the reduced precisions come after fp32 then).
        first_accelerated: Stop at the first accelerated trial that passes a meaningful check.
        stop: Polled before each trial: True ends the loop (a closing tuner).
        after_each: Called with the seconds each trial took (a background check paces itself with it).
        log: Receives each rejection (the caller's logger).
    """
    tried: list[Trial] = []
    for trial in trials(search, autotune):
        if stop is not None and stop():
            break
        t0 = time.perf_counter()
        tried.append(trial)
        why = trial.rejected = search.check(trial)
        if after_each is not None:
            after_each(time.perf_counter() - t0)
        if why is not None:
            search.notes.append(f"rejected {trial.label}: {why}")
            if log is not None:
                log(f"rejected {trial.label}: {why}")
            continue
        if trial.precision == "fp32" and trial.outputs is not None and not trial.partitioned:
            search.fp32_outputs[Candidate(trial.backend, trial.device)] = trial.outputs
        if first_accelerated and search.verifier.ok and not is_fallback(trial.backend):
            return tried, trial
    return tried, None
