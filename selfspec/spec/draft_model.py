"""Draft-model speculation (SpS): a small model of the same vocabulary proposes k tokens.

The draft keeps its own slot KV cache (a second `ModelRunner`), one slot per target sequence.
After a verification rejects part of a proposal, the draft's cache is made consistent again by
re-feeding from the longest prefix it shares with the committed context: cached positions
past that prefix are simply overwritten (they are never visible to later queries).

`shallow_draft(model, n)` builds the self-distilled shape used here (LayerSkip / Kangaroo
style): the target's first n layers + its final norm + its head, sharing the target's
weights, so no second checkpoint is needed and the vocabularies agree by construction.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch

from selfspec.engine.model_runner import Chunk, ModelRunner
from selfspec.engine.sampling import SamplingParams, processed_probs
from selfspec.engine.scheduler import SlotPool
from selfspec.engine.static_forward import GraphBuckets
from selfspec.spec.proposal import Proposal


def shallow_draft(model: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """A model made of `model`'s first `num_layers` decoder layers, norm and head (shared)."""
    inner = model.model
    total = len(inner.layers)
    if not 1 <= num_layers < total:
        raise ValueError(f"a shallow draft needs 1 <= num_layers < {total}, got {num_layers}")
    draft = copy.copy(model)  # shallow: shares every submodule and parameter
    draft._modules = dict(model._modules)
    draft_inner = copy.copy(inner)
    draft_inner._modules = dict(inner._modules)
    draft_inner.layers = torch.nn.ModuleList(list(inner.layers)[:num_layers])
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:num_layers]
    draft_inner.config = config
    draft.model = draft_inner
    draft.config = config
    return draft


class DraftModelRunner:
    """The draft model with its own slot cache, shared by the proposers of one engine."""

    def __init__(self, model: torch.nn.Module, *, num_slots: int, max_len: int) -> None:
        self.model = model
        # On a GPU the draft's one-token steps are launch-bound like the target's: same static
        # shapes, CUDA graphs, fused twins (shared with the target's layers) and slot attention.
        cuda = next(model.parameters()).device.type == "cuda"
        self.runner = ModelRunner(
            model,
            num_slots=num_slots,
            max_len=max_len,
            max_padding_ratio=1e9,
            static_shapes=GraphBuckets() if cuda else None,
            capture_graphs=cuda,
            fused_pointwise=cuda,
            slot_attention=cuda,
        )
        self.slots = SlotPool(num_slots)
        self.max_len = max_len
        self.forwards = 0

    def forward(self, slot: int, start: int, tokens: list[int]) -> torch.Tensor:
        """Logits [V] after feeding `tokens` at `start` into `slot`."""
        (logits,) = self.runner.run([Chunk(slot, start, tokens, 1)])
        self.forwards += 1
        return logits[-1]


class DraftModelProposer:
    """Per-sequence proposer: k autoregressive draft steps from the committed context."""

    def __init__(
        self,
        draft: DraftModelRunner,
        *,
        num_tokens: int = 5,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.draft = draft
        self.num_tokens = num_tokens
        self.params = params or SamplingParams()
        self.generator = generator
        self.slot: int | None = None
        self.cached: list[int] = []  # tokens whose K/V the draft slot holds, in order
        self._known = 0  # context length at the last call: that prefix is certainly cached

    def propose(self, context: Sequence[int], max_tokens: int) -> Proposal:
        k = min(self.num_tokens, max_tokens, self.draft.max_len - len(context) - 1)
        if k <= 0:
            return Proposal([])
        if self.slot is None:
            self.slot = self.draft.slots.allocate()
            if self.slot is None:
                return Proposal([])  # no draft slot free: plain decoding for this step
        # The context only grows by appends (the Proposer contract), so the draft cache agrees
        # with it up to the previous context length; only the proposed tail needs comparing.
        common = _common_prefix(self.cached, context, start=min(self._known, len(self.cached)))
        common = min(common, len(context) - 1)  # always re-feed at least the last token
        feed = list(context[common:])
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        position = common
        for _ in range(k):
            logits = self.draft.forward(self.slot, position, feed)
            position += len(feed)
            if self.params.greedy:
                token = int(logits.argmax())
            else:
                probs = processed_probs(logits, self.params)
                token = int(torch.multinomial(probs, 1, generator=self.generator).item())
                rows.append(probs)
            tokens.append(token)
            feed = [token]
        self.cached = list(context) + tokens[:-1]
        self._known = len(context)
        return Proposal(tokens, torch.stack(rows) if rows else None)

    def release(self) -> None:
        if self.slot is not None:
            self.draft.slots.release(self.slot)
            self.slot = None
            self.cached = []
            self._known = 0


def _common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i
