"""The OpenVINO backend: ``Core().available_devices`` mapped to hybrid devices.

'CPU' -> 'cpu'; 'GPU' / 'GPU.N' (Intel GPUs) -> 'gpu:N'; 'NPU' -> 'npu:0'. Only the CPU is verified on
this project's machines. Inference precision defaults to f32 so that results match the other
backends; bf16/f16 are an explicit choice (``inference_precision``) or found by precision='auto'.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from hybrid.errors import BackendError
from hybrid.hal.backend import Backend, Executable, Layout, NodeSpan, Option, ProbedDevice

__all__ = ["OpenVINOBackend", "OpenVINOExecutable", "compile_reason", "ov_config"]

_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
_PRECISIONS = ("f32", "bf16", "f16")
_PARTITIONERS = ("STATIC", "AUTO")


def _native_device(device: str) -> str:
    kind, _, idx = device.partition(":")
    if kind == "cpu":
        return "CPU"
    if kind == "gpu":
        return f"GPU.{idx or 0}"
    if kind == "npu":
        return "NPU"
    raise BackendError("HYB-303", f"openvino cannot use device {device!r}", "use cpu, gpu:N or npu")


def ov_config(options: Mapping[str, Any], threads: int | None = None, native: str = "CPU") -> dict[str, str]:
    """OpenVINO compile properties from validated hybrid options, for the OpenVINO device ``native``.

    The CPU plugin's own properties (pinning, the TBB partitioner) go to 'CPU' only: other plugins reject them.
    """
    cfg = {
        "PERFORMANCE_HINT": options.get("performance_hint", "LATENCY"),
        "INFERENCE_PRECISION_HINT": options.get("inference_precision", "f32"),
    }
    n = options.get("num_threads", threads)
    if n:
        cfg["INFERENCE_NUM_THREADS"] = str(n)
    if options.get("num_streams"):
        cfg["NUM_STREAMS"] = str(options["num_streams"])
    if options.get("num_requests"):
        cfg["PERFORMANCE_HINT_NUM_REQUESTS"] = str(options["num_requests"])
    if native == "CPU" and options.get("cpu_pinning") is not None:
        cfg["ENABLE_CPU_PINNING"] = "YES" if options["cpu_pinning"] else "NO"
    if native == "CPU" and options.get("tbb_partitioner"):
        cfg["TBB_PARTITIONER"] = options["tbb_partitioner"]
    if options.get("cache_dir"):
        cfg["CACHE_DIR"] = options["cache_dir"]
    if options.get("profile"):
        cfg["PERF_COUNT"] = "YES"
    return cfg


_SOURCE_LINE = re.compile(r"^(Exception from|Check '.*' failed at) \S+:\d+:?$")
_BOILERPLATE = ("To facilitate the conversion", "Summary:")
_OV_PRECISIONS = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "f64": "fp64"}


def compile_reason(error: BaseException, limit: int = 600) -> str:
    """OpenVINO's error without its source-location lines, so the informative ones are kept.

    OpenVINO prefixes its reasons with lines such as ``Exception from src/inference/src/cpp/core.cpp:105:``;
    the reason a user can act on ("No conversion rule found for operations: com.foo.Bar") comes after.
    """
    lines = [ln.strip().lstrip("-").strip() for ln in str(error).splitlines()]
    keep = [ln for ln in lines if ln and not _SOURCE_LINE.match(ln) and not ln.startswith(_BOILERPLATE)]
    text = " ".join(keep) or str(error).strip() or type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


_MAX_PROFILED_RUNS = 4096  # per-layer counters kept (the last runs) by a model compiled with profile=True


def layer_spans(info: Any, call: int, span_us: float) -> list[NodeSpan]:
    """Node spans of one call from per-layer counters (OpenVINO ProfilingInfo or the same duck type).

    OpenVINO reports durations, not start times: the layers are laid end to end from the call's start.
    Their sum can exceed the call (layers that overlap on the worker threads); then the spans are shrunk
    in proportion to fit in the call, and ``args.real_us`` keeps the reported time.
    """
    layers = []
    for rec in info:
        status = str(getattr(rec, "status", "EXECUTED"))
        real = getattr(rec, "real_time", 0)
        dur = real.total_seconds() * 1e6 if isinstance(real, datetime.timedelta) else float(real) * 1e6
        if dur > 0 and "NOT_RUN" not in status and "OPTIMIZED_OUT" not in status:
            layers.append((rec, dur))
    total = sum(d for _, d in layers)
    scale = min(1.0, span_us / total) if total else 1.0
    spans, cursor = [], 0.0
    for rec, dur in layers:
        args: dict[str, Any] = {"real_us": round(dur, 3)}
        if getattr(rec, "exec_type", None):
            args["exec_type"] = str(rec.exec_type)
        spans.append(NodeSpan(str(getattr(rec, "node_name", "?")), str(getattr(rec, "node_type", "?")), call,
                              cursor, dur * scale, args))
        cursor += dur * scale
    return spans


class OpenVINOExecutable(Executable):
    """An OpenVINO ``CompiledModel`` with one infer request per calling thread."""

    def __init__(self, compiled: Any, input_names: list[str], output_names: list[str],
                 share_inputs: bool = True, profiling: bool = False) -> None:
        self.compiled = compiled
        self.input_names = input_names
        self.output_names = output_names
        # where each of our outputs is among the compiled model's (by name, else by position): results are
        # read with one to_tuple() call, not an OVDict lookup per output port (1.8 us each)
        by_name = {n: i for i, port in enumerate(compiled.outputs) for n in port.get_names()}
        self._positions = [by_name.get(n, i) for i, n in enumerate(output_names)]
        ov_inputs = {n for port in compiled.inputs for n in port.get_names()}
        # OpenVINO drops inputs the graph does not use; feeding them would fail
        self._unused = [n for n in input_names if n not in ov_inputs]
        self._local = threading.local()
        self._share = share_inputs
        # per-layer counters of each run, read right after it (the request keeps the last run's only)
        self._layers: collections.deque[list[Any]] | None = \
            collections.deque(maxlen=_MAX_PROFILED_RUNS) if profiling else None

    def _request(self) -> Any:
        req = getattr(self._local, "req", None)
        if req is None:
            req = self._local.req = self.compiled.create_infer_request()
        return req

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Infer on this thread's request; return copies of the outputs in ``output_names`` order.

        Feeds for inputs OpenVINO dropped from the graph are left out, and with profiling on the run's
        per-layer counters are kept for :meth:`node_spans`.
        """
        req = self._request()
        if self._unused:
            feeds = {k: v for k, v in feeds.items() if k not in self._unused}
        # share_outputs=False: results are copied out, so the next run cannot overwrite them
        results = req.infer(dict(feeds), share_inputs=self._share, share_outputs=False)
        if self._layers is not None:
            self._layers.append(list(req.profiling_info))
        values = results.to_tuple()
        return [values[i] for i in self._positions]

    @property
    def precision(self) -> str | None:
        """The inference precision OpenVINO chose, read back from the compiled model; None when it cannot say.

        It can differ from the hint: an 'f16' hint runs bf16 on a CPU with BF16 units.
        """
        try:
            name = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        except Exception:  # a device without the property, or a closed model
            return None
        return _OV_PRECISIONS.get(name, name)

    @property
    def loaded_from_cache(self) -> bool | None:
        """OpenVINO's LOADED_FROM_CACHE: whether it imported its blob from ``cache_dir``."""
        try:
            return bool(self.compiled.get_property("LOADED_FROM_CACHE"))
        except Exception:  # a device without the property, or a closed model
            return None

    def node_spans(self, calls: Sequence[tuple[int, int]]) -> list[NodeSpan]:
        """The per-layer counters (``PERF_COUNT``) of the last ``len(calls)`` runs.

        Each run's layers are laid end to end in its call (:func:`layer_spans`).
        """
        if not self._layers or not calls:
            return []
        count = min(len(calls), len(self._layers))
        first = len(calls) - count
        out: list[NodeSpan] = []
        for i, info in enumerate(list(self._layers)[len(self._layers) - count:]):
            start, end = calls[first + i]
            out += layer_spans(info, first + i, (end - start) / 1e3)
        return out

    def close(self) -> None:
        """Drop the compiled model, so OpenVINO can free it."""
        self.compiled = None


