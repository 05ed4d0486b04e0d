"""Zoo builders for sequences: the stateful LSTM voice-activity model and the BERT-style encoder.

Imports torch at module level; :mod:`hybrid.zoo` imports this module only inside ``build``.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

from hybrid.zoo import _data
from hybrid.zoo._torch import deterministic, export, train

__all__ = ["build_encoder", "build_vad_lstm"]

VAD_STATE, ENCODER_VOCAB, ENCODER_MAX_LEN = _data.VAD_STATE, _data.ENCODER_VOCAB, _data.ENCODER_MAX_LEN


# ------------------------------------------------------------------ voice activity (Silero-VAD-like)
class VadLSTM(nn.Module):
    """A voice-activity detector that carries its LSTM state across calls.

    A learned filterbank (strided Conv1d, log-compressed magnitude), a 2-layer LSTM carrying ``h``/``c``
    across calls, and the speech probability of the chunk's last frame.
    """

    def __init__(self) -> None:
        super().__init__()
        layers, hidden = VAD_STATE
        self.filterbank = nn.Conv1d(1, 48, 64, 32, 16)
        self.encoder = nn.Sequential(nn.Conv1d(48, hidden, 3, 2, 1), nn.ReLU())
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers)
        self.head = nn.Linear(hidden, 1)

    def forward(self, audio: torch.Tensor, h: torch.Tensor, c: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spec = torch.log1p(100.0 * self.filterbank(audio.unsqueeze(1)).abs())
        frames = self.encoder(spec).permute(2, 0, 1)  # frames, N, hidden
        y, (hn, cn) = self.lstm(frames, (h, c))
        return torch.sigmoid(self.head(y[-1])), hn, cn


def _vad_loss(model: VadLSTM, audio: torch.Tensor, h: torch.Tensor, c: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    prob, _, _ = model(audio, h, c)
    return F.binary_cross_entropy(prob.clamp(1e-6, 1 - 1e-6).squeeze(1), y)


def build_vad_lstm() -> onnx.ModelProto:
    with deterministic(4):
        rng = np.random.default_rng(4)
        model = VadLSTM()
        layers, hidden = VAD_STATE

        def batch(step: int) -> tuple[torch.Tensor, ...]:
            audio, labels = _data.audio_clips(rng, 16, 512)
            state = rng.normal(0.0, 0.1, size=(2, layers, 16, hidden)).astype(np.float32)  # as if mid-stream
            return (torch.from_numpy(audio), torch.from_numpy(state[0]), torch.from_numpy(state[1]),
                    torch.from_numpy(labels.astype(np.float32)))

        train(model, batch, _vad_loss, steps=80, lr=5e-3)
        zeros = torch.zeros(layers, 1, hidden)
        return export(model, (torch.zeros(1, 512), zeros, zeros), ["audio", "h", "c"], ["prob", "hn", "cn"],
                      {"audio": {0: "batch", 1: "samples"}, "h": {1: "batch"}, "c": {1: "batch"},
                       "prob": {0: "batch"}, "hn": {1: "batch"}, "cn": {1: "batch"}})


# ------------------------------------------------------------------ BERT-style encoder
class _EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d))

    def forward(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, d = h.shape
        dh = d // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, dh).transpose(1, 2)

        att = torch.softmax(split(self.q(h)) @ split(self.k(h)).transpose(-1, -2) / math.sqrt(dh) + bias, -1)
        ctx = (att @ split(self.v(h))).transpose(1, 2).reshape(b, s, d)
        h = self.ln1(h + self.o(ctx))
        return self.ln2(h + self.ffn(h))


class Encoder(nn.Module):
    """BERT's layout at a small size (hidden 64, 2 layers, 4 heads).

    Token + position + segment embeddings, an additive attention mask made from ``attention_mask``,
    post-LayerNorm blocks, a tanh pooler.
    """

    def __init__(self, d: int = 64, layers: int = 2, heads: int = 4, ffn: int = 128) -> None:
        super().__init__()
        self.tok = nn.Embedding(ENCODER_VOCAB, d)
        self.pos = nn.Embedding(ENCODER_MAX_LEN, d)
        self.seg = nn.Embedding(2, d)
        self.norm = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(_EncoderLayer(d, heads, ffn) for _ in range(layers))
        self.pool = nn.Linear(d, d)
        for m in self.modules():  # BERT's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        h = self.norm(self.tok(input_ids) + self.pos(positions) + self.seg.weight[0])
        bias = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * -10000.0
        for layer in self.layers:
            h = layer(h, bias)
        return h, torch.tanh(self.pool(h[:, 0]))


def build_encoder() -> onnx.ModelProto:
    with deterministic(5):
        rng = np.random.default_rng(5)
        model = Encoder()
        probe = nn.Linear(64, 2)  # a sentence-classification head, trained with the encoder, not exported
        pair = nn.ModuleDict({"encoder": model, "probe": probe})

        def batch(step: int) -> tuple[torch.Tensor, ...]:
            ids, mask = _data.token_batch(rng, 16, 32, ENCODER_VOCAB)
            label = ((ids >= 20) & (ids < 60)).any(1).astype(np.int64)  # "does a topic word occur"
            return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(label)

        def loss(m: nn.ModuleDict, ids: torch.Tensor, mask: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(m["probe"](m["encoder"](ids, mask)[1]), label)

        train(pair, batch, loss, steps=60, lr=2e-3)
        ids, mask = (torch.from_numpy(a) for a in _data.token_batch(np.random.default_rng(0), 1, 128, ENCODER_VOCAB))
        return export(model, (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"],
                      {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
                       "last_hidden_state": {0: "batch", 1: "sequence"}, "pooler_output": {0: "batch"}})
