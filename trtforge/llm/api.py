"""The raw greedy loop over a slot-layout step graph: per-step logits and teacher-forced scores.

A numerics tool, not the front door (``trtforge.llm.load`` serves every model, slot graphs included,
through the engine): :meth:`LLM.generate` with ``return_logits=True`` and :meth:`LLM.score` give the
logits each token came from, which the accuracy checks of FP16/INT8 step graphs compare. One prefill
step for the whole batch (prompts right-padded to the longest, each row's own length in `new_lens`),
then one decode step per new token; a row that emits an end-of-sequence id stops growing its output
(it still rides along in the batch).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from trtforge.errors import UserError, checked_call
from trtforge.llm import contract
from trtforge.llm.executors import OrtStepExecutor

EXECUTORS = ("onnxruntime",)


class LLM:
    """A loaded step graph plus the loop that drives it."""

    def __init__(self, executor: OrtStepExecutor):
        self.executor = executor
        self.generation = executor.generation

    @property
    def eos_token_ids(self) -> list[int]:
        """End-of-sequence ids recorded from the model's config (may be empty)."""
        return list(self.generation.get("eos_token_ids") or [])

    def _check_prompts(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        g = self.generation
        if hasattr(prompts, "tolist"):  # numpy array / torch tensor [B, L]
            prompts = prompts.tolist()
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
            raise UserError("prompts must be a non-empty list of token-id lists, e.g. [[1, 2, 3]].")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise UserError(
                f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}; sampling options "
                "(SamplingParams) are served by trtforge.llm.load(path).generate(prompts, params)."
            )
        if len(prompts) > g["max_batch"]:
            raise UserError(
                f"{len(prompts)} sequences exceed this engine's max batch {g['max_batch']} (--max-batch); "
                "split them into smaller batches or rebuild with a larger --max-batch."
            )
        rows = []
        for b, p in enumerate(prompts):
            p = p.tolist() if hasattr(p, "tolist") else p
            if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or not p:
                raise UserError(f"prompt {b} must be a non-empty list of token ids.")
            if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in p):
                raise UserError(
                    f"prompt {b} must hold integer token ids, got {[type(t).__name__ for t in p][:3]}."
                )
            ids = [int(t) for t in p]
            vocab = contract.input_vocab_size(g)  # (the embedding's ids)
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise UserError(
                    f"prompt {b} holds token ids {bad[:5]} outside the vocabulary 0..{vocab - 1}."
                )
            if len(ids) > g["max_prefill"]:
                raise UserError(
                    f"prompt {b} has {len(ids)} tokens, more than the engine's prefill limit "
                    f"{g['max_prefill']} (--max-prefill)."
                )
            if len(ids) + max_new_tokens > g["max_seq"]:
                raise UserError(
                    f"prompt {b} ({len(ids)} tokens) plus max_new_tokens {max_new_tokens} exceeds the cache "
                    f"length {g['max_seq']} (--max-seq)."
                )
            rows.append(ids)
        return rows

    def _steps(self, rows: list[list[int]], forced: list[list[int]] | None, max_new_tokens: int):
        """Yield each step's last-token logits [B, V]; the next tokens are argmax or `forced`."""
        ex = self.executor
        batch, longest = len(rows), max(len(r) for r in rows)
        ids = np.zeros((batch, longest), np.int64)
        for b, r in enumerate(rows):
            ids[b, : len(r)] = r
        lens = np.array([len(r) for r in rows], np.int64)
        feeds: dict[str, np.ndarray] = {
            "input_ids": ids,
            "position_ids": np.minimum(np.arange(longest, dtype=np.int64)[None], lens[:, None] - 1),
            "past_lens": np.zeros(batch, np.int64),
            "new_lens": lens,
            **ex.new_cache(batch),
        }
        for step in range(max_new_tokens):
            out = ex.run(feeds)
            logits = out["logits"]
            if logits.ndim == 3:  # an all-positions graph: each row's last real new token
                logits = logits[np.arange(batch), feeds["new_lens"] - 1]
            yield logits
            if step == max_new_tokens - 1:
                return
            nxt = logits.argmax(-1) if forced is None else np.array([f[step] for f in forced])
            past = feeds["past_lens"] + feeds["new_lens"]
            feeds = {
                "input_ids": nxt.astype(np.int64)[:, None],
                "position_ids": past[:, None].copy(),
                "past_lens": past,
                "new_lens": np.ones(batch, np.int64),
                **{n: out[n.replace("_cache.", "_cache_out.")] for n in ex.cache_inputs},
            }

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 16,
        *,
        stop_at_eos: bool = True,
        return_logits: bool = False,
    ) -> Any:
        """Greedy continuation of each prompt: a list of new-token-id lists (and per-step logits if asked).

        With `stop_at_eos` a row ends after its first end-of-sequence id (kept in its output).
        `return_logits` also returns, per row, an array [steps, V] of the logits each token came from.
        """
        rows = self._check_prompts(prompts, max_new_tokens)
        eos = set(self.eos_token_ids) if stop_at_eos else set()
        out: list[list[int]] = [[] for _ in rows]
        logits_out: list[list[np.ndarray]] = [[] for _ in rows]
        done = [False] * len(rows)
        for logits in self._steps(rows, None, max_new_tokens):
            for b, row in enumerate(logits):
                if done[b]:
                    continue
                tok = int(row.argmax())
                out[b].append(tok)
                logits_out[b].append(row)
                done[b] = tok in eos
            if all(done):
                break
        if return_logits:
            return out, [np.stack(x) for x in logits_out]
        return out

    def score(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Teacher-forced logits: for each row, [len(continuation), V], the logits that predict each token."""
        if (
            len(continuations) != len(prompts)
            or len({len(c) for c in continuations}) != 1
            or not continuations[0]
        ):
            raise UserError("score needs one continuation per prompt, all of the same non-zero length.")
        steps = len(continuations[0])
        rows = self._check_prompts(prompts, steps)
        forced = [[int(t) for t in c] for c in continuations]
        per_step = list(self._steps(rows, forced, steps))
        return [np.stack([s[b] for s in per_step]) for b in range(len(rows))]


@checked_call
def load(path: str | os.PathLike[str], executor: str = "onnxruntime") -> LLM:
    """Load a slot-layout step graph (`step.onnx`, from `trtforge compile --generate --save-onnx`) into
    the raw loop, for its logits. To generate, serve it: :func:`trtforge.llm.load`.

    `executor`: "onnxruntime" (CPU, exact).
    """
    from trtforge._fileio import as_path
    from trtforge.llm.executors.onnxruntime_exec import read_generation

    p = as_path(path, "the step graph")
    if executor not in EXECUTORS:
        raise UserError(f"executor {executor!r} is not available; choose one of {', '.join(EXECUTORS)}.")
    if p.suffix == ".engine":
        raise UserError(
            f"'{p}' is a TensorRT engine; the onnxruntime executor runs the step graph. Load the engine "
            "with executor='tensorrt' (a paged step engine), or the ONNX written by `trtforge compile "
            "--generate --save-onnx step.onnx`."
        )
    return LLM(OrtStepExecutor(p, read_generation(p)))
