"""The arbitrator's prefix K/V cache: every cached decision equals the full forward of its state."""

from __future__ import annotations

import random

import pytest
import torch

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.cospec import ArbitrationState, Arbitrator, CoSpecConfig
from selfspec.spec.cospec.arbitrator import hybrid_layout, hybrid_rows
from selfspec.spec.cospec.prefix_cache import (
    ArbitratorPrefixCache,
    _distinct_owner_chunks,
    common_prefix_len,
    new_owner,
    prefix_cache_for,
    window_start,
)
from selfspec.testing.tiny import tiny_model, tiny_tokenizer

PROMPTS = ["What is 12 + 30?", "Write a counter class", "Route from A to B", "def add(a, b):"]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _pair(tok, family: str, num_slots: int = 4) -> LLM:
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


def test_window_start_keeps_its_anchor_until_the_window_overflows():
    assert window_start(100, 0, 512, 128) == 0
    assert window_start(512, 0, 512, 128) == 0
    assert window_start(513, 0, 512, 128) == 513 - 384  # moved by reanchor_tokens at once
    assert window_start(600, 129, 512, 128) == 129  # 471 tokens: the anchor holds
    assert window_start(700, 129, 512, 128) == 700 - 384
    assert window_start(50, 0, 8, 100) == 49  # a step wider than the window leaves one token


def test_cached_rows_are_rows_of_the_full_layout():
    lengths = torch.tensor([[6, 3, 4]])
    _, full, _ = hybrid_layout(lengths, 14)
    rows = hybrid_rows(lengths, torch.arange(4, 14).view(1, -1), 14)
    assert torch.equal(rows[0], full[0, 4:14])
    padded = hybrid_rows(lengths, torch.arange(10, 18).view(1, -1), 20)  # 4 real rows, 4 padding rows
    assert torch.equal(padded[0, :4, :14], full[0, 10:14]) and not padded[0, :4, 14:].any()
    assert all(padded[0, r].sum() == 1 for r in range(4, 8))  # padding sees one key: finite softmax


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_cached_decisions_equal_full_forwards(tok, family):
    """Random rounds over growing contexts, two owners sharing the slots and re-anchored windows:
    each cached logit is the arbitrator's full forward over the same state."""
    arbitrator = _trained(_pair(tok, family))
    cache = ArbitratorPrefixCache(arbitrator, capacity=80, num_slots=2, capture=False, buckets=(8, 16, 32))
    rng = random.Random(0)
    contexts = {new_owner(): [rng.randrange(3, 60) for _ in range(10)] for _ in range(3)}  # 3 owners, 2 slots
    starts = dict.fromkeys(contexts, 0)
    for round_ in range(36):
        owner = list(contexts)[round_ % 3 if round_ % 5 else 0]
        context = contexts[owner]
        context += [rng.randrange(3, 60) for _ in range(rng.randrange(1, 5))]
        starts[owner] = window_start(len(context), starts[owner], 48, 16)
        draft = tuple(rng.randrange(3, 60) for _ in range(rng.randrange(1, 6)))
        target = tuple(rng.randrange(3, 60) for _ in range(len(draft) + 1))
        state = ArbitrationState(prefix=tuple(context[starts[owner] :]), draft_block=draft, target_block=target)
        torch.testing.assert_close(
            cache.keep_logit(owner, state), arbitrator.keep_logits([state]), rtol=1e-5, atol=1e-5
        )
    stats = cache.stats()
    assert stats["calls"] == 36 and stats["rebuilds"] > 3  # evictions and re-anchors rebuilt slots
    assert stats["fed_tokens"] < 36 * 30  # most rounds fed only their new tokens and the blocks


def test_a_changed_prefix_is_recomputed_from_where_it_differs(tok):
    arbitrator = _trained(_pair(tok, "qwen3"))
    cache = ArbitratorPrefixCache(arbitrator, capacity=64, num_slots=1, capture=False)
    owner = new_owner()
    first = ArbitrationState(prefix=tuple(range(3, 23)), draft_block=(30, 31), target_block=(32, 33, 34))
    cache.keep_logit(owner, first)
    edited = ArbitrationState(prefix=(*range(3, 13), 50, *range(14, 26)), draft_block=(31,), target_block=(35, 36))
    assert common_prefix_len(first.prefix, edited.prefix) == 10
    torch.testing.assert_close(cache.keep_logit(owner, edited), arbitrator.keep_logits([edited]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="exceeds"):
        cache.keep_logit(owner, ArbitrationState(prefix=tuple(range(70)), draft_block=(1,), target_block=(2,)))


def test_the_cache_is_not_copied_with_the_arbitrator(tok):
    import copy

    arbitrator = _trained(_pair(tok, "qwen3"))
    cache = prefix_cache_for(arbitrator, 64)
    assert prefix_cache_for(arbitrator, 64) is cache and prefix_cache_for(arbitrator, 32) is cache
    assert prefix_cache_for(copy.deepcopy(arbitrator), 64) is not cache
    assert prefix_cache_for(arbitrator, 128) is not cache  # a wider state needs a larger cache


def test_anchored_cospec_decisions_are_the_full_forwards_and_the_window_rule(tok):
    """In real CoSpec generation every recorded decision's π equals the uncached forward of the
    recorded state, and every prefix obeys the anchored window; slots are freed at the end."""
    llm = _pair(tok, "qwen3")
    arbitrator = _trained(llm)
    decisions = []
    spec = CoSpecConfig(
        num_speculative_tokens=4,
        threshold=0.5,
        arbitrator=arbitrator,
        max_prefix_tokens=24,
        reanchor_tokens=8,
        recorder=decisions.append,
    )
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=60), spec=spec)
    assert out[0].metrics["arbitration_prefix_window"] == "anchored"
    assert len(decisions) > 8
    full = arbitrator.keep_probability([d.state for d in decisions])
    torch.testing.assert_close(torch.tensor([d.keep_probability for d in decisions]), full, rtol=1e-5, atol=1e-5)
    for d in decisions:
        assert d.state.prefix == d.context[len(d.context) - len(d.state.prefix) :]
        assert len(d.state.prefix) <= 24 and (len(d.context) <= 24 or len(d.state.prefix) >= 16)
    cache = prefix_cache_for(arbitrator, 24 + 2 * 4 + 2)
    assert cache.owners == [None] * len(cache.owners), "finished requests keep no slot"
    assert cache.stats()["fed_tokens"] < sum(d.state.length for d in decisions)


