"""Hostile arguments to the public LLM API (`trtforge.llm`): each is refused up front with a UserError
naming the argument, never a hang, a deep torch trace or silently wrong output."""

from __future__ import annotations

import pytest

from trtforge.errors import UserError
from trtforge.llm import SamplingParams


def test_sampling_params_refuses_n_past_its_bound() -> None:
    """Before: accepted, and generate() built 10**23 requests in SamplingParams.expand (never returned)."""
    with pytest.raises(UserError, match=r"SamplingParams\.n must be an integer in \[1, 65536\]"):
        SamplingParams(n=10**23)
    assert len(SamplingParams(n=2**16, temperature=1.0).expand()) == 2**16


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda llm: llm.load(""), r"the model to load is an empty path \(''\)"),
        (lambda llm: llm.load(b""), r"the model to load is an empty path \(''\)"),
        (lambda llm: llm.load("", executor="tensorrt"), r"the model to load is an empty path \(''\)"),
        (lambda llm: llm.from_pretrained(""), r"the model is an empty path \(''\)"),
        (lambda llm: llm.from_pretrained("", tensor_parallel_size=2), r"the model is an empty path"),
        (
            lambda llm: llm.from_pretrained("x:y", speculative={"method": "draft", "model": ""}),
            r"speculative 'model' is an empty path \(''\)",
        ),
    ],
)
def test_an_empty_model_path_is_named_empty(call, message) -> None:
    """Before: Path('') is '.', and the message said "'.' is a directory", a path never given."""
    import trtforge.llm

    with pytest.raises(UserError, match=message):
        call(trtforge.llm)
