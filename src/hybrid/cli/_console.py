"""Console helpers shared by the CLI commands.

One rich Console for results (stdout) and one for messages and progress (stderr). Both have markup and
highlighting off: model names, value names and shapes such as ``float32[batchx64]`` or
``model[/v2].onnx`` are user text and must print as they are; styling is applied with
:class:`rich.text.Text` objects only (:func:`styled`). Progress shows on stderr when it is a terminal and
``--quiet`` was not given.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from hybrid.errors import HybridError

__all__ = ["console", "err_console", "fail", "print_wide", "progress", "progress_iter", "report_errors", "settings",
           "styled"]

T = TypeVar("T")

console = Console(markup=False, highlight=False, emoji=False)
err_console = Console(stderr=True, markup=False, highlight=False, emoji=False)


@dataclass
class _Settings:
    """What the global options (pyasc --quiet, -v, --log-level) chose for this invocation."""

    quiet: bool = False


settings = _Settings()


def styled(text: Any, style: str) -> Text:
    """``text`` as a styled rich Text (never parsed as markup)."""
    return Text(str(text), style=style)


def print_wide(renderable: Any, con: Console | None = None) -> None:
    """Print a table as wide as it needs when not on a terminal.

    On a terminal Rich fits it; elsewhere (a log, a pipe, a test runner) no column is cut at the 80
    columns Rich assumes when it cannot ask a terminal.
    """
    con = con or console
    if con.is_terminal:
        con.print(renderable)
        return
    needed = con.measure(renderable, options=con.options.update_width(10_000)).maximum
    before = con._width  # Console has no public way to widen one print
    con.width = max(con.width, needed)
    try:
        con.print(renderable, crop=False)
    finally:
        con._width = before


def _show_progress() -> bool:
    return not settings.quiet and err_console.is_terminal and sys.stderr.isatty()


def progress_iter(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar on stderr when it is a terminal (and not --quiet); plainly otherwise."""
    if not _show_progress():
        yield from items
        return
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in items:
            bar.update(task, description=f"{description}: {item}" if isinstance(item, str) else description)
            yield item
            bar.advance(task)


@contextmanager
def progress(description: str) -> Iterator[Any]:
    """A spinner with elapsed time on stderr for one long step (a terminal only, not --quiet).

    Yields a function ``update(text)`` that changes the description (a no-op when nothing is shown).
    """
    if not _show_progress():
        yield lambda _text: None
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(description, total=None)
        yield lambda text: bar.update(task, description=text)


# the library's hints name Python settings; where a flag does the same, say so
_CLI_HINTS = {"HYB-307": "--device-fallback warn runs on the CPU instead (with a warning)"}


def fail(err: HybridError, code: int = 1, as_json: bool = False) -> None:
    """Print a HybridError the way every command does (stderr), then exit with status ``code``.

    With ``as_json`` (the command's ``--json``) stdout also gets ``{"ok": false, "code", "message", "hint"}``,
    so a script reading stdout sees why there is no result.
    """
    if as_json:
        import json

        typer.echo(json.dumps({"ok": False, "code": err.code, "message": err.message, "hint": err.hint}))
    line = Text.assemble(styled(f"error[{err.code}]", "bold red"), ": ", err.message)
    err_console.print(line, soft_wrap=True)
    if err.hint:
        err_console.print(f"  hint: {err.hint}", soft_wrap=True)
    if err.code in _CLI_HINTS:
        err_console.print(f"  on the command line: {_CLI_HINTS[err.code]}", soft_wrap=True)
    err_console.print(f"  more: pyasc explain {err.code}")
    raise typer.Exit(code)


@contextmanager
def report_errors(as_json: bool = False) -> Iterator[None]:
    """Turn HybridErrors raised inside the block into a clean message and exit code 1.

    With ``as_json`` stdout also gets a JSON error document.
    """
    try:
        yield
    except HybridError as e:
        fail(e, as_json=as_json)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is logged (a test runner swaps it per command)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure_logging(verbose: int, log_level: str | None) -> None:
    """The ``hybrid`` logger's level from --log-level (or $HYBRID_LOG_LEVEL), else -v (INFO) / -vv (DEBUG).

    Raises:
        ConfigError: HYB-104 for an unknown level name.
    """
    from hybrid.config import set_log_level

    hybrid_logger = logging.getLogger("hybrid")
    if not hybrid_logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s hybrid: %(message)s"))
        hybrid_logger.addHandler(handler)
    if log_level:
        set_log_level(log_level)
    elif verbose:
        set_log_level(logging.DEBUG if verbose > 1 else logging.INFO)


def hide_flag_types() -> None:
    """Help without ``<bool>`` after flags (``--help <bool>``).

    typer >= 0.2x prints a type for every option, flags included; a flag takes no value, so nothing is
    shown for it.
    """
    from typer.core import TyperOption

    original = TyperOption.display_type_rich
    if getattr(original, "_pyasc_flags", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False) or getattr(self, "count", False):
            return None
        return original(self, ctx)

    display_type_rich._pyasc_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
