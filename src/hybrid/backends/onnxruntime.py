"""The ONNX Runtime backend: every execution provider the installed ORT reports.

Providers map to hybrid devices: CPU -> 'cpu'; CUDA and TensorRT -> 'cuda:N'; CANN -> 'npu:N';
DirectML and the OpenVINO EP's GPU -> 'gpu:N'; CoreML -> 'mps'. Only the CPU provider is verified on
this project's machines; the others are written against ORT's documented provider options and are
listed as unverified in the README.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hybrid.errors import BackendError, first_line
from hybrid.hal.backend import Backend, CacheStrategy, Executable, Layout, NodeSpan, Option, ProbedDevice

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeExecutable", "provider_chain", "session_options"]

logger = logging.getLogger("hybrid")

_OPT_LEVELS = ("disable", "basic", "extended", "layout", "all")

# provider name -> hybrid device kind
_PROVIDER_KINDS = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "cuda",
    "CANNExecutionProvider": "npu",
    "DmlExecutionProvider": "gpu",
    "OpenVINOExecutionProvider": "gpu",
    "CoreMLExecutionProvider": "mps",
}


class OnnxRuntimeExecutable(Executable):
    """An ``onnxruntime.InferenceSession`` behind the Executable contract."""

    def __init__(self, session: Any, run_options: Any = None, profiling: bool = False) -> None:
        self.session = session
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        self._run = _direct_run(session) or session.run
        self._run_options = run_options
        self._profiling = profiling

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Run the session on the feeds; return the outputs in ``output_names`` order.

        A CPU-only session calls ORT's native ``run`` directly, skipping the checks hybrid has already made.
        """
        return self._run(self.output_names, feeds, self._run_options)

    def node_spans(self, calls: Sequence[tuple[int, int]]) -> list[NodeSpan]:
        """ORT's node events of the last ``len(calls)`` runs; ORT's profiler ends here.

        Each run's ``model_run`` event is centred in its call (the difference is Python-side overhead).
        """
        if not self._profiling or self.session is None or not calls:
            return []
        path = self.session.end_profiling()
        self._profiling = False
        try:
            with open(path, encoding="utf-8") as f:
                events = json.load(f)
        finally:
            Path(path).unlink(missing_ok=True)
        return ort_node_spans(events, calls)

    def close(self) -> None:
        """Release the session and the bound native run that held it alive; a later run raises RuntimeError."""
        self.session = None
        self._run = _closed_run  # the bound native run held the session (and its memory) alive


def _closed_run(*_: Any) -> list[Any]:
    raise RuntimeError("this ONNX Runtime session was closed")


def _direct_run(session: Any) -> Any:
    """The native ``run`` of a CPU-only session, or None where ORT's Python ``run`` must stay in between.

    ``InferenceSession.run`` checks, in Python on every call, what hybrid's InputValidator has already
    checked (required inputs; feeds are numpy arrays, never OrtValues) and costs 5-15 us a call: a third
    of a 30 us model. It also retries on another provider after ``EPFail`` (raised by GPU providers only)
    and refuses WebGPU graph capture; a session with either need keeps the Python ``run``.
    """
    native = getattr(session, "_sess", None)
    if native is None or not hasattr(native, "run") or session.get_providers() != ["CPUExecutionProvider"]:
        return None
    capture = getattr(native, "is_webgpu_graph_capture_enabled", None)
    if capture is not None and capture():
        return None
    return native.run


