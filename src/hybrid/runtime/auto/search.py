"""Choosing by measurement: the search behind ``compile(target='auto')`` (DESIGN 2.3).

The search checks every trial (:mod:`.trials`) on sample inputs at the shapes users run: the
declared ones (``shapes=``, ``sample_inputs=``), else generated ones. The survivors are timed
(``autotune``) and the fastest wins, except that candidates within timing noise of the fastest tie
and the one closest to the reference wins the tie (:mod:`.judge`); without timing the first
accelerated survivor in priority order wins. When no sample can be checked, the reference backend
runs the model. The decision is cached on disk, so the next compile is instant. When accelerated
candidates were timed within 1.5x of a winner that was the fastest (and it runs a call in 0.2 ms or
more), they stay compiled and take turns with it on the first real calls, which confirm or replace the
decision (:class:`.online.Confirmation`): one timing at compile ranks a near tie the wrong way when the
machine's state moves between compile and serving.

A model with dynamic input dims and nothing declared about them is not timed at made-up shapes: it
starts on the first candidate by priority that passes the check (an accelerated one even when the
generated sample cannot be checked), and tunes online on real calls, per shape bucket
(:mod:`.online`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from hybrid._version import __version__
from hybrid.config import autotune_config
from hybrid.errors import BackendError, HybridError
from hybrid.hal import Candidate, backend_status, fallback_backend, is_fallback, split_fallback
from hybrid.ir import Model
from hybrid.runtime.auto import accuracy as accuracy_budget
from hybrid.runtime.auto import cache, judge
from hybrid.runtime.auto.decision import decision_from_json
from hybrid.runtime.auto.lab import Confirmation, RealLab
from hybrid.runtime.auto.online import CHECKS, OnlineTuner
from hybrid.runtime.auto.policy import TimingPolicy, TuningPolicy
from hybrid.runtime.auto.samples import make_samples
from hybrid.runtime.auto.shapes import has_dynamic_inputs, normalize_shapes
from hybrid.runtime.auto.timing import METHOD as TIMING_METHOD
from hybrid.runtime.auto.timing import time_candidates
from hybrid.runtime.auto.trials import OptionsOf, Search, Trial, build_partition, check_trials, trial_of
from hybrid.runtime.compiled import CompiledModel
from hybrid.runtime.partition import node_label, supporters, typed_model
from hybrid.runtime.plan import Plan, Segment

__all__ = ["partition_compiled", "select", "single_plan"]

logger = logging.getLogger("hybrid")
Rivals = tuple[Mapping[str, Any], list[Trial]] | None  # a timing's sample and the rivals of its winner


def _node_names(model: Model) -> tuple[str, ...]:
    return tuple(node_label(n, i) for i, n in enumerate(model.graph))


def _shapes(samples: Mapping[str, Any] | None) -> list[Any]:
    if samples is None:
        return []
    return [[k, str(getattr(v, "dtype", type(v).__name__)), list(getattr(v, "shape", ()))] for k, v in samples.items()]


def single_plan(model: Model, trial: Trial, notes: list[str] | tuple[str, ...], reason: str) -> Plan:
    """The plan of a trial: its partition's, or one segment running the whole graph."""
    if trial.plan is not None:
        return Plan(trial.plan.segments, tuple(notes), trial.plan.placements)
    sig = model.signature
    ran = trial.executable.precision or trial.precision  # what the backend says it runs (OpenVINO: bf16 for f16)
    if trial.layout is not None:
        reason = f"{reason}; layout {trial.layout.tag}: {trial.layout.doc}"
    return Plan((Segment(trial.backend, trial.device, _node_names(model), tuple(sig.input_names),
                         tuple(sig.output_names), reason, ran),), tuple(notes))


def _compiled(model: Model, trial: Trial, target: str, notes: list[str], reason: str) -> CompiledModel:
    return CompiledModel(model, trial.executable, single_plan(model, trial, notes, reason), trial.backend,
                         trial.device, trial.options, target)


def _from_record(model: Model, record: dict[str, Any], order: list[Candidate], options_of: OptionsOf,
                 sample_inputs: Any) -> tuple[Trial, list[str]] | None:
    notes = [f"decision read from the autotune cache {record['path']}", *record.get("notes", [])]
    try:
        trial = trial_of(model, decision_from_json(record["decision"]), order, options_of, sample_inputs)
    except (HybridError, KeyError, TypeError, ValueError) as e:
        logger.info("cached autotune decision unusable (%s); searching again", e)
        return None
    return None if trial is None else (trial, notes)


