"""The torch backend package: ONNX graphs lowered to ``torch.fx`` and run on any torch device.

Importing this package imports no torch: :class:`TorchBackend` imports it when probed.
"""

from hybrid.backends.torch.backend import TorchBackend, TorchExecutable

__all__ = ["TorchBackend", "TorchExecutable"]
