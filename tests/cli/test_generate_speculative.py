"""`trtforge generate --speculative-method ...`: the greedy ids of plain decoding, and the flags' errors."""

from __future__ import annotations

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
