"""The host CPU's vector ISA, recorded next to latency measured with FAST sessions (whose kernels and
int8 arithmetic ONNX Runtime picks by ISA), so two latency tables say whether they are comparable."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# /proc/cpuinfo flag -> the name reports use, in the order they are listed.
_FLAGS = (
    ("sse4_2", "SSE4.2"),
    ("avx", "AVX"),
    ("avx2", "AVX2"),
    ("fma", "FMA"),
    ("avx512f", "AVX-512"),
    ("avx512_vnni", "AVX512-VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx512_bf16", "AVX512-BF16"),
    ("avx512_fp16", "AVX512-FP16"),
    ("amx_tile", "AMX"),
    ("amx_int8", "AMX-INT8"),
    ("amx_bf16", "AMX-BF16"),
    ("asimd", "NEON"),
    ("asimddp", "NEON-DOTPROD"),
    ("sve", "SVE"),
    ("i8mm", "I8MM"),
)
_CPUINFO = Path("/proc/cpuinfo")


def isa_from_flags(flags: set[str]) -> list[str]:
    """The ISA extensions named in `flags` (cpuinfo spelling) that matter to int8/float kernels."""
    return [name for flag, name in _FLAGS if flag in flags]


@functools.cache
def cpu_isa() -> dict[str, object]:
    """{'model', 'arch', 'isa': [...], 'source'}; 'isa' is empty where the flags cannot be read."""
    model, flags = "", set()
    try:
        for line in _CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {
        "model": model or platform.processor() or "unknown",
        "arch": platform.machine(),
        "isa": isa_from_flags(flags),
        "source": "/proc/cpuinfo flags" if flags else "not available on this system",
    }


def isa_summary() -> str:
    """A short label such as 'x86_64 AVX2 FMA' for table rows (no SSE/AVX baseline noise)."""
    info = cpu_isa()
    isa = [x for x in info["isa"] if x not in ("SSE4.2", "AVX")]  # type: ignore[union-attr]
    return " ".join([str(info["arch"]), *isa]) if isa else f"{info['arch']} (ISA unknown)"
