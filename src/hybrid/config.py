"""Runtime configuration state, validation and size parsing (behind ``hybrid.init``).

The configuration is a small validated tree: every section is a pydantic model (:class:`InitSettings`,
:class:`MemoryPoolSettings`, :class:`AutotuneSettings`) and :func:`config_error` turns what pydantic
finds into the one error form: unknown keys are rejected with HYB-101 naming the key and the valid
ones; bad values with HYB-102 saying what was expected and what was found; sizes such as ``'4GB'`` are
parsed by :func:`parse_size` (HYB-103; K/M/G/T are powers of 1024, as in PyTorch's and OpenVINO's size
settings); log levels by :func:`log_level_value` (HYB-104).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hybrid.errors import ConfigError

__all__ = [
    "AutotuneSettings",
    "ConfigSection",
    "InitSettings",
    "MemoryPoolSettings",
    "RuntimeConfig",
    "autotune_config",
    "backend_sections",
    "config_error",
    "expect_mapping",
    "get_config",
    "log_level_value",
    "parse_size",
    "pool_sizes",
    "reset",
    "set_log_level",
    "update_backend_options",
    "validated_update",
]

logger = logging.getLogger("hybrid")

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

POOL_DEVICES = ("cpu", "pinned", "gpu", "npu")


def _field_at(model: type[BaseModel], path: list[str]) -> tuple[str, Any]:
    """The name and FieldInfo that ``path`` (a pydantic error location) falls under, or ('', None).

    That is the deepest model field on the path; a key inside a mapping field belongs to that field.
    """
    name, field = "", None
    current: type[BaseModel] | None = model
    for part in path:
        if current is None:
            break
        name, field = part, current.model_fields.get(part)
        if field is None:
            return "", None
        ann = field.annotation
        current = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return name, field


def _model_at(model: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    """The section model at ``path`` (``[]``: ``model`` itself), or None when the path leaves the models."""
    current = model
    for part in path:
        field = current.model_fields.get(part)
        ann = field.annotation if field is not None else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        current = ann
    return current


def config_error(error: ValidationError, model: type[BaseModel], section: str = "",
                 hint: str | None = None) -> ConfigError:
    """The ConfigError for the first problem pydantic found validating a configuration section.

    An unknown key (``extra='forbid'``) is HYB-101 naming the key and the valid ones; anything else is
    HYB-102 ``"<key>: expected <what>, got <value>"``, ``<what>`` being the field's ``description`` when it
    has one, else pydantic's wording.

    Args:
        error: What ``model.model_validate`` raised.
        model: The section's model (its fields name the valid keys and describe the values).
        section: The dotted name of the section ('' for the top level), put before every key.
        hint: How to fix it; default: the field's first example, as ``key=example``.
    """
    errors = error.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])  # unknown keys first
    path = [str(p) for p in err["loc"] if p != "[key]"]
    where = ".".join([section, *path] if section else path) or section
    if err["type"] == "extra_forbidden":
        parent = _model_at(model, path[:-1])
        valid = sorted(parent.model_fields) if parent is not None else []
        return ConfigError("HYB-101", f"unknown configuration key {where!r}; valid keys: {', '.join(valid)}",
                           "check the spelling of the key")
    name, field = _field_at(model, path)
    if field is not None and field.description:
        expected = field.description
    elif err["type"] in ("model_type", "dict_type", "model_attributes_type"):
        expected = "a mapping"
    else:
        expected = err["msg"].removeprefix("Input should be ").removeprefix("input should be ")
    if hint is None and field is not None and field.examples:
        hint = f"e.g. {name}={field.examples[0]!r}"
    elif hint is None and not path:
        hint = f"pass a dict of {', '.join(model.model_fields)}"
    return ConfigError("HYB-102", f"{where}: expected {expected}, got {err.get('input')!r}", hint)


class ConfigSection(BaseModel):
    """Base of a settings object built from user input (serving, connection limits).

    It is frozen and strict, refuses unknown keys, and a bad value raises :func:`config_error`'s
    ConfigError (HYB-101/102) on construction rather than pydantic's ValidationError.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _as_config_error(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        try:
            return handler(data)
        except ValidationError as e:
            raise config_error(e, cls) from None


