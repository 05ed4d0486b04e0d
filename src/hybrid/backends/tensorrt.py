"""The native TensorRT backend: an engine built from the IR with TensorRT's ONNX parser.

The engine is built once per (model, build settings, device fingerprint) and cached on disk with the
builder's timing cache, so the second compile of a model only deserializes it. Runs use the
TensorRT 10 I/O API (``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``) with torch
CUDA tensors as buffers, on torch's current CUDA stream.

Unverified: this project's machines have no NVIDIA GPU and no TensorRT. The code follows TensorRT's
documented Python API (8.6 and 10.x); the option mapping is unit-tested against a recording stand-in
of that API (tests/test_tensorrt.py). Options validate without TensorRT installed, so
``hybrid.set_backend('tensorrt', config={'fp16_mode': True, 'max_workspace_size': 1 << 30})`` works
anywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybrid.errors import BackendError, RunError
from hybrid.hal.backend import Backend, Executable, Option, ProbedDevice
from hybrid.hal.machine import cache_root
from hybrid.ir import atomic_write_bytes

if TYPE_CHECKING:
    import onnx_ir as ir

    from hybrid.ir import Model

__all__ = [
    "BuildSettings",
    "TensorRTBackend",
    "TensorRTExecutable",
    "build_settings",
    "cache_key",
    "configure_builder",
    "engine_paths",
    "profile_shapes",
]

logger = logging.getLogger("hybrid")

# ONNX element types TensorRT takes at its inputs and outputs (no doubles, no strings)
_TRT_TYPES = {"FLOAT", "FLOAT16", "BFLOAT16", "INT8", "INT32", "INT64", "BOOL", "UINT8", "FLOAT8E4M3FN"}


@dataclass(frozen=True, slots=True)
class BuildSettings:
    """What goes into an engine besides the model: every field changes the cache key."""

    fp16: bool = False
    bf16: bool = False
    workspace: int | None = None
    optimization_level: int | None = None
    timing_cache: bool = True
    dla_core: int | None = None
    max_batch: int = 32
    shapes: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = field(default=())


def build_settings(options: Mapping[str, Any]) -> BuildSettings:
    """Turn validated backend options into build settings, checking their values.

    Raises:
        BackendError: HYB-306 for a value the types alone do not catch (a negative size, a malformed
            shape profile).
    """
    workspace = options.get("max_workspace_size")
    if workspace is not None and workspace <= 0:
        raise BackendError("HYB-306", f"backend 'tensorrt' option 'max_workspace_size': expected a positive byte "
                           f"count, got {workspace}", "e.g. 1 << 30 for 1 GiB")
    max_batch = options.get("max_batch", 32)
    if max_batch < 1:
        raise BackendError("HYB-306", f"backend 'tensorrt' option 'max_batch': expected >= 1, got {max_batch}")
    dla = options.get("dla_core")
    if dla is not None and dla < 0:
        raise BackendError("HYB-306", f"backend 'tensorrt' option 'dla_core': expected a core index >= 0, got {dla}")
    shapes = []
    for name, triple in sorted((options.get("profile_shapes") or {}).items()):
        try:
            mins, opts, maxs = (tuple(int(d) for d in dims) for dims in triple)
            ok = len(mins) == len(opts) == len(maxs) and all(a <= b <= c for a, b, c in zip(mins, opts, maxs))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise BackendError("HYB-306", f"backend 'tensorrt' option 'profile_shapes'[{name!r}]: expected "
                               f"(min, opt, max) shapes of one rank with min <= opt <= max, got {triple!r}",
                               "e.g. {'input': ((1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224))}")
        shapes.append((str(name), (mins, opts, maxs)))
    return BuildSettings(fp16=bool(options.get("fp16_mode", False)), bf16=bool(options.get("bf16_mode", False)),
                         workspace=workspace, optimization_level=options.get("builder_optimization_level"),
                         timing_cache=bool(options.get("timing_cache", True)), dla_core=dla, max_batch=max_batch,
                         shapes=tuple(shapes))


def configure_builder(trt: Any, builder: Any, config: Any, settings: BuildSettings) -> None:
    """Apply build settings to a ``tensorrt.IBuilderConfig`` (TensorRT's own API, nothing else)."""
    if settings.workspace is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace)
    if settings.fp16:
        if not builder.platform_has_fast_fp16:
            logger.warning("tensorrt: fp16_mode on a GPU without fast FP16; TensorRT may keep FP32 kernels")
        config.set_flag(trt.BuilderFlag.FP16)
    if settings.bf16:
        config.set_flag(trt.BuilderFlag.BF16)
    if settings.optimization_level is not None:
        config.builder_optimization_level = settings.optimization_level
    if settings.dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = settings.dla_core
        config.set_flag(trt.BuilderFlag.GPU_FALLBACK)


