"""Graph passes on onnx-ir and ``hybrid.optimize``.

``optimize(model, level, config)`` runs one explicit pass list per level (:data:`LEVELS`) to a fixpoint
on a copy of the model; ``make_batch_dynamic(model)`` rewrites a static-batch model to take any batch.
Each pass is importable on its own and follows the onnx-ir pass contract (``PassResult(model,
modified)``); the rule tables (:data:`FUSION_RULES`, ...) are ``(pattern, fn)`` rows.
"""

from hybrid.passes.base import HybridPass, OnnxIrPass, Pass, PassManager, PassResult, verify_enabled, working_copy
from hybrid.passes.batch import MakeBatchDynamic, make_batch_dynamic
from hybrid.passes.cse import deduplicate_initializers, eliminate_common_subexpressions
from hybrid.passes.dce import NOOP_RULES, eliminate_identity, remove_dead_code, remove_noops
from hybrid.passes.fold import (
    DEFAULT_FOLD_SIZE_LIMIT,
    FoldConstants,
    NormalizeInitializers,
    evaluate_node,
    lift_constants,
)
from hybrid.passes.fuse import FUSION_RULES, fuse_operators
from hybrid.passes.layout import TRANSPOSE_RULES, ConvertLayout, cancel_transposes
from hybrid.passes.optimize import GRAPH_OPTIMIZATION, LEVELS, OptimizeOptions, build_passes, optimize, parse_options
from hybrid.passes.rewrite import Context, Rewrite, RuleRewritePass
from hybrid.passes.shapes import SHAPE_RULES, fold_shapes, infer_shapes
from hybrid.passes.simplify import SIMPLIFY_RULES, simplify
from hybrid.passes.verify import GraphInvalid, verify_model

__all__ = [
    "DEFAULT_FOLD_SIZE_LIMIT",
    "FUSION_RULES",
    "GRAPH_OPTIMIZATION",
    "LEVELS",
    "NOOP_RULES",
    "SHAPE_RULES",
    "SIMPLIFY_RULES",
    "TRANSPOSE_RULES",
    "Context",
    "ConvertLayout",
    "FoldConstants",
    "GraphInvalid",
    "HybridPass",
    "MakeBatchDynamic",
    "NormalizeInitializers",
    "OnnxIrPass",
    "OptimizeOptions",
    "Pass",
    "PassManager",
    "PassResult",
    "Rewrite",
    "RuleRewritePass",
    "build_passes",
    "cancel_transposes",
    "deduplicate_initializers",
    "eliminate_common_subexpressions",
    "eliminate_identity",
    "evaluate_node",
    "fold_shapes",
    "fuse_operators",
    "infer_shapes",
    "lift_constants",
    "make_batch_dynamic",
    "optimize",
    "parse_options",
    "remove_dead_code",
    "remove_noops",
    "simplify",
    "verify_enabled",
    "verify_model",
    "working_copy",
]