def test_sliding_window_keeps_the_full_forward(tok):
    llm = _pair(tok, "qwen3")
    arbitrator = _trained(llm)
    decisions = []
    spec = CoSpecConfig(
        num_speculative_tokens=4,
        threshold=0.5,
        arbitrator=arbitrator,
        max_prefix_tokens=24,
        prefix_window="sliding",
        recorder=decisions.append,
    )
    out = llm.generate(PROMPTS[:2], SamplingParams(max_tokens=40), spec=spec)
    assert out[0].metrics["arbitration_prefix_window"] == "sliding"
    assert all(len(d.state.prefix) == min(24, len(d.context)) for d in decisions)


def test_folded_adapters_follow_in_place_updates(tok):
    """RL steps write the adapters in place: the folded copy refolds and no stale K/V is reused."""
    arbitrator = _trained(_pair(tok, "qwen3"))
    cache = ArbitratorPrefixCache(arbitrator, capacity=64, num_slots=2, capture=False)
    assert cache.merged is not None and not any("lora_" in n for n, _ in cache.merged.module.named_parameters())
    owner = new_owner()
    state = ArbitrationState(prefix=tuple(range(3, 30)), draft_block=(40, 41), target_block=(42, 43, 44))
    before = cache.keep_logit(owner, state)
    with torch.no_grad():
        for name, param in arbitrator.named_parameters():
            if "lora_A" in name:
                param.mul_(3.0)
    after = cache.keep_logit(owner, state)  # same prefix: would reuse the slot if weights were not checked
    torch.testing.assert_close(after, arbitrator.keep_logits([state]), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before)
    assert cache.stats()["lora_folds"] == 2 and cache.stats()["rebuilds"] == 2
    unmerged = ArbitratorPrefixCache(arbitrator, capacity=64, capture=False, merge_lora=False)
    torch.testing.assert_close(unmerged.keep_logit(new_owner(), state), after, rtol=1e-5, atol=1e-5)


def test_a_bucket_warm_up_leaves_live_slots_alone(tok):
    """A graph bucket first needed mid-request is warmed up and captured on a placeholder call:
    it runs in the scratch slot, so the request's cached prefix stays valid."""
    arbitrator = _trained(_pair(tok, "qwen3"))
    cache = ArbitratorPrefixCache(arbitrator, capacity=64, num_slots=1, capture=False, buckets=(8, 16, 32))
    owner = new_owner()
    first = ArbitrationState(prefix=tuple(range(3, 40)), draft_block=(50,), target_block=(51, 52))
    cache.keep_logit(owner, first)
    assert (1, 32) not in cache.compiled
    placeholder = cache._prepare_bucket(32)
    cache._body(placeholder)  # what capture_graph's warm-up runs do on a GPU
    cache._body(placeholder)
    later = ArbitrationState(prefix=tuple(range(3, 42)), draft_block=(53, 54), target_block=(55, 56, 57))
    torch.testing.assert_close(cache.keep_logit(owner, later), arbitrator.keep_logits([later]), rtol=1e-5, atol=1e-5)
    assert cache.stats()["rebuilds"] == 1


# ------------------------------------------------------------------ decisions batched across requests
BATCH_PROMPTS = [*PROMPTS, "Sort 5 3 1"]


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
    out = llm.generate(BATCH_PROMPTS, SamplingParams(max_tokens=60), spec=spec)
    return [o.token_ids for o in out], decisions


def test_batched_cospec_generation_is_the_one_at_a_time_generation(tok):
    """Five requests decoding together: one arbitrator call per step serves every request at a
    mismatch, and the outputs, decisions and kept tokens are those of deciding one at a time."""
    llm = _pair(tok, "qwen3", num_slots=6)
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