def select(model: Model, target: str, order: list[Candidate], options_of: OptionsOf, precision: str,
           accuracy: Mapping[str, Any] | None, autotune: bool | None, sample_inputs: Any,
           shapes: Mapping[str, Any] | None = None) -> CompiledModel:
    """Compile ``model`` for the best of ``order`` by check and measurement (see the module doc).

    Raises:
        ConfigError: HYB-101/102 for a bad ``accuracy`` or ``shapes``.
        BackendError: HYB-304 when no candidate (nor a partition) can run the model.
    """
    sig = model.signature
    acc = accuracy_budget.parse_accuracy(accuracy, precision, sig.output_names)
    ranges = normalize_shapes(sig, shapes)
    settings = autotune_config()
    timing = TimingPolicy.from_settings(settings)  # the compile's timing and judging, read once
    rtol = settings.rtol if acc.rtol is None else acc.rtol
    # precision='auto': reduced precisions race online too, within the accuracy budget (the default one when none is
    # given, as at compile); at fp32 nothing changes numerics
    reduced = precision == "auto"
    online = (sample_inputs is None and not ranges and precision in ("fp32", "auto")
              and autotune is not False and settings.online and has_dynamic_inputs(sig))
    start_precision = "fp32" if online else precision  # the start of online tuning runs the model as exported
    if online:
        autotune = False  # nothing is timed at made-up shapes: the start is the first checked candidate by
        # priority, and real calls decide (the plan says so)
    elif autotune is None:
        autotune = True  # how many full-graph candidates there are is known only after compiling
    samples = make_samples(model, sample_inputs)
    versions = {c.backend: backend_status(c.backend).version for c in order}
    reference = fallback_backend()
    if backend_status(reference).available:
        versions[reference] = backend_status(reference).version
    base = {
        "hybrid": __version__, "model": model.sha256, "target": target, "candidates": [str(c) for c in order],
        "precision": precision, "accuracy": acc.budget, "rtol": rtol, "rules": acc.rules,
        "ties": timing.tie_bounds, "tie_below": timing.tiny_s, "exact_below": timing.deviation_floor,
        "timing": TIMING_METHOD, "layouts": settings.layouts,  # a decision of a layout holds only where they may race
        "options": {str(c): options_of(c, "fp32") for c in order},
        "backends": versions, "device": cache.device_fingerprint(),
    }
    inputs = {k: [r.min, r.opt, r.max] for k, r in ranges.items()} if ranges else (_shapes(samples) or str(sig))
    key, material = cache.decision_key({**base, "inputs": inputs, "autotune": autotune, "online": online})
    record = cache.load_decision(key, material)
    found = _from_record(model, record, order, options_of, sample_inputs) if record else None
    rivals: Rivals = None
    if found is not None:
        (trial, notes), reason = found, "chosen by autotune (cached)"
    else:
        confirm = not online and precision == "fp32" and settings.online  # declared or static shapes
        trial, notes, reason, rivals = _search(model, target, order, options_of, start_precision, acc, autotune,
                                               sample_inputs, ranges, rtol, online, confirm, timing)
        path = cache.save_decision(key, material, trial.decision.to_json(), notes)
        if path is not None:
            notes.append(f"decision cached in {path}")
    confirmation = None
    if rivals and not online:
        def save(confirmed: Trial) -> None:
            cache.save_decision(key, material, confirmed.decision.to_json(),
                                [*notes, f"confirmed on real calls: {confirmed.label}"])

        confirmation = Confirmation(rivals[0], tuple(rivals[1]), save, timing.confirm_ratio)
    elif not online:
        return _compiled(model, trial, target, notes, reason)
    policy = TuningPolicy.from_settings(settings)
    lab = RealLab(model, trial, order, options_of, "auto" if reduced else "fp32", acc.budget if reduced else None,
                  rtol, acc.rules, base, policy.check_share, settings.check_process, confirmation,
                  policy.replica_bytes, CHECKS)
    tuner = OnlineTuner(model, lab, policy, notes, lambda t, notes, why: single_plan(model, t, notes, why))
    return CompiledModel(model, tuner, single_plan(model, trial, tuner.notes(), reason), trial.backend,
                         trial.device, trial.options, target)


