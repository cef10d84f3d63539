"""Shared test setup: hardware markers skip with a stated reason, never pass vacuously."""

from __future__ import annotations

import functools

import pytest


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
    for marker, reason_fn in _REASONS.items():
        if item.get_closest_marker(marker) is not None:
            reason = reason_fn()
            if reason:
                pytest.skip(f"[{marker}] {reason}")
