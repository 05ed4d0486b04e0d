"""``pyasc bundle inspect`` and ``pyasc bundle verify``: read a bundle without running it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from hybrid.bundle.arrays import read_npz
from hybrid.bundle.cache import OPTIMIZED_NAME, check_optimized
from hybrid.bundle.fingerprint import device_fingerprint
from hybrid.bundle.format import BundleReader, Source
from hybrid.bundle.load import read_model
from hybrid.bundle.manifest import Manifest
from hybrid.bundle.modelio import parse_model_bytes
from hybrid.bundle.safety import Limits
from hybrid.bundle.select import available_pairs
from hybrid.errors import BundleError

__all__ = ["inspect_bundle", "read_calibration", "verify_bundle"]


def _signature(m: Manifest) -> dict[str, Any]:
    def fmt(t: Any) -> str:
        dims = "?" if t.shape is None else "x".join(str(d) for d in t.shape) or "scalar"
        return f"{t.name}: {t.dtype or '?'}[{dims}]"

    return {"inputs": [fmt(t) for t in m.model.inputs], "outputs": [fmt(t) for t in m.model.outputs]}


def inspect_bundle(source: Source, limits: Limits | None = None) -> dict[str, Any]:
    """A JSON-able summary.

    Manifest facts, signature, platform, compile choice, caches (and whether one matches this machine), calibration,
    vendored wheels, and every member with its size.

    Checks the archive's structure and the manifest, not the member hashes (that is :func:`verify_bundle`).
    """
    with BundleReader(source, limits) as reader:
        m = reader.manifest
        members = [{"name": n, "size": size, "compressed": csize} for n, size, csize in reader.iter_members()]
        file_size = reader.size
    caches = []
    for c in m.caches:
        here = bool(available_pairs([f"{c.backend}:{c.device}"])) and \
            device_fingerprint(c.backend, c.device).digest == c.fingerprint
        caches.append({"fingerprint": c.fingerprint, "backend": c.backend, "device": c.device,
                       "precision": c.precision, "kind": c.kind, "matches_this_machine": here,
                       "bytes": sum(m.members[f].size for f in c.files), "built_on": c.fingerprint_info})
    return {
        "file": str(source) if isinstance(source, (str, os.PathLike)) else "<bytes>",
        "file_size": file_size,
        "format_version": m.format_version,
        "name": m.name,
        "task": m.task,
        "preprocess": None if m.preprocess is None else m.preprocess.model_dump(mode="json"),
        "postprocess": None if m.postprocess is None else m.postprocess.model_dump(mode="json"),
        "serving": None if m.serving is None else m.serving.model_dump(mode="json", exclude_none=True),
        "shapes": None if m.shapes is None else {k: v if isinstance(v, list) else v.model_dump(mode="json")
                                                 for k, v in m.shapes.items()},
        "created_by": m.created_by,
        "created_at": m.created_at,
        "signature": _signature(m),
        "model": {"path": m.model.path, "sha256": m.model.sha256, "opset": m.model.opset,
                  "external_data": m.model.external_data, "optimize_level": m.optimize_level,
                  "optimized": m.optimized, "layout": m.model.layout},
        "platform": m.platform.model_dump(mode="json"),
        "compile": None if m.compile is None else m.compile.model_dump(mode="json"),
        "caches": caches,
        "calibration": None if m.calibration is None else {"path": m.calibration.path,
                                                           "arrays": sorted(m.calibration.arrays)},
        "libs": None if m.libs is None else {
            "platform": m.libs.platform, "python_version": m.libs.python_version,
            "pip_platforms": m.libs.pip_platforms, "targets": m.libs.targets,
            "wheels": [w.model_dump(mode="json") for w in m.libs.wheels]},
        "warnings": m.warnings,
        "members": members,
        "total_bytes": sum(x["size"] for x in members),
    }


def read_calibration(source: Source, limits: Limits | None = None) -> dict[str, np.ndarray] | None:
    """The bundle's calibration samples by input name (None when it has none); never unpickles."""
    with BundleReader(source, limits) as reader:
        entry = reader.manifest.calibration
        if entry is None:
            return None
        arrays = read_npz(reader.read(entry.path), f"{reader.where}:{entry.path}", reader.limits)
    by_key = {key: name for name, key in entry.arrays.items()}
    missing = sorted(set(by_key) - set(arrays))
    if missing:
        raise BundleError("HYB-507", f"calibration arrays {missing} listed in the manifest are not in the npz",
                          "the bundle is damaged; rebuild it")
    return {by_key[k]: v for k, v in arrays.items() if k in by_key}


def verify_bundle(source: Source, limits: Limits | None = None) -> dict[str, Any]:
    """Run every check a load runs, without compiling.

    Archive structure and caps, manifest schema, every member's sha256, the model and its external data, compiled
    caches, calibration data.

    Returns:
        A report: ``{"ok": True, "members": n, "bytes": total, "checks": [...]}``.

    Raises:
        BundleError: 5xx naming the first failed check.
    """
    checks = ["archive structure, names, links, duplicates, sizes, ratios, overlaps", "manifest schema"]
    with BundleReader(source, limits) as reader:
        m = reader.manifest
        model = read_model(reader)
        checks.append(f"model {m.model.path} parses" + (" with its external data inside the bundle"
                                                        if m.model.external_data else ""))
        for c in m.caches:
            if c.kind == "optimized-model":
                name = next(f for f in c.files if f.endswith(OPTIMIZED_NAME))
                check_optimized(parse_model_bytes(reader.read(name), name), model, name)
        if m.caches:
            checks.append(f"{len(m.caches)} compiled cache(s) are self-contained and match the model")
        if m.calibration is not None:
            read_npz(reader.read(m.calibration.path), m.calibration.path, reader.limits)
            checks.append("calibration data parses without pickle, sizes consistent")
        if m.libs is not None:
            checks.append(f"{len(m.libs.wheels)} vendored wheel(s) match their lock entries")
        total = reader.verify()
        checks.append(f"sha256 of all {len(m.members)} members")
    return {"ok": True, "members": len(m.members), "bytes": total, "checks": checks}
