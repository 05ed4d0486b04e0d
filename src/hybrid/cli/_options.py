"""The option vocabulary shared by the pyasc commands (docs/cli.md has the table).

One meaning per flag across commands, matching trtexec and OpenVINO's benchmark_app where a user
would reach for the same flag: ``-t/--target`` where to run, ``-p/--precision`` the precision,
``-i/--input NAME=FILE.npy``, ``--shapes NAME:1x3x224x224``, ``-o/--output`` a file written,
``--duration`` / ``--iterations`` / ``--warmup``, ``--json`` machine-readable output on stdout.
"""

from __future__ import annotations

from typing import Annotated

import typer

from hybrid.errors import ConfigError

__all__ = ["DeviceFallback", "Inputs", "Json", "Shapes", "Target", "apply_device_fallback"]

Target = Annotated[str, typer.Option("--target", "-t", help="Where to run: auto, a device (cpu, cuda:0), a backend "
                                     "(onnxruntime, openvino) or backend:device.")]
Inputs = Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE.npy (repeatable); inputs not "
                                                  "given are generated.")]
Shapes = Annotated[str | None, typer.Option("--shapes", help="Shapes of generated inputs, trtexec's spelling: "
                                            "NAME:1x3x480x640[,NAME2:1x128].")]
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
