"""The torch backend: the hybrid IR as a ``torch.fx`` GraphModule on any torch device.

Devices come from torch at run time: the CPU always, ``cuda:N`` for every device
``torch.cuda.device_count()`` reports (NVIDIA, and AMD under ROCm builds), ``npu:N`` when
``torch_npu`` imports (Huawei Ascend), and ``mps`` on Apple silicon. Only the CPU path is verified
on this project's machines; the others use the same module with tensors placed on that device.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hybrid.errors import BackendError
from hybrid.hal.backend import Backend, Executable, Option, ProbedDevice

if TYPE_CHECKING:
    import onnx_ir as ir

    from hybrid.ir import Model

__all__ = ["TorchBackend", "TorchExecutable", "torch_device"]

logger = logging.getLogger("hybrid")

_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_COMPILE_BACKENDS = ("inductor", "aot_eager", "eager", "cudagraphs")
_AUTOCAST = ("fp16", "bf16")


def torch_device(device: str) -> str:
    """The torch device string of a hybrid device name ('cpu', 'cuda:1', 'npu:0', 'mps').

    Raises:
        BackendError: HYB-303 for a device kind torch does not drive.
    """
    kind, _, idx = device.partition(":")
    if kind == "cpu" or kind == "mps":
        return kind
    if kind in ("cuda", "npu"):
        return f"{kind}:{idx or 0}"
    raise BackendError("HYB-303", f"torch cannot use device {device!r}", "use cpu, cuda:N, npu:N or mps")


class TorchExecutable(Executable):
    """A GraphModule (optionally ``torch.compile``d) with its staging of inputs and outputs."""

    def __init__(self, module: Any, input_names: list[str], output_names: list[str], stager: Any,
                 autocast: Any = None, output_dtypes: list[Any] | None = None) -> None:
        import torch

        self.module = module
        self.input_names = input_names
        self.output_names = output_names
        self._stager = stager
        self._torch = torch
        self._autocast = autocast
        self._output_dtypes = output_dtypes or []

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Stage the feeds onto the device and run the module under ``inference_mode``; return numpy outputs in order.

        Under autocast, outputs are cast back to the dtypes the graph declares.
        """
        torch = self._torch
        args = self._stager.inputs([feeds[n] for n in self.input_names])
        with torch.inference_mode():
            if self._autocast is not None:
                with torch.autocast(**self._autocast):
                    outs = self.module(*args)
                outs = [o.to(d) if d is not None and isinstance(o, torch.Tensor) and o.dtype != d else o
                        for o, d in zip(outs, self._output_dtypes)]
            else:
                outs = self.module(*args)
        return self._stager.outputs(outs, args)

    def close(self) -> None:
        """Drop the module, so its parameters and buffers can be freed."""
        self.module = None


