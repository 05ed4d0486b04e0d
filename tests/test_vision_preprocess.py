"""Preprocessing: resize/letterbox geometry and its mapping back, crops, color, normalization, layout, dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid.errors import BundleError, RunError
from hybrid.ir import TensorSpec
from hybrid.vision import Preprocess, as_frames, image_input, prepare, prepare_crops

F32 = np.dtype("float32")


def _input(h, w, layout="NCHW", dtype=F32, batch="N", **decl):
    shape = (batch, 3, h, w) if layout == "NCHW" else (batch, h, w, 3)
    return image_input(Preprocess(**decl), TensorSpec("x", dtype, shape))


def _hwc(x, inp):
    return x.transpose(0, 2, 3, 1) if inp.layout == "NCHW" else x


def _exact_resize(frame: np.ndarray, h: int, w: int) -> np.ndarray:
    """Half-pixel bilinear resize (align_corners=False, no antialias) in float64."""

    def taps(n_in: int, n_out: int):
        src = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
        lo = np.minimum(np.floor(src).astype(int), n_in - 1)
        return lo, np.minimum(lo + 1, n_in - 1), src - lo

    y0, y1, ly = taps(frame.shape[0], h)
    x0, x1, lx = taps(frame.shape[1], w)
    f = frame.astype(np.float64)
    rows = f[y0] * (1 - ly)[:, None, None] + f[y1] * ly[:, None, None]
    return rows[:, x0] * (1 - lx)[None, :, None] + rows[:, x1] * lx[None, :, None]


def _torch_resize(frame: np.ndarray, h: int, w: int) -> np.ndarray:
    t = torch.from_numpy(frame.astype(np.float32)).permute(2, 0, 1)[None]
    out = torch.nn.functional.interpolate(t, size=(h, w), mode="bilinear", align_corners=False, antialias=False)
    return out[0].permute(1, 2, 0).numpy()


@settings(max_examples=60, deadline=None)
@given(fh=st.integers(1, 300), fw=st.integers(1, 300), ih=st.integers(4, 96), iw=st.integers(4, 96),
       mode=st.sampled_from(["letterbox", "resize"]))
def test_mapping_back_is_where_the_pixels_came_from(fh, fw, ih, iw, mode):
    """A frame whose pixels hold their own x and y: every input pixel of the image area says which frame
    position it was sampled from, and Placement.to_frame must map that pixel's center there (<= 0.5 px)."""
    yy, xx = np.mgrid[0:fh, 0:fw].astype(np.float32)
    frame = np.stack([xx, yy, np.zeros_like(xx)], -1)
    inp = _input(ih, iw, resize=mode, scale=1.0)
    x, (pl,) = prepare([frame], inp)
    x1, y1, x2, y2 = pl.dst
    if mode == "letterbox":  # aspect kept within rounding, image centered
        assert max(x2 - x1 - iw, y2 - y1 - ih) == 0  # one side fills the input
        assert abs((x2 - x1) / fw - (y2 - y1) / fh) <= 1 / min(fw, fh) + 1e-9
        assert abs(x1 - (iw - x2)) <= 1 and abs(y1 - (ih - y2)) <= 1
    u, v = np.meshgrid(np.arange(x1, x2) + 0.5, np.arange(y1, y2) + 0.5)
    mapped = pl.to_frame(np.stack([u.ravel(), v.ravel(), u.ravel(), v.ravel()], 1))
    sampled_x = x[0, 0, y1:y2, x1:x2].ravel() + 0.5
    sampled_y = x[0, 1, y1:y2, x1:x2].ravel() + 0.5
    # sampling clamps at the frame's outer half pixels; the mapping does not: compare inside them
    inner_x = (mapped[:, 0] >= 0.5) & (mapped[:, 0] <= fw - 0.5)
    inner_y = (mapped[:, 1] >= 0.5) & (mapped[:, 1] <= fh - 0.5)
    assert np.abs(mapped[inner_x, 0] - sampled_x[inner_x]).max(initial=0) <= 0.5
    assert np.abs(mapped[inner_y, 1] - sampled_y[inner_y]).max(initial=0) <= 0.5
    assert np.abs(mapped[inner_x, 0] - sampled_x[inner_x]).max(initial=0) < 1e-3  # in fact exact


