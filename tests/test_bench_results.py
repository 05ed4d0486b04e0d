"""benchmarks/_results.py (issue 53 item 6): a benchmark replaces its own section of the results page, inserts it
when the page has none, keeps the section it replaced in its history, and two writers at once keep both sections.
No benchmark runs here."""

from __future__ import annotations

import datetime
import multiprocessing
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _results as results

TABLE = "| a | b |\n|---|---|\n| 1 | 2 |"
CPUINFO_AMX = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
               "flags\t\t: fpu sse avx2 avx512f avx512bw avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8\n"
               "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: fpu sse\n")
CPUINFO_AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx avx2 fma\n"


def _clock(day: int):
    return lambda: datetime.datetime(2026, 12, day, 10, 30, tzinfo=datetime.UTC)


def _write(page: Path, name: str, table: str = TABLE, day: int = 7, load: str = "", **kw) -> str:
    return results.write_results(name, f"{name} title", f"python benchmarks/{name}.py", table,
                                 machine_line="Test CPU, 2 cores, no AVX-512, no AMX; Python 3", load=load,
                                 results=page, history=page.parent / "history", now=_clock(day), **kw)


def test_machine_names_cpu_vector_flags_and_versions() -> None:
    xeon = results.machine(CPUINFO_AMX, libraries=("pytest", "no-such-distribution"))
    assert xeon.cpu == "Intel(R) Xeon(R) Platinum 8481C"
    assert xeon.avx512 == ("bf16", "bw", "f", "vnni")
    assert xeon.amx == ("bf16", "int8", "tile")
    assert [n for n, _ in xeon.libraries] == ["pytest"]  # an absent library is left out, not an error
    line = xeon.line()
    assert "AVX-512 (bf16 bw f vnni)" in line and "AMX (bf16 int8 tile)" in line and f"{xeon.cores} cores" in line
    epyc = results.machine(CPUINFO_AVX2, libraries=()).line()
    assert epyc.startswith("AMD EPYC, ") and "AVX2, no AVX-512, no AMX" in epyc
    assert results.machine("", libraries=()).cpu  # no /proc/cpuinfo: the platform's name, never empty


def test_insert_then_replace_keeps_other_sections_and_text(tmp_path: Path) -> None:
    page = tmp_path / "RESULTS.md"
    page.write_text("# Benchmark results\n\nHow to regenerate.\n")
    _write(page, "alpha")
    _write(page, "beta", table="| beta |\n|---|\n| 1 |")
    text = page.read_text()
    assert text.startswith("# Benchmark results\n\nHow to regenerate.\n")
    assert text.index("<!-- results:alpha -->") < text.index("<!-- results:beta -->")
    assert "- Date: 2026-12-07 10:30 UTC" in text and "- Command: `python benchmarks/alpha.py`" in text
    assert "- Load:" not in text  # load="" leaves the line out

    _write(page, "gamma", table="| g |\n|---|\n| 0 |", load="load average 3.0")
    assert "- Load: load average 3.0\n" in page.read_text()

    _write(page, "alpha", table="| a | b |\n|---|---|\n| 3 | 4 |", day=8, notes="Newer.")
    text = page.read_text()
    assert text.count("<!-- results:alpha -->") == 1 and text.count("<!-- /results:alpha -->") == 1
    assert "| 3 | 4 |" in text and "| 1 | 2 |" not in text and "Newer." in text
    assert text.index("<!-- results:alpha -->") < text.index("<!-- results:beta -->")  # replaced in place
    assert "| beta |" in text and text.startswith("# Benchmark results\n\nHow to regenerate.\n")


def test_replaced_section_is_appended_to_history(tmp_path: Path) -> None:
    page = tmp_path / "RESULTS.md"
    _write(page, "alpha", day=5)
    assert not (tmp_path / "history" / "alpha.md").exists()  # nothing replaced yet
    _write(page, "alpha", table="| x |\n|---|\n| 2 |", day=6)
    _write(page, "alpha", table="| x |\n|---|\n| 3 |", day=7)
    history = (tmp_path / "history" / "alpha.md").read_text()
    assert history.startswith("# History of `alpha`")
    assert "<!-- results:" not in history  # markers live on the page only
    first, second = history.index("2026-12-05"), history.index("2026-12-06")
    assert first < second and "| 1 | 2 |" in history and "| 2 |" in history
    assert "| 3 |" not in history and "| 3 |" in page.read_text()


