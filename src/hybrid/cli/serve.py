"""``pyasc serve``: the KServe v2 inference server over model files and repositories (or on Ray Serve)."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

import typer
from rich.measure import Measurement
from rich.table import Table

from hybrid.cli import _serving_options as so
from hybrid.cli._console import console, report_errors
from hybrid.errors import ConfigError, ModelError, ServingError

__all__ = ["register", "serve"]

_EXTRA_HINT = "install the server: pip install 'pyasc[serve]' (and 'pyasc[serve-ray]' for --ray)"


def _json_object(option: str, text: str | None, example: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ConfigError("HYB-102", f"{option}: expected a JSON object, got {text!r} ({e})",
                          f"e.g. {option} '{example}'") from e
    if not isinstance(doc, dict):
        raise ConfigError("HYB-102", f"{option}: expected a JSON object, got {type(doc).__name__}",
                          f"e.g. {option} '{example}'")
    return doc


def _check_port_free(host: str, port: int, option: str) -> None:
    """Fail before the models load (which takes time) when ``port`` cannot be bound: HYB-710 naming it."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            raise ServingError("HYB-710", f"{option} {port}: cannot listen on {host}:{port} ({e.strerror or e})",
                               f"stop what listens there, or choose another {option}"
                               + (" (0 turns gRPC off)" if "grpc" in option else "")) from e


