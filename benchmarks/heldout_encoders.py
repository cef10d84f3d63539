"""Acceptance sweep: tiny random encoders trtforge's tests never saw, through the public API and CLI.

Each model (transformers *Config classes at tiny sizes, or plain torch modules) is compiled in FP32,
FP16 and INT8 into a TensorRT-RTX engine on the CPU, its pass ledger is summarised, and a report is
written. Run from the repository root:

    HF_HUB_OFFLINE=1 python benchmarks/heldout_encoders.py [--only bert,vit] [--cli] [--out DIR]

Prints one line per model and stage (ok, or the error's type and first line); exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

B, S = 2, 8


def _ids(vocab: int, batch: int = B, seq: int = S, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _mask(batch: int = B, seq: int = S) -> torch.Tensor:
    m = torch.ones(batch, seq, dtype=torch.long)
    m[-1, seq // 2 :] = 0
    return m


class _Hidden(torch.nn.Module):
    """Returns the encoder's last_hidden_state (and pooler output when it has one) as a tuple."""

    def __init__(self, model: torch.nn.Module, pooled: bool = False) -> None:
        super().__init__()
        self.m = model
        self.pooled = pooled

    def forward(self, **kw: torch.Tensor):
        out = self.m(**kw)
        return (out.last_hidden_state, out.pooler_output) if self.pooled else out.last_hidden_state


def make_bert():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.BertConfig(
        vocab_size=97,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=72,
        max_position_embeddings=64,
    )
    ids = _ids(97)
    return T.BertModel(cfg).eval(), {
        "input_ids": ids,
        "attention_mask": _mask(),
        "token_type_ids": torch.zeros_like(ids),
    }


def make_roberta():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.RobertaConfig(
        vocab_size=101,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=66,
        pad_token_id=1,
    )
    return T.RobertaModel(cfg).eval(), {"input_ids": _ids(101) + 2, "attention_mask": _mask()}


def make_distilbert():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.DistilBertConfig(
        vocab_size=90, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64
    )
    return _Hidden(T.DistilBertModel(cfg)).eval(), {"input_ids": _ids(90), "attention_mask": _mask()}


def make_albert():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.AlbertConfig(
        vocab_size=80,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
    )
    return T.AlbertModel(cfg).eval(), {"input_ids": _ids(80), "attention_mask": _mask()}


def make_electra():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.ElectraConfig(
        vocab_size=80,
        embedding_size=24,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=40,
        max_position_embeddings=64,
    )
    return T.ElectraForSequenceClassification(cfg).eval(), {"input_ids": _ids(80), "attention_mask": _mask()}


def make_deberta_v2():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.DebertaV2Config(
        vocab_size=80,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        relative_attention=True,
        position_buckets=16,
        pos_att_type=["p2c", "c2p"],
        max_relative_positions=32,
    )
    return _Hidden(T.DebertaV2Model(cfg)).eval(), {"input_ids": _ids(80), "attention_mask": _mask()}


def make_vit():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        image_size=32,
        patch_size=8,
        num_labels=5,
    )
    return T.ViTForImageClassification(cfg).eval(), {"pixel_values": torch.randn(B, 3, 32, 32)}


def make_convnext():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32, num_labels=3)
    return T.ConvNextForImageClassification(cfg).eval(), {"pixel_values": torch.randn(B, 3, 32, 32)}


def make_swin():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4
    )
    return _Hidden(T.SwinModel(cfg), pooled=True).eval(), {"pixel_values": torch.randn(B, 3, 32, 32)}


def make_t5_encoder():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.T5Config(vocab_size=90, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4)
    return _Hidden(T.T5EncoderModel(cfg)).eval(), {"input_ids": _ids(90), "attention_mask": _mask()}


def make_bart_encoder():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.BartConfig(
        vocab_size=90,
        d_model=32,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
    )
    return _Hidden(T.BartModel(cfg).get_encoder()).eval(), {"input_ids": _ids(90), "attention_mask": _mask()}


