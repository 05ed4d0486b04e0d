"""Scale-out on Ray Serve: the same models and the same v2 HTTP API, on N replicas or autoscaled.

Each replica loads the models itself and serves the app made by :func:`hybrid.serve.app.create_app`
through Serve's FastAPI ingress; Serve's proxy spreads requests over the replicas, and each replica
batches what it receives. Model paths are discovered and checked on the driver and must be readable at
the same path on every node (a shared file system, or a single machine).

Only imported when Ray is wanted: ``pip install 'pyasc[serve-ray]'``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray import serve

from hybrid.serve.app import ServeOptions, create_app
from hybrid.serve.model import BatchSettings
from hybrid.serve.repository import ModelSource, build_registry, configure_backends, discover

__all__ = ["HybridDeployment", "deploy", "shutdown"]

logger = logging.getLogger("hybrid.serve")

DEFAULT_APP = "pyasc"


@serve.ingress()
class HybridDeployment:
    """One Serve replica: loads the models, then serves the v2 app built for them.

    Args:
        sources: The model versions (discovered on the driver).
        target: Target for every model, or None for each model's own (else 'auto').
        overrides: Serving settings from the command line.
        options: Auth token and limits.
        backend_config: Backend options for this replica's process (see ``configure_backends``).
    """

    def __init__(self, sources: list[ModelSource], target: str | None, overrides: dict[str, Any],
                 options: ServeOptions, backend_config: dict[str, Any] | None = None) -> None:
        configure_backends(backend_config)
        self._registry = build_registry([], target, overrides, sources=sources)
        self._options = options

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(self._registry, self._options)


def deploy(models: Sequence[str | Path], *, target: str | None = None,
           overrides: Mapping[str, Any] | None = None, options: ServeOptions | None = None,
           backend_config: Mapping[str, Mapping[str, Any]] | None = None, replicas: int = 1,
           autoscaling: Mapping[str, Any] | None = None, replica_cpus: float = 1.0,
           ray_actor_options: Mapping[str, Any] | None = None, max_ongoing_requests: int = 64,
           host: str = "127.0.0.1", port: int = 8000, app_name: str = DEFAULT_APP, route_prefix: str = "/",
           ray_address: str | None = None, ray_init: Mapping[str, Any] | None = None) -> Any:
    """Deploy models as a Ray Serve application that speaks the KServe v2 HTTP API.

    Starts (or connects to) Ray and Serve's HTTP proxy on ``host:port`` when they are not running.

    Args:
        models: Model files and repository folders, as for ``pyasc serve``.
        target: Target for every model (None: each folder's config.json, else 'auto').
        overrides: Serving settings (:class:`~hybrid.serve.model.BatchSettings` fields) for every model.
        options: Auth token and request limits.
        backend_config: Backend options set in every replica's process, as for ``hybrid.set_backend``
            (ONNX Runtime's thread spinning is off unless given).
        replicas: Fixed number of replicas (ignored when ``autoscaling`` is given).
        autoscaling: Serve's ``autoscaling_config``, passed through (``min_replicas``, ``max_replicas``,
            ``target_ongoing_requests``, ...).
        replica_cpus: CPUs Ray reserves per replica (fractions allowed).
        ray_actor_options: More Ray actor options, passed through.
        max_ongoing_requests: Requests a replica takes at once; beyond, the proxy queues them. Keep it
            above ``max_batch`` or batches cannot fill.
        host: Address of Serve's HTTP proxy (loopback by default).
        port: Its port.
        app_name: Serve application name.
        route_prefix: URL prefix of the API ('/': the v2 paths as they are).
        ray_address: Ray cluster to join; None starts a local instance when none is running.
        ray_init: More ``ray.init`` arguments for a local instance (``num_cpus``, ...).

    Returns:
        The Serve deployment handle.

    Raises:
        HybridError: Discovery errors (HYB-201, HYB-707) and bad settings (HYB-101/102), on the driver.
    """
    from hybrid.hal import backend_class

    sources = discover(models)
    settings = dict(overrides or {})
    BatchSettings().merged(settings, "deploy(overrides=...)")
    for name, opts in (backend_config or {}).items():  # fail here rather than in every replica
        backend_class(name).validate_options(opts)
    if not ray.is_initialized():
        ray.init(address=ray_address, **dict(ray_init or {}))
    serve.start(http_options={"host": host, "port": port})
    deployment_options: dict[str, Any] = {
        "name": f"{app_name}-models",
        "ray_actor_options": {"num_cpus": replica_cpus, **dict(ray_actor_options or {})},
        "max_ongoing_requests": max_ongoing_requests,
    }
    if autoscaling:
        deployment_options["autoscaling_config"] = dict(autoscaling)
    else:
        deployment_options["num_replicas"] = replicas
    deployment = serve.deployment(HybridDeployment).options(**deployment_options)
    backends = {name: dict(opts) for name, opts in (backend_config or {}).items()}
    bound = deployment.bind(sources, target, settings, options or ServeOptions(), backends)
    logger.info("deploying %d model version(s) on Ray Serve at http://%s:%d%s", len(sources), host, port,
                route_prefix)
    return serve.run(bound, name=app_name, route_prefix=route_prefix, blocking=False)


def shutdown(app_name: str | None = DEFAULT_APP) -> None:
    """Delete the application (its replicas drain), or with ``app_name=None`` stop Serve entirely."""
    if app_name is None:
        serve.shutdown()
    else:
        serve.delete(app_name)
