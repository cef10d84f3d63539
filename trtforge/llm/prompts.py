"""LLM calibration prompts (token-id lists): the one check of their form and count that the API's
`calib_prompts` (``from_pretrained``, ``load``, ``compile --generate``'s ``compile``,
``quantize_model``) and the CLI's ``--calib-data`` file both go through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trtforge.errors import UserError, shown

#: the most calibration prompts taken: calibration reads each scale's range off a few hundred (int4-awq
#: uses at most its first 16,384 tokens anyway), while each prompt costs a forward pass and, for
#: `compile --generate --precision int8/fp8`, a zeroed KV cache of the step graph's (MBs to GBs)
MAX_CALIB_PROMPTS = 1024


def too_many_prompts(what: str, count: int | None, fix: str) -> UserError:
    """The refusal of more than :data:`MAX_CALIB_PROMPTS` prompts in `what` (a file or an argument), which
    holds `count` of them (None: a file read no further than the prompt past the limit); `fix` says how
    to pass fewer there."""
    held = f"more than {MAX_CALIB_PROMPTS:,}" if count is None else f"{count:,}"
    return UserError(
        f"{what} holds {held} prompts; calibration takes at most {MAX_CALIB_PROMPTS:,}: {fix} (a few "
        "hundred varied prompts calibrate as well)."
    )


def check_calib_prompts(prompts: Any, what: str = "calib_prompts") -> None:
    """UserError unless `prompts` is None or a list of at most :data:`MAX_CALIB_PROMPTS` lists of integer
    token ids (the vocabulary and lengths are checked where the model's are known)."""
    if prompts is None:
        return
    expected = "expected None or a list of prompts, each a list of integer token ids"
    if hasattr(prompts, "tolist"):
        prompts = prompts.tolist()
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise UserError(f"{what} must be a list of token-id lists, got {type(prompts).__name__}; {expected}.")
    if len(prompts) > MAX_CALIB_PROMPTS:
        raise too_many_prompts(what, len(prompts), f"pass {what}[:{MAX_CALIB_PROMPTS}] or a chosen few")
    for i, row in enumerate(prompts):
        row = row.tolist() if hasattr(row, "tolist") else row
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
            raise UserError(f"{what}[{i}] must be a list of token ids, got {type(row).__name__}; {expected}.")
        bad = next((t for t in row if not isinstance(t, (int, np.integer)) or isinstance(t, bool)), None)
        if bad is not None:
            raise UserError(f"{what}[{i}] holds {type(bad).__name__} {shown(bad)}; {expected}.")
