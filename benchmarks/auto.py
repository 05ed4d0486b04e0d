"""target='auto' against the raw runtimes, same process, same inputs, interleaved in blocks.

For each light model (batch 1) and a BERT-style encoder built from a transformers config (6 layers,
hidden 384, 12 heads, intermediate 1536; batch 8 x 128 tokens; random weights, nothing downloaded),
it times raw onnxruntime (default session), raw OpenVINO at f32, and ``hybrid.compile(target='auto')``
(checked against the reference backend, timed, cached); auto / best raw is the median over blocks of the ratio
within each block (see _harness.paired_ratio). On the encoder it also times
``precision='auto', accuracy={'min_cosine': 0.995}`` and reports its cosine against onnxruntime fp32.

Run (alone on the machine; takes a few minutes):
    flock /tmp/bench.lock python benchmarks/auto.py [--models resnet50,bert] [--blocks 5 --per-block 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results
from _harness import geomean, interleave, machine_info, median_ms, paired_ratio, table

BERT = "bert-6x384"


def export_bert(folder: Path, dynamic: bool = False) -> Path:
    """Export the BERT-style encoder with torch.onnx; return the .onnx path.

    Args:
        folder: Where the model is written (reused when it is there).
        dynamic: Batch and sequence length as dynamic axes, as an exported encoder is served; else static 8 x 128.
    """
    import torch
    from transformers import BertConfig, BertModel

    path = folder / ("bert_6x384_dynamic.onnx" if dynamic else "bert_6x384.onnx")
    if path.exists():
        return path
    cfg = BertConfig(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536)
    torch.manual_seed(0)
    bert = BertModel(cfg).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(0, cfg.vocab_size, (8, 128))
    mask = torch.ones(8, 128, dtype=torch.int64)
    torch.onnx.export(Encoder().eval(), (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                      dynamic_axes={n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask",
                                                                            "last_hidden_state")} if dynamic else None)
    return path


def bert_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((8, 128), np.int64)
    mask[:, 100:] = 0  # padded tail, as in a real batch
    return {"input_ids": rng.integers(0, 30522, (8, 128)).astype(np.int64), "attention_mask": mask}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main() -> None:
    from hybrid.zoo import samples

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join([*samples.LIGHT_MODELS, BERT]))
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--per-block", type=int, default=5)
    ap.add_argument("--keep-cache", action="store_true", help="use the user's cache instead of a fresh one")
    ap.add_argument("--lead-s", type=float, default=0.05,
                    help="seconds of calls at the start of each block that are run but not timed: a runtime whose "
                         "pool idled takes about that long to serve at its steady speed (0: time from the first call)")
    _results.add_argument(ap, "auto")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hybrid-bench-auto-"))
    if not args.keep_cache:  # measure the search itself, then the cached second compile
        os.environ["HYBRID_CACHE_DIR"] = str(work / "cache")

    import onnxruntime as ort
    import openvino as ov

    import hybrid

    core = ov.Core()
    print(machine_info())
    rows, speedups, verdicts = [], [], []
    for name in args.models.split(","):
        if name == BERT:
            path, feeds = export_bert(work), bert_feeds()
        else:
            path = samples.light_model_path(name)
            feeds = {hybrid.Model.load(path).signature.input_names[0]: samples.light_input()}
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        req = core.compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                    "PERFORMANCE_HINT": "LATENCY"}).create_infer_request()
        t0 = time.perf_counter()
        cm = hybrid.compile(path, target="auto", sample_inputs=feeds)
        search_s = time.perf_counter() - t0
        cm.tune(feeds)  # a near tie at compile is confirmed on real calls first (a server's --warmup does this)
        t0 = time.perf_counter()
        hybrid.compile(path, target="auto", sample_inputs=feeds).close()
        cached_s = time.perf_counter() - t0
        contenders = {
            "onnxruntime": lambda s=sess, f=feeds: s.run(None, f),
            "openvino f32": lambda r=req, f=feeds: r.infer(f, share_inputs=True),
            "auto": lambda c=cm, f=feeds: c.run(f),
        }
        cm_p = None
        if name == BERT:
            cm_p = hybrid.compile(path, target="auto", precision="auto", accuracy={"min_cosine": 0.995},
                                  sample_inputs=feeds)
            cm_p.tune(feeds)
            contenders["auto precision"] = lambda c=cm_p, f=feeds: c.run(f)
        times = interleave(contenders, blocks=args.blocks, per_block=args.per_block, lead_s=args.lead_s)
        seg = cm.plan.segments[0]
        picked = cm.backend if len(cm.plan.segments) > 1 else f"{seg.backend} {seg.precision}"
        med = {k: median_ms(v) for k, v in times.items()}
        best_raw = min(("onnxruntime", "openvino f32"), key=med.__getitem__)
        ratio = paired_ratio(times, "auto", best_raw, args.per_block)  # per block, then the median
        speedups.append(med["onnxruntime"] / med["auto"])
        verdicts.append(ratio <= 1.05)
        rows.append([name, f"{med['onnxruntime']:.2f}", f"{med['openvino f32']:.2f}", f"{med['auto']:.2f}", picked,
                     f"{ratio:.3f}", f"{med['onnxruntime'] / med['auto']:.2f}x", f"{search_s:.1f} s",
                     f"{cached_s:.2f} s"])
        if cm_p is not None:
            ref = sess.run(None, feeds)[0]
            cos = cosine(cm_p.run(feeds)["last_hidden_state"], ref)
            pseg = cm_p.plan.segments[0]
            rows.append([f"{name} precision=auto", f"{med['onnxruntime']:.2f}", f"{med['openvino f32']:.2f}",
                         f"{med['auto precision']:.2f}", f"{pseg.backend} {pseg.precision}", f"cos {cos:.6f}",
                         f"{med['onnxruntime'] / med['auto precision']:.2f}x", "", ""])
            cm_p.close()
        cm.close()
        print(f"{name}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items()) + f" -> auto picked {picked}",
              flush=True)
    results = table(["model", "onnxruntime ms", "openvino f32 ms", "auto ms", "auto picked",
                     "auto / best raw (paired)", "speedup vs ORT", "first compile", "second compile"], rows)
    summary = (f"geometric-mean speedup of target='auto' over raw onnxruntime: {geomean(speedups):.2f}x "
               f"({len(speedups)} models); auto within 1.05 x min(raw) on {sum(verdicts)} of {len(verdicts)}")
    print()
    print(results)
    print()
    print(summary)
    if args.write_results:
        _results.write_results(args.write_results, "Auto-selection on the light models", _results.command_line(),
                               results, notes=summary)


if __name__ == "__main__":
    main()
