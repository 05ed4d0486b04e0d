"""``hybrid.optimize``: one explicit pass list per level, run to a fixpoint on a copy of the model.

Levels (each list is read top to bottom and repeated until no pass changes the graph):

- O0: nothing.
- O1: cleanup - initializers and Constant nodes become plain constants, no-ops and Identity nodes go,
  equal constants and equal nodes merge, constant subgraphs fold, dead code goes.
- O2: O1 plus shape inference, shape-computation folding, operator fusion (Conv+BatchNormalization,
  Conv+per-channel Mul/Add, MatMul+Add -> Gemm, ...) and transpose cancellation.
- O3: O2 plus precision-preserving algebraic rewrites and, only when ``config['layout'] == 'NHWC'``, the
  channels-last interface conversion: the model's rank-4 image inputs then take NHWC arrays under the same
  names (its compute stays NCHW, as ONNX's Conv is), a change of contract its callers must follow.

``config['dynamic_batch']`` runs ``make_batch_dynamic`` first, at any level. The result is standard ONNX
at the model's own opset, so every backend runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hybrid.config import config_error, parse_size
from hybrid.errors import ConfigError
from hybrid.ir import Model
from hybrid.passes.base import Pass, PassManager, working_copy
from hybrid.passes.batch import MakeBatchDynamic
from hybrid.passes.cse import deduplicate_initializers, eliminate_common_subexpressions
from hybrid.passes.dce import eliminate_identity, remove_dead_code, remove_noops
from hybrid.passes.fold import DEFAULT_FOLD_SIZE_LIMIT, FoldConstants, NormalizeInitializers, lift_constants
from hybrid.passes.fuse import fuse_operators
from hybrid.passes.layout import ConvertLayout, cancel_transposes
from hybrid.passes.shapes import fold_shapes, infer_shapes
from hybrid.passes.simplify import simplify

__all__ = ["GRAPH_OPTIMIZATION", "LEVELS", "GraphOptimization", "OptimizeConfig", "OptimizeOptions", "build_passes",
           "optimize", "parse_options"]

LEVELS: dict[str, tuple[str, ...]] = {
    "O0": (),
    "O1": (
        "normalize_initializers",           # initializers listed as inputs (IR < 4) become constants
        "lift_constants",                   # Constant nodes become initializers
        "remove_noops",                     # Dropout, one-input Sum/Concat, ... become Identity
        "eliminate_identity",
        "deduplicate_initializers",         # equal tensors under different names become one
        "eliminate_common_subexpressions",
        "fold_constants",                   # constant subgraphs are evaluated once, here
        "remove_dead_code",
    ),
    "O2": (
        "normalize_initializers",
        "lift_constants",
        "deduplicate_initializers",
        "eliminate_common_subexpressions",
        "fold_constants",
        "infer_shapes",                     # annotations only; the passes below read them
        "fold_shapes",                      # Shape/Size/Gather-of-Shape with static answers, Reshape chains
        "remove_noops",
        "fuse_operators",                   # Conv+BN, Conv+Mul/Add, BN+Mul/Add, MatMul+Add -> Gemm
        "cancel_transposes",
        "eliminate_identity",
        "remove_dead_code",
    ),
    "O3": (
        "normalize_initializers",
        "lift_constants",
        "deduplicate_initializers",
        "eliminate_common_subexpressions",
        "fold_constants",
        "infer_shapes",
        "fold_shapes",
        "remove_noops",
        "fuse_operators",
        "simplify",                         # x*1, Relu(Relu(x)), Squeeze(Unsqueeze(x)), Concat(Concat)
        "convert_layout",                   # only with config['layout'] == 'NHWC'
        "cancel_transposes",
        "eliminate_identity",
        "remove_dead_code",
    ),
}

# config['graph_optimization'] switch -> the passes it turns off when False
GRAPH_OPTIMIZATION: dict[str, tuple[str, ...]] = {
    "constant_folding": ("fold_constants", "fold_shapes"),
    "operator_fusion": ("fuse_operators",),
    "common_subexpression_elimination": ("deduplicate_initializers", "eliminate_common_subexpressions"),
    "dead_code_elimination": ("remove_noops", "eliminate_identity", "remove_dead_code"),
    "transpose_optimization": ("cancel_transposes",),
    "algebraic_simplification": ("simplify",),
}



class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _switch() -> Any:
    return Field(default=True, description="True or False", examples=[False])


class GraphOptimization(_Section):
    """``config['graph_optimization']``: False turns off the passes :data:`GRAPH_OPTIMIZATION` names."""

    constant_folding: bool = _switch()
    operator_fusion: bool = _switch()
    common_subexpression_elimination: bool = _switch()
    dead_code_elimination: bool = _switch()
    transpose_optimization: bool = _switch()
    algebraic_simplification: bool = _switch()



class OptimizeConfig(_Section):
    """The ``config`` of ``hybrid.optimize`` (see :func:`optimize` for each key)."""

    graph_optimization: GraphOptimization = Field(default_factory=GraphOptimization,
                                                  description="a mapping of switches to bools",
                                                  examples=[{"operator_fusion": False}])
    layout: Literal["NCHW", "NHWC"] = Field(default="NCHW", description="'NCHW' or 'NHWC'", examples=["NHWC"])
    dynamic_batch: Any = Field(default=False, description="True, False or the name of the batch dimension",
                               examples=[True])
    fold_size_limit: int = Field(default=DEFAULT_FOLD_SIZE_LIMIT, examples=["64MB"])
    disabled_passes: list[str] = Field(default_factory=list, strict=False, description="a list of pass names",
                                       examples=[["fuse_operators"]])
    verify: bool | None = Field(default=None, description="True or False", examples=[True])
    max_iterations: int = Field(default=10, ge=1, description="a positive int", examples=[10])

    @field_validator("graph_optimization", mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        return dict(value) if isinstance(value, Mapping) else value

    @field_validator("dynamic_batch")
    @classmethod
    def _dimension_name(cls, value: Any) -> bool | str:
        if isinstance(value, bool) or (isinstance(value, str) and value):
            return value
        raise ValueError("not a bool or a dimension name")

    @field_validator("fold_size_limit", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int:
        return parse_size(value, "fold_size_limit")  # HYB-103

    @field_validator("disabled_passes")
    @classmethod
    def _known_passes(cls, names: list[str]) -> list[str]:
        for pass_name in names:
            if pass_name not in _FACTORIES:
                raise ConfigError("HYB-102", f"optimize config 'disabled_passes': unknown pass {pass_name!r}; "
                                  f"passes: {', '.join(_FACTORIES)}", "name passes of hybrid.passes.LEVELS")
        return names


@dataclass(frozen=True, slots=True)
class OptimizeOptions:
    """A validated optimize configuration."""

    level: str = "O2"
    disabled: frozenset[str] = frozenset()
    layout: str = "NCHW"
    dynamic_batch: str | None = None
    fold_size_limit: int = DEFAULT_FOLD_SIZE_LIMIT
    verify: bool | None = None
    max_iterations: int = 10


_FACTORIES: dict[str, Callable[[OptimizeOptions], Pass]] = {
    "normalize_initializers": lambda o: NormalizeInitializers(),
    "lift_constants": lambda o: lift_constants(),
    "remove_noops": lambda o: remove_noops(),
    "eliminate_identity": lambda o: eliminate_identity(),
    "deduplicate_initializers": lambda o: deduplicate_initializers(),
    "eliminate_common_subexpressions": lambda o: eliminate_common_subexpressions(),
    "fold_constants": lambda o: FoldConstants(o.fold_size_limit),
    "infer_shapes": lambda o: infer_shapes(),
    "fold_shapes": lambda o: fold_shapes(),
    "fuse_operators": lambda o: fuse_operators(),
    "cancel_transposes": lambda o: cancel_transposes(),
    "simplify": lambda o: simplify(),
    "convert_layout": lambda o: ConvertLayout(o.layout),
    "remove_dead_code": lambda o: remove_dead_code(),
}


def _level(level: Any) -> str:
    if isinstance(level, int) and not isinstance(level, bool) and 0 <= level <= 3:
        return f"O{level}"
    if isinstance(level, str) and level.upper() in LEVELS:
        return level.upper()
    raise ConfigError("HYB-102", f"optimize level: expected one of {', '.join(LEVELS)}, got {level!r}",
                      "O0 does nothing, O1 cleans up, O2 adds fusions (the default), O3 adds layout rewrites")


def parse_options(level: Any = "O2", config: Mapping[str, Any] | None = None) -> OptimizeOptions:
    """Validate ``level`` and ``config`` (:class:`OptimizeConfig`).

    Raises:
        ConfigError: HYB-101 for an unknown key (naming the valid ones), HYB-102 for a bad value,
            HYB-103 for a bad ``fold_size_limit``.
    """
    name = _level(level)
    try:
        given = OptimizeConfig.model_validate(dict(config) if isinstance(config, Mapping) else
                                              {} if config is None else config)
    except ValidationError as e:
        raise config_error(e, OptimizeConfig, "optimize") from None
    switches = given.graph_optimization
    disabled = {p for key, passes in GRAPH_OPTIMIZATION.items() if not getattr(switches, key) for p in passes}
    disabled.update(given.disabled_passes)
    if given.layout == "NHWC" and "convert_layout" not in LEVELS[name]:
        raise ConfigError("HYB-102", f"optimize config 'layout': 'NHWC' is applied at level O3, the level "
                          f"given is {name}", "call hybrid.optimize(model, level='O3', config={'layout': 'NHWC'})")
    dynamic = given.dynamic_batch
    dynamic_name = dynamic if isinstance(dynamic, str) else "N" if dynamic else None
    return OptimizeOptions(name, frozenset(disabled), given.layout, dynamic_name, given.fold_size_limit,
                           given.verify, given.max_iterations)


def build_passes(options: OptimizeOptions) -> list[Pass]:
    """The level's pass list with the disabled passes left out."""
    return [_FACTORIES[name](options) for name in LEVELS[options.level] if name not in options.disabled]


