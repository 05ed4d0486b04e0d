"""Platform profiles: what a deployment target prefers (backends, precision, layout, compile options).

Built-in profiles cover the article's platforms; users add their own in a TOML file::

    [platforms.my-board]
    base = "arm64"                      # start from a built-in (or an earlier profile in the file)
    description = "RK3588 with 8 GB"
    targets = ["onnxruntime:cpu", "reference"]
    precision = "fp16"
    [platforms.my-board.backend_options.onnxruntime]
    intra_op_num_threads = 4

``pyasc platforms`` lists them. Only x86-64 is verified on this project's machines; the Jetson, NVIDIA
GPU and Ascend profiles are written against the vendors' documented setups (JetPack 5/6, CANN).

:data:`RUNTIME_PACKAGES` says which pip distributions give each target, so that ``--include-libs`` can
tell which of a profile's targets its vendored wheels give the platform (a profile's ``runtimes``
overrides or extends it).
"""

from __future__ import annotations

import logging
import os
import platform as _platform
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hybrid.errors import BundleError, ConfigError, HybridError
from hybrid.hal import backend_status

__all__ = [
    "BUILTIN_PLATFORMS",
    "RUNTIME_PACKAGES",
    "PlatformProfile",
    "detect_platform",
    "get_platform",
    "json_safe",
    "list_platforms",
    "load_platforms_file",
    "machine_arch",
]

logger = logging.getLogger("hybrid")

PLATFORMS_ENV = "HYBRID_PLATFORMS"
_PACKAGE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")


