"""Frontends: how models get into hybrid's IR.

``hybrid.frontends.torch.export`` turns a ``torch.nn.Module`` into a :class:`hybrid.Model`;
``hybrid.frontends.jit.jit`` traces a torch callable per input signature and runs the compiled model.
Nothing here is imported by ``import hybrid``: torch loads on first use.
"""

__all__: list[str] = []
