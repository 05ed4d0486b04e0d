"""The ``.hybrid`` bundle: one self-contained, verifiable file to deploy (DESIGN 2.7).

``cm.save('m.hybrid')`` / :func:`save_bundle` and :func:`create_bundle` write it; :func:`load` (``hybrid.load``)
verifies and compiles it (:func:`load_task`, ``hybrid.load_task``: one that declares a vision task, typed as
the TaskModel it returns); :func:`inspect_bundle` and :func:`verify_bundle` read it without running it.
Platform profiles live in :mod:`hybrid.bundle.platforms`. See docs/bundle.md.
"""

from hybrid.bundle.create import create_bundle, save_bundle
from hybrid.bundle.fingerprint import Fingerprint, device_fingerprint
from hybrid.bundle.inspection import inspect_bundle, read_calibration, verify_bundle
from hybrid.bundle.libs import install_libs
from hybrid.bundle.load import LoadInfo, load, load_task, load_with_info
from hybrid.bundle.platforms import PlatformProfile, detect_platform, get_platform, list_platforms
from hybrid.bundle.safety import Limits

__all__ = [
    "Fingerprint",
    "Limits",
    "LoadInfo",
    "PlatformProfile",
    "create_bundle",
    "detect_platform",
    "device_fingerprint",
    "get_platform",
    "inspect_bundle",
    "install_libs",
    "list_platforms",
    "load",
    "load_task",
    "load_with_info",
    "read_calibration",
    "save_bundle",
    "verify_bundle",
]
