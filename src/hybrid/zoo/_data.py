"""Synthetic but learnable data for the zoo: the same generators train the models and make their feeds.

numpy only (no torch), so :meth:`hybrid.zoo.ZooModel.feeds` works without torch. Every generator takes a
``numpy.random.Generator`` and returns float32 images in [0, 1] (NCHW) or the arrays named below.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ENCODER_MAX_LEN", "ENCODER_VOCAB", "GLYPH_CLASSES", "SHAPE_CLASSES", "VAD_STATE", "audio_clips",
           "blob_images", "box_images", "glyph_strips", "shape_images", "token_batch"]

GLYPH_W = 8
GLYPH_CLASSES = 37  # 0 = blank (CTC-style), 1..36 = glyphs ("0-9a-z")
SHAPE_CLASSES = 5  # square, circle, triangle, cross, ring
VAD_STATE = (2, 64)  # LSTM layers, hidden size: h and c are [2, N, 64]
ENCODER_VOCAB = 2000
ENCODER_MAX_LEN = 256
BOX_PALETTE = np.array([[0.9, 0.1, 0.1], [0.1, 0.8, 0.2], [0.15, 0.25, 0.95], [0.95, 0.9, 0.1],
                        [0.85, 0.2, 0.85], [0.1, 0.85, 0.9]], dtype=np.float32)


def _glyph_bank() -> np.ndarray:
    """36 fixed glyphs of 48x8 pixels.

    Like Latin script, ink sits mostly above the baseline (ascenders are common, descenders rare), so a
    line rotated by 180 degrees looks different from an upright one.
    """
    rng = np.random.default_rng(1234)
    low = np.zeros((GLYPH_CLASSES - 1, 12, 4), dtype=np.float32)
    low[:, 3:10] = rng.random((GLYPH_CLASSES - 1, 7, 4)) < 0.5
    low[:, 1:3] = (rng.random((GLYPH_CLASSES - 1, 1, 1)) < 0.5) & (rng.random((GLYPH_CLASSES - 1, 2, 4)) < 0.6)
    low[:, 10:11] = (rng.random((GLYPH_CLASSES - 1, 1, 1)) < 0.1) & (rng.random((GLYPH_CLASSES - 1, 1, 4)) < 0.6)
    low[:, :, 3] = 0  # a blank column between glyphs
    bank = np.repeat(np.repeat(low, 4, axis=1), 2, axis=2)
    return np.concatenate([np.zeros((1, 48, GLYPH_W), np.float32), bank])  # class 0: a space


_BANK = _glyph_bank()


def glyph_strips(rng: np.random.Generator, n: int, width: int, rotate: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Text lines of 48 x ``width`` pixels: one glyph class per 8 columns (0 = space).

    Returns:
        images [n, 3, 48, width] in [0, 1]; labels [n, width // 8] (class per glyph slot, of the upright
        line); rotated [n] (bool: the line is turned by 180 degrees; only with ``rotate=True``).
    """
    slots = max(width // GLYPH_W, 1)
    labels = rng.integers(1, GLYPH_CLASSES, size=(n, slots))
    labels[rng.random((n, slots)) < 0.15] = 0
    ink = _BANK[labels]  # n, slots, 48, 8
    ink = ink.transpose(0, 2, 1, 3).reshape(n, 48, slots * GLYPH_W)
    strip = np.zeros((n, 48, width), np.float32)
    strip[:, :, :min(width, slots * GLYPH_W)] = ink[:, :, :width]
    paper = rng.uniform(0.7, 1.0, size=(n, 3, 1, 1))
    color = rng.uniform(0.0, 0.35, size=(n, 3, 1, 1))
    img = paper * (1.0 - strip[:, None]) + color * strip[:, None]
    img += rng.normal(0.0, 0.03, size=img.shape)
    rotated = rng.random(n) < 0.5 if rotate else np.zeros(n, dtype=bool)
    img[rotated] = img[rotated][:, :, ::-1, ::-1]
    return np.clip(img, 0.0, 1.0).astype(np.float32), labels, rotated


def shape_images(rng: np.random.Generator, n: int, size: int, night: bool | None = None, width: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One shape per image (0 square, 1 circle, 2 triangle, 3 cross, 4 ring) on a day or night background.

    Day backgrounds are bright, night ones dark; ``night=None`` mixes both. ``width`` defaults to
    ``size`` (the height).

    Returns:
        images [n, 3, size, width] in [0, 1], labels [n], night [n] (bool).
    """
    h, w = size, width or size
    labels = rng.integers(0, SHAPE_CLASSES, size=n)
    nights = rng.random(n) < 0.5 if night is None else np.full(n, night)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    cy = rng.uniform(0.3, 0.7, size=(n, 1, 1)) * h
    cx = rng.uniform(0.3, 0.7, size=(n, 1, 1)) * w
    r = rng.uniform(0.15, 0.3, size=(n, 1, 1)) * min(h, w)
    dy, dx = yy - cy, xx - cx
    dist2 = dx * dx + dy * dy
    masks = np.stack([
        np.maximum(abs(dx), abs(dy)) < r,
        dist2 < r * r,
        (dy > -r) & (dy < r) & (abs(dx) < (dy + r) / 2),
        ((abs(dx) < r / 3) & (abs(dy) < r)) | ((abs(dy) < r / 3) & (abs(dx) < r)),
        (dist2 < r * r) & (dist2 > (0.6 * r) ** 2),
    ], axis=1)[np.arange(n), labels]
    bg = np.where(nights, rng.uniform(0.05, 0.3, n), rng.uniform(0.55, 0.9, n))[:, None, None, None]
    bg = bg + 0.1 * (xx / w - 0.5) * rng.uniform(-1, 1, size=(n, 1, 1, 1))
    shift = rng.uniform(0.25, 0.5, size=(n, 3, 1, 1)) * np.where(nights, 1.0, -1.0)[:, None, None, None]
    img = bg + masks[:, None] * shift + rng.normal(0.0, 0.04, size=(n, 3, h, w))
    return np.clip(img, 0.0, 1.0).astype(np.float32), labels, nights


def box_images(rng: np.random.Generator, n: int, h: int, w: int, max_boxes: int = 4
               ) -> tuple[np.ndarray, np.ndarray]:
    """Street-scene stand-ins: 1 to ``max_boxes`` filled rectangles on a textured background.

    A rectangle's color is its class (6 classes); later rectangles occlude earlier ones.

    Returns:
        images [n, 3, h, w] in [0, 1]; boxes [n, max_boxes, 5] as (class, x0, y0, x1, y1) in pixels, rows
        of -1 where an image has fewer boxes.
    """
    img = rng.uniform(0.3, 0.6, size=(n, 1, 1, 1)) + rng.normal(0.0, 0.08, size=(n, 3, h, w))
    boxes = np.full((n, max_boxes, 5), -1.0, dtype=np.float32)
    side = min(h, w)
    for i in range(n):
        for j in range(int(rng.integers(1, max_boxes + 1))):
            bw, bh = rng.uniform(0.12, 0.45, size=2) * side
            x0, y0 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            cls = int(rng.integers(0, len(BOX_PALETTE)))
            ys, xs = slice(int(y0), int(y0 + bh) + 1), slice(int(x0), int(x0 + bw) + 1)
            img[i, :, ys, xs] = BOX_PALETTE[cls][:, None, None] + rng.normal(0.0, 0.05, size=(3, 1, 1))
            boxes[i, j] = (cls, x0, y0, x0 + bw, y0 + bh)
    return np.clip(img, 0.0, 1.0).astype(np.float32), boxes


def blob_images(rng: np.random.Generator, n: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Ellipses (the foreground) among rectangles (clutter), all in random colors, for segmentation.

    Returns:
        images [n, 3, h, w] in [0, 1] and masks [n, 1, h, w] in {0, 1} (the ellipses).
    """
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = rng.uniform(0.2, 0.8, size=(n, 3, 1, 1)) + rng.normal(0.0, 0.05, size=(n, 3, h, w))
    mask = np.zeros((n, 1, h, w), np.float32)
    side = min(h, w)
    for i in range(n):
        for _ in range(int(rng.integers(1, 4))):
            cy, cx = rng.uniform(0, h), rng.uniform(0, w)
            ry, rx = rng.uniform(0.06, 0.22, size=2) * side
            if rng.random() < 0.6:
                inside = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1.0
                mask[i, 0][inside] = 1.0
            else:
                inside = (abs(yy - cy) < ry) & (abs(xx - cx) < rx)
                mask[i, 0][inside] = 0.0
            img[i][:, inside] = rng.uniform(0.0, 1.0, size=(3, 1))
    return np.clip(img, 0.0, 1.0).astype(np.float32), mask


def audio_clips(rng: np.random.Generator, n: int, t: int, sample_rate: int = 16000
                ) -> tuple[np.ndarray, np.ndarray]:
    """Voiced speech stand-ins and noise-only clips, half each, peak-normalized to a random level.

    The speech is a glottal pitch with harmonics and a formant-like spectral tilt, in noise.

    Returns:
        audio [n, t] float32 in [-1, 1] and labels [n] (1 = speech).
    """
    time = np.arange(t, dtype=np.float64) / sample_rate
    labels = (np.arange(n) + rng.integers(0, 2)) % 2
    out = np.empty((n, t), np.float32)
    for i in range(n):
        noise = rng.normal(0.0, 1.0, t)
        if rng.random() < 0.5:  # brown-ish noise
            noise = np.cumsum(noise)
            noise -= noise.mean()
        noise /= np.abs(noise).max() + 1e-9
        if labels[i]:
            f0 = rng.uniform(90.0, 280.0) * (1.0 + 0.1 * time * rng.uniform(-1, 1))
            formant = rng.uniform(400.0, 1200.0)
            phase = 2 * np.pi * np.cumsum(f0) / sample_rate
            voiced = sum(np.exp(-abs(k * f0.mean() - formant) / 600.0) / k * np.sin(k * phase + rng.uniform(0, 6))
                         for k in range(1, 12))
            voiced /= np.abs(voiced).max() + 1e-9
            sig = voiced + noise * 10 ** (-rng.uniform(3.0, 20.0) / 20)
        else:
            sig = noise
        out[i] = sig / (np.abs(sig).max() + 1e-9) * rng.uniform(0.05, 0.8)
    return out, labels


def token_batch(rng: np.random.Generator, n: int, s: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokenized sentences padded to ``s``.

    [CLS]=1, word ids drawn by a Zipf law from 3..vocab-1, [SEP]=2, padding 0. Row 0 fills the whole
    length; the other rows have random valid lengths.

    Returns:
        input_ids [n, s] int64 and attention_mask [n, s] int64.
    """
    ranks = np.arange(1, vocab - 2, dtype=np.float64)
    p = 1.0 / ranks ** 1.1
    ids = 3 + rng.choice(vocab - 3, size=(n, s), p=p / p.sum())
    lengths = rng.integers(min(2, s), s + 1, size=n)
    lengths[0] = s
    mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, ids, 0)
    ids[:, 0] = 1
    ids[np.arange(n), np.maximum(lengths - 1, 1) if s > 1 else 0] = 2
    return ids.astype(np.int64), mask
