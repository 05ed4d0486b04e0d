"""``pyasc bench --url``: perf_analyzer's sweep and LoadGen's scenarios against a served model (issue 52 item 2).

A real server (``hybrid.serve``'s public API, in this process) serves an onnx.helper model; the sweep runs over
HTTP and gRPC. The stability rule and the window accounting are checked on scripted time.
"""

from __future__ import annotations

import csv
import json
import socket
import threading
from pathlib import Path

import pytest
from _serve_support import serving, tiny_repo
from typer.testing import CliRunner

from hybrid.cli._bench_remote import SweepSettings, run_sweep
from hybrid.cli._sweep import (
    COLUMNS,
    Record,
    ServerCounters,
    StabilityPolicy,
    Window,
    measure,
    parse_range,
    stable,
    window_of,
)
from hybrid.cli.main import app
from hybrid.errors import ConfigError

pytestmark = pytest.mark.timeout(240)
FAST = ["--measurement-interval", "250", "--max-trials", "3"]


def _window(rate: float, latency_us: float) -> Window:
    return Window(seconds=1.0, requests=int(rate), errors=0, infer_per_s=rate, avg_us=latency_us,
                  percentiles_us={p: latency_us for p in (50, 90, 95, 99)}, send_us=0.0, recv_us=0.0)


# --- the stability rule, on scripted windows ---------------------------------------------------------------

def test_three_windows_within_ten_percent_are_stable_and_two_are_not() -> None:
    policy = StabilityPolicy()
    assert not stable([_window(100, 1000), _window(105, 1050)], policy)
    assert stable([_window(100, 1000), _window(105, 1050), _window(109, 1090)], policy)
    assert not stable([_window(100, 1000), _window(105, 1050), _window(111, 1000)], policy)  # throughput 11 %
    assert not stable([_window(100, 1000), _window(100, 1050), _window(100, 1120)], policy)  # latency 12 %
    assert not stable([_window(0, 0)] * 3, policy)  # nothing completed: never stable


def test_the_rule_reads_its_parameters_from_the_policy() -> None:
    w = [_window(100, 1000), _window(100, 1150), _window(100, 1000)]
    assert not stable(w, StabilityPolicy())
    assert stable(w, StabilityPolicy(stability_pct=20))
    assert stable(w[1:], StabilityPolicy(windows=1, max_trials=1))
    assert not stable([], StabilityPolicy())
    p99 = [Window(1.0, 100, 0, 100.0, 1000.0, {50: 900.0, 90: 1000.0, 95: 1100.0, 99: 2000.0 * k}, 0.0, 0.0)
           for k in (1.0, 1.3, 1.0)]
    assert stable(p99, StabilityPolicy()) and not stable(p99, StabilityPolicy(percentile=99))


def test_measure_stops_at_the_first_stable_triple_or_after_max_trials() -> None:
    seq = iter([_window(50, 3000), _window(90, 1500), _window(100, 1000), _window(102, 1010), _window(99, 1005),
                _window(500, 1)])
    level = measure("concurrency", 2, lambda: next(seq), StabilityPolicy())
    assert level.stable and len(level.windows) == 5
    assert level.merged.infer_per_s == pytest.approx((100 + 102 + 99) / 3)
    drifting = iter([_window(100 * 1.2 ** k, 1000) for k in range(20)])
    level = measure("concurrency", 1, lambda: next(drifting), StabilityPolicy(max_trials=6))
    assert not level.stable and len(level.windows) == 6


def test_a_policy_that_cannot_hold_is_hyb_102() -> None:
    for bad in ({"max_trials": 2}, {"stability_pct": 0}, {"window_s": -1}, {"percentile": 42}):
        with pytest.raises(ConfigError) as e:
            StabilityPolicy(**bad)
        assert e.value.code == "HYB-102"


# --- window accounting, on scripted time -------------------------------------------------------------------

def test_a_window_counts_what_completed_inside_it_and_the_servers_deltas_per_request() -> None:
    records = [Record(end=0.95, latency=0.010, send=0.001, recv=0.001),  # before the window
               Record(end=1.10, latency=0.010, send=0.001, recv=0.002),
               Record(end=1.50, latency=0.030, send=0.001, recv=0.002),
               Record(end=1.90, latency=0.020, send=0.001, recv=0.002, ok=False),
               Record(end=2.00, latency=0.020, send=0.001, recv=0.002)]  # at the end: the next window's
    before = ServerCounters(10, {"queue": (10, 10_000_000), "compute_input": (10, 0), "compute_infer": (10, 0),
                                 "compute_output": (10, 0)})
    after = ServerCounters(12, {"queue": (12, 14_000_000), "compute_input": (12, 1_000_000),
                                "compute_infer": (12, 20_000_000), "compute_output": (12, 0)})
    w = window_of(records, 1.0, 2.0, items=4, before=before, after=after)
    assert (w.requests, w.errors) == (2, 1)
    assert w.infer_per_s == pytest.approx(8.0)  # 2 requests x batch 4 in 1 s
    assert w.avg_us == pytest.approx(20_000) and w.send_us == pytest.approx(1000) and w.recv_us == pytest.approx(2000)
    assert w.server_us == pytest.approx({"queue": 2000, "compute_input": 500, "compute_infer": 10_000,
                                         "compute_output": 0})
    assert w.network_us == pytest.approx(20_000 - 3000 - 12_500)
    assert window_of(records, 1.0, 2.0).server_us is None  # no statistics extension: no server side


