"""Proposers of draft tokens: one small interface, prompt lookup and a draft model.

A proposer gets the running sequences that may speculate this step and, per sequence, how many
tokens at most (k); it returns per sequence a :class:`Proposal`: up to k token ids continuing the
sequence's tokens, and the distributions they were drawn from (``probs`` ``[len, vocab]``; None: each
token was chosen with certainty, as prompt lookup and greedy drafting do). :meth:`Proposer.forget`
releases what it keeps for finished requests.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from trtforge.errors import UserError
from trtforge.llm.executors.base import ExecutorFacts, StepBatch, StepExecutor
from trtforge.llm.sched.blocks import BlockManager, NoFreeBlocksError
from trtforge.llm.sched.request import Sequence_


class Proposal(NamedTuple):
    """Draft tokens for one sequence and, when drawn at random, the distributions they came from."""

    tokens: list[int]
    probs: np.ndarray | None = None


@runtime_checkable
class Proposer(Protocol):
    """Proposes up to ``num_tokens`` tokens per sequence for the target to verify in one step."""

    method: str
    num_tokens: int

    def propose(self, seqs: Sequence[Sequence_], ks: Sequence[int]) -> list[Proposal]:
        """One proposal per sequence, at most ``ks[i]`` tokens (may be empty)."""
        ...

    def forget(self, request_ids: Iterable[Hashable]) -> None:
        """Release what is kept for these (finished) requests."""
        ...


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens (n from
    ``max_n`` down to ``min_n``, the longest match wins) in its own tokens (prompt and output), and
    propose the tokens that followed it. No model; it pays where text repeats (code, retrieval, edits).

    Per request it keeps its tokens in a growing array (appending only the new ones each step), and a
    lookup compares the whole sequence with its last token once, then extends only those matches
    backwards: O(length) vectorised work per sequence and step.
    """

    method = "ngram"

    def __init__(self, num_tokens: int, min_n: int = 1, max_n: int = 4) -> None:
        self.num_tokens, self.min_n, self.max_n = num_tokens, min_n, max_n
        self._arrays: dict[Hashable, tuple[np.ndarray, int]] = {}

    def _array(self, seq: Sequence_) -> np.ndarray:
        """`seq`'s tokens as an int64 array (the request's tokens only ever grow at the end)."""
        tokens = seq.tokens
        buf, n = self._arrays.get(seq.request_id, (None, 0))
        if buf is None or len(buf) < len(tokens):
            grown = np.empty(max(2 * len(tokens), 64), dtype=np.int64)
            if buf is not None:
                grown[:n] = buf[:n]
            buf = grown
        buf[n : len(tokens)] = tokens[n:]
        self._arrays[seq.request_id] = (buf, len(tokens))
        return buf[: len(tokens)]

    def propose(self, seqs: Sequence[Sequence_], ks: Sequence[int]) -> list[Proposal]:
        return [Proposal(self.lookup(self._array(s), k)) for s, k in zip(seqs, ks)]

    def lookup(self, tokens: Sequence[int] | np.ndarray, k: int) -> list[int]:
        """Up to `k` tokens following the latest earlier match of the longest suffix of `tokens`."""
        arr = np.asarray(tokens, dtype=np.int64)
        last = len(arr) - 1
        ends = np.flatnonzero(arr[:last] == arr[last])  # matches of length >= 1, each followed by a token
        if not len(ends):
            return []
        lengths = np.ones(len(ends), dtype=np.int64)
        alive = np.ones(len(ends), dtype=bool)
        for m in range(1, self.max_n):  # extend each match backwards while it still agrees
            alive &= ends >= m
            alive[alive] = arr[ends[alive] - m] == arr[last - m]
            if not alive.any():
                break
            lengths += alive
        best = int(lengths.max())
        if best < self.min_n:
            return []
        end = int(ends[np.flatnonzero(lengths == best)[-1]])
        return arr[end + 1 : end + 1 + k].tolist()

    def forget(self, request_ids: Iterable[Hashable]) -> None:
        for rid in request_ids:
            self._arrays.pop(rid, None)


