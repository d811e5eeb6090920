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
from typing import Literal, Sequence

import torch
from pydantic import Field

from selfspec.engine.model_runner import Chunk, ModelRunner
from selfspec.engine.policy import Proposal
from selfspec.engine.sampling import SamplingParams, make_generator, processed_probs
from selfspec.engine.scheduler import SlotPool
from selfspec.engine.static_forward import GraphBuckets
from selfspec.spec.base import MethodConfig, MethodContext
from selfspec.thinking.policy import ThinkingPolicy


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
        self._checkpoint: int | None = None  # linear-attention drafts: context length of the saved state

    @property
    def group_key(self) -> DraftModelRunner:
        """Proposers of one draft model can draft together (`propose_group`)."""
        return self.draft

    @staticmethod
    def propose_group(requests: "list[tuple[DraftModelProposer, Sequence[int], int]]") -> list[Proposal]:
        return propose_group(requests)

    def propose(self, context: Sequence[int], max_tokens: int) -> Proposal:
        return propose_group([(self, context, max_tokens)])[0]

    def _start(self, context: Sequence[int], max_tokens: int) -> "_DraftJob | None":
        """Slot and re-feed for one proposal (None: nothing to propose this step)."""
        k = min(self.num_tokens, max_tokens, self.draft.max_len - len(context) - 1)
        if k <= 0:
            return None
        if self.slot is None:
            self.slot = self.draft.slots.allocate()
            if self.slot is None:
                return None  # no draft slot free: plain decoding for this step
        # The context only grows by appends (the Proposer contract), so the draft cache agrees
        # with it up to the previous context length; only the proposed tail needs comparing.
        common = _common_prefix(self.cached, context, start=min(self._known, len(self.cached)))
        common = min(common, len(context) - 1)  # always re-feed at least the last token
        if self.draft.runner.stateful:
            # A linear-attention state cannot drop the rejected tail: go back to the checkpoint
            # taken at the previous committed context and re-feed from there (from 0 without one).
            ckpt = self._checkpoint
            common = ckpt if ckpt is not None and ckpt <= common and self.draft.runner.state.restore(self.slot) else 0
        return _DraftJob(self, list(context), k, common, list(context[common:]))

    def _finish(self, job: "_DraftJob") -> Proposal:
        self.cached = job.context + job.tokens[:-1]
        self._known = len(job.context)
        return Proposal(job.tokens, torch.stack(job.rows) if job.rows else None)

    def release(self) -> None:
        if self.slot is not None:
            self.draft.runner.release_slot(self.slot)
            self.draft.slots.release(self.slot)
            self.slot = None
            self.cached = []
            self._known = 0
            self._checkpoint = None


class _DraftJob:
    """One sequence's proposal in progress inside `propose_group`."""

    def __init__(
        self, proposer: DraftModelProposer, context: list[int], k: int, position: int, feed: list[int]
    ) -> None:
        self.proposer = proposer
        self.context = context
        self.k = k
        self.position = position  # where `feed` goes in the draft's slot
        self.feed = feed
        self.tokens: list[int] = []
        self.rows: list[torch.Tensor] = []  # the draft's sampling distributions (non-greedy)


def propose_group(requests: list[tuple[DraftModelProposer, Sequence[int], int]]) -> list[Proposal]:
    """Proposals for several sequences of one draft model: k lockstep draft steps, each one
    draft forward over every sequence still drafting (batched like the target's steps).

    Why: per-sequence proposals cost k draft forwards per sequence and round, so a batch of
    12 RL rollouts ran 96 small forwards per target step. Each sequence's tokens are chosen
    from its own row with its own sampling parameters and generator, so the result is what
    the sequence alone would propose, up to the float differences of a batched forward —
    which verification absorbs: greedy verification is exact whatever is proposed, and
    rejection sampling uses the very probabilities the tokens were drawn from.
    """
    proposals: list[Proposal] = [Proposal([]) for _ in requests]
    jobs: list[tuple[int, _DraftJob]] = []
    for index, (proposer, context, max_tokens) in enumerate(requests):
        job = proposer._start(context, max_tokens)
        if job is not None:
            jobs.append((index, job))
    if not jobs:
        return proposals
    draft = jobs[0][1].proposer.draft
    if any(job.proposer.draft is not draft for _, job in jobs):
        raise ValueError("propose_group takes proposers of one draft model")
    active = [job for _, job in jobs]
    while active:
        want_logits = [not job.proposer.params.greedy for job in active]  # greedy rows need only the argmax
        forward = draft.runner.run([Chunk(job.proposer.slot, job.position, job.feed, 1) for job in active], want_logits)
        draft.forwards += 1
        for job, row_logits, row_argmax in zip(active, forward.logits, forward.argmax):
            if not job.tokens and draft.runner.stateful:
                # The state now holds exactly the committed context: the next round restarts here.
                draft.runner.state.checkpoint(job.proposer.slot)
                job.proposer._checkpoint = len(job.context)
            params = job.proposer.params
            if params.greedy:
                token = int(row_argmax[-1])
            else:
                probs = processed_probs(row_logits[-1], params)
                token = int(torch.multinomial(probs, 1, generator=job.proposer.generator).item())
                job.rows.append(probs)
            job.position += len(job.feed)
            job.tokens.append(token)
            job.feed = [token]
        active = [job for job in active if len(job.tokens) < job.k]
    for index, job in jobs:
        proposals[index] = job.proposer._finish(job)
    return proposals


def _common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


DRAFT_SEED_OFFSET = 104729
"""Added to a request's seed for its draft's sampling stream, so draft and target never share
one stream (a shared stream would correlate proposals with their own verification)."""


class DraftModelConfig(MethodConfig):
    """Draft-model speculation (SpS, vLLM's `draft_model`): the LLM's draft model
    (`LLM(draft="layers:N" | "distilled:<name>" | a model)`) proposes K tokens per round,
    verified exactly (greedy, or rejection sampling with the draft's own probabilities)."""

    method: Literal["draft"] = "draft"
    num_speculative_tokens: int = Field(5, ge=1, le=64)

    def build(self, ctx: MethodContext) -> ThinkingPolicy:
        if ctx.draft_runner is None:
            raise ValueError("method='draft' needs a draft model: LLM(..., draft='layers:N' or a model)")
        params = ctx.params
        seed = None if params.seed is None else params.seed + DRAFT_SEED_OFFSET
        generator = None if params.greedy else make_generator(seed, ctx.device)
        proposer = DraftModelProposer(
            ctx.draft_runner, num_tokens=self.num_speculative_tokens, params=params, generator=generator
        )
        return ThinkingPolicy(ctx.thinking_format, ctx.limits, thinking=ctx.thinking, proposer=proposer)
