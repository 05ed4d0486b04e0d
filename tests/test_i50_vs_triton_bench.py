"""benchmarks/vs_triton.py's own logic (issue 50): Triton layouts parsed, each block's best Triton layout paired with
every other server, a zoo model described from its ONNX file, and the wait for idle servers on scripted time."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import vs_triton as vt


def test_layouts_parse_and_refuse_bad_ones() -> None:
    assert vt.parse_layouts("1x2, 2x1,4x2") == [(1, 2), (2, 1), (4, 2)]
    for bad in ("", "2", "0x1", "2x", "1x2,1x2", "ax1"):
        with pytest.raises(ValueError):
            vt.parse_layouts(bad)


def _block(r: int, n: int, server: str, rate: float, p99: float = 10.0) -> dict[str, object]:
    return {"round": r, "clients": n, "server": server, "inf_s": rate, "p99_ms": p99}


def test_each_block_pairs_with_its_own_best_triton_layout() -> None:
    blocks = [_block(0, 4, "triton-1x2", 100, 5), _block(0, 4, "triton-2x1", 200, 7), _block(0, 4, "pyasc-plain", 300),
              _block(1, 4, "triton-1x2", 150, 6), _block(1, 4, "triton-2x1", 120, 8), _block(1, 4, "pyasc-plain", 300),
              _block(2, 4, "triton-1x2", 100, 5)]  # round 2 unfinished: left out
    [row] = vt.summarize(blocks, [4, 16], ["triton-1x2", "triton-2x1", "pyasc-plain"])
    assert row["rounds"] == [0, 1]
    assert row["triton_best"]["servers"] == ["triton-2x1", "triton-1x2"]
    assert row["triton_best"]["p99_ms"] == [7, 6]
    assert row["servers"]["pyasc-plain"]["ratios"] == [1.5, 2.0]
    assert row["servers"]["pyasc-plain"]["median_ratio"] == 1.75
    assert row["servers"]["triton-1x2"]["ratios"] == [0.5, 1.0]
    table = vt.tables([row], ["triton-1x2", "triton-2x1", "pyasc-plain"])
    assert "| 4 | 175 | 2x1, 1x2 | 6.5 | 300 | x1.75 | 10.0 |" in table


def test_quiet_waits_for_idle_servers_on_scripted_time() -> None:
    now = [0.0]
    used = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
        used[0] += 0.5 if now[0] <= 6 else 0.0  # busy for the first 6 s, then idle

    assert vt.quiet({"a": lambda: used[0]}, 20, clock=lambda: now[0], sleep=sleep) == 8.0
    now[0], used[0] = 0.0, 0.0
    assert vt.quiet({"a": lambda: used[0]}, 4, clock=lambda: now[0], sleep=sleep) is None


@pytest.mark.parametrize(("name", "batched", "inputs", "outputs"), [
    ("crnn", True, [("x", "FP32", (3, 48, -1))], [("probs", "FP32", (-1, 37))]),
    ("encoder", True, [("input_ids", "INT64", (-1,)), ("attention_mask", "INT64", (-1,))],
     [("last_hidden_state", "FP32", (-1, 64)), ("pooler_output", "FP32", (64,))]),
    ("detector", False, [("x", "FP32", (1, 3, -1, -1))], [("output0", "FP32", (-1, -1, -1))]),
])
def test_a_zoo_model_is_described_from_its_onnx_file(tmp_path: Path, name: str, batched: bool,
                                                      inputs: list[tuple[str, str, tuple[int, ...]]],
                                                      outputs: list[tuple[str, str, tuple[int, ...]]]) -> None:
    pytest.importorskip("tritonclient")
    served = vt.build_model(tmp_path, name)
    assert served.batched is batched
    assert [(t.name, t.datatype, t.dims) for t in served.inputs] == inputs
    assert [(t.name, t.datatype, t.dims) for t in served.outputs] == outputs
    assert served.max_batch == (vt.MAX_BATCH if batched else 0)
    if batched:
        assert all(v.shape[0] == 1 for v in served.sample.values())
    assert set(served.reference) == {t.name for t in served.outputs}
    config = vt.triton_repository(tmp_path / "t", served, 1, instances=4) / vt.MODEL / "config.pbtxt"
    text = config.read_text()
    assert "count: 4" in text
    assert ("dynamic_batching" in text) is batched


def test_distinct_samples_vary_a_float_input_only() -> None:
    served = vt.Served(Path("m.onnx"), (vt.Tensor("ids", "INT64", (-1,)), vt.Tensor("x", "FP32", (2,))), (), True,
                       {"ids": np.zeros((1, 3), np.int64), "x": np.zeros((1, 2), np.float32)}, {})
    old = vt.DISTINCT
    try:
        vt.DISTINCT = 3
        got = vt.samples(served)
    finally:
        vt.DISTINCT = old
    assert [s["x"][0, 0] for s in got] == [0, 1, 2]
    assert all(not s["ids"].any() for s in got)
