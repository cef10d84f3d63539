"""Fixtures of the server tests."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest


@pytest.fixture
def built_state(monkeypatch) -> Callable[..., Any]:
    """``built_state(tokenizer, name, options, *rest)``: the state ``trtforge.llm.server.run.run`` builds its
    app from, over a stand-in engine (max_model_len 64, 2 sequences), stopped where the app would be built:
    what a test of the serving options reads. Needs the [serve] extra (fastapi)."""
    pytest.importorskip("fastapi", reason="trtforge serve needs the [serve] extra (fastapi)")
    server_run = importlib.import_module("trtforge.llm.server.run")  # (the package exports a function `run`)
    states = []

    class Built(Exception):
        """Raised in place of building the app: the state is all the test reads."""

    def create_app(state):
        states.append(state)
        raise Built

    monkeypatch.setattr(server_run, "create_app", create_app)
    engine = SimpleNamespace(
        max_model_len=64, config=SimpleNamespace(max_num_seqs=2), enable_structured_output=lambda tok: None
    )
    llm = SimpleNamespace(engine=engine)

    def build(tokenizer: Any, name: str, options: Any, *rest: Any) -> Any:
        with pytest.raises(Built):
            server_run.run(llm, tokenizer, name, options, *rest)
        return states[-1]

    return build