def test_counters_read_http_numbers_and_grpc_strings_alike() -> None:
    http = {"model_stats": [{"version": "1", "inference_stats": {"success": {"count": 3, "ns": 9},
                                                                  "queue": {"count": 3, "ns": 300}}}]}
    grpc = {"model_stats": [{"version": "1", "inference_stats": {"success": {"count": "3", "ns": "9"},
                                                                  "queue": {"count": "3", "ns": "300"},
                                                                  "compute_input": {}}}]}
    assert ServerCounters.from_stats(http) == ServerCounters.from_stats(grpc)
    assert ServerCounters.from_stats(http).stages["queue"] == (3, 300)


def test_ranges_parse_as_perf_analyzer_reads_them() -> None:
    assert parse_range("1:16:4", "--concurrency-range", True) == [1, 5, 9, 13]
    assert parse_range("2", "--concurrency-range", True) == [2]
    assert parse_range("10:30:10", "--request-rate-range", False) == [10.0, 20.0, 30.0]
    for bad in ("0:4", "4:1", "1:4:0", "a:b", "1:2:3:4", "1.5:2"):
        with pytest.raises(ConfigError) as e:
            parse_range(bad, "--concurrency-range", True)
        assert e.value.code == "HYB-102", bad


def test_the_sweep_runs_its_windows_on_an_injected_clock() -> None:
    now = [0.0]
    moved = threading.Condition()

    class Scripted:  # a server answering every call in 10 ms of scripted time
        def call(self, feeds, clock):
            with moved:
                now[0] += 0.010
                moved.notify_all()
            return 0.001, 0.010, 0.001, {}

        def counters(self):
            return None

    def sleep(seconds: float) -> None:  # the load runs on its own threads; time moves only with its calls
        with moved:
            end = now[0] + seconds
            assert moved.wait_for(lambda: now[0] >= end, timeout=60), "the load stopped calling"  # a hang's net

    levels = run_sweep(Scripted(), [{}], SweepSettings("concurrency", (1.0,), StabilityPolicy(window_s=0.5)), 1,
                       clock=lambda: now[0], sleep=sleep)
    assert len(levels) == 1 and levels[0].stable
    assert levels[0].merged.infer_per_s == pytest.approx(100, rel=0.1)
    assert levels[0].merged.avg_us == pytest.approx(10_000)


# --- against a real server ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving([tiny_repo(tmp_path_factory.mktemp("remote"))]) as srv:
        yield srv


def _http(server) -> str:
    return f"http://{server.url.removeprefix('http://')}"


def _invoke(*args: str):
    result = CliRunner().invoke(app, ["bench", *args], env={"COLUMNS": "200"})
    return result


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_two_step_concurrency_sweep_writes_perf_analyzers_csv_and_json(server, tmp_path: Path,
                                                                         protocol: str) -> None:
    url = _http(server) if protocol == "http" else f"grpc://{server.grpc_url}"
    out_csv, out_json, report = tmp_path / "perf.csv", tmp_path / "perf.json", tmp_path / "r.html"
    result = _invoke("--url", url, "--model", "tiny", "--concurrency-range", "1:2", *FAST, "--csv", str(out_csv),
                     "--output", str(out_json), "--report", str(report))
    assert result.exit_code == 0, result.output
    assert "instances 1 x KIND_CPU" in result.output  # the server's layout, from its model configuration
    if protocol == "http":  # pyasc serve's own record, in its statistics JSON (gRPC's protobuf has no room for it)
        assert "runtime onnxruntime, device cpu, precision fp32" in result.output
    assert "AMX" in result.output and "AVX-512" in result.output
    with out_csv.open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["Concurrency", *COLUMNS]
    assert sorted(int(r[0]) for r in rows[1:]) == [1, 2]
    for row in rows[1:]:
        values = [float(x) for x in row]
        assert all(v >= 0 for v in values) and values[1] > 0
        assert values[6] > 0  # Server Compute Infer: the server's side is there
    doc = json.loads(out_json.read_text())
    for lv in doc["levels"]:
        assert lv["server side"] is True and lv["windows"] >= 3 and lv["requests"] > 0
        assert all(lv[c] >= 0 for c in COLUMNS)
    text = report.read_text()
    assert "<svg" in text and "Latency vs throughput" in text and "<script" not in text


