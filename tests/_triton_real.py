"""The real Triton server, from the ``nvidia-pytriton`` wheel, for differential tests and benchmarks.

The wheel ships ``tritonserver`` (2.51) with its Python backend; the backend needs the Python stub of this
interpreter's version beside it, which :func:`triton_home` copies there once (atomically; it works on a
fresh machine or CI). The stub links the system's ``libpython3.X``, and finds numpy and onnxruntime through
``PYTHONPATH`` (this interpreter's site-packages). :func:`write_model` writes a repository entry the way a
CPU-only Triton shop serves an ONNX file without the native onnxruntime backend: ``backend: "python"`` and
a ``model.py`` that runs ONNX Runtime (requests of a dynamic batch concatenated along the batch dim).

Nothing here is imported by the package; it is a test and benchmark helper.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TritonServer", "TritonSpec", "free_port", "triton_home", "unavailable_reason", "write_model"]

_PY = f"{sys.version_info.major}.{sys.version_info.minor}"
_STUB = "triton_python_backend_stub"

_MODEL_PY = '''\
import json
import os
import sys

# the stub's embedded interpreter does not read PYTHONPATH itself: put the server's site-packages first
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = {threads}
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "{spinning}")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]
        self.strings = {{i["name"] for i in config["input"] if i["data_type"] == "TYPE_STRING"}}

    def _array(self, request, name):
        arr = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
        if name in self.strings:
            arr = np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(arr)
        return arr

    def execute(self, requests):
        arrays = [[self._array(r, n) for n in self.inputs] for r in requests]
        rows = [a[0].shape[0] for a in arrays]
        if len(requests) == 1:
            feeds = dict(zip(self.inputs, arrays[0]))
        else:
            feeds = {{n: np.concatenate([a[i] for a in arrays]) for i, n in enumerate(self.inputs)}}
        outs = self.session.run(self.outputs, feeds)
        responses = []
        start = 0
        for k in rows:
            tensors = []
            for name, out in zip(self.outputs, outs):
                part = out[start:start + k] if len(requests) > 1 else out
                if part.dtype == object:
                    part = np.vectorize(lambda s: s.encode("utf-8") if isinstance(s, str) else s,
                                        otypes=[object])(part)
                tensors.append(pb_utils.Tensor(name, part))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += k
        return responses
'''


def _package_dir() -> Path | None:
    spec = importlib.util.find_spec("pytriton")  # found without importing it (its imports need pyzmq)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def unavailable_reason() -> str | None:
    """Why the real server cannot run here (None when it can)."""
    home = _package_dir()
    if home is None:
        return ("nvidia-pytriton is not installed (pip install --no-deps 'nvidia-pytriton==0.7.0': a manylinux_2_35 "
                "x86-64 wheel; --no-deps keeps numpy 2, which its metadata would downgrade)")
    if not (home / "bin" / "tritonserver").exists():
        return f"{home} has no bin/tritonserver"
    if not (home / "python_backend_stubs" / _PY / _STUB).exists():
        return f"nvidia-pytriton has no Python backend stub for Python {_PY}"
    if not sysconfig.get_config_var("INSTSONAME") or not _libpython_found():
        return f"the Python backend stub needs libpython{_PY}.so.1.0, which the dynamic linker cannot find"
    return None


def _libpython_found() -> bool:
    out = subprocess.run(["ldd", str(_package_dir() / "python_backend_stubs" / _PY / _STUB)],  # type: ignore[operator]
                         capture_output=True, text=True, check=False).stdout
    return "not found" not in out


def triton_home() -> Path:
    """The wheel's ``tritonserver`` folder, with this Python's backend stub in place (copied once)."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    home = _package_dir()
    assert home is not None
    target = home / "backends" / "python" / _STUB
    if not target.exists():
        tmp = target.with_name(f".{_STUB}.{os.getpid()}")
        shutil.copy2(home / "python_backend_stubs" / _PY / _STUB, tmp)
        os.replace(tmp, target)
    return home


