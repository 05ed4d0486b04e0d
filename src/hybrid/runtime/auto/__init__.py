"""``compile(target='auto')``: which backend runs this model, at the shapes users run, checked and timed.

The package, top to bottom:

- :mod:`.shapes` the declared shapes (``shapes=``, trtexec-style ranges, ``--shapes x:1x3x480x640``)
  and the shape buckets of online tuning;
- :mod:`.samples` sample inputs for the check, the timings, ``pyasc bench`` and the profiler;
- :mod:`.tolerance` when two answers agree (model-level fp32 tolerance, per-output rules, budgets);
- :mod:`.verify` the check against the reference backend;
- :mod:`.trials` the candidates compiled and checked; :mod:`.judge` the vote and the tie rule;
- :mod:`.timing` interleaved timing; :mod:`.cache` the decision cache; :mod:`.decision` what is decided;
- :mod:`.search` the offline search;
- online tuning on real calls per shape bucket: :mod:`.online` (the tuner), :mod:`.router` (the data plane),
  :mod:`.controller` (the control plane), :mod:`.lab` (check, compile, cache), :mod:`.rule` (the one decision
  rule, also used by :mod:`.timing`), :mod:`.policy` (its parameters), :mod:`.status` (``cm.tuning``).
"""

from hybrid.runtime.auto.decision import Decision, PartitionDecision, SingleDecision
from hybrid.runtime.auto.online import OnlineTuner
from hybrid.runtime.auto.policy import TuningPolicy
from hybrid.runtime.auto.samples import SAMPLE_STYLES, make_samples
from hybrid.runtime.auto.search import partition_compiled, select
from hybrid.runtime.auto.shapes import ShapeRange, bucket_of, normalize_shapes, parse_shapes
from hybrid.runtime.auto.status import BucketTuning, CandidateResult
from hybrid.runtime.auto.timing import time_candidates
from hybrid.runtime.auto.trials import offered_precisions

__all__ = [
    "SAMPLE_STYLES",
    "BucketTuning",
    "CandidateResult",
    "Decision",
    "OnlineTuner",
    "PartitionDecision",
    "ShapeRange",
    "SingleDecision",
    "TuningPolicy",
    "bucket_of",
    "make_samples",
    "normalize_shapes",
    "offered_precisions",
    "parse_shapes",
    "partition_compiled",
    "select",
    "time_candidates",
]
