"""Optional values.

An optional is its value, or None when empty (as onnx.reference's OptionalGetElement reads it; its Optional constructor
wraps the value in a list, which breaks an optional sequence, so hybrid defines these three ops itself).
"""

from __future__ import annotations

import numpy as np

from hybrid.backends.reference.registry import NodeContext, kernel, prepared

__all__: list[str] = []


@prepared("Optional", since=15)
def _optional(ctx: NodeContext):
    if set(ctx.attrs) - {"type"}:
        return None

    def run(x=None):
        return (x,)

    return run


@kernel("OptionalHasElement", since=15)
def _optional_has_element(x=None):
    return (np.array(x is not None),)


@kernel("OptionalGetElement", since=15)
def _optional_get_element(x):
    if x is None:
        raise ValueError("OptionalGetElement on an empty optional")
    return (x,)
