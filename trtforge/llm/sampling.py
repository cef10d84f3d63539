"""Per-request sampling parameters and a batched sampler over a logits batch (torch or numpy).

Each request draws from its own seeded generator, exactly one uniform number per sampled token, and
sampling is inverse-CDF over the stably sorted, min_p/top-k/top-p filtered distribution. A grammar
bitmask, the logit bias and the penalties are applied to the whole batch first, in that order
(:mod:`trtforge.llm.penalties`), row-wise; greedy rows take the argmax of the result. So a
request's tokens depend only on its logits, its history and its seed, never on which other requests
share the batch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from trtforge.errors import UserError, checked_call, is_int, shown
from trtforge.llm.host_to_device import to_device
from trtforge.llm.penalties import (
    RowHistory,
    TokenLogprobs,
    apply_bitmask,
    apply_logit_bias,
    apply_penalties,
    compute_logprobs,
    min_p_floor,
)

# vLLM's default max_logprobs (and OpenAI's top_logprobs limit)
MAX_LOGPROBS = 20
# samples of one prompt at most: each is its own queued sequence (a few KB of host memory before it
# runs, then its own KV blocks), all created at once, so a typo such as n=10**23 must be refused rather
# than fill the memory for hours; 65,536 samples of a small model take about a minute on a CPU
MAX_N = 2**16
# a temperature below this samples greedily (vLLM's _SAMPLING_EPS): the scaled logits of 1e-320 overflowed
# to inf, inf - inf is NaN, and the sampler returned token 0, 1, 2, ... with NaN logprobs
GREEDY_TEMPERATURE = 1e-5
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
# logit_bias entries at most: one per token id of the largest vocabularies (Gemma 3's 262,144) with room;
# the engine refuses an id past its model's vocabulary, so a request's map is at most that in practice
MAX_LOGIT_BIAS = 2**20
# OpenAI's range of a logit_bias value: -100 bans a token, +100 all but forces it
LOGIT_BIAS_LIMIT = 100.0
# logit_bias ids are int64 on the host and the device (an id of 2**64 raised OverflowError when the
# request was queued); the engine then refuses one past its model's vocabulary
MAX_TOKEN_ID = 2**63 - 1
# digits of a token id written as text (a server's logit_bias key, --logit-bias ID=BIAS): any vocabulary's
# ids fit, and int() never meets a 4,300-digit string
MAX_TOKEN_ID_DIGITS = 12
_TOKEN_ID_TEXT = re.compile(f"[0-9]{{1,{MAX_TOKEN_ID_DIGITS}}}")


def token_id_of(text: str) -> int | None:
    """The token id `text` spells (decimal digits only, at most :data:`MAX_TOKEN_ID_DIGITS`), else None:
    the one reading of a logit_bias key for the server and ``generate --logit-bias``."""
    return int(text) if _TOKEN_ID_TEXT.fullmatch(text) else None


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _finite(x: Any) -> bool:
    """Whether number `x` is a finite float: NaN, infinities and an integer too large for a float (whose
    float() raised OverflowError) are not."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


