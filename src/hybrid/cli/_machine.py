"""The machine a benchmark ran on, in one line: CPU model, cores, the vector and matrix units that decide speed.

AMX (Sapphire Rapids and later Xeons) and AVX-512 (its BF16 and VNNI parts) change which runtime and
precision wins; a figure read without them cannot be compared with one from another machine.
"""

from __future__ import annotations

import os
import platform

__all__ = ["ISA_FLAGS", "cpu_flags", "machine_line", "physical_cores"]

# /proc/cpuinfo flag -> the name a reader knows, in the order shown
ISA_FLAGS = {"amx_tile": "AMX", "amx_bf16": "AMX-BF16", "amx_int8": "AMX-INT8", "avx512f": "AVX-512",
             "avx512_bf16": "AVX512-BF16", "avx512_vnni": "AVX512-VNNI", "avx512_fp16": "AVX512-FP16",
             "avx2": "AVX2", "avx_vnni": "AVX-VNNI", "asimd": "NEON", "sve": "SVE"}


def _cpuinfo() -> list[tuple[str, str]]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in f)]
    except OSError:
        return []


def cpu_flags() -> set[str]:
    """The first CPU's feature flags (x86 'flags', ARM 'Features'); empty where the system does not say."""
    for key, value in _cpuinfo():
        if key in ("flags", "features"):
            return set(value.split())
    return set()


def physical_cores() -> int | None:
    """Distinct (package, core) pairs in /proc/cpuinfo; None where it does not list them."""
    pairs, package = set(), "0"
    for key, value in _cpuinfo():
        if key == "physical id":
            package = value
        elif key == "core id":
            pairs.add((package, value))
    return len(pairs) or None


def machine_line() -> str:
    """'AMD EPYC, 2 cores (2 logical), x86_64, AMX no, AVX-512 no; has AVX2' and the like."""
    from hybrid.hal.machine import cpu_facts

    flags = cpu_flags()
    logical = os.cpu_count() or 1
    physical = physical_cores()
    cores = f"{physical} cores ({logical} logical)" if physical else f"{logical} logical cores"
    has = [name for flag, name in ISA_FLAGS.items() if flag in flags]
    units = f"AMX {'yes' if 'amx_tile' in flags else 'no'}, AVX-512 {'yes' if 'avx512f' in flags else 'no'}"
    return (f"{cpu_facts()[0]}, {cores}, {platform.system()} {platform.machine()}, {units}"
            + (f"; has {', '.join(has)}" if has else ""))
