"""`trtforge report MODEL --generate`: a causal LM's precision variants compared on quality and speed.

Written with the encoder report's machinery (:mod:`trtforge.reports`: the same :class:`Report`,
renderers, schema and atomic writes); this module only measures. For every variant:

- **perplexity** on a text file: ``windows`` windows of ``window_len`` tokens, evenly spaced over the
  second half of the tokenized text (the same windows for every variant; their start offsets are in
  the JSON). Serving variants run each window through their executor as prompt chunks of ``chunk``
  tokens, asking it for the logits of every position, so later chunks attend to K/V read back from
  the (possibly FP8) cache, as in serving. Step-graph variants run each window as one prefill of an
  all-logits step graph in exact ONNX Runtime.
- **greedy top-1 agreement**: the fraction of those positions whose argmax is the reference's.
- **TTFT / ITL / throughput** (serving variants only) at each batch size, through the engine
  (``llm.from_pretrained`` + :class:`~trtforge.llm.engine.LLMEngine`): B requests of ``prompt_len``
  tokens of the text submitted at once, ``new_tokens`` greedy tokens each.
- **KV bytes per token** from the executor's facts (step graphs: their cache dtype).

Serving variants map onto ``from_pretrained(model, quantization=..., kv_cache_dtype=...,
lm_head_quantization=...)`` (``+head-fp8``: the LM head in FP8 too); a variant
this machine cannot run (``from_pretrained`` refuses it by name: FP8 needs FP8 tensor cores, compute
capability 8.9+; the CPU runs the float reference path) keeps its row with the reason. Calibration
prompts (int8 / fp8 step graphs, int4-awq, the FP8 KV cache's scales) come from the text's first half,
disjoint from the evaluation windows.

May import ``reports`` (its top floor) and everything ``llm`` and ``llm.compile`` may.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtforge._fileio import as_path, refuse_overwriting_inputs, work_directory
from trtforge.errors import UserError, shown
from trtforge.llm.contract import DEFAULT_BLOCK_SIZE
from trtforge.reports.results import FAILED, NOT_RUN, OK, LmQuality, LmSpeed, Report, TargetInfo

# variant -> from_pretrained options (beyond dtype); the reference is "bf16" on a GPU, "fp32" on the CPU
SERVING_VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "bf16": {},
    "fp16": {},
    "fp8": {"quantization": "fp8"},
    "int4-awq": {"quantization": "int4-awq"},
    "int4-rtn": {"quantization": "int4-rtn"},
    "fp8+head-fp8": {"quantization": "fp8", "lm_head_quantization": "fp8"},
    "int4-awq+head-fp8": {"quantization": "int4-awq", "lm_head_quantization": "fp8"},
    "kv-fp8": {"kv_cache_dtype": "fp8"},
    "fp8+kv-fp8": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
}
# step-graph variants (exact ONNX Runtime, quality only) -> compile --generate --precision
STEP_VARIANTS = {"onnx-fp32": "fp32", "onnx-int8": "int8", "onnx-fp8": "fp8", "onnx-int4": "int4"}
VARIANTS = (*SERVING_VARIANTS, *STEP_VARIANTS)
FLOAT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DEFAULT_WINDOWS = 8
DEFAULT_WINDOW_LEN = 256
DEFAULT_CHUNK = 64
DEFAULT_PROMPT_LEN = 128
DEFAULT_NEW_TOKENS = 32
CALIB_PROMPTS, CALIB_LEN = 16, 128


@dataclass
class Windows:
    """The evaluation windows (token ids) and the calibration prompts, both cut from one text."""

    tokens: np.ndarray  # int64 [windows, window_len]
    starts: list[int]
    calibration: list[list[int]]
    text_tokens: int


@dataclass
class _Scores:
    nll: float
    tokens: int
    argmax: np.ndarray  # int64 [windows, window_len - 1]

    @property
    def perplexity(self) -> float:
        """exp(mean NLL); inf where that overflows a float (a variant whose logits are wildly off:
        math.exp raised OverflowError after every variant had run)."""
        mean = self.nll / self.tokens
        return math.exp(mean) if mean < 700 else math.inf


@dataclass
class LmReportResult:
    """Paths of the written report files and the report they were rendered from."""

    html_path: Path
    markdown_path: Path
    json_path: Path
    report: Report
    windows: Windows = field(repr=False, default=None)  # type: ignore[assignment]


def parse_variants(text: str | Sequence[str] | None, reference: str) -> list[str]:
    """The variant list (reference first), refusing unknown names before any work."""
    if text is None:
        names = [reference, *(v for v in SERVING_VARIANTS if v not in FLOAT_DTYPES), *STEP_VARIANTS]
    else:
        raw = text.split(",") if isinstance(text, str) else [n for t in text for n in t.split(",")]
        names = [n.strip() for n in raw if n.strip()]
        unknown = [n for n in names if n not in VARIANTS]
        if unknown or not names:
            given = text if isinstance(text, str) else ",".join(text)
            what = f"unknown variant(s) {unknown}" if unknown else f"{given!r} names no variant"
            raise UserError(f"--variants: {what}; expected a comma-separated list of {', '.join(VARIANTS)}.")
    return list(dict.fromkeys([reference, *names]))


def cut_windows(ids: Sequence[int], windows: int, window_len: int, what: str) -> Windows:
    """`windows` windows evenly spaced over the second half of `ids`; calibration from the first half."""
    if windows < 1 or window_len < 2:
        raise UserError(f"--windows must be >= 1 and --window-len >= 2; got {windows} and {window_len}.")
    ids = np.asarray(ids, dtype=np.int64)
    half = len(ids) // 2
    if len(ids) - half < window_len:
        raise UserError(
            f"{what} has {len(ids)} tokens; the evaluation windows come from its second half, which needs at "
            f"least --window-len {window_len} tokens (give a longer text or a shorter --window-len)."
        )
    span = len(ids) - half - window_len
    if windows > span + 1:  # (the starts repeated: one window scored several times, counted as more tokens)
        raise UserError(
            f"{what} has {len(ids)} tokens; its second half holds only {span + 1} distinct windows of "
            f"--window-len {window_len}, fewer than --windows {windows} (lower --windows or --window-len, or "
            "give a longer text)."
        )
    starts = [half + (span * i // max(windows - 1, 1) if windows > 1 else 0) for i in range(windows)]
    tokens = np.stack([ids[s : s + window_len] for s in starts])
    calib_len = min(CALIB_LEN, window_len, half)  # (half: never into the first window, ids[half])
    step = max(1, (half - calib_len) // CALIB_PROMPTS) if half > calib_len else 0
    calibration = [ids[i * step : i * step + calib_len].tolist() for i in range(CALIB_PROMPTS)]
    calibration = [c for c in calibration if c] or [ids[:calib_len].tolist()]
    return Windows(tokens, starts, calibration, len(ids))


#: the least of --text read: the whole of any ordinary evaluation text (eval_stdlib.txt is 1 MB)
TEXT_MIN_BYTES = 16 << 20
#: bytes a token is allowed when sizing what of --text to read: far more than text takes (code ~3, any
#: UTF-8 text at most 4 a character), so the part read holds the tokens the windows and prompts need
_BYTES_PER_TOKEN = 32


def text_bytes_needed(windows: int, window_len: int, prompt_len: int) -> int:
    """The bytes of --text to read: enough for twice the tokens the windows or the speed prompts take
    (the windows come from the second half), and at least TEXT_MIN_BYTES."""
    tokens = max(windows * window_len, prompt_len, 0)
    return max(TEXT_MIN_BYTES, 2 * tokens * _BYTES_PER_TOKEN)


@dataclass
class _Text:
    """The part of --text read: its text, the bytes it came from and the file's size."""

    text: str
    bytes_read: int
    file_size: int


