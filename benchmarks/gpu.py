"""GPU benchmark: hybrid ``target='cuda'`` vs torch eager on CUDA vs ONNX Runtime on the CPU.

Workloads, each at batch 1 and 32 (``--batches``):

* ResNet-50-class light models from ONNX's zoo (resnet50, inception_v1, densenet121), made
  batch-dynamic by hybrid's batch pass; with random weights (the shipped ones are uniform). They
  exist only as ONNX, so they have no torch eager column.
* ResNet-50 as a torch module (torchvision's when installed, else the same architecture defined here),
  exported to ONNX.
* A BERT-style encoder: transformers ``BertModel(BertConfig(num_hidden_layers=6, hidden_size=384))``
  at sequence length 128; without transformers, ``torch.nn.TransformerEncoder`` of the same size
  (the table says which ran).

Every contender takes the same numpy input and returns numpy (host->device->host copies included for
the GPU ones), runs interleaved in blocks, and its outputs are compared with hybrid's. Installs
nothing. Without a CUDA device the GPU parts are skipped (exit 0); ``--device cpu --quick`` runs the
whole flow on the CPU in a minute, to check the script itself.

    python benchmarks/gpu.py [--device cuda|cpu] [--quick] [--out results.md]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results
from _harness import interleave, machine_info, median_ms, table


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- models
def _light_random(name: str):
    """A light model with random weights (hybrid.zoo.samples), batch made dynamic."""
    import hybrid
    from hybrid.passes.batch import make_batch_dynamic
    from hybrid.zoo.samples import light_model_with_random_weights

    return make_batch_dynamic(hybrid.Model.load(light_model_with_random_weights(name)))


def _resnet50(torch):
    try:
        import torchvision

        return torchvision.models.resnet50(weights=None), "torchvision resnet50"
    except ImportError:
        pass
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    layers, cin = [], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    net = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                        nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))
    return net, "ResNet-50 (torchvision architecture, defined here)"


def _encoder(torch, layers: int, hidden: int, vocab: int = 30522):
    try:
        from transformers import BertConfig, BertModel

        cfg = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, intermediate_size=4 * hidden)

        class Bert(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = BertModel(cfg, add_pooling_layer=False)

            def forward(self, ids):
                return self.bert(input_ids=ids).last_hidden_state

        return Bert(), f"transformers BertModel ({layers} layers, hidden {hidden})"
    except ImportError:
        pass
    nn = torch.nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.pos = nn.Parameter(torch.randn(1, 512, hidden) * 0.02)
            layer = nn.TransformerEncoderLayer(hidden, hidden // 64, 4 * hidden, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=False)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

        def forward(self, ids):
            x = self.embed(ids) + self.pos[:, : ids.shape[1]]
            return self.encoder(x)

    return Encoder(), f"torch.nn.TransformerEncoder ({layers} layers, hidden {hidden}; transformers not installed)"


def _export(torch, module, example, input_name: str):
    """ONNX bytes of ``module`` with a dynamic batch: the TorchScript exporter (needs nothing more),
    else the dynamo one (needs onnxscript)."""
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(module, (example,), out, dynamo=False, input_names=[input_name], output_names=["y"],
                              dynamic_axes={input_name: {0: "N"}, "y": {0: "N"}}, opset_version=17)
            return out.getvalue(), "torch.onnx.export (TorchScript)"
        except Exception as first:  # try the other exporter; report both if it fails too
            out = io.BytesIO()
            try:
                batch = torch.export.Dim("N", min=1, max=1024)
                program = torch.onnx.export(module, (example,), dynamo=True, input_names=[input_name],
                                            output_names=["y"], dynamic_shapes=({0: batch},))
                program.save(out)
                return out.getvalue(), "torch.onnx.export (dynamo)"
            except Exception as second:
                raise RuntimeError(f"export failed: TorchScript: {first}; dynamo: {second}") from second


# ---------------------------------------------------------------------------------------------- contenders
def _ort_cpu(model_bytes: bytes):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda x: sess.run(None, {name: x})[0]


def _eager(torch, module, device):
    module = module.to(device).eval()

    def run(x):
        with torch.inference_mode():
            y = module(torch.from_numpy(x).to(device))
            return y.float().cpu().numpy() if y.dtype != torch.int64 else y.cpu().numpy()

    return run


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("nan")
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _measure(contenders: dict, quick: bool) -> dict[str, list[float]]:
    # one call each to size the blocks: about 0.5 s per contender per block, at least 2 calls
    per_call = {}
    for name, fn in contenders.items():
        t0 = time.perf_counter()
        fn()
        per_call[name] = time.perf_counter() - t0
    per_block = max(2, min(20, int(0.5 / max(max(per_call.values()), 1e-4))))
    blocks = 2 if quick else 4
    return interleave(contenders, blocks=blocks, per_block=per_block, warmup=1 if quick else 3, pause=0.1)


def _bench_one(label, model, module_info, example_fn, batches, device, torch, quick, rows, notes):
    import hybrid

    cm = hybrid.compile(model, target=device)
    model_bytes = hybrid.Model.load(model).to_bytes()
    ort_run = _ort_cpu(model_bytes)
    eager = _eager(torch, module_info[0], device) if module_info else None
    for batch in batches:
        x = example_fn(batch)
        contenders = {"hybrid": lambda x=x: cm(x), "ort_cpu": lambda x=x: ort_run(x)}
        if eager is not None:
            contenders["eager"] = lambda x=x: eager(x)
        outs = {name: fn() for name, fn in contenders.items()}
        times = _measure(contenders, quick)
        h = median_ms(times["hybrid"])
        e = median_ms(times["eager"]) if eager is not None else None
        o = median_ms(times["ort_cpu"])
        rows.append([label, batch, f"{cm.backend}:{cm.device}", h, e if e is not None else "n/a", o,
                     (h / e) if e else "n/a", o / h,
                     f"{_rel(outs['hybrid'], outs['eager']):.1e}" if eager is not None else "n/a",
                     f"{_rel(outs['hybrid'], outs['ort_cpu']):.1e}"])
        _log(f"  {label} batch {batch}: hybrid {h:.2f} ms, eager {e if e is None else round(e, 2)} ms, "
             f"ORT CPU {o:.2f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda (default when present), cuda:N, or cpu (dry run)")
    parser.add_argument("--quick", action="store_true", help="small workloads and few iterations")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,32)")
    parser.add_argument("--out", default=None, help="Markdown file for the table (default: $OUT/gpu_results.md)")
    _results.add_argument(parser)  # the section: gpu, or gpu_cpu for the CPU self-check
    args = parser.parse_args(argv)

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else None)
    if device is None:
        print("no CUDA device visible to torch: GPU benchmark skipped (use --device cpu --quick to check "
              "the script on the CPU)")
        return 0
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {device}: torch sees no CUDA device; GPU benchmark skipped")
        return 0
    quick = args.quick
    batches = [int(b) for b in (args.batches or ("1,2" if quick else "1,32")).split(",")]
    torch.manual_seed(0)
    if device.startswith("cuda"):
        torch.backends.cudnn.benchmark = True
        card = f"{torch.cuda.get_device_name(torch.device(device))}, CUDA {torch.version.cuda}, " \
               f"cuDNN {torch.backends.cudnn.version()}"
    else:
        card = "no GPU: CPU dry run of the script"
    rows: list[list] = []
    notes: list[str] = []
    rng = np.random.default_rng(0)

    light = ["resnet50"] if quick else ["resnet50", "inception_v1", "densenet121"]
    for name in light:
        _log(f"light {name}")
        model = _light_random(name)
        _bench_one(f"light {name}", model, None,
                   lambda b: rng.random((b, 3, 224, 224), dtype=np.float32), batches, device, torch, quick, rows, notes)

    net, desc = _resnet50(torch)
    net.eval()
    onnx_bytes, exporter = _export(torch, net, torch.randn(2, 3, 224, 224), "images")
    notes.append(f"ResNet-50 module: {desc}; exported with {exporter}")
    _log("resnet50 module")
    _bench_one("ResNet-50 (torch)", onnx_bytes, (net,),
               lambda b: rng.random((b, 3, 224, 224), dtype=np.float32), batches, device, torch, quick, rows, notes)

    layers, hidden, seq = (2, 128, 16) if quick else (6, 384, 128)
    enc, desc = _encoder(torch, layers, hidden)
    enc.eval()
    onnx_bytes, exporter = _export(torch, enc, torch.randint(0, 1000, (2, seq)), "ids")
    notes.append(f"encoder: {desc}, sequence length {seq}; exported with {exporter}")
    _log("encoder")
    _bench_one(f"BERT-style encoder (L{layers}, H{hidden}, S{seq})", onnx_bytes, (enc,),
               lambda b: rng.integers(0, 1000, (b, seq), dtype=np.int64), batches, device, torch, quick, rows, notes)

    headers = ["workload", "batch", "hybrid backend", "hybrid ms", "torch eager ms", "ORT CPU ms",
               "hybrid / eager", "ORT CPU / hybrid", "max rel diff vs eager", "max rel diff vs ORT"]
    text = "\n".join([
        f"### GPU benchmark: hybrid target='{device}' vs torch eager vs ONNX Runtime CPU",
        "",
        f"Card: {card}. Machine: {machine_info()}.",
        "",
        table(headers, rows),
        "",
        "Medians of interleaved blocks; every contender takes and returns numpy arrays (GPU copies included). "
        "Max rel diff: max |a - b| / max |b| against hybrid's output.",
        *[f"- {n}" for n in notes],
        "",
    ])
    print(text)
    if args.write_results is not None:
        title = ("Torch backend on the CPU (self-check, not a GPU result)" if device == "cpu" else
                 f"GPU: hybrid target='{device}' vs torch eager vs ONNX Runtime CPU")
        _results.write_results(args.write_results or ("gpu_cpu" if device == "cpu" else "gpu"), title,
                               _results.command_line(), text)
    out = args.out or (os.path.join(os.environ["OUT"], "gpu_results.md") if os.environ.get("OUT") else None)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        _log(f"table written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
