"""Shared CLI option readers (trtforge.cli._options)."""

from __future__ import annotations

from trtforge.cli._options import read_prompt_ids


def test_a_prompt_id_file_with_a_byte_order_mark_and_crlf_lines_is_read(tmp_path):
    """Notepad's UTF-8 (a BOM, CRLF lines). Before: the BOM stuck to the first id, and the file was
    refused: "invalid literal for int() with base 10: '\\ufeff1'"."""
    path = tmp_path / "p.txt"
    path.write_bytes("\ufeff1 2 3\r\n\r\n4 5\r\n".encode())
    assert read_prompt_ids(str(path)) == [[1, 2, 3], [4, 5]]