def _read_text(text_path: Path, limit: int) -> _Text:
    """The --text file's text, of its first `limit` bytes at most (cut after the last whole line): a
    GB-sized text was read whole, decoded and tokenized into a list of every id, gigabytes of RAM for
    windows that need a few thousand tokens. UserError for one that is not UTF-8 text (a binary file, or
    another encoding), whose perplexity would be measured on replacement characters and say nothing."""
    try:
        with open(text_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(limit + 1)
    except OSError as e:
        raise UserError(f"--text '{text_path}': cannot read it ({e.strerror or e}).") from e
    if len(data) > limit:  # (more follows: keep whole lines, or whole characters of a file of one line)
        data = data[:limit]
        line_end = data.rfind(b"\n")
        if line_end >= 0:
            data = data[: line_end + 1]
        else:  # (the first byte of the last character, and whether the limit split that character)
            start = len(data) - 1
            while start > max(len(data) - 4, 0) and data[start] & 0xC0 == 0x80:
                start -= 1
            lead = data[start]
            width = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            data = data[:start] if len(data) - start < width else data
    if b"\0" in data:
        raise UserError(
            f"--text '{text_path}' holds NUL bytes (the first at offset {data.index(0)}): a binary file, "
            "not text; expected a UTF-8 text file."
        )
    try:  # (utf-8-sig: a leading byte-order mark is no text; it was tokenized and shifted every window)
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        at = e.start + len(data) - len(e.object)  # (the decoder's offsets leave out a BOM it skipped)
        raise UserError(
            f"--text '{text_path}' is not UTF-8 text (byte 0x{data[at]:02x} at offset {at}); "
            "expected a UTF-8 text file."
        ) from None
    # universal newlines, as read_text gave before the bytes were checked: a CRLF copy of a text (a Windows
    # checkout) was measured on its '\r' tokens, a perplexity of line endings the tokenizer never saw
    return _Text(text.replace("\r\n", "\n").replace("\r", "\n"), len(data), max(size, len(data)))


def _check_logits_fit(windows: int, window_len: int, vocab: int) -> None:
    """UserError when the logits of every window, held at once for scoring (float32 [windows, window_len,
    vocab]), exceed this machine's available RAM: a large --windows was killed for memory (exit 137)."""
    from trtforge.llm.sizing import available_ram

    need, ram = 4 * windows * window_len * vocab, available_ram()
    if need > ram:
        raise UserError(
            f"--windows {windows} x --window-len {window_len} x the vocabulary's {vocab} logits take "
            f"{need / 2**30:.3g} GiB, more than this machine's {ram / 2**30:.3g} GiB of available RAM; "
            "lower --windows or --window-len."
        )


def _pool_blocks(windows: int, window_len: int, batch: int, speed_len: int) -> int:
    """KV blocks of a serving variant's pool: every window's at once, the largest batch's requests of
    `speed_len` tokens at once, and two spare."""
    bs = DEFAULT_BLOCK_SIZE
    return windows * _blocks(window_len, bs) + batch * _blocks(speed_len, bs) + 2


def _check_memory_fits(
    lm: Any,
    names: Sequence[str],
    device: str,
    reference: str,
    *,
    windows: int,
    window_len: int,
    batch: int,
    prompt_len: int,
    new_tokens: int,
) -> None:
    """UserError, before any variant runs, when the largest serving variant does not fit the memory free
    for it: its KV pool (the windows' blocks and the largest --batch's, as `_serving_variant` allocates
    it, at the widest KV element of the variants asked for), its copy of the weights and, on the CPU, the
    windows' logits held for scoring. Before: the speed requests' KV alone (float32) was held against
    the whole machine (a GPU's total memory, weights and windows left out), so a pool that could not fit
    passed, and every serving variant was refused late as "num_blocks N: ... cannot be allocated" (an
    option the report has not got), or the CPU run was killed for memory."""
    import torch

    from trtforge.llm.executors.kv_cache import kv_element_bytes
    from trtforge.llm.models.base import logits_width
    from trtforge.llm.sizing import available_ram, model_kv_block_bytes

    serving = [n for n in names if n in SERVING_VARIANTS]
    if not serving:  # (step graphs run in ONNX Runtime, one window at a time)
        return
    dtypes = {n: getattr(torch, FLOAT_DTYPES.get(n, FLOAT_DTYPES[reference])) for n in serving}
    kv_bytes = {
        n: kv_element_bytes(SERVING_VARIANTS[n].get("kv_cache_dtype", "auto"), dtypes[n]) for n in serving
    }
    widest = max(serving, key=lambda n: kv_bytes[n])
    block = model_kv_block_bytes(lm, DEFAULT_BLOCK_SIZE, kv_bytes[widest])
    speed_kv = batch * _blocks(prompt_len + new_tokens, DEFAULT_BLOCK_SIZE) * block
    window_kv = _pool_blocks(windows, window_len, batch, prompt_len + new_tokens) * block - speed_kv
    weights = sum(p.numel() for p in lm.parameters()) * max(d.itemsize for d in dtypes.values())
    parts = {
        f"KV cache for --batch {batch} requests of --prompt-len {prompt_len} + --new-tokens {new_tokens} "
        "tokens at once": speed_kv,
        f"KV cache for --windows {windows} of --window-len {window_len} tokens": window_kv,
        "a copy of the weights": weights,
    }
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        have, where = int(torch.cuda.mem_get_info(index)[0]), f"free memory of GPU {index}"
    else:
        parts["the windows' logits"] = 4 * windows * window_len * logits_width(lm)
        have, where = available_ram(), "available RAM"
    need = sum(parts.values())
    if need <= have:
        return
    lower = "--batch or --prompt-len" if speed_kv >= window_kv else "--windows or --window-len"
    listed = ", ".join(f"{v / 2**30:.3g} GiB of {k}" for k, v in parts.items())
    raise UserError(
        f"variant {widest} ({kv_bytes[widest]} bytes a KV element) needs {need / 2**30:.3g} GiB at once "
        f"({listed}), more than this machine's {have / 2**30:.3g} GiB of {where}; lower {lower}."
    )


def _check_can_create(out: Path) -> None:
    """UserError, before any work, when the report directory cannot be made: its nearest existing
    ancestor is a file, or a directory this process may not write (the files are written only at the
    end, after every variant has run)."""
    parent = out
    while not parent.exists() and parent != parent.parent:
        if os.path.islink(parent):  # (the write failed after every variant had run: "No such file")
            raise UserError(
                f"cannot create report directory '{out}': '{parent}' is a symbolic link to "
                f"'{os.readlink(parent)}', which does not exist."
            )
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"cannot create report directory '{out}': '{parent}' is a file, not a directory.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot create report directory '{out}': directory '{parent}' is not writable.")


