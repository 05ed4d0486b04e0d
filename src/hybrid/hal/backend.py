"""The backend contract: what every hardware backend implements.

A backend is a small object (DESIGN 2.2): it probes its library lazily and lists the devices it can
use, answers ``supports(node)``, and compiles a model (or a partition of one) into an
:class:`Executable`. Public methods validate and wrap; the ``_probe``/``_compile`` hooks do the work.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from hybrid.errors import BackendError

if TYPE_CHECKING:
    import onnx_ir as ir

    from hybrid.ir import Model

__all__ = ["MACHINE_OPTIONS", "Backend", "CacheStrategy", "Executable", "Layout", "NodeSpan", "Option", "ProbedDevice"]

# options that name files on the machine that compiles: never carried into a bundle, a cache key or a
# profiled build; the option a CacheStrategy names must be one of them
MACHINE_OPTIONS = ("optimized_model_path", "profile", "cache_dir", "engine_cache_path")


@dataclass(frozen=True, slots=True)
class Option:
    """One option a backend accepts (in ``set_backend`` or ``compile(config=...)``).

    Attributes:
        types: Accepted Python types.
        default: Value used when the option is not given (None: the library's own default).
        choices: Allowed values, if the option is an enumeration.
        doc: One line for error messages and ``pyasc devices``.
    """

    types: tuple[type, ...]
    default: Any = None
    choices: tuple[Any, ...] | None = None
    doc: str = ""


@dataclass(frozen=True, slots=True)
class ProbedDevice:
    """A device as one backend sees it: hybrid device name plus the backend's own name for it."""

    name: str
    kind: str
    index: int = 0
    native: str = ""
    properties: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSpan:
    """One node's time in one profiled call, as the backend's own profiler reports it.

    Attributes:
        name: The node (or the backend's layer) name.
        op_type: Its operator type in the backend's words ('Conv', 'Convolution').
        call: Which of the calls given to :meth:`Executable.node_spans` it ran in (index into them).
        offset_us: Its start, in microseconds after that call's start.
        dur_us: Its duration in microseconds, as drawn (within the call).
        args: Extra facts shown with the span (provider, shapes); ``real_us`` is the time the backend
            reported when it differs from ``dur_us``, and is what the profile's statistics add up.
    """

    name: str
    op_type: str
    call: int
    offset_us: float
    dur_us: float
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CacheStrategy:
    """How a backend's compiled artifact is captured into a bundle and given back to it.

    Attributes:
        kind: 'optimized-model': the backend writes an optimized ONNX graph to the file that ``option``
            names, and compiling that graph with graph optimizations off skips its optimizer;
            'directory': the backend writes its own cache files into the folder ``option`` names, and
            reads them back (validating them) when compiled again with the same option.
        option: The backend option that names the file or folder.
        restore_options: Options added when compiling from the artifact ('optimized-model': those that
            turn the optimizer off, it already ran).
    """

    kind: Literal["optimized-model", "directory"]
    option: str
    restore_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Layout:
    """One way a backend can run an executable besides its default.

    Attributes:
        tag: Short, stable name in candidate labels and the decision cache ('2x1': 2 replicas x 1 thread).
        options: Backend options that make the layout (merged over the candidate's; a layout whose option the
            user set to another value is not offered: the user's choice wins).
        replicas: Executables compiled with those options; each call takes a free one (:class:`ReplicaPool`).
        doc: What it is, in words, for ``cm.tuning`` and ``--explain``.
    """

    tag: str
    options: Mapping[str, Any]
    replicas: int = 1
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.tag or "@" in self.tag or " " in self.tag:
            raise ValueError(f"layout tag {self.tag!r}: expected a short name without '@' or spaces")
        if self.replicas < 1:
            raise ValueError(f"layout {self.tag!r}: expected at least 1 replica, got {self.replicas}")


class Executable(abc.ABC):
    """A compiled model or subgraph, ready to run on one device."""

    input_names: list[str]
    output_names: list[str]

    @abc.abstractmethod
    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Run on already validated feeds; return outputs in ``output_names`` order."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release native resources (sessions, engines)."""

    @property
    def precision(self) -> str | None:
        """The precision the backend actually runs ('fp32', 'fp16', 'bf16').

        Read back from it where it can say (OpenVINO's INFERENCE_PRECISION_HINT); None: the precision that
        was requested.
        """
        return None

    @property
    def loaded_from_cache(self) -> bool | None:
        """Whether the backend imported its compiled artifact from the cache its options named.

        True: it did; False: it compiled afresh (a cache it rejected); None: it cannot say.
        """
        return None

    def node_spans(self, calls: Sequence[tuple[int, int]]) -> list[NodeSpan]:
        """Per-node timings of the last ``len(calls)`` calls of :meth:`run`, from the backend's profiler.

        The executable was compiled with :meth:`Backend.profiling_options`. Called once, after those calls;
        a backend may stop its profiler then. Default: none (no profiler).

        Args:
            calls: (start, end) of each profiled call, ``time.perf_counter_ns()``; earlier calls were warm-up.
        """
        return []


class Backend(abc.ABC):
    """Base class of hardware backends.

    Subclasses set ``name``, ``priority`` (lower runs first when several can), ``options``, and
    implement ``_probe``, ``version`` and ``_compile``. ``probe`` never raises: a missing library
    becomes an unavailable backend with the reason recorded by the registry.

    ``exact_and_complete`` is the fallback role, declared by the backend itself: True for one that runs
    every op (custom ops included) on the CPU with the kernels that define it (the reference backend).
    Such a backend is the yardstick ``target='auto'`` checks the others against, and the one that gets
    only what no other backend runs; the runtime asks :func:`hybrid.hal.is_fallback`, never a name.

    ``memory_pools`` is the backend's use of the unified memory pool, declared by the backend itself: the
    ``hybrid.init({'memory_pool': ...})`` arenas it draws from ('cpu', 'pinned', 'gpu', 'npu'), each with what
    it keeps there. Whatever else it allocates comes from its library's allocators, which :meth:`own_memory`
    describes (``own_allocator``, ``memory_options``); ``init`` and ``hybrid.utils.memory_summary`` report the
    pool's scope from these, never from a backend's name.
    """

    name: ClassVar[str]
    priority: ClassVar[int] = 100
    options: ClassVar[dict[str, Option]] = {}
    install_hint: ClassVar[str] = ""
    exact_and_complete: ClassVar[bool] = False
    memory_pools: ClassVar[Mapping[str, str]] = {}
    own_allocator: ClassVar[str] = "its library's own allocators"
    memory_options: ClassVar[Mapping[str, Any]] = {}  # option -> the library's default (None: unset, no limit)

    @classmethod
    def own_memory(cls, options: Mapping[str, Any]) -> str:
        """How the backend allocates what it does not take from hybrid's pools, in one line.

        ``own_allocator``, then the value of each of ``memory_options`` (the options that shape that memory) in
        ``options`` (``set_backend``, ``init``'s ``backends``), or its library's default. Imports no library.
        """
        settings = []
        for key, default in cls.memory_options.items():
            value = options.get(key, default)
            shown = "unset" if value is None else str(value)
            settings.append(f"{key}={shown}" + ("" if key in options else " (default)"))
        return cls.own_allocator + (f": {', '.join(settings)}" if settings else "")

    # ---------------------------------------------------------------- options
    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """Check options against ``cls.options``; return them as a dict.

        Raises:
            BackendError: HYB-306 naming the option and what the backend accepts.
        """
        out: dict[str, Any] = {}
        for key, value in options.items():
            spec = cls.options.get(key)
            if spec is None:
                valid = ", ".join(sorted(cls.options)) or "none"
                raise BackendError("HYB-306", f"backend {cls.name!r} has no option {key!r}; it accepts: "
                                   f"{valid}", "check the option name")
            if not isinstance(value, spec.types) or (isinstance(value, bool) and bool not in spec.types):
                names = " or ".join(t.__name__ for t in spec.types)
                raise BackendError("HYB-306", f"backend {cls.name!r} option {key!r}: expected {names}, "
                                   f"got {value!r}", spec.doc or None)
            if spec.choices is not None and value not in spec.choices:
                raise BackendError("HYB-306", f"backend {cls.name!r} option {key!r}: expected one of "
                                   f"{list(spec.choices)}, got {value!r}", spec.doc or None)
            out[key] = value
        return out

    # ---------------------------------------------------------------- discovery
    def probe(self) -> list[ProbedDevice]:
        """Import the backend's library and list the devices it can use (may raise.

        The registry turns any exception into 'unavailable' with the reason).
        """
        return self._probe()

    @abc.abstractmethod
    def _probe(self) -> list[ProbedDevice]:
        """Hook: import the library, return devices."""

    @abc.abstractmethod
    def version(self) -> str:
        """The backend library's version string."""

    # ---------------------------------------------------------------- capability
    def supports(self, node: ir.Node, device: str = "cpu") -> bool:
        """Whether this backend can run ``node`` on ``device``. Default: yes."""
        return True

    def supports_model(self, model: Model, device: str = "cpu") -> list[ir.Node]:
        """Return the nodes of ``model`` this backend cannot run on ``device`` (empty: all of them)."""
        return [n for n in model.graph if not self.supports(n, device)]

    # ---------------------------------------------------------------- precisions
    def precisions(self, device: str) -> tuple[str, ...]:
        """The reduced inference precisions ('bf16', 'fp16') this backend offers on ``device``.

        Fp32 is always offered and not listed. Never raises: a device it cannot ask offers none.
        """
        try:
            return tuple(self._precisions(device))
        except Exception:
            return ()

    def _precisions(self, device: str) -> tuple[str, ...]:
        """Hook: reduced precisions on ``device`` (default: none)."""
        return ()

    def precision_options(self, device: str, precision: str) -> dict[str, Any]:
        """The options that make a compile on ``device`` run at ``precision`` ({} for fp32).

        Raises:
            BackendError: HYB-304 when ``precision`` is not offered on ``device``.
        """
        if precision == "fp32":
            return {}
        offered = self.precisions(device)
        if precision not in offered:
            raise BackendError("HYB-304", f"backend {self.name!r} has no {precision} mode on {device}; precisions "
                               f"it runs there: {', '.join(('fp32', *offered))}",
                               "use precision='fp32' or 'auto', or a target that offers it")
        return self._precision_options(device, precision)

    def _precision_options(self, device: str, precision: str) -> dict[str, Any]:
        """Hook: options for a precision listed by :meth:`_precisions`."""
        raise NotImplementedError(f"{self.name} lists {precision} but does not say how to select it")

    # ---------------------------------------------------------------- layouts
    def layouts(self, device: str, cores: int) -> tuple[Layout, ...]:
        """The ways besides its default this backend can run one executable on ``device`` with ``cores`` cores.

        Candidates for ``target='auto'`` where callers run concurrently (issue 50): replicas and threads (ONNX
        Runtime), a throughput hint (OpenVINO). The default layout is not listed. Never raises: a device it cannot
        ask offers none.
        """
        try:
            return tuple(self._layouts(device, max(1, cores)))
        except Exception:
            return ()

    def _layouts(self, device: str, cores: int) -> tuple[Layout, ...]:
        """Hook: the layouts of :meth:`layouts` (default: none besides the default one)."""
        return ()

    # ---------------------------------------------------------------- sharing the machine
    @classmethod
    def shared_options(cls) -> dict[str, Any]:
        """Options for when the backend shares the process's cores.

        A part of a graph that runs beside other backends' parts, or a server whose event loop forms the next batch (the
        user's own options still win). Default: none. ONNX Runtime turns off its spinning threads, which would starve
        the others on few cores (DESIGN 4).
        """
        return {}

    # ---------------------------------------------------------------- profiling and caches
    @classmethod
    def profiling_options(cls, workdir: str) -> dict[str, Any]:
        """Options that turn the backend's per-node profiler on ({}.

        It has none); its files, if any, go under ``workdir``. Default: ``{'profile': True}`` when the backend declares
        a ``profile`` option.
        """
        return {"profile": True} if "profile" in cls.options else {}

    @classmethod
    def cache_strategy(cls, device: str, options: Mapping[str, Any]) -> CacheStrategy | None:
        """How a compile on ``device`` with ``options`` captures its artifact (None: no cache).

        Default, from the declared options: ``optimized_model_path`` -> 'optimized-model' (restored with
        ``graph_optimization_level='disable'`` when declared); ``cache_dir`` or ``engine_cache_path`` -> 'directory'.
        """
        if "optimized_model_path" in cls.options:
            off = {"graph_optimization_level": "disable"} if "graph_optimization_level" in cls.options else {}
            return CacheStrategy("optimized-model", "optimized_model_path", off)
        for option in ("cache_dir", "engine_cache_path"):
            if option in cls.options:
                return CacheStrategy("directory", option)
        return None

    # ---------------------------------------------------------------- artifacts made in another process
    def prepare_artifact(self, model: Model, device: str, options: Mapping[str, Any], path: str,
                         compiled: Executable | None = None) -> bool:
        """Write to ``path`` what :meth:`compile` with ``artifact=path`` imports cheaply (False: this backend has none).

        Meant for another process than the one that imports it (``target='auto'``'s check process): the costly part of
        a compile (graph optimizations, a plugin's transformations) runs there, and the serving process only imports.
        The artifact is for this machine and this library version only (it is never kept). The file is written under
        another name and renamed, so a reader never sees half of it.

        Args:
            model: The model.
            device: The device it is compiled for.
            options: The options it is compiled with (the import is given the same ones).
            path: Where to write it.
            compiled: The same model already compiled here with the same options, if there is one (a backend that
                exports from it saves a compile).

        Raises:
            BackendError: HYB-304 when the library fails to compile or export.
        """
        return False

    def _import_artifact(self, model: Model, device: str, options: dict[str, Any], artifact: str) -> Executable:
        """Hook: the executable imported from what :meth:`prepare_artifact` wrote (a backend that writes one)."""
        raise BackendError("HYB-304", f"backend {self.name!r} cannot import a compiled artifact; got {artifact!r}",
                           "compile without artifact=")

    # ---------------------------------------------------------------- compile
    def compile(self, model: Model, device: str, options: Mapping[str, Any] | None = None,
                artifact: str | None = None) -> Executable:
        """Compile ``model`` for ``device`` with validated options merged over the defaults.

        Args:
            model: The model.
            device: The device.
            options: Backend options.
            artifact: A file :meth:`prepare_artifact` wrote for this model, device and options: imported instead of
                compiled (the caller falls back to a compile when it fails).

        Raises:
            BackendError: HYB-306 for bad options, HYB-304 when the library rejects the model (or the artifact).
        """
        opts = self.validate_options(options or {})
        if artifact is not None:
            return self._import_artifact(model, device, opts, artifact)
        return self._compile(model, device, opts)

    @abc.abstractmethod
    def _compile(self, model: Model, device: str, options: dict[str, Any]) -> Executable:
        """Hook: build the executable."""
