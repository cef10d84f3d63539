"""One adapter per supported decoder family (:mod:`.llama`, :mod:`.gpt2`, :mod:`.gemma`, ...; shared spec,
checks, the one sliding-window rule, the attention chunks (Llama 4), the attention soft-caps and the ALiBi
slopes (BLOOM, MPT, falcon-rw)
in :mod:`.base`, the RoPE body
Llama-style, Gemma (1, 2, 3 text), OLMo (1, 2, 3), Granite, StableLM, SmolLM3, Cohere, GLM, Nemotron,
Persimmon, Helium, ERNIE 4.5, EXAONE 4, HunYuan and Apertus share in :mod:`.rope`, the rotary tables and
rotary variants of every RoPE family in :mod:`.rotary` but GPT-J's and CodeGen's fixed table (:mod:`.gptj`);
:func:`.families.adapter_for` picks one), read by the step-graph export (``llm.compile``) and the torch
executor alike; :mod:`.loader` loads HF models; :mod:`.parallel` holds the tensor-parallel pieces an
adapter's ``shard`` puts in place.

May import ``trtforge.errors``, ``trtforge.core`` and ``trtforge.llm.contract``; never ``llm.compile``.
"""
