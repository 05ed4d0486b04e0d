"""Runs a partitioned model: each partition's executable in order, values handed over as they are.

On one host every backend reads and writes numpy arrays, so a boundary value produced by one
partition is passed to the next as the very same array object: no copy, no conversion. Each value
is dropped after its last use (computed once, STYLE habit 8), so peak memory stays that of the
largest partition plus the live boundary values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hybrid.hal.backend import Executable

__all__ = ["PartitionedExecutable", "Step"]


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
        for step in self.steps:
            step.executable.close()