def optimize(model_or_path: Any, level: str | int = "O2", config: Mapping[str, Any] | None = None) -> Model:
    """Optimize a model; the input is never modified.

    Args:
        model_or_path: Anything ``hybrid.Model.load`` takes (path, bytes, ModelProto, onnx_ir.Model, Model).
        level: 'O0', 'O1', 'O2' (default) or 'O3'.
        config: Optional keys: ``graph_optimization`` (switches ``constant_folding``, ``operator_fusion``,
            ``common_subexpression_elimination``, ``dead_code_elimination``, ``transpose_optimization``,
            ``algebraic_simplification``; False leaves those passes out), ``layout`` ('NCHW' or 'NHWC',
            the latter at O3), ``dynamic_batch`` (True or the batch dimension's name), ``fold_size_limit``
            (bytes or '64MB': the largest tensor constant folding may create), ``disabled_passes`` (pass
            names), ``verify`` (check the graph after every pass; default: ``HYBRID_VERIFY_PASSES``),
            ``max_iterations`` (fixpoint cap, default 10).

    Returns:
        A new ``hybrid.Model``.

    Raises:
        ConfigError: HYB-101 / HYB-102 / HYB-103 for a bad level or config.
        ModelError: HYB-2xx when the model cannot be loaded, HYB-208 naming a pass that failed,
            HYB-209 when ``dynamic_batch`` is asked for and a node pins the batch.
    """
    options = parse_options(level, config)
    source = Model.load(model_or_path)
    work = working_copy(source.ir)
    if options.dynamic_batch is not None:
        PassManager([MakeBatchDynamic(options.dynamic_batch)], 1, options.verify)(work)
    passes = build_passes(options)
    if passes:
        PassManager(passes, options.max_iterations, options.verify)(work)
    return Model(work, base_dir=source.base_dir, name=source.name)
