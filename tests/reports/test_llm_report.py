"""`trtforge report MODEL --generate`: the LLM variant report's numbers, schema, HTML and bad input."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.llm.tiny_models import tiny_model
from tests.reports._chromium import dump_dom, needs_chromium
from tests.reports.test_render import _validator
from trtforge.cli.main import main as cli_main
from trtforge.llm.report import build_llm_report

MODELS = Path(__file__).resolve().parents[2] / ".." / "shared" / "models"
TEXT = Path(__file__).resolve().parents[2] / "trtforge" / "llm" / "engine.py"  # any Python source
SMALL = {"windows": 3, "window_len": 32, "chunk": 8, "batch_sizes": (1, 2), "prompt_len": 8, "new_tokens": 4}


def _tokenizer(vocab: int, text: str):
    """A byte-level BPE tokenizer of `vocab` ids trained on `text` (in memory, a second or less)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A random tiny Llama (hidden 128: INT4 blocks of 128 apply) saved with its own tokenizer."""
    d = tmp_path_factory.mktemp("tiny-llama")
    tok = _tokenizer(300, TEXT.read_text())
    model = tiny_model("llama", hidden_size=128, intermediate_size=256, vocab_size=len(tok))
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def report(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("llm-report") / "out"
    variants = "fp8,fp8+head-fp8,kv-fp8,onnx-fp32,onnx-fp8,onnx-int4"
    return build_llm_report(tiny_dir, text=TEXT, out_dir=out, variants=variants, device="cpu", **SMALL)


def _hf_perplexity(model_dir: Path, windows: np.ndarray) -> float:
    """Perplexity of the windows straight from transformers' logits (FP32, one forward each)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for row in windows:
            logits = model(torch.tensor(row)[None]).logits[0, :-1].double()
            logp = torch.log_softmax(logits, -1)
            nll -= float(logp[torch.arange(len(row) - 1), torch.tensor(row[1:])].sum())
            count += len(row) - 1
    return math.exp(nll / count)


def test_json_validates_and_lists_every_variant(report):
    doc = json.loads(report.json_path.read_text())
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])
    assert doc["source"]["kind"] == "causal_lm" and doc["reference"] == "fp32"
    assert [t["name"] for t in doc["targets"]] == [
        "fp32",
        "fp8",
        "fp8+head-fp8",
        "kv-fp8",
        "onnx-fp32",
        "onnx-fp8",
        "onnx-int4",
    ]
    assert [q["target"] for q in doc["lm_quality"]] == [t["name"] for t in doc["targets"]]


def test_reference_perplexity_matches_transformers(report, tiny_dir):
    """The torch executor's perplexity (windows in prompt chunks through the paged cache) and the FP32
    step graph's (exact ORT) both equal one computed from transformers' own logits."""
    ppl = _hf_perplexity(tiny_dir, report.windows.tokens)
    q = {r.target: r for r in report.report.lm_quality}
    assert q["fp32"].perplexity == pytest.approx(ppl, rel=1e-4)
    assert q["onnx-fp32"].perplexity == pytest.approx(ppl, rel=1e-4)
    assert q["onnx-fp32"].top1_agreement == 1.0 and abs(q["onnx-fp32"].delta_ppl_pct) < 1e-2
    assert q["fp32"].tokens == 3 * 31
    starts = report.report.settings["window_starts"]
    assert len(set(starts)) == 3 and min(starts) >= report.windows.text_tokens // 2


def test_quantized_step_graphs_are_measured(report):
    q = {r.target: r for r in report.report.lm_quality}
    for name in ("onnx-fp8", "onnx-int4"):
        assert q[name].status == "ok" and q[name].perplexity > 1
        assert 0 < q[name].top1_agreement <= 1 and q[name].delta_ppl_pct != 0
        assert q[name].kv_bytes_per_token == 2 * 2 * 2 * 32 * 2  # 2 layers, 2 KV heads, head_dim 32, FP16
    assert q["fp32"].kv_bytes_per_token == 2 * 2 * 2 * 32 * 4 and q["fp32"].kv_dtype == "float32"
    speed = [p for p in report.report.lm_speed if p.target.startswith("onnx-")]
    assert {p.status for p in speed} == {"not_run"} and all("not a serving target" in p.reason for p in speed)