def test_letterbox_box_mapping_known_cases():
    inp = _input(640, 640, resize="letterbox")
    _, (pl,) = prepare([np.zeros((480, 640, 3), np.uint8)], inp)
    assert pl.dst == (0, 80, 640, 560)
    np.testing.assert_allclose(pl.to_frame([[100, 180, 200, 280]]), [[100, 100, 200, 200]])
    _, (pl,) = prepare([np.zeros((720, 1280, 3), np.uint8)], inp)
    assert pl.dst == (0, 140, 640, 500)
    np.testing.assert_allclose(pl.to_frame([[0, 140, 640, 500], [10, 150, 20, 160]]), [[0, 0, 1280, 720],
                                                                                       [20, 20, 40, 40]])
    np.testing.assert_allclose(pl.to_frame([[-5, 0, 700, 100]]), [[0, 0, 1280, 0]])  # clipped to the frame


@settings(max_examples=40, deadline=None)
@given(fh=st.integers(1, 120), fw=st.integers(1, 120), ih=st.integers(2, 90), iw=st.integers(2, 90))
def test_resize_equals_torch_bilinear(fh, fw, ih, iw):
    """Half-pixel bilinear resize as torch defines it. Torch computes the source coordinates in float32,
    so near a 0/255 edge one fp32 ulp of a coordinate (~8e-6 at x=100) moves a pixel by up to ~2e-3; the
    exact float64 resize is held to 1e-4 and torch to a bound that allows its coordinate rounding."""
    frame = np.random.default_rng(fh * 1000 + fw).integers(0, 256, (fh, fw, 3), dtype=np.uint8)
    inp = _input(ih, iw, scale=1.0)
    x, _ = prepare([frame], inp)
    got = _hwc(x, inp)[0]
    np.testing.assert_allclose(got, _exact_resize(frame, ih, iw), rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, _torch_resize(frame, ih, iw), rtol=0, atol=1e-2)


def test_letterbox_pads_and_places_the_resized_frame(rng):
    frame = rng.integers(0, 256, (50, 100, 3), dtype=np.uint8)
    inp = _input(64, 64, resize="letterbox", scale=1.0)
    x, (pl,) = prepare([frame], inp)
    img = _hwc(x, inp)[0]
    x1, y1, x2, y2 = pl.dst
    assert (x1, y1, x2, y2) == (0, 16, 64, 48)
    np.testing.assert_allclose(img[y1:y2, x1:x2], _torch_resize(frame, 32, 64), atol=2e-3)
    assert np.all(img[:y1] == 114) and np.all(img[y2:] == 114)


def test_crops_equal_preprocessing_the_cropped_frame(rng):
    frames = [rng.integers(0, 256, (60, 80, 3), dtype=np.uint8) for _ in range(2)]
    rects = np.array([[10, 5, 40, 45], [0, 0, 80, 60], [70, 50, 80, 60], [3, 7, 4, 8]], np.float64)
    ids = np.array([0, 1, 1, 0])
    for mode in ("resize", "letterbox"):
        inp = _input(16, 24, resize=mode, mean=[0.4, 0.5, 0.6], std=[0.2, 0.3, 0.4])
        got, placements = prepare_crops(frames, ids, rects, inp)
        for k, (x1, y1, x2, y2) in enumerate(rects.astype(int)):
            want, (pl,) = prepare([frames[ids[k]][y1:y2, x1:x2]], inp)
            np.testing.assert_allclose(got[k], want[0], atol=1e-4)
            assert placements[k].dst == pl.dst and placements[k].src == (x1, y1, x2, y2)


def test_color_scale_mean_std_layout_and_dtypes(rng):
    frame = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    inp = _input(8, 8, mean=mean, std=std)
    want = (frame / 255.0 - mean) / std
    x, _ = prepare([frame], inp)
    assert x.dtype == np.float32 and x.shape == (1, 3, 8, 8)
    np.testing.assert_allclose(x[0].transpose(1, 2, 0), want, atol=1e-5)
    bgr, _ = prepare([frame[..., ::-1]], inp, color="bgr")  # BGR frames for an RGB model
    np.testing.assert_allclose(bgr, x, atol=1e-6)
    to_bgr, _ = prepare([frame], _input(8, 8, mean=mean, std=std, color="bgr"))  # a BGR model: mean/std in its order
    np.testing.assert_allclose(to_bgr[0].transpose(1, 2, 0), (frame[..., ::-1] / 255.0 - mean) / std, atol=1e-5)
    nhwc, _ = prepare([frame], _input(8, 8, layout="NHWC", mean=mean, std=std))
    assert nhwc.shape == (1, 8, 8, 3)
    np.testing.assert_allclose(nhwc[0], want, atol=1e-5)
    half, _ = prepare([frame], _input(8, 8, dtype=np.dtype("float16")))
    assert half.dtype == np.float16
    np.testing.assert_allclose(half[0].transpose(1, 2, 0), frame / 255.0, atol=1e-3)
    raw, _ = prepare([frame], _input(8, 8, dtype=np.dtype("uint8"), scale=1.0))
    assert raw.dtype == np.uint8 and np.array_equal(raw[0].transpose(1, 2, 0), frame)


