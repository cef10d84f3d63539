"""The ncu export summaries of benchmarks/probe_decode_ncu.py, on small hand-written exports (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.probe_decode_ncu import summarize_sass

SASS = """"Kernel Name","_int4_mma_kernel"
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"
"0x10","LDG.E.128 R4, desc[UR4][R2.64]","120","100"
"0x20","@P0 HMMA.16816.F32.BF16 R8, R4, R6, R8","300","250"
"0x30","HMMA.16816.F32.BF16 R12, R4, R6, R12","1,000","900"
"0x40","LOP3.LUT R1, R2, 0xf000f, R3, 0xea, !PT","10","2"
"""


def test_sass_summary_sums_stalls_by_opcode_and_ranks_instructions(tmp_path: Path, capsys) -> None:
    path = tmp_path / "sass.csv"
    path.write_text(SASS)
    summarize_sass(path, top=2)
    out = capsys.readouterr().out.splitlines()
    ops = out[1:3]
    assert ops == ["HMMA | 1300 | 1150", "LDG | 120 | 100"]  # predicated HMMA counted as HMMA; top 2
    ranked = out[5:7]
    assert ranked[0].startswith("HMMA.16816.F32.BF16 R12") and ranked[0].endswith("| 1,000 | 900")
    assert ranked[1].startswith("@P0 HMMA")


def test_sass_summary_refuses_an_export_without_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "raw.csv"
    path.write_text('"ID","Kernel Name"\n"0","k"\n')
    with pytest.raises(SystemExit, match="no 'Source' column"):
        summarize_sass(path)
