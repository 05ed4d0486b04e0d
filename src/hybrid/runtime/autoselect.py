"""Choosing by measurement: the search behind ``compile(target='auto')`` (DESIGN 2.3).

Trials, in priority order: every accelerated candidate that compiles the whole graph (fp32); a
partitioned plan when none does; the reference backend; with ``precision='auto'`` the reduced
precisions each accelerated backend offers. Each trial runs the sample input and is checked: fp32
against the reference backend with per-dtype tolerances, reduced precisions against fp32 with the
accuracy budget. A trial that fails the check is rejected and the log says which output differed and
by how much; only when no accelerated backend agrees with the reference but two independent ones agree
with each other is the reference outvoted (see :func:`_outvote`). When no sample can be checked at
all, the reference backend runs the model. The survivors are timed (``autotune``) and the fastest
wins, except that candidates within timing noise of the fastest tie and the one closest to the
reference wins the tie; without timing the first accelerated survivor in priority order wins. The
decision is cached on disk, so the next compile is instant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from hybrid._version import __version__
from hybrid.config import get_config
from hybrid.errors import BackendError, HybridError
from hybrid.hal import Candidate, backend_status, get_backend
from hybrid.hal.backend import Executable
from hybrid.ir import Model
from hybrid.runtime import autotune as at
from hybrid.runtime import checks
from hybrid.runtime.compiled import CompiledModel
from hybrid.runtime.executor import compile_partitioned
from hybrid.runtime.partition import FALLBACK_BACKEND, node_label, supporters, typed_model
from hybrid.runtime.plan import Plan, Segment
from hybrid.runtime.verify import Verifier

__all__ = ["offered_precisions", "select"]

logger = logging.getLogger("hybrid")

OptionsOf = Callable[[Candidate, str], dict[str, Any]]

# Timings this close to the fastest are a tie, broken by closeness to the reference (defaults of
# hybrid.init({'autotune': {'tie_rel': ..., 'tie_us': ...}})). 2 % stays well inside the 5 % slack auto
# is allowed against the best single runtime; 20 us is about the spread of medians between timings of
# the same 15-40 us graph a few seconds apart on a shared 2-core machine (see docs/auto.md).
TIE_REL = 0.02
TIE_US = 20.0


def tie_bounds() -> tuple[float, float]:
    """(relative, absolute seconds) within which a timing ties with the fastest, from the config."""
    tune = get_config().autotune
    return tune.get("tie_rel", TIE_REL), tune.get("tie_us", TIE_US) * 1e-6


@dataclass(slots=True)
class _Trial:
    label: str
    backend: str
    device: str
    precision: str
    options: dict[str, Any]
    executable: Executable
    plan: Plan | None = None
    decision: dict[str, Any] = field(default_factory=dict)
    outputs: list[Any] | None = None
    first_run_s: float | None = None
    rejected: str | None = None
    disputed: bool = False
    answers: tuple[list[Any], ...] = ()


def offered_precisions(cand: Candidate) -> list[str]:
    """The reduced precisions a candidate offers on its device (written against each library's API;
    only OpenVINO on the CPU is verified on this project's machines)."""
    try:
        backend = get_backend(cand.backend)
    except HybridError:
        return []
    kind, _, idx = cand.device.partition(":")
    if cand.backend == "openvino":
        native = {"cpu": "CPU", "gpu": f"GPU.{idx or 0}", "npu": "NPU"}.get(kind)
        core = getattr(backend, "_core", None)
        try:
            caps = set(core.get_property(native, "OPTIMIZATION_CAPABILITIES")) if core and native else set()
        except Exception:
            caps = set()
        return [p for p, cap in (("bf16", "BF16"), ("fp16", "FP16")) if cap in caps]
    if cand.backend == "onnxruntime" and kind == "cuda":
        return ["fp16"] if "TensorrtExecutionProvider" in getattr(backend, "available_providers", ()) else []
    return []


def _node_names(model: Model) -> tuple[str, ...]:
    return tuple(node_label(n, i) for i, n in enumerate(model.graph))


def _shapes(samples: Mapping[str, Any] | None) -> list[Any]:
    if samples is None:
        return []
    return [[k, str(getattr(v, "dtype", type(v).__name__)), list(getattr(v, "shape", ()))] for k, v in samples.items()]


class _Search:
    """State of one search: the model, the candidates, the verifier, the notes for the plan."""

    def __init__(self, model: Model, order: list[Candidate], options_of: OptionsOf, precision: str,
                 budget: dict[str, float] | None, sample_inputs: Any) -> None:
        self.model = model
        self.order = order
        self.options_of = options_of
        self.precision = precision
        self.notes: list[str] = []
        self.verifier = Verifier(model, sample_inputs, budget, self.notes)
        self.fp32_outputs: dict[Candidate, list[Any]] = {}

    def single(self, cand: Candidate, precision: str) -> _Trial | None:
        label = str(cand) if precision == "fp32" else f"{cand} {precision}"
        try:
            options = self.options_of(cand, precision)
            ref = self.verifier.reference_executable() if cand.backend == FALLBACK_BACKEND and not options else None
            exe = ref or get_backend(cand.backend).compile(self.model, cand.device, options)
        except HybridError as e:
            if e.code == "HYB-306":
                raise
            self.notes.append(f"{label} could not compile the model: {e.message}")
            return None
        return _Trial(label, cand.backend, cand.device, precision, options, exe,
                      decision={"kind": "single", "backend": cand.backend, "device": cand.device,
                                "precision": precision})

    def partitioned(self) -> _Trial | None:
        try:
            typed = typed_model(self.model, self.verifier.samples)
            able = supporters(list(typed.graph), self.order)
            return build_partition(self.model, typed, able, self.order, lambda c: self.options_of(c, "fp32"),
                                   self.notes)
        except HybridError as e:
            self.notes.append(f"partitioning failed: {e.message}")
            return None

    def check(self, trial: _Trial) -> str | None:
        """Why ``trial`` must not win (None: it may); records its outputs and first-run time."""
        truth = self.fp32_outputs.get(Candidate(trial.backend, trial.device))
        verdict = self.verifier.check(trial.executable, trial.precision, truth)
        trial.outputs, trial.first_run_s = verdict.outputs, verdict.first_run_s
        trial.disputed = verdict.disputed and trial.backend != FALLBACK_BACKEND and "+" not in trial.backend
        trial.answers = verdict.answers
        if verdict.why is None and trial.precision != "fp32" and trial.outputs is not None:
            cases = self.verifier.cases
            base = cases[0].expected if cases else truth
            if base is not None:
                cos = checks.cosine(base, trial.outputs, self.verifier.names)
                self.notes.append(f"{trial.label}: min cosine vs fp32 {cos:.6f}")
        return verdict.why


def build_partition(model: Model, typed: Any, able: list[tuple[Candidate, ...]], order: list[Candidate],
                    options_of: Callable[[Candidate], dict[str, Any]], notes: list[str]) -> _Trial:
    """Partition and compile (see :func:`hybrid.runtime.executor.compile_partitioned`) as a trial."""
    exe, plan, partition = compile_partitioned(model, typed, able, order, options_of, notes)
    labels = list(dict.fromkeys(p.label for p in partition.parts))
    backends = "+".join(dict.fromkeys(c.backend for c in labels))
    devices = "+".join(dict.fromkeys(c.device for c in labels))
    return _Trial("partition(" + " + ".join(map(str, labels)) + ")", backends, devices, "fp32", {}, exe, plan,
                  {"kind": "partition", "assignment": partition.assignment})


def _trials(search: _Search, autotune: bool) -> Iterator[_Trial]:
    order = search.order
    accelerated = [c for c in order if c.backend != FALLBACK_BACKEND]
    fallback = [c for c in order if c.backend == FALLBACK_BACKEND]
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


def _outvote(trials: list[_Trial], search: _Search, name: str) -> None:
    """Let independent backends outvote the reference on an output they agree on and it does not.

    When no accelerated fp32 candidate agrees with the reference, but candidates of two or more
    backends, rejected for values alone, agree with each other on every sample, the output is one
    where rounding decides the answer (equal logits near 1e10 before a Softmax, say) and the
    reference's own rounding is one opinion among several: those candidates are reinstated and the
    reference trial is rejected instead. A candidate that differs from every other opinion stays out.
    """
    if any(t.rejected is None and t.precision == "fp32" and t.backend != FALLBACK_BACKEND for t in trials):
        return
    disputed = [t for t in trials if t.disputed]
    best: list[_Trial] = []
    for t in disputed:
        group = [u for u in disputed if u is t or search.verifier.agree(t.answers, u.answers)]
        consistent = all(search.verifier.agree(u.answers, v.answers) for u in group for v in group if u is not v)
        if consistent and len({u.backend for u in group}) >= 2 and len(group) > len(best):
            best = group
    if not best:
        return
    labels = ", ".join(t.label for t in best)
    note = f"the reference backend was outvoted: {labels} agree with each other on every sample but not with it"
    logger.warning("auto: %s for %r", note, name)
    search.notes.append(note)
    for t in best:
        t.rejected = None
    for t in trials:
        if t.backend == FALLBACK_BACKEND and t.rejected is None:
            t.rejected = "outvoted"


def _deviation(trial: _Trial, search: _Search) -> float:
    """How far ``trial``'s answers are from the reference's (0.0 for the reference itself; infinity
    when nothing was compared), in the units of :func:`hybrid.runtime.checks.deviation`."""
    verifier = search.verifier
    if verifier.reference is not None and trial.executable is verifier.reference:
        return 0.0
    cases, names = verifier.cases, verifier.names
    if trial.answers and len(trial.answers) == len(cases):
        return max(checks.deviation(c.expected, a, names) for c, a in zip(cases, trial.answers))
    if trial.outputs is not None and cases:
        return checks.deviation(cases[0].expected, trial.outputs, names)
    return float("inf")


def _fastest_or_most_exact(survivors: list[_Trial], times: Mapping[str, float],
                           search: _Search) -> tuple[_Trial, str]:
    """The fastest survivor, unless others are as fast within :func:`tie_bounds`:
    then, of those, the one closest to the reference (the reference itself when it is among them)."""
    fastest = min(survivors, key=lambda t: times[t.label])
    best = times[fastest.label]
    rel, abs_s = tie_bounds()
    ties = [t for t in survivors if times[t.label] <= best + max(rel * best, abs_s)]
    reason = f"fastest of {len(survivors)} checked candidates"
    if len(ties) < 2:
        return fastest, reason
    dev = {t.label: _deviation(t, search) for t in ties}
    exact = min(ties, key=lambda t: (dev[t.label], times[t.label]))
    if exact is fastest or dev[exact.label] >= dev[fastest.label]:
        return fastest, reason
    search.notes.append(
        f"{exact.label} is as fast as {fastest.label} (within {rel:.0%} or {abs_s * 1e6:.0f} us) and closer "
        f"to the reference: deviation {dev[exact.label]:.3g} vs {dev[fastest.label]:.3g} tolerance units")
    return exact, f"closest to the reference of {len(ties)} candidates as fast as the fastest"


def _close_all(trials: list[_Trial], keep: _Trial | None, search: _Search) -> None:
    keep_exe = keep.executable if keep else None
    closed = set()
    for t in trials:
        if t.executable is not keep_exe and id(t.executable) not in closed:
            closed.add(id(t.executable))
            t.executable.close()
    if id(search.verifier.reference) not in closed:
        search.verifier.close(keep_exe)


def _compiled(model: Model, trial: _Trial, target: str, notes: list[str], reason: str) -> CompiledModel:
    if trial.plan is not None:
        plan = Plan(trial.plan.segments, tuple(notes), trial.plan.placements)
    else:
        sig = model.signature
        plan = Plan((Segment(trial.backend, trial.device, _node_names(model), tuple(sig.input_names),
                             tuple(sig.output_names), reason, trial.precision),), tuple(notes))
    return CompiledModel(model, trial.executable, plan, trial.backend, trial.device, trial.options, target)


def _from_record(model: Model, record: dict[str, Any], order: list[Candidate], options_of: OptionsOf,
                 sample_inputs: Any, target: str) -> CompiledModel | None:
    decision = record["decision"]
    notes = [f"decision read from the autotune cache {record['path']}", *record.get("notes", [])]
    try:
        if decision["kind"] == "single":
            cand = Candidate(decision["backend"], decision["device"])
            if cand not in order:
                return None
            trial = _Search(model, order, options_of, "fp32", None, sample_inputs).single(cand, decision["precision"])
            if trial is None:
                return None
            return _compiled(model, trial, target, notes, "chosen by autotune (cached)")
        typed = typed_model(model, at.make_samples(model, sample_inputs))
        assignment = decision["assignment"]
        if len(assignment) != len(typed.graph):
            return None
        able = [(Candidate(*label.split(":", 1)),) for label in assignment]
        if any(a[0] not in order for a in able):
            return None
        scratch: list[str] = []
        trial = build_partition(model, typed, able, order, lambda c: options_of(c, "fp32"), scratch)
        return _compiled(model, trial, target, notes, "")
    except (HybridError, KeyError, TypeError, ValueError) as e:
        logger.info("cached autotune decision unusable (%s); searching again", e)
        return None


def select(model: Model, target: str, order: list[Candidate], options_of: OptionsOf, precision: str,
           accuracy: Mapping[str, Any] | None, autotune: bool | None, sample_inputs: Any) -> CompiledModel:
    """Compile ``model`` for the best of ``order`` by check and measurement (see the module doc).

    Raises:
        BackendError: HYB-304 when no candidate (nor a partition) can run the model.
    """
    budget = checks.validate_accuracy(accuracy) if precision != "fp32" else None
    samples = at.make_samples(model, sample_inputs)
    if autotune is None:
        autotune = True  # how many full-graph candidates there are is known only after compiling
    versions = {c.backend: backend_status(c.backend).version for c in order}
    if backend_status(FALLBACK_BACKEND).available:
        versions[FALLBACK_BACKEND] = backend_status(FALLBACK_BACKEND).version
    key, material = at.decision_key({
        "hybrid": __version__, "model": model.sha256, "inputs": _shapes(samples) or str(model.signature),
        "target": target, "candidates": [str(c) for c in order], "precision": precision, "accuracy": budget,
        "autotune": autotune, "ties": tie_bounds(), "options": {str(c): options_of(c, "fp32") for c in order},
        "backends": versions,
        "device": at.device_fingerprint(),
    })
    record = at.load_decision(key, material)
    if record is not None:
        cm = _from_record(model, record, order, options_of, sample_inputs, target)
        if cm is not None:
            return cm
    search = _Search(model, order, options_of, precision, budget, sample_inputs)
    if samples is not None:
        shapes = ", ".join(f"{k}: {v.dtype}[{'x'.join(map(str, v.shape))}]" for k, v in samples.items()
                           if hasattr(v, "shape"))
        search.notes.append(f"sample input ({'given' if sample_inputs is not None else 'generated'}): {shapes}")
    trials: list[_Trial] = []
    winner: _Trial | None = None
    for trial in _trials(search, autotune):
        trials.append(trial)
        why = search.check(trial)
        if why is not None:
            logger.warning("auto: rejected %s for %r: %s", trial.label, model.name, why)
            search.notes.append(f"rejected {trial.label}: {why}")
            trial.rejected = why
            continue
        if trial.precision == "fp32" and trial.outputs is not None and "+" not in trial.backend:
            search.fp32_outputs[Candidate(trial.backend, trial.device)] = trial.outputs
        if not autotune and search.verifier.ok and trial.backend != FALLBACK_BACKEND:
            winner = trial
            break
    if winner is None:
        _outvote(trials, search, model.name)
    survivors = [t for t in trials if t.rejected is None]
    unchecked = not search.verifier.ok
    fallback = [t for t in survivors if t.backend == FALLBACK_BACKEND]
    if winner is None and unchecked and fallback:
        # nothing could be checked, so nothing accelerated may win: the reference is right by definition
        winner = fallback[0]
        reason = "no sample input could be checked; the reference backend is right by definition"
        logger.warning("auto: %r runs on the reference backend: no sample input could be checked against it; "
                       "pass sample_inputs= to let the accelerated backends compete", model.name)
    elif winner is None and survivors:
        winner = survivors[0]
        reason = "first candidate by priority that passed the check"
        feeds = search.verifier.samples
        if autotune and len(survivors) > 1 and search.verifier.ok:
            times = at.time_candidates({t.label: (lambda e=t.executable: e.run(feeds)) for t in survivors},
                                       first_runs={t.label: t.first_run_s for t in survivors if t.first_run_s})
            search.notes.append("timed: " + ", ".join(f"{n} {s * 1e3:.3g} ms" for n, s in
                                                      sorted(times.items(), key=lambda kv: kv[1])))
            winner, reason = _fastest_or_most_exact(survivors, times, search)
    else:
        reason = "first candidate by priority that passed the check (autotune=False)"
    if winner is None:
        _close_all(trials, None, search)
        raise BackendError("HYB-304", f"no candidate of target {target!r} can run {model.name!r}: "
                           + "; ".join(search.notes[-6:]), "see the log for each candidate's error")
    _close_all(trials, winner, search)
    search.notes.append(f"picked {winner.label} ({reason})")
    path = at.save_decision(key, material, winner.decision, search.notes)
    if path is not None:
        search.notes.append(f"decision cached in {path}")
    logger.info("auto: %s runs on %s (%s)", model.name, winner.label, reason)
    return _compiled(model, winner, target, search.notes, reason)


def partition_compiled(model: Model, target: str, order: list[Candidate], options_of: OptionsOf,
                       sample_inputs: Any) -> CompiledModel:
    """Partition without checks or timing (targets other than 'auto' whose candidates each fail).

    Raises:
        BackendError: HYB-305 for a node no candidate supports, HYB-304 when compiling keeps failing.
    """
    samples = at.make_samples(model, sample_inputs)  # types the outputs of custom ops, if any
    typed = typed_model(model, samples)
    notes = ["no single candidate compiles the whole graph: partitioned across backends"]
    trial = build_partition(model, typed, supporters(list(typed.graph), order), order,
                            lambda c: options_of(c, "fp32"), notes)
    return _compiled(model, trial, target, notes, "")
