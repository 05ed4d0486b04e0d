"""Vendored wheels (``--include-libs``): fetch them for the target platform, lock them, install offline.

Fetching runs ``pip download --only-binary=:all: --platform ... --python-version ...`` so the wheels
match the target's OS, architecture and Python, not this machine's. Each wheel is recorded in the
manifest's lock list (file, name, version, sha256, size). ``pyasc bundle install-libs`` checks every
hash, writes the wheels to a temporary folder and runs ``pip install --no-index --find-links DIR
--require-hashes``, so pip itself refuses any wheel that differs from the lock and never goes online.
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
from hybrid.errors import BundleError

__all__ = ["InstallReport", "default_requirements", "fetch_wheels", "hybrid_wheel", "install_libs", "lock_wheel",
           "parse_wheel_name"]

logger = logging.getLogger("hybrid")

DISTRIBUTION = "pyasc"
# PEP 427: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl
_WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.!+]+)(-\d[A-Za-z0-9_]*)?"
                    r"-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl$")
_PIP_TIMEOUT = 1800


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
                     wheels=entries), list(by_name.values())


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
