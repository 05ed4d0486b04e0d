"""benchmarks/repeatability.py's own logic (issue 51): traffic read against the bursts, buckets settled, picks and
gaps summarised, the idle sessions' CPU read from a /proc of the test's own. No process is started."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import repeatability as rp


def _cand(label: str, ratio: float | None, outcome: str, reason: str = "") -> dict[str, object]:
    return {"label": label, "ratio": ratio, "outcome": outcome, "reason": reason}


def _record(batch: int, state: str = "decided", serving: str = "onnxruntime:cpu", ov: tuple = (1.3, "slower"),
            after_s: float | None = 12.0, calls: int | None = 500) -> dict[str, object]:
    return {"key": [["x", [batch, 4, 64, 256]]], "state": state, "serving": serving,
            "decided_after_s": after_s if state == "decided" else None,
            "decided_after_calls": calls if state == "decided" else None,
            "candidates": [_cand("torch:cpu", 12.0, "slower", "pruned: at least 6x"), _cand("openvino:cpu", *ov),
                           _cand(serving, 1.0, "serving")]}


def test_ranges_parse_and_refuse_bad_ones() -> None:
    assert rp.parse_range("5,10") == (5.0, 10.0)
    assert rp.parse_range(" 30 , 60 ") == (30.0, 60.0)
    for bad in ("5", "10,5", "0,3", "a,b", "1,2,3"):
        with pytest.raises(argparse.ArgumentTypeError):
            rp.parse_range(bad)


def test_traffic_counts_only_burst_seconds_between_first_call_and_until() -> None:
    bursts = [(100.0, 107.0), (150.0, 158.0), (200.0, 205.0)]
    assert rp.traffic_s(bursts, 100.0, 300.0) == pytest.approx(20.0)
    assert rp.traffic_s(bursts, 100.0, 154.0) == pytest.approx(11.0)  # the second burst's first 4 s
    assert rp.traffic_s(bursts, 100.0, 120.0) == pytest.approx(7.0)  # a decision in the pause: the pause is no traffic
    assert rp.traffic_s(bursts, 102.0, 104.0) == pytest.approx(2.0)


def test_settled_means_decided_with_nothing_open() -> None:
    assert rp.settled(_record(1))
    assert not rp.settled(_record(1, state="tuning"))
    assert not rp.settled(_record(1, ov=(None, "open")))  # decided, but a candidate left untimed for the re-check


def test_runner_up_is_the_closest_judged_candidate() -> None:
    assert rp.runner_up(_record(1)) == ("openvino:cpu", 1.3)
    rejected = _record(1, ov=(None, "rejected"))
    assert rp.runner_up(rejected) == ("torch:cpu", 12.0)
    alone = {**rejected, "candidates": [c for c in rejected["candidates"] if c["label"] != "torch:cpu"]}
    assert rp.runner_up(alone) is None


def test_picks_are_counted_and_the_undecided_never_agree() -> None:
    assert rp.picks_label(["a", "a", "a"]) == ("a x3", 3)
    assert rp.picks_label(["b", "a", "a", None]) == ("a x2, b x1, not decided x1", 2)
    assert rp.picks_label([None, None]) == ("not decided x2", 0)


def test_candidates_label_gives_median_ratio_and_outcomes() -> None:
    text = rp.candidates_label([_record(1, ov=(1.2, "slower")), _record(1, ov=(1.4, "slower")),
                                _record(1, ov=(1.01, "tie"))])
    assert text == "openvino:cpu 1.2 (slower x2, tie x1); torch:cpu 12 (pruned x3)"


def test_watch_places_the_decision_and_the_settling_on_the_clock() -> None:
    w = rp.Watch()
    w.see([_record(1, state="tuning")], 1.0)
    w.see([_record(1, ov=(None, "open")), _record(8, state="tuning")], 2.0)
    assert not w.settled_all((1, 8))
    w.see([_record(1), _record(8)], 3.0)
    w.see([_record(1, serving="openvino:cpu", ov=(0.9, "faster")), _record(8)], 4.0)
    assert w.settled_all((1, 8))
    one = w.buckets[1]
    assert (one["decided"], one["settled"], one["flips"]) == (2.0, 3.0, 1)
    assert one["record"]["serving"] == "onnxruntime:cpu" and one["record"]["later"] == "openvino:cpu"


def test_bucket_outcome_reads_traffic_to_decision_and_to_settling() -> None:
    w = rp.Watch()
    w.see([_record(1, after_s=55.0)], 160.0)
    out = rp.bucket_outcome(w.buckets[1], 1, [(100.0, 107.0), (150.0, 165.0)], 100.0)
    assert out["pick"] == "onnxruntime:cpu"
    assert out["traffic_s"] == pytest.approx(12.0)  # 7 s of the first burst, 5 of the second up to 155
    assert out["settle_traffic_s"] == pytest.approx(17.0)
    assert out["bursts"] == 2 and out["calls"] == 500 and out["wall_s"] == 55.0
    assert rp.bucket_outcome(None, 8, [], None)["pick"] is None


def _outcome(pick: str | None, ov: float = 1.3, traffic: float = 10.0) -> dict[str, object]:
    record = _record(1, serving=pick or "onnxruntime:cpu", ov=(ov, "slower"))
    return {"pick": pick, "record": record if pick else None, "traffic_s": traffic if pick else None,
            "settle_traffic_s": traffic if pick else None, "bursts": 2, "calls": 400, "wall_s": 40.0, "flips": 0,
            "background": [0.1]}


def test_summary_row_verdicts() -> None:
    row = dict(zip(rp.HEADERS, rp.summary_row("m", 1, [_outcome("onnxruntime:cpu")] * 5, 0.02, 30.0)))
    assert row["same pick"] == "5/5" and row["same pick where the gap exceeds the tie band"] == "holds"
    assert row["within the bound"] == "yes" and row["not settled"] == "0"
    split = [_outcome("onnxruntime:cpu")] * 4 + [_outcome(None)]
    row = dict(zip(rp.HEADERS, rp.summary_row("m", 1, split, 0.02, 30.0)))
    assert row["same pick where the gap exceeds the tie band"] == "fails (4/5)" and row["not settled"] == "1"
    tie = [_outcome("onnxruntime:cpu", ov=1.01)] * 3 + [_outcome("openvino:cpu", ov=1.01, traffic=31.0)] * 2
    row = dict(zip(rp.HEADERS, rp.summary_row("m", 1, tie, 0.02, 30.0)))
    assert row["same pick where the gap exceeds the tie band"] == "tie: any pick"
    assert row["within the bound"] == "no (31.0 s)"


def test_group_cpu_reads_only_the_named_groups(tmp_path: Path) -> None:
    ticks = os.sysconf("SC_CLK_TCK")

    def stat(pid: int, pgrp: int, utime: int, stime: int, cutime: int = 0) -> None:
        rest = ["S", "1", str(pgrp)] + ["0"] * 8 + [str(utime), str(stime), str(cutime), "0"] + ["0"] * 5
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (py (thon)) " + " ".join(rest) + "\n")

    stat(10, 10, ticks, ticks)
    stat(11, 10, ticks, 0, cutime=ticks)
    stat(20, 20, 5 * ticks, 0)
    assert rp.group_cpu_s([10], proc=tmp_path) == pytest.approx(4.0)
    assert rp.group_cpu_s([10, 20], proc=tmp_path) == pytest.approx(9.0)
    assert rp.group_cpu_s([30], proc=tmp_path) == 0.0
