"""The dynamic-batching options shared by ``pyasc serve`` and ``pyasc bundle create``.

``pyasc serve`` applies them to every model it serves (over each bundle's own ``serving`` settings);
``pyasc bundle create`` writes them into the bundle's manifest, so the bundle carries its batching to any
server (docs/serving.md).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

__all__ = ["serving_settings"]

_P = "Dynamic batching (pyasc serve)"

MaxBatch = Annotated[int | None, typer.Option(help="Requests per batch; 0 turns batching off (default 8).",
                                              rich_help_panel=_P)]
BatchTimeout = Annotated[float | None, typer.Option(help="Seconds a request waits for its batch to fill "
                                                         "(default 0.005).", rich_help_panel=_P)]
MaxQueue = Annotated[int | None, typer.Option(help="Queued requests per model before 503 (default 256); "
                                                   "0 on pyasc serve: unbounded.", rich_help_panel=_P)]
RequestTimeout = Annotated[float | None, typer.Option(help="Seconds a request may take in the server "
                                                           "(default 60); 0 on pyasc serve: no limit.",
                                                      rich_help_panel=_P)]
Concurrency = Annotated[int | None, typer.Option(help="Batches run at once per model (default: the replicas of "
                                                      "the layout serving it).",
                                                 rich_help_panel=_P)]


def serving_settings(max_batch: int | None, batch_timeout: float | None, max_queue: int | None,
                     request_timeout: float | None, concurrency: int | None, *,
                     zero_means_off: bool) -> dict[str, Any]:
    """The settings given on the command line, by manifest key.

    With ``zero_means_off`` (the server), 0 turns the queue bound and the request timeout off; a bundle's
    manifest has no 'off' for them, so there 0 is passed on and refused by the manifest's validation
    (HYB-502 naming the key).
    """
    given = {"max_batch": max_batch, "batch_timeout": batch_timeout, "max_queue": max_queue,
             "request_timeout": request_timeout, "concurrency": concurrency}
    given = {k: v for k, v in given.items() if v is not None}
    if zero_means_off:
        for key in ("max_queue", "request_timeout"):
            if key in given:
                given[key] = given[key] or None
    return given
