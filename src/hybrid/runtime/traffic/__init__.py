"""The traffic around a compiled model: what carries requests to any callable, compiling and running nothing.

A room of its own beside the compile core (``hybrid.runtime``: compile, plans, partitions, the executor, the
profiler) and the tuner (:mod:`hybrid.runtime.auto`); pyproject's import contracts keep the three apart:

- :mod:`.batching`: ``@hybrid.dynamic_batch`` / ``Batcher``, many single requests in, one call per batch;
- :mod:`.pipeline`: ``hybrid.Pipeline``, stages on their own threads joined by bounded queues;
- :mod:`.stream`: ``hybrid.StreamContext``, an ordered asynchronous work queue per device;
- :mod:`.collector`: the garbage-collector policy of a long-running process (``pyasc serve``, the tuner's
  check process), which keeps full collections from pausing the requests in flight.

Each wraps callables; the only part of the core they use is the input validator a batch can check requests with.
"""
