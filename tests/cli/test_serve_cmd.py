"""`trtforge serve` refuses bad input before it loads anything: exit 2, one message, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtforge.cli.main import main

pytest.importorskip("fastapi", reason="trtforge serve needs the [serve] extra (fastapi)")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "/no/such/model-dir"], "holds no tokenizer"),
        (["serve", b"caf\xe9".decode("utf-8", "surrogateescape")], "MODEL is not valid UTF-8"),
        (["serve", ".", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["serve", ".", "--port", "70000"], "--port"),
        (["serve", ".", "--max-num-seqs", "0"], "--max-num-seqs"),
        (["serve", ".", "--max-prefill-tokens-with-decodes", "0"], "--max-prefill-tokens-with-decodes"),
        (["serve", ".", "--max-num-seqs", str(10**23)], "'--max-num-seqs': 1000000000000000000000"),
        (["serve", ".", "--max-num-batched-tokens", str(2**21)], "2097152 is more than 1,048,576"),
        (["serve", ".", "--chat-template", "/no/such.jinja"], "--chat-template"),
    ],
)
def test_bad_input_exits_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_empty_chat_template_is_refused(tmp_path, capsys):
    empty = tmp_path / "chat.jinja"
    empty.write_text("  \n")
    assert main(["serve", str(tmp_path), "--chat-template", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err


MODEL = Path(__file__).resolve().parents[2] / ".." / "shared" / "models" / "code-llama-21m"


@pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model {MODEL} is absent")
def test_the_startup_line_says_how_the_pool_was_sized(monkeypatch, capsys):
    """Before it listens, the server prints the sized pool and what the sizing counted (on a GPU: the
    weights, the measured step peak and the measured CUDA graphs; on the CPU: the RAM share)."""
    import importlib

    server_run = importlib.import_module("trtforge.llm.server.run")  # (the package exports a function `run`)
    served = []
    monkeypatch.setattr(server_run, "run", lambda llm, *a, **k: served.append(llm))
    argv = [
        "serve",
        str(MODEL),
        "--device",
        "cpu",
        "--max-num-seqs",
        "4",
        "--max-prefill-tokens-with-decodes",
        "96",
    ]
    assert main(argv) in (0, None)
    err = capsys.readouterr().err
    (llm,) = served
    try:
        assert llm.engine.config.max_num_seqs == 4 and llm.engine.config.max_prefill_tokens_with_decodes == 96
        sized = llm.pool_size
        assert sized is not None and sized.num_blocks == llm.executor.facts.num_blocks
        assert f"trtforge serve: KV pool of {sized.num_blocks:,} blocks" in err and sized.how in err
    finally:
        llm.close()
