"""The option vocabulary shared by the pyasc commands (docs/cli.md has the table).

One meaning per flag across commands, matching trtexec and OpenVINO's benchmark_app where a user
would reach for the same flag: ``-t/--target`` where to run, ``-p/--precision`` the precision,
``-i/--input NAME=FILE.npy``, ``--shapes NAME:1x3x224x224``, ``-o/--output`` a file written,
``--duration`` / ``--iterations`` / ``--warmup``, ``--json`` machine-readable output on stdout.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from hybrid.errors import ConfigError

__all__ = ["Batch", "DeclaredShapes", "DeviceFallback", "Inputs", "Json", "MaxShapes", "MinShapes", "OptShapes",
           "Shapes", "Target", "apply_device_fallback", "backend_config"]

Target = Annotated[str, typer.Option("--target", "-t", help="Where to run: auto, a device (cpu, cuda:0), a backend "
                                     "(onnxruntime, openvino) or backend:device.")]
Inputs = Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE.npy (repeatable); the "
                                                  "errors are measured on it. Inputs not given are generated "
                                                  "at --shapes (a dynamic dim needs a size).")]
Shapes = Annotated[str | None, typer.Option("--shapes", help="Shapes to run, trtexec's spelling: "
                                            "NAME:1x3x480x640[,NAME2:1x128]; auto measures at them. A dynamic "
                                            "input needs one (or --input).")]
MinShapes = Annotated[str | None, typer.Option("--min-shapes", help="Smallest shapes of a range (with "
                                               "--max-shapes; not with --shapes).")]
OptShapes = Annotated[str | None, typer.Option("--opt-shapes", help="Typical shapes of a range: the ones run "
                                               "and timed.")]
MaxShapes = Annotated[str | None, typer.Option("--max-shapes", help="Largest shapes of a range.")]
DeclaredShapes = Annotated[str | None, typer.Option("--shapes", help="The shapes users run, trtexec's spelling: "
                                                    "NAME:1x3x480x640[,NAME2:1x128]; auto checks and times at them, "
                                                    "and the bundle written declares them.")]
Batch = Annotated[int | None, typer.Option("--batch", help="Size of dim 0 where it is dynamic and --shapes does "
                                           "not set it (other dynamic dims need --shapes).", min=1)]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (messages go to stderr).")]
DeviceFallback = Annotated[str, typer.Option("--device-fallback", help="error: a target whose device is absent "
                                             "fails (exit 1); warn: fall back to the CPU with a warning.")]


def apply_device_fallback(policy: str) -> None:
    """Set hybrid's device_fallback policy for this command.

    Raises:
        ConfigError: HYB-102 for a policy other than 'error' or 'warn'.
    """
    import hybrid

    if policy not in ("error", "warn"):
        raise ConfigError("HYB-102", f"--device-fallback: expected 'error' or 'warn', got {policy!r}",
                          "--device-fallback warn runs on the CPU when the device asked for is absent")
    hybrid.init({"device_fallback": policy})


def backend_config(options: list[str] | None, hint: str | None, nstreams: int | None,
                   nthreads: int | None) -> dict[str, dict[str, Any]]:
    """``--backend-option`` and benchmark_app's ``-hint/-nstreams/-nthreads`` as backend options.

    ``--hint`` is OpenVINO's performance_hint, ``--nstreams`` its num_streams, ``--nthreads`` its
    num_threads and ONNX Runtime's intra_op_num_threads; ``--backend-option BACKEND.KEY=VALUE`` any
    option, VALUE read as JSON, else kept as text.

    Raises:
        ConfigError: HYB-102 for an option that does not parse or a hint that is not one of OpenVINO's.
    """
    out: dict[str, dict[str, Any]] = {}
    if hint is not None:
        if hint.lower() not in ("latency", "throughput", "cumulative_throughput"):
            raise ConfigError("HYB-102", f"--hint: expected latency, throughput or cumulative_throughput, got "
                              f"{hint!r}", "--hint throughput with --concurrency N is benchmark_app's -hint "
                              "throughput -nireq N")
        out.setdefault("openvino", {})["performance_hint"] = hint.upper()
    if nstreams is not None:
        out.setdefault("openvino", {})["num_streams"] = nstreams
    if nthreads is not None:
        out.setdefault("openvino", {})["num_threads"] = nthreads
        out.setdefault("onnxruntime", {})["intra_op_num_threads"] = nthreads
    for item in options or ():
        key, sep, raw = item.partition("=")
        backend, dot, name = key.strip().partition(".")
        if not sep or not dot or not backend or not name:
            raise ConfigError("HYB-102", f"--backend-option: expected BACKEND.KEY=VALUE, got {item!r}",
                              "e.g. --backend-option openvino.performance_hint=THROUGHPUT")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out.setdefault(backend, {})[name] = value
    return out