# a seed is any int64, as OpenAI's API and vLLM take it (the CLI's --seed and the server's "seed" alike)
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How one request generates: greedy by default (temperature 0, or any below 1e-5, as vLLM).

    ``stop_token_ids`` and ``eos_token_id`` end generation when sampled; ``stop_sequences`` are
    token-id sequences that end it once the output ends with one. The token(s) that stopped
    generation stay in the output. ``eos_token_id=None`` means the engine's (the model's) EOS;
    ``ignore_eos`` disables it. The other fields carry vLLM's names and meanings: ``n`` samples per
    prompt (see :meth:`expand`), ``logprobs`` top logprobs per token (0: the sampled token's only;
    see :class:`~trtforge.llm.penalties.TokenLogprobs`), the penalties and ``min_p`` of
    :mod:`trtforge.llm.penalties`, ``stop`` strings (for the layers that hold a tokenizer and match them
    on the decoded text: ``trtforge serve`` and ``generate``; the token engine refuses them),
    ``response_format`` (OpenAI's: ``{"type": "json_object"}`` or ``{"type": "json_schema",
    "json_schema": {"schema": {...}}}``) for grammar-constrained output, and ``logit_bias`` (OpenAI's:
    token id -> a bias in [-100, 100] added to that token's logit before sampling; -100 bans it, +100
    all but forces it; an empty map is None).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    eos_token_id: int | None = None
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    response_format: dict[str, Any] | None = field(default=None, hash=False)
    logit_bias: dict[int, float] | None = field(default=None, hash=False)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        def bad(name: str, expected: str, value: object) -> UserError:
            return UserError(f"SamplingParams.{name} must be {expected}, got {shown(value)}")

        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise bad("max_tokens", "an integer >= 1", self.max_tokens)
        if not _is_number(self.temperature) or not _finite(self.temperature) or self.temperature < 0:
            raise bad("temperature", "a finite number >= 0 (0 means greedy)", self.temperature)
        if not is_int(self.top_k) or self.top_k < 0:
            raise bad("top_k", "an integer >= 0 (0 keeps every token)", self.top_k)
        if not _is_number(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise bad("top_p", "a number in (0, 1]", self.top_p)
        if self.seed is not None and (not is_int(self.seed) or not SEED_MIN <= self.seed <= SEED_MAX):
            raise bad("seed", f"None or an integer in [{SEED_MIN:,}, {SEED_MAX:,}] (any int64)", self.seed)
        if self.eos_token_id is not None and (not is_int(self.eos_token_id) or self.eos_token_id < 0):
            raise bad("eos_token_id", "None or a token id >= 0", self.eos_token_id)
        if not isinstance(self.ignore_eos, bool):
            raise bad("ignore_eos", "a bool", self.ignore_eos)
        stop_ids = self.stop_token_ids
        if isinstance(stop_ids, (str, bytes)) or not isinstance(stop_ids, (list, tuple)):
            raise bad("stop_token_ids", "a list of token ids", stop_ids)
        if not all(is_int(t) and t >= 0 for t in stop_ids):
            raise bad("stop_token_ids", "a list of token ids >= 0", stop_ids)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stop_ids))
        seqs = self.stop_sequences
        if isinstance(seqs, (str, bytes)) or not isinstance(seqs, (list, tuple)):
            raise bad("stop_sequences", "a list of token-id lists (text stop strings need a tokenizer)", seqs)
        norm: list[tuple[int, ...]] = []
        for s in seqs:
            if (
                isinstance(s, (str, bytes))
                or not isinstance(s, (list, tuple))
                or not s
                or not all(is_int(t) and t >= 0 for t in s)
            ):
                raise bad("stop_sequences", "a list of non-empty token-id lists", seqs)
            norm.append(tuple(int(t) for t in s))
        object.__setattr__(self, "stop_sequences", tuple(norm))
        self._check_openai_fields(bad)

    def _check_openai_fields(self, bad: Any) -> None:
        if not is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise bad("n", f"an integer in [1, {MAX_N}] (samples per prompt)", self.n)
        lp = self.logprobs
        if lp is not None and (not is_int(lp) or not 0 <= lp <= MAX_LOGPROBS):
            raise bad("logprobs", f"None or an integer in [0, {MAX_LOGPROBS}]", self.logprobs)
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_number(v) or not -2.0 <= v <= 2.0:
                raise bad(name, "a number in [-2, 2] (0 disables it)", v)
        rp = self.repetition_penalty
        if not _is_number(rp) or not _finite(rp) or rp <= 0:
            raise bad("repetition_penalty", "a finite number > 0 (1 disables it)", rp)
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "a number in [0, 1] (0 disables it)", self.min_p)
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(x, str) and x for x in stop):
            raise bad("stop", "a string or a list of non-empty strings", self.stop)
        object.__setattr__(self, "stop", tuple(stop))
        self._check_logit_bias(bad)
        rf = self.response_format
        if rf is None:
            return
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind not in RESPONSE_FORMATS:
            raise bad("response_format", f"None or a dict whose 'type' is one of {RESPONSE_FORMATS}", rf)
        if kind == "text":
            object.__setattr__(self, "response_format", None)
        elif kind == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, (dict, bool)):
                raise bad(
                    "response_format",
                    'of type json_schema a dict with "json_schema": {"schema": {...}}',
                    rf,
                )

    def _check_logit_bias(self, bad: Any) -> None:
        """Normalise ``logit_bias`` to a new ``{int: float}`` (None when empty), or refuse it naming the
        first bad entry (not the whole map: it may hold a vocabulary's worth)."""
        lb = self.logit_bias
        if lb is None:
            return
        expected = (
            f"None or a dict of token id (an integer in [0, 2**63)) to a bias in [-{LOGIT_BIAS_LIMIT:g}, "
            f"{LOGIT_BIAS_LIMIT:g}]"
        )
        if not isinstance(lb, Mapping):
            raise bad("logit_bias", expected, lb)
        if len(lb) > MAX_LOGIT_BIAS:
            most = f"{expected}, of at most {MAX_LOGIT_BIAS:,} entries"
            raise bad("logit_bias", most, f"{len(lb):,} entries")
        norm: dict[int, float] = {}
        for k, v in lb.items():
            ok = is_int(k) and 0 <= k <= MAX_TOKEN_ID and _is_number(v) and _finite(v)
            if not ok or not -LOGIT_BIAS_LIMIT <= v <= LOGIT_BIAS_LIMIT:
                raise bad("logit_bias", expected, {k: v})
            norm[int(k)] = float(v)
        object.__setattr__(self, "logit_bias", norm or None)

    @cached_property
    def logit_bias_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``logit_bias`` as (int64 token ids, float64 biases), built once per params (the sampler
        reads them every step); None without a bias."""
        lb = self.logit_bias
        if not lb:
            return None
        ids = np.fromiter(lb.keys(), dtype=np.int64, count=len(lb))
        return ids, np.fromiter(lb.values(), dtype=np.float64, count=len(lb))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    def stream_seed(self, fallback_seed: int) -> int:
        """The seed of the request's own random stream: `seed` as an unsigned 64-bit number (every int64
        seed its own stream: -1 is 2**64 - 1), else `fallback_seed` (the engine's)."""
        return self.seed % 2**64 if self.seed is not None else fallback_seed

    def make_generator(self, fallback_seed: int) -> np.random.Generator:
        """The request's own random stream (:meth:`stream_seed`)."""
        return np.random.default_rng(self.stream_seed(fallback_seed))

    def expand(self) -> list[SamplingParams]:
        """The `n` independent single-sample requests of these params (n=1: itself).

        Sample i has ``n=1`` and, when a seed is set, seed :func:`child_seed` (seed, i): each sample
        is reproducible from (seed, index), and sample 0 equals the n=1 request.
        """
        if self.n == 1:
            return [self]
        return [
            replace(self, n=1, seed=None if self.seed is None else child_seed(self.seed, i))
            for i in range(self.n)
        ]


SamplingParams.__init__ = checked_call(SamplingParams.__init__)  # type: ignore[method-assign]


def child_seed(seed: int, index: int) -> int:
    """Sample `index`'s seed of a request seeded `seed` (any int64; index 0 keeps the seed itself): the one
    rule for ``generate --n`` (:meth:`SamplingParams.expand`) and a server request's ``n`` choices."""
    if index == 0:
        return seed
    entropy = [seed % 2**64, index]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _settings(params: Sequence[SamplingParams], vocab: int) -> tuple[np.ndarray, ...]:
    temps = np.array([p.temperature for p in params], dtype=np.float64)
    top_k = np.array([p.top_k if 0 < p.top_k < vocab else vocab for p in params], dtype=np.int64)
    top_p = np.array([p.top_p for p in params], dtype=np.float64)
    min_p = np.array([p.min_p for p in params], dtype=np.float64)
    return temps, top_k, top_p, min_p


def _sorted_probs(logits: np.ndarray, rows: np.ndarray, temps, top_k, top_p, min_p) -> tuple[np.ndarray, ...]:
    """(order, probs): the rows' token ids stably sorted by logit, and their probabilities after
    temperature, min_p, top-k and top-p (top-p's cut left unnormalised)."""
    x = logits[rows].astype(np.float64) / temps[rows, None]
    x = np.where(x < min_p_floor(x, min_p[rows])[:, None], -np.inf, x)
    order = np.argsort(-x, axis=-1, kind="stable")
    xs = np.take_along_axis(x, order, axis=-1)
    ranks = np.arange(x.shape[1])
    xs = np.where(ranks[None, :] >= top_k[rows, None], -np.inf, xs)
    xs = xs - xs[:, :1]
    probs = np.exp(xs)
    probs /= probs.sum(-1, keepdims=True)
    cum = np.cumsum(probs, axis=-1)
    probs = np.where(cum - probs >= top_p[rows, None], 0.0, probs)
    return order, probs


def _sample_numpy(logits: np.ndarray, rows: np.ndarray, temps, top_k, top_p, min_p, u) -> np.ndarray:
    order, probs = _sorted_probs(logits, rows, temps, top_k, top_p, min_p)
    cum = np.cumsum(probs, axis=-1)
    target = u[:, None] * cum[:, -1:]
    pick = np.minimum((cum <= target).sum(-1), probs.shape[1] - 1)
    return order[np.arange(len(rows)), pick]


def probabilities(logits: np.ndarray, params: Sequence[SamplingParams]) -> np.ndarray:
    """float64 ``[N, vocab]``: the distribution :func:`sample` draws row i from under params[i]
    (temperature, min_p, top-k, top-p; no logit bias, penalties or grammar), for sampled (non-greedy)
    params only.

    Speculative decoding's rejection sampler verifies proposals against it, so that its output has
    exactly plain sampling's distribution."""
    if any(p.greedy for p in params):
        raise ValueError("probabilities() is for sampled rows; a greedy row's distribution is its argmax")
    rows = np.arange(len(params))
    order, probs = _sorted_probs(logits, rows, *_settings(params, int(logits.shape[1])))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(probs)
    np.put_along_axis(out, order, probs, axis=-1)
    return out


def _sample_torch(logits, rows, temps, top_k, top_p, min_p, u):
    """The torch twin of :func:`_sample_numpy`: (row ids, tokens), both on the logits' device.

    The per-row settings go to the device in one copy (float64 holds the row and top-k ids exactly).
    """
    import torch

    dev = logits.device
    packed = np.stack(
        [rows.astype(np.float64), temps[rows], top_k[rows].astype(np.float64), top_p[rows], min_p[rows], u]
    )
    idx, t, k, p, mp, draws = to_device(packed, dev).unbind(0)
    idx = idx.long()
    x = logits.index_select(0, idx).double() / t[:, None]
    x = x.masked_fill(x < min_p_floor(x, mp)[:, None], -math.inf)
    xs, order = torch.sort(x, dim=-1, descending=True, stable=True)
    ranks = torch.arange(x.shape[1], device=dev)
    xs = xs.masked_fill(ranks[None, :] >= k.long()[:, None], -math.inf)
    probs = torch.softmax(xs, dim=-1)
    cum = probs.cumsum(-1)
    probs = probs.masked_fill(cum - probs >= p[:, None], 0.0)
    cum = probs.cumsum(-1)
    target = draws[:, None] * cum[:, -1:]
    pick = (cum <= target).sum(-1).clamp(max=x.shape[1] - 1)
    return idx, order.gather(1, pick[:, None])[:, 0]


def _host_view(logits: Any) -> np.ndarray | None:
    """`logits` as a numpy array without a copy when it lives on the host (numpy, or a float CPU tensor)."""
    if isinstance(logits, np.ndarray):
        return logits
    import torch

    on_host = logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64)
    if on_host and not logits.requires_grad:
        return logits.numpy()
    return None


