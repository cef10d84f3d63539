"""INT8 calibration benchmark: accuracy on a real model and real data, cost on bert-base, ORT latency.

Sections (all measured in one run, peers side by side):

- accuracy: all-MiniLM-L6-v2 (exported here, legacy exporter, opset 18), 200 calibration and 400
  disjoint evaluation sentences from /usr/share/common-licenses (tests/calibration/minilm.py says how
  they are split). Mean/min cosine of mean-pooled embeddings vs FP32 for each of our methods, and for
  ModelOpt ONNX INT8 PTQ (max, entropy; high_precision_dtype=fp32) and ORT quantize_static QDQ
  per-channel symmetric INT8 (MinMax, Entropy, Percentile; MatMul only). Plus MatMuls in INT8.
- bert: bert-base config with random weights, seq 128, random token ids: calibration seconds and
  peak RSS for 200 and 1000 samples, ours vs ModelOpt max vs ORT MinMax.
- latency: ORT CPU median latency of our INT8 MiniLM vs FP32 (batch 8, seq 128), FAST sessions
  (ORT's graph optimizations on, so its int8 kernels: the figures depend on the CPU's ISA, recorded).

Every quantized model, ours and the peers', is evaluated with the same EXACT ONNX Runtime session
(`trtforge.numerics.exact_session`: graph optimizations off, so Q/DQ computes in float and matches
exact integer math, as TensorRT's INT8 GEMMs do) in this one process: no accuracy figure depends on
the CPU's int8 kernels.

Every calibration runs in its own subprocess; its peak RSS is its own ru_maxrss, and the parent
kills it past --mem-cap-gb (RSS polled from /proc) or --time-cap-s, recording that instead.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_calibration.py --out build/bench_calibration
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after PYTHONPATH: with_old's .old tree must come first
os.environ.setdefault("HF_HUB_OFFLINE", "1")

OURS = [
    ("max", {"method": "max"}),
    ("percentile 99.99", {"method": "percentile"}),
    ("entropy", {"method": "entropy"}),
    ("mse", {"method": "mse"}),
    ("max, padding included (--all-tokens)", {"method": "max", "only_real_tokens": False}),
    ("max + smoothquant 0.8", {"method": "max", "smoothquant": 0.8}),
    ("entropy + smoothquant 0.8", {"method": "entropy", "smoothquant": 0.8}),
    ("mse + smoothquant 0.8", {"method": "mse", "smoothquant": 0.8}),
    (
        "max + smoothquant 0.8 + accuracy target 0.999",
        {"method": "max", "smoothquant": 0.8, "accuracy_target": 0.999},
    ),
]


# ----------------------------------------------------------------------------- workers (subprocess)
def _worker(spec: dict) -> dict:
    t0 = time.perf_counter()
    kind = spec["kind"]
    info: dict = {}
    if kind == "ours":
        import onnx

        from trtforge.calibration.api import calibrate_model

        model = onnx.load(spec["model"])
        q, rec = calibrate_model(
            model, spec["data"], tokenizer=spec.get("tokenizer"), progress=False, **spec["kw"]
        )
        onnx.save(q, spec["output"])
        info = rec.to_dict()
        info = {k: info[k] for k in ("samples", "matmuls_quantized", "fallback", "accuracy", "smoothquant")}
        info["fallback"] = [f["node"] for f in info["fallback"]]
    elif kind == "modelopt":
        import modelopt.onnx.quantization as moq

        data = dict(np.load(spec["data"]))
        b, s = spec["batch"], data["input_ids"].shape[1]
        moq.quantize(
            onnx_path=spec["model"],
            quantize_mode="int8",
            calibration_data=data,
            calibration_method=spec["method"],
            calibration_shapes=",".join(f"{k}:{b}x{s}" for k in data),
            calibration_eps=["cpu"],
            high_precision_dtype="fp32",
            output_path=spec["output"],
            log_level="ERROR",
        )
    elif kind == "ort":
        from onnxruntime.quantization import (
            CalibrationDataReader,
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )

        data = dict(np.load(spec["data"]))
        b = spec["batch"]

        class Reader(CalibrationDataReader):
            def __init__(self):
                n = len(data["input_ids"])
                self.it = iter([{k: v[i : i + b] for k, v in data.items()} for i in range(0, n, b)])

            def get_next(self):
                return next(self.it, None)

        quantize_static(
            spec["model"],
            spec["output"],
            Reader(),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, spec["method"]),
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
    info["seconds"] = time.perf_counter() - t0
    info["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return info


def run_isolated(spec: dict, mem_cap_gb: float, time_cap_s: float) -> dict:
    """Run one calibration in a subprocess; kill it past the memory or time cap."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    t0, peak, killed = time.perf_counter(), 0.0, None
    while proc.poll() is None:
        peak = max(peak, _rss_gb(proc.pid))
        if peak > mem_cap_gb:
            killed = f"killed at the {mem_cap_gb:g} GB memory cap after {time.perf_counter() - t0:.0f} s"
        elif time.perf_counter() - t0 > time_cap_s:
            killed = f"killed at the {time_cap_s:g} s time cap (RSS {peak:.1f} GB)"
        if killed:
            proc.kill()
            proc.wait()
            return {"error": killed, "peak_rss_gb": peak}
        time.sleep(0.25)
    out, err = proc.communicate()
    if proc.returncode != 0:
        return {"error": err.strip().splitlines()[-1][:300] if err.strip() else f"exit {proc.returncode}"}
    return json.loads(out.strip().splitlines()[-1])


