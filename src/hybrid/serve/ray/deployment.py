"""Scale-out on Ray Serve: the same models and the same v2 HTTP and gRPC APIs, on N replicas or autoscaled.

Each replica serves the app made by :func:`hybrid.serve.app.create_app` through Serve's FastAPI ingress,
and the KServe v2 / Triton gRPC service through Serve's gRPC proxy (:mod:`hybrid.serve.ray.grpc_methods`); Serve's
proxies spread requests over the replicas, and each replica batches what it receives.

The models travel with the deployment (:mod:`hybrid.serve.ray.models`): the driver reads and digests the
files, the deployment's init arguments carry them, and each node checks and caches them, so no node needs
the driver's path, and replicas restarted after the driver is gone (or its files deleted) still load them.
:func:`app_builder` makes the same application from a ``serve deploy`` config file.

Each replica warms its models up before it counts as started, answers Serve's ``check_health`` (every model
loaded and answering a tiny call, :mod:`hybrid.serve.ray.health`), and drains on :func:`drain`: it refuses
new requests with HYB-706 and answers the ones it has, then Serve deletes the application.

Only imported when Ray is wanted: ``pip install 'pyasc[serve-ray]'``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.experimental import internal_kv

from hybrid.errors import ConfigError
from hybrid.serve.app import create_app
from hybrid.serve.core.model import BatchSettings
from hybrid.serve.core.repository import build_registry, configure_backends, discover
from hybrid.serve.core.state import ServeOptions
from hybrid.serve.grpc.server import GrpcService
from hybrid.serve.ray.grpc_methods import SERVICER_FUNCTION, GrpcMethods
from hybrid.serve.ray.health import ReplicaHealth
from hybrid.serve.ray.models import ModelPackage, is_uri, materialize, pack, package_uri

__all__ = ["HybridDeployment", "app_builder", "build_application", "connect", "deploy", "drain", "serve_until_stopped",
           "shutdown"]

logger = logging.getLogger("hybrid.serve")

DEFAULT_APP = "pyasc"
KV_NAMESPACE = "pyasc"
DRAIN_POLL = 0.2  # seconds between a replica's looks at its application's drain flag
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "hybrid.serve.ray.proxy:middlewares"


def _drain_key(app_name: str) -> bytes:
    return f"drain/{app_name}".encode()


def _watch_drain(app_name: str, state: Any, stop: threading.Event) -> None:
    """A replica's thread: begin draining once the driver raised the application's drain flag."""
    key = _drain_key(app_name)
    while not stop.wait(DRAIN_POLL):
        try:
            flagged = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE) is not None
        except Exception as e:  # the GCS being briefly away must not end the watch
            logger.debug("drain flag of %s: %s", app_name, e)
            continue
        if flagged:
            state.begin_drain()
            try:  # tell the driver this replica refuses new requests now
                replica = serve.get_replica_context().replica_id.unique_id
                internal_kv._internal_kv_put(_drain_key(app_name) + f"/ack/{replica}".encode(), b"1",
                                             namespace=KV_NAMESPACE)
            except Exception as e:  # the driver then waits its longest settle time
                logger.warning("drain of %s: cannot acknowledge (%s)", app_name, e)
            return


@serve.ingress()
class HybridDeployment(GrpcMethods):
    """One Serve replica: checks and loads the shipped models, warms them up, then serves them.

    Args:
        packages: The model versions and their bytes (:func:`hybrid.serve.ray.models.pack`).
        target: Target for every model, or None for each model's own (else 'auto').
        overrides: Serving settings from the command line.
        options: Auth token and limits (gRPC goes through Serve's proxy; model control is off on Ray).
        backend_config: Backend options for this replica's process (see ``configure_backends``).
        warmup: Probe runs per model before the replica counts as started.
        app_name: The Serve application (whose drain flag the replica watches).
    """

    def __init__(self, packages: list[ModelPackage], target: str | None, overrides: dict[str, Any],
                 options: ServeOptions, backend_config: dict[str, Any] | None = None, warmup: int = 1,
                 app_name: str = DEFAULT_APP) -> None:
        configure_backends(backend_config)
        sources = [materialize(p) for p in packages]
        registry = build_registry([], target, overrides, sources=sources)
        try:
            self._health = ReplicaHealth(registry)
            self._health.warm_up(warmup)
        except BaseException:
            registry.close()
            raise
        self._app = create_app(registry, dataclasses.replace(options, grpc_address=None, model_control=False))
        self._state = self._app.state.hybrid
        self.grpc_service = GrpcService(self._state)
        self._stop_watch = threading.Event()
        threading.Thread(target=_watch_drain, args=(app_name, self._state, self._stop_watch),
                         name="hybrid-drain-watch", daemon=True).start()
        logger.info("replica ready: %d model version(s), warm-up %d run(s) each", len(registry), warmup)

    def __serve_build_asgi_app__(self) -> Any:
        return self._app

    async def check_health(self) -> None:
        """Serve's health check: raises when a model is not loaded or does not answer its probe."""
        await self._health.check(self._state.draining)


def build_application(models: Sequence[str | Path], *, target: str | None = None,
                      overrides: Mapping[str, Any] | None = None, options: ServeOptions | None = None,
                      backend_config: Mapping[str, Mapping[str, Any]] | None = None, replicas: int = 1,
                      autoscaling: Mapping[str, Any] | None = None, replica_cpus: float = 1.0,
                      ray_actor_options: Mapping[str, Any] | None = None, max_ongoing_requests: int = 64,
                      warmup: int = 1, health_check_period_s: float = 10.0, app_name: str = DEFAULT_APP) -> Any:
    """The Serve application for ``models``, their files read and packed here (see the module doc).

    Args:
        models: Model files and repository folders, as for ``pyasc serve``, whose bytes travel in the init
            arguments; and ``[NAME=]URI[#sha256=HEX]`` entries (``file://``, ``http(s)://``, fsspec's
            schemes) that every node reads itself (:func:`hybrid.serve.ray.models.package_uri`).
        target: Target for every model (None: each folder's config.json, else 'auto').
        overrides: Serving settings (:class:`~hybrid.serve.core.model.BatchSettings` fields) for every model.
        options: Auth token and request limits.
        backend_config: Backend options set in every replica's process, as for ``hybrid.set_backend``.
        replicas: Fixed number of replicas (ignored when ``autoscaling`` is given).
        autoscaling: Serve's ``autoscaling_config``, passed through.
        replica_cpus: CPUs Ray reserves per replica (fractions allowed).
        ray_actor_options: More Ray actor options, passed through.
        max_ongoing_requests: Requests a replica takes at once; keep it above ``max_batch``.
        warmup: Probe runs per model before a replica counts as started (0: none).
        health_check_period_s: Seconds between Serve's health checks of a replica.
        app_name: The application's name (also names the deployment: ``<app_name>-models``).

    Returns:
        The bound application, for ``serve.run`` (or returned by a ``serve deploy`` builder).

    Raises:
        HybridError: Discovery and packing errors (HYB-201, HYB-707), bad settings (HYB-101/102/301/306).
    """
    from hybrid.hal import backend_class

    uris = [m for m in models if is_uri(m)]
    sources = discover([m for m in models if not is_uri(m)]) if len(uris) < len(models) else []
    settings = dict(overrides or {})
    BatchSettings().merged(settings, "overrides")
    for name, opts in (backend_config or {}).items():  # fail here rather than in every replica
        backend_class(name).validate_options(opts)
    if warmup < 0:
        raise ConfigError("HYB-102", f"warmup must be >= 0 probe runs, got {warmup}", "0 turns warm-up off")
    packages = pack(sources) + [package_uri(str(u)) for u in uris]
    deployment_options: dict[str, Any] = {
        "name": f"{app_name}-models",
        "ray_actor_options": {"num_cpus": replica_cpus, **dict(ray_actor_options or {})},
        "max_ongoing_requests": max_ongoing_requests,
        "health_check_period_s": health_check_period_s,
    }
    if autoscaling:
        deployment_options["autoscaling_config"] = dict(autoscaling)
    else:
        deployment_options["num_replicas"] = replicas
    deployment = serve.deployment(HybridDeployment).options(**deployment_options)
    backends = {name: dict(opts) for name, opts in (backend_config or {}).items()}
    logger.info("packed %d model version(s), %d bytes, for the deployment", len(packages),
                sum(p.size for p in packages))
    # replicas share no memory with a client (they may run on any node), and a call reaches one of them: no
    # system shared memory, no log or trace settings over the network, no stateful models
    options = dataclasses.replace(options or ServeOptions(), shared_memory=False, log_settings=False,
                                  trace=None, sequences=False)
    return deployment.bind(packages, target, settings, options, backends, warmup, app_name)


def app_builder(args: Mapping[str, Any]) -> Any:
    """Builder for ``serve deploy`` / ``serve run`` config files.

    Their ``import_path`` is ``hybrid.serve.ray.deployment:app_builder``.

    ``args`` are :func:`build_application`'s keywords (``models`` a list of paths readable where Serve runs
    the build, the head node), plus ``auth_token``; unknown keys are refused (HYB-101).
    """
    known = {"models", "target", "overrides", "backend_config", "replicas", "autoscaling", "replica_cpus",
             "ray_actor_options", "max_ongoing_requests", "warmup", "health_check_period_s", "app_name",
             "auth_token"}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ConfigError("HYB-101", f"app_builder: unknown argument(s) {', '.join(unknown)}",
                          f"expected some of {', '.join(sorted(known))}")
    if not isinstance(args.get("models"), list) or not args["models"]:
        raise ConfigError("HYB-102", f"app_builder: 'models' must be a list of paths, got {args.get('models')!r}",
                          "args: {models: [/models/repo]}")
    kwargs = dict(args)
    token = kwargs.pop("auth_token", None)
    return build_application(kwargs.pop("models"), options=ServeOptions(auth_token=token), **kwargs)


def _reload_auth_config() -> None:
    """Ray reads its auth mode and token once per process (at import, and on first use): read them again."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray without token authentication
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def connect(ray_address: str | None = None, ray_init: Mapping[str, Any] | None = None,
            auth_token: str | None = None) -> None:
    """Start or join Ray, once per process.

    Args:
        ray_address: Cluster to join ('auto', 'HOST:PORT', 'ray://...'); None starts a local instance when
            none runs.
        ray_init: More ``ray.init`` arguments (``num_cpus``, ``_node_ip_address``, ...).
        auth_token: The cluster's token (Ray's token authentication); set as ``RAY_AUTH_TOKEN`` with
            ``RAY_AUTH_MODE=token`` unless the mode is set. Ray also reads ``RAY_AUTH_TOKEN_PATH`` and
            ``~/.ray/auth_token`` itself.
    """
    if ray.is_initialized():
        return
    if auth_token:
        os.environ["RAY_AUTH_TOKEN"] = auth_token
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        _reload_auth_config()
    # Serve's proxy answers its own errors as plain text; a local instance started here inherits this, so its
    # proxy answers them as the server's JSON errors (a cluster's nodes need it set where `ray start` runs)
    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
    ray.init(address=ray_address, **dict(ray_init or {}))


def deploy(models: Sequence[str | Path], *, host: str = "127.0.0.1", port: int = 8000, grpc_port: int = 0,
           proxy_location: str | None = None, route_prefix: str = "/", ray_address: str | None = None,
           ray_init: Mapping[str, Any] | None = None, app_name: str = DEFAULT_APP, **build: Any) -> Any:
    """Deploy models as a Ray Serve application that speaks the KServe v2 HTTP (and gRPC) API.

    Starts (or joins) Ray, and Serve's proxies when Serve is not running; then deploys and waits until every
    replica has loaded and warmed up its models.

    Args:
        models: Model files and repository folders, as for ``pyasc serve``.
        host: Address of Serve's HTTP proxy (loopback by default).
        port: Its port.
        grpc_port: Port of Serve's gRPC proxy with the KServe v2 / Triton service; 0: no gRPC. Serve's gRPC
            proxy listens on every interface (``[::]``), whatever ``host`` says.
        proxy_location: Serve's ``proxy_location`` ('EveryNode', Ray's default; 'HeadOnly'; 'Disabled').
        route_prefix: URL prefix of the API ('/': the v2 paths as they are).
        ray_address: Ray cluster to join; None starts a local instance when none is running.
        ray_init: More ``ray.init`` arguments for :func:`connect`.
        app_name: Serve application name.
        **build: :func:`build_application`'s keywords (``target``, ``overrides``, ``options``, ``replicas``,
            ``autoscaling``, ``replica_cpus``, ``warmup``, ...).

    Returns:
        The Serve deployment handle.

    Raises:
        HybridError: Discovery, packing and settings errors, on the driver.
    """
    from ray.serve.config import HTTPOptions, gRPCOptions

    application = build_application(models, app_name=app_name, **build)
    connect(ray_address, ray_init)
    start: dict[str, Any] = {"http_options": HTTPOptions(host=host, port=port)}
    if grpc_port:
        start["grpc_options"] = gRPCOptions(port=grpc_port, grpc_servicer_functions=[SERVICER_FUNCTION])
        options = build.get("options")
        if options is None or not options.auth_token:
            logger.warning("Serve's gRPC proxy listens on every interface ([::]:%d), whatever the HTTP host %s; "
                           "set an auth token, or a firewall, when this machine is reachable (grpc_port=0 turns "
                           "gRPC off)", grpc_port, host)
    if proxy_location:
        start["proxy_location"] = proxy_location
    serve.start(**start)
    _clear_drain(app_name)
    logger.info("deploying on Ray Serve at http://%s:%d%s%s", host, port, route_prefix,
                f" and grpc port {grpc_port}" if grpc_port else "")
    return serve.run(application, name=app_name, route_prefix=route_prefix, blocking=False)


def _running_replicas(app_name: str) -> int:
    app = serve.status().applications.get(app_name)
    return sum(d.replica_states.get("RUNNING", 0) for d in app.deployments.values()) if app else 0


def drain(app_name: str = DEFAULT_APP, settle: float = 10.0) -> None:
    """Drain the application, then delete it.

    Raises the application's drain flag; every replica sees it within :data:`DRAIN_POLL` seconds, from then on
    refuses new requests (503 / ``UNAVAILABLE`` HYB-706) and answers those it holds, and acknowledges. Once
    every running replica has (or after ``settle`` seconds), ``serve.delete`` waits for the requests in flight
    (Serve's graceful shutdown) and removes the application.
    """
    flag = _drain_key(app_name)
    internal_kv._internal_kv_put(flag, b"1", overwrite=True, namespace=KV_NAMESPACE)
    deadline = time.monotonic() + settle
    try:
        while time.monotonic() < deadline:
            acks = internal_kv._internal_kv_list(flag + b"/ack/", namespace=KV_NAMESPACE)
            if len(acks) >= _running_replicas(app_name):
                break
            time.sleep(DRAIN_POLL / 2)
        else:
            logger.warning("drain of %s: not every replica acknowledged within %.0f s; deleting it", app_name, settle)
        serve.delete(app_name)
    finally:
        _clear_drain(app_name)


def _clear_drain(app_name: str) -> None:
    flag = _drain_key(app_name)
    for key in [flag, *internal_kv._internal_kv_list(flag + b"/ack/", namespace=KV_NAMESPACE)]:
        internal_kv._internal_kv_del(key, namespace=KV_NAMESPACE)


def shutdown(app_name: str | None = DEFAULT_APP) -> None:
    """Delete the application at once (its replicas drain), or with ``app_name=None`` stop Serve entirely."""
    if app_name is None:
        serve.shutdown()
    else:
        serve.delete(app_name)


def serve_until_stopped(models: Sequence[str | Path], *, ray_address: str | None = None,
                        auth_token: str | None = None, ray_init: Mapping[str, Any] | None = None,
                        on_ready: Callable[[], None] | None = None, app_name: str = DEFAULT_APP,
                        **deploy_args: Any) -> None:
    """``pyasc serve --ray``: deploy, serve until SIGTERM or SIGINT, then drain, delete and disconnect.

    Ray's ``init`` installs a SIGTERM handler that exits with status 15; the handlers here are installed
    after it, so a signal drains instead (:func:`drain`) and the function returns normally. Serve itself is
    shut down only when no other application is left on it, and Ray only when this process started it.
    """
    connect(ray_address, ray_init, auth_token)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        deploy(models, ray_address=ray_address, app_name=app_name, **deploy_args)
        if on_ready is not None:
            on_ready()
        while not stop.wait(0.5):
            pass
        logger.info("draining the Ray Serve application %r", app_name)
        drain(app_name)
        if not serve.status().applications:
            serve.shutdown()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray.shutdown()
