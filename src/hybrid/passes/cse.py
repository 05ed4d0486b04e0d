"""Common-subexpression elimination, from onnx-ir.

``deduplicate_initializers`` (onnx-ir's ``DeduplicateHashedInitializersPass``: equal dtype, shape and
content, compared by hash and then byte for byte) runs first, so that two nodes reading equal constants
from differently named initializers count as the same expression; ``eliminate_common_subexpressions``
(onnx-ir's ``CommonSubexpressionEliminationPass``) then keeps one of every set of nodes with the same
operator, attributes and inputs (random operators excepted).
"""

from __future__ import annotations

from onnx_ir.passes.common import CommonSubexpressionEliminationPass, DeduplicateHashedInitializersPass

from hybrid.passes.base import OnnxIrPass

__all__ = ["deduplicate_initializers", "eliminate_common_subexpressions"]


def deduplicate_initializers() -> OnnxIrPass:
    """onnx-ir's ``DeduplicateHashedInitializersPass``, whatever the tensor size."""
    return OnnxIrPass("deduplicate_initializers", DeduplicateHashedInitializersPass())


def eliminate_common_subexpressions() -> OnnxIrPass:
    """onnx-ir's ``CommonSubexpressionEliminationPass`` (tensor attributes up to 1024 elements compared)."""
    return OnnxIrPass("eliminate_common_subexpressions", CommonSubexpressionEliminationPass(size_limit=1024))
