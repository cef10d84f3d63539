"""`trtforge generate --speculative-method ...`: the greedy ids of plain decoding, and the flags' errors."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.llm.tiny_models import hf_greedy, tiny_model
from trtforge.cli.main import main

FACTORY = "tests.llm.tiny_models:llama_factory"
ARGS = ["--prompt-ids", "1 2 3 1 2 3 1 2", "--prompt-ids", "4,5", "--max-tokens", "9", "--ignore-eos"]


def _lines(capsys):
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return [[int(t) for t in line.split()] for line in out.out.splitlines()]


@pytest.mark.parametrize(
    "flags",
    [
        ["--speculative-method", "ngram", "--num-speculative-tokens", "3"],
        ["--speculative-model", FACTORY],  # the model drafting for itself; the method is implied
    ],
    ids=["ngram", "draft"],
)
def test_speculative_generate_prints_the_greedy_ids(capsys, flags):
    model = tiny_model("llama")
    want = [hf_greedy(model, p, 9)[0] for p in ([1, 2, 3, 1, 2, 3, 1, 2], [4, 5])]
    assert main(["generate", FACTORY, *ARGS, "--num-blocks", "16", *flags]) == 0
    assert _lines(capsys) == want


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--num-speculative-tokens", "3"], "needs --speculative-method"),
        (["--speculative-method", "draft"], "needs --speculative-model"),
        (["--speculative-method", "ngram", "--speculative-model", FACTORY], "uses none"),
    ],
)
def test_speculative_flags_that_do_not_go_together_exit_2(capsys, flags, said):
    assert main(["generate", FACTORY, *ARGS, *flags]) == 2
    assert said in capsys.readouterr().err


def test_a_draft_model_that_cannot_load_is_named_as_the_flag(capsys):
    """The loader's refusal of the draft did not say it was the draft ("cannot import module ..." could be
    MODEL's); it names --speculative-model, with exit 2 and no traceback."""
    flags = ["--speculative-model", "nosuch_pkg.module:factory"]
    assert main(["generate", FACTORY, *ARGS, *flags]) == 2
    err = capsys.readouterr().err
    assert "error: --speculative-model: cannot import module 'nosuch_pkg.module'" in err
    assert "Traceback" not in err


def larger_vocabulary_draft():
    """A draft of 301 ids for the 300 of FACTORY's model: ids the target has no logits for."""
    return tiny_model("llama", vocab_size=301), None


def test_a_draft_of_another_vocabulary_is_named_as_the_flag(capsys, tmp_path):
    """Before: 'speculative draft model has a vocabulary of 301 tokens ...' named neither
    --speculative-model nor the draft given; as the loader's refusals do, it names both."""
    for draft in ("tests.cli.test_generate_speculative:larger_vocabulary_draft", str(tmp_path / "draft")):
        if draft.startswith("/"):
            tiny_model("llama", vocab_size=301).save_pretrained(draft)
        assert main(["generate", FACTORY, *ARGS, "--speculative-model", draft]) == 2
        out = capsys.readouterr()
        assert out.out == "" and "Traceback" not in out.err
        assert (
            f"error: --speculative-model: '{draft}' has a vocabulary of 301 tokens but the target's has 300: "
            "it could propose ids the target has no logits for."
        ) in out.err, out.err


def test_self_drafting_accepts_every_greedy_proposal():
    """A draft identical to the target proposes exactly the target's greedy tokens: every one is
    accepted, so the draft's own pool is kept in step with the target's through every rollback."""
    import torch

    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.sampling import SamplingParams
    from trtforge.llm.sched.scheduler import SchedulerConfig
    from trtforge.llm.spec.proposers import DraftModelProposer

    target = TorchExecutor(tiny_model("llama"), num_blocks=32, block_size=4, dtype=torch.float64)
    draft = DraftModelProposer(
        TorchExecutor(tiny_model("llama"), num_blocks=32, block_size=4, dtype=torch.float64), 3
    )
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11], [4]]
    with LLMEngine(target, SchedulerConfig(max_num_seqs=3), proposer=draft) as engine:
        got = engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
        stats = engine.stats
    assert [list(c.token_ids) for c in got] == [hf_greedy(tiny_model("llama"), p, 12)[0] for p in prompts]
    assert stats.spec_draft_tokens > 20 and stats.spec_acceptance_rate == 1.0
    assert draft.blocks.num_free_blocks == draft.blocks.num_blocks


SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "models"
TARGET, DRAFT = SHARED / "code-llama-21m", SHARED / "code-llama-3m"
NEEDS_TRAINED = pytest.mark.skipif(not DRAFT.is_dir(), reason=f"the trained models are absent: {SHARED}")


