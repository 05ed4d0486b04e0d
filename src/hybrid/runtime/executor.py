"""Runs a partitioned model: each partition's executable in order, values handed over as they are.

On one host every backend reads and writes numpy arrays, so a boundary value produced by one
partition is passed to the next as the very same array object: no copy, no conversion. Each value
is dropped after its last use (computed once, STYLE habit 8), so peak memory stays that of the
largest partition plus the live boundary values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir

from hybrid.errors import BackendError
from hybrid.hal import Candidate, get_backend
from hybrid.hal.backend import Executable
from hybrid.ir import Model
from hybrid.runtime.partition import Part, Partition, node_label, partition_graph, submodel
from hybrid.runtime.plan import Plan

__all__ = ["PartitionedExecutable", "Step", "compile_partitioned", "compile_parts"]

MAX_ATTEMPTS = 8


@dataclass(frozen=True, slots=True)
class Step:
    """One partition to run: its executable, the values it reads and writes, what dies after it."""

    executable: Executable
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    free: tuple[str, ...] = ()


class PartitionedExecutable(Executable):
    """An Executable made of partitions that run one after another.

    Args:
        steps: (executable, input names, output names) per partition, in dependency order.
        input_names: The model's inputs.
        output_names: The model's outputs (each produced by a step, a model input or a constant).
        constants: Values that are model outputs without a producing node (initializers).
    """

    def __init__(self, steps: Sequence[tuple[Executable, Sequence[str], Sequence[str]]],
                 input_names: Sequence[str], output_names: Sequence[str],
                 constants: Mapping[str, Any] | None = None) -> None:
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self._constants = dict(constants or {})
        keep = set(self.output_names)
        last_use: dict[str, int] = {}
        for k, (_, ins, _) in enumerate(steps):
            for name in ins:
                last_use[name] = k
        free: list[list[str]] = [[] for _ in steps]
        for name, k in last_use.items():
            if name not in keep:
                free[k].append(name)
        self.steps = [Step(exe, tuple(ins), tuple(outs), tuple(free[k]))
                      for k, (exe, ins, outs) in enumerate(steps)]

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Run the parts in order, each on the values it reads; return the graph outputs in order.

        A value is dropped after the last part that reads it, unless it is a graph output.
        """
        env = dict(feeds)
        if self._constants:
            env.update(self._constants)
        for step in self.steps:
            results = step.executable.run({n: env[n] for n in step.inputs if n in env})
            env.update(zip(step.outputs, results))
            for name in step.free:
                env.pop(name, None)
        return [env[n] for n in self.output_names]

    def close(self) -> None:
        """Close every part's executable."""
        for step in self.steps:
            step.executable.close()


def compile_parts(model: Model, typed: ir.Model, partition: Partition,
                  options_of: Callable[[Candidate], dict[str, Any]]) -> list[tuple[Executable, Part]]:
    """Compile every partition with its backend.

    Raises:
        BackendError: HYB-304 naming the partition a backend could not compile (with ``.part``).
    """
    proto = ir.serde.serialize_model(typed)
    compiled = []
    try:
        for k, part in enumerate(partition.parts):
            sub = submodel(proto, typed.graph, part, f"{model.name}.part{k}")
            backend = get_backend(part.label.backend)
            try:
                compiled.append((backend.compile(sub, part.label.device, options_of(part.label)), part))
            except BackendError as e:
                err = BackendError("HYB-304", f"partition {k} ({len(part.nodes)} nodes) failed to compile on "
                                   f"{part.label}: {e.message}", e.hint)
                err.part = part  # type: ignore[attr-defined]
                raise err from e
    except BaseException:
        for exe, _ in compiled:
            exe.close()
        raise
    return compiled


def compile_partitioned(model: Model, typed: ir.Model, able: list[tuple[Candidate, ...]], order: list[Candidate],
                        options_of: Callable[[Candidate], dict[str, Any]], notes: list[str],
                        ) -> tuple[PartitionedExecutable, Plan, Partition]:
    """Partition ``typed``, compile every part and assemble the executor.

    A backend that fails to compile its part loses those nodes, which are partitioned again (at most
    :data:`MAX_ATTEMPTS` times); what happened is appended to ``notes``. When ONNX Runtime shares the
    process with other partitions, its sessions do not spin (DESIGN 4) unless the user said otherwise:
    each backend's :meth:`~hybrid.hal.Backend.shared_options` apply under the user's options.

    Raises:
        BackendError: HYB-305 when a node has no backend left, HYB-304 when compiling keeps failing.
    """
    able = list(able)
    for _ in range(MAX_ATTEMPTS):
        partition = partition_graph(typed.graph, able, order)
        parts = partition.parts
        mixed = len(parts) > 1

        def opts(c: Candidate, mixed: bool = mixed) -> dict[str, Any]:
            shared = get_backend(c.backend).shared_options() if mixed else {}
            return {**shared, **options_of(c)}

        try:
            compiled = compile_parts(model, typed, partition, opts)
        except BackendError as e:
            part = getattr(e, "part", None)
            if part is None:
                raise
            notes.append(e.message)
            for i in part.nodes:
                able[i] = tuple(c for c in able[i] if c != part.label)
            continue
        graph = typed.graph
        constants = {v.name: v.const_value.numpy() for v in graph.outputs
                     if v.name in graph.initializers and v.const_value is not None}
        exe = PartitionedExecutable([(e, p.inputs, e.output_names) for e, p in compiled],
                                    model.signature.input_names, model.signature.output_names, constants)
        names = [node_label(n, i) for i, n in enumerate(graph)]
        return exe, Plan(partition.segments(names), placements=partition.placements), partition
    raise BackendError("HYB-304", f"could not compile the partitions of {model.name!r} after {MAX_ATTEMPTS} "
                       "attempts", "see the notes in the log; try a single-backend target")