def make_whisper_encoder():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.WhisperConfig(
        vocab_size=90,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=4,
        decoder_layers=1,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_source_positions=16,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    enc = T.models.whisper.modeling_whisper.WhisperEncoder(cfg)
    return _Hidden(enc).eval(), {"input_features": torch.randn(B, 8, 32)}


def make_clip_text():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.CLIPTextConfig(
        vocab_size=90,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=16,
        eos_token_id=89,
    )
    return _Hidden(T.CLIPTextModel(cfg), pooled=True).eval(), {
        "input_ids": _ids(89),
        "attention_mask": _mask(),
    }


class SmallCNN(torch.nn.Module):
    """Conv/BatchNorm/ReLU/MaxPool/AdaptiveAvgPool/Linear, the shape of a torchvision classifier."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU6(),
            nn.Conv2d(16, 16, 3, padding=1, groups=16),
            nn.BatchNorm2d(16),
            nn.Hardswish(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 7)

    def forward(self, image):
        return self.fc(torch.flatten(self.pool(self.features(image)), 1))


def make_cnn():
    torch.manual_seed(0)
    m = SmallCNN()
    for bn in m.modules():
        if isinstance(bn, torch.nn.BatchNorm2d):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return m.eval(), {"image": torch.randn(B, 3, 24, 24)}


class OddMLP(torch.nn.Module):
    """Odd feature sizes, SiLU/GELU(tanh)/Softplus, LayerNorm without bias, outputs as a dict."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.a = nn.Linear(37, 53)
        self.norm = nn.LayerNorm(53, bias=False)
        self.b = nn.Linear(53, 29)
        self.c = nn.Linear(29, 11)

    def forward(self, x):
        h = torch.nn.functional.silu(self.a(x))
        h = torch.nn.functional.gelu(self.b(self.norm(h)), approximate="tanh")
        logits = self.c(h)
        return {
            "logits": logits,
            "probs": torch.softmax(logits, -1),
            "energy": torch.nn.functional.softplus(h).sum(-1),
        }


def make_mlp():
    torch.manual_seed(0)
    return OddMLP().eval(), {"x": torch.randn(3, 37)}


class MultiIO(torch.nn.Module):
    """int64 ids, a bool mask, a float side feature -> a tuple (pooled, per-token scores, count)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 24)
        self.side = torch.nn.Linear(5, 24)
        self.layer = torch.nn.TransformerEncoderLayer(24, 4, 40, dropout=0.0, batch_first=True)
        self.score = torch.nn.Linear(24, 1)

    def forward(self, tokens, keep, side):
        h = self.emb(tokens) + self.side(side).unsqueeze(1)
        h = self.layer(h, src_key_padding_mask=~keep)
        w = keep.unsqueeze(-1).to(h.dtype)
        pooled = (h * w).sum(1) / w.sum(1).clamp(min=1.0)
        return pooled, self.score(h).squeeze(-1), keep.sum(-1)


def make_multi_io():
    torch.manual_seed(0)
    keep = torch.ones(B, S, dtype=torch.bool)
    keep[-1, S // 2 :] = False
    return MultiIO().eval(), {"tokens": _ids(50), "keep": keep, "side": torch.randn(B, 5)}


# name -> (factory, dynamic spec)
MODELS: dict[str, tuple[Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]], Any]] = {
    "bert": (make_bert, "batch,seq"),
    "roberta": (make_roberta, "batch,seq"),
    "distilbert": (make_distilbert, "batch,seq"),
    "albert": (make_albert, "batch,seq"),
    "electra": (make_electra, "batch,seq"),
    "deberta_v2": (make_deberta_v2, "batch,seq"),
    "vit": (make_vit, "batch"),
    "convnext": (make_convnext, "batch"),
    "swin": (make_swin, "batch"),
    "t5_encoder": (make_t5_encoder, "batch,seq"),
    "bart_encoder": (make_bart_encoder, "batch,seq"),
    "whisper_encoder": (make_whisper_encoder, "batch"),
    "clip_text": (make_clip_text, "batch,seq"),
    "cnn": (make_cnn, "batch"),
    "mlp": (make_mlp, "batch"),
    "multi_io": (
        make_multi_io,
        {"tokens": {0: "batch", 1: "seq"}, "keep": {0: "batch", 1: "seq"}, "side": {0: "batch"}},
    ),
}


def _calib(inputs: dict[str, torch.Tensor], n: int = 4) -> list[dict[str, Any]]:
    """n feed dicts like the example inputs (ints and bools kept, floats re-drawn)."""
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(100 + i)
        feed = {}
        for k, v in inputs.items():
            feed[k] = (torch.randn(v.shape, generator=g) if v.is_floating_point() else v).numpy()
        out.append(feed)
    return out


_WATCH = (
    "LayerNormalization",
    "RMSNormalization",
    "Gelu",
    "Attention",
    "Softmax",
    "Erf",
    "Tanh",
    "QuantizeLinear",
)


def _fused(records: dict[str, Any], onnx_path: Path) -> str:
    """Pass matches (non-zero) and the final graph's count of the ops fusion should produce or remove."""
    import collections

    import onnx

    passes = records.get("passes") or {}
    counts = {
        p["name"]: p["matches"] for p in passes.get("passes", []) if p.get("matches") and p["name"] != "opset"
    }
    ops = collections.Counter(
        n.op_type for n in onnx.load(str(onnx_path), load_external_data=False).graph.node
    )
    return f"passes={counts} ops={ {k: ops[k] for k in _WATCH if ops[k]} }"


def _run(label: str, fn: Callable[[], str], results: list[dict[str, Any]]) -> None:
    t0 = time.perf_counter()
    try:
        info = fn()
        results.append({"step": label, "ok": True, "s": round(time.perf_counter() - t0, 1), "info": info})
        print(f"OK   {label:34s} {time.perf_counter() - t0:6.1f}s {info}", flush=True)
    except Exception as e:  # the sweep records every failure and goes on
        tb = traceback.format_exc()
        results.append({"step": label, "ok": False, "error": f"{type(e).__name__}: {e}", "tb": tb})
        first = str(e).splitlines()[0] if str(e) else ""
        print(f"FAIL {label:34s} {type(e).__name__}: {first[:300]}", flush=True)


def _compile(name: str, model: Any, inputs: dict, dynamic: Any, prec: str, out: Path) -> str:
    """trtforge.compile at one precision; returns the pass matches and watched op counts."""
    import trtforge
    from trtforge.core.policy import PrecisionOptions

    precision: Any = prec
    if prec == "int8":
        precision = PrecisionOptions(mode="int8", calib_data=_calib(inputs), progress=False)
    r = trtforge.compile(
        model,
        inputs,
        out / f"{name}.{prec}.engine",
        dynamic=dynamic,
        progress=False,
        force=True,
        log=lambda _m: None,
        save_onnx=out / f"{name}.{prec}.onnx",
        precision=precision,
    )
    decomposed = r.records.get("build", {}).get("attention_decomposed") or []
    return _fused(r.records, out / f"{name}.{prec}.onnx") + (
        f" decomposed={decomposed}" if decomposed else ""
    )


def _report(name: str, model: Any, inputs: dict, out: Path) -> str:
    """A report over torch and the ONNX Runtime targets; raises when an output fails its tolerance."""
    from trtforge.reports.api import build_report

    r = build_report(
        (model, inputs),
        targets=["torch", "ort", "ort-fused", "ort-fp16", "ort-int8"],
        out_dir=out / f"{name}.report",
        batch_sizes=(1, 2),
        seq_lens=(S,),
        warmup=1,
        runs=2,
        progress=False,
    )
    summary = json.loads(r.json_path.read_text())["summary"]
    if not summary.get("all_passed"):
        raise RuntimeError(f"report did not pass: {summary}")
    return f"{summary['accuracy_passed']} accuracy checks passed"


def _cli(name: str, dynamic: Any, out: Path) -> str:
    """`trtforge compile benchmarks.heldout_encoders:make_NAME --precision fp16` in a subprocess."""
    dyn = dynamic if isinstance(dynamic, str) else "batch"
    cmd = [sys.executable, "-m", "trtforge.cli.main", "compile", f"heldout_encoders:make_{name}"]
    cmd += ["-o", str(out / f"{name}.cli.engine"), "--precision", "fp16", "--force", "--dynamic", dyn]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.getcwd()]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {(p.stderr or p.stdout)[-1500:]}")
    return "exit 0"


def sweep(
    names: list[str], out: Path, precisions: list[str], report: bool, cli: bool
) -> list[dict[str, Any]]:
    """Every stage of every named model; one result dict per (model, stage)."""
    results: list[dict[str, Any]] = []
    for name in names:
        factory, dynamic = MODELS[name]
        made: list[Any] = []
        _run(f"{name} build module", lambda f=factory, m=made: str(m.extend(f()) or ""), results)
        if not made:
            continue
        model, inputs = made
        for prec in precisions:
            _run(f"{name} api {prec}", lambda p=prec: _compile(name, model, inputs, dynamic, p, out), results)  # noqa: B023
        if report:
            _run(f"{name} report", lambda: _report(name, model, inputs, out), results)  # noqa: B023
        if cli:
            _run(f"{name} cli fp16", lambda: _cli(name, dynamic, out), results)  # noqa: B023
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--precisions", default="fp32,fp16,int8")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--cli", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n] or list(MODELS)
    out = Path(a.out or tempfile.mkdtemp(prefix="heldout-"))
    out.mkdir(parents=True, exist_ok=True)
    results = sweep(names, out, [p for p in a.precisions.split(",") if p], a.report, a.cli)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    failed = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)}/{len(results)} ok; outputs in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