def _address(host: str, port: int) -> str:
    """'host:port', with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _print_models(registry: Any, url: str) -> None:
    table = Table(title=f"serving at {url}")
    for col in ("model", "version", "runs on", "signature", "max_batch", "batches"):
        table.add_column(col)
    for m in registry:
        batches = "rows joined" if m.batch_symbol else "one by one" if m.settings.max_batch else "off"
        table.add_row(m.name, m.version, f"{m.compiled.backend}:{m.compiled.device}", str(m.signature),
                      str(m.settings.max_batch), batches)
    # off a terminal (a log file, a pipe) rich would wrap at 80 columns: print the table at its full width
    if console.is_terminal:
        console.print(table)
        return
    width = console.width  # print() clamps its width= to the console's: widen the console itself meanwhile
    console.width = max(width, Measurement.get(console, console.options.update(max_width=10_000), table).maximum)
    try:
        console.print(table, crop=False)
    finally:
        console.width = width


def serve(
    models: Annotated[list[str] | None, typer.Argument(help="Model files (.hybrid, .onnx; NAME=PATH to rename) or "
                                                            "repository folders (repo/<model>/<version>/model.*).",
                                                       show_default=False)] = None,
    model_repository: Annotated[list[str] | None, typer.Option(
        "--model-repository", help="A repository folder, as tritonserver takes it (repeatable): the same as naming "
                                   "it as an argument.")] = None,
    host: Annotated[str, typer.Option(help="Address to bind. Loopback by default; anything else should "
                                           "come with --auth-token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "--http-port", help="Port to bind (--http-port: tritonserver's "
                                                                    "spelling).")] = 8000,
    grpc_port: Annotated[int, typer.Option(help="Port of the KServe v2 / Triton gRPC service (tritonclient.grpc), "
                                                "on the same address; 0 turns gRPC off.")] = 8001,
    metrics_port: Annotated[int, typer.Option(help="A port of its own where GET /metrics is answered too, alone, "
                                                   "on the same address (Triton's metrics port: 8002 there); 0: "
                                                   "/metrics on --port only.")] = 0,
    model_control: Annotated[bool, typer.Option("--model-control", help="Allow the repository load/unload "
                                                "endpoints (HTTP and gRPC) to load and unload the models of the "
                                                "served repositories.")] = False,
    model_control_mode: Annotated[str, typer.Option(help="tritonserver's spelling: explicit is --model-control "
                                                         "with tritonserver's start (no model loads but those of "
                                                         "--load-model); poll serves what the repositories hold, "
                                                         "looked at every --repository-poll-secs (models added, "
                                                         "changed or removed are loaded, reloaded or unloaded; "
                                                         "the load/unload endpoints are off); none the "
                                                         "default.")] = "none",
    repository_poll_secs: Annotated[float, typer.Option(help="With --model-control-mode poll: seconds between two "
                                                             "looks at the repositories (tritonserver's "
                                                             "default).")] = 15.0,
    load_model: Annotated[list[str] | None, typer.Option(
        "--load-model", help="With --model-control: the models loaded at start (repeatable; '*': all, the default "
                             "of --model-control); the others can be loaded later, as in tritonserver's explicit "
                             "mode.")] = None,
    target: Annotated[str | None, typer.Option(help="Target for every model (default: each folder's "
                                                    "config.json, else 'auto').")] = None,
    backend_config: Annotated[str | None, typer.Option(help="Backend options as JSON, e.g. '{\"onnxruntime\": "
                                                            "{\"intra_op_num_threads\": 2}}' (the server "
                                                            "turns ONNX Runtime's thread spinning off unless "
                                                            "told otherwise).")] = None,
    precision: Annotated[str | None, typer.Option(help="Compile precision for every ONNX model: fp32, fp16, bf16, "
                                                      "or auto (the fastest within --min-cosine); default: each "
                                                      "folder's config.json, else fp32.")] = None,
    min_cosine: Annotated[float | None, typer.Option(help="Accuracy budget of reduced precisions: least cosine "
                                                          "similarity to the fp32 outputs, e.g. 0.995.")] = None,
    warmup: Annotated[int, typer.Option(help="Random warm-up calls per model at its declared shapes before it is "
                                             "ready (target auto: its shape buckets are decided first); a "
                                             "config.pbtxt's model_warmup takes precedence.")] = 0,
    idle_tuning: Annotated[bool, typer.Option(help="Target auto: once the server has had no request for a "
                                                   "second, decide each model's batch-size buckets, so the "
                                                   "traffic meets them decided: on random inputs where the "
                                                   "only dynamic dim is the batch and the precision fp32, "
                                                   "else at the shapes of the requests seen, on their rows.")]
    = True,
    freeze_tuning: Annotated[bool, typer.Option(help="Target auto: stop tuning once the models are loaded and warmed "
                                                     "up (--warmup decides their shapes first): what serves each "
                                                     "shape then serves it from then on, and a shape first called "
                                                     "later is served by its cached decision or the start, "
                                                     "unchecked (cm.freeze()).")] = False,
    max_batch: so.MaxBatch = None,
    batch_timeout: so.BatchTimeout = None,
    max_queue: so.MaxQueue = None,
    request_timeout: so.RequestTimeout = None,
    concurrency: so.Concurrency = None,
    max_body: Annotated[str, typer.Option(help="Largest request body after decompression.")] = "64MB",
    max_json_depth: Annotated[int, typer.Option(help="Deepest JSON nesting accepted.")] = 64,
    auth_token: Annotated[str | None, typer.Option(envvar="PYASC_AUTH_TOKEN", show_envvar=True,
                                                   help="Require 'Authorization: Bearer TOKEN' on every "
                                                        "endpoint but liveness.")] = None,
    drain_timeout: Annotated[float, typer.Option(help="Seconds to finish in-flight requests on "
                                                      "SIGTERM/SIGINT.")] = 30.0,
    header_timeout: Annotated[float, typer.Option(help="Seconds a connection has to send a complete request "
                                                       "head (line and headers); slower senders are "
                                                       "disconnected.")] = 10.0,
    keep_alive_timeout: Annotated[int, typer.Option(help="Seconds an idle kept-alive connection stays "
                                                         "open.")] = 5,
    max_connections: Annotated[int, typer.Option(help="Open connections past which the oldest idle one "
                                                      "is closed.")] = 1024,
    body_timeout: Annotated[float, typer.Option(help="Seconds a request has to send its whole body once its "
                                                     "head is complete; 0 turns the limit off.")] = 60.0,
    log_level: Annotated[str, typer.Option(help="Server log level.")] = "info",
    trace_config: Annotated[list[str] | None, typer.Option(
        "--trace-config", help="Triton's trace settings, in its spelling (repeatable): triton,file=PATH, "
                               "triton,log-frequency=N, level=TIMESTAMPS|TENSORS|OFF, rate=N (one request of every "
                               "N), count=N (-1: no limit); mode=opentelemetry exports spans over OTLP/HTTP instead: "
                               "opentelemetry,url=HOST:PORT/v1/traces, opentelemetry,resource=KEY=VALUE, "
                               "opentelemetry,bsp_schedule_delay=MS. Clients read and change them at "
                               "/v2/trace/setting.")]
    = None,
    cache_config: Annotated[list[str] | None, typer.Option(
        "--cache-config", help="Triton's response cache: local,size=BYTES. The models whose config.pbtxt has "
                               "response_cache { enable: true } answer inputs they have seen from it.")] = None,
    metrics_config: Annotated[list[str] | None, typer.Option(
        "--metrics-config", help="tritonserver's latency metrics (repeatable): summary_latencies=true (quantiles "
                                 "of the last minute, nv_inference_*_summary_us), counter_latencies=false (no "
                                 "nv_inference_*_duration_us counters), summary_quantiles=0.5:0.05,0.99:0.001.")]
    = None,
    use_ray: Annotated[bool, typer.Option("--ray", help="Deploy on Ray Serve instead of this process.")] = False,
    replicas: Annotated[int, typer.Option(help="--ray: number of replicas.")] = 1,
    autoscaling: Annotated[str | None, typer.Option(help="--ray: Serve autoscaling_config as JSON "
                                                         "(replaces --replicas).")] = None,
    replica_cpus: Annotated[float, typer.Option(help="--ray: CPUs reserved per replica.")] = 1.0,
    ray_address: Annotated[str | None, typer.Option(help="--ray: cluster to join ('auto', HOST:PORT; default: "
                                                         "a local instance).")] = None,
    ray_auth_token: Annotated[str | None, typer.Option(envvar="RAY_AUTH_TOKEN", show_envvar=True,
                                                       help="--ray: the cluster's token when it runs Ray's token "
                                                            "authentication (RAY_AUTH_MODE=token); Ray also "
                                                            "reads RAY_AUTH_TOKEN_PATH and ~/.ray/auth_token.")]
    = None,
    ray_proxy_location: Annotated[str | None, typer.Option(help="--ray: where Serve runs its proxies: "
                                                                "EveryNode (Ray's default), HeadOnly or "
                                                                "Disabled.")] = None,
    ray_warmup: Annotated[int, typer.Option(help="--ray: probe runs per model before a replica counts as "
                                                 "started (0: none).")] = 1,
) -> None:
    """Serve models over the KServe v2 / Open Inference Protocol REST and gRPC APIs.

    tritonclient.http and tritonclient.grpc work.
    """
    with report_errors():
        from hybrid.config import parse_size

        try:
            from hybrid.serve.app import ServeOptions, create_app
            from hybrid.serve.core.protocol import Limits
            from hybrid.serve.core.repository import (
                build_registry,
                compile_request,
                configure_backends,
                startup_sources,
            )
            from hybrid.serve.observe.latency_summary import MetricsConfig
            from hybrid.serve.observe.trace import TraceConfig
            from hybrid.serve.server import ConnectionLimits, run
            from hybrid.serve.triton.response_cache import cache_size
        except ImportError as e:
            raise ModelError("HYB-207", f"pyasc serve needs {e.name or e}, which is not installed",
                             _EXTRA_HINT) from e
        models = [*(models or []), *(model_repository or [])]
        if not models:
            raise ConfigError("HYB-102", "pyasc serve needs models to serve: none were named",
                              "name model files or repository folders, or --model-repository FOLDER")
        if model_control_mode not in ("none", "explicit", "poll"):
            raise ConfigError("HYB-102", f"--model-control-mode {model_control_mode!r}: expected none, explicit or "
                              "poll", "e.g. --model-control-mode explicit")
        polling = model_control_mode == "poll"
        if polling and (model_control or load_model or use_ray):
            raise ConfigError("HYB-102", "--model-control-mode poll serves what the repositories hold: it cannot be "
                              "combined with --model-control, --load-model or --ray",
                              "drop the others, or use --model-control-mode explicit")
        if not repository_poll_secs > 0:
            raise ConfigError("HYB-102", f"--repository-poll-secs must be > 0, got {repository_poll_secs}")
        model_control = model_control or model_control_mode == "explicit"
        if load_model and not model_control:
            raise ConfigError("HYB-102", "--load-model needs --model-control (tritonserver: --model-control-mode "
                              "explicit): without it every model found is served",
                              "add --model-control-mode explicit, or drop --load-model")
        if load_model and use_ray:
            raise ConfigError("HYB-102", "--load-model cannot be used with --ray: the replicas serve every model found")
        if max_json_depth < 1:
            raise ConfigError("HYB-102", f"--max-json-depth must be >= 1, got {max_json_depth}")
        limits = Limits(max_body=parse_size(max_body, "--max-body"), max_json_depth=max_json_depth)
        connections = ConnectionLimits(header_timeout=header_timeout, keep_alive_timeout=keep_alive_timeout,
                                       max_connections=max_connections, body_timeout=body_timeout or None)
        if not 0 <= grpc_port <= 65535:
            raise ConfigError("HYB-102", f"--grpc-port must be a port number (0 turns gRPC off), got {grpc_port}")
        grpc_address = _address(host, grpc_port)
        if not 0 <= metrics_port <= 65535:
            raise ConfigError("HYB-102", f"--metrics-port must be a port number (0: /metrics on --port only), got "
                              f"{metrics_port}")
        if metrics_port and metrics_port in (port, grpc_port):
            raise ConfigError("HYB-102", f"--metrics-port {metrics_port} is the port of another service",
                              "choose a port of its own (Triton's is 8002)")
        if metrics_port and use_ray:
            raise ConfigError("HYB-102", "--metrics-port cannot be used with --ray: each replica keeps its own "
                              "metrics, which Ray Serve exposes", "scrape Ray's metrics, or serve without --ray")
        metrics_address = _address(host, metrics_port)
        if trace_config and use_ray:
            raise ConfigError("HYB-102", "--trace-config cannot be used with --ray: a request reaches one replica "
                              "of several, each with its own trace settings (and file)",
                              "trace a server started without --ray")
        options = ServeOptions(auth_token=auth_token or None, limits=limits, drain_timeout=drain_timeout,
                               grpc_address=grpc_address if grpc_port and not use_ray else None,
                               model_control=model_control, trace=TraceConfig.from_options(trace_config or []),
                               response_cache=cache_size(cache_config or []),
                               metrics=MetricsConfig.from_options(metrics_config or []),
                               metrics_address=metrics_address if metrics_port else None,
                               repository_poll_s=repository_poll_secs if polling else None)
        overrides = so.serving_settings(max_batch, batch_timeout, max_queue, request_timeout, concurrency,
                                        zero_means_off=True)
        backends = _json_object("--backend-config", backend_config, '{"onnxruntime": {"intra_op_num_threads": 2}}')
        scaling = _json_object("--autoscaling", autoscaling, '{"min_replicas": 1, "max_replicas": 4}')
        logging.getLogger("hybrid").setLevel(log_level.upper())
        if use_ray:
            _serve_on_ray(models, target, overrides, options, backends, replicas, scaling, replica_cpus,
                          host, port, ray_address, grpc_port=grpc_port, auth_token=ray_auth_token,
                          proxy_location=ray_proxy_location, warmup=ray_warmup)
            return
        _check_port_free(host, port, "--port")  # both ports, before anything loads or claims to serve
        if options.grpc_address:
            _check_port_free(host, grpc_port, "--grpc-port")
        if options.metrics_address:
            _check_port_free(host, metrics_port, "--metrics-port")
        if warmup < 0:
            raise ConfigError("HYB-102", f"--warmup must be >= 0, got {warmup}")
        from hybrid.runtime.traffic.collector import policy_from_env

        policy_from_env()  # a bad HYBRID_GC_MAX_PAUSE_MS is refused before anything loads (run() applies it)
        configure_backends(backends)
        sources = None
        if load_model:
            sources = startup_sources(models, load_model)
        elif model_control_mode == "explicit":  # tritonserver's explicit mode: no model loads at start
            sources = startup_sources(models, ())
        registry = build_registry(models, target, overrides, sources=sources, warmup=warmup,
                                  idle_tuning=idle_tuning and not freeze_tuning, freeze_tuning=freeze_tuning,
                                  compile_options=compile_request(precision, min_cosine, "--min-cosine"))
        _print_models(registry, f"http://{host}:{port}" + (f" and grpc://{grpc_address}" if grpc_port else "")
                      + (f" (metrics: http://{metrics_address}/metrics)" if options.metrics_address else ""))
        run(create_app(registry, options), host=host, port=port, drain_timeout=drain_timeout, log_level=log_level,
            connections=connections)


def _serve_on_ray(models: list[str], target: str | None, overrides: dict[str, Any], options: Any,
                  backends: dict[str, Any] | None, replicas: int, autoscaling: dict[str, Any] | None,
                  replica_cpus: float, host: str, port: int, ray_address: str | None, *, grpc_port: int,
                  auth_token: str | None, proxy_location: str | None, warmup: int) -> None:
    try:
        from hybrid.serve.ray import deployment as ray_serve
    except ImportError as e:
        raise ModelError("HYB-207", f"pyasc serve --ray needs {e.name or e}, which is not installed",
                         "pip install 'pyasc[serve-ray]'") from e
    if proxy_location not in (None, "EveryNode", "HeadOnly", "Disabled"):
        raise ConfigError("HYB-102", f"--ray-proxy-location: expected EveryNode, HeadOnly or Disabled, got "
                          f"{proxy_location!r}", "e.g. --ray-proxy-location HeadOnly")
    grpc = f" and grpc port {grpc_port} (every interface)" if grpc_port else ""
    scale = "autoscaling" if autoscaling else f"{replicas} replica(s)"

    def ready() -> None:
        console.print(f"serving on Ray Serve at http://{host}:{port}{grpc} ({scale}); Ctrl+C or SIGTERM drains")

    ray_serve.serve_until_stopped(models, ray_address=ray_address, auth_token=auth_token, on_ready=ready,
                                  target=target, overrides=overrides, options=options, backend_config=backends,
                                  replicas=replicas, autoscaling=autoscaling, replica_cpus=replica_cpus,
                                  host=host, port=port, grpc_port=grpc_port, proxy_location=proxy_location,
                                  warmup=warmup)


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command to the ``pyasc`` app."""
    app.command("serve")(serve)