class OpenVINOBackend(Backend):
    """Runs models with OpenVINO ``Core.compile_model``."""

    name = "openvino"
    priority = 20
    install_hint = "pip install 'pyasc[openvino]'"
    own_allocator = "OpenVINO's plugin allocators, per compiled model (it reports no usage figures)"
    options = {
        "performance_hint": Option((str,), "LATENCY", _HINTS, "OpenVINO PERFORMANCE_HINT"),
        "inference_precision": Option((str,), "f32", _PRECISIONS, "INFERENCE_PRECISION_HINT"),
        "num_threads": Option((int,), doc="INFERENCE_NUM_THREADS"),
        "num_streams": Option((int,), doc="NUM_STREAMS"),
        "num_requests": Option((int,), doc="PERFORMANCE_HINT_NUM_REQUESTS"),
        "cpu_pinning": Option((bool,), doc="ENABLE_CPU_PINNING: pin the CPU plugin's threads to cores"),
        "tbb_partitioner": Option((str,), None, _PARTITIONERS, "TBB_PARTITIONER: how parallel loops split work"),
        "cache_dir": Option((str,), doc="OpenVINO model cache folder (bundle platform cache)"),
        "profile": Option((bool,), doc="collect per-layer performance counters"),
    }

    @classmethod
    def shared_options(cls) -> dict[str, Any]:
        """Leave the CPU plugin's threads unpinned: a pinned thread cannot move off a core the others are using.

        By default (the LATENCY hint) the plugin pins its threads to cores, which suits a process that owns them;
        beside a server's front end or another backend's part, a parallel loop then waits at its join for the thread
        whose core is taken, where the OS would have moved it (OpenVINO's ``ENABLE_CPU_PINNING``).
        """
        return {"cpu_pinning": False}

    def _layouts(self, device: str, cores: int) -> tuple[Layout, ...]:
        """The THROUGHPUT hint: as many streams as the plugin finds best, each concurrent caller on its own request.

        The executable keeps one infer request per calling thread, so concurrent callers run on separate streams.
        """
        return (Layout("throughput", {"performance_hint": "THROUGHPUT"}, 1,
                       "PERFORMANCE_HINT THROUGHPUT (streams chosen by OpenVINO)"),)

    def _probe(self) -> list[ProbedDevice]:
        import openvino as ov

        self._core = ov.Core()
        found = []
        for native in self._core.available_devices:
            kind, _, idx = native.partition(".")
            full = self._core.get_property(native, "FULL_DEVICE_NAME")
            props = (("full_name", str(full)),)
            if kind == "CPU":
                found.append(ProbedDevice("cpu", "cpu", 0, native, props))
            elif kind == "GPU":
                i = int(idx or 0)
                found.append(ProbedDevice(f"gpu:{i}", "gpu", i, native, props))
            elif kind == "NPU":
                found.append(ProbedDevice("npu:0", "npu", 0, native, props))
        return found

    def version(self) -> str:
        """OpenVINO's version string (``openvino.get_version()``)."""
        import openvino as ov

        return ov.get_version()

    def supports(self, node: Any, device: str = "cpu") -> bool:
        """Whether OpenVINO runs ``node`` on ``device``, from ``Core.query_model`` on its whole graph.

        ``query_model`` answers per model, so the answer for every node of a graph is computed once
        (``hybrid.backends.openvino_query``) and cached for as long as the graph lives.
        """
        from hybrid.backends.openvino_query import graph_support

        graph = node.graph
        if graph is None:
            return False
        return graph_support(self._core, graph, _native_device(device)).get(id(node), False)

    def _precisions(self, device: str) -> tuple[str, ...]:
        caps = set(self._core.get_property(_native_device(device), "OPTIMIZATION_CAPABILITIES"))
        return tuple(p for p, cap in (("bf16", "BF16"), ("fp16", "FP16")) if cap in caps)

    def _precision_options(self, device: str, precision: str) -> dict[str, Any]:
        return {"inference_precision": {"fp16": "f16", "bf16": "bf16"}[precision]}

    def _compile(self, model: Any, device: str, options: dict[str, Any]) -> Executable:
        from hybrid.config import get_config

        native = _native_device(device)
        try:
            ov_model = self._core.read_model(model.to_bytes())
            compiled = self._core.compile_model(ov_model, native, ov_config(options, get_config().num_threads, native))
        except Exception as e:
            raise BackendError("HYB-304", f"openvino could not compile model {model.name!r} for {device}: "
                               f"{compile_reason(e)}", "try target='auto' or another backend") from e
        return self._executable(model, compiled, options)

    @staticmethod
    def _executable(model: Any, compiled: Any, options: Mapping[str, Any]) -> OpenVINOExecutable:
        sig = model.signature
        # zero-copy input sharing misreads ml_dtypes arrays (bfloat16, float8...) as float16
        share = not any(s.dtype is not None and s.dtype.kind == "V" for s in sig.inputs)
        return OpenVINOExecutable(compiled, sig.input_names, sig.output_names, share, bool(options.get("profile")))

    def prepare_artifact(self, model: Any, device: str, options: Mapping[str, Any], path: str,
                         compiled: Executable | None = None) -> bool:
        """The compiled model's exported blob (``CompiledModel.export_model``), from ``compiled`` where given.

        Importing it (:meth:`_import_artifact`, ``Core.import_model``) skips the ONNX front end and the plugin's graph
        transformations.
        """
        exe = compiled if isinstance(compiled, OpenVINOExecutable) and compiled.compiled is not None else None
        made = exe is None
        if exe is None:
            built = self.compile(model, device, options)
            assert isinstance(built, OpenVINOExecutable)
            exe = built
        part = f"{path}.{os.getpid()}.part"
        try:
            try:
                exported = exe.compiled.export_model()  # bytes, or a BytesIO in newer releases
                blob = exported.getvalue() if hasattr(exported, "getvalue") else bytes(exported)
            except Exception as e:
                raise BackendError("HYB-304", f"openvino could not export model {model.name!r} for {device}: "
                                   f"{compile_reason(e)}", "compile it in the serving process") from e
            with open(part, "wb") as f:
                f.write(blob)
            os.replace(part, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(part)
            if made:
                exe.close()
        return True

    def _import_artifact(self, model: Any, device: str, options: dict[str, Any], artifact: str) -> Executable:
        """``Core.import_model`` of the blob at ``artifact``, with the compile's properties (threads, hint)."""
        from hybrid.config import get_config

        native = _native_device(device)
        try:
            with open(artifact, "rb") as f:
                blob = f.read()
            compiled = self._core.import_model(blob, native, ov_config(options, get_config().num_threads, native))
        except Exception as e:
            raise BackendError("HYB-304", f"openvino could not import the compiled model {artifact!r} of "
                               f"{model.name!r} for {device}: {compile_reason(e)}",
                               "compile it from the model instead") from e
        return self._executable(model, compiled, options)