def _draws(logits: Any, params: Sequence[SamplingParams], generators: Sequence[np.random.Generator | None]):
    """Check the sizes; return the sampled (non-greedy) rows with their settings and uniform draws."""
    n = len(params)
    if len(generators) != n or logits.shape[0] != n:
        raise ValueError(f"{logits.shape[0]} logit rows, {n} params, {len(generators)} generators")
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if not sampled:
        return None
    rows = np.array(sampled, dtype=np.int64)
    u = np.array([generators[i].random() for i in sampled], dtype=np.float64)
    return (rows, *_settings(params, int(logits.shape[1])), u)


def _process(logits: Any, params: Sequence[SamplingParams], histories: Any, bitmask: Any) -> Any:
    """The logits the sampler draws from: grammar mask, logit bias, then penalties (vLLM's order;
    `logits` itself when none applies). Greedy rows take the argmax of these too."""
    if bitmask is not None:
        logits = apply_bitmask(logits, bitmask)
    logits = apply_logit_bias(logits, params)
    return apply_penalties(logits, params, histories)


def _sample_device(logits: Any, draws: Any, argmax: Callable[[Any], Any] | None = None) -> Any:
    """Token ids ``[N]`` (int64) left on the logits' device: one argmax (`argmax`: the executor's, e.g. a
    kernel of its device; else torch's), then the sampled rows' kernels."""
    out = argmax(logits) if argmax is not None else logits.argmax(dim=-1)
    if draws is not None:
        out.index_copy_(0, *_sample_torch(logits, *draws))
    return out