def draft_with_tokenizer(dest: Path, edit: Callable[[dict], None]) -> Path:
    """The trained draft model (its files linked) in `dest`, with its tokenizer.json edited by `edit`
    (and the pad token of tokenizer_config.json following a renamed '<|pad|>')."""
    dest.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (dest / name).symlink_to(DRAFT / name)
    tok = json.loads((DRAFT / "tokenizer.json").read_text())
    edit(tok)
    (dest / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((DRAFT / "tokenizer_config.json").read_text())
    cfg["pad_token"] = tok["added_tokens"][1]["content"]
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dest


def permute_regular_ids(tok: dict) -> None:
    """Another tokenizer of the same size: every regular token at another id (the added 0 and 1 stay)."""
    vocab = tok["model"]["vocab"]
    top = max(vocab.values())
    tok["model"]["vocab"] = {t: i if i < 2 else 2 + top - i for t, i in vocab.items()}


def rename_pad(tok: dict) -> None:
    """The same vocabulary with one added token named otherwise (a family sibling's special token)."""
    tok["added_tokens"][1]["content"] = "<|padding|>"
    tok["model"]["vocab"]["<|padding|>"] = tok["model"]["vocab"].pop("<|pad|>")


def swap_two_regular_ids(tok: dict) -> None:
    """Two regular tokens exchanged: a near-identical tokenizer (2 of 4,094 ids differ)."""
    vocab = tok["model"]["vocab"]
    vocab["ro"], vocab["Ġin"] = vocab["Ġin"], vocab["ro"]


PROMPT = ["--prompt", "def read_json(path):", "--max-tokens", "12"]


@NEEDS_TRAINED
def test_a_draft_with_another_tokenizer_of_the_same_size_is_refused(capfd, tmp_path):
    """Before: accepted (same vocabulary size), the output exact but nearly every proposal rejected."""
    draft = draft_with_tokenizer(tmp_path / "draft", permute_regular_ids)
    assert main(["generate", str(TARGET), *PROMPT, "--speculative-model", str(draft)]) == 2
    out, err = capfd.readouterr()
    assert out == "" and "Traceback" not in err
    assert re.search(
        rf"the speculative draft model '{re.escape(str(draft))}' and the target '{re.escape(str(TARGET))}' "
        r"have different tokenizers: 4094 of the target's 4094 regular token ids mean other tokens",
        err,
    ), err


@NEEDS_TRAINED
def test_a_draft_differing_in_added_tokens_only_runs_with_a_warning(capfd, tmp_path):
    """A family sibling whose special tokens differ is a legitimate draft: it runs, the output is the
    target's own greedy output, and one warning line says which tokens differ."""
    draft = draft_with_tokenizer(tmp_path / "draft", rename_pad)
    assert main(["generate", str(TARGET), *PROMPT]) == 0
    plain = capfd.readouterr().out
    assert main(["generate", str(TARGET), *PROMPT, "--speculative-model", str(draft)]) == 0
    out, err = capfd.readouterr()
    assert out == plain
    warned = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "id 1 is '<|pad|>' in the target, '<|padding|>' in the draft" in warned[0], (
        err
    )


@NEEDS_TRAINED
def test_the_trained_pair_shares_its_tokenizer_without_a_warning(capfd):
    assert main(["generate", str(TARGET), *PROMPT, "--speculative-model", str(DRAFT)]) == 0
    err = capfd.readouterr().err
    assert "warning" not in err and "tokenizer" not in err, err


def trained_target_factory():
    """The trained target as module:factory: a model without a tokenizer directory of its own."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(TARGET)), None


@NEEDS_TRAINED
@pytest.mark.parametrize(
    "target",
    [str(TARGET), "tests.cli.test_generate_speculative:trained_target_factory"],
    ids=["dir", "factory"],
)
def test_a_draft_tokenizer_that_cannot_load_is_named_as_the_flag(capfd, tmp_path, target):
    """Before: "error: cannot load the tokenizer in 'DIR' ...", as MODEL's own tokenizer's refusal reads."""
    draft = draft_with_tokenizer(tmp_path / "draft", lambda tok: None)
    (draft / "tokenizer.json").write_text('{"model": ')
    argv = ["generate", target, *PROMPT, "--tokenizer", str(TARGET), "--speculative-model", str(draft)]
    assert main(argv) == 2
    out, err = capfd.readouterr()
    assert out == "" and "Traceback" not in err
    assert f"error: --speculative-model: cannot load the tokenizer in '{draft}' (" in err, err


@NEEDS_TRAINED
def test_a_factory_target_is_compared_through_its_tokenizer_option(capfd, tmp_path):
    """A module:factory target has no directory to read a tokenizer from: --tokenizer names it, and the
    draft's is compared with that one (before: accepted, every proposal of the draft rejected)."""
    draft = draft_with_tokenizer(tmp_path / "draft", permute_regular_ids)
    argv = ["generate", "tests.cli.test_generate_speculative:trained_target_factory", *PROMPT]
    argv += ["--tokenizer", str(TARGET), "--speculative-model", str(draft)]
    assert main(argv) == 2
    out, err = capfd.readouterr()
    assert out == "" and f"and the target '--tokenizer {TARGET}' have different tokenizers" in err, err
