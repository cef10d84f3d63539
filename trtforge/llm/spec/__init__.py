"""Speculative decoding: proposers of draft tokens and the rule that verifies them.

``config`` (:class:`SpeculativeConfig`, the ``speculative=`` option checked), ``proposers`` (the
:class:`Proposer` interface, :class:`NgramProposer` (prompt lookup) and :class:`DraftModelProposer` (a
second causal LM over its own paged KV cache)) and ``verify`` (greedy longest-prefix acceptance and
the rejection-sampling rule). The loop that runs them with the target is
:mod:`trtforge.llm.spec_loop`.

May import the base, ``llm.ground`` (sampling, penalties, executors.base), ``llm.models``,
``llm.sched`` and ``llm.executors``; the engine and the front door import it, never the reverse.
"""

from __future__ import annotations

from trtforge.llm.spec.config import SPECULATIVE_KEYS, SpeculativeConfig
from trtforge.llm.spec.proposers import DraftModelProposer, NgramProposer, Proposal, Proposer
from trtforge.llm.spec.verify import rejection_sample, verify_greedy

__all__ = [
    "SPECULATIVE_KEYS",
    "DraftModelProposer",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "SpeculativeConfig",
    "rejection_sample",
    "verify_greedy",
]