def json_safe(value: Any, depth: int = 0) -> Any:
    """Return ``value`` if it is plain JSON (str keys, at most 8 levels deep), else raise ValueError."""
    if depth > 8:
        raise ValueError("options nest deeper than 8 levels")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [json_safe(v, depth + 1) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("option keys must be strings")
        return {k: json_safe(v, depth + 1) for k, v in value.items()}
    raise ValueError(f"option value {value!r} is not a JSON value")


class PlatformProfile(BaseModel):
    """One deployment platform.

    Attributes:
        name: Profile name ('jetson-xavier').
        description: One line for ``pyasc platforms``.
        os, arch: Operating system and CPU architecture of the target ('linux', 'aarch64').
        glibc: The target's glibc version; wheels for ``--include-libs`` must be manylinux <= this.
        python: The platform's own Python 'X.Y' where it is known (JetPack 5: 3.8), None where it is not.
            ``--include-libs`` fetches wheels for it when hybrid runs on it, else for the Python creating
            the bundle, and warns when the two differ.
        targets: Backend priority as hybrid targets, best first; the first one available is used.
        precision: Default precision ('fp16' on Jetson).
        layout: Preferred activation layout ('NHWC' on Ascend), applied by the layout pass at O3.
        backend_options: Compile options per backend (``hybrid.set_backend(name, config=...)``).
        compile_options: Vendor compile options kept verbatim (the article's ``ascend_config``).
        wheels: Runtime packages ``--include-libs`` vendors besides hybrid and its dependencies.
        runtimes: Per target, the distributions that give it (over :data:`RUNTIME_PACKAGES`): each entry
            one package needed, ``a|b`` for alternatives; ``[]``: nothing beyond hybrid.
        runtime_note: Where the platform's accelerator runtimes come from when PyPI has no wheel of them
            (JetPack, CANN); said when the vendored wheels lack them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    description: str = ""
    os: Literal["linux", "windows", "darwin"] = "linux"
    arch: Literal["x86_64", "aarch64"]
    glibc: str | None = Field(default="2.28", pattern=r"^\d+\.\d+$")
    python: str | None = Field(default=None, pattern=r"^3\.\d+$")
    targets: list[str] = Field(min_length=1)
    precision: Literal["fp32", "fp16", "bf16"] = "fp32"
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    backend_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    compile_options: dict[str, Any] = Field(default_factory=dict)
    wheels: list[str] = Field(default_factory=list)
    runtimes: dict[str, list[str]] = Field(default_factory=dict)
    runtime_note: str = ""

    @field_validator("backend_options", "compile_options")
    @classmethod
    def _check_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        return json_safe(value)

    @field_validator("targets")
    @classmethod
    def _check_targets(cls, value: list[str]) -> list[str]:
        for t in value:
            if not t or len(t) > 64 or not all(c.isalnum() or c in ":_-." for c in t):
                raise ValueError(f"target {t!r} is not a hybrid target such as 'onnxruntime:cpu'")
        return value

    @field_validator("runtimes")
    @classmethod
    def _check_runtimes(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for target, packages in value.items():
            for package in packages:
                if not all(_PACKAGE.match(p) for p in package.split("|")):
                    raise ValueError(f"runtimes[{target!r}]: {package!r} is not a package name (or 'a|b')")
        return value

    def runtime_requirements(self, target: str) -> list[str] | None:
        """The packages ``target`` needs (``a|b``: either), or None when neither table names it."""
        if target in self.runtimes:
            return list(self.runtimes[target])
        known = RUNTIME_PACKAGES.get(target)
        return None if known is None else list(known)

    def options_for(self, backend: str) -> dict[str, Any]:
        """The profile's compile options for one backend."""
        return dict(self.backend_options.get(backend, {}))

    @property
    def pip_platforms(self) -> list[str]:
        """Pip ``--platform`` tags for this target: every manylinux level up to its glibc."""
        if self.os != "linux":
            raise ConfigError("HYB-102", f"platform {self.name!r}: --include-libs supports linux targets, got "
                              f"{self.os!r}", "vendor the wheels yourself for other systems")
        major, minor = (int(x) for x in (self.glibc or "2.17").split("."))
        tags = [f"manylinux_{major}_{m}_{self.arch}" for m in range(minor, 16, -1)]
        return [*tags, f"manylinux2014_{self.arch}"]


# Which pip distributions give a target, by name (a wheel's contents are not opened). One entry per package
# needed, 'a|b' for alternatives; () for what hybrid itself gives. TensorRT's device buffers are torch's.
RUNTIME_PACKAGES: dict[str, tuple[str, ...]] = {
    "reference": (),
    "onnxruntime:cpu": ("onnxruntime|onnxruntime-gpu|onnxruntime-openvino|onnxruntime-cann",),
    "onnxruntime:cuda": ("onnxruntime-gpu",),
    "onnxruntime:npu": ("onnxruntime-cann",),
    "openvino:cpu": ("openvino",),
    "openvino:gpu": ("openvino",),
    "openvino:npu": ("openvino",),
    "torch:cpu": ("torch",),
    "torch:cuda": ("torch",),
    "torch:npu": ("torch", "torch-npu"),
    "tensorrt:cuda": ("tensorrt", "torch"),
}

_JETSON_RUNTIMES = ("JetPack installs CUDA, cuDNN and TensorRT with Python bindings for its own Python; "
                    "onnxruntime-gpu and torch for Jetson are NVIDIA's wheels (Jetson Zoo), not on PyPI: "
                    "add them with --wheel FILE, or install them on the device")
_ASCEND_RUNTIMES = ("the CANN toolkit installs the NPU driver and runtime; onnxruntime-cann and torch-npu "
                    "must match its version: name them with --requirement, or install them on the device")

_TRT_SEED = {"fp16_mode": True, "max_workspace_size": 1 << 30}  # the article's set_backend('tensorrt', ...)
_ORT_TRT = {"tensorrt": True, "fp16": True, "max_workspace_size": 1 << 30}
_ASCEND_CONFIG = {"aoe_mode": "subgraph", "precision_mode": "force_fp16"}  # the article's ascend_config
_CUDA_TARGETS = ["tensorrt:cuda", "onnxruntime:cuda", "torch:cuda", "onnxruntime:cpu", "reference"]


def _jetson(name: str, description: str, glibc: str, python: str) -> PlatformProfile:
    """A Jetson generation: what differs between them is the JetPack's system (glibc) and Python."""
    return PlatformProfile(name=name, description=description, arch="aarch64", glibc=glibc, python=python,
                           targets=list(_CUDA_TARGETS), precision="fp16",
                           backend_options={"tensorrt": dict(_TRT_SEED), "onnxruntime": dict(_ORT_TRT)},
                           wheels=["onnxruntime"], runtime_note=_JETSON_RUNTIMES)


def _ascend(name: str, description: str, arch: str, glibc: str) -> PlatformProfile:
    """An Ascend NPU: the cards differ in their host (arch, glibc); CANN, targets and options are the same."""
    return PlatformProfile(name=name, description=description, arch=arch, glibc=glibc,
                           targets=["onnxruntime:npu", "torch:npu", "onnxruntime:cpu", "reference"],
                           precision="fp16", layout="NHWC",
                           backend_options={"onnxruntime": {"precision_mode": "force_fp16"}},
                           compile_options=dict(_ASCEND_CONFIG), wheels=["onnxruntime"], runtime_note=_ASCEND_RUNTIMES)


BUILTIN_PLATFORMS: dict[str, PlatformProfile] = {p.name: p for p in (
    PlatformProfile(name="x86-64", description="x86-64 CPU server or PC (oneDNN/MLAS through ORT, OpenVINO)",
                    arch="x86_64", glibc="2.28", targets=["onnxruntime:cpu", "openvino:cpu", "reference"],
                    wheels=["onnxruntime", "openvino"]),
    PlatformProfile(name="arm64", description="64-bit ARM CPU (Graviton, Ampere, Raspberry Pi 5)",
                    arch="aarch64", glibc="2.28", targets=["onnxruntime:cpu", "openvino:cpu", "reference"],
                    wheels=["onnxruntime"]),
    _jetson("jetson-xavier", "NVIDIA Jetson AGX/NX Xavier, JetPack 5 (CUDA 11.4, TRT 8.5)", glibc="2.31",
            python="3.8"),
    _jetson("jetson-orin", "NVIDIA Jetson AGX/NX/Nano Orin, JetPack 6 (CUDA 12, TRT 8.6+)", glibc="2.35",
            python="3.10"),
    PlatformProfile(name="nvidia-gpu", description="x86-64 server with an NVIDIA GPU (CUDA 12, TensorRT)",
                    arch="x86_64", glibc="2.28",
                    targets=["tensorrt:cuda", "onnxruntime:cuda", "torch:cuda", "onnxruntime:cpu",
                             "openvino:cpu", "reference"],
                    backend_options={"tensorrt": {"fp16_mode": False, "max_workspace_size": 1 << 30},
                                     "onnxruntime": {"tensorrt": True, "max_workspace_size": 1 << 30}},
                    wheels=["onnxruntime-gpu"],
                    runtime_note="TensorRT comes as the tensorrt wheel (with a CUDA build of torch); the NVIDIA "
                                 "driver and CUDA come with the system"),
    _ascend("ascend-910b", "Huawei Ascend 910B NPU (Atlas 800T A2, Kunpeng, CANN 8)", arch="aarch64", glibc="2.34"),
    _ascend("ascend-310p", "Huawei Ascend 310P NPU (Atlas 300I Pro/Duo inference card)", arch="x86_64",
            glibc="2.28"),
)}


def _validation_message(e: ValidationError) -> str:
    first = e.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "profile"
    return f"{where}: {first.get('msg', 'invalid')}"


def load_platforms_file(path: str | os.PathLike) -> dict[str, PlatformProfile]:
    """Read user-defined profiles from a TOML file (``[platforms.NAME]`` tables, optional ``base``).

    Raises:
        ConfigError: HYB-102 when the file is missing, is not TOML or a profile fails validation.
    """
    file = Path(path)
    try:
        doc = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError("HYB-102", f"platforms file {str(file)!r}: expected a readable TOML file ({e})",
                          "see docs/bundle.md for the format") from e
    tables = doc.get("platforms")
    if not isinstance(tables, dict):
        raise ConfigError("HYB-102", f"platforms file {str(file)!r}: expected [platforms.NAME] tables, found "
                          f"keys {sorted(doc)}", "see docs/bundle.md for the format")
    found: dict[str, PlatformProfile] = {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise ConfigError("HYB-102", f"platforms file {str(file)!r}: platforms.{name} must be a table")
        fields = dict(table)
        base_name = fields.pop("base", None)
        merged: dict[str, Any] = {}
        if base_name is not None:
            base = found.get(base_name) or BUILTIN_PLATFORMS.get(base_name)
            if base is None:
                raise ConfigError("HYB-102", f"platforms file {str(file)!r}: platforms.{name} has base "
                                  f"{base_name!r}, which is neither built in nor defined above it",
                                  f"built-in profiles: {', '.join(BUILTIN_PLATFORMS)}")
            merged = base.model_dump()
            options = {k: dict(v) for k, v in merged["backend_options"].items()}
            for backend, opts in (fields.pop("backend_options", None) or {}).items():
                options[backend] = {**options.get(backend, {}), **(opts if isinstance(opts, dict) else {})}
            merged["backend_options"] = options
        merged.update(fields)
        merged["name"] = name
        try:
            found[name] = PlatformProfile.model_validate(merged)
        except ValidationError as e:
            raise ConfigError("HYB-102", f"platforms file {str(file)!r}: platforms.{name}: "
                              f"{_validation_message(e)}", "see docs/bundle.md for the fields") from e
    return found


def list_platforms(platforms_file: str | os.PathLike | None = None) -> dict[str, PlatformProfile]:
    """Built-in profiles plus those in ``platforms_file`` (or the file named by $HYBRID_PLATFORMS)."""
    out = dict(BUILTIN_PLATFORMS)
    path = platforms_file or os.environ.get(PLATFORMS_ENV)
    if path:
        out.update(load_platforms_file(path))
    return out


def machine_arch() -> str:
    """This machine's architecture in profile terms: 'x86_64' or 'aarch64' (else as reported)."""
    arch = _platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def _jetson_model() -> str | None:
    for path in ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model"):
        try:
            text = Path(path).read_text(errors="replace").lower()
        except OSError:
            continue
        if "jetson" in text or "tegra" in text:
            return "jetson-orin" if "orin" in text else "jetson-xavier"
    return "jetson-xavier" if Path("/etc/nv_tegra_release").exists() else None


def detect_platform() -> PlatformProfile:
    """The built-in profile that describes this machine (probes only the onnxruntime backend)."""
    arch = machine_arch()
    if arch == "aarch64":
        jetson = _jetson_model()
        if jetson:
            return BUILTIN_PLATFORMS[jetson]
    try:
        kinds = {d.kind for d in backend_status("onnxruntime").devices}
    except HybridError:
        kinds = set()
    if "npu" in kinds:
        return BUILTIN_PLATFORMS["ascend-910b" if arch == "aarch64" else "ascend-310p"]
    if "cuda" in kinds and arch == "x86_64":
        return BUILTIN_PLATFORMS["nvidia-gpu"]
    return BUILTIN_PLATFORMS["arm64" if arch == "aarch64" else "x86-64"]


def get_platform(name: str | PlatformProfile = "auto",
                 platforms_file: str | os.PathLike | None = None) -> PlatformProfile:
    """Return profile ``name`` ('auto': this machine's); user-defined profiles win over built-ins.

    Raises:
        BundleError: HYB-508 for an unknown name. ConfigError: HYB-102 for a broken platforms file.
    """
    if isinstance(name, PlatformProfile):
        return name
    if name == "auto":
        return detect_platform()
    profiles = list_platforms(platforms_file)
    if name not in profiles:
        raise BundleError("HYB-508", f"unknown platform {name!r}; known platforms: {', '.join(profiles)}",
                          "define it in a TOML file passed with --platforms-file (see `pyasc platforms`)")
    return profiles[name]
