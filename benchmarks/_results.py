"""One current page of results: each benchmark replaces its own section of ``benchmarks/RESULTS.md``.

A section sits between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` and holds the benchmark's
title, the command that produced it, the date, the machine (CPU model, AVX-512 and AMX flags, cores, Python
and the runtimes' versions) and its table. :func:`write_results` replaces that section (or appends it when the
page has none yet) and moves the section it replaced to ``benchmarks/history/NAME.md``, so the page shows
the latest figures and nothing measured before is lost.

Two benchmarks may finish at the same moment, so every read-modify-write of the page happens under one file
lock, and each file is written to a temporary file first and then renamed over the old one: a reader never sees
half a page, and a writer never loses the other's section.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import importlib.metadata
import os
import platform
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from filelock import FileLock

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
HISTORY = HERE / "history"
# The runtimes whose versions change the figures; read from the installed metadata, so nothing is imported.
LIBRARIES = ("pyasc", "numpy", "onnxruntime", "openvino", "torch", "onnx", "grpcio", "tritonclient")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


@dataclasses.dataclass(frozen=True, slots=True)
class Machine:
    """What a reader needs to know about the machine before comparing figures across runs."""

    cpu: str
    cores: int
    avx2: bool
    avx512: tuple[str, ...]
    amx: tuple[str, ...]
    python: str
    libraries: tuple[tuple[str, str], ...]

    def line(self) -> str:
        """One line: CPU, cores, vector extensions, then the software.

        Example: ``AMD EPYC, 2 cores, AVX2, no AVX-512, no AMX; Python 3.11.7, numpy 2.4.0``.
        """
        vector = f"AVX-512 ({' '.join(self.avx512)})" if self.avx512 else "no AVX-512"
        if self.avx2:
            vector = "AVX2, " + vector
        matrix = f"AMX ({' '.join(self.amx)})" if self.amx else "no AMX"
        software = ", ".join([f"Python {self.python}"] + [f"{n} {v}" for n, v in self.libraries])
        return f"{self.cpu}, {self.cores} cores, {vector}, {matrix}; {software}"


def _short_flag(flag: str, prefix: str) -> str:
    # avx512_bf16 -> bf16, avx512vnni -> vnni, amx_tile -> tile: the family is named once, before the list.
    return flag[len(prefix):].lstrip("_") or flag


def machine(cpuinfo: str | None = None, libraries: Sequence[str] = LIBRARIES) -> Machine:
    """The machine this process runs on.

    Args:
        cpuinfo: the text of ``/proc/cpuinfo``; read from the file when not given (tests pass their own).
        libraries: distributions whose installed versions are named.

    Returns:
        The CPU model and flags from ``/proc/cpuinfo`` (``platform`` where there is none), the cores this
        process may run on, and the versions of the installed libraries (absent ones are left out).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    cpu, flags = platform.processor() or platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            cpu = value.strip()
        elif key == "flags":
            flags = set(value.split())
            break  # every core lists the same flags; the model name comes before them
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    versions = []
    for name in libraries:
        try:
            versions.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return Machine(
        cpu=cpu,
        cores=cores,
        avx2="avx2" in flags,
        avx512=tuple(sorted(_short_flag(f, "avx512") for f in flags if f.startswith("avx512"))),
        amx=tuple(sorted(_short_flag(f, "amx") for f in flags if f.startswith("amx"))),
        python=platform.python_version(),
        libraries=tuple(versions),
    )


def markers(name: str) -> tuple[str, str]:
    """The opening and closing markers of ``name``'s section."""
    return f"<!-- results:{name} -->", f"<!-- /results:{name} -->"


def section(name: str, title: str, command: str, date: str, machine_line: str, table: str, notes: str = "",
            load: str = "") -> str:
    """The Markdown of one section, markers included, ending in a newline."""
    start, end = markers(name)
    parts = [start, f"## {title}", "",
             f"- Command: `{command}`", f"- Date: {date}", f"- Machine: {machine_line}",
             *([f"- Load: {load}"] if load else []), "", table.strip()]
    if notes.strip():
        parts += ["", notes.strip()]
    return "\n".join([*parts, end]) + "\n"


def find_section(text: str, name: str) -> tuple[int, int] | None:
    """Where ``name``'s section starts and ends in ``text`` (end past the closing marker's line), or None."""
    start_mark, end_mark = markers(name)
    start = text.find(start_mark)
    if start < 0:
        return None
    end = text.find(end_mark, start)
    if end < 0:
        raise ValueError(f"RESULTS.md: {start_mark} has no {end_mark} after it; restore the closing marker "
                         "by hand before writing this benchmark's results")
    end += len(end_mark)
    if text.startswith("\n", end):
        end += 1
    return start, end


