"""Backend adapter: selection, errors naming the pip command, capabilities, no TensorRT at import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trtforge.core import backend as backend_mod
from trtforge.core.backend import BackendUnavailableError, get_backend

HIDE_TRT = textwrap.dedent(
    """
    import sys, importlib.abc
    class _Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorrt", "tensorrt_rtx", "tensorrt_rtx_bindings"):
                raise ImportError(f"hidden for the test: {name}")
    sys.meta_path.insert(0, _Hide())
    """
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HIDE_TRT + textwrap.dedent(code)], capture_output=True, text=True
    )


def test_import_and_help_without_tensorrt() -> None:
    proc = _run(
        """
        import trtforge
        assert "torch" not in sys.modules and "onnx" not in sys.modules, "import trtforge must stay light"
        from trtforge.cli.main import main
        rc = main(["--help"])
        assert rc == 0, rc
        assert not any(m.startswith("tensorrt") for m in sys.modules)
        print("OK", trtforge.__version__)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "OK 0.1.0" in proc.stdout
    assert "compile" in proc.stdout and "inspect" in proc.stdout


def test_missing_backend_names_pip_command() -> None:
    proc = _run(
        """
        from trtforge.core.backend import get_backend, BackendUnavailableError
        try:
            get_backend()
        except BackendUnavailableError as e:
            print("ERR", e)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install tensorrt-rtx" in proc.stdout and "pip install tensorrt" in proc.stdout


def test_compile_without_backend_exits_2(tmp_path) -> None:
    from tests.models import tiny_onnx

    model = tiny_onnx(tmp_path / "m.onnx")
    proc = _run(
        f"""
        from trtforge.cli.main import main
        sys.exit(main(["compile", {str(model)!r}, "-o", {str(tmp_path / "m.engine")!r}]))
        """
    )
    assert proc.returncode == 2, proc.stderr
    assert "pip install tensorrt-rtx" in proc.stderr
    assert not (tmp_path / "m.engine").exists()


def test_unknown_backend_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(backend_mod.BACKEND_ENV, "tensorflow")
    with pytest.raises(BackendUnavailableError, match="unknown TensorRT backend 'tensorflow'"):
        get_backend()


@pytest.mark.parametrize("by_env", [True, False], ids=["by TRTFORGE_BACKEND", "by argument"])
def test_forced_missing_backend(monkeypatch: pytest.MonkeyPatch, by_env: bool) -> None:
    """A missing backend is named as it was asked for. Before: `--backend tensorrt` (get_backend's
    argument), with TRTFORGE_BACKEND unset, read "TRTFORGE_BACKEND=tensorrt was requested ... or unset
    TRTFORGE_BACKEND": a variable the user never set."""
    real_import = backend_mod._import

    def fake_import(name: str):
        if name == "tensorrt":
            raise ImportError("no datacenter TensorRT here")
        return real_import(name)

    monkeypatch.setattr(backend_mod, "_import", fake_import)
    monkeypatch.delenv(backend_mod.BACKEND_ENV, raising=False)
    if by_env:
        monkeypatch.setenv(backend_mod.BACKEND_ENV, "tensorrt")
    backend_mod._load.cache_clear()
    try:
        with pytest.raises(BackendUnavailableError) as info:
            get_backend(None if by_env else "tensorrt")
    finally:
        backend_mod._load.cache_clear()
    message = str(info.value)
    assert "Python module 'tensorrt' is not importable" in message and "pip install tensorrt" in message
    if by_env:
        assert "TRTFORGE_BACKEND=tensorrt was requested" in message and "unset TRTFORGE_BACKEND" in message
    else:
        assert "TensorRT backend 'tensorrt' was requested" in message and "TRTFORGE_BACKEND" not in message


@pytest.mark.trt_build
def test_rtx_capabilities_on_this_machine() -> None:
    b = get_backend("tensorrt_rtx")
    caps = b.capabilities
    assert b.is_rtx and b.version.startswith("1.")
    assert caps.can_build and caps.strongly_typed_only and not caps.timing_cache
    assert not caps.can_host_plugins and "add_plugin_v3" in caps.plugin_reason
    gpu = backend_mod.probe_gpu()
    if not gpu.present:
        assert not caps.can_run and caps.run_reason == gpu.reason
    d = b.describe()
    assert d["name"] == "tensorrt_rtx" and d["capabilities"]["can_build"] is True


def test_rtx_refuses_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorRT-RTX does not run on CC 9.0 (the lent H200): capabilities must say so."""
    pytest.importorskip("tensorrt_rtx")
    monkeypatch.setattr(backend_mod, "probe_gpu", lambda: backend_mod.GpuInfo(True, "H200", (9, 0)))
    b = backend_mod.Backend("tensorrt_rtx", __import__("tensorrt_rtx"))
    assert not b.capabilities.can_run
    assert "9.0" in b.capabilities.run_reason
    monkeypatch.setattr(backend_mod, "probe_gpu", lambda: backend_mod.GpuInfo(True, "RTX 4090", (8, 9)))
    assert backend_mod.Backend("tensorrt_rtx", __import__("tensorrt_rtx")).capabilities.can_run


def test_native_stderr_collects_the_librarys_own_lines_and_lets_pythons_through(capfd) -> None:
    """TensorRT-RTX writes "Internal Error: MyelinCheckException ..." to descriptor 2 itself, past the
    ILogger; native_stderr collects such lines while Python's stderr still reaches the terminal."""
    import os
    import sys

    from trtforge.core.backend import native_stderr

    lines: list[str] = []
    with native_stderr(lines):
        os.write(2, b"Internal Error: from the library\n\n")
        print("from python", file=sys.stderr, flush=True)
    print("after", file=sys.stderr, flush=True)
    err = capfd.readouterr().err
    assert lines == ["Internal Error: from the library"]
    assert "from python" in err and "after" in err and "from the library" not in err


def test_a_stream_taken_during_native_stderr_still_writes_after_it() -> None:
    """A handler made during a build holds the stand-in sys.stderr: it is flushed, not closed, at the end,
    so the handler's later lines still reach the terminal instead of failing on a closed file. (In a child
    process: under pytest's capture sys.stderr is not descriptor 2, and no stand-in is made.)"""
    code = (
        "import logging, sys\n"
        "from trtforge.core.backend import native_stderr\n"
        "with native_stderr([]):\n"
        "    handler = logging.StreamHandler()\n"
        "    print('during', file=sys.stderr)\n"
        "handler.emit(logging.makeLogRecord({'msg': 'later line', 'levelno': logging.WARNING}))\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root)
    assert done.returncode == 0, done.stderr
    assert "during" in done.stderr and "later line" in done.stderr, done.stderr
    assert "closed file" not in done.stderr, done.stderr


@pytest.mark.trt_build
def test_the_tensorrt_logger_passes_messages_on_at_their_levels(caplog) -> None:
    """Before: INFO and VERBOSE messages were dropped and warnings only kept; now every message goes to
    the trtforge.tensorrt log at its level (the CLI shows the warnings)."""
    import logging

    from trtforge.core.backend import get_backend

    be = get_backend()
    sev = be.trt.ILogger.Severity
    be.logger.take()
    with caplog.at_level(logging.DEBUG, logger="trtforge.tensorrt"):
        for s in (sev.VERBOSE, sev.INFO, sev.WARNING, sev.ERROR, sev.INTERNAL_ERROR):
            be.logger.log(s, f"m{int(s)}")
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "trtforge.tensorrt"]
    assert got == [
        (logging.DEBUG, "m4"),
        (logging.INFO, "m3"),
        (logging.WARNING, "m2"),
        (logging.ERROR, "m1"),
        (logging.CRITICAL, "m0"),
    ]
    assert [m for _, m in be.logger.take()] == ["m2", "m1", "m0"]  # (kept for build records and errors)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="trtforge.tensorrt"):  # (every step engine's parse had 4)
        be.logger.log(sev.WARNING, "ModelImporter.cpp:1071: Make sure input input_ids has Int64 binding.")
    assert [r.levelno for r in caplog.records if r.name == "trtforge.tensorrt"] == [logging.INFO]
    be.logger.take()


def test_the_cli_shows_tensorrt_warnings_only(capsys) -> None:
    import logging

    from trtforge.cli._errors import _tensorrt_warnings_as_lines

    log = logging.getLogger("trtforge.tensorrt")
    with _tensorrt_warnings_as_lines():
        log.debug("verbose detail")
        log.info("Total Activation Memory: 8198144 bytes")
        log.warning("a real warning")
        log.error("an error the build recovered from (a failed one raises it)")
    log.warning("outside the command")
    err = capsys.readouterr().err
    assert err == "warning: TensorRT: a real warning\n"