def profile_shapes(inputs: Sequence[tuple[str, Sequence[int]]],
                   settings: BuildSettings) -> dict[str, tuple[tuple[int, ...], ...]]:
    """(min, opt, max) shapes for every network input with a dynamic (-1) dimension.

    A given ``profile_shapes`` entry wins; otherwise only a dynamic first dimension is filled in
    (1, max_batch, max_batch): TensorRT tunes its kernels for ``opt``.

    Raises:
        BackendError: HYB-304 naming an input with another dynamic dimension and no profile.
    """
    given = dict(settings.shapes)
    out: dict[str, tuple[tuple[int, ...], ...]] = {}
    for name, dims in inputs:
        dims = tuple(int(d) for d in dims)
        if all(d >= 0 for d in dims):
            continue
        if name in given:
            out[name] = given[name]
            continue
        if any(d < 0 for d in dims[1:]):
            raise BackendError("HYB-304", f"tensorrt: input {name!r} has dynamic dimensions {list(dims)} beyond the "
                               "first and no profile", "give profile_shapes={name: (min, opt, max)} in the options")
        rest = dims[1:]
        out[name] = ((1, *rest), (settings.max_batch, *rest), (settings.max_batch, *rest))
    return out


def cache_key(model_bytes: bytes, settings: BuildSettings) -> str:
    """The engine's cache key: the model and every build setting."""
    h = hashlib.sha256(model_bytes)
    h.update(json.dumps(asdict(settings), sort_keys=True, default=list).encode())
    return h.hexdigest()[:24]


def engine_paths(root: Path, fingerprint: str, key: str) -> tuple[Path, Path]:
    """Where an engine and the device's timing cache live: ``<root>/tensorrt/<fingerprint>/``."""
    folder = root / "tensorrt" / fingerprint
    return folder / f"{key}.engine", folder / "timing.cache"


def _cache_root(options: Mapping[str, Any]) -> Path:
    """The option's folder, else hybrid's cache folder (:func:`hybrid.hal.machine.cache_root`)."""
    return Path(options["cache_dir"]) if options.get("cache_dir") else cache_root()


def _fingerprint(trt: Any, torch: Any, index: int) -> str:
    """Engines are valid for one GPU model and compute capability, one TensorRT and one CUDA."""
    p = torch.cuda.get_device_properties(index)
    info = [p.name, f"{p.major}.{p.minor}", trt.__version__, str(torch.version.cuda)]
    return hashlib.sha256("|".join(info).encode()).hexdigest()[:16]


def _torch_dtypes(trt: Any, torch: Any) -> dict[Any, Any]:
    names = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8", "INT32": "int32",
             "INT64": "int64", "BOOL": "bool", "UINT8": "uint8", "FP8": "float8_e4m3fn"}
    return {getattr(trt.DataType, a): getattr(torch, b) for a, b in names.items() if hasattr(trt.DataType, a)}


