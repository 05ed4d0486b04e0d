"""Moved to :mod:`hybrid.hal.capability`; this name stays for the backends that still import it from here.

It moved because the partitioner in the runtime uses it, and the runtime must not import a backend module.
"""

from __future__ import annotations

from hybrid.hal.capability import captured_values, node_opset, one_node_model, op_signature

__all__ = ["captured_values", "node_opset", "one_node_model", "op_signature"]