CONTENTS = ("<!-- results-contents -->", "<!-- /results-contents -->")
_SECTION = re.compile(r"^<!-- results:([a-z0-9][a-z0-9_.-]*) -->\n## (.+)$", re.MULTILINE)


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return "".join(c for c in title.strip().lower() if c.isalnum() or c in " -_").replace(" ", "-")


def with_contents(text: str) -> str:
    """``text`` with its contents line (between :data:`CONTENTS`' markers) listing every section, in page order."""
    start, end = text.find(CONTENTS[0]), text.find(CONTENTS[1])
    if start < 0 or end < start:
        return text  # a page without the markers keeps what it has
    links = ", ".join(f"[{name}](#{anchor(title)})" for name, title in _SECTION.findall(text))
    return text[:start + len(CONTENTS[0])] + f"\n**Contents**: {links}\n" + text[end:]


def _write_atomic(path: Path, text: str) -> None:
    # Temp file in the same folder, then rename: readers see the old page or the new one, never half of one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _lock_for(results: Path) -> FileLock:
    # The lock lives outside the repository so no lock file is left beside the page; one per page.
    key = hashlib.sha1(str(results.resolve()).encode()).hexdigest()[:16]
    return FileLock(Path(tempfile.gettempdir()) / f"hybrid-results-{key}.lock")


def load_average() -> str:
    """The 1/5/15-minute load averages, as a reader of a shared machine's figures wants them ("" where unknown)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return ""
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min) when the results were written"


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def write_results(name: str, title: str, command: str, table: str, notes: str = "", *,
                  machine_line: str | None = None, load: str | None = None, results: Path = RESULTS,
                  history: Path = HISTORY, now: Callable[[], datetime.datetime] = _utc_now) -> str:
    """Replace benchmark ``name``'s section of the results page; keep the one it replaces in its history.

    Args:
        name: the section's key (lower case, digits, ``_``, ``.``, ``-``), e.g. ``"vs_triton"``.
        title: the section's heading.
        command: the command line that produced the figures, as a reader would type it.
        table: the figures, a Markdown table.
        notes: a few lines under the table (what the figures mean, what was left out).
        machine_line: the machine, when the figures came from another one; this machine's otherwise.
        load: how busy the machine was; this machine's load averages when written otherwise ("" for none).
        results: the page (``benchmarks/RESULTS.md``).
        history: the folder that keeps replaced sections, one ``NAME.md`` per benchmark.
        now: the clock that dates the section.

    Returns:
        The section written.
    """
    if not _NAME.match(name):
        raise ValueError(f"results name {name!r}: expected lower case letters, digits, '_', '.' or '-' "
                         "(it names the section's markers and its history file); pick such a name")
    date = now().strftime("%Y-%m-%d %H:%M UTC")
    new = section(name, title, command, date, machine_line or machine().line(), table, notes,
                  load=load if load is not None else load_average())
    with _lock_for(results):
        text = results.read_text() if results.exists() else "# Benchmark results\n"
        where = find_section(text, name)
        if where is None:
            text = text.rstrip("\n") + "\n\n" + new
        else:
            start, end = where
            old = text[start:end]
            text = text[:start] + new + text[end:]
            _append_history(history / f"{name}.md", name, old)
        _write_atomic(results, with_contents(text))
    return new


def _append_history(path: Path, name: str, old: str) -> None:
    start, end = markers(name)
    # The markers stay on the page only: in the archive the old section is plain Markdown under its own heading.
    body = old.replace(start, "").replace(end, "").strip("\n")
    head = path.read_text() if path.exists() else (
        f"# History of `{name}`\n\nSections of benchmarks/RESULTS.md that a newer run of this benchmark replaced, "
        "oldest first.\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, head.rstrip("\n") + "\n\n" + body + "\n")


def add_argument(parser: argparse.ArgumentParser, name: str = "") -> None:
    """Add ``--write-results [NAME]`` to a benchmark's parser.

    Args:
        parser: the benchmark's argument parser.
        name: the section the flag alone writes; empty where the benchmark names it from its other arguments
            (it then reads ``args.write_results == ""`` as "write, under my own name for this run").
    """
    parser.add_argument("--write-results", nargs="?", const=name, default=None, metavar="NAME",
                        help="replace this benchmark's section of benchmarks/RESULTS.md with this run's table "
                             f"(NAME: the section, default {name or 'named after the run'}); the section it "
                             "replaces goes to benchmarks/history/NAME.md")


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that started this benchmark, as ``python benchmarks/NAME.py ARGS`` (for ``command=``)."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    shown = f"benchmarks/{script.name}" if script.resolve().parent == HERE else argv[0]
    return shlex.join(["python", shown, *argv[1:]])
