"""The CPU ISA recorded next to fast-session latency."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtforge.numerics.cpu import cpu_isa, isa_from_flags, isa_summary


def test_flags_map_to_isa_names():
    flags = {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "ht"}
    assert isa_from_flags(flags) == [
        "SSE4.2",
        "AVX",
        "AVX2",
        "FMA",
        "AVX-512",
        "AVX512-VNNI",
        "AMX",
        "AMX-INT8",
    ]
    assert isa_from_flags({"avx2", "avx_vnni"}) == ["AVX2", "AVX-VNNI"]


def test_this_machine_reported_as_its_cpuinfo_says():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo on this system")
    flags = set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith(("flags", "Features")):
            flags = set(line.split(":", 1)[1].split())
            break
    info = cpu_isa()
    assert info["isa"] == isa_from_flags(flags)
    assert ("AVX2" in isa_summary()) == ("avx2" in flags)
    assert ("AVX-512" in isa_summary()) == ("avx512f" in flags)
