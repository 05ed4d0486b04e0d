"""The HTTP transport: the v2 infer route, the generate extension and Triton's HTTP extension routes.

It never imports the gRPC transport (import-linter's ``serve-layers``); both reach the core through
:mod:`hybrid.serve.core.state`.
"""
