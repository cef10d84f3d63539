"""The common end of a GPU benchmark: its rows and failed checks written atomically, the failures named."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from trtforge._fileio import atomic_write_text


def finish(out: Path, rows: list[dict], failures: list[str], **fields: Any) -> int:
    """Write ``{"device", **fields, "rows", "failures"}`` to `out` (complete or not at all), print each
    failure to stderr, and return the process's exit status (1 when a check failed)."""
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), **fields, "rows": rows, "failures": failures}
    atomic_write_text(out, json.dumps(result, indent=1))
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    return 1 if failures else 0
