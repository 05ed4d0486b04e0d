"""``manifest.json``: the bundle's table of contents, a versioned and validated schema.

The manifest names every other member with its sha256 and size, the model and its signature, the
platform profile the bundle was made for, the compile choice and the compiled caches per device
fingerprint, optional calibration data and vendored wheels. It is parsed with ``json`` only (no
pickle, no YAML tags) and validated strictly; a newer major format version is refused with HYB-506.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hybrid.bundle.platforms import PlatformProfile, json_safe
from hybrid.bundle.safety import check_member_name
from hybrid.errors import BundleError, HybridError
from hybrid.vision.spec import Postprocess, Preprocess

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "CacheEntry",
    "CalibrationEntry",
    "CompileEntry",
    "LibsEntry",
    "LockEntry",
    "Manifest",
    "MemberEntry",
    "ModelEntry",
    "ShapeRangeEntry",
    "TensorEntry",
    "cache_folder",
    "parse_manifest",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"

_SHA256 = r"^[0-9a-f]{64}$"
_Precision = Literal["fp32", "fp16", "bf16"]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class MemberEntry(_Strict):
    """One member's digest and uncompressed size."""

    sha256: str = Field(pattern=_SHA256)
    size: int = Field(ge=0)


class TensorEntry(_Strict):
    """An input or output of the model (see ``hybrid.TensorSpec``); dtype as numpy names it."""

    name: str = Field(max_length=4096)
    dtype: str | None = Field(default=None, max_length=64)
    shape: list[int | str] | None = None
    kind: Literal["tensor", "sequence", "optional", "map"] = "tensor"


_Dims = list[Annotated[int, Field(ge=0)]]


class ShapeRangeEntry(_Strict):
    """A dynamic input's range, trtexec's spelling: the smallest, typical and largest shape run."""

    min: _Dims
    opt: _Dims
    max: _Dims

    @model_validator(mode="after")
    def _one_rank(self) -> ShapeRangeEntry:
        if not len(self.min) == len(self.opt) == len(self.max):
            raise ValueError(f"min, opt and max have ranks {len(self.min)}, {len(self.opt)}, {len(self.max)}; "
                             "they must be equal")
        return self


class ModelEntry(_Strict):
    """The IR: ``model/model.onnx`` and the external-data members its tensors point to."""

    path: str
    sha256: str = Field(pattern=_SHA256, description="sha256 of the whole serialized model (IR identity)")
    opset: int = Field(ge=1)
    external_data: list[str] = Field(default_factory=list)
    inputs: list[TensorEntry]
    outputs: list[TensorEntry]
    # 'NHWC': the image inputs (and image outputs) were made channels-last on request (`--layout nhwc`);
    # None: the interface is the source model's
    layout: Literal["NHWC"] | None = None


class CompileEntry(_Strict):
    """How the bundled caches were compiled: a backend and device, a precision, backend options."""

    backend: str = Field(max_length=64)
    device: str = Field(max_length=64)
    precision: _Precision = "fp32"
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("options")
    @classmethod
    def _check_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        return json_safe(value)


def cache_folder(fingerprint: str, backend: str) -> str:
    """The bundle folder of one compiled cache: ``platforms/<fingerprint>/<backend>/``."""
    return f"platforms/{fingerprint}/{backend}/"


class CacheEntry(CompileEntry):
    """A compiled artifact for one device fingerprint, under ``platforms/<fingerprint>/<backend>/``."""

    fingerprint: str = Field(pattern=r"^[0-9a-f]{16}$")
    fingerprint_info: dict[str, Any] = Field(default_factory=dict)
    kind: Literal["optimized-model", "directory"]
    files: list[str] = Field(min_length=1)

    @property
    def folder(self) -> str:
        """The bundle folder every file of this cache lies in, with a trailing '/'."""
        return cache_folder(self.fingerprint, self.backend)

    @model_validator(mode="after")
    def _files_in_folder(self) -> CacheEntry:
        for name in self.files:
            if not name.startswith(self.folder):
                raise ValueError(f"cache file {name!r} is not under {self.folder!r}")
        return self


class CalibrationEntry(_Strict):
    """Calibration samples: an npz whose arrays are stored under plain keys (name -> key)."""

    path: str
    arrays: dict[str, str]


class LockEntry(_Strict):
    """One vendored wheel: the lock list that ``pyasc bundle install-libs`` installs with hash checks."""

    file: str = Field(pattern=r"^libs/[A-Za-z0-9_][A-Za-z0-9._+-]*\.whl$")
    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
    version: str = Field(pattern=r"^[A-Za-z0-9.+!_-]{1,64}$")
    sha256: str = Field(pattern=_SHA256)
    size: int = Field(ge=0)


class LibsEntry(_Strict):
    """Wheels for the target platform (``--include-libs``)."""

    platform: str
    pip_platforms: list[str]
    python_version: str = Field(pattern=r"^3\.\d+$")
    wheels: list[LockEntry]
    targets: list[str] = Field(default_factory=list, description="the platform's targets the wheels give, by name")