def _rss_gb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def count_int8_matmuls(path: str) -> tuple[int, int, int]:
    """(MatMuls reading a DequantizeLinear, MatMuls, other nodes reading a DequantizeLinear)."""
    import onnx

    m = onnx.load(path, load_external_data=False)
    prod = {o: n.op_type for n in m.graph.node for o in n.output}
    reads_dq = [n for n in m.graph.node if any(prod.get(i) == "DequantizeLinear" for i in n.input)]
    mms = [n for n in m.graph.node if n.op_type == "MatMul"]
    other = sum(n.op_type not in ("MatMul", "QuantizeLinear", "DequantizeLinear") for n in reads_dq)
    return sum(n.op_type == "MatMul" for n in reads_dq), len(mms), other


# ----------------------------------------------------------------------------- sections
def section_accuracy(work: Path, args) -> list[dict]:
    from transformers import AutoTokenizer

    from tests.calibration import minilm
    from trtforge.numerics.sessions import exact_session

    model = work / "minilm.onnx"
    if not model.exists():
        minilm.export_minilm(model)
    cal, ev = minilm.calibration_and_eval_sentences()
    minilm.write_sentences(work / "calib.txt", cal)
    tok = AutoTokenizer.from_pretrained(minilm.model_path())
    enc = tok(cal, padding=True, truncation=True, max_length=128, return_tensors="np")
    np.savez(work / "calib_padded.npz", **{k: np.asarray(v, np.int64) for k, v in enc.items()})
    real = float(enc["attention_mask"].mean())
    ref = minilm.pooled_embeddings(exact_session(__import__("onnx").load(model)), tok, ev)
    runs = [
        (f"trtforge {n}", {"kind": "ours", "kw": kw, "data": str(work / "calib.txt"), "tokenizer": "demo"})
        for n, kw in OURS
    ]
    for meth in ("max", "entropy"):
        runs.append(
            (
                f"ModelOpt {meth}",
                {"kind": "modelopt", "method": meth, "data": str(work / "calib_padded.npz"), "batch": 8},
            )
        )
    for meth in ("MinMax", "Entropy", "Percentile"):
        runs.append(
            (
                f"ORT quantize_static {meth}",
                {"kind": "ort", "method": meth, "data": str(work / "calib_padded.npz"), "batch": 8},
            )
        )
    rows = []
    for i, (name, spec) in enumerate(runs):
        if args.filter and args.filter not in name:
            continue
        spec.update(model=str(model), output=str(work / f"acc_{i}.onnx"))
        print(f"[accuracy] {name} ...", file=sys.stderr, flush=True)
        res = run_isolated(spec, args.mem_cap_gb, args.time_cap_s)
        row = {"section": "accuracy", "name": name, **res, "calib_positions_real": real}
        if "error" not in res:
            emb = minilm.pooled_embeddings(exact_session(__import__("onnx").load(spec["output"])), tok, ev)
            c = minilm.cosines(ref, emb)
            row.update(mean_cos=float(c.mean()), min_cos=float(c.min()))
            row["int8_matmuls"], row["matmuls"], row["other_dq_readers"] = count_int8_matmuls(spec["output"])
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
        if name == "ORT quantize_static MinMax" and "error" not in res:
            rewired = str(work / "ort_minmax_float_residual.onnx")
            n = float_non_matmul_readers(spec["output"], rewired)
            emb = minilm.pooled_embeddings(exact_session(__import__("onnx").load(rewired)), tok, ev)
            c = minilm.cosines(ref, emb)
            diag = {
                "section": "accuracy",
                "name": f"{name}, its {n} non-MatMul DQ readers fed float (diagnostic)",
            }
            diag.update(mean_cos=float(c.mean()), min_cos=float(c.min()))
            diag["int8_matmuls"], diag["matmuls"], diag["other_dq_readers"] = count_int8_matmuls(rewired)
            rows.append(diag)
    return rows


