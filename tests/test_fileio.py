"""Atomic writes: all or nothing, usual permissions."""

from __future__ import annotations

import os

import pytest

from trtforge._fileio import atomic_open, atomic_write_bytes, check_output_path
from trtforge.errors import UserError


def test_atomic_write_leaves_nothing_on_failure(tmp_path) -> None:
    def crash_mid_write() -> None:
        with atomic_open(tmp_path / "out.bin") as f:
            f.write(b"partial")
            raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        crash_mid_write()
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_permissions_follow_umask(tmp_path) -> None:
    atomic_write_bytes(tmp_path / "a.bin", b"x")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "a.bin").stat().st_mode & 0o777 == 0o666 & ~mask


def test_check_output_path(tmp_path) -> None:
    (tmp_path / "exists").write_text("x")
    with pytest.raises(UserError, match="already exists"):
        check_output_path(tmp_path / "exists", force=False)
    assert check_output_path(tmp_path / "exists", force=True) == tmp_path / "exists"
    with pytest.raises(UserError, match="is a directory"):
        check_output_path(tmp_path, force=True)