def test_bad_name_and_unclosed_marker_are_refused(tmp_path: Path) -> None:
    page = tmp_path / "RESULTS.md"
    with pytest.raises(ValueError, match="results name"):
        _write(page, "Bad Name")
    page.write_text("# r\n\n<!-- results:alpha -->\n## old\n")
    with pytest.raises(ValueError, match="closing marker"):
        _write(page, "alpha")
    assert page.read_text() == "# r\n\n<!-- results:alpha -->\n## old\n"  # left as it was


def _writer(page: str, name: str, rounds: int) -> None:
    for i in range(rounds):
        _write(Path(page), name, table=f"| {name} |\n|---|\n| {i} |")


def test_concurrent_writers_keep_both_sections(tmp_path: Path) -> None:
    page = tmp_path / "RESULTS.md"
    page.write_text("# Benchmark results\n")
    rounds = 40
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(page), name, rounds)) for name in ("alpha", "beta")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    text = page.read_text()
    for name in ("alpha", "beta"):
        assert text.count(f"<!-- results:{name} -->") == 1
        assert f"| {name} |\n|---|\n| {rounds - 1} |" in text  # each writer's last table survived the other
        history = (tmp_path / "history" / f"{name}.md").read_text()
        assert history.count("## alpha title" if name == "alpha" else "## beta title") == rounds - 1
    assert not list(tmp_path.glob(".RESULTS.md.*.tmp"))  # no temp file left behind


def test_command_line_names_the_script_under_benchmarks() -> None:
    script = str(Path(results.__file__).with_name("vs_triton.py"))
    assert results.command_line([script, "--rounds", "3", "--model", "a b"]) == \
        "python benchmarks/vs_triton.py --rounds 3 --model 'a b'"


def test_write_results_flag_is_off_by_default_and_names_the_section() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    results.add_argument(parser, "auto")
    assert parser.parse_args([]).write_results is None
    assert parser.parse_args(["--write-results"]).write_results == "auto"
    assert parser.parse_args(["--write-results", "auto_quick"]).write_results == "auto_quick"
    named_by_run = argparse.ArgumentParser()
    results.add_argument(named_by_run)
    assert named_by_run.parse_args(["--write-results"]).write_results == ""  # the benchmark names it


def test_the_page_has_one_closed_section_per_name_each_with_command_date_and_machine() -> None:
    import re

    text = results.RESULTS.read_text()
    names = re.findall(r"<!-- results:([a-z0-9][a-z0-9_.-]*) -->", text)  # NAME in the header is no section
    assert names and len(names) == len(set(names))
    for name in names:
        start, end = results.find_section(text, name)  # raises where the closing marker is missing
        body = text[start:end]
        assert body.count("<!-- results:") == 1  # sections do not nest or overlap
        for field in ("\n## ", "\n- Command: `", "\n- Date: ", "\n- Machine: "):
            assert field in body, (name, field)


def test_each_benchmark_default_section_is_on_the_page() -> None:
    import re

    page = results.RESULTS.read_text()
    named = {}
    for script in sorted(results.HERE.glob("*.py")):
        for name in re.findall(r'add_argument\(\w+, "([a-z0-9_.-]+)"\)', script.read_text()):
            named[script.name] = name
    assert len(named) >= 10  # the flag is wired into the benchmarks, not only into this module
    missing = {script: name for script, name in named.items() if f"<!-- results:{name} -->" not in page}
    assert not missing  # a first --write-results would append a new section instead of replacing the old one


def test_contents_line_follows_the_sections(tmp_path: Path) -> None:
    page = tmp_path / "RESULTS.md"
    page.write_text("# Benchmark results\n\n<!-- results-contents -->\n<!-- /results-contents -->\n")
    _write(page, "alpha")
    _write(page, "beta.2")
    text = page.read_text()
    assert "**Contents**: [alpha](#alpha-title), [beta.2](#beta2-title)\n" in text
    assert results.anchor("pyasc serve vs Triton, gRPC (issue 25) — `x`") == "pyasc-serve-vs-triton-grpc-issue-25--x"
    _write(page, "alpha", day=9)  # a replacement leaves one contents line, in page order
    assert page.read_text().count("**Contents**:") == 1