def float_non_matmul_readers(path: str, out: str) -> int:
    """Rewire every non-MatMul input that reads a Q->DQ pair back to the float tensor; returns how many."""
    import onnx

    m = onnx.load(path)
    by_out = {n.output[0]: n for n in m.graph.node}
    count = 0
    for node in m.graph.node:
        if node.op_type in ("MatMul", "QuantizeLinear", "DequantizeLinear"):
            continue
        for k, i in enumerate(node.input):
            dq = by_out.get(i)
            q = by_out.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":
                node.input[k] = q.input[0]
                count += 1
    onnx.save(m, out)
    return count


def section_bert(work: Path, args) -> list[dict]:
    import torch
    from transformers import BertConfig, BertModel

    model = work / "bert_base.onnx"
    if not model.exists():
        torch.manual_seed(0)
        bert = BertModel(BertConfig()).eval()
        ids = torch.ones(2, 16, dtype=torch.long)
        names = ["input_ids", "attention_mask", "token_type_ids"]

        class Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.m(
                    input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
                )[0]

        torch.onnx.export(
            Wrap(bert),
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(model),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes={k: {0: "batch", 1: "seq"} for k in names},
            opset_version=18,
            dynamo=False,
        )
    rng = np.random.default_rng(0)
    rows = []
    for n in args.bert_samples:
        data = work / f"bert_{n}.npz"
        ids = rng.integers(1000, 30000, (n, 128))
        np.savez(data, input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids))
        runs = [
            ("trtforge entropy", {"kind": "ours", "kw": {"method": "entropy"}, "data": str(data)}),
            ("ModelOpt max", {"kind": "modelopt", "method": "max", "data": str(data), "batch": 8}),
            (
                "ORT quantize_static Entropy",
                {"kind": "ort", "method": "Entropy", "data": str(data), "batch": 8},
            ),
            (
                "ORT quantize_static MinMax",
                {"kind": "ort", "method": "MinMax", "data": str(data), "batch": 8},
            ),
        ]
        if n > 200:  # 2 shared cores: at 1000 samples the peer is ModelOpt max only
            runs = runs[:2]
        for name, spec in runs:
            if args.filter and args.filter not in name:
                continue
            spec.update(model=str(model), output=str(work / f"bert_{n}_q.onnx"))
            print(f"[bert] {name} {n} samples ...", file=sys.stderr, flush=True)
            res = run_isolated(spec, args.mem_cap_gb, args.time_cap_s)
            row = {"section": "bert", "name": name, "n": n, **res}
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def section_latency(work: Path, args) -> list[dict]:
    import onnx

    from trtforge.calibration.api import calibrate_model
    from trtforge.numerics.cpu import isa_summary
    from trtforge.numerics.sessions import fast_session

    fp32 = onnx.load(work / "minilm.onnx")
    q, _ = calibrate_model(
        fp32, str(work / "calib.txt"), tokenizer="demo", method="max", smoothquant=0.8, progress=False
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (8, 128))
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    rows = []
    for name, m in (("FP32", fp32), ("INT8 (trtforge max + smoothquant 0.8)", q)):
        s = fast_session(m, threads=2)
        for _ in range(3):
            s.run(None, feed)
        times = []
        for _ in range(args.latency_runs):
            t = time.perf_counter()
            s.run(None, feed)
            times.append((time.perf_counter() - t) * 1e3)
        rows.append(
            {
                "section": "latency",
                "name": name,
                "median_ms": float(np.median(times)),
                "runs": len(times),
                "session": "fast (ORT_ENABLE_ALL)",
                "cpu_isa": isa_summary(),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


# ----------------------------------------------------------------------------- report
def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render(rows: list[dict], cmd: str) -> str:
    import onnxruntime

    from trtforge.numerics.cpu import cpu_isa, isa_summary

    cpu = cpu_isa()
    lines = [
        "# INT8 calibration benchmark",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores shared with other jobs, Python "
        f"{platform.python_version()}, onnxruntime {onnxruntime.__version__}; CPU {cpu['model']}, ISA "
        f"{isa_summary()}; "
        f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.  ",
        "Each calibration ran alone in a subprocess; peak RSS = that process's ru_maxrss.  ",
        "Accuracy: every model (ours and the peers') evaluated with EXACT ONNX Runtime sessions "
        "(graph optimizations off: Q/DQ computed in float, as exact integer math; CPU-independent). "
        "Latency: FAST sessions (ORT's fused int8 kernels; CPU-dependent, ISA in the table).",
        "",
    ]
    acc = [r for r in rows if r["section"] == "accuracy"]
    if acc:
        lines += [
            "## MiniLM (all-MiniLM-L6-v2), 200 calibration / 400 evaluation sentences",
            "",
            "Cosine of mean-pooled embeddings vs FP32 ONNX Runtime on the 400 evaluation sentences. "
            "Peers got the calibration set padded to its longest sentence (real tokens: "
            f"{acc[0]['calib_positions_real']:.0%} "
            "of positions); ours pads per batch and collects statistics over real tokens only.",
            "",
            "| calibrator | mean cos | min cos | MatMuls INT8 | other ops reading a DQ | seconds "
            "| peak RSS GB | notes |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in acc:
            if "error" in r:
                lines.append(
                    f"| {r['name']} | - | - | - | - | - | {r.get('peak_rss_gb', 0):.1f} | {r['error']} |"
                )
                continue
            note = ""
            if r.get("fallback") is not None and r.get("accuracy"):
                a = r["accuracy"]
                note = (
                    f"held-out cos {a['all_quantized']['mean']:.5f} -> {a['final']['mean']:.5f}; "
                    f"float: {', '.join(r['fallback']) or 'none'}"
                )
            lines.append(
                f"| {r['name']} | {r['mean_cos']:.5f} | {r['min_cos']:.5f} | "
                f"{r['int8_matmuls']}/{r['matmuls']} | {r.get('other_dq_readers', '-')} | "
                f"{_fmt(r.get('seconds'), '.0f')} | {_fmt(r.get('peak_rss_gb'), '.1f')} | {note} |"
            )
        lines.append("")
    bert = [r for r in rows if r["section"] == "bert"]
    if bert:
        lines += [
            "## bert-base config (random weights), seq 128: calibration cost",
            "",
            "| calibrator | samples | seconds | peak RSS GB | notes |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in bert:
            secs = f"{r['seconds']:.0f}" if "seconds" in r else "-"
            lines.append(
                f"| {r['name']} | {r['n']} | {secs} | {r.get('peak_rss_gb', 0):.2f} | {r.get('error', '')} |"
            )
        lines.append("")
    lat = [r for r in rows if r["section"] == "latency"]
    if lat:
        lines += [
            "## ONNX Runtime CPU latency, MiniLM, batch 8, seq 128 (2 threads)",
            "",
            "| model | median ms | runs | session | CPU ISA |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {r['name']} | {r['median_ms']:.1f} | {r['runs']} | {r.get('session', '-')} "
            f"| {r.get('cpu_isa', '-')} |"
            for r in lat
        ]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", default="build/bench_calibration")
    p.add_argument("--sections", default="accuracy,latency,bert")
    p.add_argument("--bert-samples", type=lambda s: [int(x) for x in s.split(",")], default=[200, 1000])
    p.add_argument("--mem-cap-gb", type=float, default=6.0)
    p.add_argument("--time-cap-s", type=float, default=900.0)
    p.add_argument("--latency-runs", type=int, default=20)
    p.add_argument("--filter", default="", help="Only runs whose name contains this (rows merge by name).")
    p.add_argument("--results", default=str(ROOT / "benchmarks/results/calibration.md"))
    args = p.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    rows_path = work / "rows.jsonl"
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else []
    for section in args.sections.split(","):
        new = {"accuracy": section_accuracy, "bert": section_bert, "latency": section_latency}[section](
            work, args
        )
        keys = {(r["section"], r["name"], r.get("n")) for r in new}
        rows = [r for r in rows if (r["section"], r["name"], r.get("n")) not in keys] + new
        order = {n: i for i, (n, _) in enumerate(OURS)}
        rows.sort(
            key=lambda r: (r["section"] != "accuracy", order.get(r["name"].removeprefix("trtforge "), 99))
        )
        rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        Path(args.results).write_text(render(rows, " ".join(["python", *sys.argv])) + "\n")


if __name__ == "__main__":
    main()