def test_serving_variants_run_on_the_cpu(report):
    """fp8 / fp8+head-fp8 / kv-fp8 run on the CPU through the serving executor's float reference path
    (``from_pretrained(quantization=..., lm_head_quantization=..., kv_cache_dtype=...)``): a row, not
    a refusal, and the records say what was quantized."""
    targets = {t.name: t for t in report.report.targets}
    quality = {q.target: q for q in report.report.lm_quality}
    for name in ("fp8", "fp8+head-fp8", "kv-fp8"):
        assert targets[name].status == "ok", targets[name].reason
        assert quality[name].perplexity > 1 and quality[name].top1_agreement > 0.5
    assert targets["fp8"].records["lm_head_quantization"] is None
    assert targets["fp8+head-fp8"].records["quantization"] == "fp8"
    assert targets["fp8+head-fp8"].records["lm_head_quantization"] == "fp8"
    assert quality["fp8+head-fp8"].perplexity != quality["fp8"].perplexity


def test_speed_points(report):
    points = {p.batch: p for p in report.report.lm_speed if p.target == "fp32"}
    assert sorted(points) == [1, 2]
    for b, p in points.items():
        assert p.status == "ok" and p.ttft_ms > 0 and p.itl_ms > 0 and p.new_tokens == 4
        assert p.throughput_tok_s == pytest.approx(b * 4 / p.wall_s)


def test_a_repeated_batch_size_is_measured_once(tiny_dir, tmp_path):
    """--batch 2,1,2: batch 2 was timed twice, two speed rows of one (variant, batch)."""
    small = SMALL | {"windows": 1, "window_len": 16, "batch_sizes": (2, 1, 2)}
    result = build_llm_report(
        tiny_dir, text=TEXT, out_dir=tmp_path / "o", variants="fp32", device="cpu", **small
    )
    assert [p.batch for p in result.report.lm_speed] == [2, 1]
    assert result.report.settings["batch_sizes"] == [2, 1]


def test_the_title_names_a_model_given_as_dot(tiny_dir, tmp_path, monkeypatch):
    """`report . --generate` from inside the model's directory: the title was 'trtforge LLM report: '."""
    monkeypatch.chdir(tiny_dir)
    small = SMALL | {"windows": 1, "window_len": 16, "batch_sizes": (1,)}
    result = build_llm_report(".", text=TEXT, out_dir=tmp_path / "o", variants="fp32", device="cpu", **small)
    assert result.report.title == f"trtforge LLM report: {tiny_dir.name}"


def test_markdown(report):
    md = report.markdown_path.read_text()
    assert "## Quality (vs `fp32`" in md and "## Speed" in md and "## Accuracy" not in md
    assert md.count("\n| variant |") == 2


