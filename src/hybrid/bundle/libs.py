"""Vendored wheels (``--include-libs``): fetch them for the target platform, lock them, install offline.

Fetching runs ``pip download --only-binary=:all: --platform ... --python-version ...`` so the wheels
match the target's OS, architecture and Python, not this machine's. Each wheel is recorded in the
manifest's lock list (file, name, version, sha256, size). ``pyasc bundle install-libs`` checks every
hash, writes the wheels to a temporary folder and runs ``pip install --no-index --find-links DIR
--require-hashes``, so pip itself refuses any wheel that differs from the lock and never goes online.

What the wheels cannot give the platform is said at create time (:func:`platform_warnings`): the profile's
preferred targets whose runtimes are not among them (Jetson's TensorRT and CUDA, when only the CPU
onnxruntime could be vendored), and a Python that differs from the platform's own, or is not known.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from hybrid.bundle.manifest import LibsEntry, LockEntry
from hybrid.bundle.platforms import PlatformProfile, machine_arch
from hybrid.errors import BundleError, ConfigError

__all__ = ["InstallReport", "default_requirements", "fetch_wheels", "given_targets", "hybrid_python_floor",
           "hybrid_wheel", "install_libs", "lock_wheel", "parse_wheel_name", "platform_warnings", "wheels_python"]

logger = logging.getLogger("hybrid")

DISTRIBUTION = "pyasc"
# PEP 427: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl
_WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.!+]+)(-\d[A-Za-z0-9_]*)?"
                    r"-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl$")
_PIP_TIMEOUT = 1800
_PYTHON = re.compile(r"^3\.\d{1,2}$")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_name(filename: str) -> tuple[str, str]:
    """(normalized name, version) from a wheel file name.

    Raises:
        BundleError: HYB-509 when the name is not a PEP 427 wheel name.
    """
    m = _WHEEL.match(filename)
    if not m:
        raise BundleError("HYB-509", f"{filename!r} is not a wheel file name (name-version-python-abi-platform.whl)",
                          "vendor only .whl files")
    return _normalize(m.group("name")), m.group("version")


def lock_wheel(path: Path) -> LockEntry:
    """The lock entry of one wheel file."""
    name, version = parse_wheel_name(path.name)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return LockEntry(file=f"libs/{path.name}", name=name, version=version, sha256=digest, size=path.stat().st_size)


def _pip(args: Sequence[str], what: str, python: str | None = None, isolated: bool = False) -> str:
    """Run pip.

    ``isolated`` ignores every pip config file and PIP_* variable (offline installs must see only the bundle's wheels,
    not a find-links folder configured on the machine).
    """
    cmd = [python or sys.executable, "-m", "pip", *args]
    env = dict(os.environ)
    if isolated:
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
    logger.debug("running %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BundleError("HYB-509", f"{what}: could not run pip ({e})", "check the Python interpreter") from e
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise BundleError("HYB-509", f"{what}: pip failed (exit {proc.returncode}): {tail[:800]}",
                          "check the package names, the network (for downloads) and pip's message")
    return proc.stdout


def hybrid_wheel(dest: Path) -> Path:
    """A wheel of the installed hybrid (pure Python, fits every platform), built from its source tree.

    Raises:
        BundleError: HYB-509 when hybrid was not installed from a local source tree.
    """
    try:
        direct = json.loads(metadata.distribution(DISTRIBUTION).read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError) as e:
        raise BundleError("HYB-509", f"cannot find how {DISTRIBUTION} was installed ({e})",
                          "pass the pyasc wheel explicitly with --wheel PATH") from e
    url = direct.get("url", "")
    if not url.startswith("file://"):
        raise BundleError("HYB-509", f"{DISTRIBUTION} was not installed from a local source tree (from {url!r})",
                          "pass the pyasc wheel explicitly with --wheel PATH")
    source = Path(url[len("file://"):])
    dest.mkdir(parents=True, exist_ok=True)
    _pip(["wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(dest), str(source)],
         f"building the {DISTRIBUTION} wheel")
    wheels = sorted(dest.glob(f"{DISTRIBUTION}-*.whl"))
    if not wheels:
        raise BundleError("HYB-509", f"pip wheel wrote no {DISTRIBUTION} wheel into {dest}", "check pip's output")
    return wheels[-1]


def default_requirements(profile: PlatformProfile) -> list[str]:
    """The profile's runtime packages, pinned to the versions installed here when they are."""
    out = []
    for name in profile.wheels:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _here() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def hybrid_python_floor() -> str | None:
    """The lowest Python hybrid runs on, read from its own ``Requires-Python`` (None: not known)."""
    try:
        spec = metadata.metadata(DISTRIBUTION).get("Requires-Python") or ""
    except metadata.PackageNotFoundError:
        return None
    m = re.search(r">=\s*(3\.\d+)", spec)
    return m.group(1) if m else None


