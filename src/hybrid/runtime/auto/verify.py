"""The correctness gate of ``compile(target='auto')``: sample inputs, the reference answers, the check.

The reference backend answers the sample inputs once; every candidate must then give the same
answers within the tolerances of :mod:`.tolerance` (fp32, at model level) or within the accuracy
budget (reduced precisions). Samples are made at the declared shapes (``shapes=``: ``opt`` first,
then ``min`` and ``max`` of a range), else with every symbolic dim 1. Generated samples that the
reference itself rejects (an integer input that must be a valid index or size, a coordinate that
must lie inside an image) are regenerated in a few other styles. When the reference answers
quickly and no shapes were declared, two more samples with other values (integers up to 7, then
also floats 64 times larger) widen the check. When no sample can be checked, the caller keeps the
reference backend (or, tuning online, the first accelerated candidate) and the plan says why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybrid.errors import HybridError, first_line
from hybrid.hal import backend_status, fallback_backend, get_backend
from hybrid.hal.backend import Executable
from hybrid.ir import Model
from hybrid.runtime.auto import accuracy
from hybrid.runtime.auto import tolerance as checks
from hybrid.runtime.auto.samples import SAMPLE_STYLES, make_samples
from hybrid.runtime.auto.shapes import ShapeRange, concrete_shapes

__all__ = ["Verdict", "Verifier"]

logger = logging.getLogger("hybrid")

MORE_SAMPLES_BELOW_S = 0.5  # more samples are checked when the reference answers faster than this
MORE_SAMPLES_MAGNITUDE = 64.0  # a power of two: scaling the floats adds no rounding of its own
MORE_SAMPLES_INT_HIGH = 8  # integers in [1, 8): longer windows, strides, lengths than 1 or 2


@dataclass(slots=True)
class _Case:
    samples: dict[str, Any]
    expected: list[Any]
    seconds: float
    moved: list[Any] | None = None
    moved_done: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of checking one candidate.

    Attributes:
        why: Why the candidate must not win; None when it may.
        outputs: Its outputs on the first sample (None when it was not run).
        first_run_s: Seconds its first run on the first sample took.
        disputed: It was rejected for values alone (same shapes and dtypes as the reference).
        answers: Its outputs on every checked sample (fp32 candidates).
    """

    why: str | None
    outputs: list[Any] | None = None
    first_run_s: float | None = None
    disputed: bool = False
    answers: tuple[list[Any], ...] = ()


