"""Conv algorithms agree with im2col (property tests), and the selection rule picks what it documents."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybrid.backends.reference import conv_algorithms as ca
from hybrid.backends.reference.ops_conv import ConvKernel


@st.composite
def conv_cases(draw, algorithm: str):
    """Random 2-D convs that ``algorithm`` can compute."""
    rank1 = draw(st.booleans()) and algorithm != "winograd"
    n = draw(st.integers(1, 2))
    if algorithm == "depthwise":
        group = c = draw(st.integers(1, 6))
        m = c * draw(st.integers(1, 3))
    else:
        group = 1 if algorithm == "winograd" else draw(st.sampled_from([1, 1, 2, 3]))
        c = group * draw(st.integers(1, 4))
        m = group * draw(st.integers(1, 4))
    if algorithm == "winograd":
        k, s, d = (3, 3), (1, 1), (1, 1)
    else:
        k = (1, draw(st.integers(1, 5))) if rank1 else (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
        s = (1, draw(st.integers(1, 3))) if rank1 else (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        d = (1, draw(st.integers(1, 2))) if rank1 else (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple(0 if (rank1 and i % 2 == 0) else draw(st.integers(0, 2)) for i in range(4))
    span = [(k[i] - 1) * d[i] + 1 for i in range(2)]
    h = 1 if rank1 else draw(st.integers(max(1, span[0] - pads[0] - pads[2]), 12))
    w = draw(st.integers(max(1, span[1] - pads[1] - pads[3]), 12))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad == "VALID":
        h, w = max(h, span[0]), max(w, span[1])
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c // group, *k)).astype(np.float32)
    if rank1:
        x, wt = x[:, :, 0], wt[:, :, 0]
        attrs = {"strides": s[1:], "dilations": d[1:], "pads": (pads[1], pads[3]), "group": group}
    else:
        attrs = {"strides": s, "dilations": d, "pads": (pads[0], pads[1], pads[2], pads[3]), "group": group}
    if auto_pad != "NOTSET":
        attrs["auto_pad"] = auto_pad
        del attrs["pads"]
    return x, wt, attrs


def _run(x, w, attrs, algorithm, const=True):
    kernel = ConvKernel(attrs, w if const else None, None, algorithm)
    return kernel(x) if const else kernel(x, w)


@pytest.mark.parametrize("algorithm", ["winograd", "depthwise", "direct"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_algorithms_equal_im2col(algorithm, data):
    x, w, attrs = data.draw(conv_cases(algorithm))
    expected = _run(x, w, attrs, "im2col")[0]
    kernel = ConvKernel(attrs, w, None, algorithm)
    geometry, chosen = kernel.plan(x.shape, w.shape)
    x4 = x if x.ndim == 4 else x[:, :, None]
    assert chosen == algorithm or not ca.applicable(algorithm, x4.shape, geometry)
    got = kernel(x)[0]
    assert got.shape == expected.shape
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * scale)
    # weights known only at run time take the same path
    np.testing.assert_allclose(_run(x, w, attrs, algorithm, const=False)[0], expected, rtol=1e-4,
                               atol=1e-4 * scale)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_im2col_matches_a_naive_loop(data):
    x, w, attrs = data.draw(conv_cases("direct"))
    if x.ndim == 3:
        return
    g = ca.geometry(x.shape, w.shape, **attrs)
    xp = ca.pad_input(x, g)
    n, m = x.shape[0], w.shape[0]
    cg, mg = w.shape[1], m // g.group
    expected = np.zeros((n, m, *g.out), np.float64)
    for oc in range(m):
        grp = oc // mg
        for i in range(g.out[0]):
            for j in range(g.out[1]):
                for ki in range(g.kernel[0]):
                    for kj in range(g.kernel[1]):
                        patch = xp[:, grp * cg:(grp + 1) * cg, i * g.strides[0] + ki * g.dilations[0],
                                   j * g.strides[1] + kj * g.dilations[1]]
                        expected[:, oc, i, j] += patch @ w[oc, :, ki, kj]
    got = _run(x, w, attrs, "im2col")[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(expected).max()))


def _geometry(x_shape, w_shape, **attrs):
    return ca.geometry(x_shape, w_shape, **attrs)


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "expected"), [
    ((1, 32, 56, 56), (32, 1, 3, 3), {"group": 32, "pads": (1, 1, 1, 1)}, "depthwise"),
    ((1, 24, 28, 28), (48, 1, 5, 5), {"group": 24, "pads": (2, 2, 2, 2)}, "depthwise"),
    ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": (1, 1, 1, 1)}, "winograd"),
    ((1, 256, 14, 14), (256, 256, 3, 3), {"pads": (1, 1, 1, 1)}, "winograd"),       # 49 tiles
    ((1, 512, 7, 7), (512, 512, 3, 3), {"pads": (1, 1, 1, 1)}, "im2col"),           # 16 tiles < 36
    ((4, 512, 7, 7), (512, 512, 3, 3), {"pads": (1, 1, 1, 1)}, "winograd"),         # batch counts
    ((1, 32, 56, 56), (32, 32, 3, 3), {"pads": (1, 1, 1, 1)}, "im2col"),            # too few channels
    ((1, 64, 56, 56), (64, 64, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}, "im2col"),
    ((1, 64, 56, 56), (64, 64, 3, 3), {"dilations": (2, 2), "pads": (2, 2, 2, 2)}, "im2col"),
    ((1, 64, 56, 56), (64, 32, 3, 3), {"group": 2, "pads": (1, 1, 1, 1)}, "im2col"),
    ((1, 64, 56, 56), (256, 64, 1, 1), {}, "im2col"),
    ((1, 3, 224, 224), (64, 3, 7, 7), {"strides": (2, 2), "pads": (3, 3, 3, 3)}, "im2col"),
])
def test_selection_rule(x_shape, w_shape, attrs, expected):
    assert ca.select_algorithm(x_shape, w_shape, _geometry(x_shape, w_shape, **attrs)) == expected


@pytest.mark.parametrize("algorithm", ["im2col", "winograd", "depthwise", "direct"])
def test_config_override_applies_where_it_can(algorithm):
    x_shape, w_shape = (1, 8, 10, 10), (8, 8, 3, 3)
    chosen = ConvKernel({"pads": (1, 1, 1, 1)}, None, None, algorithm).plan(x_shape, w_shape)[1]
    # depthwise needs group == C_in: a dense conv falls back to im2col
    assert chosen == ("im2col" if algorithm == "depthwise" else algorithm)
    dense_5x5 = ConvKernel({}, None, None, algorithm).plan((1, 8, 10, 10), (8, 8, 5, 5))[1]
    assert dense_5x5 == ("im2col" if algorithm in ("winograd", "depthwise") else algorithm)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="channels"):
        ca.geometry((1, 3, 8, 8), (4, 2, 3, 3))
    with pytest.raises(ValueError, match="does not fit"):
        ca.geometry((1, 3, 2, 2), (4, 3, 5, 5))


@pytest.mark.parametrize("algorithm", ["im2col", "winograd", "depthwise", "direct"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_intra_op_threads_change_nothing(monkeypatch, algorithm, data):
    from hybrid.backends.reference import parallel

    x, w, attrs = data.draw(conv_cases(algorithm))
    m = w.shape[0]
    bias = np.linspace(-1, 1, m).astype(np.float32)
    single = ConvKernel(attrs, w, bias, algorithm)
    single.relu = True
    expected = single(x)[0]
    monkeypatch.setattr(parallel, "_MIN_WORK", 0)  # split even these small convs
    previous = parallel.set_threads(3)
    try:
        got = single.with_weights(w, bias)(x)[0]
    finally:
        parallel.set_threads(previous)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(expected).max())))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 4), cin=st.sampled_from([1, 3, 16, 32, 63, 64, 96, 256]),
       m_per_group=st.sampled_from([1, 16, 63, 64, 128]), k=st.sampled_from([1, 3, 5]),
       s=st.integers(1, 2), d=st.integers(1, 2), depthwise=st.booleans(), size=st.integers(3, 20))
def test_selection_rule_is_the_documented_one(n, cin, m_per_group, k, s, d, depthwise, size):
    group = cin if depthwise else 1
    x_shape, w_shape = (n, cin, size + 8, size + 8), (m_per_group * group, cin // group, k, k)
    g = ca.geometry(x_shape, w_shape, strides=(s, s), dilations=(d, d), group=group)
    tiles = n * ((g.out[0] + 1) // 2) * ((g.out[1] + 1) // 2)
    if group > 1 and group == cin:
        expected = "depthwise"
    elif k == 3 and s == 1 and d == 1 and group == 1 and cin >= 64 and w_shape[0] >= 64 and tiles >= 36:
        expected = "winograd"
    else:
        expected = "im2col"
    assert ca.select_algorithm(x_shape, w_shape, g) == expected