def wheels_python(profile: PlatformProfile, requested: str | None) -> str:
    """The Python 'X.Y' the wheels are fetched for.

    ``requested`` (``--python-version``), else the platform's own Python when hybrid runs on it, else this
    interpreter's.

    Raises:
        ConfigError: HYB-102 when ``requested`` is not 'X.Y'.
        BundleError: HYB-509 when hybrid cannot run on the requested Python (its wheels could not be
            installed beside hybrid).
    """
    floor = hybrid_python_floor()
    if requested is not None:
        if not isinstance(requested, str) or not _PYTHON.match(requested):
            raise ConfigError("HYB-102", f"python version: expected X.Y such as '3.11', got {requested!r}",
                              "pass the target's Python as --python-version 3.11")
        if floor is not None and _version(requested) < _version(floor):
            raise BundleError("HYB-509", f"wheels for Python {requested} were asked for, but {DISTRIBUTION} needs "
                              f"Python >={floor}: they could not be installed beside it",
                              f"pass --python-version {floor} or later; a target whose Python is older needs a "
                              f"second interpreter (conda, pyenv)")
        return requested
    own = profile.python
    if own is not None and (floor is None or _version(own) >= _version(floor)):
        return own
    return _here()


def given_targets(profile: PlatformProfile, names: Sequence[str]) -> list[str]:
    """The profile's targets that wheels of these distributions give, best first (by distribution name)."""
    have = {_normalize(n) for n in names}
    out = []
    for target in profile.targets:
        needs = profile.runtime_requirements(target)
        if needs is not None and all(any(_normalize(a) in have for a in need.split("|")) for need in needs):
            out.append(target)
    return out


def _runtime_warning(profile: PlatformProfile, given: Sequence[str]) -> str | None:
    """The targets the platform prefers over the best one the wheels give, with the packages they need."""
    missing = []
    for target in profile.targets:
        if target in given:
            break
        needs = profile.runtime_requirements(target)
        if needs is None:
            logger.debug("no packages known for target %r: not checked against the vendored wheels", target)
            continue
        missing.append(f"{target} (needs {', '.join(n.replace('|', ' or ') for n in needs)})")
    if not missing:
        return None
    if given:
        text = (f"platform {profile.name}: the vendored wheels give {', '.join(given)}, not its preferred "
                f"{'; '.join(missing)}: without those runtimes on the device the bundle runs on {given[0]}")
    else:
        text = (f"platform {profile.name}: the vendored wheels give none of its targets ({'; '.join(missing)}): "
                "the device must provide a runtime")
    return f"{text}. {profile.runtime_note}" if profile.runtime_note else text


def _python_warning(profile: PlatformProfile, version: str, requested: str | None) -> str | None:
    own, floor = profile.python, hybrid_python_floor()
    if own is None:
        if requested is not None:
            return None  # the user named the target's Python
        return (f"platform {profile.name}: its Python is not known; the wheels are for Python {version}, this "
                f"interpreter's: check the target's Python, or pass --python-version X.Y")
    if own == version:
        return None
    where = f"platform {profile.name}'s Python is {own} ({profile.description or profile.name})"
    if floor is not None and _version(own) < _version(floor):
        return (f"the wheels are for Python {version}, {where}, and {DISTRIBUTION} needs Python >={floor}: install "
                f"Python {version} on the target (conda, pyenv) and run hybrid from it; packages built for its "
                f"Python {own}, such as the system's accelerator bindings, do not import in it")
    return f"the wheels are for Python {version}, {where}: pass --python-version {own} to fetch wheels for it"


def platform_warnings(profile: PlatformProfile, libs: LibsEntry, requested: str | None = None) -> list[str]:
    """What the vendored wheels cannot give the platform: preferred targets' runtimes, its Python.

    Args:
        profile: The platform.
        libs: The vendored wheels (``libs.targets`` already computed).
        requested: The Python asked for with ``--python-version`` (None: chosen by :func:`wheels_python`).
    """
    found = [_runtime_warning(profile, libs.targets), _python_warning(profile, libs.python_version, requested)]
    return [w for w in found if w]