def ort_node_spans(events: list[dict[str, Any]], calls: Sequence[tuple[int, int]]) -> list[NodeSpan]:
    """Node spans from ORT's profile (its Chrome-trace events).

    They are the ``*_kernel_time`` node events inside each of the last ``len(calls)`` ``model_run``
    events, timed from the start of the matching call.
    """
    model_runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                        key=lambda e: e["ts"])
    nodes = sorted((e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")),
                   key=lambda e: e["ts"])
    count = min(len(calls), len(model_runs))
    first = len(calls) - count
    out: list[NodeSpan] = []
    k = 0
    for i, mr in enumerate(model_runs[len(model_runs) - count:]):
        start, end = calls[first + i]
        # centre ORT's model_run inside the call
        lead = max(0.0, ((end - start) / 1e3 - mr["dur"]) / 2)
        while k < len(nodes) and nodes[k]["ts"] < mr["ts"]:
            k += 1
        while k < len(nodes) and nodes[k]["ts"] <= mr["ts"] + mr["dur"]:
            ev, args = nodes[k], nodes[k].get("args", {})
            keep = {"provider": args.get("provider", "")}
            for key in ("input_type_shape", "output_type_shape"):
                if key in args:
                    keep[key] = args[key]
            out.append(NodeSpan(ev["name"][:-len("_kernel_time")], args.get("op_name", "?"), first + i,
                                ev["ts"] - mr["ts"] + lead, ev.get("dur", 0), keep))
            k += 1
    return out


def session_options(ort: Any, options: Mapping[str, Any], threads: int | None = None) -> Any:
    """Build ``onnxruntime.SessionOptions`` from validated hybrid options."""
    so = ort.SessionOptions()
    intra = options.get("intra_op_num_threads", threads)
    if intra:
        so.intra_op_num_threads = intra
    if options.get("inter_op_num_threads"):
        so.inter_op_num_threads = options["inter_op_num_threads"]
    level = options.get("graph_optimization_level")
    if level is not None:
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "layout": getattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT",
                              ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[level]
    if options.get("execution_mode") == "parallel":
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    if "enable_mem_pattern" in options:
        so.enable_mem_pattern = options["enable_mem_pattern"]
    if "enable_cpu_mem_arena" in options:
        so.enable_cpu_mem_arena = options["enable_cpu_mem_arena"]
    if options.get("optimized_model_path"):
        so.optimized_model_filepath = options["optimized_model_path"]
    if options.get("allow_spinning") is not None:
        flag = "1" if options["allow_spinning"] else "0"
        so.add_session_config_entry("session.intra_op.allow_spinning", flag)
        so.add_session_config_entry("session.inter_op.allow_spinning", flag)
    if options.get("profile"):
        so.enable_profiling = True
        prefix = options["profile"]
        if not isinstance(prefix, str):  # never litter the working directory with trace files
            prefix = os.path.join(tempfile.gettempdir(), "hybrid-ort-profile")
        so.profile_file_prefix = prefix
    so.log_severity_level = 4  # failures surface as exceptions (HYB-304/408), not log spam
    return so


# hybrid options passed to the CANN EP under the same names (ORT's CANN EP documentation)
_CANN_OPTIONS = ("precision_mode", "op_select_impl_mode", "optypelist_for_implmode", "npu_mem_limit",
                 "arena_extend_strategy", "enable_cann_graph", "dump_graphs", "dump_om_model")
_CANN_PRECISIONS = ("force_fp32", "cube_fp16in_fp32out", "force_fp16", "allow_fp32_to_fp16",
                    "must_keep_origin_dtype", "allow_mix_precision", "allow_mix_precision_fp16",
                    "allow_mix_precision_bf16", "allow_fp32_to_bf16")
_AOE_JOB_TYPES = {"subgraph": 1, "operator": 2}


def _note_aoe(mode: str) -> None:
    """Warn that the seed's ``aoe_mode`` has no ONNX Runtime CANN EP option, and how to tune instead.

    AOE tunes offline, and the graph builds that follow (the CANN EP's included) read its results from
    CANN's knowledge base.
    """
    logger.warning("aoe_mode=%r: ONNX Runtime's CANN EP has no AOE option; tune once with `aoe --framework=5 "
                   "--model=model.onnx --job_type=%d` on the Ascend host, later CANN builds use the tuned "
                   "knowledge base", mode, _AOE_JOB_TYPES[mode])


def provider_chain(device: str, options: Mapping[str, Any], available: list[str]) -> list[tuple[str, dict]]:
    """The ORT providers (with their documented options) to use for a hybrid device, CPU last."""
    kind, _, idx = device.partition(":")
    index = int(idx or 0)
    chain: list[tuple[str, dict]] = []
    extra = dict(options.get("provider_options") or {})
    if kind == "cuda":
        if options.get("tensorrt") and "TensorrtExecutionProvider" in available:
            trt: dict[str, Any] = {"device_id": index, "trt_fp16_enable": bool(options.get("fp16"))}
            if options.get("max_workspace_size"):
                trt["trt_max_workspace_size"] = int(options["max_workspace_size"])
            if options.get("engine_cache_path"):
                trt["trt_engine_cache_enable"] = True
                trt["trt_engine_cache_path"] = options["engine_cache_path"]
                trt["trt_timing_cache_enable"] = True
                # without a path ORT writes the timing cache to the working directory
                trt["trt_timing_cache_path"] = options["engine_cache_path"]
            chain.append(("TensorrtExecutionProvider", {**trt, **extra.get("TensorrtExecutionProvider", {})}))
        cuda: dict[str, Any] = {"device_id": index}
        if options.get("gpu_mem_limit"):
            cuda["gpu_mem_limit"] = int(options["gpu_mem_limit"])
        if options.get("cudnn_conv_algo_search"):
            cuda["cudnn_conv_algo_search"] = options["cudnn_conv_algo_search"]
        chain.append(("CUDAExecutionProvider", {**cuda, **extra.get("CUDAExecutionProvider", {})}))
    elif kind == "npu":
        cann: dict[str, Any] = {"device_id": index}
        for key in _CANN_OPTIONS:
            if options.get(key) is not None:
                cann[key] = options[key]
        if options.get("aoe_mode"):
            _note_aoe(options["aoe_mode"])
        chain.append(("CANNExecutionProvider", {**cann, **extra.get("CANNExecutionProvider", {})}))
    elif kind == "gpu":
        name = "DmlExecutionProvider" if "DmlExecutionProvider" in available else "OpenVINOExecutionProvider"
        opts = {"device_id": index} if name == "DmlExecutionProvider" else {"device_type": f"GPU.{index}"}
        chain.append((name, {**opts, **extra.get(name, {})}))
    elif kind == "mps":
        chain.append(("CoreMLExecutionProvider", dict(extra.get("CoreMLExecutionProvider", {}))))
    chain.append(("CPUExecutionProvider", dict(extra.get("CPUExecutionProvider", {}))))
    return [(n, o) for n, o in chain if n in available]


class OnnxRuntimeBackend(Backend):
    """Runs models with ONNX Runtime ``InferenceSession``s."""

    name = "onnxruntime"
    priority = 10
    install_hint = "pip install onnxruntime (or onnxruntime-gpu for CUDA/TensorRT)"
    own_allocator = "ONNX Runtime's own arenas, per session"
    memory_options = {"enable_cpu_mem_arena": True, "enable_mem_pattern": True, "gpu_mem_limit": None,
                      "npu_mem_limit": None}
    options = {
        "intra_op_num_threads": Option((int,), doc="threads inside one operator (0: all cores)"),
        "inter_op_num_threads": Option((int,), doc="threads across operators (parallel mode)"),
        "graph_optimization_level": Option((str,), choices=_OPT_LEVELS, doc="ORT graph optimizations"),
        "execution_mode": Option((str,), choices=("sequential", "parallel")),
        "allow_spinning": Option((bool,), doc="let idle intra-op threads spin (fast alone, starves "
                                              "other runtimes on few cores)"),
        "enable_mem_pattern": Option((bool,)),
        "enable_cpu_mem_arena": Option((bool,)),
        "optimized_model_path": Option((str,), doc="write ORT's optimized model here (bundle cache)"),
        "profile": Option((bool, str), doc="enable ORT's profiler (str: file prefix)"),
        "tensorrt": Option((bool,), doc="on cuda devices, put the TensorRT EP before CUDA"),
        "fp16": Option((bool,), doc="TensorRT EP fp16 mode"),
        "max_workspace_size": Option((int,), doc="TensorRT EP workspace bytes"),
        "engine_cache_path": Option((str,), doc="TensorRT EP engine and timing cache folder"),
        "gpu_mem_limit": Option((int,), doc="CUDA EP arena limit in bytes"),
        "cudnn_conv_algo_search": Option((str,), choices=("EXHAUSTIVE", "HEURISTIC", "DEFAULT")),
        "precision_mode": Option((str,), choices=_CANN_PRECISIONS, doc="CANN EP precision mode"),
        "op_select_impl_mode": Option((str,), choices=("high_performance", "high_precision")),
        "optypelist_for_implmode": Option((str,), doc="CANN EP: op types (comma-separated) op_select_impl_mode "
                                                      "applies to"),
        "npu_mem_limit": Option((int,), doc="CANN EP memory limit in bytes"),
        "arena_extend_strategy": Option((str,), choices=("kNextPowerOfTwo", "kSameAsRequested"),
                                        doc="CANN EP arena growth"),
        "enable_cann_graph": Option((bool,), doc="CANN EP: run whole graphs on CANN's graph engine (ORT default "
                                                 "True)"),
        "dump_graphs": Option((bool,), doc="CANN EP: dump the partitioned subgraphs as ONNX"),
        "dump_om_model": Option((bool,), doc="CANN EP: write the compiled offline model (.om)"),
        "aoe_mode": Option((str,), choices=tuple(_AOE_JOB_TYPES), doc="Ascend AOE tuning (the CANN EP cannot "
                                                                       "run it; a warning gives the aoe command)"),
        "provider_options": Option((dict,), doc="raw options per provider name, passed through"),
    }

    def _probe(self) -> list[ProbedDevice]:
        import onnxruntime as ort

        self._ort = ort
        available = ort.get_available_providers()
        self.available_providers = available
        found: dict[str, ProbedDevice] = {}
        for prov in available:
            kind = _PROVIDER_KINDS.get(prov)
            if kind is None:
                continue
            name = "cpu" if kind == "cpu" else ("mps" if kind == "mps" else f"{kind}:0")
            prev = found.get(name)
            provs = (dict(prev.properties)["providers"] + "," + prov) if prev else prov
            found[name] = ProbedDevice(name, kind, 0, prov, (("providers", provs),))
        return list(found.values())

    @classmethod
    def shared_options(cls) -> dict[str, Any]:
        """Turn off ORT's spinning worker threads, which would starve the other backends sharing the cores."""
        return {"allow_spinning": False}

    def _layouts(self, device: str, cores: int) -> tuple[Layout, ...]:
        """Sessions x intra-op threads that fill the cores: 2, 4 and one session per core (CPU only).

        ORT runs concurrent ``run`` calls of one session in parallel, but they share its intra-op pool and arena;
        separate sessions with fewer threads each do not wait on each other's fork-joins (issue 50: 8 callers of a
        classifier on 2 cores, 2 sessions x 1 thread served 1.43x the inferences of one session with ORT's default
        threads; benchmarks/RESULTS.md, "Concurrent callers"). The grid is Triton Model Analyzer's first sweep
        (instance count x threads).
        """
        if device != "cpu" or cores < 2:
            return ()
        out: dict[str, Layout] = {}
        for replicas in sorted({2, 4, cores}):
            if replicas > cores:
                continue
            threads = max(1, cores // replicas)
            tag = f"{replicas}x{threads}"
            # a pool's idle threads spin after each run: beside the other replicas' callers that takes their cores
            options = {"intra_op_num_threads": threads, **({"allow_spinning": False} if threads > 1 else {})}
            out[tag] = Layout(tag, options, replicas,
                              f"{replicas} sessions x {threads} intra-op thread{'s' if threads > 1 else ''}")
        return tuple(out.values())

    @classmethod
    def profiling_options(cls, workdir: str) -> dict[str, Any]:
        """ORT's profiler on, its trace files under ``workdir``."""
        return {"profile": os.path.join(workdir, "ort")}  # ORT's trace files stay in the profiler's folder

    @classmethod
    def cache_strategy(cls, device: str, options: Mapping[str, Any]) -> CacheStrategy | None:
        """The optimized model on ORT's own, or the TensorRT engine directory where the TensorRT EP is on.

        ORT cannot serialize a graph with TensorRT-compiled nodes, so there the engines are the cache.
        """
        if device.startswith("cuda") and options.get("tensorrt"):
            # ORT cannot serialize a graph with TensorRT-compiled nodes; the engines are the cache
            return CacheStrategy("directory", "engine_cache_path")
        return CacheStrategy("optimized-model", "optimized_model_path", {"graph_optimization_level": "disable"})

    def _precisions(self, device: str) -> tuple[str, ...]:
        # fp16 through the TensorRT execution provider (unverified here: no GPU)
        on_cuda = device.startswith("cuda") and "TensorrtExecutionProvider" in self.available_providers
        return ("fp16",) if on_cuda else ()

    def _precision_options(self, device: str, precision: str) -> dict[str, Any]:
        return {"tensorrt": True, "fp16": True}

    def version(self) -> str:
        """The installed onnxruntime version string."""
        import onnxruntime as ort

        return ort.__version__

    def supports(self, node: Any, device: str = "cpu") -> bool:
        """Whether ORT has a kernel for ``node`` on ``device``.

        A one-node session is created once per op signature (op, opset, input types, attributes)
        and the answer cached: the session resolves kernels, type constraints and ONNX functions
        exactly as a full session would, which the raw kernel registry does not.
        """
        from hybrid.backends.capability import op_signature

        cache = self.__dict__.setdefault("_supports_cache", {})
        key = (device, op_signature(node))
        answer = cache.get(key)
        if answer is None:
            answer = cache[key] = self._probe_node(node, device)
        return answer

    def _probe_node(self, node: Any, device: str) -> bool:
        from hybrid.backends.capability import one_node_model

        proto = one_node_model(node)
        if proto is None:
            return False
        ort = self._ort
        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        providers = provider_chain(device, {}, self.available_providers)
        try:
            ort.InferenceSession(proto.SerializeToString(), sess_options=so,
                                 providers=[p for p, _ in providers], provider_options=[o for _, o in providers])
        except Exception as e:
            logger.debug("onnxruntime lacks %s (%s) on %s: %s", node.name or node.op_type, node.op_type, device,
                         first_line(e, 200))
            return False
        return True

    def _compile(self, model: Any, device: str, options: dict[str, Any]) -> Executable:
        return self._session(model.to_bytes(), model.name, device, options)

    def _session(self, source: bytes | str, name: str, device: str, options: dict[str, Any]) -> Executable:
        """An InferenceSession of ``source`` (the model's bytes, or the path of an optimized model)."""
        ort = self._ort
        from hybrid.config import get_config

        so = session_options(ort, options, get_config().num_threads)
        providers = provider_chain(device, options, self.available_providers)
        try:
            session = ort.InferenceSession(source, sess_options=so,
                                           providers=[p for p, _ in providers],
                                           provider_options=[o for _, o in providers])
        except Exception as e:
            first = first_line(e, 500)
            raise BackendError("HYB-304", f"onnxruntime could not compile model {name!r} for "
                               f"{device}: {first}", "try target='auto' or another backend") from e
        return OnnxRuntimeExecutable(session, profiling=bool(options.get("profile")))

    def prepare_artifact(self, model: Any, device: str, options: Mapping[str, Any], path: str,
                         compiled: Executable | None = None) -> bool:
        """ORT's optimized model, written by a session at the candidate's optimization level (``compiled`` unused).

        The artifact is the one a bundle caches (:meth:`cache_strategy`, 'optimized-model'): a session cannot
        serialize itself after the fact, so this builds one with the strategy's option; importing it with the
        strategy's restore options (the optimizer off) skips the optimizer (:meth:`_import_artifact`). False where the
        strategy is another (the TensorRT EP: ORT cannot serialize a graph with TensorRT-compiled nodes).
        """
        opts = self.validate_options(options)
        strategy = self.cache_strategy(device, opts)
        if strategy is None or strategy.kind != "optimized-model":
            return False
        part = f"{path}.{os.getpid()}.part"
        try:
            self._session(model.to_bytes(), model.name, device, {**opts, strategy.option: part}).close()
            os.replace(part, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(part)
        return True

    def _import_artifact(self, model: Any, device: str, options: dict[str, Any], artifact: str) -> Executable:
        """A session of the optimized model at ``artifact``, with the cache strategy's restore options (it ran)."""
        strategy = self.cache_strategy(device, options)
        if strategy is None or strategy.kind != "optimized-model" or not os.path.isfile(artifact):
            raise BackendError("HYB-304", f"onnxruntime: no optimized model at {artifact!r} for {model.name!r}",
                               "compile without the artifact")
        opts = {k: v for k, v in options.items() if k != strategy.option}
        return self._session(artifact, model.name, device, {**opts, **strategy.restore_options})
