"""Realistic CNNs for quantization work: trained briefly in this process, exported with a dynamic batch.

Three families, each small enough to train in seconds on two cores and big enough to show what int8
does to a real network (trained weights, BatchNorm folded by export, activations with real ranges):

- ``mobilenet``: MobileNetV3-like (HardSwish, squeeze-excitation with HardSigmoid, inverted
  residuals, a 4-class head).
- ``resnet``: ResNet-like (BasicBlocks with residual Adds; ``width=64`` is conv-heavy enough for
  int8 to pay on ONNX Runtime's VNNI kernels).
- ``detector``: a two-scale detection head whose per-scale predictions (boxes, sigmoid objectness and
  class scores) are reshaped and concatenated into one ``[N, boxes, 9]`` output.

The task is synthetic and learnable: images are noisy, shifted and rescaled mixtures of per-class
sinusoid templates (classifiers) or one bright rectangle on noise (detector). Nothing is downloaded.
Built models are cached as ONNX under ``hybrid``'s cache folder (or the ``cache`` folder given), keyed by
the builder and its arguments; numpy and torch are seeded, so a rebuild gives the same model on one
machine.

``build("resnet", width=16, size=32)`` returns the model; ``images(kind, n, seed, size)``
makes more samples of the same distribution.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["KINDS", "build", "images"]

KINDS = ("mobilenet", "resnet", "detector")
_VERSION = 2
_CLASSES = 4


def images(kind: str, n: int, seed: int, size: int = 32) -> np.ndarray:
    """``n`` float32 images ``[n, 3, size, size]`` of the distribution ``kind``'s model was trained on."""
    if kind == "detector":
        return _boxes(n, seed, size)[0]
    return _patterns(n, seed, size)[0]


def build(kind: str, *, width: int = 16, size: int = 32, steps: int = 200, spread: float = 1.0,
          cache: str | Path | None = None) -> Any:
    """The trained, exported model ``kind`` (a :class:`hybrid.ir.Model`), built once and cached.

    Args:
        kind: 'mobilenet', 'resnet' or 'detector'.
        width: Channels of the first stage (the others scale with it).
        size: Input height and width (a multiple of 16).
        steps: SGD steps (batch 32) to train for.
        spread: After training, rescale the channels feeding each ReLU -> Conv boundary by factors
            spread over ``[1, spread]`` (log-uniform), dividing the next Conv's input weights by the same
            factors. The function is unchanged; the channel ranges differ the way they do in long-trained
            networks (Nagel et al. 2019, "Data-Free Quantization"), which is what makes per-tensor int8
            activations lose accuracy. 1 (default): as trained.
        cache: Folder for the ONNX file (default: hybrid's cache folder / 'quant-models').
    """
    from hybrid.ir import Model, atomic_write_bytes

    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {list(KINDS)}, got {kind!r}")
    key = json.dumps({"kind": kind, "width": width, "size": size, "steps": steps, "spread": spread,
                      "v": _VERSION}, sort_keys=True)
    folder = Path(cache) if cache is not None else _default_cache()
    path = folder / f"{kind}-w{width}-s{size}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.onnx"
    if path.is_file():
        return Model.load(str(path))
    model = _train_and_export(kind, width, size, steps, spread)
    atomic_write_bytes(path, model.to_bytes())
    return Model.load(str(path))


def _default_cache() -> Path:
    from hybrid.hal.machine import cache_root

    return cache_root() / "quant-models"