def _logprobs(x: Any, params: Sequence[SamplingParams], tokens: Any) -> list[TokenLogprobs | None] | None:
    """The requested logprobs of each row (None for a row that asked for none), computed batched."""
    want = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not want:
        return None
    k = min(max(params[i].logprobs for i in want), int(x.shape[1]))
    temps = np.array([_logprob_temperature(params[i]) for i in want], dtype=np.float64)
    rows = np.array(want, dtype=np.int64)
    if isinstance(x, np.ndarray):
        host_tokens = np.asarray(tokens)
        parts = compute_logprobs(x[rows].astype(np.float64) / temps[:, None], host_tokens[rows], k)
    else:
        import torch

        dev = x.device
        idx = to_device(rows, dev)
        scaled = x.index_select(0, idx).double() / to_device(temps, dev)[:, None]
        picked = torch.as_tensor(tokens).to(dev).index_select(0, idx)
        parts = [t.cpu().numpy() for t in compute_logprobs(scaled, picked, k)]
        parts_tokens = picked.cpu().numpy()
        host_tokens = np.zeros(len(params), dtype=np.int64)
        host_tokens[rows] = parts_tokens
    chosen, rank, ids, lps = parts
    out: list[TokenLogprobs | None] = [None] * len(params)
    for j, i in enumerate(want):
        m = params[i].logprobs
        token = int(host_tokens[i])
        top = tuple(zip(ids[j, :m].tolist(), lps[j, :m].tolist()))
        out[i] = TokenLogprobs(token, float(chosen[j]), int(rank[j]), top)
    return out


