"""The IR layer: ONNX models held with onnx-ir, their signatures, safe loading and saving.

This package imports no other part of hybrid but ``hybrid.errors``.
"""

from hybrid.ir.model import Model, atomic_file, atomic_write_bytes
from hybrid.ir.signature import Signature, TensorSpec, signature_of

__all__ = ["Model", "Signature", "TensorSpec", "atomic_file", "atomic_write_bytes", "signature_of"]
