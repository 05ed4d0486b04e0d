"""Pauses of Python's cyclic garbage collector in a long-running process (``pyasc serve`` installs the policy).

A full collection walks every object the collector tracks. In a server process that is mostly what never dies: the
imports (a runtime, and torch or OpenVINO once ``target='auto'`` compiles its candidates) and the loaded models, a
million objects or more. The requests allocate fast enough to start one every 20 s or so under load, and each held
the GIL for about 150 ms on this project's 2-core machine, stalling every request in flight
(benchmarks/history/RESULTS-to-2026-12-07.md, issue 25).
:class:`CollectorPolicy` freezes the objects that survived a full collection that took longer than
``max_pause_s`` (``gc.freeze``: they leave the collector's passes; reference counting still frees them), so the
next full collections walk only what is younger. Freezing once at start-up covers the imports and the models;
the rule covers what is loaded later. Objects frozen in a reference cycle are not reclaimed, so whatever lets go of
a model or a compiled candidate (a model unloaded, a tuning candidate released) thaws them all (:func:`thaw`), and
the rule freezes what is still alive after the next long collection.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybrid.errors import ConfigError

__all__ = ["ENV_MAX_PAUSE_MS", "CollectorPolicy", "install", "installed", "policy_from_env", "thaw", "uninstall"]

logger = logging.getLogger("hybrid")

ENV_MAX_PAUSE_MS = "HYBRID_GC_MAX_PAUSE_MS"  # the bound in ms; 'off' leaves the collector as Python sets it
_OLDEST = 2  # the generation of a full collection


@dataclass(eq=False)  # one installed policy is told from another by identity (gc.callbacks.remove)
class CollectorPolicy:
    """Freeze the long-lived objects when a full collection pauses the process longer than ``max_pause_s``.

    Attributes:
        max_pause_s: The longest full collection accepted before the objects that survived it are frozen.
        clock: The clock that times a collection (injected by tests).
        freezes: How many times the policy froze the survivors.
        longest_s: The longest full collection seen so far.
    """

    max_pause_s: float = 0.02
    clock: Callable[[], float] = time.perf_counter
    freezes: int = 0
    longest_s: float = 0.0
    _started: float | None = field(default=None, repr=False)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` entry: times each full collection and freezes after a long one."""
        if info.get("generation") != _OLDEST:
            return
        if phase == "start":
            self._started = self.clock()
            return
        if self._started is None:
            return
        pause = self.clock() - self._started
        self._started = None
        self.longest_s = max(self.longest_s, pause)
        if pause > self.max_pause_s:
            gc.freeze()  # the collection is over: the survivors are all in the oldest generation's list
            self.freezes += 1
            logger.info("a full garbage collection paused the process %.0f ms; its survivors are frozen out of the "
                        "next ones (%d objects frozen in all)", pause * 1e3, gc.get_freeze_count())


_installed: CollectorPolicy | None = None


def policy_from_env(environ: dict[str, str] | None = None) -> CollectorPolicy | None:
    """The policy that :data:`ENV_MAX_PAUSE_MS` asks for (default 20 ms; 'off': None).

    Raises:
        ConfigError: HYB-102 when the variable is neither a number of milliseconds >= 0 nor 'off'.
    """
    value = (os.environ if environ is None else environ).get(ENV_MAX_PAUSE_MS, "").strip()
    if not value:
        return CollectorPolicy()
    if value.lower() == "off":
        return None
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not ms >= 0:  # also NaN
        raise ConfigError("HYB-102", f"{ENV_MAX_PAUSE_MS}={value!r}: expected milliseconds >= 0 or 'off'",
                           f"set {ENV_MAX_PAUSE_MS}=20 (the default) or {ENV_MAX_PAUSE_MS}=off")
    return CollectorPolicy(max_pause_s=ms / 1e3)


def install(policy: CollectorPolicy, freeze_now: bool = True) -> None:
    """Apply ``policy`` to this process (a server process that owns it: ``hybrid.serve.server.run``).

    Args:
        policy: The rule.
        freeze_now: Collect once and freeze the survivors now: the imports and the loaded models, before the
            first request (the one long pause is taken while nothing waits).
    """
    global _installed
    uninstall()
    if freeze_now:
        gc.collect()
        gc.freeze()
    gc.callbacks.append(policy)
    _installed = policy


def uninstall() -> None:
    """Remove the installed policy (frozen objects stay frozen: :func:`thaw` releases them)."""
    global _installed
    if _installed is not None and _installed in gc.callbacks:
        gc.callbacks.remove(_installed)
    _installed = None


def installed() -> CollectorPolicy | None:
    """The policy applied to this process, if any."""
    return _installed


def thaw() -> None:
    """Return the frozen objects to the collector (after a model is unloaded: its cycles can be reclaimed).

    Nothing happens where no policy is installed: frozen objects are then someone else's decision.
    """
    if _installed is not None:
        gc.unfreeze()
