"""--tokenizer given as a Hugging Face Hub name (org/name) on a machine that cannot reach the Hub: one
clear message naming it, at once (exit 2). Before, the Hub client retried for ~49 s, then failed with
its own message ("Check your internet connection ...") cut mid-word."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.models import tiny_onnx
from trtforge.cli.main import main

HUB_NAME = "some-org/some-name"


@pytest.fixture
def unreachable_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The Hub at a closed local port, online mode (make test sets HF_HUB_OFFLINE=1), an empty cache."""
    from huggingface_hub import constants

    endpoint = "http://127.0.0.1:9"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    return endpoint


def _calibrate(tmp_path: Path, tokenizer: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    model = tiny_onnx(tmp_path / "m.onnx")
    (tmp_path / "s.txt").write_text("hello world\nanother sentence\n")
    argv = ["calibrate", str(model), "--data", str(tmp_path / "s.txt"), "--tokenizer", tokenizer]
    t0 = time.perf_counter()
    rc = main([*argv, "-o", str(tmp_path / "c.onnx")])
    seconds = time.perf_counter() - t0
    cap = capsys.readouterr()
    return rc, cap.out + cap.err, seconds


def test_a_hub_tokenizer_fails_fast_when_the_hub_is_unreachable(
    tmp_path, capsys, unreachable_hub, monkeypatch
):
    from huggingface_hub import constants

    # HF_HUB_OFFLINE=1: the Hub is not asked at all (this run also imports what the command needs, so
    # the timed run below measures the tokenizer's lookup, not first imports)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    rc, text, _ = _calibrate(tmp_path, HUB_NAME, capsys)
    assert rc == 2 and "and HF_HUB_OFFLINE is set, so the Hub is not asked" in text, text
    assert f"--tokenizer '{HUB_NAME}'" in text
    # online, the Hub unreachable: one request, no retries
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    rc, text, seconds = _calibrate(tmp_path, HUB_NAME, capsys)
    assert rc == 2, text
    assert f"--tokenizer '{HUB_NAME}' is not a directory here and not in the local Hugging Face cache" in text
    assert f"the Hub ({unreachable_hub}) cannot be reached" in text and "HF_HUB_OFFLINE=1" in text
    assert "Traceback" not in text and not (tmp_path / "c.onnx").exists()
    assert seconds < 15, f"{seconds:.1f} s: the Hub was retried"


def test_a_path_that_is_no_directory_is_not_a_hub_name(tmp_path, capsys, unreachable_hub):
    rc, text, _ = _calibrate(tmp_path, str(tmp_path / "no" / "such" / "tok"), capsys)
    assert rc == 2 and "is neither a directory here nor a Hugging Face Hub name" in text, text


def test_a_cached_hub_tokenizer_loads_offline(tmp_path, unreachable_hub):
    """A Hub name found in the local cache loads without asking the (unreachable) Hub."""
    import shutil

    from huggingface_hub import constants

    from trtforge.calibration.data import resolve_tokenizer
    from trtforge.demo import minilm_path

    snapshot = Path(constants.HF_HUB_CACHE) / "models--some-org--some-name" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for f in Path(minilm_path()).iterdir():
        wanted = f.name.startswith(("tokenizer", "special_tokens", "vocab")) or f.name == "config.json"
        if f.is_file() and wanted:
            shutil.copy(f, snapshot / f.name)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    tok = resolve_tokenizer(HUB_NAME)
    assert tok("hello world")["input_ids"][0] == tok.cls_token_id


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_llm_commands_take_a_tokenizer_directory_only(tmp_path, capsys, unreachable_hub, command):
    """generate and serve read --tokenizer as a directory, offline: a Hub name is refused at once."""
    argv = [command, str(tmp_path / "model"), "--tokenizer", HUB_NAME]
    t0 = time.perf_counter()
    rc = main([*argv, "--prompt", "x"] if command == "generate" else argv)
    seconds = time.perf_counter() - t0
    text = "".join(capsys.readouterr())
    assert rc == 2 and f"'{HUB_NAME}' holds no tokenizer" in text and "--tokenizer DIR" in text, text
    assert seconds < 15
