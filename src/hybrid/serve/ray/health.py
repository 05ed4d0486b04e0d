"""Health and warm-up of a Ray Serve replica: every model loaded, and its backend answering a tiny call.

The tiny call is each model's *probe*: zeros of the model's input dtypes and shapes, every symbolic dim
set to 1 (one row of a batch-dynamic model). A probe goes through the model's queue like a request
(so it never runs beside a batch on a backend that cannot), and shows in the batch statistics, not in
the request counters. A model whose probe is refused at warm-up for its inputs (a symbolic height that
cannot be 1, say) is checked for being loaded only, with a warning.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from hybrid.errors import HybridError, ServingError

if TYPE_CHECKING:
    from hybrid.serve.core.model import ServedModel
    from hybrid.serve.core.repository import ModelRegistry

__all__ = ["ReplicaHealth", "probe_feeds"]

logger = logging.getLogger("hybrid.serve")

PROBE_TIMEOUT = 20.0  # seconds; Serve's health_check_timeout_s is 30 by default


def probe_feeds(model: ServedModel) -> dict[str, np.ndarray] | None:
    """Zeros for every input (symbolic dims 1), or None when an input is not a plain tensor."""
    feeds = {}
    for spec in model.signature.inputs:
        if spec.kind != "tensor" or spec.shape is None or spec.dtype is None or spec.dtype == np.dtype(object):
            return None
        feeds[spec.name] = np.zeros([d if isinstance(d, int) else 1 for d in spec.shape], spec.dtype)
    return feeds


class ReplicaHealth:
    """The probes of one replica's models.

    Args:
        registry: The replica's models.
    """

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self._probes: dict[tuple[str, str], dict[str, np.ndarray] | None] = {
            (m.name, m.version): probe_feeds(m) for m in registry}

    def warm_up(self, runs: int) -> None:
        """Run every model's probe ``runs`` times before the replica serves.

        The probes run on an event loop of their own in a thread of their own, so this is callable from a
        constructor that Serve runs on its event loop's thread. A probe refused for its inputs turns that
        model's probe off; any other failure is raised.
        """
        if runs <= 0:
            return

        async def all_models() -> None:
            for model in self.registry:
                for _ in range(runs):
                    if not await self._probe(model, at_warm_up=True):
                        break

        with ThreadPoolExecutor(1, thread_name_prefix="hybrid-warm-up") as pool:
            pool.submit(asyncio.run, all_models()).result()

    async def _probe(self, model: ServedModel, at_warm_up: bool = False) -> bool:
        key = (model.name, model.version)
        feeds = self._probes.get(key)
        if feeds is None:
            return False
        try:
            await model.infer(feeds, PROBE_TIMEOUT)
        except HybridError as e:
            if at_warm_up and e.code.startswith("HYB-40") and e.code != "HYB-408":
                logger.warning("model %s:%s: the health probe (zeros, symbolic dims 1) does not fit its inputs "
                               "(%s); health checks only that it is loaded", model.name, model.version, e)
                self._probes[key] = None
                return False
            raise
        return True

    async def check(self, draining: bool) -> None:
        """Raise when a model is not loaded or its backend does not answer its probe.

        Serve then restarts the replica. A draining replica is healthy: it is on its way out.
        """
        if draining:
            return
        for model in self.registry:
            if not model.ready:
                raise ServingError("HYB-708", f"model {model.name!r} version {model.version} is not loaded",
                                   "Serve restarts the replica")
            await self._probe(model)