def _search(model: Model, target: str, order: list[Candidate], options_of: OptionsOf, precision: str,
            acc: accuracy_budget.Accuracy, autotune: bool, sample_inputs: Any, ranges: Mapping[str, Any], rtol: float,
            online: bool, confirm: bool, timing: TimingPolicy) -> tuple[Trial, list[str], str, Rivals]:
    """Check, time and judge the trials.

    Returns the winner, the notes, the reason, and when ``confirm``, rivals within the timing policy's
    ``confirm_ratio`` of a winner that was the fastest, kept compiled (with the timing's sample).
    """
    search = Search(model, order, options_of, precision, acc.budget, sample_inputs, ranges=ranges, rtol=rtol,
                    rules=acc.rules)
    samples = search.verifier.samples
    if samples is not None:
        shown = ", ".join(f"{k}: {v.dtype}[{'x'.join(map(str, v.shape))}]" for k, v in samples.items()
                          if hasattr(v, "shape"))
        origin = "given" if sample_inputs is not None else "at the declared shapes" if ranges else "generated"
        search.notes.append(f"sample input ({origin}): {shown}")
    rivals: Rivals = None
    tried, winner = check_trials(search, autotune, first_accelerated=not autotune,
                                 log=lambda line: logger.warning("auto: %s for %r", line, model.name))
    if winner is None:
        judge.outvote(tried, search, model.name)
    survivors = [t for t in tried if t.rejected is None]
    unchecked = not search.verifier.ok
    accelerated, fallback = split_fallback(survivors)
    if winner is None and unchecked and online and accelerated:
        winner = accelerated[0]
        reason = ("first candidate by priority that compiled (the generated sample could not be checked; "
                  "real calls are checked online)")
    elif winner is None and unchecked and fallback:
        # nothing could be checked, so nothing accelerated may win: the reference is right by definition
        winner = fallback[0]
        reason = "no sample input could be checked; the reference backend is right by definition"
        logger.warning("auto: %r runs on the reference backend: no sample input could be checked against it; "
                       "pass shapes= or sample_inputs= to let the accelerated backends compete", model.name)
    elif winner is None and survivors:
        winner = survivors[0]
        reason = "first candidate by priority that passed the check"
        feeds = search.verifier.samples
        if autotune and len(survivors) > 1 and search.verifier.ok:
            times = time_candidates({t.label: (lambda e=t.executable: e.run(feeds)) for t in survivors},
                                    policy=timing)
            search.notes.append("timed: " + ", ".join(f"{n} {s * 1e3:.3g} ms" for n, s in
                                                      sorted(times.items(), key=lambda kv: kv[1])))
            winner, reason = judge.fastest_or_most_exact(survivors, times, search, timing)
            if (confirm and times[winner.label] == min(times.values()) and times[winner.label] >= timing.quick_s
                    and feeds is not None):  # (graphs timed quickly: the tie rule keeps exact answers there)
                rivals = (feeds, [t for t in survivors if t is not winner and not is_fallback(t.backend)
                                  and not t.partitioned and t.precision == "fp32"
                                  and times[t.label] <= timing.confirm_ratio * times[winner.label]])
    elif online:
        reason = "first candidate by priority that passed the check; real calls decide (online tuning)"
    else:
        reason = "first candidate by priority that passed the check (autotune=False)"
    if winner is None:
        judge.close_all(tried, None, search)
        raise BackendError("HYB-304", f"no candidate of target {target!r} can run {model.name!r}: "
                           + "; ".join(search.notes[-6:]), "see the log for each candidate's error")
    judge.close_all(tried, winner, search, rivals[1] if rivals else ())
    search.notes.append(f"picked {winner.label} ({reason})")
    logger.info("auto: %s runs on %s (%s)", model.name, winner.label, reason)
    return winner, search.notes, reason, rivals if rivals and rivals[1] else None


def partition_compiled(model: Model, target: str, order: list[Candidate], options_of: OptionsOf,
                       sample_inputs: Any) -> CompiledModel:
    """Partition without checks or timing (targets other than 'auto' whose candidates each fail).

    Raises:
        BackendError: HYB-305 for a node no candidate supports, HYB-304 when compiling keeps failing.
    """
    samples = make_samples(model, sample_inputs)  # types the outputs of custom ops, if any
    typed = typed_model(model, samples)
    notes = ["no single candidate compiles the whole graph: partitioned across backends"]
    trial = build_partition(model, typed, supporters(list(typed.graph), order), order,
                            lambda c: options_of(c, "fp32"), notes)
    return _compiled(model, trial, target, notes, "")