# ------------------------------------------------------------------ data
def _patterns(n: int, seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Class templates (sums of sinusoids per channel), rolled, rescaled and noised."""
    t_rng = np.random.default_rng(1234)
    yy, xx = np.mgrid[0:size, 0:size] / size
    templates = np.zeros((_CLASSES, 3, size, size), np.float32)
    for c in range(_CLASSES):
        for ch in range(3):
            for _ in range(3):
                fx, fy, ph = t_rng.uniform(1, 5), t_rng.uniform(1, 5), t_rng.uniform(0, 2 * np.pi)
                templates[c, ch] += np.sin(2 * np.pi * (fx * xx + fy * yy) + ph) / 3
    rng = np.random.default_rng(seed)
    y = rng.integers(0, _CLASSES, n)
    x = templates[y]
    shift = max(1, size // 8)
    for i in range(n):
        x[i] = np.roll(x[i], tuple(rng.integers(-shift, shift + 1, 2)), axis=(1, 2))
    x = x * rng.uniform(0.6, 1.4, (n, 1, 1, 1)) + rng.normal(0, 0.6, x.shape)
    return x.astype(np.float32), y


def _boxes(n: int, seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One rectangle per image on noise; the class is its colour. Targets: (cx, cy, w, h, class)."""
    rng = np.random.default_rng(seed)
    colours = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], np.float32) * 2
    x = rng.normal(0, 0.4, (n, 3, size, size)).astype(np.float32)
    targets = np.zeros((n, 5), np.float32)
    for i in range(n):
        w, h = rng.integers(size // 6, size // 2, 2)
        x0, y0 = rng.integers(0, size - w), rng.integers(0, size - h)
        c = rng.integers(0, _CLASSES)
        x[i, :, y0:y0 + h, x0:x0 + w] += colours[c][:, None, None]
        targets[i] = ((x0 + w / 2) / size, (y0 + h / 2) / size, w / size, h / size, c)
    return x, targets


# ------------------------------------------------------------------ networks
def _nets() -> dict[str, Any]:
    import torch
    from torch import nn

    def cbn(i: int, o: int, k: int = 3, s: int = 1, groups: int = 1, act: Any = nn.ReLU) -> nn.Module:
        layers = [nn.Conv2d(i, o, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(o)]
        return nn.Sequential(*layers, act()) if act is not None else nn.Sequential(*layers)

    class SE(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Sequential(nn.Conv2d(c, max(8, c // 4), 1), nn.ReLU(), nn.Conv2d(max(8, c // 4), c, 1),
                                    nn.Hardsigmoid())

        def forward(self, x: Any) -> Any:
            return x * self.fc(self.pool(x))

    class InvertedResidual(nn.Module):
        def __init__(self, i: int, exp: int, o: int, s: int, se: bool) -> None:
            super().__init__()
            self.body = nn.Sequential(cbn(i, exp, 1, act=nn.Hardswish), cbn(exp, exp, 3, s, exp, nn.Hardswish),
                                      SE(exp) if se else nn.Identity(), cbn(exp, o, 1, act=None))
            self.residual = s == 1 and i == o

        def forward(self, x: Any) -> Any:
            y = self.body(x)
            return x + y if self.residual else y

    class MobileNet(nn.Module):
        def __init__(self, w: int) -> None:
            super().__init__()
            c1, c2, c3 = w, w * 3 // 2, w * 5 // 2
            self.features = nn.Sequential(
                cbn(3, w, 3, 2, act=nn.Hardswish), InvertedResidual(w, w * 2, c1, 1, True),
                InvertedResidual(c1, w * 4, c2, 2, False), InvertedResidual(c2, c2 * 3, c2, 1, True),
                InvertedResidual(c2, c2 * 4, c3, 2, True), InvertedResidual(c3, c3 * 3, c3, 1, True),
                cbn(c3, c3 * 4, 1, act=nn.Hardswish), nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.head = nn.Sequential(nn.Linear(c3 * 4, 8 * w), nn.Hardswish(), nn.Linear(8 * w, _CLASSES))

        def forward(self, x: Any) -> Any:
            return self.head(self.features(x))

    class Block(nn.Module):
        def __init__(self, i: int, o: int, s: int) -> None:
            super().__init__()
            self.body = nn.Sequential(cbn(i, o, 3, s), cbn(o, o, 3, act=None))
            self.short = cbn(i, o, 1, s, act=None) if (s != 1 or i != o) else nn.Identity()

        def forward(self, x: Any) -> Any:
            return torch.relu(self.body(x) + self.short(x))

    class ResNet(nn.Module):
        def __init__(self, w: int) -> None:
            super().__init__()
            self.features = nn.Sequential(cbn(3, w, 3, 2), Block(w, w, 1), Block(w, w, 1), Block(w, 2 * w, 2),
                                          Block(2 * w, 2 * w, 1), Block(2 * w, 4 * w, 2), Block(4 * w, 4 * w, 1),
                                          nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.fc = nn.Linear(4 * w, _CLASSES)

        def forward(self, x: Any) -> Any:
            return self.fc(self.features(x))

    class Detector(nn.Module):
        """Two scales (stride 8 and 16), 5 + classes values per cell, concatenated over both."""

        def __init__(self, w: int) -> None:
            super().__init__()
            self.c3 = nn.Sequential(cbn(3, w, 3, 2), cbn(w, 2 * w, 3, 2), cbn(2 * w, 2 * w), cbn(2 * w, 2 * w, 3, 2))
            self.c4 = nn.Sequential(cbn(2 * w, 4 * w, 3, 2), cbn(4 * w, 4 * w))
            self.h3, self.h4 = nn.Conv2d(2 * w, 5 + _CLASSES, 1), nn.Conv2d(4 * w, 5 + _CLASSES, 1)

        @staticmethod
        def _decode(p: Any) -> Any:
            p = p.flatten(2).transpose(1, 2)  # [N, cells, 5 + classes]
            return torch.cat([p[..., :4], torch.sigmoid(p[..., 4:])], dim=2)

        def forward(self, x: Any) -> Any:
            f3 = self.c3(x)
            f4 = self.c4(f3)
            return torch.cat([self._decode(self.h3(f3)), self._decode(self.h4(f4))], dim=1)

    return {"mobilenet": MobileNet, "resnet": ResNet, "detector": Detector}


def _detector_loss(out: Any, targets: Any, size: int) -> Any:
    """Objectness/class BCE and box L1 at the cell (of each scale) holding the rectangle's centre."""
    import torch
    from torch.nn import functional

    losses = []
    start = 0
    for stride in (8, 16):
        cells = size // stride
        count = cells * cells
        part = out[:, start:start + count]
        start += count
        ix = (targets[:, 0] * cells).long().clamp(0, cells - 1)
        iy = (targets[:, 1] * cells).long().clamp(0, cells - 1)
        idx = iy * cells + ix
        obj = torch.zeros(part.shape[:2])
        obj[torch.arange(len(idx)), idx] = 1
        losses.append(functional.binary_cross_entropy(part[..., 4].clamp(1e-6, 1 - 1e-6), obj))
        hit = part[torch.arange(len(idx)), idx]
        losses.append(functional.l1_loss(hit[:, :4], targets[:, :4]))
        cls = functional.one_hot(targets[:, 4].long(), _CLASSES).float()
        losses.append(functional.binary_cross_entropy(hit[:, 5:].clamp(1e-6, 1 - 1e-6), cls))
    return sum(losses)


def _spread_ranges(net: Any, spread: float) -> None:
    """Rescale channels across every ReLU -> Conv boundary and along MobileNet's linear bottlenecks.

    Function-preserving: ReLU and the projection without activation are homogeneous.
    """
    import torch
    from torch import nn

    rng = np.random.default_rng(7)
    pairs: list[tuple[Any, Any]] = []  # (producer: BatchNorm2d or Conv2d with bias, next Conv2d)
    for module in net.modules():
        name = type(module).__name__
        if name == "Block":
            pairs.append((module.body[0][1], module.body[1][0]))
        elif name == "SE":
            pairs.append((module.fc[0], module.fc[2]))
        elif name == "MobileNet":
            f = module.features
            # a stage: the block that produces the bottleneck, its residual followers, the next consumer
            for first, residual, consumer in ((2, (3,), 4), (4, (5,), 6)):
                factors = torch.from_numpy(spread ** rng.uniform(0, 1, f[consumer][0].in_channels
                                                                 if consumer == 6 else
                                                                 f[consumer].body[0][0].in_channels)).float()
                with torch.no_grad():
                    for b in (first, *residual):
                        bn = f[b].body[3][1]
                        bn.weight *= factors
                        bn.bias *= factors
                    for conv in [f[b].body[0][0] for b in residual] + [
                            f[consumer][0] if consumer == 6 else f[consumer].body[0][0]]:
                        conv.weight /= factors[None, :, None, None]
        elif name == "Detector":
            pairs += [(module.c3[1][1], module.c3[2][0]), (module.c3[2][1], module.c3[3][0]),
                      (module.c4[0][1], module.c4[1][0])]
    with torch.no_grad():
        for producer, conv in pairs:
            factors = torch.from_numpy(spread ** rng.uniform(0, 1, conv.in_channels)).float()
            if isinstance(producer, nn.BatchNorm2d):
                producer.weight *= factors
                producer.bias *= factors
            else:
                producer.weight *= factors[:, None, None, None]
                producer.bias *= factors
            conv.weight /= factors[None, :, None, None]


def _train_and_export(kind: str, width: int, size: int, steps: int, spread: float) -> Any:
    import torch
    from torch import nn

    from hybrid.frontends.torch import export

    torch.manual_seed(0)
    net = _nets()[kind](width)
    if kind == "detector":
        x, t = _boxes(2048, 0, size)
    else:
        x, t = _patterns(2048, 0, size)
    xt, tt = torch.from_numpy(x), torch.from_numpy(t)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, steps))
    net.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: one thread is as fast, and far faster on a busy machine
    try:
        for _ in range(steps):
            idx = torch.randint(0, len(x), (32,))
            out = net(xt[idx])
            loss = (_detector_loss(out, tt[idx], size) if kind == "detector"
                    else nn.functional.cross_entropy(out, tt[idx].long()))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    finally:
        torch.set_num_threads(threads)
    net.eval()
    if spread != 1.0:
        _spread_ranges(net, spread)
    name = {"mobilenet": "MobileNetV3-like", "resnet": "ResNet-like", "detector": "Detector"}[kind]
    return export(net, input_shape=(1, 3, size, size), dynamic_axes={"input": {0: "batch"}},
                  name=f"{name}-w{width}")