class TorchBackend(Backend):
    """Runs models as torch.fx GraphModules, optionally compiled with ``torch.compile``."""

    name = "torch"
    priority = 30
    install_hint = "pip install 'pyasc[torch]' (torch_npu for Ascend NPUs)"
    memory_pools = {"pinned": "staging buffers of host-to-device input copies (pin_memory)"}
    own_allocator = "torch's allocators (the CUDA caching allocator on GPUs; CPU inputs share the caller's arrays)"
    memory_options = {"pin_memory": True}
    options = {
        "compile": Option((bool,), False, doc="wrap the module with torch.compile"),
        "compile_mode": Option((str,), "default", _COMPILE_MODES, "torch.compile mode"),
        "compile_backend": Option((str,), "inductor", _COMPILE_BACKENDS, "torch.compile backend"),
        "dynamic": Option((bool,), doc="torch.compile dynamic shapes (None: torch decides)"),
        "autocast": Option((str,), choices=_AUTOCAST, doc="run under torch.autocast in this precision"),
        "pin_memory": Option((bool,), True, doc="stage CUDA inputs through pinned host buffers"),
        "num_threads": Option((int,), doc="torch intra-op threads on the CPU (process-wide)"),
        "cudnn_benchmark": Option((bool,), doc="set torch.backends.cudnn.benchmark (process-wide)"),
        "allow_tf32": Option((bool,), doc="let CUDA matmuls and cuDNN convolutions use TF32 (process-wide; "
                                          "False keeps fp32 results close to the CPU's)"),
    }

    def _probe(self) -> list[ProbedDevice]:
        import torch

        self.notes: dict[str, str] = {}
        found = [ProbedDevice("cpu", "cpu", 0, "cpu", (("threads", torch.get_num_threads()),))]
        found += self._cuda_devices(torch)
        found += self._npu_devices(torch)
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            found.append(ProbedDevice("mps", "mps", 0, "mps"))
        return found

    def _cuda_devices(self, torch: Any) -> list[ProbedDevice]:
        if not torch.cuda.is_available():
            self.notes["cuda"] = ("torch built without CUDA" if torch.version.cuda is None
                                  and getattr(torch.version, "hip", None) is None else "no CUDA device visible")
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            props = (("name", p.name), ("memory", int(p.total_memory)),
                     ("capability", f"{p.major}.{p.minor}"))
            out.append(ProbedDevice(f"cuda:{i}", "cuda", i, f"cuda:{i}", props))
        return out

    def _npu_devices(self, torch: Any) -> list[ProbedDevice]:
        try:
            import torch_npu  # noqa: F401 - registers torch.npu
        except ImportError:
            self.notes["npu"] = "torch_npu not installed"
            return []
        except Exception as e:  # a broken CANN install must not hide the CPU
            self.notes["npu"] = f"torch_npu failed to import: {e}"
            return []
        npu = getattr(torch, "npu", None)
        if npu is None or not npu.is_available():
            self.notes["npu"] = "no Ascend NPU visible to torch_npu"
            return []
        return [ProbedDevice(f"npu:{i}", "npu", i, f"npu:{i}", (("name", str(npu.get_device_name(i))),))
                for i in range(npu.device_count())]

    def version(self) -> str:
        """The installed torch version string."""
        import torch

        return torch.__version__

    def supports(self, node: ir.Node, device: str = "cpu") -> bool:
        """Whether the lowering table covers ``node`` on ``device`` (op, opset, attributes, dtypes)."""
        from hybrid.backends.torch.graph_builder import unsupported_reason

        graph = node.graph
        opsets = dict(graph.opset_imports) if graph is not None else {}
        return unsupported_reason(node, opsets, device.partition(":")[0]) is None

    def _compile(self, model: Model, device: str, options: dict[str, Any]) -> Executable:
        import torch

        from hybrid.backends.torch.graph_builder import build_module
        from hybrid.backends.torch.lowering import torch_dtype
        from hybrid.backends.torch.staging import Stager

        dev = torch.device(torch_device(device))
        if options.get("num_threads"):
            torch.set_num_threads(options["num_threads"])
        if options.get("cudnn_benchmark") is not None:
            torch.backends.cudnn.benchmark = options["cudnn_benchmark"]
        if options.get("allow_tf32") is not None:
            torch.backends.cuda.matmul.allow_tf32 = options["allow_tf32"]
            torch.backends.cudnn.allow_tf32 = options["allow_tf32"]
        graph = model.graph
        opsets = dict(model.ir.opset_imports)
        module = build_module(graph, opsets, dev, model.name).eval()
        protected = [b.untyped_storage().data_ptr() for b in module.buffers()]
        runner: Any = module
        if options.get("compile"):
            try:
                mode = options.get("compile_mode", "default")
                runner = torch.compile(module, backend=options.get("compile_backend", "inductor"),
                                       mode=None if mode == "default" else mode, dynamic=options.get("dynamic"))
            except Exception as e:
                raise BackendError("HYB-304", f"torch.compile rejected model {model.name!r}: {e}",
                                   "compile=False runs the same module eagerly") from e
        autocast = None
        out_dtypes: list[Any] = []
        if options.get("autocast"):
            autocast = {"device_type": dev.type,
                        "dtype": torch.float16 if options["autocast"] == "fp16" else torch.bfloat16}
            for value in graph.outputs:
                try:
                    out_dtypes.append(torch_dtype(value.dtype) if value.dtype is not None else None)
                except KeyError:
                    out_dtypes.append(None)
        stager = Stager(dev, options.get("pin_memory", True), protected)
        sig = model.signature
        return TorchExecutable(runner, sig.input_names, sig.output_names, stager, autocast, out_dtypes)
