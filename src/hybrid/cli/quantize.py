"""``pyasc quantize MODEL --calibration data.npz --method static --min-cosine 0.995 -o model.int8.onnx``.

A thin command over :func:`hybrid.quantize`: reads the calibration samples, quantizes, writes the model
and prints the accuracy report (cosine, SNR, max error per output against fp32 on held-out samples)
as a table, or as JSON with ``--json``.

Calibration data: an ``.npz`` whose arrays are named after the model's inputs, N samples stacked along
a new first axis (or along the batch axis, one sample per row), or a folder of ``.npz`` files (one
sample each, same names) or of ``.npy`` files (single-input models).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from hybrid.cli import _options as opt
from hybrid.cli._console import console, err_console, print_wide, progress, report_errors, settings, styled
from hybrid.cli._inputs import dims
from hybrid.errors import QuantizationError

__all__ = ["read_calibration", "register"]

_METHODS = ("static", "dynamic")
_PRECISIONS = ("int8", "uint8", "fp16", "bf16")


def _npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError) as e:
        raise QuantizationError("HYB-602", f"--calibration: {str(path)!r} is not a readable .npz ({e})",
                                "save samples with numpy.savez(path, input_name=array)") from e


def read_calibration(path: Path, signature: Any) -> list[dict[str, np.ndarray]]:
    """Calibration samples from an ``.npz`` or a folder (see the module docstring).

    Raises:
        QuantizationError: HYB-602 when the path holds no samples or cannot be read, HYB-603 when an
            array is named after no input.
    """
    names = [s.name for s in signature.inputs]
    ranks = {s.name: None if s.shape is None else len(s.shape) for s in signature.inputs}
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy"))
        if not files:
            raise QuantizationError("HYB-602", f"--calibration: folder {str(path)!r} has no .npz or .npy files",
                                    "one sample per file: numpy.savez(f'{i}.npz', input_name=array)")
        samples = []
        for f in files:
            if f.suffix == ".npz":
                samples.append(_npz(f))
            elif len(names) == 1:
                samples.append({names[0]: np.load(f, allow_pickle=False)})
            else:
                raise QuantizationError("HYB-602", f"--calibration: {f.name} is a .npy, but the model has "
                                        f"{len(names)} inputs ({', '.join(names)})", "use .npz files named by input")
        return samples
    if not path.is_file():
        raise QuantizationError("HYB-602", f"--calibration: {str(path)!r} does not exist",
                                "give an .npz file or a folder of .npz files")
    arrays = _npz(path)
    unknown = [k for k in arrays if k not in names]
    if unknown:
        raise QuantizationError("HYB-603", f"--calibration: arrays {', '.join(map(repr, unknown))} are named after "
                                "no input; the "
                                f"model's inputs: {', '.join(names)}", "name each array after the input it feeds")
    if not arrays:
        raise QuantizationError("HYB-602", f"--calibration: {str(path)!r} holds no arrays",
                                "save samples with numpy.savez(path, input_name=array)")
    counts = set()
    split: dict[str, list[np.ndarray]] = {}
    for name, arr in arrays.items():
        stacked = ranks[name] is not None and arr.ndim == ranks[name] + 1
        split[name] = list(arr) if stacked else [arr[i:i + 1] for i in range(arr.shape[0])]
        counts.add(len(split[name]))
    if len(counts) != 1:
        raise QuantizationError("HYB-603", "--calibration: the arrays hold different numbers of samples ("
                                + ", ".join(f"{k}: {len(v)}" for k, v in split.items()) + ")",
                                "stack the same N samples per input")
    return [{k: v[i] for k, v in split.items()} for i in range(counts.pop())]


def _written(report: Any, precision: str) -> tuple[str, str]:
    """(format, precision) of the model written, from the report (the float model when that was returned)."""
    if report is None:
        return "ONNX", precision
    if report.result == "float":
        return "ONNX, float (not quantized)", "fp32"
    if report.mode in ("fp16", "bf16"):
        return "ONNX, float conversion", report.mode
    if report.mode == "dynamic":
        return "ONNX, dynamic quantization (DynamicQuantizeLinear)", precision
    return f"ONNX, {report.scheme.partition(',')[0]} static quantization", precision


def _speed(source: Any, quantized: Any, target: str, feed: dict[str, np.ndarray]) -> dict[str, Any]:
    """fp32 and the written model timed interleaved on ``target`` (medians over 3 blocks), and compared there."""
    from hybrid.cli._bench_view import measure_accuracy
    from hybrid.cli.bench import Timing, _interleave
    from hybrid.runtime.compiler import compile_model

    fp32 = compile_model(source, target=target)
    q = compile_model(quantized, target=target)
    times = _interleave({"fp32": lambda: fp32.run(feed), "quantized": lambda: q.run(feed)},
                        Timing(blocks=3, per_block=10, warmup=3, pause=0.02))
    fp32_ms = float(np.median(times["fp32"][0])) * 1e3
    q_ms = float(np.median(times["quantized"][0])) * 1e3
    acc = measure_accuracy(fp32.run(feed), q.run(feed), 0.0, 0.0, 0.0)  # the figures, on the target itself
    return {"target": f"{q.backend}:{q.device}", "fp32_ms": fp32_ms, "quantized_ms": q_ms,
            "speedup": fp32_ms / q_ms if q_ms else None, "cosine": acc.cosine, "max_abs_err": acc.max_abs_err}


def quantize_command(
    model: Annotated[Path, typer.Argument(help="The float model: an .onnx file (or a folder holding one).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Quantized model to write (.onnx).")],
    calibration: Annotated[Path | None, typer.Option("--calibration", help="Samples: an .npz (arrays named by "
                                                     "input, samples stacked) or a folder of .npz files. Needed "
                                                     "for --method static.")] = None,
    method: Annotated[str, typer.Option("--method", help="static (calibrated activation ranges) or dynamic "
                                        "(activations quantized at run time).")] = "static",
    precision: Annotated[str, typer.Option("--precision", "-p", help="int8 or uint8 (static/dynamic), or fp16 / "
                                           "bf16 (a float conversion; --method is ignored).")] = "int8",
    min_cosine: Annotated[float | None, typer.Option("--min-cosine", help="Accuracy budget, a cosine in (0, 1]: "
                                                     "keep the most sensitive layers in float until every "
                                                     "output's cosine against fp32 reaches it; exit 1 (HYB-605) "
                                                     "when only the float model does.")] = None,
    calibration_method: Annotated[str, typer.Option("--calibration-method", help="auto (chosen by measurement "
                                                    "under --min-cosine), minmax, entropy or percentile.")] = "auto",
    samples: Annotated[int, typer.Option("--samples", help="Samples to calibrate on (the next 16 are held "
                                         "back for the report).", min=1)] = 64,
    per_channel: Annotated[bool, typer.Option("--per-channel/--per-tensor", help="Weight scales per output "
                                              "channel (default) or per tensor.")] = True,
    target: Annotated[str, typer.Option("--target", "-t", help="Where the speed against fp32 is measured "
                                        "(a warning when the result is slower).")] = "onnxruntime:cpu",
    speed: Annotated[bool, typer.Option("--speed/--no-speed", help="Time the written model against fp32 on "
                                        "--target.")] = True,
    shapes: opt.Shapes = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Quantize MODEL to int8 (static or dynamic) or fp16/bf16 and report what was written.

    Writes the model to --output and prints its format and precision, its speed against fp32 on --target
    (a warning when slower), and cosine, SNR and max error per output against fp32 on held-out samples.
    Exits 1 when --min-cosine cannot be met by a quantized model (HYB-605; nothing is written) or an
    argument is invalid. Without --calibration, a dynamic input needs --shapes (HYB-417).
    """
    import hybrid
    from hybrid.cli._inputs import declared_shapes, load_model, model_path, resolve_inputs

    with report_errors(as_json):
        if method not in _METHODS:
            raise QuantizationError("HYB-601", f"--method: expected static or dynamic, got {method!r}",
                                    "static needs --calibration; dynamic does not")
        if precision not in _PRECISIONS:
            raise QuantizationError("HYB-601", f"--precision: expected one of {', '.join(_PRECISIONS)}, got "
                                    f"{precision!r}", "int8 is the usual choice")
        if min_cosine is not None and not 0 < min_cosine <= 1:
            raise QuantizationError("HYB-601", f"--min-cosine: expected a cosine in (0, 1], got {min_cosine:g}",
                                    "e.g. --min-cosine 0.995 (1 would ask for an exact copy)")
        if output.suffix != ".onnx":
            raise QuantizationError("HYB-601", f"--output {str(output)!r}: quantize writes an .onnx model, got "
                                    f"{output.suffix or 'no suffix'}", f"e.g. -o {output.stem}.int8.onnx")
        float_mode = precision in ("fp16", "bf16")
        if method == "static" and not float_mode and calibration is None:
            raise QuantizationError("HYB-602", "--method static needs --calibration (an .npz or a folder of "
                                    "samples)", "or use --method dynamic, which needs no samples")
        if calibration is not None and shapes:
            raise QuantizationError("HYB-601", "--shapes and --calibration both give the shapes; the "
                                    "calibration samples' shapes are used", "drop --shapes")
        model = model_path(model)
        source = load_model(model)
        cfg: dict[str, Any] = {"quant_mode": precision if float_mode else method,
                               "progress": not settings.quiet and err_console.is_terminal}
        if not float_mode:
            # int8: the activation type (uint8 or int8, symmetric or not) is measured like the calibration
            cfg.update(activation_dtype="auto" if precision == "int8" else precision, weight_dtype=precision,
                       per_channel=per_channel)
            if method == "static":
                cfg["calibration_method"] = calibration_method
        if calibration is not None:
            data = read_calibration(calibration, source.signature)
            cfg["calibration_dataset"] = data
            cfg["num_calibration_samples"] = samples
            feed = {k: np.asarray(v) for k, v in data[0].items()}
        else:
            # the evaluation (and timing) samples, at the sizes given: never made-up sizes
            declared = declared_shapes(shapes)
            feed = resolve_inputs(source, None, declared, command=f"quantize {model} -o {output}",
                                  alternative="--calibration data.npz").feeds
            cfg["calibration_dataset"] = [resolve_inputs(source, None, declared or {k: v.shape for k, v in
                                                                                    feed.items()}, seed=i).feeds
                                          for i in range(4)]
        if min_cosine is not None:
            cfg["accuracy"] = {"min_cosine": min_cosine, "on_unmet": "raise"}
        with progress(f"quantizing {model.name} ({cfg['quant_mode']})"):
            quantized = hybrid.quantize(source, cfg)
        quantized.save(output)
        report = quantized.metadata.get("quantization_report")
        timing = None
        if speed and (report is None or report.result != "float"):
            with progress(f"timing against fp32 on {target}"):
                timing = _speed(source, quantized, target, feed)
    fmt, prec = _written(report, precision)
    doc = {"model": str(model), "output": str(output), "format": fmt, "precision": prec,
           "inputs": {k: list(v.shape) for k, v in feed.items()}, "speed": timing,
           **(report.to_dict() if report is not None else {})}
    slower = timing is not None and timing["speedup"] is not None and timing["speedup"] < 1.0
    if slower:
        err_console.print(styled("warning", "bold yellow"), f": {output.name} runs slower than fp32 on "
                          f"{timing['target']} ({timing['quantized_ms']:.3g} ms vs {timing['fp32_ms']:.3g} ms, "
                          f"{timing['speedup']:.2f}x); keep the fp32 model there, or try --method static with "
                          "--min-cosine (which keeps fp32 when int8 is not faster)", sep="", soft_wrap=True)
    if as_json:
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    size = "" if report is None else f"; {report.fp32_bytes / 1e6:.2f} MB -> {report.quantized_bytes / 1e6:.2f} MB"
    console.print(f"wrote {output}: {fmt}, {prec}{size}", soft_wrap=True)
    if report is not None and report.result != "float":
        console.print(f"  scheme: {report.scheme}", soft_wrap=True)
    if report is not None and report.note:
        console.print(f"  note: {report.note}", soft_wrap=True)
    console.print(f"  inputs: {', '.join(f'{k}: {v.dtype}[{dims(v.shape)}]' for k, v in feed.items())}",
                  soft_wrap=True)
    if timing is not None:
        console.print(f"  on {timing['target']}: {timing['quantized_ms']:.3g} ms vs fp32 {timing['fp32_ms']:.3g} ms "
                      f"({timing['speedup']:.2f}x fp32); against fp32 there: cosine {timing['cosine']:.5f}, max abs "
                      f"error {timing['max_abs_err']:.3g}", soft_wrap=True)
    elif report is not None and report.result == "float":
        console.print("  speed: the float model, as fast as fp32", soft_wrap=True)
    if report is None:
        return
    table = Table(title=f"accuracy against fp32 on {report.eval_samples} {report.eval_source} samples")
    for col in ("output", "cosine min", "cosine mean", "SNR dB", "max abs error", "top-1 agreement"):
        table.add_column(col, justify="right" if col != "output" else "left")
    for o in report.outputs:
        table.add_row(o.name, f"{o.cosine_min:.5f}", f"{o.cosine_mean:.5f}", f"{o.snr_db:.1f}",
                      f"{o.max_abs_error:.3g}", "-" if o.top1_agreement is None else f"{o.top1_agreement:.1%}")
    print_wide(table)
    if report.budget is not None:
        console.print(f"budget min_cosine={min_cosine}: {'met' if report.budget_met else 'NOT met'}")
    if report.kept_float:
        console.print(f"kept in float ({len(report.kept_float)}): {', '.join(report.kept_float)}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``quantize`` to the pyasc app."""
    app.command("quantize")(quantize_command)
