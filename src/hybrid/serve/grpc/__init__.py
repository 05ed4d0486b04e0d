"""The gRPC transport: Triton's ``GRPCInferenceService`` on grpcio's asyncio server.

:mod:`~hybrid.serve.grpc.server` is the service, :mod:`~hybrid.serve.grpc.wire` reads a ``ModelInferRequest``
off the wire by hand (the hot path; protobuf parses everything else) and :mod:`~hybrid.serve.grpc.accept` takes
calls ahead of the server's own loop. It never imports the HTTP transport (import-linter's ``serve-layers``).
"""
