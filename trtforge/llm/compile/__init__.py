"""Decoder LLMs: a Hugging Face causal LM -> ONE step graph (ONNX opset 24) serving prefill and decode.

Design. A torch wrapper (:mod:`.step`) runs the model's own submodules through one adapter per family
(:mod:`trtforge.llm.models`, shared with the torch executor: Llama-style = llama, mistral, ministral, qwen2,
qwen3, phi3, starcoder2, internlm3, seed_oss, arcee; Ministral 3; GPT-2, GPT-SW3, GPT-Neo, GPT-BigCode, GPT-1;
OPT; Gemma 1, Gemma 2, Gemma 3 text, ModernBERT-Decoder, OLMo 1-3, Granite, Granite SWA, StableLM, SmolLM3,
Cohere 1 / 2, GLM, GLM-4-0414, Nemotron, Persimmon, Helium, ERNIE 4.5, EXAONE 4, HunYuan dense, Apertus,
Apertus 1.5 text; GPT-NeoX, GPT-NeoX-Japanese; Phi; GPT-J, CodeGen; Falcon; BLOOM, MPT; the MoE families
Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GraniteMoE, GraniteMoeShared, gpt-oss, HunYuan-MoE, ERNIE 4.5-MoE,
GLM-4.5, Param2-MoE, Sarvam-MoE, Solar Open, dots.llm1, FlexOLMo, K-EXAONE, Mellum, Cohere 2-MoE,
GraniteMoeSWA, MiniMax-M2, MiniCPM5-MoE, Kolibri-1, HY V3, Flint, AFMoE, Beam, Laguna, Aria text, whose expert
MLPs the step graph computes densely:
:mod:`trtforge.llm.models.moe`); only the attention is rewritten, around two torch custom ops with exact torch
reference implementations (:mod:`.ops`): the cache write, exported as ONNX ``TensorScatter`` (TensorRT:
KV_CACHE_UPDATE, in place), and attention over the cache, exported as ONNX ``Attention`` with one output and
an explicit bool mask (TensorRT: IAttention). A layer with an attention
logit soft-cap (Gemma 2) attends through plain ops instead (MatMul, Tanh on the scaled scores, Where, Softmax:
TensorRT's parser refuses ONNX Attention's ``softcap``), which no attention pass fuses; so does an ALiBi layer
(BLOOM, MPT, falcon-rw), its position bias (slope times key minus query position, the query's from
``position_ids``) added to the scaled scores before the mask, and a layer with attention sinks (gpt-oss), each
head's sink logit one more Softmax column (Concat before, Slice after). Both torch exporters work (dynamo:
custom_translation_table; legacy: symbolic functions); :mod:`.export` checks the graph with exact ONNX Runtime
against torch on a ragged prefill and a decode step.

Step graph contract ("slot" cache layout; issue #17's serving layer is written against it):

inputs
  ``input_ids``    int64 [B, S]   new tokens; rows shorter than S are right-padded (any valid id)
  ``position_ids`` int64 [B, S]   their positions (RoPE angle / learned position row / ALiBi query position)
  ``past_lens``    int64 [B]      tokens already in the cache = the row's write index
  ``new_lens``     int64 [B]      real new tokens per row, 1 <= new_lens[b] <= S
  ``key_cache.{i}``, ``value_cache.{i}``  [B, Hkv, S_max, D] per layer i (S_max static, the --max-seq)
outputs
  ``logits``       float32 [B, V] of each row's last real new token ([B, S, V] with all_logits)
  ``key_cache_out.{i}``, ``value_cache_out.{i}``  the caches with the S new rows written at
                   past_lens[b] .. past_lens[b]+S-1 (TensorRT aliases them to the inputs, in place)

Query j of row b sees key k iff k <= past_lens[b]+j and k < past_lens[b]+new_lens[b] (and, for a
sliding-window layer, k > past_lens[b]+j-window; for a chunked layer of chunk C (Llama 4's), k >= p - p % C
with p = past_lens[b]+j). The caller keeps past_lens[b]+S <= S_max. Padded
positions write garbage rows beyond a row's length; they are masked out and overwritten by the next
step, which writes from past_lens+new_lens.

Paged contract (``export_step(..., cache_layout="paged", block_size=bs)``; served by
:class:`trtforge.llm.executors.OrtPagedExecutor` under issue #17's scheduler):

inputs
  ``input_ids``, ``position_ids``, ``past_lens``, ``new_lens``   as above ([B, S] right-padded, [B])
  ``block_tables`` int32 [B, max_blocks]  row b's physical blocks in order; entries past its length
                   may be any valid block (masked out)
  ``slot_mapping`` int64 [B, S]   pool slot (block * bs + offset) of each new token; padded positions
                   point at a scratch block the caller never reads (several may share one slot)
  ``key_pool.{i}``, ``value_pool.{i}``  [num_blocks, bs, Hkv, D] per layer (num_blocks dynamic)
outputs
  ``logits``       as above
  ``key_pool_out.{i}``, ``value_pool_out.{i}``  the pools with the new rows written

Per layer the write is ``ScatterND`` into the pool reshaped to [num_blocks*bs, Hkv, D] at
``slot_mapping`` (updates Transpose(k, [0, 2, 1, 3])), reshaped back; the read is
``Gather(pool, block_tables)`` -> Transpose [0, 3, 1, 2, 4] -> Reshape to [B, Hkv, max_blocks*bs, D];
then the same ``Attention`` with the same mask rule as the slot layout over key positions
0 .. max_blocks*bs-1. ``optimize --attention paged`` rewrites each layer's write + gather + attention
into one ``trtforge::PagedAttention`` node over the same pools (slot_mapping, block_tables and
seq_lens = past_lens + new_lens, query_lens = new_lens as int32; the plugin runs the decode kernel for
S = 1 and chunked prefill for longer, ragged steps). Layers with a sliding window or an attention chunk
shorter than max_seq are refused with that reason (the paged plugin has no window or chunk mask).

Engine: one engine with two optimization profiles, 0 = prefill (S in 1..max_prefill) and 1 = decode
(S = 1), sharing one copy of the weights (:mod:`.build`, :mod:`.compile`). Precision: FP16 (default)
or BF16 with FP16/BF16 caches and FP32 logits; INT8 SmoothQuant W8A8 calibrated on prompts
(:mod:`.int8`) with the rest FP16. FP32 engines are refused: TensorRT's attention layer needs FP16/BF16.

Exporters: both work for all four families. The legacy one needed two workarounds, both in this
package: GPT-2's Conv1D is applied as matmul + bias (its traced view froze S), and the exported
graph's intermediate value_info is dropped (concrete example sizes that shape folding would bake in).
The dynamo exporter is several times slower on this model size (40-150 s vs ~5 s on the CI box).

May import the encoder wing (``compiler``'s compile session, ``passes``, ``calibration``, ``core``) and
``llm.models`` / ``llm.contract``; nothing in ``llm`` but the front doors imports this package.
"""
