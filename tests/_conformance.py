"""ONNX node conformance through a hybrid target, compared the way ONNX's own backend runner does.

TensorProto inputs/outputs (exotic dtypes) go through onnx.numpy_helper.to_array, strings compare
exactly, sequences element-wise, bfloat16/float8/int4 through float32, NaN equals NaN, each case with
its own rtol/atol. Same rules as the team's shared conformance tool.
"""

from __future__ import annotations

import warnings

import numpy as np
from onnx import TensorProto, numpy_helper


def as_array(v):
    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else v


def close(a, b, rtol: float, atol: float) -> bool:
    a, b = as_array(a), as_array(b)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(close(x, y, rtol, atol) for x, y in zip(a, b)))
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype == object or b.dtype == object or a.dtype.kind in "SU" or b.dtype.kind in "SU":
        return np.array_equal(a.astype(object), b.astype(object))
    if a.dtype.kind == "V" or b.dtype.kind == "V":
        try:
            a, b = a.astype(np.float32), b.astype(np.float32)
        except (TypeError, ValueError):
            return a.tobytes() == b.tobytes()
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        return np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    return np.array_equal(a, b)


def run_case(case, target: str) -> None:
    """Compile and run one node case; raise on any failure or mismatch."""
    import hybrid

    cm = hybrid.compile(case.model, target=target)
    names = cm.signature.input_names
    for ins, outs in case.data_sets:
        got = list(cm.run(dict(zip(names, [as_array(i) for i in ins]))).values())
        if len(got) < len(outs) or not all(close(g, o, case.rtol, case.atol) for g, o in zip(got, outs)):
            raise AssertionError(f"{case.name}: wrong output")


def conformance(target: str) -> tuple[int, list[str]]:
    """Return (number passed, names failed) over all ONNX node cases for ``target``."""
    import onnx.backend.test.case.node as node_cases

    passed, failed = 0, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases()
        for case in cases:
            try:
                run_case(case, target)
                passed += 1
            except Exception:
                failed.append(case.name)
    return passed, failed