def _device(device: str | None) -> str:
    """The torch device of the serving variants (None: cuda if present, else cpu). UserError, before any
    work, for a string torch does not parse, a kind other than cpu/cuda, or a GPU this machine lacks:
    otherwise every variant failed to load and the report said so with exit 3."""
    from trtforge.llm.service import default_device

    return default_device(device, "--device")


def _tokenize(text: str, tokenizer_dir: Any) -> tuple[list[int], dict[int, str]]:
    """The text's token ids (no BOS added) and the tokenizer's special tokens (id -> token)."""
    from trtforge.llm.text import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    special = dict(zip(tok.all_special_ids, tok.all_special_tokens, strict=False))
    return list(tok(text, add_special_tokens=False)["input_ids"]), special


def _check_windows_hold_text(w: Windows, ids: Sequence[int], special: dict[int, str], what: str) -> None:
    """UserError when an evaluation window is special tokens only (a text of '<|endoftext|>' over and
    over): its perplexity measures how the model predicts its control tokens, not text; the report said
    "ok" with a perplexity and deltas of nothing."""

    def named(present: set[int]) -> str:
        return ", ".join(repr(special[i]) for i in sorted(present & special.keys()))

    present = set(np.unique(np.asarray(ids, dtype=np.int64)).tolist())
    if not present - special.keys():
        raise UserError(
            f"{what} tokenizes to special tokens only ({named(present)}): there is no text to measure "
            "perplexity on; expected a UTF-8 text file of the kind the model reads."
        )
    for i, row in enumerate(w.tokens):
        present = set(row.tolist())
        if not present - special.keys():
            raise UserError(
                f"{what}: evaluation window {i} (tokens {w.starts[i]}..{w.starts[i] + len(row) - 1} of "
                f"{w.text_tokens}) is special tokens only ({named(present)}): its perplexity would measure "
                "no text; give a text with fewer of them, or another --windows / --window-len."
            )