def _logprob_temperature(p: SamplingParams) -> float:
    """The temperature a row's logprobs are scaled by: its own, 1 where it samples greedily by
    temperature (0, or below :data:`GREEDY_TEMPERATURE`)."""
    return 1.0 if p.temperature < GREEDY_TEMPERATURE else float(p.temperature)


def _sample_host(logits, params, generators, histories, bitmask, argmax=None) -> tuple[np.ndarray, Any]:
    draws = _draws(logits, params, generators)
    x = _process(logits, params, histories, bitmask)
    host = _host_view(x)
    if host is None:  # a device tensor
        return _sample_device(x, draws, argmax).cpu().numpy().astype(np.int64, copy=False), x
    out = np.argmax(host, axis=-1).astype(np.int64, copy=False)
    if draws is not None:
        rows = draws[0]
        if isinstance(x, np.ndarray):
            out[rows] = _sample_numpy(x, *draws)
        else:
            out[rows] = _sample_torch(x, *draws)[1].numpy()
    return out, x


def sample(
    logits: Any,
    params: Sequence[SamplingParams],
    generators: Sequence[np.random.Generator | None],
    histories: Sequence[RowHistory] | None = None,
    bitmask: Any = None,
) -> np.ndarray:
    """Pick one token per row of `logits` ``[N, vocab]`` (torch tensor or numpy array); row i uses params[i].

    Greedy rows take the first maximum (their generators may be None); the others consume one uniform
    draw from generators[i].
    `histories` (one :class:`RowHistory` per row) feed the penalties, needed when a row has any;
    `bitmask` (int32 ``[N, ceil(vocab/32)]``, see :mod:`trtforge.llm.structured`) masks tokens.
    Returns int64 token ids ``[N]``. On a device: one argmax over all rows, the sampled rows'
    kernels, and a single copy back to the host.
    """
    return _sample_host(logits, params, generators, histories, bitmask)[0]