def test_a_request_rate_level_over_grpc(server) -> None:
    result = _invoke("--url", f"grpc://{server.grpc_url}", "--model", "tiny", "--request-rate-range", "40",
                     "--request-distribution", "poisson", *FAST, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    (level,) = doc["levels"]
    assert level["Request Rate"] == 40 and level["Server Queue"] >= 0 and level["server side"]


def test_a_one_second_loadgen_scenario_against_the_server(server) -> None:
    result = _invoke("--url", _http(server), "--model", "tiny", "--scenario", "singlestream", "--min-duration", "1",
                     "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["results"]
    assert row["scenario"] == "singlestream" and row["status"] == "ok" and row["metric"] > 0
    assert row["short_run"] is True


# --- errors ------------------------------------------------------------------------------------------------

def _code(result) -> str:
    assert result.exit_code != 0, result.output
    return result.output


def test_bad_url_unreachable_server_unknown_model_and_bad_range_have_stable_codes(server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # bound, not listening: refused
        assert "HYB-716" in _code(_invoke("--url", f"http://127.0.0.1:{closed}", "--model", "tiny"))
        assert "HYB-716" in _code(_invoke("--url", f"grpc://127.0.0.1:{closed}", "--model", "tiny"))
    assert "HYB-102" in _code(_invoke("--url", "ftp://127.0.0.1:1", "--model", "tiny"))
    assert "HYB-102" in _code(_invoke("--url", "http://127.0.0.1:8000/v2", "--model", "tiny"))
    assert "HYB-102" in _code(_invoke("--url", _http(server)))  # no --model
    assert "HYB-701" in _code(_invoke("--url", _http(server), "--model", "nope"))
    assert "HYB-701" in _code(_invoke("--url", f"grpc://{server.grpc_url}", "--model", "nope"))
    assert "HYB-102" in _code(_invoke("--url", _http(server), "--model", "tiny", "--concurrency-range", "4:1"))
    assert "HYB-102" in _code(_invoke("--url", _http(server), "--model", "tiny", "--request-rate-range", "x"))
    assert "HYB-102" in _code(_invoke("--url", _http(server), "--model", "tiny", "--concurrency-range", "1",
                                      "--request-rate-range", "5"))
    assert "HYB-102" in _code(_invoke("--url", _http(server), "--model", "tiny", "--shapes", "nope:1x4"))
    assert "HYB-102" in _code(_invoke())  # neither a MODEL nor --url
    refused = _code(_invoke("--url", _http(server), "--model", "tiny", "--shapes", "x:1x4,scale:2x1", *FAST))
    assert "HYB-702" in refused and "HYB-405" in refused  # the server's own reason, carried


def test_a_dynamic_dim_no_option_sizes_is_hyb_417() -> None:
    from types import SimpleNamespace

    from hybrid.cli._remote import remote_samples
    from hybrid.errors import RunError

    served = SimpleNamespace(name="m", max_batch_size=8, inputs=[("ids", "INT64", (-1, -1))])
    with pytest.raises(RunError) as e:
        remote_samples(served, None, None, None)
    assert e.value.code == "HYB-417" and "ids:NxN" in e.value.hint
    (first, *_) = remote_samples(served, {"ids": (2, 16)}, None, None)
    assert first["ids"].shape == (2, 16) and first["ids"].dtype.name == "int64"
    served = SimpleNamespace(name="m", max_batch_size=8, inputs=[("x", "FP32", (-1, 4))])
    assert remote_samples(served, None, 3, None)[0]["x"].shape == (3, 4)  # dim 0 of a batching model: --batch


# --- the report says what ran (item 3) ---------------------------------------------------------------------

def test_a_local_bench_names_the_machines_units_and_the_layout(tmp_path: Path) -> None:
    from _serve_support import tiny_model

    model = tiny_model(tmp_path / "tiny.onnx")
    result = _invoke(str(model), "-t", "onnxruntime", "-p", "fp32", "--shapes", "x:2x4,scale:2x1", "--blocks", "1",
                     "--per-block", "2", "--nthreads", "1")
    assert result.exit_code == 0, result.output
    assert "AMX" in result.output and "AVX-512" in result.output
    assert "layout: onnxruntime: threads 1, streams default" in result.output


def test_a_loadgen_server_report_has_the_search_curve(tmp_path: Path) -> None:
    from _serve_support import tiny_model

    model = tiny_model(tmp_path / "tiny.onnx")
    report = tmp_path / "server.html"
    result = _invoke(str(model), "-t", "onnxruntime", "-p", "fp32", "--shapes", "x:1x4,scale:1x1", "--scenario",
                     "server", "--min-duration", "0.3", "--search-runs", "2", "--target-qps", "20",
                     "--latency-bound", "200", "--report", str(report))
    assert result.exit_code == 0, result.output
    text = report.read_text()
    assert "Server search: p99 vs QPS" in text and "<svg" in text and "layout:" in text
