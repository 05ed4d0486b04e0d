"""Zoo builders for images: the YOLO-style detector, the U-Net, the CRNN and the angle classifier.

Imports torch at module level; :mod:`hybrid.zoo` imports this module only inside ``build``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

from hybrid.zoo import _data
from hybrid.zoo._torch import deterministic, export, train

__all__ = ["build_crnn", "build_detector", "build_neg_dim", "build_unet"]


def conv_bn(cin: int, cout: int, k: int = 3, s: int = 1, act: type[nn.Module] = nn.SiLU) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), act())


# ------------------------------------------------------------------ detector (YOLO-style)
class _C2f(nn.Module):
    """YOLOv8's C2f block, reduced: split, a residual bottleneck, concat, 1x1 conv."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.cv1 = conv_bn(c, c, 1)
        self.m = nn.Sequential(conv_bn(c // 2, c // 2), conv_bn(c // 2, c // 2))
        self.cv2 = conv_bn(c + c // 2, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).chunk(2, 1)
        return self.cv2(torch.cat([a, b, b + self.m(b)], 1))


class _SPPF(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.cv1 = conv_bn(c, c // 2, 1)
        self.pool = nn.MaxPool2d(5, 1, 2)
        self.cv2 = conv_bn(c * 2, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y0 = self.cv1(x)
        y1 = self.pool(y0)
        y2 = self.pool(y1)
        return self.cv2(torch.cat([y0, y1, y2, self.pool(y2)], 1))


class Detector(nn.Module):
    """A YOLO-style detector: backbone (strides 8/16/32, SiLU), FPN neck (Upsample + Concat), decoupled heads.

    The output is ``[B, N, 4 + C]``: boxes as x0, y0, x1, y1 in pixels (decoded on an arange grid, as
    YOLO exports do) and per-class sigmoid scores, concatenated over the three strides.
    """

    STRIDES = (8, 16, 32)

    def __init__(self, classes: int = len(_data.BOX_PALETTE)) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 16, 3, 2), conv_bn(16, 32, 3, 2), _C2f(32))
        self.p3 = nn.Sequential(conv_bn(32, 48, 3, 2), _C2f(48))
        self.p4 = nn.Sequential(conv_bn(48, 64, 3, 2), _C2f(64))
        self.p5 = nn.Sequential(conv_bn(64, 96, 3, 2), _C2f(96), _SPPF(96))
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.n4 = nn.Sequential(conv_bn(96 + 64, 64, 1), _C2f(64))
        self.n3 = nn.Sequential(conv_bn(64 + 48, 48, 1), _C2f(48))
        self.box = nn.ModuleList(nn.Sequential(conv_bn(c, 32), nn.Conv2d(32, 4, 1)) for c in (48, 64, 96))
        self.cls = nn.ModuleList(nn.Sequential(conv_bn(c, 32), nn.Conv2d(32, classes, 1)) for c in (48, 64, 96))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        n4 = self.n4(torch.cat([self.up(p5), p4], 1))
        n3 = self.n3(torch.cat([self.up(n4), p3], 1))
        out = []
        for i, (feat, stride) in enumerate(zip((n3, n4, p5), self.STRIDES)):
            h, w = feat.shape[-2:]
            ys = (torch.arange(h, dtype=torch.float32) + 0.5) * stride
            xs = (torch.arange(w, dtype=torch.float32) + 0.5) * stride
            cy = ys.view(1, h, 1).expand(1, h, w).reshape(1, 1, -1)
            cx = xs.view(1, 1, w).expand(1, h, w).reshape(1, 1, -1)
            ltrb = F.softplus(self.box[i](feat)).flatten(2) * stride * 2.0
            boxes = torch.cat([cx - ltrb[:, 0:1], cy - ltrb[:, 1:2], cx + ltrb[:, 2:3], cy + ltrb[:, 3:4]], 1)
            out.append(torch.cat([boxes, torch.sigmoid(self.cls[i](feat).flatten(2))], 1))
        return torch.cat(out, 2).permute(0, 2, 1)


def _detector_loss(model: Detector, x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    pred = model(x)  # B, N, 4 + C
    h, w = x.shape[-2:]
    centers = torch.cat([torch.stack(torch.meshgrid((torch.arange(h // s) + 0.5) * s, (torch.arange(w // s) + 0.5) * s,
                                                    indexing="ij"), -1).reshape(-1, 2) for s in Detector.STRIDES])
    cy, cx = centers[:, 0].view(1, -1, 1), centers[:, 1].view(1, -1, 1)
    valid = boxes[:, None, :, 0] >= 0
    inside = valid & (cx > boxes[:, None, :, 1]) & (cx < boxes[:, None, :, 3]) & (cy > boxes[:, None, :, 2]) & (
        cy < boxes[:, None, :, 4])
    order = torch.arange(1, boxes.shape[1] + 1).view(1, 1, -1)
    top = (inside * order).argmax(-1)  # the last-drawn box covering the cell is the visible one
    pos = inside.any(-1)
    target = torch.gather(boxes, 1, top[..., None].expand(-1, -1, 5))
    cls_t = F.one_hot(target[..., 0].clamp(min=0).long(), pred.shape[-1] - 4).float() * pos[..., None]
    cls_loss = F.binary_cross_entropy(pred[..., 4:].clamp(1e-6, 1 - 1e-6), cls_t)
    box_loss = (pred[..., :4] - target[..., 1:]).abs().sum(-1)[pos].mean() / 64.0 if pos.any() else 0.0
    return cls_loss * 10.0 + box_loss


def _image_batches(make: Callable[..., tuple[np.ndarray, np.ndarray]], seed: int, n: int):
    """Training batches of ``n`` 64x64 images and their targets, ``make(rng, n, 64, 64)`` as tensors."""
    rng = np.random.default_rng(seed)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        img, target = make(rng, n, 64, 64)
        return torch.from_numpy(img), torch.from_numpy(target)

    return batch


def build_detector() -> onnx.ModelProto:
    with deterministic(1):
        model = Detector()
        train(model, _image_batches(_data.box_images, 1, 8), _detector_loss, steps=60, lr=5e-3)
        return export(model, (torch.rand(1, 3, 480, 640),), ["x"], ["output0"],
                      {"x": {2: "height", 3: "width"}, "output0": {1: "anchors"}})


# ------------------------------------------------------------------ U-Net with side outputs
class UNet(nn.Module):
    """A U2-Net-style segmenter: five encoder levels and a bottleneck, seven mask outputs.

    Each decoder level upsamples with ``F.interpolate(size=skip.shape[-2:])`` (exported as Shape ->
    Slice -> Resize(sizes)). The outputs are as in U2-Net: the fused mask and six side masks (one per
    decoder level and the bottleneck), each resized to the input size.
    """

    CH = (12, 16, 24, 32, 48, 64)

    def __init__(self) -> None:
        super().__init__()
        ch = self.CH
        self.enc = nn.ModuleList(nn.Sequential(conv_bn(cin, cout, act=nn.ReLU), conv_bn(cout, cout, act=nn.ReLU))
                                 for cin, cout in zip((3, *ch[:-1]), ch))
        self.dec = nn.ModuleList(nn.Sequential(conv_bn(ch[i + 1] + ch[i], ch[i], act=nn.ReLU)) for i in range(5))
        self.side = nn.ModuleList(nn.Conv2d(c, 1, 3, padding=1) for c in ch)
        self.fuse = nn.Conv2d(6, 1, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        skips = []
        h = x
        for i, enc in enumerate(self.enc):
            h = enc(h if i == 0 else F.max_pool2d(h, 2, 2))
            skips.append(h)
        levels = [h]
        for i in reversed(range(5)):
            skip = skips[i]
            up = F.interpolate(h, size=skip.shape[-2:], mode="bilinear", align_corners=False)
            h = self.dec[i](torch.cat([up, skip], 1))
            levels.append(h)
        size = x.shape[-2:]
        sides = [F.interpolate(self.side[lvl](feat), size=size, mode="bilinear", align_corners=False)
                 for lvl, feat in zip(reversed(range(6)), levels)]
        sides = sides[::-1]  # d1 (full resolution) first, bottleneck last
        fused = self.fuse(torch.cat(sides, 1))
        return tuple(torch.sigmoid(t) for t in (fused, *sides))


def _unet_loss(model: UNet, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    total = torch.zeros(())
    for out in model(x):  # deep supervision; BCE + Dice, as the foreground is small
        out = out.clamp(1e-6, 1 - 1e-6)
        dice = 1 - (2 * (out * mask).sum((2, 3)) + 1) / (out.sum((2, 3)) + mask.sum((2, 3)) + 1)
        total = total + F.binary_cross_entropy(out, mask) + dice.mean()
    return total


def build_unet() -> onnx.ModelProto:
    with deterministic(2):
        model = UNet()
        train(model, _image_batches(_data.blob_images, 2, 4), _unet_loss, steps=40, lr=5e-3)
        outs = ["d0", "d1", "d2", "d3", "d4", "d5", "d6"]
        axes = {"x": {0: "batch", 2: "height", 3: "width"}} | {o: {0: "batch", 2: "height", 3: "width"} for o in outs}
        return export(model, (torch.rand(1, 3, 320, 320),), ["x"], outs, axes)


# ------------------------------------------------------------------ CRNN text recognizer
class CRNN(nn.Module):
    """A text-line recognizer: per-step class probabilities ``[N, W / 4, 37]`` (blank + 36 glyphs).

    VGG-style convs fold the 48-pixel height to 1 and the width by 4, then a bidirectional LSTM runs
    over the width, as PaddleOCR's rec model does.
    """

    def __init__(self) -> None:
        super().__init__()
        r = nn.ReLU
        self.cnn = nn.Sequential(conv_bn(3, 32, act=r), nn.MaxPool2d(2, 2), conv_bn(32, 48, act=r), nn.MaxPool2d(2, 2),
                                 conv_bn(48, 64, act=r), nn.MaxPool2d((2, 1), (2, 1)), conv_bn(64, 96, act=r),
                                 nn.MaxPool2d((2, 1), (2, 1)), nn.Conv2d(96, 96, (3, 1)), nn.ReLU())
        self.rnn = nn.LSTM(96, 48, bidirectional=True)
        self.fc = nn.Linear(96, _data.GLYPH_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.cnn(x).squeeze(2).permute(2, 0, 1)  # T, N, C
        y, _ = self.rnn(f)
        return torch.softmax(self.fc(y), -1).permute(1, 0, 2)


def _crnn_loss(model: CRNN, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    probs = model(x)  # N, T, K; each 8-pixel glyph spans 2 steps
    target = labels.repeat_interleave(2, dim=1)
    return F.nll_loss(torch.log(probs.clamp(min=1e-8)).reshape(-1, probs.shape[-1]), target.reshape(-1))


def build_crnn() -> onnx.ModelProto:
    with deterministic(3):
        rng = np.random.default_rng(3)
        model = CRNN()

        def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            img, labels, _ = _data.glyph_strips(rng, 16, 64)
            return torch.from_numpy((img - 0.5) / 0.5), torch.from_numpy(labels)

        train(model, batch, _crnn_loss, steps=80, lr=5e-3)
        return export(model, (torch.rand(1, 3, 48, 320),), ["x"], ["probs"],
                      {"x": {0: "batch", 3: "width"}, "probs": {0: "batch", 1: "steps"}})


# ------------------------------------------------------------------ text-angle classifier with -1 / "?" dims
class AngleClassifier(nn.Module):
    """MobileNet-style (depthwise-separable) 0/180-degree text-line classifier, PaddleOCR 'cls'-like."""

    def __init__(self) -> None:
        super().__init__()

        def dw(cin: int, cout: int, s: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cin, 3, s, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                                 nn.Hardswish(), conv_bn(cin, cout, 1, act=nn.Hardswish))

        self.features = nn.Sequential(conv_bn(3, 16, 3, 2, nn.Hardswish), dw(16, 24, 2), dw(24, 32, 2),
                                      dw(32, 48, 2), dw(48, 64, 1))
        self.fc = nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)), -1)


def _cls_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.nll_loss(torch.log(model(x).clamp(min=1e-8)), y)


def build_neg_dim() -> onnx.ModelProto:
    with deterministic(8):
        rng = np.random.default_rng(8)
        model = AngleClassifier()

        def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            img, _, rotated = _data.glyph_strips(rng, 16, 192, rotate=True)
            return torch.from_numpy((img - 0.5) / 0.5), torch.from_numpy(rotated.astype(np.int64))

        train(model, batch, _cls_loss, steps=60, lr=5e-3)
        proto = export(model, (torch.rand(1, 3, 48, 192),), ["x"], ["probs"],
                       {"x": {0: "batch"}, "probs": {0: "batch"}})
    # what paddle2onnx-era files carry: the batch dim as dim_value -1, every other dim named "?"
    for value in (*proto.graph.input, *proto.graph.output):
        for i, dim in enumerate(value.type.tensor_type.shape.dim):
            if i == 0:
                dim.Clear()
                dim.dim_value = -1
            else:
                dim.Clear()
                dim.dim_param = "?"
    return proto
