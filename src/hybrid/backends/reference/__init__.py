"""The reference backend: numpy kernels that define every op, always available.

Public names: :class:`ReferenceBackend` (registered as 'reference'), :func:`custom_op` (re-exported
as ``hybrid.custom_op``) and :func:`evaluate_node` (constant folding in the graph optimizer).
Importing this package registers the hand kernels; it imports no backend library.
"""

from __future__ import annotations

from hybrid.backends.reference import (  # noqa: F401 - importing registers the kernels
    ops_control,
    ops_conv,
    ops_elementwise,
    ops_index,
    ops_nn,
    ops_optional,
    ops_quant,
    ops_reduce,
    ops_resize,
    ops_shape,
    ops_spectral,
)
from hybrid.backends.reference.backend import ReferenceBackend, ReferenceExecutable
from hybrid.backends.reference.evaluate import evaluate_node
from hybrid.backends.reference.registry import custom_op, registered_ops

__all__ = ["ReferenceBackend", "ReferenceExecutable", "custom_op", "evaluate_node", "registered_ops"]