class ServingEntry(_Strict):
    """Dynamic-batching settings ``pyasc serve`` applies to this model (docs/serving.md).

    Keys left out keep the server's defaults or its command-line values.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)

    max_batch: int | None = Field(default=None, ge=0, le=4096)
    batch_timeout: float | None = Field(default=None, ge=0, le=60)
    max_queue: int | None = Field(default=None, ge=1)
    request_timeout: float | None = Field(default=None, gt=0)
    concurrency: int | None = Field(default=None, ge=1, le=64)


class Manifest(_Strict):
    """The whole manifest (format version 1)."""

    format: Literal["hybrid-bundle"] = "hybrid-bundle"
    format_version: int = FORMAT_VERSION
    created_by: str
    created_at: str
    name: str = Field(max_length=256)
    task: str | None = Field(default=None, max_length=256)
    preprocess: Preprocess | None = None  # vision tasks: frames -> input (hybrid.vision.spec)
    postprocess: Postprocess | None = None  # vision tasks: output -> detections / labels
    serving: ServingEntry | None = None  # dynamic batching under `pyasc serve`
    shapes: dict[str, _Dims | ShapeRangeEntry] | None = None  # the shapes users run (`bundle create --shapes`)
    model: ModelEntry
    platform: PlatformProfile
    optimize_level: str | None = Field(default=None, pattern=r"^O[0-3]$")
    optimized: bool = False
    compile: CompileEntry | None = None
    caches: list[CacheEntry] = Field(default_factory=list)
    calibration: CalibrationEntry | None = None
    libs: LibsEntry | None = None
    # what the bundle cannot give its platform, or changed on request, as said when it was created
    warnings: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=64)
    members: dict[str, MemberEntry]

    def declared_shapes(self) -> dict[str, Any] | None:
        """``shapes`` as ``hybrid.compile(shapes=...)`` takes them: tuples, or min/opt/max tuples for a range.

        None when the bundle declares none (it was created without ``--shapes``).
        """
        if not self.shapes:
            return None
        return {name: tuple(v) if isinstance(v, list) else {"min": tuple(v.min), "opt": tuple(v.opt),
                                                              "max": tuple(v.max)}
                for name, v in self.shapes.items()}

    @model_validator(mode="after")
    def _references_are_members(self) -> Manifest:
        for name in self.members:
            check_member_name(name, MANIFEST_NAME)
        if MANIFEST_NAME in self.members:
            raise ValueError("the manifest cannot list itself")
        inputs = {t.name: t for t in self.model.inputs}
        for name, value in (self.shapes or {}).items():
            if name not in inputs:
                raise ValueError(f"shapes names {name!r}, which is not an input of the model")
            shape = inputs[name].shape
            rank = len(value.opt if isinstance(value, ShapeRangeEntry) else value)
            if shape is not None and rank != len(shape):
                raise ValueError(f"shapes[{name!r}] has rank {rank}, the input has rank {len(shape)}")
        refs = [self.model.path, *self.model.external_data]
        refs += [f for c in self.caches for f in c.files]
        refs += [self.calibration.path] if self.calibration else []
        refs += [w.file for w in self.libs.wheels] if self.libs else []
        for ref in refs:
            if ref not in self.members:
                raise ValueError(f"{ref!r} is referenced but not listed in members")
        if self.libs:
            for w in self.libs.wheels:
                if self.members[w.file].sha256 != w.sha256:
                    raise ValueError(f"lock entry {w.file!r} and members disagree on its sha256")
        return self

    def to_json(self) -> bytes:
        """The manifest as JSON bytes (sorted keys), as stored in the bundle."""
        return json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True).encode("utf-8")


def parse_manifest(data: bytes, where: str) -> Manifest:
    """Parse and validate manifest bytes.

    Raises:
        BundleError: HYB-502 when it is not JSON or fails the schema, HYB-506 for a newer format.
    """
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BundleError("HYB-502", f"{where}: manifest.json is not UTF-8 JSON ({type(e).__name__}: "
                          f"{str(e)[:200]})", "the bundle is damaged; rebuild it") from e
    if not isinstance(doc, dict):
        raise BundleError("HYB-502", f"{where}: manifest.json must be a JSON object, found "
                          f"{type(doc).__name__}", "the bundle is damaged; rebuild it")
    version = doc.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise BundleError("HYB-506", f"{where}: bundle format version {version}, this hybrid reads up to "
                          f"{FORMAT_VERSION}", "upgrade pyasc: pip install -U pyasc")
    try:
        return Manifest.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or "manifest"
        raise BundleError("HYB-502", f"{where}: manifest.json fails its schema at {loc}: "
                          f"{str(first.get('msg', 'invalid'))[:300]}", "the bundle is damaged; rebuild it") from e
    except (HybridError, RecursionError, ValueError) as e:
        if isinstance(e, BundleError):
            raise
        raise BundleError("HYB-502", f"{where}: manifest.json is invalid: {e}",
                          "the bundle is damaged; rebuild it") from e
