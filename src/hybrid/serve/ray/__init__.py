"""Scale-out on Ray Serve (:mod:`~hybrid.serve.ray.deployment`), batch inference on Ray Data (:mod:`~.data`).

Only imported when Ray is wanted: ``pip install 'pyasc[serve-ray]'``.
"""
