"""Which (backend, device) a bundle runs on here: the platform's priority, filtered by what is present.

Checks only the backends it asks about (a platform whose first choice is present never probes the
others), and never uses the HAL's device fallback: 'onnxruntime:cuda' on a machine without CUDA is
"not present", so the next target of the profile is tried and the caller can say so in a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from hybrid.bundle.cache import untrusted_options
from hybrid.bundle.platforms import PlatformProfile
from hybrid.errors import HybridError
from hybrid.hal import Candidate, backend_class, backend_names, backend_status
from hybrid.hal.device import parse_device
from hybrid.runtime.compiler import split_config

__all__ = ["available_pairs", "merged_options", "split_user_config"]

logger = logging.getLogger("hybrid")


def _pairs_for(target: str) -> list[tuple[str, str]]:
    """The present (backend, device) pairs a 'backend' or 'backend:device' target names; [] if none."""
    backend, _, device = target.strip().lower().partition(":")
    if backend not in backend_names():
        return []
    try:
        status = backend_status(backend)
    except HybridError:
        return []
    if not status.available:
        return []
    if not device:
        return [(backend, d.name) for d in status.devices]
    parsed = parse_device(device)
    if parsed is None:
        return []
    kind, index = parsed
    kinds = ("cuda", "gpu") if kind == "gpu" else (kind,)
    return [(backend, d.name) for d in status.devices if d.kind in kinds and (index is None or d.index == index)]


def available_pairs(targets: Iterable[str]) -> list[tuple[str, str]]:
    """Present (backend, device) pairs for ``targets``, in order, without duplicates."""
    out: list[tuple[str, str]] = []
    for target in targets:
        for pair in _pairs_for(target):
            if pair not in out:
                out.append(pair)
    return out


def split_user_config(config: Mapping[str, Any] | None, backend: str, device: str) -> dict[str, Any]:
    """The user's ``config`` for one backend: per-backend keys, or flat options (compile's rules)."""
    if not config:
        return {}

    return split_config(config, [Candidate(backend, device)]).get(backend, {})


def merged_options(backend: str, layers: Iterable[tuple[str, Mapping[str, Any]]],
                   untrusted: Iterable[str] = ()) -> tuple[dict[str, Any], list[str]]:
    """Merge option layers (later wins) after checking each against the backend's declared options.

    A layer the installed backend rejects (a bundle from another hybrid version, a profile written for
    a newer backend) is dropped with a note instead of failing the load. Layers named in ``untrusted``
    (read from a bundle) lose the options a hostile bundle could abuse (see ``untrusted_options``).
    """
    merged: dict[str, Any] = {}
    notes: list[str] = []
    suspicious = set(untrusted)
    for label, options in layers:
        if label in suspicious:
            options, dropped = untrusted_options(options)
            if dropped:
                notes.append(f"ignoring {label} options for {backend} that a bundle may not set: "
                             f"{', '.join(sorted(dropped))}")
        if not options:
            continue
        try:
            merged.update(backend_class(backend).validate_options(options))
        except HybridError as e:
            notes.append(f"ignoring {label} options for {backend}: {e.message}")
    return merged, notes


def profile_layer(profile: PlatformProfile, backend: str) -> tuple[str, dict[str, Any]]:
    """The profile's options for ``backend`` as a layer for :func:`merged_options`."""
    return "platform", profile.options_for(backend)
