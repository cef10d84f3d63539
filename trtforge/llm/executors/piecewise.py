"""Piecewise CUDA graphs for steps with prompt tokens: the work between attention calls, per token bucket.

A step that is not decode-only mixes prompt chunks and decode rows, so its attention launches
depend on the step's layout (how many chunks, where they start) and cannot be fixed in a graph.
Everything else in a layer (norms, projections, RoPE and the K/V write, the MLP, residuals) depends
only on the token count. With the tokens padded to a bucket, the step runs as L + 1 graphs: the
embedding and layer 0's attention input; layer i's output and layer i+1's input; the last layer's
output. Attention runs eagerly between them, reading and writing static buffers (as vLLM's
piecewise graphs do). Padding tokens carry id 0 at position 0 and write their K/V to the pools'
scratch slot, which no real row reads. Without CUDA graphs (the CPU, tests) the same pieces run
eagerly on the same buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from trtforge.core.cuda_capture import gc_paused
from trtforge.llm.executors.base import StepBatch, TokenFeed
from trtforge.llm.host_to_device import to_device

#: Token-count buckets of piecewise steps (a step with more tokens than the largest runs eagerly).
TOKEN_BUCKETS = (8, 16, 32, 64, 128, 192, *range(256, 8193, 128))


# Empty the allocator's cache between a bucket's warm-up and its capture (session 34): a capture cannot
# release cached blocks to make room, and warm-ups on fresh streams left theirs cached where no later
# allocation could reuse them (an 8B FP8 capture at 8,192-token steps ran out of memory beside its sized
# pool). False (for an A/B) skips it.
EMPTY_CACHE_BEFORE_CAPTURE = True


class StepLayers(Protocol):
    """What the pieces run: the model split at its attention calls (the torch executor provides it)."""

    @property
    def num_layers(self) -> int: ...

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Hidden states ``[T, hidden]`` of `ids`, and what every layer needs of the positions (RoPE)."""
        ...

    def layer_in(
        self, i: int, h: torch.Tensor, extra: Any, slots: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Layer i up to attention: writes K/V at `slots`, returns q ``[T, Hq, D]`` (written into `out`
        when given)."""
        ...

    def layer_out(
        self, i: int, h: torch.Tensor, o: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Layer i after attention (output projection, MLP, residuals): the next hidden states (written
        into `out` when given, which may be `h` itself)."""
        ...

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Float32 logits of hidden states `h`."""
        ...


#: ``attend(layer, q [T, Hq, D], out [T, Hq, D])``: the step's attention of one layer, into `out`.
AttendFn = Callable[[int, torch.Tensor, torch.Tensor], None]


@dataclass
class _Bucket:
    """The pieces of one token bucket: callables, and their graphs once captured."""

    pieces: list[Callable[[], None]]
    graphs: list[Any] = field(default_factory=list)

    def run(self, j: int) -> None:
        if self.graphs:
            self.graphs[j].replay()
        else:
            self.pieces[j]()


class PiecewiseStep:
    """Runs steps of up to `max_tokens` tokens as pieces on static buffers; CUDA graphs when `graphs`.

    `scratch_slot` is the pool slot padding tokens write to; `pool` returns the memory pool the
    graphs share (with the decode graphs: one step runs at a time, on one stream), `stream` the side
    stream each bucket warms up and is captured on (called once a bucket: the same stream each time lets
    buckets reuse each other's freed blocks, which the allocator reuses on their own stream only); each
    defaults to one of this runner's own.
    """

    def __init__(
        self,
        layers: StepLayers,
        *,
        max_tokens: int,
        hidden: int,
        num_heads: int | list[int],
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        scratch_slot: int,
        graphs: bool,
        pool: Callable[[], Any] | None = None,
        stream: Callable[[], Any] | None = None,
    ) -> None:
        self.layers = layers
        self.buckets = (*(b for b in TOKEN_BUCKETS if b < max_tokens), max_tokens)
        self.max_tokens = max_tokens
        self.device, self.dtype = device, dtype
        #: the query head count of every layer, or each layer's (they may differ: Laguna's)
        # (one count where every layer's is the same: a step then takes one view of q and o for all)
        heads = [num_heads] if isinstance(num_heads, int) else list(num_heads)
        self._heads: int | list[int] = heads[0] if len(set(heads)) == 1 else heads
        widest = max(heads)
        self._shapes = (hidden, widest, head_dim)
        self.scratch_slot = scratch_slot
        self.use_graphs = graphs
        self._pool = pool
        self._stream = stream
        self._own_stream: Any = None
        self._bufs: dict[str, torch.Tensor] = {}
        self._records: dict[int, _Bucket] = {}

    @property
    def num_graphs(self) -> int:
        """CUDA graphs captured so far (L + 1 per token bucket used)."""
        return sum(len(r.graphs) for r in self._records.values())

    def bucket(self, num_tokens: int) -> int | None:
        """The bucket a step of `num_tokens` tokens pads to, or None above the largest."""
        for b in self.buckets:
            if b >= num_tokens:
                return b
        return None

    def _buffers(self) -> dict[str, torch.Tensor]:
        if not self._bufs:
            n, dev, dt = self.max_tokens, self.device, self.dtype
            hidden, hq, d = self._shapes
            self._bufs = {
                "inputs": torch.zeros(3, n, dtype=torch.int32, device=dev),  # ids, positions, slots
                "h": torch.zeros(n, hidden, dtype=dt, device=dev),
                # flat: each layer views its first rows as [tokens, its heads, d] (:meth:`_heads_view`)
                "q": torch.zeros(n * hq * d, dtype=dt, device=dev),
                # padding rows keep what earlier steps left: finite values, never read by real rows
                "o": torch.zeros(n * hq * d, dtype=dt, device=dev),
            }
        return self._bufs

    def _heads_view(self, name: str, i: int, rows: int) -> torch.Tensor:
        """The first `rows` rows of the flat buffer `name` ("q" or "o") as layer i's ``[rows, heads, d]``
        (contiguous; a bucket's view and a step's of its first rows share their elements)."""
        _, _, d = self._shapes
        heads = self._heads if isinstance(self._heads, int) else self._heads[i]
        return self._buffers()[name][: rows * heads * d].view(rows, heads, d)

    def _make_pieces(self, tb: int) -> _Bucket:
        """Bucket `tb`'s pieces. The RoPE kernel writes q straight into its static buffer and the
        projections accumulate into the residual stream ``h`` in place: copying both in instead cost
        2.5% of 2048/128's output rate at 8B (BENCHMARKS.md, session 29)."""
        buf, layers = self._buffers(), self.layers
        ids, pos, slots = buf["inputs"][:, :tb].unbind(0)
        h = buf["h"][:tb]
        q = [self._heads_view("q", i, tb) for i in range(layers.num_layers)]
        o = [self._heads_view("o", i, tb) for i in range(layers.num_layers)]
        state: dict[str, Any] = {}

        def first() -> None:
            x, state["extra"] = layers.embed(ids, pos)
            h.copy_(x)
            layers.layer_in(0, h, state["extra"], slots, out=q[0])

        def middle(i: int) -> Callable[[], None]:
            def piece() -> None:
                layers.layer_out(i - 1, h, o[i - 1], out=h)
                layers.layer_in(i, h, state["extra"], slots, out=q[i])

            return piece

        def last() -> None:
            layers.layer_out(layers.num_layers - 1, h, o[-1], out=h)

        pieces = [first, *(middle(i) for i in range(1, layers.num_layers)), last]
        return _Bucket(pieces=pieces)

    def _fill_padding(self, tb: int) -> None:
        ids, pos, slots = self._buffers()["inputs"][:, :tb].unbind(0)
        ids.fill_(0)
        pos.fill_(0)
        slots.fill_(self.scratch_slot)

    def prepare(self, tb: int) -> None:
        """Build bucket `tb`'s pieces and, with graphs on, capture them (runs touch only the scratch slot)."""
        if tb in self._records:
            return
        record = self._make_pieces(tb)
        if self.use_graphs:
            self._fill_padding(tb)
            cur = torch.cuda.current_stream(self.device)
            side = self._side_stream()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                for piece in record.pieces:  # warm-up outside capture: lazy inits, workspaces
                    piece()
            side.synchronize()
            # a capture cannot release cached blocks to make room, and the sizing measured the graphs
            # after emptying the cache: the warm-up's temporaries go back before capturing
            if EMPTY_CACHE_BEFORE_CAPTURE:
                torch.cuda.empty_cache()
            pool = self._pool() if self._pool is not None else None
            # capture_begin/end rather than torch.cuda.graph(): that one collects garbage and empties the
            # allocator's cache around every capture, which for L + 1 pieces a bucket dominates capture time
            for piece in record.pieces:
                graph = torch.cuda.CUDAGraph()
                with gc_paused(), torch.cuda.stream(side):
                    graph.capture_begin(pool=pool)
                    try:
                        piece()
                    finally:
                        graph.capture_end()
                record.graphs.append(graph)
            cur.wait_stream(side)
        self._records[tb] = record

    def _side_stream(self) -> Any:
        if self._stream is not None:
            return self._stream()
        if self._own_stream is None:
            self._own_stream = torch.cuda.Stream(self.device)
        return self._own_stream

    def capture_all(self) -> int:
        """Prepare every bucket now rather than on first use, largest first (the graphs share one memory
        pool: where they are captured on one stream, smaller buckets' temporaries then fit in the blocks
        the largest one's left free, where smallest first would add a larger segment for every bucket);
        return the graphs captured."""
        for tb in reversed(self.buckets):
            self.prepare(tb)
        return self.num_graphs

    def run(self, batch: StepBatch, feed: TokenFeed | None, attend: AttendFn) -> torch.Tensor:
        """One step (``batch.num_tokens <= max_tokens``): its float32 logits at ``batch.logits_indices``."""
        t = batch.num_tokens
        tb = self.bucket(t)
        if tb is None:
            raise ValueError(f"a step of {t} tokens is above the largest piecewise bucket {self.max_tokens}")
        self.prepare(tb)
        record, buf = self._records[tb], self._buffers()
        host = np.empty((3, tb), dtype=np.int32)
        host[0, :t], host[1, :t], host[2, :t] = batch.input_ids, batch.positions, batch.slot_mapping
        host[:, t:] = np.array([[0], [0], [self.scratch_slot]], dtype=np.int32)
        inputs = buf["inputs"][:, :tb]
        inputs.copy_(to_device(host, self.device))
        if feed is not None:  # on the device, after the copy and before the first piece reads the ids
            rows, sources = to_device(np.stack([feed.rows, feed.sources]).astype(np.int64), self.device)
            tokens = torch.as_tensor(feed.tokens, device=self.device).index_select(0, sources)
            inputs[0].index_copy_(0, rows, tokens.to(torch.int32))
        n = self.layers.num_layers
        if isinstance(self._heads, int):  # the step's views once, not twice a layer (host time)
            views = [(self._heads_view("q", 0, t), self._heads_view("o", 0, t))] * n
        else:
            views = [(self._heads_view("q", i, t), self._heads_view("o", i, t)) for i in range(n)]
        for i, (q, o) in enumerate(views):
            record.run(i)
            attend(i, q, o)
        record.run(self.layers.num_layers)
        rows = to_device(batch.logits_indices, self.device)
        return self.layers.head(buf["h"][:t].index_select(0, rows))