def sample_with_logprobs(
    logits: Any,
    params: Sequence[SamplingParams],
    generators: Sequence[np.random.Generator | None],
    histories: Sequence[RowHistory] | None = None,
    bitmask: Any = None,
    argmax: Callable[[Any], Any] | None = None,
) -> tuple[np.ndarray, list[TokenLogprobs | None] | None]:
    """:func:`sample`, plus each row's :class:`TokenLogprobs` (None when no row asked for logprobs).
    `argmax`: the greedy pick of device logits (the executor's; default torch's)."""
    out, x = _sample_host(logits, params, generators, histories, bitmask, argmax)
    return out, _logprobs(x, params, out)


class SampledTokens:
    """One step's sampled token ids, perhaps still being computed.

    `tokens` lies where the sampler left it (a next step reads its input ids there); :meth:`result`
    waits for the copy to the host that started with them and returns them as numpy int64 ``[N]``.
    `logprobs`: per row :class:`TokenLogprobs` or None (None: no row asked for any).
    """

    __slots__ = ("_host", "_ready", "logprobs", "tokens")

    def __init__(self, tokens: Any, host: Any, ready: Any = None, logprobs: Any = None) -> None:
        self.tokens = tokens
        self._host = host
        self._ready = ready
        self.logprobs = logprobs

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def result(self) -> np.ndarray:
        if self._ready is not None:
            self._ready.synchronize()
            self._ready = None
        host = self._host
        return host if isinstance(host, np.ndarray) else host.numpy()


def sample_async(
    logits: Any,
    params: Sequence[SamplingParams],
    generators: Sequence[np.random.Generator | None],
    histories: Sequence[RowHistory] | None = None,
    bitmask: Any = None,
    argmax: Callable[[Any], Any] | None = None,
) -> SampledTokens:
    """:func:`sample` without waiting for the device: the tokens stay on it, and a copy to pinned host
    memory plus an event start behind them. The same draws and the same tokens as :func:`sample`.
    Rows that ask for logprobs make it wait for them (they are copied to the host here)."""
    if _host_view(logits) is not None:
        out, lps = sample_with_logprobs(logits, params, generators, histories, bitmask, argmax)
        if isinstance(logits, np.ndarray):
            return SampledTokens(out, out, logprobs=lps)
        import torch

        return SampledTokens(torch.from_numpy(out), out, logprobs=lps)
    import torch

    draws = _draws(logits, params, generators)
    x = _process(logits, params, histories, bitmask)
    tokens = _sample_device(x, draws, argmax)
    lps = _logprobs(x, params, tokens)
    if tokens.device.type != "cuda":
        return SampledTokens(tokens, tokens.cpu().numpy(), logprobs=lps)
    host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    host.copy_(tokens, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(tokens.device))
    return SampledTokens(tokens, host, ready, logprobs=lps)
