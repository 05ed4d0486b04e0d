"""``pyasc bench --url``'s options (perf_analyzer's spelling where it has one) and their checks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from hybrid.errors import ConfigError

__all__ = ["run_remote"]

Url = Annotated[str | None, typer.Option("--url", help="Measure a served model instead of a file: "
                                         "http://HOST:PORT or grpc://HOST:PORT of any KServe v2 / Triton server "
                                         "(pyasc serve, tritonserver); perf_analyzer -u with -i.")]
ServedModel = Annotated[str | None, typer.Option("--model", "-m", help="With --url: the served model's name "
                                                 "(perf_analyzer -m).")]
ModelVersion = Annotated[str, typer.Option("--model-version", help="With --url: its version (default: the "
                                           "server's choice; perf_analyzer -x).")]
ConcurrencyRange = Annotated[str | None, typer.Option("--concurrency-range", help="With --url: START[:END[:STEP]] "
                                                      "callers in a closed loop, one level each (perf_analyzer's "
                                                      "option; the default sweep is 1, or --concurrency).")]
RequestRateRange = Annotated[str | None, typer.Option("--request-rate-range", help="With --url: START[:END[:STEP]] "
                                                      "requests per second, one level each (perf_analyzer's "
                                                      "option).")]
RequestDistribution = Annotated[str, typer.Option("--request-distribution", help="With --request-rate-range: "
                                                  "constant or poisson intervals (perf_analyzer's option).")]
MeasurementInterval = Annotated[float, typer.Option("--measurement-interval", help="With --url: milliseconds per "
                                                    "window (perf_analyzer -p).")]
StabilityPercentage = Annotated[float, typer.Option("--stability-percentage", help="With --url: the last 3 windows "
                                                    "agree when max/min of throughput and of latency are within "
                                                    "this percent (perf_analyzer -s).")]
MaxTrials = Annotated[int, typer.Option("--max-trials", help="With --url: windows per level at most "
                                        "(perf_analyzer -r).")]
Percentile = Annotated[int | None, typer.Option("--percentile", help="With --url: compare this latency percentile "
                                                "(50, 90, 95, 99) instead of the mean (perf_analyzer's option).")]
LatencyThreshold = Annotated[float | None, typer.Option("--latency-threshold", help="With --url: stop the sweep "
                                                        "after a level whose p99 exceeds this many ms "
                                                        "(perf_analyzer -l).")]
MaxThreads = Annotated[int, typer.Option("--max-threads", help="With --request-rate-range: sender threads "
                                         "(perf_analyzer's option).", min=1)]
CsvPath = Annotated[Path | None, typer.Option("--csv", help="With --url: write perf_analyzer's CSV here "
                                              "(perf_analyzer -f).")]


def run_remote(url: str, model: str | None, version: str, shapes: str | None, batch: int | None,
               inputs: list[str] | None, scenario: str | None, concurrency: int, concurrency_range: str | None,
               rate_range: str | None, distribution: str, interval_ms: float, stability_pct: float, max_trials: int,
               percentile: int | None, latency_threshold: float | None, max_threads: int, *, as_json: bool,
               as_markdown: bool, output: Path | None, csv_path: Path | None, report: Path | None,
               loadgen: Mapping[str, Any]) -> None:
    """Check the options and measure the served model (:func:`hybrid.cli._bench_remote.remote_command`).

    Raises:
        ConfigError: HYB-102 for options that contradict each other or a bad range.
    """
    from hybrid.cli._bench_remote import SweepSettings, remote_command
    from hybrid.cli._inputs import load_inputs, parse_shapes
    from hybrid.cli._sweep import StabilityPolicy, parse_range

    if as_json and as_markdown:
        raise ConfigError("HYB-102", "--json and --markdown both choose what stdout gets; give one")
    if concurrency_range and rate_range:
        raise ConfigError("HYB-102", "--concurrency-range and --request-rate-range both choose the load; give one")
    if latency_threshold is not None and not latency_threshold > 0:
        raise ConfigError("HYB-102", f"--latency-threshold: expected a number of ms > 0, got {latency_threshold}")
    sweep = None
    settings = None
    if scenario is not None:
        if concurrency_range or rate_range or csv_path:
            raise ConfigError("HYB-102", "--scenario runs LoadGen; --concurrency-range, --request-rate-range and "
                              "--csv belong to the perf_analyzer sweep", "give one or the other")
        settings = {"scenario": scenario.lower(), **loadgen}
    else:
        if rate_range:
            mode, levels = "request_rate", parse_range(rate_range, "--request-rate-range", integer=False)
        else:
            mode = "concurrency"
            levels = parse_range(concurrency_range or str(concurrency), "--concurrency-range", integer=True)
        policy = StabilityPolicy(window_s=interval_ms / 1000, stability_pct=stability_pct, max_trials=max_trials,
                                 percentile=percentile)
        sweep = SweepSettings(mode, tuple(levels), policy, distribution, max_threads, latency_threshold)
        if distribution not in ("constant", "poisson"):
            raise ConfigError("HYB-102", f"--request-distribution: expected constant or poisson, got "
                              f"{distribution!r}")
    remote_command(url, model, version, parse_shapes(shapes) if shapes else None, batch, load_inputs(inputs),
                   sweep, settings, as_json=as_json, as_markdown=as_markdown, output=output, csv_path=csv_path,
                   report=report)
