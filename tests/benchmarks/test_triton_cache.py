"""benchmarks/triton_cache.py: the archive keeps what a cache hit loads, and a restored cache hits."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile

import pytest

from benchmarks import triton_cache as tc
from tests.kernels._sm90 import needs_ptxas, run_in_child


def _fake_cache(root, key="ABC"):
    d = root / key
    d.mkdir(parents=True)
    for name in ("k.json", "k.cubin", "launcher.so", "k.llir", "k.ptx", "k.ttgir", "k.source"):
        (d / name).write_bytes(os.urandom(64))
    children = {n: str(d / n) for n in ("k.json", "k.cubin", "k.llir", "k.ptx", "k.ttgir", "k.source")}
    (d / "__grp__k.json").write_text(json.dumps({"child_paths": children}))
    (d / "lock").write_text("")
    (d / "k.cubin.tmp.pid_1_x").write_bytes(b"half")
    return d


def test_save_keeps_binaries_and_metadata_and_drops_ir(tmp_path):
    _fake_cache(tmp_path / "cache")
    out = tmp_path / "out" / "c.txz"
    got = tc.save(tmp_path / "cache", out)
    assert got["entries"] == 1 and got["files"] == 4
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == ["ABC/__grp__k.json", "ABC/k.cubin", "ABC/k.json", "ABC/launcher.so"]
    assert tc.load(out, tmp_path / "restored") == {"entries": 1, "files": 4}
    assert (tmp_path / "restored/ABC/k.cubin").read_bytes() == (tmp_path / "cache/ABC/k.cubin").read_bytes()
    group = json.loads((tmp_path / "restored/ABC/__grp__k.json").read_text())["child_paths"]
    assert group["k.cubin"] == str(tmp_path / "restored/ABC/k.cubin")  # pointed at where it now lies


def test_save_over_the_cap_writes_nothing(tmp_path):
    _fake_cache(tmp_path / "cache")
    with pytest.raises(ValueError, match="over --max-mib"):
        tc.save(tmp_path / "cache", tmp_path / "c.txz", max_mib=1e-6)
    assert list(tmp_path.iterdir()) == [tmp_path / "cache"]
    assert tc.main(["save", str(tmp_path / "c.txz"), "--cache-dir", str(tmp_path / "nothing")]) == 1


def test_load_refuses_members_outside_the_cache(tmp_path):
    bad = tmp_path / "bad.txz"
    with tarfile.open(bad, "w:xz") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    assert tc.main(["load", str(bad), "--cache-dir", str(tmp_path / "cache")]) == 1
    assert not (tmp_path / "escaped").exists()


def _compile_tiny(cache: str) -> dict:
    """In a child: compile a small kernel for sm_90 with Triton's cache at `cache`; whether it was a
    cache hit, a hash of its binary, and whether compile_sm90 still gives its PTX."""
    import hashlib

    import triton
    import triton.language as tl
    from triton.compiler import ASTSource

    from tests.kernels._sm90 import compile_sm90

    @triton.jit
    def scale(X, Y, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * 2.0, mask=offs < n)

    hits = []
    triton.knobs.cache.dir = cache
    triton.knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    src = ASTSource(fn=scale, signature={"X": "*fp32", "Y": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                    constexprs={"BLOCK": 128})  # fmt: skip
    kernel = compile_sm90(src, {"num_warps": 4})
    cubin = hashlib.sha256(kernel.asm["cubin"]).hexdigest()
    return {"hits": hits, "cubin": cubin, "ptx": "ptx" in kernel.asm}


@pytest.mark.slow
def test_a_restored_cache_is_a_hit_on_a_fresh_directory(tmp_path):
    needs_ptxas()
    first = run_in_child("tests.benchmarks.test_triton_cache:_compile_tiny", str(tmp_path / "a"), fresh=True)
    assert first["hits"] == [False] and first["ptx"]
    tc.save(tmp_path / "a", tmp_path / "c.txz")
    shutil.rmtree(tmp_path / "a")  # the group files named children there: a hit must not need them
    tc.load(tmp_path / "c.txz", tmp_path / "b")
    again = run_in_child("tests.benchmarks.test_triton_cache:_compile_tiny", str(tmp_path / "b"), fresh=True)
    assert again["hits"][0] is True, json.dumps(again)
    assert again["cubin"] == first["cubin"]
    assert again["ptx"] and again["hits"][1:] == [False]  # the PTX reader compiled it anew
