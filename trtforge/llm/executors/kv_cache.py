"""The KV cache's element type (``kv_cache_dtype``): "auto" (the model's dtype) or "fp8" (E4M3 pools).

An FP8 pool holds each layer's keys and values as ``x / scale`` in ``torch.float8_e4m3fn`` (1 byte an
element, saturated to ±448; :mod:`trtforge.kernels.kv_quant`), with one float32 scale for the
layer's K and one for its V (per tensor: the kernels fold the K scale into the softmax scale and apply
the V scale to the output, so a scale is a plain launch argument and CUDA graphs stay valid). The
scales are :class:`KVScales`: calibrated (the default) as ``amax / 448`` of each layer's K (after
RoPE) and V over calibration prompts, or fixed (vLLM's default is 1.0). The torch reference path
quantizes with the same arithmetic and attends in float32 over the dequantized values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trtforge.errors import UserError
from trtforge.kernels.kv_quant import FP8_KV_DTYPE, FP8_MAX, dequantize, quantize_fp8

# every name ``kv_cache_dtype`` takes (vLLM's spellings of E4M3 included) -> its canonical name
_ALIASES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8"}
KV_CACHE_DTYPES = tuple(_ALIASES)
# Calibration without prompts: this many sequences of this many token ids drawn uniformly (seeded).
DEFAULT_CALIB_SEQS = 4
DEFAULT_CALIB_LEN = 512
_CALIB_SEED = 0


def kv_cache_dtype_name(value: Any) -> str:
    """The canonical name ("auto" or "fp8") of a ``kv_cache_dtype`` option; UserError for anything else."""
    name = _ALIASES.get(value) if isinstance(value, str) else None
    if name is None:
        raise UserError(
            f"kv_cache_dtype (--kv-cache-dtype) {value!r} is not supported; choose 'auto' (the model's "
            "dtype) or 'fp8' (E4M3 pools with per-layer scales). FP8 E5M2 and INT8 KV caches are not "
            "implemented."
        )
    return name


def resolve_kv_cache_dtype(value: Any, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The pools' torch dtype for ``kv_cache_dtype`` `value` on `device`: the model's dtype for "auto",
    ``float8_e4m3fn`` for "fp8". FP8 on a CUDA GPU needs compute capability 8.9 or later (Ada, Hopper,
    Blackwell): older GPUs are refused by name. The CPU runs FP8 pools on the float32 reference path."""
    if kv_cache_dtype_name(value) == "auto":
        return model_dtype
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            name = torch.cuda.get_device_name(device)
            raise UserError(
                f"kv_cache_dtype='fp8' needs a GPU with FP8 support (compute capability 8.9 or later: Ada, "
                f"Hopper, Blackwell); {name} is {major}.{minor}. Use kv_cache_dtype='auto'."
            )
    return FP8_KV_DTYPE


def kv_element_bytes(value: Any, model_dtype: torch.dtype) -> int:
    """Bytes one cached K or V element takes under ``kv_cache_dtype`` `value` (sizing)."""
    dtype = model_dtype if kv_cache_dtype_name(value) == "auto" else FP8_KV_DTYPE
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class KVScales:
    """One K and one V scale per layer (dequantized = stored * scale) and how they were reached."""

    k: tuple[float, ...]
    v: tuple[float, ...]
    how: str

    @classmethod
    def fixed(cls, value: float, num_layers: int) -> KVScales:
        """The same scale for every layer's K and V."""
        value = float(value)
        if not value > 0 or value == float("inf"):
            raise UserError(f"a fixed KV-cache scale must be a positive number, got {value!r}.")
        return cls((value,) * num_layers, (value,) * num_layers, f"fixed {value:g}")

    def layer(self, i: int) -> tuple[float, float]:
        return self.k[i], self.v[i]


def default_calibration_prompts(vocab_size: int) -> list[list[int]]:
    """Seeded uniform token ids: what calibration runs on when no prompts are given."""
    gen = torch.Generator().manual_seed(_CALIB_SEED)
    ids = torch.randint(0, vocab_size, (DEFAULT_CALIB_SEQS, DEFAULT_CALIB_LEN), generator=gen)
    return ids.tolist()


def _layer_kv(cache: Any, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer i's cached keys and values of a transformers cache (>= 4.56 ``layers``; older ``key_cache``)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers[i].keys, layers[i].values
    return cache.key_cache[i], cache.value_cache[i]


@torch.inference_mode()
def calibrate_kv_scales(
    model: Any, num_layers: int, prompts: Sequence[Sequence[int]] | None = None, *, max_len: int | None = None
) -> KVScales:
    """Per-layer scales ``amax / 448`` of the keys (after RoPE) and values that `model` (a transformers
    causal LM, on its device and dtype) caches over `prompts` (token-id lists; None: seeded random ids,
    :func:`default_calibration_prompts`), each run alone and cut to `max_len` tokens."""
    vocab = int(model.config.vocab_size)
    given = prompts is not None
    rows = [list(p) for p in (prompts if given else default_calibration_prompts(vocab))]
    rows = [r[:max_len] if max_len else r for r in rows if r]
    if not rows:
        raise UserError("KV-cache calibration needs at least one non-empty prompt (--calib-data).")
    bad = [t for r in rows for t in r if not 0 <= int(t) < vocab]
    if bad:
        raise UserError(
            f"calibration prompts hold token ids {bad[:5]} outside the vocabulary 0..{vocab - 1}."
        )
    device = next(model.parameters()).device
    k_amax, v_amax = [0.0] * num_layers, [0.0] * num_layers
    for r in rows:
        out = model(input_ids=torch.tensor([r], device=device), use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        for i in range(num_layers):
            k, v = _layer_kv(cache, i)
            k_amax[i] = max(k_amax[i], float(k.abs().amax()))
            v_amax[i] = max(v_amax[i], float(v.abs().amax()))
    tokens = sum(len(r) for r in rows)
    source = "prompts" if given else "seeded random token ids"
    floor = 1e-6  # an all-zero layer still gets a usable scale

    def to_scale(a: float) -> float:
        return max(a, floor) / FP8_MAX

    how = f"calibrated: amax / {FP8_MAX:g} over {len(rows)} {source} ({tokens} tokens)"
    return KVScales(tuple(to_scale(a) for a in k_amax), tuple(to_scale(a) for a in v_amax), how)


def write_reference(pool: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, scale: float) -> None:
    """The torch path's cache write: rows `x` ``[T, Hkv, D]`` into `pool` ``[N, block_size, Hkv, D]`` (any
    strides) at flat `slots` (int64 ``[T]``), quantized with `scale` where the pool is FP8."""
    bs = int(pool.shape[1])
    blk, off = slots // bs, slots % bs
    if pool.dtype == FP8_KV_DTYPE:  # (index_put_ has no FP8 kernel: copy the bytes)
        pool.view(torch.uint8)[blk, off] = quantize_fp8(x, scale).view(torch.uint8)
    else:
        pool[blk, off] = x


def read_reference(gathered: torch.Tensor, scale: float) -> torch.Tensor:
    """K or V gathered from a pool, as the reference attends over it: FP8 dequantized to float32."""
    return dequantize(gathered, scale) if gathered.dtype == FP8_KV_DTYPE else gathered
