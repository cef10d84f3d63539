"""probe_decode_ablation.py's --configs: each form parsed to the launch it names, bad ones refused saying
the form, and an INT4 tensor-core choice in force only while its projection's launch is made."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.probe_decode_ablation import Mma, _configs, _launch_choice
from trtforge.kernels import int4_mma
from trtforge.kernels.decode_attention import DecodeConfig
from trtforge.kernels.gemv import GemvConfig


def test_each_form_names_its_launch_and_semicolons_join_them() -> None:
    text, configs = _configs("qkv=4,4096,4,r;down=mma:8,2;attn=64,4,3,12;o=8,4096,4")
    assert text == "qkv=4,4096,4,r;down=mma:8,2;attn=64,4,3,12;o=8,4096,4"
    assert configs["qkv"] == GemvConfig(block_n=4, block_k=4096, num_warps=4, num_stages=1, reduce=True)
    assert configs["o"] == GemvConfig(block_n=8, block_k=4096, num_warps=4, num_stages=1, reduce=False)
    assert configs["down"] == Mma(8, 2)
    assert configs["attn"] == DecodeConfig(64, 4, 3, 12, early_kv=True)


@pytest.mark.parametrize(
    ("text", "says"),
    [("qkv=mma:4", "mma:WARPS,GROUPS"), ("qkv=mma:0,1", "mma:WARPS,GROUPS"), ("attn=64,4,3", "SPLITS"),
     ("lm=8,2048,4", "NAME=BN,BK,WARPS"), ("qkv=8,2048,4,x", "fourth field")],
)  # fmt: skip
def test_a_malformed_config_is_refused_naming_the_form(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        _configs(text)


def test_a_tensor_core_choice_holds_only_inside_its_launch() -> None:
    before = int4_mma.launch_rule(14336, False, False)
    with _launch_choice(Mma(4, 2)) as config:
        assert config is None  # the launch takes its default path, on the forced rule
        assert int4_mma.launch_rule(14336, False, False) == (4, 2)
        assert int4_mma.launch_rule(4096, True, True) == (4, 2)
    assert int4_mma.launch_rule(14336, False, False) == before
    assert (int4_mma.MMA_WARPS, int4_mma.GROUPS_PER_ITERATION) == (None, None)
    cfg = GemvConfig(block_n=8, block_k=4096)
    with _launch_choice(cfg) as config:
        assert config is cfg and int4_mma.MMA_WARPS is None
