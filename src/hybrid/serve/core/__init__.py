"""The serving core: server state and the one inference path, the models and their batching, the repository.

:mod:`~hybrid.serve.core.state` holds the server's state and :func:`~hybrid.serve.core.state.infer`, the path
every transport's request takes; :mod:`~hybrid.serve.core.model` is one served model (checks, queue, batching
through :mod:`~hybrid.serve.core.batcher` and :mod:`~hybrid.serve.core.batch_buffers`);
:mod:`~hybrid.serve.core.protocol` is the v2 JSON/binary request and response codec over the tensor codec of
:mod:`hybrid.serve.tensors`; :mod:`~hybrid.serve.core.repository` finds and loads models
(:mod:`~hybrid.serve.core.model_dir`, :mod:`~hybrid.serve.core.polling`, :mod:`~hybrid.serve.core.warmup`,
:mod:`~hybrid.serve.core.idle_tuning`). The core imports no transport (import-linter's ``serve-layers``).
"""
