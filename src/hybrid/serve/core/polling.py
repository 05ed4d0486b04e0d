"""Triton's ``--model-control-mode poll``: the served repositories are looked at again, and what changed is served.

Every ``interval_s`` seconds (tritonserver's ``--repository-poll-secs``, 15 by default) :class:`RepositoryPoller`
reads the served paths: a model folder (or model file) that appeared is loaded, one whose files changed (a file
added, removed, or with another size or modification time) is loaded again, and one that is gone is unloaded. A
load that fails is logged and leaves what was served before (a changed model keeps its old versions); it is tried
again once its files change. A repository that cannot be read at all (or is gone: an unmounted volume) changes
nothing in that poll. Loading,
replacing and unloading are the registry's (:meth:`hybrid.serve.core.repository.ModelRegistry.load` and ``unload``):
queued requests of a replaced version are still answered.

:meth:`RepositoryPoller.poll` does one look, in the caller's thread (tests call it directly);
:meth:`RepositoryPoller.start` runs it every ``interval_s`` seconds in a thread of its own.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hybrid.errors import HybridError, ServingError
from hybrid.serve.core.model_dir import folder_layout
from hybrid.serve.core.repository import discover

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from hybrid.serve.core.repository import ModelRegistry

__all__ = ["DEFAULT_POLL_S", "PollReport", "RepositoryPoller"]

logger = logging.getLogger("hybrid.serve")

DEFAULT_POLL_S = 15.0
"""tritonserver's default ``--repository-poll-secs``."""

Mark = tuple[tuple[str, int, int], ...]  # (path inside the model's folder, size, mtime_ns) of each of its files


@dataclass
class PollReport:
    """What one poll changed.

    Attributes:
        loaded: Models loaded, new or again (their files changed).
        unloaded: Models unloaded (gone from the paths).
        failed: Model -> why its load failed (it is tried again once its files change).
    """

    loaded: list[str] = field(default_factory=list)
    unloaded: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def _mark(path: Path) -> Mark:
    """What tells a change of the model at ``path`` (a folder, or a model file): its files' sizes and times."""
    if path.is_file():
        stat = path.stat()
        return (("", stat.st_size, stat.st_mtime_ns),)
    marks = []
    for item in sorted(path.rglob("*")):
        if item.is_file():
            stat = item.stat()
            marks.append((str(item.relative_to(path)), stat.st_size, stat.st_mtime_ns))
    return tuple(marks)


def scan(paths: Sequence[str | Path], folders: frozenset[str] = frozenset()) -> dict[str, Mark]:
    """Model name -> :func:`_mark` of what holds it, for every model the served ``paths`` hold now.

    A repository's model folders are named by their folder (not read: a broken one is found by its load); a
    model file that is gone is simply not there.

    Args:
        paths: The served model files and folders.
        folders: Those of ``paths`` that were folders when serving began.

    Raises:
        HybridError: A served folder that cannot be read as a repository, files or a bundle, or one of
            ``folders`` that is no folder now (HYB-707: a volume unmounted changes nothing, rather than
            unloading every model).
        OSError: A folder that cannot be listed.
    """
    found: dict[str, Mark] = {}
    for arg in paths:
        path = Path(arg)
        if str(arg) in folders and not path.is_dir():
            raise ServingError("HYB-707", f"the served folder {arg} is gone")
        if path.is_dir() and folder_layout(path)[0] == "repository":
            for folder in sorted(path.iterdir()):
                if folder.is_dir() and not folder.name.startswith("."):
                    found[folder.name] = _mark(folder)
            continue
        try:
            sources = discover([arg])
        except ServingError:  # a path that does not make models (a bad name): the caller changes nothing
            raise
        except HybridError:  # a model file that is gone (HYB-201)
            continue
        for source in sources:
            found[source.name] = _mark(Path(source.path))
    return found


class RepositoryPoller:
    """Serves what the registry's paths hold, looked at every ``interval_s`` seconds; see the module docstring.

    The state of the paths when it is made is taken as the one served (the registry has just loaded it).

    Args:
        registry: The served models; its ``paths`` are polled.
        interval_s: Seconds between two polls (> 0).
        serving: Whether the server still serves; once it returns False (the server drains) no poll changes
            anything and the thread ends.
    """

    def __init__(self, registry: ModelRegistry, interval_s: float = DEFAULT_POLL_S,
                 serving: Callable[[], bool] = lambda: True) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.registry = registry
        self.interval_s = interval_s
        self.serving = serving
        self._folders = frozenset(str(p) for p in registry.paths if Path(p).is_dir())
        self._marks = scan(registry.paths, self._folders)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> PollReport:
        """Look at the paths once: load what appeared or changed, unload what is gone."""
        report = PollReport()
        if not self.serving():
            return report
        try:
            now = scan(self.registry.paths, self._folders)
        except (HybridError, OSError) as e:
            logger.error("repository poll: the served paths cannot be read, nothing changes: %s", e)
            return report
        served = {m.name for m in self.registry}
        for name, mark in now.items():
            if self._marks.get(name) == mark:  # as served (or as it failed to load): nothing to do
                continue
            self._marks[name] = mark
            try:
                self.registry.load(name)
            except HybridError as e:
                report.failed[name] = str(e)
                logger.error("repository poll: model %r does not load (tried again once its files change): %s",
                             name, e)
                continue
            report.loaded.append(name)
            logger.info("repository poll: model %r loaded (versions %s)", name,
                        ", ".join(self.registry.versions(name)))
        for name in sorted(served - now.keys()):
            self._marks.pop(name, None)
            self.registry.unload(name)
            report.unloaded.append(name)
            logger.info("repository poll: model %r unloaded (gone from the repository)", name)
        for name in set(self._marks) - now.keys():  # never served (its load failed), and gone now
            del self._marks[name]
        return report

    def start(self) -> RepositoryPoller:
        """Poll every ``interval_s`` seconds in a thread until :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(self.interval_s) and self.serving():
                try:
                    self.poll()
                except Exception:  # never end the thread: the next poll may go through
                    logger.exception("repository poll failed")

        self._thread = threading.Thread(target=loop, name="pyasc-repository-poll", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop polling; wait for a poll under way (up to ``timeout`` seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
