"""Hostile arguments to the public LLM API (`trtforge.llm`): each is refused up front with a UserError
naming the argument, never a hang, a deep torch trace or silently wrong output."""

from __future__ import annotations

import pytest

from tests.cli.test_generate_speculative import (
    NEEDS_TRAINED,
    TARGET,
    draft_with_tokenizer,
    permute_regular_ids,
    rename_pad,
    swap_two_regular_ids,
)
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


@NEEDS_TRAINED
def test_from_pretrained_refuses_a_draft_with_another_tokenizer(tmp_path) -> None:
    """The API refuses what the CLI refuses, before either model's weights load (before: accepted)."""
    import trtforge.llm

    draft = draft_with_tokenizer(tmp_path / "draft", permute_regular_ids)
    with pytest.raises(
        UserError, match=r"have different tokenizers: 4094 of the target's 4094 regular token ids"
    ):
        trtforge.llm.from_pretrained(str(TARGET), speculative={"method": "draft", "model": str(draft)})


@NEEDS_TRAINED
@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (rename_pad, r"differ at 1 id\(s\) \(1 of added .*id 1 is '<\|pad\|>' in the target, '<\|padding"),
        (swap_two_regular_ids, r"differ at 2 id\(s\) \(0 of added .*id 301 is 'ro' in the target, 'Ġin'"),
    ],
    ids=["added token renamed", "two regular ids swapped"],
)
def test_a_nearly_identical_draft_tokenizer_warns(tmp_path, edit, said) -> None:
    """Added tokens only, or a few regular ones (under 1% of the vocabulary): a legitimate pair, warned."""
    from trtforge.llm.spec.tokenizers import DraftTokenizerWarning, check_draft_directories

    draft = draft_with_tokenizer(tmp_path / "draft", edit)
    with pytest.warns(DraftTokenizerWarning, match=said):
        check_draft_directories(TARGET, draft)


@NEEDS_TRAINED
def test_tokenizers_that_agree_compare_equal(tmp_path) -> None:
    from trtforge.llm.spec.tokenizers import compare_vocabularies
    from trtforge.llm.text import load_tokenizer

    same = draft_with_tokenizer(tmp_path / "draft", lambda tok: None)  # loaded, not skipped as same files
    assert compare_vocabularies(load_tokenizer(TARGET), load_tokenizer(same)) == ([], [])