class TensorRTExecutable(Executable):
    """An engine and one execution context; runs are serialized (a context runs one at a time)."""

    def __init__(self, engine: Any, context: Any, device: Any, input_names: list[str], output_names: list[str],
                 dtypes: dict[str, Any], stager: Any, loaded: bool | None = None) -> None:
        import torch

        self.engine = engine
        self.context = context
        self.input_names = input_names
        self.output_names = output_names
        self._device = device
        self._dtypes = dtypes
        self._stager = stager
        self._torch = torch
        self._lock = threading.Lock()
        self._loaded = loaded

    @property
    def loaded_from_cache(self) -> bool | None:
        """Whether the engine was deserialized from the cache folder (False: built here)."""
        return self._loaded

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Bind the staged inputs and fresh output buffers, run the context on the current CUDA stream and wait.

        Runs are serialized by a lock, since one execution context runs one call at a time.

        Raises:
            RunError: HYB-408 when an output's shape depends on the data, or TensorRT's execution fails.
        """
        torch = self._torch
        args = self._stager.inputs([feeds[n] for n in self.input_names])
        with self._lock, torch.cuda.device(self._device):
            ctx = self.context
            for name, t in zip(self.input_names, args):
                t = t.to(self._dtypes[name]).contiguous()
                ctx.set_input_shape(name, tuple(t.shape))
                ctx.set_tensor_address(name, t.data_ptr())
            outs = []
            for name in self.output_names:
                shape = tuple(ctx.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise RunError("HYB-408", f"tensorrt: output {name!r} has a data-dependent shape {shape}",
                                   "run this model with target='torch:cuda' or 'onnxruntime'")
                out = torch.empty(shape, dtype=self._dtypes[name], device=self._device)
                ctx.set_tensor_address(name, out.data_ptr())
                outs.append(out)
            stream = torch.cuda.current_stream(self._device)
            if not ctx.execute_async_v3(stream.cuda_stream):
                raise RunError("HYB-408", "tensorrt: execute_async_v3 failed (see the TensorRT log)")
            stream.synchronize()
            return self._stager.outputs(outs, args)

    def close(self) -> None:
        """Drop the execution context and the engine, so TensorRT can free them."""
        self.context = None
        self.engine = None


class TensorRTBackend(Backend):
    """Builds TensorRT engines with ``tensorrt.OnnxParser`` and runs them on CUDA devices."""

    name = "tensorrt"
    priority = 5  # the fastest path on NVIDIA GPUs when installed; engines are cached after the first build
    install_hint = "pip install tensorrt (with a CUDA build of torch for the device buffers)"
    memory_pools = {"pinned": "staging buffers of host-to-device input copies (pin_memory)"}
    own_allocator = "TensorRT's builder and runtime allocators (device buffers from torch's CUDA caching allocator)"
    memory_options = {"max_workspace_size": None, "pin_memory": True}
    options = {
        "fp16_mode": Option((bool,), False, doc="allow FP16 kernels (BuilderFlag.FP16)"),
        "bf16_mode": Option((bool,), False, doc="allow BF16 kernels (BuilderFlag.BF16, TensorRT >= 9)"),
        "max_workspace_size": Option((int,), doc="builder workspace limit in bytes (MemoryPoolType.WORKSPACE)"),
        "builder_optimization_level": Option((int,), choices=(0, 1, 2, 3, 4, 5), doc="TensorRT's build effort"),
        "timing_cache": Option((bool,), True, doc="keep the builder's timing cache per device"),
        "cache_dir": Option((str,), doc="engine and timing cache folder (default: hybrid's cache)"),
        "max_batch": Option((int,), 32, doc="largest dynamic first dimension in the optimization profile"),
        "profile_shapes": Option((dict,), doc="input name -> (min, opt, max) shapes for dynamic dimensions"),
        "dla_core": Option((int,), doc="build for this DLA core (Jetson), GPU fallback on"),
        "pin_memory": Option((bool,), True, doc="stage inputs through pinned host buffers"),
    }

    def _probe(self) -> list[ProbedDevice]:
        try:
            import tensorrt as trt
        except ImportError as e:
            raise ModuleNotFoundError("tensorrt not installed (pip install tensorrt)") from e
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible to torch; TensorRT needs one")
        self._trt = trt
        self._logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(self._logger)
        self._support_parser = trt.OnnxParser(builder.create_network(self._network_flags(trt)), self._logger)
        devices = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            props = (("name", p.name), ("capability", f"{p.major}.{p.minor}"),
                     ("fast_fp16", bool(builder.platform_has_fast_fp16)))
            devices.append(ProbedDevice(f"cuda:{i}", "cuda", i, f"cuda:{i}", props))
        return devices

    @staticmethod
    def _network_flags(trt: Any) -> int:
        # TensorRT 10 networks are always explicit-batch; 8.x needs the flag
        if int(trt.__version__.split(".")[0]) < 10:
            return 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
        return 0

    def _precisions(self, device: str) -> tuple[str, ...]:
        return ("fp16", "bf16") if int(self._trt.__version__.split(".")[0]) >= 9 else ("fp16",)

    def _precision_options(self, device: str, precision: str) -> dict[str, Any]:
        return {f"{precision}_mode": True}

    def version(self) -> str:
        """The installed TensorRT version string."""
        import tensorrt as trt

        return trt.__version__

    def supports(self, node: ir.Node, device: str = "cpu") -> bool:
        """TensorRT's ONNX parser's own answer for the op, plus the element types TensorRT runs."""
        if node.domain not in ("", "ai.onnx") or not self._support_parser.supports_operator(node.op_type):
            return False
        for v in [*node.inputs, *node.outputs]:
            if v is not None and v.dtype is not None and v.dtype.name not in _TRT_TYPES and not v.is_initializer():
                return False
        return True

    def _compile(self, model: Model, device: str, options: dict[str, Any]) -> Executable:
        import torch

        from hybrid.backends.torch.staging import Stager

        trt = self._trt
        settings = build_settings(options)
        index = int(device.partition(":")[2] or 0)
        dev = torch.device(f"cuda:{index}")
        data = model.to_bytes()
        engine_path, timing_path = engine_paths(_cache_root(options), _fingerprint(trt, torch, index),
                                                cache_key(data, settings))
        with torch.cuda.device(dev):
            runtime = trt.Runtime(self._logger)
            engine, loaded = None, False
            if engine_path.is_file():
                engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
                loaded = engine is not None
                if engine is None:
                    logger.warning("tensorrt: cached engine %s did not load; rebuilding", engine_path)
            if engine is None:
                plan = self._build(trt, data, settings, timing_path, model.name)
                atomic_write_bytes(engine_path, plan)
                engine = runtime.deserialize_cuda_engine(plan)
            if engine is None:
                raise BackendError("HYB-304", f"tensorrt could not load the engine it built for {model.name!r}",
                                   "see the TensorRT log above")
            context = engine.create_execution_context()
        types = _torch_dtypes(trt, torch)
        sig = model.signature
        dtypes = {n: types[engine.get_tensor_dtype(n)] for n in [*sig.input_names, *sig.output_names]}
        return TensorRTExecutable(engine, context, dev, sig.input_names, sig.output_names, dtypes,
                                  Stager(dev, options.get("pin_memory", True)), loaded)

    def _build(self, trt: Any, data: bytes, settings: BuildSettings, timing_path: Path, name: str) -> bytes:
        builder = trt.Builder(self._logger)
        network = builder.create_network(self._network_flags(trt))
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse(data):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise BackendError("HYB-304", f"tensorrt's ONNX parser rejected model {name!r}: {errors[:500]}",
                               "try target='torch:cuda' or 'onnxruntime:cuda'")
        config = builder.create_builder_config()
        configure_builder(trt, builder, config, settings)
        inputs = [(network.get_input(i).name, tuple(network.get_input(i).shape)) for i in range(network.num_inputs)]
        shapes = profile_shapes(inputs, settings)
        if shapes:
            profile = builder.create_optimization_profile()
            for input_name, (lo, opt, hi) in shapes.items():
                profile.set_shape(input_name, lo, opt, hi)
            config.add_optimization_profile(profile)
        cache = None
        if settings.timing_cache:
            cache = config.create_timing_cache(timing_path.read_bytes() if timing_path.is_file() else b"")
            config.set_timing_cache(cache, ignore_mismatch=False)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise BackendError("HYB-304", f"tensorrt could not build an engine for {name!r}",
                               "see the TensorRT log above; a larger max_workspace_size sometimes helps")
        if cache is not None:
            atomic_write_bytes(timing_path, bytes(config.get_timing_cache().serialize()))
        return bytes(plan)
