"""`trtforge serve` refuses bad input before it loads anything: exit 2, one message, no traceback."""

from __future__ import annotations

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
