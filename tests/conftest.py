"""Shared test setup: hardware markers skip with a stated reason, never pass vacuously.

``whole_gpu`` tests measure or fill the device's free memory, which other processes on the GPU change:
under pytest-xdist with more than one worker they skip with the reason (``make test-gpu`` runs them
alone, before the parallel pass). ``--live-report=SECONDS`` prints each failure or error the moment it
is reported, and each test that took longer than SECONDS, so a run cut short still names them
(``make test-gpu`` turns it on).
"""

from __future__ import annotations

import functools
import os

import pytest

_live: dict[str, object] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--live-report",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="print each failure when it happens and each test slower than SECONDS (0: off)",
    )
    parser.addoption(
        "--large-models",
        action="store_true",
        default=False,
        help="run the large_model tests (a real model past protobuf's 2 GB: minutes and ~16 GB of memory)",
    )


def pytest_configure(config: pytest.Config) -> None:
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:  # an xdist worker: its share of the cores, not torch's default of all of them each
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // workers))
    seconds = config.getoption("--live-report", 0.0)
    if seconds and not hasattr(config, "workerinput"):  # the controller prints (xdist workers have no tty)
        _live.update(seconds=seconds, config=config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _live.get("config")
    if config is None or report.skipped:
        return
    terminal = config.pluginmanager.get_plugin("terminalreporter")  # type: ignore[attr-defined]
    if terminal is None:
        return
    node = getattr(report, "node", None)  # (under xdist: the worker that ran it)
    where = f"[{node.gateway.id}] " if node is not None else ""
    if report.failed:
        kind = "FAILED" if report.when == "call" else f"ERROR at {report.when}"
        terminal.write("\n")  # (off the progress dots' line)
        terminal.write_line(f"{where}{kind} {report.nodeid} ({report.duration:.1f} s)", red=True, bold=True)
    elif report.when == "call" and report.duration > float(_live["seconds"]):  # type: ignore[arg-type]
        terminal.write("\n")
        terminal.write_line(f"{where}SLOW {report.nodeid} ({report.duration:.1f} s)", yellow=True)


@functools.lru_cache(maxsize=1)
def _gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "needs a CUDA device (none here); run `make test-gpu` on the H200 via the device tool"
    return None


@functools.lru_cache(maxsize=1)
def _trt_build_reason() -> str | None:
    from trtforge.core.backend import BackendUnavailableError, get_backend

    try:
        backend = get_backend()
    except BackendUnavailableError as e:
        return f"no TensorRT backend importable: {e}"
    caps = backend.capabilities
    return None if caps.can_build else f"{backend.name} cannot build here: {caps.build_reason}"


@functools.lru_cache(maxsize=1)
def _trt_run_reason() -> str | None:
    from trtforge.core.backend import BackendUnavailableError, get_backend

    try:
        backend = get_backend()
    except BackendUnavailableError as e:
        return f"no TensorRT backend importable: {e}"
    caps = backend.capabilities
    return (
        None if caps.can_run else f"no GPU that {backend.name} {backend.version} runs on: {caps.run_reason}"
    )


_REASONS = {"gpu": _gpu_reason, "trt_build": _trt_build_reason, "trt_run": _trt_run_reason}


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("large_model") is not None and not item.config.getoption("--large-models"):
        pytest.skip(
            "[large_model] compiles a real model past protobuf's 2 GB (minutes, up to ~16 GB of memory), too "
            "slow for `make test`: run it alone with `pytest --large-models -n 0 -k NAME`"
        )
    for marker, reason_fn in _REASONS.items():
        if item.get_closest_marker(marker) is not None:
            reason = reason_fn()
            if reason:
                pytest.skip(f"[{marker}] {reason}")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if item.get_closest_marker("whole_gpu") is not None and workers > 1:
        pytest.skip(
            f"[whole_gpu] measures or fills the GPU's free memory, which the other {workers - 1} xdist "
            "workers change: `make test-gpu` runs it alone, before the parallel pass (or run it without -n)"
        )


@pytest.fixture(autouse=True, scope="module")
def _no_engine_left_open(request: pytest.FixtureRequest):
    """Fail a test module that leaves an LLMEngine open: its loop thread and its heap freeze would outlive
    the module and skew the garbage collection of every later test in the process (test_gc_heap's cases
    skip then). Per module, not per test: a module may share one engine between its tests (a fixture that
    starts it on first use and closes it at the module's end)."""
    from trtforge.llm import gc_heap

    before = gc_heap.holders()
    yield
    left = gc_heap.holders() - before
    assert left <= 0, f"{request.node.nodeid}: {left} LLMEngine(s) left open (close them, or use `with`)"
