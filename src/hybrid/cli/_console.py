"""Console helpers shared by the CLI commands: one rich Console, progress bars only on a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hybrid.errors import HybridError

__all__ = ["console", "fail", "progress_iter", "report_errors"]

T = TypeVar("T")

console = Console()
err_console = Console(stderr=True)


def progress_iter(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar on a terminal; plainly when output is piped."""
    if not sys.stderr.isatty():
        yield from items
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in items:
            yield item
            bar.advance(task)


def fail(err: HybridError) -> None:
    """Print a HybridError the way every command does, then exit with status 1."""
    err_console.print(f"[bold red]error[{err.code}][/]: {err.message}", highlight=False)
    if err.hint:
        err_console.print(f"  hint: {err.hint}", highlight=False)
    err_console.print(f"  more: pyasc explain {err.code}", highlight=False)
    raise typer.Exit(1)


@contextmanager
def report_errors() -> Iterator[None]:
    """Turn HybridErrors raised inside the block into a clean message and exit code 1."""
    try:
        yield
    except HybridError as e:
        fail(e)
