"""The zoo's table: per model, where its builder lives, what it carries and the shapes users run.

Each entry also says how to make realistic inputs for those shapes (numpy only; no torch needed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from hybrid.errors import RunError
from hybrid.zoo import _data

__all__ = ["RECIPES", "Recipe"]

Shape = tuple[int, ...]
Feeder = Callable[[np.random.Generator, Mapping[str, Shape], int], dict[str, np.ndarray]]


@dataclass(frozen=True, slots=True)
class Recipe:
    """One zoo model.

    ``inputs`` maps each input to (dtype, template); ``None`` in a template marks a dim the model lets
    vary, an int one it fixes. ``links`` name dims that must agree across inputs: when
    ``feeds(shapes=...)`` gives the first input and not the follower, the follower's dim follows.
    """

    name: str
    module: str
    description: str
    quirks: tuple[str, ...]
    inputs: Mapping[str, tuple[str, tuple[int | None, ...]]]
    shapes: Mapping[str, Shape]
    ranges: Mapping[str, Mapping[str, Shape]]
    feeder: Feeder
    external_data: bool = False
    links: tuple[tuple[str, int, str, int], ...] = ()  # (input, axis, follower, axis): dims that must agree


def _range(lo: Shape, opt: Shape, hi: Shape) -> dict[str, Shape]:
    return {"min": lo, "opt": opt, "max": hi}


def _multiple_of(name: str, shape: Shape, axes: tuple[int, ...], k: int) -> None:
    for a in axes:
        if shape[a] % k:
            raise RunError("HYB-405", f"zoo feeds: input {name!r} dim {a} must be a multiple of {k} for this "
                           f"model, got shape {shape}", f"round the size to a multiple of {k} (letterbox/pad)")


def _same_batch(shapes: Mapping[str, Shape], names: tuple[str, ...], axis: Mapping[str, int]) -> int:
    sizes = {n: shapes[n][axis[n]] for n in names}
    if len(set(sizes.values())) != 1:
        raise RunError("HYB-405", f"zoo feeds: the batch size must agree across inputs, got {sizes}",
                       "give every input the same batch size (or give only the first and let the others follow)")
    return next(iter(sizes.values()))


# ------------------------------------------------------------------ feeders
def _detector(rng: np.random.Generator, shapes: Mapping[str, Shape], seed: int) -> dict[str, np.ndarray]:
    n, _, h, w = shapes["x"]
    _multiple_of("x", shapes["x"], (2, 3), 32)
    return {"x": _data.box_images(rng, n, h, w)[0]}


def _unet(rng: np.random.Generator, shapes: Mapping[str, Shape], seed: int) -> dict[str, np.ndarray]:
    n, _, h, w = shapes["x"]
    return {"x": _data.blob_images(rng, n, h, w)[0]}


def _text(rotate: bool) -> Feeder:
    def feed(rng: np.random.Generator, shapes: Mapping[str, Shape], seed: int) -> dict[str, np.ndarray]:
        n, _, _, w = shapes["x"]
        img = _data.glyph_strips(rng, n, w, rotate=rotate)[0]
        return {"x": ((img - 0.5) / 0.5).astype(np.float32)}  # PaddleOCR's normalization

    return feed


def _vad(rng: np.random.Generator, shapes: Mapping[str, Shape], seed: int) -> dict[str, np.ndarray]:
    n = _same_batch(shapes, ("audio", "h", "c"), {"audio": 0, "h": 1, "c": 1})
    audio = _data.audio_clips(rng, n, shapes["audio"][1])[0]
    # the state a previous chunk left behind (bounded like LSTM states are), not the all-zero first call
    h = np.tanh(rng.normal(0.0, 0.3, shapes["h"])).astype(np.float32)
    c = rng.normal(0.0, 0.5, shapes["c"]).astype(np.float32)
    return {"audio": audio, "h": h, "c": c}


def _encoder(rng: np.random.Generator, shapes: Mapping[str, Shape], seed: int) -> dict[str, np.ndarray]:
    if shapes["input_ids"] != shapes["attention_mask"]:
        raise RunError("HYB-405", f"zoo feeds: input_ids {shapes['input_ids']} and attention_mask "
                       f"{shapes['attention_mask']} must have the same shape", "give both the same [batch, sequence]")
    n, s = shapes["input_ids"]
    if s > _data.ENCODER_MAX_LEN:
        raise RunError("HYB-405", f"zoo feeds: sequence length {s} exceeds the encoder's {_data.ENCODER_MAX_LEN} "
                       "positions", f"use at most {_data.ENCODER_MAX_LEN} tokens")
    ids, mask = _data.token_batch(rng, n, s, _data.ENCODER_VOCAB)
    return {"input_ids": ids, "attention_mask": mask}


def _shapes(night_by_seed: bool) -> Feeder:
    def feed(rng: np.random.Generator, shapes: Mapping[str, Shape], seed: int) -> dict[str, np.ndarray]:
        n, _, h, w = shapes["x"]
        night = bool(seed % 2) if night_by_seed else None
        return {"x": _data.shape_images(rng, n, h, night=night, width=w)[0]}

    return feed


def _loop(rng: np.random.Generator, shapes: Mapping[str, Shape], seed: int) -> dict[str, np.ndarray]:
    return {"x": rng.normal(0.0, 1.0, shapes["x"]).astype(np.float32)}


# ------------------------------------------------------------------ the table
F32, I64 = "float32", "int64"

RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("detector", "_vision",
           "YOLO-style detector: SiLU conv backbone with C2f/SPPF blocks, FPN neck (Upsample + Concat), heads at "
           "strides 8/16/32 decoded on an arange grid; output0 [1, N, 4 + 6] (x0, y0, x1, y1 in pixels, 6 class "
           "scores). Height and width are named dynamic dims and must be multiples of 32.",
           ("dynamic_hw",), {"x": (F32, (1, 3, None, None))}, {"x": (1, 3, 480, 640)},
           {"x": _range((1, 3, 320, 320), (1, 3, 480, 640), (1, 3, 640, 640))}, _detector),
    Recipe("crnn", "_vision",
           "CRNN text recognizer: conv stack folding the 48-pixel height, a bidirectional LSTM over the width, "
           "per-step softmax over 37 classes; probs [N, W / 4, 37]. Dynamic batch and width.",
           ("dynamic_width", "lstm"), {"x": (F32, (None, 3, 48, None))}, {"x": (1, 3, 48, 320)},
           {"x": _range((1, 3, 48, 32), (1, 3, 48, 320), (8, 3, 48, 960))}, _text(rotate=False)),
    Recipe("vad_lstm", "_sequence",
           "Stateful voice-activity model (Silero-VAD-like): strided Conv1d filterbank, 2-layer LSTM whose state "
           "h, c [2, N, 64] goes in and comes out (hn, cn), speech probability prob [N, 1] per 512-sample chunk.",
           ("state_io", "lstm"),
           {"audio": (F32, (None, None)), "h": (F32, (2, None, 64)), "c": (F32, (2, None, 64))},
           {"audio": (1, 512), "h": (2, 1, 64), "c": (2, 1, 64)},
           {"audio": _range((1, 256), (1, 512), (8, 1536)), "h": _range((2, 1, 64), (2, 1, 64), (2, 8, 64)),
            "c": _range((2, 1, 64), (2, 1, 64), (2, 8, 64))}, _vad,
           links=(("audio", 0, "h", 1), ("audio", 0, "c", 1))),
    Recipe("unet", "_vision",
           "U-Net segmentation with U2-Net-style deep supervision: 7 outputs d0..d6 [N, 1, H, W] (fused mask, then "
           "the side masks from full resolution to the bottleneck); every upsampling is a Resize whose sizes come "
           "from the Shape of the skip (or input) tensor.",
           ("multi_output", "shape_driven_resize"), {"x": (F32, (None, 3, None, None))}, {"x": (1, 3, 320, 320)},
           {"x": _range((1, 3, 64, 64), (1, 3, 320, 320), (4, 3, 512, 512))}, _unet),
    Recipe("encoder", "_sequence",
           "BERT-style transformer encoder (vocab 2000, hidden 64, 2 layers, 4 heads, 256 positions): input_ids "
           "and attention_mask [N, S] int64; last_hidden_state [N, S, 64] and pooler_output [N, 64].",
           ("int64_inputs", "attention_mask"),
           {"input_ids": (I64, (None, None)), "attention_mask": (I64, (None, None))},
           {"input_ids": (1, 128), "attention_mask": (1, 128)},
           {"input_ids": _range((1, 8), (1, 128), (8, 256)), "attention_mask": _range((1, 8), (1, 128), (8, 256))},
           _encoder, links=(("input_ids", 0, "attention_mask", 0), ("input_ids", 1, "attention_mask", 1),
                            ("attention_mask", 0, "input_ids", 0), ("attention_mask", 1, "input_ids", 1))),
    Recipe("if_model", "_graphs",
           "Day/night shape classifier: a torch-exported CNN backbone, then an If on the data (mean pixel > 0.45) "
           "between a linear head and a two-layer head; the branches answer [N, 5] and [N, 1, 5], so the If's "
           "output has no static rank, and a Reshape makes probs [N, 5]. feeds(seed): even seeds give day images "
           "(then-branch), odd seeds night images (else-branch).",
           ("if", "dynamic_rank"), {"x": (F32, (None, 3, None, None))}, {"x": (1, 3, 96, 96)},
           {"x": _range((1, 3, 32, 32), (1, 3, 96, 96), (8, 3, 224, 224))}, _shapes(night_by_seed=True)),
    Recipe("loop_model", "_graphs",
           "Iterative refinement in an ONNX Loop built with onnx.helper: h <- h + 0.5 (tanh(h A + x U + b) - h) "
           "until the largest update is under 1e-3 (at most 24 steps, a data-dependent count); outputs probs "
           "[N, 10], deltas [steps] (scan output) and iterations [1] int64.",
           ("loop", "data_dependent_shape"), {"x": (F32, (None, 32))}, {"x": (4, 32)},
           {"x": _range((1, 32), (4, 32), (64, 32))}, _loop),
    Recipe("neg_dim", "_vision",
           "Text-angle classifier (0/180 degrees, PaddleOCR 'cls'-like, depthwise-separable convs); the file "
           "stores the batch dim as dim_value -1 and every other input/output dim as dim_param '?'. "
           "probs [N, 2].",
           ("dim_-1", "dim_?"), {"x": (F32, (None, 3, 48, None))}, {"x": (1, 3, 48, 192)},
           {"x": _range((1, 3, 48, 192), (1, 3, 48, 192), (8, 3, 48, 192))}, _text(rotate=True)),
    Recipe("external_data", "_graphs",
           "Shape classifier (conv + max-pool, about 2.1 MB of weights) whose initializers are all stored in one "
           "external data file beside the .onnx (<name>.onnx.data); probs [N, 5], dynamic batch.",
           ("external_data",), {"x": (F32, (None, 3, 96, 96))}, {"x": (1, 3, 96, 96)},
           {"x": _range((1, 3, 96, 96), (1, 3, 96, 96), (16, 3, 96, 96))}, _shapes(night_by_seed=False),
           external_data=True),
    Recipe("legacy_ir3", "_graphs",
           "2018-style file: IR version 3, opset 8, every initializer also listed as a graph input, static "
           "shapes, and a declared output shape [1, 10] that is wrong (the graph computes probs [1, 5]).",
           ("ir3", "initializers_as_inputs", "wrong_output_shape"), {"x": (F32, (1, 3, 32, 32))},
           {"x": (1, 3, 32, 32)}, {}, _shapes(night_by_seed=False)),
)}