class DraftModelProposer:
    """A draft causal LM run by its own step executor over its own paged KV pool (its own
    :class:`BlockManager`), kept in step with the target's tokens.

    Per sequence it holds the tokens whose K/V its pool has. At each proposal it cuts them back to the
    longest prefix the sequence still has (the rolled-back rejected proposals), runs the tokens it
    lacks plus the last one in one batched step (a catch-up chunk: the whole prompt at first) and then
    one batched step per further token. Greedy requests draft by argmax; sampled ones draw from the
    draft's softmax at the request's temperature with the request's generator, returning those
    distributions as q. A sequence whose blocks do not fit the draft pool simply gets no proposal.
    """

    method = "draft"

    def __init__(self, executor: StepExecutor, num_tokens: int) -> None:
        self.executor = executor
        self.num_tokens = num_tokens
        f = executor.facts
        self.blocks = BlockManager(f.num_blocks, f.block_size, enable_prefix_caching=False)
        self._max_len = f.max_model_len
        self._written: dict[Hashable, list[int]] = {}

    def check_target(self, target: ExecutorFacts) -> None:
        """UserError unless the draft shares the target's vocabulary."""
        if self.executor.facts.vocab_size != target.vocab_size:
            raise UserError(
                f"speculative draft model has a vocabulary of {self.executor.facts.vocab_size} tokens but "
                f"the target's has {target.vocab_size}; a draft model must share the target's tokenizer"
            )

    def _sync(self, seq: Sequence_, k: int) -> tuple[list[int], int, list[int], list[tuple[int, int]]] | None:
        """Bring the pool's copy of `seq` to its tokens: (run to feed, its first position, slots, copies)."""
        rid, tokens = seq.request_id, seq.tokens
        if len(tokens) + k > self._max_len:
            return None
        written = self._written.get(rid)
        if written is None:
            self.blocks.allocate(rid, [])
            written = self._written[rid] = []
        c = min(len(written), len(tokens) - 1)
        while written[:c] != tokens[:c]:  # only the tail (rejected proposals) can differ
            c -= 1
        if c < len(written):
            self.blocks.truncate(rid, c)
            del written[c:]
        run = tokens[c:]
        try:
            slots, copies = self.blocks.append_slots(rid, run)
        except NoFreeBlocksError:
            self.forget([rid])
            return None
        written.extend(run)
        return run, c, slots, copies

    def _step(
        self, rids: list[Hashable], runs: list[list[int]], starts: list[int], slots, copies, feed
    ) -> Any:
        """One draft step; with `feed` (an executor with ``step_async``) its single-token rows take their
        ids from the previous step's tokens on the device, so the host never waits between steps."""
        batch = StepBatch.build(
            rids,
            runs,
            starts,
            [self.blocks.block_table_view(r) for r in rids],
            slots,
            [True] * len(rids),
            copies,
        )
        if feed is not None:
            return self.executor.step_async(batch, feed)  # type: ignore[attr-defined]
        return self.executor.step(batch)

    @staticmethod
    def _pick(logits: Any, seqs: list[Sequence_], draws: dict[int, np.ndarray], step: int) -> tuple[Any, Any]:
        """Each row's draft token (int64 on the logits' device) and the distributions of the sampled
        rows (``[rows, vocab]`` float64 on the device, None when every row is greedy)."""
        import torch

        logits = torch.as_tensor(logits)
        tokens = logits.argmax(-1)
        sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if not sampled:
            return tokens, None
        dev = logits.device
        temps = torch.tensor([seqs[i].params.temperature for i in sampled], dtype=torch.float64, device=dev)
        u = torch.tensor([draws[id(seqs[i])][step] for i in sampled], dtype=torch.float64, device=dev)
        rows = torch.tensor(sampled, device=dev)
        q = torch.softmax(logits.index_select(0, rows).double() / temps[:, None], dim=-1)
        cum = q.cumsum(-1)
        picked = torch.searchsorted(cum, (u * cum[:, -1])[:, None], right=True)[:, 0]
        tokens.index_copy_(0, rows, picked.clamp(max=q.shape[1] - 1))
        return tokens, q

    def propose(self, seqs: Sequence[Sequence_], ks: Sequence[int]) -> list[Proposal]:
        from trtforge.llm.executors.base import TokenFeed, supports_async

        on_device = supports_async(self.executor)
        # a sampled request draws its k uniforms up front, from its own generator (reproducible)
        draws = {id(s): s.generator.random(k) for s, k in zip(seqs, ks) if k > 0 and not s.params.greedy}
        live, runs, starts, slots, copies = [], [], [], [], []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            got = self._sync(seq, k) if k > 0 else None
            if got is not None:
                live.append(i)
                runs.append(got[0])
                starts.append(got[1])
                slots.append(got[2])
                copies.extend(got[3])
        steps: list[tuple[list[int], Any, Any]] = []  # per step: its sequences, tokens, distributions
        feed = None
        while live:
            rids = [seqs[i].request_id for i in live]
            logits = self._step(rids, runs, starts, slots, copies, feed)
            tokens, q = self._pick(logits, [seqs[i] for i in live], draws, len(steps))
            steps.append((live, tokens, q))
            if not on_device:
                tokens = tokens.tolist()
            nxt, sources = [], []
            runs, starts, slots, copies = [], [], [], []
            for row, i in enumerate(live):
                if len(steps) >= ks[i]:
                    continue
                rid = seqs[i].request_id
                try:  # (the token's value is not known here: the pool's copy holds a placeholder)
                    s, cp = self.blocks.append_slots(rid, [0])
                except NoFreeBlocksError:
                    continue  # the pool is full: this sequence's proposal stops here
                nxt.append(i)
                sources.append(row)
                runs.append([0] if on_device else [tokens[row]])
                starts.append(self.blocks.num_tokens(rid) - 1)
                slots.append(s)
                copies.extend(cp)
            if on_device and nxt:
                n = len(nxt)
                feed = TokenFeed(np.arange(n, dtype=np.int64), np.asarray(sources, dtype=np.int64), tokens)
            live = nxt
        drafts: list[list[int]] = [[] for _ in seqs]
        dists: list[list[np.ndarray]] = [[] for _ in seqs]
        for live, tokens, q in steps:  # (the first copy waits for the device, once)
            host = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
            qs = None if q is None else q.cpu().numpy()
            sampled = [i for i in live if not seqs[i].params.greedy]
            for i, t in zip(live, host):
                drafts[i].append(int(t))
            for j, i in enumerate(sampled):
                dists[i].append(qs[j])
        out = []
        for seq, d, q in zip(seqs, drafts, dists):
            if d:
                # the pool's copy: its tokens, then the proposals whose K/V it wrote (all but the last)
                self._written[seq.request_id].extend(d[:-1])
            out.append(Proposal(d, np.stack(q) if q else None))
        return out

    def forget(self, request_ids: Iterable[Hashable]) -> None:
        for rid in request_ids:
            if self._written.pop(rid, None) is not None:
                self.blocks.free(rid)