class AutotuneSettings(BaseModel):
    """``hybrid.init({'autotune': {...}})``: how ``target='auto'`` decides (docs/auto.md).

    Attributes:
        tie_rel, tie_us: Timings this close to the fastest (relative, microseconds) tie; the tie goes to
            the answer closest to the reference.
        online: With nothing declared about a dynamic-shape model's inputs, tune on real calls per
            shape bucket (False: decide once on generated samples).
        calls_per_bucket: Calls each turn of online tuning times, at the serving candidate's speed.
        overhead_cap: Share of the wall time the background checks of online tuning may run, in CPU time
            (they are paced to it); None: ``max_tax`` (while it runs, the check can slow callers that keep every
            core busy up to twice: :class:`hybrid.runtime.auto.TuningPolicy`).
        rtol: Model-level relative tolerance of the fp32 parity check (ONNX's model tests use 1e-3).
        check_process: Run online tuning's checks in a separate low-priority process (False: in a thread).
        decide_within_s: Online tuning decides a shape bucket at most this long after its first call (or
            after 200 calls of a slow model).
        max_tax: The mean latency the turns of online tuning may add while a bucket is tuned (0.1: 10 %).
        confidence: Confidence of the sequential test that compares candidates on paired turns.
        recheck_after_s: A decided bucket's tied runners-up take turns again this long later (then twice as
            long after each re-check).
        layouts: Let the ways each backend can run (replicas x threads, a throughput hint) race where callers run
            concurrently (False: every backend runs in its default layout).
        replica_memory_mb: The weights the extra replicas of a layout may hold in all, in MB (each replica holds
            its own copy): a layout whose replicas would hold more is not tried.
        time_budget_s: Measuring time per candidate when a model is timed at compile (declared, sample or static
            shapes).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    tie_rel: float = Field(0.02, ge=0.0, lt=1.0)
    tie_us: float = Field(20.0, ge=0.0, lt=1e6)
    online: bool = True
    calls_per_bucket: int = Field(8, ge=2, le=10_000)
    overhead_cap: float | None = Field(None, gt=0.0, le=1.0)
    rtol: float = Field(1e-3, ge=0.0, lt=1.0)
    check_process: bool = True
    decide_within_s: float = Field(30.0, gt=0.0, le=86_400.0)
    max_tax: float = Field(0.1, gt=0.0, le=10.0)
    confidence: float = Field(0.9, gt=0.0, lt=1.0)
    recheck_after_s: float = Field(60.0, gt=0.0, le=86_400.0)
    layouts: bool = True
    replica_memory_mb: float = Field(2048.0, ge=0.0, le=1e7)
    time_budget_s: float = Field(1.0, gt=0.0, le=600.0)


AUTOTUNE_KEYS = tuple(AutotuneSettings.model_fields)


def autotune_settings(values: Mapping[str, Any]) -> AutotuneSettings:
    """Validate an ``autotune`` section.

    Raises:
        ConfigError: HYB-101 for an unknown key, HYB-102 for a value of the wrong type or range.
    """
    fields = AutotuneSettings.model_fields
    try:
        return AutotuneSettings.model_validate({
            k: float(v) if isinstance(v, int) and not isinstance(v, bool) and k in fields and
            fields[k].annotation is float else v for k, v in values.items()})
    except ValidationError as e:
        raise config_error(e, AutotuneSettings, "autotune", "e.g. hybrid.init({'autotune': {'tie_rel': 0.02, "
                           "'tie_us': 20, 'online': True}})") from None


FALLBACK_POLICIES = ("warn", "error")
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse_size(value: int | str, key: str = "size") -> int:
    """Parse a byte size: an int, or a string like ``'512MB'``, ``'4GB'``, ``'1.5GiB'``.

    Raises:
        ConfigError: HYB-103 when the value is not a size.
    """
    fix = "use an int byte count or a number with K, M, G or T (powers of 1024)"
    if isinstance(value, bool):
        raise ConfigError("HYB-103", f"{key}: expected a size like '4GB' or a byte count, got {value!r}", fix)
    if isinstance(value, int):
        if value < 0:
            raise ConfigError("HYB-103", f"{key}: expected a non-negative size, got {value}", fix)
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = (m.group(2) or "").lower().replace("i", "").rstrip("b")
            return int(float(m.group(1)) * _UNITS[unit])
    raise ConfigError("HYB-103", f"{key}: expected a size like '512MB' or '4GB', got {value!r}", fix)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class MemoryPoolSettings(_Section):
    """``hybrid.init({'memory_pool': {...}})``: bytes reserved per device kind.

    Sizes are read as :func:`parse_size` reads them: an int or ``'2GB'``.
    """

    cpu: int | None = None
    pinned: int | None = None
    gpu: int | None = None
    npu: int | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _size(cls, value: Any, info: ValidationInfo) -> int:
        return parse_size(value, f"memory_pool.{info.field_name}")  # HYB-103 names the key


def pool_sizes(values: Mapping[str, Any]) -> dict[str, int]:
    """A ``memory_pool`` section checked (:class:`MemoryPoolSettings`): device kind -> bytes, as given.

    Raises:
        ConfigError: HYB-101 for an unknown kind, HYB-102 when it is not a mapping, HYB-103 for a bad size.
    """
    try:
        return MemoryPoolSettings.model_validate(_plain_mapping(values)).model_dump(exclude_unset=True)
    except ValidationError as e:
        raise config_error(e, MemoryPoolSettings, "memory_pool", "e.g. {'cpu': '2GB'}") from None


def _plain_mapping(value: Any) -> Any:
    """Any Mapping as a dict (pydantic's dict fields take dicts only), other values as they are."""
    return dict(value) if isinstance(value, Mapping) and not isinstance(value, dict) else value


class InitSettings(_Section):
    """The keys of ``hybrid.init``. Only the keys given are applied; the others keep their value.

    Attributes:
        log_level: Level of the ``hybrid`` logger.
        device_fallback: 'warn' or 'error' when a target's device is missing.
        memory_pool: Bytes reserved per device kind.
        backends: Options per backend (checked by the backend's declared options, as ``set_backend`` does).
        cache_dir: Folder of hybrid's caches.
        num_threads: Threads per backend session.
        autotune: The ``target='auto'`` settings (:class:`AutotuneSettings`; merged with the current ones).
    """

    log_level: int = Field(default=logging.WARNING, examples=["INFO"])
    device_fallback: Literal["warn", "error"] = Field(default="warn", description=f"one of {FALLBACK_POLICIES}",
                                                      examples=["warn"])
    memory_pool: MemoryPoolSettings = Field(default_factory=MemoryPoolSettings, description="a mapping",
                                            examples=[{"cpu": "2GB"}])
    backends: dict[str, dict[str, Any]] = Field(default_factory=dict, description="a mapping",
                                                examples=[{"onnxruntime": {"intra_op_num_threads": 2}}])
    cache_dir: str | None = Field(default=None, description="a path string", examples=["~/.cache/hybrid"])
    num_threads: int | None = Field(default=None, ge=1, description="a positive int", examples=[4])
    autotune: dict[str, Any] = Field(default_factory=dict, description="a mapping",
                                     examples=[{"tie_rel": 0.02, "online": True}])

    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, value: Any) -> int:
        return log_level_value(value)  # HYB-104

    @field_validator("memory_pool", "autotune", mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        return _plain_mapping(value)

    @field_validator("backends", mode="before")
    @classmethod
    def _backends(cls, value: Any) -> Any:
        value = _plain_mapping(value)
        if isinstance(value, dict):  # {name: None} is {name: {}}, as set_backend(name) is
            value = {name: {} if opts is None else _plain_mapping(opts) for name, opts in value.items()}
        return value

    @field_validator("cache_dir", "num_threads", mode="before")
    @classmethod
    def _given(cls, value: Any) -> Any:
        if value is None:  # given as None: a value was expected (None is only the unset default)
            raise ValueError("None")
        return value


def init_settings(values: Mapping[str, Any]) -> InitSettings:
    """Validate the keys given to ``hybrid.init`` (``model_fields_set``: the ones given).

    Raises:
        ConfigError: HYB-101 for an unknown key, HYB-102 for a bad value, HYB-103 for a bad size,
            HYB-104 for a bad log level.
    """
    try:
        return InitSettings.model_validate(dict(values))
    except ValidationError as e:
        raise config_error(e, InitSettings) from None


def backend_sections(value: Any) -> dict[str, dict[str, Any]]:
    """``{backend: {option: value}}`` checked for shape (the options themselves are the backends' to check).

    Raises:
        ConfigError: HYB-102 when ``value`` is not a mapping of mappings.
    """
    try:
        settings = InitSettings.model_validate({"backends": value})
    except ValidationError as e:
        raise config_error(e, InitSettings, hint="e.g. {'onnxruntime': {'intra_op_num_threads': 2}}") from None
    return {name: dict(opts) for name, opts in settings.backends.items()}


@dataclass(slots=True)
class RuntimeConfig:
    """The process-wide configuration set by :func:`init` and :func:`set_backend`."""

    device_fallback: str = "warn"
    memory_pool: dict[str, int] = field(default_factory=dict)
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_dir: str | None = None
    num_threads: int | None = None
    autotune: dict[str, Any] = field(default_factory=dict)  # validated by AutotuneSettings, as given


_LOCK = threading.Lock()
_CONFIG = RuntimeConfig()


def autotune_config() -> AutotuneSettings:
    """The live ``autotune`` settings with their defaults filled in."""
    return AutotuneSettings(**_CONFIG.autotune)


def get_config() -> RuntimeConfig:
    """Return the live process-wide configuration (read it, do not mutate it)."""
    return _CONFIG


def reset(config: RuntimeConfig | None = None) -> None:
    """Restore ``config`` (default: the default configuration); used by tests and failed inits."""
    global _CONFIG
    with _LOCK:
        _CONFIG = config if config is not None else RuntimeConfig()


def expect_mapping(key: str, value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping (the argument of ``init``, ``set_backend``, ``compile(config=)``).

    Raises:
        ConfigError: HYB-102 otherwise.
    """
    if not isinstance(value, Mapping):
        raise ConfigError("HYB-102", f"{key}: expected a mapping, got {type(value).__name__}",
                          f"pass {key} as a dict")
    return value


def validated_update(merged: Mapping[str, Any],
                     backend_validator: Any = None) -> RuntimeConfig:
    """Validate an ``init`` mapping (:class:`InitSettings`) and install the resulting configuration.

    Args:
        merged: The keys given to ``hybrid.init``.
        backend_validator: ``fn(name, options) -> dict`` that checks one backend's options (the HAL's,
            passed in by the caller so that this module imports nothing above it).

    Raises:
        ConfigError: HYB-101 for an unknown key, HYB-102 for a bad value, HYB-103 for a bad size,
            HYB-104 for a bad log level.
    """
    given = init_settings(merged)
    keys = given.model_fields_set
    global _CONFIG
    with _LOCK:
        new = RuntimeConfig(
            device_fallback=_CONFIG.device_fallback,
            memory_pool=dict(_CONFIG.memory_pool),
            backends={k: dict(v) for k, v in _CONFIG.backends.items()},
            cache_dir=_CONFIG.cache_dir,
            num_threads=_CONFIG.num_threads,
            autotune=dict(_CONFIG.autotune),
        )
        if "device_fallback" in keys:
            new.device_fallback = given.device_fallback
        if "memory_pool" in keys:
            new.memory_pool = given.memory_pool.model_dump(exclude_unset=True)
        if "backends" in keys:
            for name, opts in given.backends.items():
                new.backends[name] = backend_validator(name, opts) if backend_validator else dict(opts)
        if "cache_dir" in keys:
            new.cache_dir = given.cache_dir
        if "num_threads" in keys:
            new.num_threads = given.num_threads
        if "autotune" in keys:
            tune = {**new.autotune, **given.autotune}
            new.autotune = autotune_settings(tune).model_dump(include=set(tune))
        if "log_level" in keys:
            set_log_level(given.log_level)
        _CONFIG = new
    return new


def update_backend_options(name: str, options: Mapping[str, Any]) -> None:
    """Merge already validated options into one backend's defaults."""
    with _LOCK:
        _CONFIG.backends[name] = {**_CONFIG.backends.get(name, {}), **options}


def log_level_value(level: Any) -> int:
    """The logging level of 'DEBUG', 'INFO', ... (any case) or a logging int.

    Raises:
        ConfigError: HYB-104 for an unknown level.
    """
    if isinstance(level, str) and level.upper() in _LEVELS:
        return getattr(logging, level.upper())
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    raise ConfigError("HYB-104", f"log level: expected one of {', '.join(_LEVELS)} or an int, got {level!r}",
                      "e.g. hybrid.set_log_level('INFO')")


def set_log_level(level: str | int) -> None:
    """Set the level of the ``hybrid`` logger ('DEBUG', 'INFO', ... or a logging int).

    Raises:
        ConfigError: HYB-104 for an unknown level.
    """
    logger.setLevel(log_level_value(level))
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s hybrid: %(message)s"))
        logger.addHandler(handler)