def fetch_wheels(requirements: Sequence[str], profile: PlatformProfile, python_version: str, dest: Path) -> list[Path]:
    """Download wheels (and their dependencies) for the profile's platform and Python into ``dest``.

    Raises:
        BundleError: HYB-509 when pip fails (no network, no wheel for that platform, ...).
    """
    dest.mkdir(parents=True, exist_ok=True)
    if not requirements:
        return []
    platforms = [arg for tag in profile.pip_platforms for arg in ("--platform", tag)]
    _pip(["download", "--only-binary=:all:", *platforms, "--python-version", python_version,
          "--implementation", "cp", "--quiet", "-d", str(dest), *requirements],
         f"downloading wheels for {profile.name} (Python {python_version})")
    return sorted(dest.glob("*.whl"))


def vendor(profile: PlatformProfile, python_version: str, requirements: Sequence[str] | None,
           wheels: Sequence[str | os.PathLike], include_hybrid: bool, workdir: Path) -> tuple[LibsEntry, list[Path]]:
    """Collect the wheels for a bundle: hybrid itself, the requirements (fetched with pip), local wheels."""
    local = [Path(w) for w in wheels]
    for w in local:
        if not w.is_file():
            raise BundleError("HYB-509", f"wheel {str(w)!r} not found", "check the path given with --wheel")
    if include_hybrid and not any(parse_wheel_name(w.name)[0] == DISTRIBUTION for w in local):
        local.append(hybrid_wheel(workdir / "build"))
    reqs = list(default_requirements(profile) if requirements is None else requirements)
    # local wheels go to pip too, so that their dependencies are fetched for the target platform
    fetched = fetch_wheels([*reqs, *(str(w) for w in local)] if reqs or include_hybrid else [], profile,
                           python_version, workdir / "download")
    by_name: dict[str, Path] = {w.name: w for w in [*fetched, *local]}
    entries = [lock_wheel(p) for p in by_name.values()]
    return LibsEntry(platform=profile.name, pip_platforms=profile.pip_platforms, python_version=python_version,
                     wheels=entries, targets=given_targets(profile, [e.name for e in entries])), \
        list(by_name.values())


@dataclass(frozen=True, slots=True)
class InstallReport:
    """What ``install_libs`` installed (or would install, with ``dry_run``)."""

    wheels: tuple[str, ...]
    target: str | None
    pip_output: str


def install_libs(source: str | os.PathLike | bytes, target: str | os.PathLike | None = None,
                 python: str | None = None, dry_run: bool = False, force: bool = False) -> InstallReport:
    """Install a bundle's vendored wheels offline, with pip checking every hash against the lock.

    Args:
        source: The bundle.
        target: Install into this folder (``pip install --target``) instead of the environment.
        python: The interpreter whose pip installs them (default: this one).
        dry_run: Ask pip what it would install, install nothing.
        force: Skip the check that the wheels match this machine's architecture and Python.

    Raises:
        BundleError: HYB-509 when the bundle has no wheels, they are for another platform, or pip fails;
            5xx when the bundle fails its checks.
    """
    from hybrid.bundle.format import BundleReader

    with BundleReader(source) as reader:
        libs = reader.manifest.libs
        if libs is None or not libs.wheels:
            raise BundleError("HYB-509", f"{reader.where}: the bundle has no vendored wheels",
                              "create it with `pyasc bundle create ... --include-libs`")
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if not force and python is None and (here != libs.python_version or not libs.pip_platforms[0].endswith(
                machine_arch())):
            raise BundleError("HYB-509", f"{reader.where}: the wheels are for {libs.platform} (Python "
                              f"{libs.python_version}, {libs.pip_platforms[0]}), this interpreter is Python {here} "
                              f"on {machine_arch()}", "run install-libs on the target, or pass --force")
        with tempfile.TemporaryDirectory(prefix="hybrid-libs-") as tmp:
            folder = Path(tmp)
            lines = []
            for w in libs.wheels:
                data = reader.read(w.file)  # sha256 checked against the manifest
                (folder / w.file.rpartition("/")[2]).write_bytes(data)
                lines.append(f"{w.name}=={w.version} --hash=sha256:{w.sha256}")
            reader.verify()
            (folder / "requirements.txt").write_text("\n".join(lines) + "\n")
            args = ["install", "--no-index", "--find-links", str(folder), "--require-hashes",
                    "-r", str(folder / "requirements.txt"), "--disable-pip-version-check"]
            if target is not None:
                args += ["--target", str(target)]
            if dry_run:
                args.append("--dry-run")
            out = _pip(args, f"installing {len(lines)} wheels from {reader.where}", python, isolated=True)
    return InstallReport(tuple(w.file.rpartition("/")[2] for w in libs.wheels),
                         None if target is None else str(target), out)
