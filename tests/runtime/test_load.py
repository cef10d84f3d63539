"""load(): manifest, sha256/size, backend and version, can-run and plugin checks, in that order."""

from __future__ import annotations

import sys
import types

import pytest

from trtforge._fileio import sha256_bytes
from trtforge.core import backend as backend_mod
from trtforge.core.manifest import write_manifest
from trtforge.errors import UserError
from trtforge.runtime import engine as engine_mod
from trtforge.runtime import load
from trtforge.runtime.standin import standin_manifest

DATA = b"not really an engine, but bytes with a hash" * 10


def _write(tmp_path, data=DATA, backend=None, plugins=()):
    path = tmp_path / "m.engine"
    path.write_bytes(data)
    m = standin_manifest(streams=2)
    m.engine_file, m.engine_bytes, m.engine_sha256 = path.name, len(data), sha256_bytes(data)
    m.backend = backend or {"name": "tensorrt", "version": "11.1.0"}
    m.plugins = list(plugins)
    write_manifest(m, path)
    return path


class _FakeBackend:
    def __init__(self, name="tensorrt", version="11.1.0", can_run=True):
        self.name, self.version = name, version
        self.capabilities = types.SimpleNamespace(can_run=can_run, run_reason="no GPU here (test)")


@pytest.fixture
def fake_backend(monkeypatch):
    holder = {"backend": _FakeBackend()}
    monkeypatch.setattr(backend_mod, "get_backend", lambda name=None: holder["backend"])
    return holder


def test_missing_manifest(tmp_path):
    p = tmp_path / "x.engine"
    p.write_bytes(DATA)
    with pytest.raises(UserError, match=r"has no manifest .*x\.engine\.json"):
        load(p)


def test_truncated_engine_is_refused_before_any_backend_work(tmp_path, fake_backend):
    p = _write(tmp_path)
    p.write_bytes(DATA[:-7])
    fake_backend["backend"] = None  # would crash if reached
    with pytest.raises(UserError, match="truncated or modified"):
        load(p)


def test_modified_engine_same_size_is_refused(tmp_path):
    p = _write(tmp_path)
    p.write_bytes(DATA[:-1] + b"!")
    with pytest.raises(UserError, match=r"does not match its manifest: 430 bytes with sha256"):
        load(p)


def test_engine_from_another_backend(tmp_path, fake_backend):
    fake_backend["backend"] = _FakeBackend("tensorrt_rtx", "1.7.1")
    with pytest.raises(UserError, match="do not move between TensorRT and TensorRT-RTX"):
        load(_write(tmp_path))


def test_engine_from_another_version(tmp_path, fake_backend):
    with pytest.raises(UserError, match=r"built with TensorRT 10\.9\.0; this is TensorRT 11\.1\.0"):
        load(_write(tmp_path, backend={"name": "tensorrt", "version": "10.9.0"}))


def test_backend_not_installed(tmp_path, monkeypatch):
    def missing(name=None):
        raise backend_mod.BackendUnavailableError(f"{name} is not importable")

    monkeypatch.setattr(backend_mod, "get_backend", missing)
    with pytest.raises(UserError, match=r"built with tensorrt 11\.1\.0, which is not importable here"):
        load(_write(tmp_path))


def test_cannot_run_here(tmp_path, fake_backend):
    fake_backend["backend"] = _FakeBackend(can_run=False)
    with pytest.raises(UserError, match=r"cannot run engines here: no GPU here \(test\)"):
        load(_write(tmp_path))


def test_missing_plugin_provider_is_reported_before_deserializing(tmp_path, fake_backend, monkeypatch):
    monkeypatch.setitem(sys.modules, "trtforge.plugins.attention.plugin", None)  # import fails
    p = _write(tmp_path, plugins=[{"name": "FlashAttention", "version": "1", "namespace": "trtforge"}])
    with pytest.raises(UserError, match="needs trtforge plugins"):
        load(p)


def test_checks_pass_then_deserializes_through_the_adapter(tmp_path, fake_backend, monkeypatch):
    seen = {}

    class FakeTrtEngine:
        num_aux_streams = 0
        data_dependent_outputs = frozenset()

        def __init__(self, backend, data, manifest, *, label):
            seen.update(backend=backend, data=data, label=label)

        def device_memory_size_for_profile(self, p):
            return 1000 + p

    from trtforge.runtime import trt_context

    monkeypatch.setattr(trt_context, "TrtEngine", FakeTrtEngine)
    eng = load(_write(tmp_path))
    assert seen["data"] == DATA and seen["backend"] is fake_backend["backend"]
    assert isinstance(eng, engine_mod.Engine)
    assert [s.name for s in eng.inputs] == ["x"] and eng.inputs[0].shape == (-1, 64)
    assert eng.streams == 2 and len(eng.profiles) == 1
    assert eng.profiles[0]["x"].max == [32, 64]
    assert eng.device_memory_for_profile(0) == 1000
    d = eng.describe()
    assert d["device_memory_per_profile"] == [1000] and d["streams"] == 2
    with pytest.raises(UserError, match="--streams 3"):
        eng.session(streams=3)


def test_a_directory_is_not_an_engine(tmp_path):
    """load(DIR) and load(x.engine/) read as "has no manifest 'DIR.json'", as if the file were fine."""
    (tmp_path / "x.engine").mkdir()
    for path in (tmp_path, tmp_path / "x.engine"):
        with pytest.raises(UserError, match=r"engine '.*' is a directory; expected an engine file"):
            load(path)


def test_the_manifest_given_instead_of_the_engine(tmp_path):
    """load('m.engine.json') said the engine had no manifest 'm.engine.json.json'."""
    p = _write(tmp_path)
    with pytest.raises(UserError, match=r"m\.engine\.json' is an engine's manifest; give the engine '"):
        load(p.with_name("m.engine.json"))


def test_a_manifest_that_is_a_directory(tmp_path):
    (tmp_path / "m.engine").write_bytes(DATA)
    (tmp_path / "m.engine.json").mkdir()
    with pytest.raises(UserError, match=r"manifest '.*m\.engine\.json' of engine '.*' is a directory"):
        load(tmp_path / "m.engine")


def test_load_refuses_a_manifest_argument_of_the_wrong_kind(tmp_path):
    """load(path, manifest={...}) was AttributeError: 'dict' object has no attribute 'engine_bytes'."""
    p = _write(tmp_path)
    with pytest.raises(UserError, match=r"load\(manifest=\.\.\.\) must be the engine's Manifest .*got dict"):
        load(p, manifest={"engine_bytes": 1})


def test_io_dtype_the_runtime_cannot_bind_is_refused_before_backend_work(tmp_path, fake_backend):
    """The manifest admits int4 / float4_e2m1 I/O, which no torch dtype binds: it was a ValueError from
    building the Engine, after the engine was deserialized."""
    from trtforge.core.manifest import read_manifest

    p = _write(tmp_path)
    m = read_manifest(p)
    m.outputs[1].dtype = "int4"
    write_manifest(m, p)
    fake_backend["backend"] = None  # would crash if reached
    with pytest.raises(UserError, match=r"I/O tensor s: dtype 'int4' has no torch equivalent.*cannot run"):
        load(p)