def test_gray_rgba_and_one_channel_models(rng):
    gray = rng.integers(0, 256, (6, 6), dtype=np.uint8)
    x, _ = prepare(as_frames(gray)[0], _input(6, 6, scale=1.0))
    assert np.array_equal(x[0], np.stack([gray] * 3).astype(np.float32))
    rgba = rng.integers(0, 256, (6, 6, 4), dtype=np.uint8)
    x, _ = prepare([rgba], _input(6, 6, scale=1.0))
    assert np.array_equal(x[0].transpose(1, 2, 0), rgba[..., :3].astype(np.float32))
    mono = image_input(Preprocess(scale=1.0, mean=[0], std=[1]), TensorSpec("x", F32, ("N", 1, 6, 6)))
    x, _ = prepare([rgba], mono)
    np.testing.assert_allclose(x[0, 0], rgba[..., :3] @ np.array([0.299, 0.587, 0.114]), atol=1e-3)


def test_frames_of_several_sizes_in_one_batch(rng):
    frames = [rng.integers(0, 256, s, dtype=np.uint8) for s in ((30, 40, 3), (50, 20, 3), (30, 40, 3), (64, 64, 3))]
    inp = _input(32, 32, resize="letterbox")
    batch, placements = prepare(frames, inp)
    for i, f in enumerate(frames):
        one, (pl,) = prepare([f], inp)
        np.testing.assert_array_equal(batch[i], one[0])
        assert placements[i] == pl


def test_as_frames_shapes_and_errors():
    frames, single = as_frames(np.zeros((4, 5, 6, 3), np.uint8))
    assert len(frames) == 4 and not single
    frames, single = as_frames(np.zeros((5, 6, 3), np.uint8))
    assert len(frames) == 1 and single
    assert not as_frames([np.zeros((5, 6, 3)), np.zeros((7, 8, 3))])[1]
    for bad, code in (("frame.png", "HYB-406"), ([np.zeros((2, 2, 2))], "HYB-404"), ([np.zeros((0, 2, 3))], "HYB-404"),
                      ([np.zeros((2, 2, 3), np.int64)], "HYB-403"), ([np.array(["a"])], "HYB-406"), (42, "HYB-406")):
        with pytest.raises(RunError) as info:
            as_frames(bad)
        assert info.value.code == code, bad


@pytest.mark.parametrize(("shape", "decl", "words"), [
    (("N", 3, 64), {}, "rank 4"),
    (("N", 5, 64, 64), {}, "layout"),
    (("N", 3, "H", "W"), {}, "no size is declared"),
    (("N", 3, 64, 64), {"size": [32, 64]}, "height is 64"),
    (("N", 3, 64, 64), {"mean": [0.1, 0.2]}, "1 or 3 values"),
    (("N", 3, 64, 64), {"dtype": "uint8"}, "raw pixels"),
    ((1, 3, 64, 64), {"max_batch": 8}, "fixed at 1"),
    (("N", 3, 64, 64), {"layout": "NHWC"}, "64 channels"),
])
def test_declarations_that_do_not_fit_the_input(shape, decl, words):
    with pytest.raises(BundleError) as info:
        image_input(Preprocess(**decl), TensorSpec("x", F32, shape))
    assert info.value.code == "HYB-502" and words in info.value.message


def test_dynamic_size_and_batch():
    inp = image_input(Preprocess(size=[48, 80], max_batch=3), TensorSpec("x", F32, ("N", 3, "H", "W")))
    assert (inp.height, inp.width, inp.max_batch, inp.static_batch) == (48, 80, 3, None)
    inp = image_input(Preprocess(), TensorSpec("x", F32, (2, 3, 8, 8)))
    assert (inp.max_batch, inp.static_batch) == (2, 2)