def stub_path() -> list[str]:
    """The folders the stub's interpreter needs first on ``sys.path``.

    The stub's numpy glue is built against numpy 1.x (its tensors from a numpy 2 array come out empty), so
    when this interpreter has numpy 2 a numpy 1.26 goes into a cache folder once (pip, from the registry)
    and comes before this interpreter's site-packages.
    """
    import numpy as np

    site = sysconfig.get_paths()["purelib"]
    if int(np.__version__.split(".")[0]) < 2:
        return [site]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pyasc-triton" / f"numpy1-py{_PY}"
    if not (cache / "numpy" / "__init__.py").exists():
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tmp),
                        "numpy==1.26.4"], check=True)
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(tmp, cache)
    return [str(cache), site]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class TritonSpec:
    """One tensor of a Triton model config: name, Triton type ('TYPE_FP32'), dims without the batch dim, and
    for an output the label file of the classification extension (in the model's folder), if any."""

    name: str
    data_type: str
    dims: Sequence[int]
    label_filename: str | None = None

    def pbtxt(self) -> str:
        labels = f' label_filename: "{self.label_filename}"' if self.label_filename else ""
        return f'{{ name: "{self.name}" data_type: {self.data_type} dims: [{", ".join(map(str, self.dims))}]{labels} }}'


def write_model(repo: Path, name: str, onnx_path: Path, inputs: Sequence[TritonSpec], outputs: Sequence[TritonSpec],
                *, max_batch_size: int = 8, queue_delay_us: int | None = 2000, threads: int = 2,
                spinning: bool = False, instances: int = 1) -> Path:
    """Write ``repo/name/{config.pbtxt, 1/model.py, 1/model.onnx}`` (the ONNX file is copied); ``instances``:
    the ``instance_group`` count (Triton runs that many model.py instances, each its own stub process and
    ONNX Runtime session with ``threads``)."""
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(onnx_path, folder / "1" / "model.onnx")
    (folder / "1" / "model.py").write_text(_MODEL_PY.format(threads=threads, spinning=int(spinning)))
    lines = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {max_batch_size}",
             f"input [ {', '.join(s.pbtxt() for s in inputs)} ]",
             f"output [ {', '.join(s.pbtxt() for s in outputs)} ]",
             f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]"]
    if queue_delay_us is not None:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}")
    (folder / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return folder


class TritonServer:
    """``tritonserver`` over a model repository, in a child process; a context manager.

    Args:
        repository: The model repository.
        startup_timeout: Longest wait in seconds for ``/v2/health/ready``.
        extra_args: More command-line options (e.g. ``--trace-config``).
    """

    def __init__(self, repository: Path, startup_timeout: float = 120.0, extra_args: Sequence[str] = ()) -> None:
        self.repository = Path(repository)
        self.extra_args = list(extra_args)
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="tritonserver-", suffix=".log", delete=False)  # noqa: SIM115

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def start(self) -> TritonServer:
        home = triton_home()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*stub_path(), env.get("PYTHONPATH")) if p)
        cmd = [str(home / "bin" / "tritonserver"), "--model-repository", str(self.repository),
               "--backend-directory", str(home / "backends"), "--http-port", str(self.http_port),
               "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port),
               "--allow-metrics", "false", "--log-verbose", "0", "--exit-on-error", "true",
               "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", *self.extra_args]
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        from _serve_support import poll  # tests/ is on the path of the tests and the benchmarks that use this

        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=1) as r:
                return r.status == 200
            return False

        if poll(ready, self.startup_timeout, every=0.2):
            return self
        self.stop()
        raise RuntimeError(f"tritonserver was not ready within {self.startup_timeout} s:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running(repository: Path) -> Iterator[TritonServer]:
    """``with running(repo) as triton:`` the server, stopped afterwards."""
    with TritonServer(repository) as server:
        yield server