def _check_tokenizer_is_the_models(model: Any, tokenizer: Any) -> None:
    """UserError when --tokenizer maps ids to other tokens than the model directory's own tokenizer (the
    id -> token maps compared as for a speculative draft: :mod:`trtforge.llm.vocab`). Its ids
    all lay inside the model's vocabulary, so the report ran and said "ok" with a perplexity of text the
    model read as other tokens (the 21M code model: 6848 instead of 25.6). Nothing to compare for a model
    without tokenizer files (module:factory, an nn.Module), which is what --tokenizer is for."""
    from trtforge.llm.text import has_tokenizer, load_tokenizer
    from trtforge.llm.vocab import MAX_REGULAR_MISMATCH, compare_vocabularies, regular_size

    if tokenizer is None or not isinstance(model, (str, os.PathLike)) or not has_tokenizer(model):
        return
    own = load_tokenizer(model)
    regular, _ = compare_vocabularies(own, load_tokenizer(tokenizer))
    size = regular_size(own)
    if len(regular) > MAX_REGULAR_MISMATCH * size:

        def token(t: str | None) -> str:
            return "unused" if t is None else repr(t)

        examples = "; ".join(f"id {i}: {token(a)} vs {token(b)}" for i, a, b in regular[:3])
        raise UserError(
            f"--tokenizer '{tokenizer}' is not the tokenizer of the model '{model}': "
            f"{len(regular)} of the {size} regular token ids of the model's own mean other tokens in it "
            f"({examples}), so the perplexity would be measured on text the model reads as other tokens. "
            "Drop --tokenizer (the model directory's own is used) or name one with the model's vocabulary."
        )


def _check_text_vocabulary(ids: Sequence[int], lm: Any, tokenizer: Any) -> None:
    """UserError naming the tokenizer when --text tokenizes to an id past the model's input vocabulary
    (its embedding's rows): another model's tokenizer. Unchecked, every variant's run failed on the
    embedding lookup and the report said "IndexError: index out of range in self" with exit 3."""
    embedding = lm.get_input_embeddings() if callable(getattr(lm, "get_input_embeddings", None)) else None
    rows = getattr(embedding, "num_embeddings", None) or getattr(lm.config, "vocab_size", None)
    if rows is None or not ids:
        return
    top = max(ids)
    if top >= rows:
        source = f"--tokenizer {shown(str(tokenizer))}" if tokenizer is not None else "the model's tokenizer"
        raise UserError(
            f"--text: {source} gave token id {top}, outside the model's vocabulary of {rows} ids "
            f"(0..{rows - 1}): it is not this model's tokenizer."
        )


class NonFiniteLogits(Exception):
    """A variant's logits hold NaN or inf: it has no perplexity (the variant failed)."""


def _score(logits_of: Any, w: Windows) -> _Scores:
    """NLL of each window's next tokens from `logits_of(window index) -> [window_len, V]`.

    NonFiniteLogits when a scored position's logits hold NaN or inf (NaN scores said "ok" and the
    quality plot raised ValueError after every variant had run)."""
    nll, argmax = 0.0, []
    for i, row in enumerate(w.tokens):
        logits = np.asarray(logits_of(i), dtype=np.float64)[:-1]
        bad = ~np.isfinite(logits).all(-1)
        if bad.any():
            raise NonFiniteLogits(
                f"non-finite logits (NaN or inf) at {int(bad.sum())} of {len(bad)} positions of window {i} "
                f"(start {w.starts[i]})"
            )
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        nll += float((logz - logits[np.arange(len(row) - 1), row[1:]]).sum())
        argmax.append(logits.argmax(-1))
    return _Scores(nll, int(w.tokens.shape[0] * (w.tokens.shape[1] - 1)), np.stack(argmax))


def _quality(
    name: str, s: _Scores, ref: _Scores | None, kv_bytes: int | None, kv_dtype: str | None
) -> LmQuality:
    ppl = s.perplexity
    delta = None
    if ref is not None and math.isfinite(ref.perplexity):  # (inf / inf: no delta to give)
        delta = 100.0 * (ppl / ref.perplexity - 1.0)
    return LmQuality(
        target=name,
        perplexity=ppl,
        delta_ppl_pct=delta,
        nll_per_token=s.nll / s.tokens,
        tokens=s.tokens,
        top1_agreement=None if ref is None else float((s.argmax == ref.argmax).mean()),
        kv_bytes_per_token=kv_bytes,
        kv_dtype=kv_dtype,
    )


# ---- serving variants ------------------------------------------------------------------------------
def _unavailable(name: str, device: str) -> str | None:
    """Why serving variant `name` is not measured on `device` (None: try it; what the machine cannot run,
    such as FP8 on a GPU older than compute capability 8.9, ``from_pretrained`` refuses by name)."""
    if name in ("bf16", "fp16") and not device.startswith("cuda"):
        return f"{name} serving is measured on a GPU; on the CPU the reference is fp32"
    return None


def _calibration(options: dict[str, Any], w: Windows) -> dict[str, Any]:
    """`calib_prompts` for the variants that calibrate (AWQ's scale search, the FP8 KV cache's scales):
    prompts from the text's first half, disjoint from the evaluation windows."""
    if options.get("quantization") == "int4-awq" or options.get("kv_cache_dtype") == "fp8":
        return {"calib_prompts": w.calibration}
    return {}


