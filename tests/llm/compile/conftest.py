"""Shared setup of the step-graph compile tests: one compile per tiny step graph.

The FP32 and FP16 slot-layout step graphs of a tiny model (tests/llm/tiny_models.py) are read, never
changed, by several tests (the FP16 accuracy check, the external-data, INT8, paged and paged-engine
references): `step_graph` compiles each once per test process and hands its path to every test that
asks for it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import trtforge
from tests.llm.tiny_models import tiny_model

# the step-graph options the compile tests' references use (prompts of up to 17 tokens plus 24 new ones)
GRAPH_OPTIONS = {"max_seq": 64, "max_batch": 4, "max_prefill": 32, "exporter": "legacy", "progress": False}


def compile_graph(model: object, path: Path, precision: str) -> Path:
    """`model`'s slot-layout step graph at GRAPH_OPTIONS in `precision`, written to `path` (no engine)."""
    trtforge.compile(
        model, None, generate=True, build=False, save_onnx=path, precision=precision, **GRAPH_OPTIONS
    )
    return path


@pytest.fixture(scope="session")
def step_graph(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """`step_graph(family, precision)`: the path of tiny_model(family)'s step graph (compile_graph),
    compiled on first use in this process. Tests only read it (load it, or compare with it)."""
    root = tmp_path_factory.mktemp("step_graphs")
    made: dict[tuple[str, str], Path] = {}

    def get(family: str, precision: str) -> Path:
        key = (family, precision)
        if key not in made:
            made[key] = compile_graph(tiny_model(family), root / f"{family}-{precision}.onnx", precision)
        return made[key]

    return get