@needs_chromium
def test_html_in_headless_chromium(report):
    html = report.html_path.read_text()
    assert "http://" not in html and "https://" not in html
    dom = dump_dom(report.html_path)
    assert set(re.findall(r'<table id="(\w+)"', dom)) == {"targets", "quality", "speed"}
    # the quality figure (perplexity + agreement) and the speed figure (TTFT, ITL, throughput)
    assert len(re.findall(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}"', dom)) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--text", "missing.txt"], "--text"),
        (["--text", str(TEXT), "--variants", "fp8,int3"], "unknown variant"),
        (["--text", str(TEXT), "--variants", " , "], "--variants: ' , ' names no variant"),  # was "[]"
        (["--text", str(TEXT), "--windows", "2", "--window-len", "100000"], "--window-len"),
        (["--text", str(TEXT), "--targets", "ort"], "--targets"),
        # was dropped: onnx-int8 was SmoothQuant'd as if it had not been given
        (["--text", str(TEXT), "--no-smoothquant"], "--no-smoothquant only applies to an output comparison"),
        (["--text", str(TEXT), "--no-smoothquant", "--seq", "64"], "--no-smoothquant, --seq only apply to"),
        ([], "--generate needs --text"),
        # was a report whose every serving variant was refused for SchedulerConfig.max_num_seqs, exit 0
        (["--text", str(TEXT), "--batch", "65537"], "--batch 65537: the serving engine runs at most 65536"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(args, message, tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli_main(["report", str(tiny_dir), "--generate", "-o", str(out), "--no-progress", *args])
    assert rc == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_variants_given_twice_add_up(tiny_dir, tmp_path):
    """--variants bf16 --variants fp16: the second replaced the first (click keeps the last value of an
    option that is not repeatable), so bf16 was silently not in the report."""
    out = tmp_path / "out"
    argv = ["report", str(tiny_dir), "--generate", "-o", str(out), "--no-progress", "--text", str(TEXT)]
    argv += ["--windows", "1", "--window-len", "16", "--batch", "1", "--prompt-len", "4", "--new-tokens", "2"]
    assert cli_main([*argv, "--variants", "bf16", "--variants", "fp16"]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert [t["name"] for t in doc["targets"]] == ["fp32", "bf16", "fp16"]


def test_a_text_that_is_one_of_the_report_files_exits_2_and_is_kept(tiny_dir, tmp_path, capsys):
    """--text OUT/report.md was read, then replaced by the report: the input was gone."""
    out = tmp_path / "out"
    out.mkdir()
    text = out / "report.md"
    text.write_text(TEXT.read_text())
    argv = ["report", str(tiny_dir), "--generate", "-o", str(out), "--no-progress", "--text", str(text)]
    rc = cli_main(argv)
    assert rc == 2 and "is the --text file" in capsys.readouterr().err
    assert text.read_text() == TEXT.read_text() and [p.name for p in out.iterdir()] == ["report.md"]


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_out_dir_through_a_dangling_symlink_exits_2_before_any_work(below, tiny_dir, tmp_path, capsys):
    """-o a symlink to a missing directory (or a directory under one): every variant ran, then writing
    the report failed ("cannot write 'link/report.json': No such file or directory")."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    out = link / below if below else link
    argv = ["report", str(tiny_dir), "--generate", "-o", str(out), "--no-progress", "--text", str(TEXT)]
    rc = cli_main([*argv, "--variants", "fp32", "--window-len", "16", "--windows", "2", "--batch", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "is a symbolic link to" in err and "does not exist" in err, err
    assert not (tmp_path / "missing").exists()


def test_a_model_that_is_not_a_causal_lm_exits_2(tmp_path, capsys):
    from tests.reports._tiny import classifier_onnx, classifier_weights

    src = classifier_onnx(tmp_path / "a.onnx", *classifier_weights(0))
    out = tmp_path / "out"
    rc = cli_main(["report", str(src), "--generate", "-o", str(out), "--text", str(TEXT)])
    assert rc == 2 and "causal LM" in capsys.readouterr().err
    assert not out.exists()


def test_trained_21m_reference_perplexity(tmp_path):
    """On the trained model: the report's FP32 perplexity is transformers' on the same windows."""
    model, text = MODELS / "code-llama-21m", MODELS / "eval_stdlib.txt"
    if not (model / "config.json").is_file() or not text.is_file():
        pytest.skip(f"trained models absent ({MODELS}): see ../shared/models/README.md")
    small = SMALL | {"windows": 2, "window_len": 128, "chunk": 64, "batch_sizes": (1,)}
    result = build_llm_report(
        model, text=text, out_dir=tmp_path / "o", variants="fp32", device="cpu", **small
    )
    ppl = _hf_perplexity(model, result.windows.tokens)
    (q,) = result.report.lm_quality
    assert q.perplexity == pytest.approx(ppl, rel=1e-4) and 2 < q.perplexity < 40


@pytest.mark.gpu
def test_gpu_bf16_reference_and_fp8_variants(tiny_dir, tmp_path):
    """On a GPU: the BF16 reference tracks transformers' FP32 perplexity, and each FP8 variant either
    runs (quality close to BF16, speed measured) or says why not."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    result = build_llm_report(
        tiny_dir, text=TEXT, out_dir=tmp_path / "o", variants="fp8,kv-fp8,fp8+kv-fp8", device="cuda", **SMALL
    )
    ppl = _hf_perplexity(tiny_dir, result.windows.tokens)
    q = {r.target: r for r in result.report.lm_quality}
    assert result.report.reference == "bf16" and q["bf16"].perplexity == pytest.approx(ppl, rel=0.03)
    fp8_gpu = torch.cuda.get_device_capability() >= (8, 9)  # FP8 tensor cores: the variants must run
    for name in ("fp8", "kv-fp8", "fp8+kv-fp8"):
        row = q[name]
        print(f"{name}: {row.status} ppl={row.perplexity} delta={row.delta_ppl_pct} reason={row.reason}")
        if fp8_gpu or row.status == "ok":  # random tiny weights: quantization noise alone moves ppl
            # 16-28% over these 93 tokens (FP8: CPU 16, H200 28; FP8 + FP8 KV: CPU 26), so the bound
            # only catches a broken variant (wrong scales: hundreds of %, agreement near chance). The
            # trained model's quality bounds are in benchmarks/bench_quant_quality.py.
            assert row.status == "ok", row.reason
            assert abs(row.delta_ppl_pct) < 60 and row.top1_agreement > 0.5
            assert any(p.target == name and p.status == "ok" for p in result.report.lm_speed)
        else:
            assert row.status == "not_run" and "FP8" in row.reason, row.reason
    if fp8_gpu:
        kv = {r.target: r.kv_bytes_per_token for r in result.report.lm_quality}
        assert kv["kv-fp8"] * 2 <= kv["bf16"] + 64  # E4M3 pools: half the bytes (scales aside)


def _scaled_head(model_dir: Path, scale: float) -> torch.nn.Module:
    """The model with its LM head's weights times `scale` (logits wildly off, or NaN / inf)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def test_a_variant_whose_logits_are_not_finite_fails_and_the_report_is_written(tiny_dir, tmp_path):
    """Logits of inf / NaN: NaN scores reached the quality plot, whose ValueError ("Axis limits cannot be
    NaN or Inf") lost the report after every variant had run. Now the variant fails, naming why."""
    small = SMALL | {"windows": 1, "window_len": 16, "batch_sizes": (1,)}
    result = build_llm_report(
        _scaled_head(tiny_dir, math.inf), tokenizer=tiny_dir, text=TEXT, out_dir=tmp_path / "o",
        variants="fp32", device="cpu", **small,
    )  # fmt: skip
    (q,) = result.report.lm_quality
    assert q.status == "failed" and "non-finite logits" in q.reason and q.perplexity is None
    doc = json.loads(result.json_path.read_text())
    assert not list(_validator().iter_errors(doc)) and doc["lm_quality"][0]["status"] == "failed"


def test_a_perplexity_past_the_float_range_is_inf_not_a_crash(tiny_dir, tmp_path):
    """Finite logits so far off that exp(mean NLL) overflows: math.exp raised OverflowError after every
    variant had run, and nothing was written. Now the perplexity is inf (JSON null: JSON has no inf)."""
    small = SMALL | {"windows": 1, "window_len": 16, "batch_sizes": (1,)}
    result = build_llm_report(
        _scaled_head(tiny_dir, 1e8), tokenizer=tiny_dir, text=TEXT, out_dir=tmp_path / "o",
        variants="fp32", device="cpu", **small,
    )  # fmt: skip
    (q,) = result.report.lm_quality
    assert q.status == "ok" and q.perplexity == math.inf and q.nll_per_token > 700
    doc = json.loads(result.json_path.read_text())
    assert not list(_validator().iter_errors(doc)) and doc["lm_quality"][0]["perplexity"] is None
    assert "| fp32 | inf |" in result.markdown_path.read_text()


def test_more_windows_than_the_second_half_holds_is_refused():
    """66 tokens: the second half (33) holds 2 distinct windows of 32 tokens; --windows 8 scored the same
    window 8 times over and reported 8 x 31 predicted tokens."""
    from trtforge.errors import UserError
    from trtforge.llm.report import cut_windows

    w = cut_windows(list(range(66)), 2, 32, "--text 't'")
    assert w.starts == [33, 34]
    with pytest.raises(UserError, match="holds only 2 distinct windows of --window-len 32"):
        cut_windows(list(range(66)), 3, 32, "--text 't'")


def test_a_prompt_len_past_the_texts_tokens_is_refused(tiny_dir, tmp_path):
    """A text shorter than --prompt-len: the speed prompts were cut short (the table's 'prompt + new'
    said fewer tokens) while the settings and the Speed heading said --prompt-len."""
    from trtforge.errors import UserError

    text = tmp_path / "short.py"
    text.write_text(TEXT.read_text()[:200])  # (155 tokens)
    small = SMALL | {"windows": 2, "window_len": 16, "batch_sizes": (1,), "prompt_len": 240}
    with pytest.raises(UserError, match="--prompt-len 240: --text .* has only \\d+ tokens"):
        build_llm_report(tiny_dir, text=text, out_dir=tmp_path / "o", variants="fp32", device="cpu", **small)
    assert not (tmp_path / "o").exists()


def test_a_byte_order_mark_is_not_text(tiny_dir, tmp_path):
    """A UTF-8 file saved with a BOM (Windows editors): the BOM was tokenized as text, which moved the
    evaluation windows and changed the perplexity of the same text."""
    plain, bom = tmp_path / "plain.py", tmp_path / "bom.py"
    plain.write_bytes(TEXT.read_bytes()[:3000])
    bom.write_bytes(b"\xef\xbb\xbf" + TEXT.read_bytes()[:3000])
    small = SMALL | {"windows": 2, "window_len": 16, "batch_sizes": (1,)}
    a, b = (
        build_llm_report(tiny_dir, text=t, out_dir=tmp_path / t.stem, variants="fp32", device="cpu", **small)
        for t in (plain, bom)
    )
    assert a.windows.text_tokens == b.windows.text_tokens
    assert np.array_equal(a.windows.tokens, b.windows.tokens)
    assert a.report.lm_quality[0].perplexity == b.report.lm_quality[0].perplexity


def test_calibration_prompts_stay_before_the_first_window():
    """67 tokens, one window of 34: the calibration prompt was ids[0:34], whose last token is the first
    window's first (ids[33]); the note says calibration is disjoint from the evaluation windows."""
    from trtforge.llm.report import cut_windows

    w = cut_windows(list(range(67)), 1, 34, "--text 't'")
    assert w.starts == [33] and max(max(c) for c in w.calibration) < 33


def test_headline_names_the_largest_perplexity_change_by_magnitude():
    """kv-fp8 +0.89% and onnx-fp8 -3.03%: the headline called kv-fp8 "the largest perplexity change"."""
    from trtforge.reports.cells import headline
    from trtforge.reports.results import LmQuality, Report, TargetInfo

    deltas = {"fp32": None, "kv-fp8": 0.89, "onnx-fp8": -3.03}
    report = Report(
        title="t", created="now", source={"kind": "causal_lm", "label": "m"}, reference="fp32",
        settings={}, environment={}, targets=[TargetInfo(n, "torch", "p", "cpu", "d") for n in deltas],
        accuracy=[], latency=[],
        lm_quality=[LmQuality(n, perplexity=30.0, delta_ppl_pct=d) for n, d in deltas.items()],
    )  # fmt: skip
    assert headline(report).endswith("largest perplexity change onnx-fp8 -3.03%.")


def test_speed_requests_pay_their_prefill(tiny_dir, tmp_path, monkeypatch):
    """The warm-up ran the timed prompts first and prefix caching kept their blocks, so every timed
    request's prefill was a cache hit (TTFT of a 512-token prompt on the 21M model: 120 ms, 436 fresh)."""
    from trtforge.llm.sched.blocks import BlockManager

    hits: list[int] = []
    real = BlockManager._prefix_hits

    def counting(self, token_ids):
        found = real(self, token_ids)
        hits.append(len(found[0]))
        return found

    monkeypatch.setattr(BlockManager, "_prefix_hits", counting)
    small = SMALL | {"windows": 1, "window_len": 16, "batch_sizes": (1, 2), "prompt_len": 40}
    result = build_llm_report(
        tiny_dir, text=TEXT, out_dir=tmp_path / "o", variants="fp32", device="cpu", **small
    )
    assert [p.status for p in result.report.lm_speed] == ["ok", "ok"]
    assert sum(hits) == 0, f"{sum(hits)} prompt blocks served from the prefix cache"
    assert any("without prefix caching" in n for n in result.report.notes)


def test_the_calibration_note_names_the_variants_that_calibrated(tiny_dir, tmp_path):
    """int4-awq+head-fp8 searches its AWQ scales on the text's prompts, but the note left it out."""
    small = SMALL | {"windows": 1, "window_len": 16, "batch_sizes": (1,)}
    result = build_llm_report(
        tiny_dir, text=TEXT, out_dir=tmp_path / "o", variants="int4-awq+head-fp8", device="cpu", **small
    )
    assert result.report.targets[1].status == "ok"
    (note,) = [n for n in result.report.notes if "calibrated on" in n]
    assert note.startswith("int4-awq+head-fp8 calibrated on 16 prompts")


def test_the_calibration_note_leaves_out_a_refused_variant(tmp_path):
    """The trained 3M model's MLP width (704) is no multiple of INT4's group size: int4-awq is refused,
    yet the note said it was calibrated on the text."""
    model, text = MODELS / "code-llama-3m", MODELS / "eval_stdlib.txt"
    if not (model / "config.json").is_file() or not text.is_file():
        pytest.skip(f"trained models absent ({MODELS}): see ../shared/models/README.md")
    small = SMALL | {"windows": 1, "window_len": 16, "batch_sizes": (1,)}
    result = build_llm_report(
        model, text=text, out_dir=tmp_path / "o", variants="int4-awq", device="cpu", **small
    )
    assert (
        result.report.targets[1].status == "not_run" and "group size 128" in result.report.targets[1].reason
    )
    assert not [n for n in result.report.notes if "calibrated on" in n]


def test_a_batch_past_the_engines_default_runs_at_once(tiny_dir, tmp_path):
    """--batch 300: the engine ran 256 requests at a time (its default max_num_seqs), so the point said
    300 concurrent requests while 44 queued behind the others and their wait counted in TTFT."""
    small = SMALL | {"windows": 1, "window_len": 16, "batch_sizes": (300,), "prompt_len": 4, "new_tokens": 2}
    result = build_llm_report(
        tiny_dir, text=TEXT, out_dir=tmp_path / "o", variants="fp32", device="cpu", **small
    )
    (point,) = result.report.lm_speed
    assert point.status == "ok" and point.batch == 300
    assert result.report.targets[0].records["scheduler"] == {
        "max_running": 300, "prefix_hit_tokens": 0, "preemptions": 0
    }  # fmt: skip


def test_crlf_line_endings_are_newlines(tiny_dir, tmp_path):
    """A CRLF copy of a text (a Windows checkout) was measured on its '\\r' tokens since the bytes are
    checked before decoding (read_text's universal newlines, used before, had read it as the LF text)."""
    lf, crlf = tmp_path / "lf.py", tmp_path / "crlf.py"
    data = TEXT.read_bytes()[:3000]
    lf.write_bytes(data)
    crlf.write_bytes(data.replace(b"\n", b"\r\n"))
    small = SMALL | {"windows": 2, "window_len": 16, "batch_sizes": (1,)}
    a, b = (
        build_llm_report(tiny_dir, text=t, out_dir=tmp_path / t.stem, variants="fp32", device="cpu", **small)
        for t in (lf, crlf)
    )
    assert np.array_equal(a.windows.tokens, b.windows.tokens)
    assert a.report.lm_quality[0].perplexity == b.report.lm_quality[0].perplexity


def test_a_bad_byte_after_a_bom_is_named_at_its_offset(tiny_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_bytes(b"\xef\xbb\xbfcaf\xe9 = 1\n" * 50)
    rc = cli_main(["report", str(tiny_dir), "--generate", "-o", str(tmp_path / "o"), "--text", str(text)])
    assert rc == 2 and "is not UTF-8 text (byte 0xe9 at offset 6)" in capsys.readouterr().err


def test_a_failed_speed_run_keeps_the_variants_quality(tiny_dir, tmp_path, monkeypatch):
    """The speed run failing (out of memory at the largest batch, say) dropped the perplexity and
    agreement already measured: the quality row said only 'run failed'."""
    import trtforge.llm.report as llm_report

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("out of memory at batch 2")

    monkeypatch.setattr(llm_report, "_speed", out_of_memory)
    small = SMALL | {"windows": 1, "window_len": 16}
    result = build_llm_report(
        tiny_dir, text=TEXT, out_dir=tmp_path / "o", variants="fp32", device="cpu", **small
    )
    (target,), (q,), (p,) = result.report.targets, result.report.lm_quality, result.report.lm_speed
    assert (
        target.status == "failed"
        and target.reason == "speed run failed: RuntimeError: out of memory at batch 2"
    )
    assert q.status == "ok" and q.perplexity > 1 and q.tokens == 15
    assert p.status == "failed" and p.batch == 0 and "out of memory" in p.reason
    assert not list(_validator().iter_errors(json.loads(result.json_path.read_text())))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<|endoftext|>" * 200, "tokenizes to special tokens only ('<|endoftext|>')"),
        # the text's second half, where the windows are, is special tokens only
        (TEXT.read_text()[:2000] + "<|endoftext|>" * 400, "evaluation window 1 (tokens "),
    ],
    ids=["only-special", "windows-special"],
)
def test_a_text_of_special_tokens_only_exits_2(text, message, tiny_dir, tmp_path, capsys):
    """'<|endoftext|>' over and over: every window was the EOS id, and the report said "ok" with a
    perplexity (and a kv-fp8 delta of -24%) measured on no text, exit 0."""
    path = tmp_path / "special.txt"
    path.write_text(text)
    out = tmp_path / "out"
    argv = ["report", str(tiny_dir), "--generate", "-o", str(out), "--no-progress", "--text", str(path)]
    argv += ["--variants", "fp32", "--windows", "2", "--window-len", "16", "--batch", "1"]
    assert cli_main([*argv, "--prompt-len", "4"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_prompt_past_the_models_positions_is_named_before_memory(tiny_dir, tmp_path, capsys):
    """--prompt-len 10**12 on a 256-position model: the KV-memory check ran first and said "--batch 1:
    ... more than this machine's RAM; lower --batch", an option that was not the problem."""
    out = tmp_path / "out"
    argv = ["report", str(tiny_dir), "--generate", "-o", str(out), "--no-progress", "--text", str(TEXT)]
    argv += ["--variants", "fp32", "--windows", "1", "--window-len", "16", "--batch", "1"]
    assert cli_main([*argv, "--prompt-len", str(10**12)]) == 2
    err = capsys.readouterr().err
    assert "exceed the model's 256 positions" in err and "lower --batch" not in err, err
    assert not out.exists()


def test_a_tokenizer_other_than_the_models_own_exits_2(tiny_dir, tmp_path, capsys):
    """--tokenizer of another vocabulary whose ids all lie inside the model's: the report ran and said
    "ok" with the perplexity of text the model read as other tokens (the 21M code model with this
    tiny tokenizer: 6848, its own: 25.6), exit 0."""
    other = tmp_path / "other-tokenizer"
    _tokenizer(300, Path(json.__file__).read_text()).save_pretrained(other)  # (trained on another text)
    out = tmp_path / "out"
    argv = ["report", str(tiny_dir), "--generate", "-o", str(out), "--no-progress", "--text", str(TEXT)]
    assert cli_main([*argv, "--variants", "fp32", "--tokenizer", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"--tokenizer '{other}' is not the tokenizer of the model '{tiny_dir}'" in err, err
    assert not out.exists()
    from trtforge.llm.report import _check_tokenizer_is_the_models

    _check_tokenizer_is_the_models(tiny_dir, tiny_dir)  # its own (or a copy of it) is fine


def test_a_reference_that_was_not_measured_fails_the_check(tiny_dir, tmp_path, capsys, monkeypatch):
    """from_pretrained refusing the reference (a KV pool this machine cannot hold, say): its row said
    "not_run", nothing was compared with it, and the report exited 0, though --check (a CI gate) fails
    a report that compared nothing."""
    import trtforge.llm.service as service
    from trtforge.errors import UserError

    def refuse(*args, **kwargs):
        raise UserError("the KV pool does not fit")

    monkeypatch.setattr(service, "from_pretrained", refuse)
    out = tmp_path / "out"
    argv = ["report", str(tiny_dir), "--generate", "-o", str(out), "--no-progress", "--text", str(TEXT)]
    argv += ["--variants", "fp32,int4-rtn", "--windows", "1", "--window-len", "16", "--batch", "1"]
    assert cli_main(argv) == 3
    err = capsys.readouterr().err
    assert "the reference 'fp32' was not measured (refused: the KV pool does not fit)" in err, err
    doc = json.loads((out / "report.json").read_text())
    assert [t["status"] for t in doc["targets"]] == ["not_run", "not_run"]
    assert cli_main([*argv, "--no-check"]) == 0


def _sparse_text(path: Path, text: bytes, size: int) -> Path:
    """`text`, then a hole to `size` bytes (NULs on reading, no disk): a file of any size at no cost."""
    with open(path, "wb") as f:
        f.write(text)
        f.truncate(size)
    return path


def test_a_huge_text_is_read_only_as_far_as_the_windows_need(tiny_dir, tmp_path, monkeypatch):
    """A GB-sized --text was read whole, decoded and tokenized into a list of every id (gigabytes of RAM
    for windows of a few thousand tokens). Now only its first text_bytes_needed bytes are read, whole
    lines, and a note says so: the NULs of the 2 GiB hole past them are never read (they were: "holds NUL
    bytes")."""
    from trtforge.llm import report as llm_report

    monkeypatch.setattr(llm_report, "TEXT_MIN_BYTES", 16_384, raising=False)
    source = TEXT.read_bytes()
    text = _sparse_text(tmp_path / "huge.txt", source[:40_000], 2 << 30)
    small = SMALL | {"windows": 2, "window_len": 16, "batch_sizes": (1,)}
    result = build_llm_report(
        tiny_dir, text=text, out_dir=tmp_path / "o", variants="fp32", device="cpu", **small
    )
    read = source[: source[:16_384].rfind(b"\n") + 1]
    assert result.windows.text_tokens == len(_tokenizer_of(tiny_dir)(read.decode())["input_ids"])
    assert any(f"its first {len(read):,} bytes of {2 << 30:,} were read" in n for n in result.report.notes)


def _tokenizer_of(model_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return lambda text: tok(text, add_special_tokens=False)


def test_reading_a_huge_text_takes_memory_for_the_part_read_only(tmp_path):
    """The read itself: a 2 GiB file costs what is read (checked with tracemalloc), and a file of one line
    is cut before a character the limit splits, never inside one ('é' is two bytes)."""
    import tracemalloc

    from trtforge.llm.report import _read_text

    text = _sparse_text(tmp_path / "huge.txt", TEXT.read_bytes()[:40_000], 2 << 30)
    tracemalloc.start()
    try:
        got = _read_text(text, 16_384)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.bytes_read <= 16_384 and got.text.endswith("\n") and got.file_size == 2 << 30
    assert peak < 1 << 20, peak
    line = tmp_path / "line.txt"
    line.write_bytes("é".encode() * 1000)
    assert _read_text(line, 1001).text == "é" * 500
    assert _read_text(line, 2000).text == "é" * 1000


def test_the_windows_kv_weights_and_logits_are_held_against_memory_together(tiny_dir, tmp_path, monkeypatch):
    """The memory check counted the speed requests' KV cache alone (the logits had a check of their own,
    each against all of the RAM), so a pool that with the windows' blocks, a copy of the weights and the
    logits could not fit passed, and the run was killed for memory late. Here 4 MiB of RAM: the logits
    (2.9 MiB) and the speed KV (32 KiB) each fit, all of it (about 7 MiB) does not."""
    from trtforge.errors import UserError
    from trtforge.llm import sizing

    monkeypatch.setattr(sizing, "available_ram", lambda: 4 << 20)
    small = SMALL | {"windows": 40, "window_len": 64, "batch_sizes": (1, 2)}
    message = (
        r"variant fp32 \(4 bytes a KV element\) needs .* GiB at once \(.* GiB of KV cache for --batch 2 "
        r"requests of --prompt-len 8 \+ --new-tokens 4 tokens at once, .* GiB of KV cache for --windows 40 "
        r"of --window-len 64 tokens, .* GiB of a copy of the weights, .* GiB of the windows' logits\), more "
        r"than this machine's 0\.00391 GiB of available RAM; lower --windows or --window-len\."
    )
    with pytest.raises(UserError, match=message):
        build_llm_report(tiny_dir, text=TEXT, out_dir=tmp_path / "o", variants="fp32", device="cpu", **small)
    assert not (tmp_path / "o").exists()


def test_a_gpu_pool_is_held_against_the_gpus_free_memory(tiny_dir, monkeypatch):
    """On a GPU the speed KV was held against the card's total memory, weights and other processes left
    out: a pool that could not be allocated passed, and each serving variant was refused late with
    "num_blocks N: the KV-cache pool ... cannot be allocated", an option the report has not got."""
    from trtforge.errors import UserError
    from trtforge.llm.models.loader import load_causal_lm
    from trtforge.llm.report import _check_memory_fits

    class Props:
        total_memory = 80 << 30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (1 << 20, 80 << 30))
    lm = load_causal_lm(tiny_dir)
    sizes = {"windows": 2, "window_len": 16, "batch": 64, "prompt_len": 128, "new_tokens": 32}
    with pytest.raises(
        UserError, match=r"than this machine's 0\.000977 GiB of free memory of GPU 1; lower --batch"
    ):
        _check_memory_fits(lm, ["bf16", "kv-fp8"], "cuda:1", "bf16", **sizes)
    _check_memory_fits(lm, ["bf16"], "cuda:1", "bf16", **(sizes | {"batch": 1, "prompt_len": 8}))
