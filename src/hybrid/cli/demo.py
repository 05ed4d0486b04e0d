"""``pyasc demo``: the main job on a model whose outputs mean something, against every backend here.

A ``hybrid.zoo`` model (trained briefly in-process, dynamic shapes, no download) is compiled with
``target='auto'`` and nothing declared, decided on its realistic input before the first timed call
(``cm.tune``), then with ``precision='auto'`` under an accuracy budget, and on each backend alone; every row
shows the latency and the error against the numpy reference backend (the definition of each op). A light
model of the onnx package (``--model squeezenet``) also works: its weights are constant, so its outputs are
degenerate and the error is read against the output shipped with it.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from hybrid.cli import _options as opt
from hybrid.cli._console import console, print_wide, progress, progress_iter, report_errors, styled

__all__ = ["demo", "register"]

BUDGET = {"min_cosine": 0.995}


def _cosine(a: list[Any], b: list[Any]) -> float:
    from hybrid.runtime.auto.accuracy import cosine

    return cosine(a, b, [f"output {k}" for k in range(len(a))])


def _max_error(a: list[Any], b: list[Any]) -> float:
    return max((float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                for x, y in zip(a, b) if np.asarray(x).dtype.kind == "f" and np.asarray(x).size), default=0.0)


def _inputs(model: str) -> tuple[str, dict[str, Any], list[Any] | None, str]:
    """(model path, feeds, expected outputs or None for the reference backend's, title)."""
    from hybrid import zoo
    from hybrid.errors import ConfigError
    from hybrid.zoo.samples import LIGHT_MODELS, light_expected, light_input, light_model_path

    if model in zoo.NAMES:
        with progress(f"building the zoo's {model} (trained in-process, cached)"):
            m = zoo.build(model)
        feeds = m.feeds(seed=0)
        shapes = ", ".join(f"{k} {'x'.join(map(str, v.shape))}" for k, v in feeds.items())
        return str(m.path), feeds, None, f"zoo {model} ({shapes}): {m.description.split(':')[0]}"
    if model in LIGHT_MODELS:
        from hybrid.ir import Model

        path = light_model_path(model)
        name = Model.load(str(path)).signature.input_names[0]
        return str(path), {name: light_input()}, [light_expected(model)], f"light {model} (onnx package, batch 1)"
    raise ConfigError("HYB-102", f"--model: expected a zoo model ({', '.join(zoo.NAMES)}) or a light model of the "
                      f"onnx package ({', '.join(LIGHT_MODELS)}), got {model!r}", "e.g. pyasc demo --model crnn")


def demo(
    model: Annotated[str, typer.Option("--model", "-m", help="A hybrid.zoo model (detector, crnn, vad_lstm, unet, "
                                       "encoder, ...; trained in-process, needs torch) or a light model of the onnx "
                                       "package (squeezenet, resnet50, ...).")] = "crnn",
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per row.", min=1)] = 20,
    decide_within: Annotated[float, typer.Option("--decide-within", help="Seconds auto may take to decide (the "
                                                 "tuning policy's bound; default 30 in a program).",
                                                 min=1.0)] = 10.0,
    as_json: opt.Json = False,
) -> None:
    """Run the main job on a sample model: auto, fp32 and precision='auto', against every backend here.

    auto decides on the model's realistic input before the timed calls (precision='auto' within min cosine
    0.995); every row shows its latency and its error against the numpy reference backend.
    """
    import hybrid
    from hybrid.hal import resolve_target

    with report_errors(as_json):
        path, feeds, expected, title = _inputs(model)
        if expected is None:
            with progress("the numpy reference backend's answer"):
                expected = list(hybrid.compile(path, target="reference").run(feeds).values())
        hybrid.init({"autotune": {"decide_within_s": decide_within}})
        rows: list[dict[str, Any]] = []
        plan: list[tuple[str, str, dict[str, Any]]] = [("auto", "fp32", {}),
                                                       ("auto", "auto", {"accuracy": BUDGET})]
        plan += [(str(c), "fp32", {}) for c in resolve_target("auto") if c.backend != "reference"]
        for target, precision, kw in progress_iter(plan, "compiling, deciding and timing", total=len(plan)):
            label = target if precision == "fp32" else f"{target}, precision='auto' (min cosine 0.995)"
            try:
                t0 = time.perf_counter()
                cm = hybrid.compile(path, target=target, precision=precision, **kw)
                tuned = cm.tune(feeds)  # decides the input's bucket before the timed calls (warms up the others)
                ready_s = time.perf_counter() - t0
                got = list(cm.run(feeds).values())
                times = []
                for _ in range(runs):
                    t1 = time.perf_counter()
                    cm.run(feeds)
                    times.append(time.perf_counter() - t1)
            except hybrid.HybridError as e:
                rows.append({"target": label, "ran_on": None, "ok": False, "code": e.code, "message": e.message})
                continue
            serving = tuned[0].serving if tuned else f"{cm.backend}:{cm.device}"
            cos = _cosine(expected, got)
            rows.append({"target": label, "ran_on": serving, "ready_s": ready_s,
                         "median_ms": statistics.median(times) * 1e3, "max_error": _max_error(expected, got),
                         "cosine": cos, "ok": cos >= BUDGET["min_cosine"] if precision == "auto" else bool(
                             all(np.allclose(e, g, rtol=1e-3, atol=1e-4) for e, g in zip(expected, got)
                                 if np.asarray(e).dtype.kind == "f")),
                         "decided": [t.as_dict() for t in tuned]})
            cm.close()
    fastest = min((r["median_ms"] for r in rows if r.get("ran_on") and not r["target"].startswith("auto")),
                  default=None)
    for r in rows:
        if r.get("ran_on") and fastest:
            r["vs_fastest_backend"] = r["median_ms"] / fastest
    if as_json:
        typer.echo(json.dumps({"model": model, "title": title, "runs": runs, "rows": rows}, indent=2, default=str))
        return
    table = Table(title=title)
    for col in ("target", "ran on", "ready s", "median ms", "vs fastest backend", "max error vs reference",
                "min cosine", "ok"):
        table.add_column(col, overflow="fold")
    for r in rows:
        if r["ran_on"] is None:
            table.add_row(r["target"], "-", "-", "-", "-", "-", "-", styled(r["code"], "red"))
            continue
        table.add_row(r["target"], r["ran_on"], f"{r['ready_s']:.1f}", f"{r['median_ms']:.2f}",
                      f"{r.get('vs_fastest_backend', float('nan')):.2f}x", f"{r['max_error']:.3g}",
                      f"{r['cosine']:.6f}", "yes" if r["ok"] else styled("no", "red"))
    print_wide(table)
    console.print("ready s: compile plus, for auto, the decision on this input (cm.tune); auto with nothing "
                  f"declared decides each new input shape on real calls within --decide-within ({decide_within:g} s)",
                  soft_wrap=True)
    for r in rows:
        if r["ran_on"] is None:
            console.print(f"{r['target']}: [{r['code']}] {r['message']}", soft_wrap=True)
        for t in r.get("decided", []):
            cands = ", ".join(f"{c['label']} {c['outcome']}" + (f" {c['ratio']:.3g}x" if c["ratio"] else "")
                              for c in t["candidates"])
            console.print(f"{r['target']}: bucket {t['bucket']} decided after {t['decided_after_s']:.1f} s: {cands}",
                          soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command to the ``pyasc`` app."""
    app.command("demo")(demo)