class Verifier:
    """Checks candidates of one model against the reference backend on sample inputs.

    Args:
        model: The model.
        given: Sample inputs from the caller (None: generate them).
        budget: The accuracy budget for reduced precisions.
        notes: Where to record what happened (the plan's notes).
        ranges: The declared shapes (``compile(shapes=...)``), validated.
        rtol: The model-level relative tolerance of the fp32 check.
        rules: Per-output rules that override the default judgement.
        reference: The reference backend already compiled for the model (None: compiled when needed).
    """

    def __init__(self, model: Model, given: Any, budget: dict[str, float] | None, notes: list[str], *,
                 ranges: Mapping[str, ShapeRange] | None = None, rtol: float = 0.0,
                 rules: Mapping[str, checks.OutputRule] | None = None, reference: Executable | None = None) -> None:
        self.model = model
        self.budget = budget
        self.notes = notes
        self.names = model.signature.output_names
        self.rtol = rtol
        self.rules = dict(rules or {})
        self.given = given is not None
        self.ranges = dict(ranges or {})
        sig = model.signature
        self._shapes = [concrete_shapes(sig, self.ranges, w) for w in ("opt", "min", "max")] if self.ranges else [{}]
        self._shapes = [s for k, s in enumerate(self._shapes) if s not in self._shapes[:k]]
        self.samples = make_samples(model, given, shapes=self._shapes[0])
        self.cases: list[_Case] = []
        self.ok = False  # the reference answered: failures are rejections, and timing is meaningful
        self._ref: Executable | None = reference
        self._ref_done = reference is not None
        self._prepared = False

    # ------------------------------------------------------------------------- reference answers
    def reference_executable(self) -> Executable | None:
        """The reference backend compiled for the model (None when it cannot be)."""
        if not self._ref_done:
            self._ref_done = True
            reference = fallback_backend()  # the backend exact and complete by its own declaration
            if backend_status(reference).available:
                try:
                    self._ref = get_backend(reference).compile(self.model, "cpu")
                except HybridError as e:
                    self.notes.append(f"the reference backend cannot check this model: {e.message}")
        return self._ref

    def _answer(self, samples: dict[str, Any]) -> _Case | str:
        assert self._ref is not None
        try:
            t0 = time.perf_counter()
            out = list(self._ref.run(samples))
            return _Case(samples, out, time.perf_counter() - t0)
        except Exception as e:
            return first_line(e)

    def prepare(self) -> None:
        """Compute the reference answers (once)."""
        if self._prepared:
            return
        self._prepared = True
        if self.samples is None or self.reference_executable() is None:
            return
        styles = [0] if self.given else list(range(SAMPLE_STYLES))
        failure = ""
        for style in styles:
            samples = self.samples if self.given else make_samples(self.model, style=style, shapes=self._shapes[0])
            if samples is None:
                continue
            case = self._answer(samples)
            if isinstance(case, str):
                failure = failure or case
                continue
            self.samples, self.ok = samples, True
            self.cases.append(case)
            if self.given or self.ranges:  # generated values can drive data-dependent shapes anywhere
                self._note_wrong_declarations(case.expected)
            for shapes in self._shapes[1:]:  # the rest of a declared range: min and max
                more = make_samples(self.model, style=style, seed=len(self.cases), shapes=shapes)
                answer = self._answer(more) if more is not None else "no sample"
                if isinstance(answer, str):
                    self.notes.append(f"the reference backend failed at {shapes}: {answer}")
                else:
                    self.cases.append(answer)
            if not self.given and not self.ranges and case.seconds < MORE_SAMPLES_BELOW_S:
                self._more_cases(style)
            if style:
                self.notes.append(f"sample input style {style} (the reference rejected style 0: {failure})")
            return
        self.notes.append(f"the reference backend failed on every sample input ({failure}): results not checked, "
                          "candidates not timed; pass sample_inputs= to check and time them")

    def _note_wrong_declarations(self, outputs: list[Any]) -> None:
        """Say so when an output's declared shape (rank or static dims) is not what the model computes.

        Such models are common and run fine; the answer the model computes is what counts.
        """
        for spec, value in zip(self.model.signature.outputs, outputs):
            got = getattr(value, "shape", None)
            if spec.shape is None or got is None:
                continue
            wrong = len(spec.shape) != len(got) or any(
                isinstance(d, int) and d >= 0 and d != n for d, n in zip(spec.shape, got))
            if wrong:
                note = (f"output {spec.name!r} is declared {spec.shape} but the model computes shape {tuple(got)}: "
                        "the declaration is wrong; the computed shape is used")
                logger.warning("auto: %s (model %r)", note, self.model.name)
                self.notes.append(note)

    def _more_cases(self, style: int) -> None:
        """Widen the check with other values.

        Longer integers (window lengths, sequence lengths, strides), then also floats 64 times larger (rounding harmless
        near 1 shows up there). A variant the reference rejects is retried with the first sample's integers.
        """
        for seed, magnitude in ((1, 1.0), (2, MORE_SAMPLES_MAGNITUDE)):
            for high in (MORE_SAMPLES_INT_HIGH, None):
                sample = make_samples(self.model, style=style, seed=seed, magnitude=magnitude, int_high=high)
                answer = self._answer(sample) if sample is not None else "no sample"
                if not isinstance(answer, str):
                    self.cases.append(answer)
                    break

    def _moved(self, case: _Case) -> list[Any] | None:
        """The reference answer for the sample nudged by rounding-level noise, computed only when a candidate disagrees.

        It tells a wrong answer from an ill-conditioned output.
        """
        if not case.moved_done:
            case.moved_done = True
            near = checks.nudged(case.samples)
            if near is not None and self._ref is not None:
                answer = self._answer(near)
                case.moved = None if isinstance(answer, str) else answer.expected
        return case.moved

    # ------------------------------------------------------------------------- the check
    def check(self, exe: Executable, precision: str, fp32_truth: list[Any] | None = None) -> Verdict:
        """Check one candidate.

        Fp32 against the reference's answers with the dtype tolerances, reduced precisions against fp32 (the
        reference's, else ``fp32_truth``) with the budget.
        """
        self.prepare()
        if self.samples is None:
            return Verdict(None)
        if not self.cases:
            try:
                t0 = time.perf_counter()
                outs = list(exe.run(self.samples))
                seconds = time.perf_counter() - t0
            except Exception as e:
                return Verdict(None) if not self.ok else Verdict(f"failed on the sample input: {first_line(e)}")
            if precision == "fp32":
                return Verdict(None, outs, seconds)
            if fp32_truth is None:
                return Verdict("no fp32 result to check the reduced precision against", outs, seconds)
            return Verdict(self._within_budget(fp32_truth, outs), outs, seconds)
        first: tuple[list[Any], float] | None = None
        answers: list[list[Any]] = []
        for k, case in enumerate(self.cases):
            if exe is self._ref:
                outs, seconds = case.expected, case.seconds
            else:
                try:
                    t0 = time.perf_counter()
                    outs = list(exe.run(case.samples))
                    seconds = time.perf_counter() - t0
                except Exception as e:
                    return Verdict(f"failed on sample input {k}: {first_line(e)}")
            first = first or (outs, seconds)
            answers.append(outs)
            if precision == "fp32":
                bad = self.compare(case.expected, outs)
                if bad is not None and self._moved(case) is not None:
                    bad = self.compare(case.expected, outs, case.moved)
                if bad is not None:
                    disputed = bad.values_only and all(
                        self._run_quietly(exe, c.samples, answers, j) for j, c in enumerate(self.cases) if j > k)
                    return Verdict(f"{bad} (vs the reference backend, sample input {k})", *first,
                                   disputed=disputed, answers=tuple(answers))
            else:
                why = self._within_budget(case.expected, outs)
                if why is not None:
                    return Verdict(why, *first)
        assert first is not None
        return Verdict(None, *first, answers=tuple(answers))

    @staticmethod
    def _run_quietly(exe: Executable, samples: dict[str, Any], answers: list[list[Any]], _: int) -> bool:
        """Run ``exe`` on one more sample for a later vote; False when it fails."""
        try:
            answers.append(list(exe.run(samples)))
        except Exception:
            return False
        return True

    def compare(self, expected: list[Any], got: list[Any], moved: list[Any] | None = None) -> checks.Mismatch | None:
        """The first output of ``got`` outside this model's fp32 tolerances around ``expected``."""
        return checks.compare(expected, got, self.names, moved, rtol=self.rtol, rules=self.rules)

    def agree(self, a: tuple[list[Any], ...], b: tuple[list[Any], ...]) -> bool:
        """Whether two candidates' answers on every sample agree within the fp32 tolerances."""
        return len(a) == len(b) == len(self.cases) and all(
            self.compare(x, y) is None and self.compare(y, x) is None for x, y in zip(a, b))

    def _within_budget(self, truth: list[Any], outs: list[Any]) -> str | None:
        assert self.budget is not None
        return accuracy.accuracy_failure(self.budget, truth, outs, self.names)

    @property
    def reference(self) -> Executable | None:
        """The reference executable if it was compiled (compiles nothing)."""
        return self._ref

    def close(self, keep: Executable | None) -> None:
        """Release the reference executable unless it is ``keep`` (the winner)."""
        if self._ref is not None and self._ref is not keep:
            self._ref.close()
