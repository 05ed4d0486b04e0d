"""Triton's protocol extensions, one module each, as state and rules the core composes.

Classification, sequences, system shared memory, the response cache, log settings, the scheduling policy and
the model configuration (config.pbtxt <-> ``ModelConfig``). Their HTTP routes live in
:mod:`hybrid.serve.http.extensions` and their gRPC methods in :mod:`hybrid.serve.grpc.server`: an extension
imports no transport (import-linter's ``serve-layers``).
"""
