"""CoSpec decisions of several requests in one arbitrator call equal their one-at-a-time values."""

from __future__ import annotations

import random

import pytest
import torch

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.cospec import ArbitrationState, Arbitrator, CoSpecConfig
from selfspec.spec.cospec.prefix_cache import (
    ArbitratorPrefixCache,
    _distinct_owner_chunks,
    new_owner,
    prefix_cache_for,
    window_start,
)
from selfspec.testing.tiny import tiny_model, tiny_tokenizer

PROMPTS = ["What is 12 + 30?", "Write a counter class", "Route from A to B", "def add(a, b):", "Sort 5 3 1"]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _pair(tok, family: str = "qwen3", num_slots: int = 6) -> LLM:
    target = tiny_model(family, len(tok), seed=5, num_layers=3, eos_token_id=tok.eos_token_id, sliding_window=4)
    return LLM.from_model(target, tok, engine_config=EngineConfig(num_slots=num_slots, max_len=256), draft="layers:2")


def _trained(llm: LLM, seed: int = 3) -> Arbitrator:
    """Adapters and head moved off their init, so the LoRA path and the head both matter."""
    arbitrator = Arbitrator.from_draft(llm.draft_runner.model, seed=seed)
    with torch.no_grad():
        for name, param in arbitrator.named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
        arbitrator.head.bias.add_(0.3)
    return arbitrator


def test_chunks_keep_order_size_and_distinct_owners():
    assert _distinct_owner_chunks([1, 2, 3, 4, 5], 2) == [[0, 1], [2, 3], [4]]
    assert _distinct_owner_chunks([7, 8, 7, 9], 4) == [[0, 1], [2, 3]]  # owner 7's second state waits
    assert _distinct_owner_chunks([], 4) == []


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_a_batched_call_equals_each_state_alone(tok, family):
    """Rounds of 1-7 states over 5 owners and 4 slots (padding rows, chunks past the slots, an
    owner twice in one call, evictions, re-anchored windows): every batched logit is the
    arbitrator's full forward over its state."""
    arbitrator = _trained(_pair(tok, family))
    cache = ArbitratorPrefixCache(arbitrator, capacity=80, num_slots=4, capture=False, buckets=(8, 16, 32))
    rng = random.Random(1)
    owners = [new_owner() for _ in range(5)]
    contexts = {o: [rng.randrange(3, 60) for _ in range(rng.randrange(4, 20))] for o in owners}
    starts = dict.fromkeys(owners, 0)
    checked = 0
    for _ in range(14):
        items = []
        for owner in rng.sample(owners, rng.randrange(1, 6)) + ([owners[0]] if rng.random() < 0.3 else []):
            context = contexts[owner]
            context += [rng.randrange(3, 60) for _ in range(rng.randrange(1, 5))]
            starts[owner] = window_start(len(context), starts[owner], 48, 16)
            draft = tuple(rng.randrange(3, 60) for _ in range(rng.randrange(1, 6)))
            target = tuple(rng.randrange(3, 60) for _ in range(len(draft) + 1))
            items.append((owner, ArbitrationState(tuple(context[starts[owner] :]), draft, target)))
        got = cache.keep_logits(items)
        torch.testing.assert_close(got, arbitrator.keep_logits([s for _, s in items]), rtol=1e-5, atol=1e-5)
        checked += len(items)
    stats = cache.stats()
    assert stats["decisions"] == checked and stats["calls"] < checked  # several decisions per forward
    assert any(rows > 1 for rows, _ in cache.compiled)


def _run(llm: LLM, arbitrator: Arbitrator, *, batched: bool) -> tuple[list, list]:
    decisions: list = []
    spec = CoSpecConfig(
        num_speculative_tokens=4,
        threshold=0.5,
        arbitrator=arbitrator,
        max_prefix_tokens=24,
        reanchor_tokens=8,
        recorder=decisions.append,
        batch_arbitration=batched,
    )
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=60), spec=spec)
    return [o.token_ids for o in out], decisions


def test_batched_cospec_generation_is_the_one_at_a_time_generation(tok):
    """Five requests decoding together: one arbitrator call per step serves every request at a
    mismatch, and the outputs, decisions and kept tokens are those of deciding one at a time."""
    llm = _pair(tok)
    arbitrator = _trained(llm)
    cache = prefix_cache_for(arbitrator, 24 + 2 * 4 + 2)
    alone_tokens, alone = _run(llm, arbitrator, batched=False)
    calls_alone = cache.stats()["calls"]
    batched_tokens, together = _run(llm, arbitrator, batched=True)
    calls_together = cache.stats()["calls"] - calls_alone
    assert batched_tokens == alone_tokens
    assert [(d.state, d.kept) for d in together] == [(d.state, d.kept) for d in alone]
    torch.testing.assert_close(
        torch.tensor([d.keep_probability for d in together]),
        torch.tensor([d.keep_probability for d in alone]),
        rtol=1e-5,
        atol=1e-5,
    )
    assert len(together) > 10 and any(d.kept for d in together) and not all(d.kept for d in together)
    assert calls_alone == len(alone) and calls_together < len(together)  # shared forwards
    assert cache.owners == [None] * len(cache.owners), "finished requests keep no slot"