def _blocks(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


def _executor_logits(ex: Any, w: Windows, chunk: int) -> list[np.ndarray]:
    """Every window's logits [window_len, V] from `ex.step`, prompt chunk by prompt chunk.

    Each window is one sequence with its own blocks; every chunk asks for the logits of all its rows."""
    from trtforge.llm.executors.base import StepBatch

    facts = ex.facts
    bs, n, length = facts.block_size, w.tokens.shape[0], w.tokens.shape[1]
    per = _blocks(length, bs)
    if n * per > facts.num_blocks:
        raise UserError(f"the KV pool holds {facts.num_blocks} blocks; {n} windows need {n * per}.")
    out: list[list[np.ndarray]] = [[] for _ in range(n)]
    for start in range(0, length, chunk):
        end = min(length, start + chunk)
        tables = [list(range(b * per, (b + 1) * per)) for b in range(n)]
        slots = [[tables[b][p // bs] * bs + p % bs for p in range(start, end)] for b in range(n)]
        batch = StepBatch.build(
            list(range(n)),
            [w.tokens[b, start:end].tolist() for b in range(n)],
            [start] * n,
            tables,
            slots,
            [True] * n,
        )
        batch = dataclasses.replace(batch, logits_indices=np.arange(batch.num_tokens, dtype=np.int64))
        logits = ex.step(batch)
        logits = logits.float().cpu().numpy() if hasattr(logits, "cpu") else np.asarray(logits)
        for b in range(n):
            out[b].append(logits[b * (end - start) : (b + 1) * (end - start)])
    return [np.concatenate(x) for x in out]


class _Stamps:
    """An engine event callback: appends the arrival time of each token of one request (the engine's
    loop thread calls it; each request has its own list)."""

    def __init__(self, into: list[float]) -> None:
        self.into = into

    def __call__(self, event: Any) -> None:
        if isinstance(event, (list, tuple)):
            self.into.extend([time.perf_counter()] * len(event))


def _speed(
    llm: Any, name: str, prompts: list[list[int]], batch_sizes: Sequence[int], new_tokens: int
) -> list[LmSpeed]:
    """TTFT / ITL / throughput at each batch size: B requests submitted at once, greedy, no early stop
    (on an engine without prefix caching: the warm-up runs the same prompts)."""
    from trtforge.llm.sampling import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    engine = llm.engine
    # warm-up: kernels, graphs and allocator caches of the largest batch
    for h in [
        engine.submit(prompts[i % len(prompts)], dataclasses.replace(params, max_tokens=2))
        for i in range(max(batch_sizes))
    ]:
        h.result()
    points = []
    for b in batch_sizes:
        times: list[list[float]] = [[] for _ in range(b)]
        t0 = time.perf_counter()
        handles = [
            engine.submit(prompts[i % len(prompts)], params, on_event=_Stamps(times[i])) for i in range(b)
        ]
        done = [h.result() for h in handles]
        wall = time.perf_counter() - t0
        ttft = [t[0] - t0 for t in times if t]
        itl = [(t[-1] - t[0]) / (len(t) - 1) for t in times if len(t) > 1 and t[-1] > t[0]]
        generated = sum(len(c.token_ids) for c in done)
        points.append(
            LmSpeed(
                target=name,
                batch=int(b),
                prompt_tokens=len(prompts[0]),
                new_tokens=new_tokens,
                ttft_ms=1e3 * float(np.median(ttft)) if ttft else None,
                itl_ms=1e3 * float(np.mean(itl)) if itl else None,
                throughput_tok_s=generated / wall,
                wall_s=wall,
            )
        )
    return points


def _speed_config(batch: int) -> Any:
    """The serving engine's scheduler for the speed runs: the defaults, with room for `batch` requests
    at once (256 ran at a time, so a --batch past it queued the rest and its TTFT counted the wait), and
    no prefix caching: every timed request pays its prefill (the warm-up and each earlier batch size ran
    the same prompts and left their blocks cached, so TTFT measured ~1 token)."""
    from trtforge.llm.sizing import default_scheduler_config

    config = default_scheduler_config(None)
    return dataclasses.replace(
        config,
        max_num_seqs=max(config.max_num_seqs, batch),
        max_num_batched_tokens=max(config.max_num_batched_tokens, batch),
        enable_prefix_caching=False,
    )


def _serving_variant(
    model: Any,
    name: str,
    device: str,
    ref_dtype: str,
    w: Windows,
    chunk: int,
    speed_args: dict[str, Any] | None,
) -> tuple[TargetInfo, _Scores | None, list[LmSpeed], dict[str, Any]]:
    import torch

    from trtforge.llm.service import from_pretrained

    options = dict(SERVING_VARIANTS[name])
    dtype = FLOAT_DTYPES.get(name, ref_dtype)
    precision = " + ".join([*(f"{k}={v}" for k, v in options.items()), f"{dtype} rest" if options else dtype])
    info = TargetInfo(
        name,
        "torch",
        precision,
        device,
        f"llm.from_pretrained(model, dtype={dtype}"
        + "".join(f", {k}={v!r}" for k, v in options.items())
        + ") on the torch executor",
    )
    why = _unavailable(name, device)
    if why:
        info.status, info.reason = NOT_RUN, why
        return info, None, [], {}
    t0 = time.perf_counter()
    length = w.tokens.shape[1]
    speed_len = (speed_args or {}).get("prompt_len", 0) + (speed_args or {}).get("new_tokens", 0)
    bs = DEFAULT_BLOCK_SIZE
    need = _pool_blocks(w.tokens.shape[0], length, max((speed_args or {}).get("batch_sizes", [1])), speed_len)
    src = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
    try:
        llm = from_pretrained(
            src,
            device=device,
            dtype=getattr(torch, dtype),
            num_blocks=need,
            block_size=bs,
            max_model_len=max(length, speed_len, 2),
            # every timed request pays its prefill: with prefix caching, the warm-up (the same prompts)
            # and each earlier batch size left the prompts' blocks cached, and TTFT measured ~1 token
            config=_speed_config(max((speed_args or {}).get("batch_sizes", [1]))),
            **options,
            **_calibration(options, w),
        )
    except UserError as e:
        info.status, info.reason = NOT_RUN, f"refused: {e}"
        return info, None, [], {}
    except Exception as e:
        info.status, info.reason = FAILED, f"could not load: {type(e).__name__}: {str(e).strip()[:400]}"
        return info, None, [], {}
    info.prepare_seconds = time.perf_counter() - t0
    try:
        return _measure_serving(llm, info, name, w, chunk, speed_args)
    finally:
        llm.close()


def _measure_serving(
    llm: Any, info: TargetInfo, name: str, w: Windows, chunk: int, speed_args: dict[str, Any] | None
) -> tuple[TargetInfo, _Scores | None, list[LmSpeed], dict[str, Any]]:
    """A loaded serving variant's quality, then its speed. A failed speed run (running out of memory
    at the largest batch, say) fails the variant but keeps its quality: it was dropped with it."""
    try:
        facts = llm.executor.facts
        info.records = {
            "quantization": getattr(facts, "quantization", None),
            "lm_head_quantization": getattr(facts, "lm_head_quantization", None),
            "executor": type(llm.executor).__name__,
            "kv_dtype": facts.kv_dtype,
            "kv_bytes_per_token": facts.kv_bytes_per_token,
            "num_blocks": facts.num_blocks,
        }
        logits = _executor_logits(llm.executor, w, chunk)
        scores = _score(lambda i: logits[i], w)
    except UserError:
        raise
    except Exception as e:
        info.status, info.reason = FAILED, f"run failed: {type(e).__name__}: {str(e).strip()[:400]}"
        return info, None, [], {}
    kv = {"kv_bytes": facts.kv_bytes_per_token, "kv_dtype": facts.kv_dtype}
    if not speed_args:
        return info, scores, [], kv
    try:
        speed = _speed(llm, name, speed_args["prompts"], speed_args["batch_sizes"], speed_args["new_tokens"])
    except UserError:
        raise
    except Exception as e:
        info.status, info.reason = FAILED, f"speed run failed: {type(e).__name__}: {str(e).strip()[:400]}"
        return info, scores, [], kv
    stats = llm.stats  # what the timed requests met: a batch all at once, no cache, no preemption
    info.records["scheduler"] = {
        "max_running": stats.max_running,
        "prefix_hit_tokens": stats.prefix_hit_tokens,
        "preemptions": stats.preemptions,
    }
    return info, scores, speed, kv


# ---- step-graph variants ---------------------------------------------------------------------------
def _fp32_step_graph(lm: Any, w: Windows, workdir: Path) -> Path:
    """The all-logits FP32 step graph every step variant starts from (exported and fused once)."""
    from trtforge.llm.compile.compile import compile_generate

    path = workdir / "onnx-fp32.onnx"
    if not path.exists():
        length = w.tokens.shape[1]
        compile_generate(
            lm, None, build=False, save_onnx=path, precision="fp32", all_logits=True, max_seq=length,
            max_batch=1, max_prefill=length, exporter="legacy", progress=False,
        )  # fmt: skip
    return path


def _step_variant(
    lm: Any, name: str, w: Windows, workdir: Path
) -> tuple[TargetInfo, _Scores | None, dict[str, Any]]:
    """A step-graph variant: the FP32 graph through compile's precision stages, scored in exact ORT;
    its KV bytes a token from the graph's own generation record (the adapter's geometry at export)."""
    import onnx

    from trtforge.core.tensor_spec import numpy_dtype_of
    from trtforge.llm import sizing
    from trtforge.llm.compile.compile import apply_precision
    from trtforge.llm.contract import generation_metadata, set_generation_metadata
    from trtforge.numerics.sessions import exact_session

    precision = STEP_VARIANTS[name]
    rest = "" if precision == "fp32" else " + fp16 rest"
    info = TargetInfo(
        name,
        "onnxruntime",
        f"{precision}{rest}",
        "cpu",
        f"compile --generate --precision {precision} step graph (all logits), exact ONNX Runtime",
    )
    length = w.tokens.shape[1]
    t0 = time.perf_counter()
    records: dict[str, Any] = {}
    try:
        base = _fp32_step_graph(lm, w, workdir)
        proto = onnx.load(str(base))
        g = generation_metadata(proto, str(base))
        if precision != "fp32":
            calib = w.calibration if precision in ("int8", "fp8") else None
            proto = apply_precision(proto, g, precision, calib, records)
            set_generation_metadata(proto, g)
    except UserError as e:
        info.status, info.reason = NOT_RUN, f"refused: {e}"
        return info, None, {}
    except Exception as e:
        info.status = FAILED
        info.reason = f"could not make the step graph: {type(e).__name__}: {str(e)[:400]}"
        return info, None, {}
    info.prepare_seconds = time.perf_counter() - t0
    info.records = {k: _summary(v) for k, v in records.items()}
    sess = exact_session(proto)
    cache = (1, int(g["num_kv_heads"]), int(g["max_seq"]), int(g["head_dim"]))
    dtype = numpy_dtype_of(g["cache"]["dtype"], "the step graph's KV cache")

    def logits_of(i: int) -> np.ndarray:
        feeds = {
            "input_ids": w.tokens[i][None],
            "position_ids": np.arange(length, dtype=np.int64)[None],
            "past_lens": np.zeros(1, np.int64),
            "new_lens": np.array([length], np.int64),
        }
        feeds |= {n: np.zeros(cache, dtype) for n in g["cache"]["inputs"]}
        return sess.run(["logits"], feeds)[0][0]

    layers, kv_heads, head_dim = int(g["num_layers"]), int(g["num_kv_heads"]), int(g["head_dim"])
    kv_bytes = sizing.kv_block_bytes(layers, kv_heads, head_dim, 1, dtype.itemsize)
    try:
        scores = _score(logits_of, w)
    except NonFiniteLogits as e:
        info.status, info.reason = FAILED, f"run failed: {e}"
        return info, None, {}
    return info, scores, {"kv_bytes": kv_bytes, "kv_dtype": g["cache"]["dtype"]}


def _summary(record: Any) -> Any:
    """A manifest stage record without its long per-node lists (for the report's records)."""
    if not isinstance(record, dict):
        return record
    drop = ("decisions", "fallback_decisions", "nodes", "casts", "kept")
    return {k: v for k, v in record.items() if k not in drop and not (isinstance(v, list) and len(v) > 8)}


# ---- the report ------------------------------------------------------------------------------------
def _model_name(label: str) -> str:
    """The model's name for the title: its directory's name (that of the absolute path, so that `.` or
    `..` names the directory, not nothing), a factory's or a module class's name as given."""
    return Path(os.path.abspath(label)).name if os.path.isdir(label) else Path(label).name or label


def build_llm_report(
    model: Any,
    *,
    text: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    variants: str | Sequence[str] | None = None,
    tokenizer: Any = None,
    windows: int = DEFAULT_WINDOWS,
    window_len: int = DEFAULT_WINDOW_LEN,
    chunk: int = DEFAULT_CHUNK,
    batch_sizes: Sequence[int] = (1, 4),
    prompt_len: int = DEFAULT_PROMPT_LEN,
    new_tokens: int = DEFAULT_NEW_TOKENS,
    device: str | None = None,
    threads: int | None = None,
    title: str | None = None,
    progress: bool = False,
) -> LmReportResult:
    """Compare a causal LM's variants (see module doc); write report.html/.md/.json into `out_dir`.

    `model`: a save_pretrained directory, ``module:factory`` or an nn.Module (then pass `tokenizer`).
    Bad input (a missing text, an unknown variant, a model that is no causal LM) raises UserError
    before anything is written; the three files are written together at the end, or none.
    `progress`: a bar on stderr, one step per variant.
    """
    from trtforge.llm.models.base import logits_width
    from trtforge.llm.models.families import adapter_for
    from trtforge.llm.models.loader import load_causal_lm, transformers_bars
    from trtforge.reports.api import (
        StepProgress,
        check_out_dir,
        create_out_dir,
        environment,
        torch_threads,
    )
    from trtforge.reports.render import REPORT_FILES, write_report

    text_path = as_path(text, "--text")
    if not text_path.is_file():
        raise UserError(f"--text '{text_path}' does not exist or is not a file; expected a UTF-8 text file.")
    _check_can_create(check_out_dir(out_dir))
    outputs = {f"the report file {name}": Path(out_dir) / name for name in REPORT_FILES}
    refuse_overwriting_inputs(outputs, {"--text file": text_path})  # (it would be replaced by the report)
    if not batch_sizes or min(int(b) for b in batch_sizes) < 1:
        raise UserError(f"--batch: expected positive integers, got {list(batch_sizes)}.")
    batch_sizes = list(dict.fromkeys(int(b) for b in batch_sizes))  # (--batch 1,1 timed batch 1 twice)
    if chunk < 1 or prompt_len < 1 or new_tokens < 2:
        raise UserError(
            "--chunk and --prompt-len must be >= 1, --new-tokens >= 2 "
            f"(got {chunk}, {prompt_len}, {new_tokens})."
        )
    device = _device(device)
    reference = "bf16" if device.startswith("cuda") else "fp32"
    names = parse_variants(variants, reference)
    _check_tokenizer_is_the_models(model, tokenizer)
    with transformers_bars(progress):  # (the one read of the weights: the variants copy the model)
        lm = load_causal_lm(model)
    tok_dir = (
        tokenizer if tokenizer is not None else (model if isinstance(model, (str, os.PathLike)) else None)
    )
    if tok_dir is None:
        raise UserError("--text needs a tokenizer: the model directory's own, or --tokenizer DIR.")
    # the rule compile --generate's --max-seq and the executors' max_model_len follow (a static rotary
    # scaling extends the positions; before, max_position_embeddings alone was the limit here); checked
    # before the memory checks, which blamed --batch (or RAM) for a --prompt-len past the positions
    limit = adapter_for(lm, "report --generate").sequence_limit
    if limit is not None and max(window_len, prompt_len + new_tokens) > limit[0]:
        raise UserError(
            f"--window-len {window_len} / --prompt-len + --new-tokens {prompt_len + new_tokens} exceed the "
            f"model's {limit[0]} positions ({limit[1]}); pass a --window-len and a --prompt-len + "
            f"--new-tokens of at most {limit[0]}."
        )
    _check_logits_fit(windows, window_len, logits_width(lm))
    from trtforge.llm.sched.request import MAX_NUM_SEQS

    if max(int(b) for b in batch_sizes) > MAX_NUM_SEQS:  # (every serving variant was refused for it)
        raise UserError(
            f"--batch {max(int(b) for b in batch_sizes)}: the serving engine runs at most {MAX_NUM_SEQS} "
            "requests at once."
        )
    _check_memory_fits(
        lm,
        names,
        device,
        reference,
        windows=windows,
        window_len=window_len,
        batch=max(batch_sizes),
        prompt_len=prompt_len,
        new_tokens=new_tokens,
    )
    # read once the memory checks passed: of a large file only what the windows and prompts need
    text_read = _read_text(text_path, text_bytes_needed(windows, window_len, prompt_len))
    ids, special = _tokenize(text_read.text, tok_dir)
    _check_text_vocabulary(ids, lm, tokenizer)
    w = cut_windows(ids, windows, window_len, f"--text '{text_path}'")
    _check_windows_hold_text(w, ids, special, f"--text '{text_path}'")
    if len(ids) < prompt_len:  # (the speed prompts were cut short and the report still said --prompt-len)
        raise UserError(
            f"--prompt-len {prompt_len}: --text '{text_path}' has only {len(ids)} tokens to cut the speed "
            "prompts from; give a shorter --prompt-len or a longer text."
        )
    prompt_starts = np.linspace(0, max(0, len(ids) // 2 - prompt_len), num=max(batch_sizes), dtype=np.int64)
    speed_prompts = [ids[s : s + prompt_len] for s in prompt_starts]
    targets: list[TargetInfo] = []
    scores: dict[str, tuple[_Scores, dict[str, Any]]] = {}
    speed: list[LmSpeed] = []
    notes: list[str] = []
    with work_directory("trtforge-llm-report-") as workdir:
        bar = StepProgress(progress, len(names))
        with torch_threads(threads), bar.running():
            for n in names:
                bar.step(f"variant {n}")
                if n in SERVING_VARIANTS:
                    speed_args = {
                        "prompts": speed_prompts,
                        "batch_sizes": list(batch_sizes),
                        "prompt_len": prompt_len,
                        "new_tokens": new_tokens,
                    }
                    # the model loaded once, above: each serving variant takes a copy of it, not
                    # another read of its weights (transformers' loading bar once per variant)
                    info, s, sp, kv = _serving_variant(
                        lm, n, device, FLOAT_DTYPES[reference], w, chunk, speed_args
                    )
                    speed += sp
                else:
                    info, s, kv = _step_variant(lm, n, w, workdir)
                targets.append(info)
                if s is not None:
                    scores[n] = (s, kv)
                bar.step(f"variant {n}", advance=1)
            bar.step("variants")
    ref = scores.get(reference, (None, None))[0]
    if ref is None:
        why = next((t.reason for t in targets if t.name == reference), "")
        notes.append(f"the reference {reference} did not run ({why}); no deltas or agreement.")
    quality = []
    for t in targets:
        if t.name in scores:
            s, kv = scores[t.name]
            quality.append(
                _quality(
                    t.name, s, None if t.name == reference else ref, kv.get("kv_bytes"), kv.get("kv_dtype")
                )
            )
        else:
            quality.append(LmQuality(target=t.name, status=t.status, reason=t.reason))
    for t in targets:
        if t.name in STEP_VARIANTS:
            speed.append(
                LmSpeed(
                    target=t.name,
                    batch=0,
                    status=NOT_RUN,
                    reason="not measured: ONNX Runtime on the CPU is not a serving target",
                )
            )
        elif t.status != OK:
            speed.append(LmSpeed(target=t.name, batch=0, status=t.status, reason=t.reason))
    notes.append(
        f"Perplexity: {windows} windows of {window_len} tokens evenly spaced over the second half of the "
        f"text ({w.text_tokens} tokens), {w.tokens.shape[0] * (window_len - 1)} predicted tokens per "
        f"variant; serving variants run each window in prompt chunks of {chunk} tokens (later chunks read "
        "the KV cache)."
    )
    if text_read.bytes_read < text_read.file_size:
        notes.append(
            f"--text: its first {text_read.bytes_read:,} bytes of {text_read.file_size:,} were read (whole "
            "lines), far more than the windows and speed prompts need; the windows lie in their second half."
        )
    if any(p.status == OK for p in speed):
        notes.append(
            "Speed: the serving engine runs without prefix caching, so every timed request pays its whole "
            "prefill (the warm-up runs the same prompts)."
        )
    # the variants that ran and took prompts of the text (a refused int4-awq was listed; int4-awq+head-fp8,
    # which calibrates as int4-awq does, was not)
    calibrated = [
        t.name
        for t in targets
        if t.name in scores  # (measured: a variant whose speed run failed after its quality, too)
        and (
            STEP_VARIANTS.get(t.name) in ("int8", "fp8")
            or (t.name in SERVING_VARIANTS and _calibration(SERVING_VARIANTS[t.name], w))
        )
    ]
    if calibrated:
        notes.append(
            f"{', '.join(calibrated)} calibrated on {len(w.calibration)} prompts of the text's first half "
            "(disjoint from the evaluation windows)."
        )
    if not device.startswith("cuda"):
        notes.append(
            "Measured on the CPU: the reference is FP32 and the serving speeds say nothing about a GPU "
            "(quantized serving variants run their float reference path here, for quality)."
        )
    label = str(model) if isinstance(model, (str, os.PathLike)) else type(lm).__name__
    report = Report(
        title=title or f"trtforge LLM report: {_model_name(label)}",
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        source={"kind": "causal_lm", "label": label},
        reference=reference,
        settings={
            "targets": names,
            "batch_sizes": [int(b) for b in batch_sizes],
            "seq_lens": [int(prompt_len)],
            "warmup": 1,
            "runs": 1,
            "threads": threads,
            "accuracy_data": f"{text_path} ({w.text_tokens} tokens)",
            "accuracy_iterations": int(w.tokens.shape[0]),
            "text": str(text_path),
            "window_len": int(window_len),
            "window_starts": [int(s) for s in w.starts],
            "chunk": int(chunk),
            "prompt_len": int(prompt_len),
            "new_tokens": int(new_tokens),
            "device": device,
        },
        environment=environment(threads),
        targets=targets,
        accuracy=[],
        latency=[],
        notes=notes,
        lm_quality=quality,
        lm_speed=speed,
    )
    html_path, md_path, json_path = write_report(report, create_out_dir(out_dir))
    return LmReportResult(html_path, md_path, json_path, report, w)


__all__ = ["SERVING_VARIANTS", "STEP_VARIANTS", "VARIANTS", "LmReportResult", "build_llm_report"]
