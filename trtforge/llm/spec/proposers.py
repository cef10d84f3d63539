"""Proposers of draft tokens: one small interface, prompt lookup and a draft model.

A proposer gets the running sequences that may speculate this step and, per sequence, how many
tokens at most (k); it returns per sequence a :class:`Proposal`: up to k token ids continuing the
sequence's tokens, and the distributions they were drawn from (``probs`` ``[len, vocab]``; None: each
token was chosen with certainty, as prompt lookup and greedy drafting do). :meth:`Proposer.forget`
releases what it keeps for finished requests.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from trtforge.errors import TrtforgeWarning, UserError
from trtforge.llm.executors.base import ExecutorFacts, StepBatch, StepExecutor
from trtforge.llm.sched.blocks import BlockManager, NoFreeBlocksError
from trtforge.llm.sched.request import Sequence_

# how much smaller than the target's a draft's vocabulary may be: families pad one tokenizer to sizes a
# little apart (Qwen2.5: 151,936 and 152,064 ids, 0.08%); further apart, they are two tokenizers
MAX_PADDING_GAP = 0.01


def check_draft_vocabulary(draft: int, target: int, name: str = "the speculative draft model") -> None:
    """UserError unless logits `draft` wide can draft for logits `target` wide: the same width, or one at
    most :data:`MAX_PADDING_GAP` narrower (see :meth:`DraftModelProposer.check_target`); `name` is how
    the refusal names the draft."""
    if target * (1 - MAX_PADDING_GAP) <= draft <= target:
        return
    why = (
        "it could propose ids the target has no logits for"
        if draft > target
        else f"sizes that far apart (more than {MAX_PADDING_GAP:.0%}) are different tokenizers, not "
        "one padded to two sizes"
    )
    raise UserError(
        f"{name} has a vocabulary of {draft} tokens but the target's has {target}: {why}. A draft model "
        "must share the target's tokenizer, with a vocabulary no larger than the target's."
    )


class DraftContextWarning(TrtforgeWarning):
    """The draft model's context is shorter than the target's: longer sequences are not speculated."""


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


class _Picker:
    """Each draft step's tokens from its logits: argmax for greedy rows; a sampled row draws from the
    draft's softmax at its request's temperature with the uniforms it drew up front from its own
    generator (k per proposal: reproducible). The uniforms and temperatures go to the device once per
    set of rows, so a chain of steps adds no host copy."""

    def __init__(self, seqs: Sequence[Sequence_], ks: Sequence[int]) -> None:
        self.seqs = seqs
        pairs = enumerate(zip(seqs, ks))
        self.draws = {i: s.generator.random(k) for i, (s, k) in pairs if k > 0 and not s.params.greedy}
        self.steps = max(ks, default=0)  # (a chained row past its own k draws zeros: its tokens are dropped)
        self._inputs: dict[tuple[int, ...], tuple[Any, Any, Any]] = {}

    def _device_inputs(self, live: list[int], device: Any) -> tuple[Any, Any, Any] | None:
        """(rows of `live` that sample, their temperatures, their uniforms ``[rows, k]``), or None."""
        from trtforge.llm.host_to_device import to_device

        rows = [r for r, i in enumerate(live) if i in self.draws]
        if not rows:
            return None
        key = tuple(live)
        if key not in self._inputs:
            sampled = [live[r] for r in rows]
            u = np.zeros((len(rows), self.steps), dtype=np.float64)
            for j, i in enumerate(sampled):
                u[j, : len(self.draws[i])] = self.draws[i]
            temps = np.array([self.seqs[i].params.temperature for i in sampled], dtype=np.float64)
            self._inputs[key] = (
                to_device(np.array(rows, dtype=np.int64), device),
                to_device(temps, device),
                to_device(u, device),
            )
        return self._inputs[key]

    def __call__(self, logits: Any, live: list[int], step: int) -> tuple[Any, Any]:
        """The tokens of rows `live` (indices of the proposal's sequences; int64 on the logits' device)
        at draft step `step`, and the distributions of the sampled rows (``[rows, vocab]`` float64 on the
        device, None when every row is greedy)."""
        import torch

        logits = torch.as_tensor(logits)
        tokens = logits.argmax(-1)
        got = self._device_inputs(live, logits.device)
        if got is None:
            return tokens, None
        rows, temps, u = got
        q = torch.softmax(logits.index_select(0, rows).double() / temps[:, None], dim=-1)
        cum = q.cumsum(-1)
        picked = torch.searchsorted(cum, (u[:, step] * cum[:, -1])[:, None], right=True)[:, 0]
        tokens.index_copy_(0, rows, picked.clamp(max=q.shape[1] - 1))
        return tokens, q


class DraftModelProposer:
    """A draft causal LM run by its own step executor over its own paged KV pool (its own
    :class:`BlockManager`), kept in step with the target's tokens.

    Per sequence it holds the tokens whose K/V its pool has. At each proposal it cuts them back to the
    longest prefix the sequence still has (the rolled-back rejected proposals), runs the tokens it
    lacks plus the last one in one batched step (a catch-up chunk: the whole prompt at first) and then
    one batched step per further token. Where the executor chains decode steps
    (``decode_chain``, ``can_chain``: the torch executor's static decode path) and `chain` is on,
    those further k-1 steps run back to back on the device: their slots reserved with the catch-up's,
    their inputs built once, each step's ids the previous step's tokens, one wait for the device at
    the end; where the catch-up's runs are short (1..8 tokens, as after a verification: the executor's
    ``chain_q_len``) and ``fold`` is on, the catch-up is the chain's first step, so that a proposal is
    one host preparation, one copy and (greedy) one CUDA graph. Otherwise each further step is a step
    of its own (a batch built on the host).
    Greedy requests draft by argmax; sampled ones draw from the draft's softmax at the request's
    temperature with the request's generator, returning those distributions as q. A sequence whose
    blocks do not fit the draft pool simply gets no proposal (or a shorter one).
    ``chain_steps`` counts the steps run chained, ``folded_catch_ups`` the catch-ups run as a chain's
    first step.

    What this buys depends on the draft. The 3M draft's steps take ~20 us of GPU time each, so its
    proposal was nearly all host work (the catch-up, built and launched as a step of its own, was
    ~0.7 ms of a 0.74-0.81 ms chained proposal on the H200); folded, a proposal is one preparation and
    one launch. A real 8B target with a Llama-3.2-1B draft is another matter: the 1B's decode step is
    GPU-bound at ~0.85 ms (measured at 512-4096 context), its catch-up of up to k+1 tokens ~1.2-1.3x
    that (as the 8B's verification steps are), so a proposal costs ~(k + 0.3) x 0.85 ms of GPU time
    whatever the host does. The host's per-step work (~0.3 ms) already hides behind such steps where
    it runs ahead; chaining and folding save the launch gaps and the one wait between the catch-up
    and the chain, tens of us a proposal, a few percent. The 8B projection's "draft" rows
    (k x t_draft + t_verify) assume exactly that no-host-share proposal; there the draft's own GEMVs
    set the cost, and a smaller or quantized draft is the lever.
    """

    method = "draft"
    # the longest catch-up run that asks for every row's logits (the torch executor's static q_len)
    short_run = 8

    def __init__(self, executor: StepExecutor, num_tokens: int, chain: bool = True) -> None:
        self.executor = executor
        self.num_tokens = num_tokens
        self.chain = chain
        self.fold = True  # the catch-up as the chain's first step, where the executor takes it
        self.chain_steps = 0
        self.folded_catch_ups = 0
        f = executor.facts
        self.blocks = BlockManager(f.num_blocks, f.block_size, enable_prefix_caching=False)
        self._max_len = f.max_model_len
        self._written: dict[Hashable, list[int]] = {}
        self.target_vocab = f.vocab_size  # (check_target sets the target's, when larger)

    def check_target(self, target: ExecutorFacts, name: str = "the speculative draft model") -> None:
        """UserError unless the draft speaks the target's ids: the same vocabulary, or one padded to a
        size at most :data:`MAX_PADDING_GAP` smaller (Qwen2.5's 0.5B-3B models pad their shared
        tokenizer to 151,936 ids, the 7B-72B to 152,064). The target's size is kept: a smaller draft's
        distributions are widened to it, and target ids past the draft's vocabulary (padding ids no text
        tokenizes to) reach the draft as id 0. A draft of a shorter context than the target's
        ``max_model_len`` gets a :class:`DraftContextWarning` (longer sequences go unspeculated).
        `name` is how the refusal names the draft (its path, where it has one)."""
        vocab = target.vocab_size
        check_draft_vocabulary(self.executor.facts.vocab_size, vocab, name)
        self.target_vocab = vocab
        if self._max_len < target.max_model_len:
            warnings.warn(
                f"the speculative draft model runs sequences of up to {self._max_len} tokens (its context), "
                f"the target up to {target.max_model_len}: past {self._max_len} tokens (prompt included) "
                "a sequence decodes without speculation. A draft of the target's context (or a smaller "
                "max_model_len) keeps it speculating.",
                DraftContextWarning,
                stacklevel=3,
            )

    def _chains(self, rows: int) -> bool:
        """Whether this proposal's further steps run as one chain on the executor."""
        can = getattr(self.executor, "can_chain", None)  # (an executor with it has decode_chain)
        return self.chain and callable(can) and bool(can(rows))

    def _sync(
        self, seq: Sequence_, k: int, ahead: int
    ) -> tuple[list[int], int, list[int], list[tuple[int, int]]] | None:
        """Bring the pool's copy of `seq` to its tokens: (run to feed, its first position, slots,
        copies). With `ahead`, the slots of that many further tokens are reserved too where the pool
        has room (their slots follow the run's)."""
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
        for extra in dict.fromkeys((ahead, 0)):  # (the further tokens' values are placeholders)
            try:
                slots, copies = self.blocks.append_slots(rid, run + [0] * extra)
                break
            except NoFreeBlocksError:
                continue
        else:
            self.forget([rid])
            return None
        written.extend(run)
        return run, c, slots, copies

    def _batch(self, rids: list[Hashable], runs, starts, slots, copies) -> StepBatch:
        """A draft step's batch: each sequence's run from its start, logits of its last token."""
        tables = [self.blocks.block_table_view(r) for r in rids]
        return StepBatch.build(rids, runs, starts, tables, slots, [True] * len(rids), copies)

    def _step(
        self, rids: list[Hashable], runs: list[list[int]], starts: list[int], slots, copies, feed
    ) -> Any:
        """One draft step, the logits of each sequence's last token; with `feed` (an executor with
        ``step_async``) its single-token rows take their ids from the previous step's tokens on the
        device, so the host never waits between steps. A catch-up of short runs (2 to 8 tokens, as after
        a fully accepted proposal) asks for every row's logits, as a verification step does, so that
        it takes the executor's static decode path (one graph) rather than the prompt chunks' one."""
        batch = self._batch(rids, runs, starts, slots, copies)
        longest = int(batch.query_lens.max())
        if feed is not None:
            return self.executor.step_async(batch, feed)  # type: ignore[attr-defined]
        if not 1 < longest <= self.short_run:
            return self.executor.step(batch)
        import torch

        from trtforge.llm.host_to_device import to_device

        every_row = replace(batch, logits_indices=np.arange(batch.num_tokens))
        logits = torch.as_tensor(self.executor.step(every_row))
        last = batch.query_start_loc[1:].astype(np.int64) - 1
        return logits.index_select(0, to_device(last, logits.device))

    def propose(self, seqs: Sequence[Sequence_], ks: Sequence[int]) -> list[Proposal]:
        pick = _Picker(seqs, ks)
        chain = self._chains(len(seqs))
        live, runs, starts, slots, copies = [], [], [], [], []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            got = self._sync(seq, k, k - 1 if chain else 0) if k > 0 else None
            if got is not None:
                live.append(i)
                runs.append(self._draft_ids(got[0]))
                starts.append(got[1])
                slots.append(got[2])
                copies.extend(got[3])
        if not live:
            return [Proposal([]) for _ in seqs]
        if chain:
            steps = self._propose_chained(seqs, pick, live, runs, starts, slots, copies)
        else:
            steps = self._propose_stepwise(seqs, ks, pick, live, runs, starts, slots, copies)
        drafts: list[list[int]] = [[] for _ in seqs]
        dists: list[list[np.ndarray]] = [[] for _ in seqs]
        for rows, tokens, q in steps:
            sampled = [i for i in rows if i in pick.draws]
            for i, t in zip(rows, tokens):
                drafts[i].append(int(t))
            for j, i in enumerate(sampled):
                dists[i].append(q[j])
        out = []
        for seq, d, q in zip(seqs, drafts, dists):
            if d:
                # the pool's copy: its tokens, then the proposals whose K/V it wrote (all but the last)
                self._written[seq.request_id].extend(d[:-1])
            out.append(Proposal(d, self._widened(np.stack(q)) if q else None))
        return out

    def _draft_ids(self, run: list[int]) -> list[int]:
        """`run` (target ids) as the draft may embed them: ids past its vocabulary (a padded target's
        padding ids, which the target can still sample) become 0, which only costs that proposal's
        acceptance; verification keeps the output exact."""
        vocab = self.executor.facts.vocab_size
        if not run or max(run) < vocab:
            return run
        return [t if t < vocab else 0 for t in run]

    def _widened(self, q: np.ndarray) -> np.ndarray:
        """Draft distributions ``[k, draft vocab]`` over the target's vocabulary (zero past the draft's),
        as rejection sampling compares them with the target's."""
        extra = self.target_vocab - q.shape[1]
        return np.pad(q, ((0, 0), (0, extra))) if extra > 0 else q

    def _propose_chained(self, seqs, pick: _Picker, live, runs, starts, slots, copies) -> list[tuple]:
        """The catch-up step, then the further steps as one :meth:`decode_chain` on reserved slots;
        where the executor takes the catch-up as the chain's first step (``chain_q_len``: runs of up to
        8 tokens, as after a verification) the whole proposal is that one chain (one host preparation,
        one copy, one graph when greedy). Per step (its sequences, their tokens, the sampled rows'
        distributions), on the host."""
        import torch

        rids = [seqs[i].request_id for i in live]
        fed = [len(r) for r in runs]
        first = self._batch(rids, runs, starts, [s[:n] for s, n in zip(slots, fed)], copies)
        q_len = getattr(self.executor, "chain_q_len", None)
        fold = self.fold and callable(q_len) and q_len(first) is not None
        ahead = np.array([len(s) - n for s, n in zip(slots, fed)], dtype=np.int64)
        m = int(ahead.max())
        greedy = not any(i in pick.draws for i in live)  # argmax: the executor's own (one graph)
        chained: list[Any] = []
        qs: list[Any] = []
        if not fold:
            logits = self._step(rids, runs, starts, [s[:n] for s, n in zip(slots, fed)], copies, None)
            tokens, q0 = pick(logits, live, 0)
            chained, qs = [tokens], [q0]
        if m or fold:
            nxt = np.array([p + n for p, n in zip(starts, fed)], dtype=np.int64)  # first proposal's position
            upto = np.minimum(np.arange(1, m + 1)[:, None], ahead[None, :])  # a row past its last repeats it
            step_slots = np.full((m, len(live)), -1, dtype=np.int64)  # (-1: its K/V goes nowhere)
            for r, (s, n) in enumerate(zip(slots, fed)):
                step_slots[: ahead[r], r] = s[n:]
            width = max(len(self.blocks.block_table_view(r)) for r in rids)
            done = len(chained)  # (steps run before the chain: its step j is the proposal's j + done)

            def step_pick(step_logits: Any, j: int) -> Any:
                tokens, q = pick(step_logits, live, j + done)
                qs.append(q)
                return tokens

            chained += self.executor.decode_chain(  # type: ignore[attr-defined]
                None if fold else chained[0],
                nxt + upto - 1,
                step_slots,
                nxt + upto,
                self.blocks.block_table_array(rids, width),
                None if greedy else step_pick,
                first if fold else None,
            )
            if greedy:
                qs += [None] * (m + fold)
            self.chain_steps += m
            self.folded_catch_ups += fold
        host = torch.stack(chained).tolist()  # the one wait for the device
        sampled = [r for r, i in enumerate(live) if i in pick.draws]
        steps = []
        for j, (tokens, q) in enumerate(zip(host, qs)):
            keep = [r for r in range(len(live)) if ahead[r] >= j]  # rows still proposing at step j
            if q is not None:
                q = q.cpu().numpy()[[n for n, r in enumerate(sampled) if ahead[r] >= j]]
            steps.append(([live[r] for r in keep], [tokens[r] for r in keep], q))
        return steps

    def _propose_stepwise(self, seqs, ks, pick: _Picker, live, runs, starts, slots, copies) -> list[tuple]:
        """The catch-up step, then one step per further token, each a batch built on the host (its ids
        fed from the previous step's tokens on the device where the executor steps asynchronously); per
        step (its sequences, their tokens, the sampled rows' distributions), on the host."""
        from trtforge.llm.executors.base import TokenFeed, supports_async

        on_device = supports_async(self.executor)
        steps: list[tuple[list[int], Any, Any]] = []
        feed = None
        while live:
            rids = [seqs[i].request_id for i in live]
            logits = self._step(rids, runs, starts, slots, copies, feed)
            tokens, q = pick(logits, live, len(steps))
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
        # (the first copy waits for the device, once)
        return [(rows, tokens.tolist(), None if q is None else q.cpu().numpy()) for rows, tokens, q in steps]

    def forget(self, request_ids: Iterable[Hashable]) -> None:
        for rid in request_ids:
            if self._written.pop(rid, None) is not None:
                self.blocks.free(rid)
