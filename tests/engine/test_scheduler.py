"""The scheduler's prefill budget: what each step feeds of the pending prompts."""

from __future__ import annotations

from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.scheduler import Scheduler
from selfspec.engine.sequence import Sequence
from selfspec.engine.static_forward import GraphBuckets
from selfspec.testing.reference import greedy_reference, random_prompts, run_to_finish
from selfspec.testing.tiny import tiny_model


def _prompts(scheduler: Scheduler, lengths: list[int]) -> list[Sequence]:
    seqs = [
        Sequence(request_id=str(i), token_ids=list(range(1, n + 1)), params=SamplingParams())
        for i, n in enumerate(lengths)
    ]
    for seq in seqs:
        scheduler.add(seq)
    return seqs


def _feed(scheduler: Scheduler) -> list[int]:
    """One step's plan as tokens per sequence (in running order), marking them cached; a sequence
    whose tokens are all cached gets its next token, as the engine's commit appends it."""
    plan = scheduler.schedule()
    for seq, take in plan:
        seq.num_cached += take
        if seq.num_cached == len(seq.token_ids):
            seq.token_ids.append(0)
    return [take for _, take in plan]


def test_short_prompts_are_not_cut_by_what_others_left_of_the_budget():
    """32 prompts of 42 tokens under a 1,024-token budget: 24 whole, then the other 8 whole, where
    without `whole_prompt_tokens` the 25th is cut into 16 + 26 over the two steps."""
    whole = Scheduler(num_slots=32, whole_prompt_tokens=64)
    _prompts(whole, [42] * 32)
    assert _feed(whole) == [42] * 24
    assert _feed(whole) == [1] * 24 + [42] * 8
    cut = Scheduler(num_slots=32)
    _prompts(cut, [42] * 32)
    assert _feed(cut) == [42] * 24 + [16]
    assert _feed(cut) == [1] * 24 + [26] + [42] * 7


def test_what_is_held_back_is_only_a_short_prompt_that_others_cut():
    """A longer prompt is still cut; a shorter one behind a held-back prompt may use what is left;
    a lone prompt longer than the whole budget is cut to it (never held back for ever)."""
    scheduler = Scheduler(num_slots=8, prefill_chunk=512, max_prefill_tokens_per_step=100, whole_prompt_tokens=64)
    _prompts(scheduler, [60, 50, 30, 200])
    assert _feed(scheduler) == [60, 30, 10]  # 50 held back, 30 fits, the 200-token prompt takes the rest
    assert _feed(scheduler) == [1, 50, 1, 50]
    lone = Scheduler(num_slots=2, max_prefill_tokens_per_step=32, whole_prompt_tokens=64)
    _prompts(lone, [42])
    assert _feed(lone) == [32] and _feed(lone) == [10]


def test_the_engine_keeps_short_prompts_whole_with_static_forwards_and_stays_exact():
    """With static forwards the engine passes its largest token bucket: prompts that a tight
    budget would cut run whole a step later, with `generate`'s tokens; eager, it cuts as before."""
    model = tiny_model("llama", 128, seed=1, num_layers=2)
    prompts = random_prompts([7, 7, 7], 128, seed=4)
    buckets = GraphBuckets(batch=(1, 2, 4), tokens=(1, 2, 4, 8), min_keys=8)
    for static, wanted in ((True, 8), (False, 0)):
        cfg = EngineConfig(
            num_slots=4, max_len=64, static_shapes=static, graph_buckets=buckets, max_prefill_tokens_per_step=16
        )
        engine = Engine(model, None, cfg, eos_token_ids=[])
        assert engine.scheduler.whole_prompt_tokens == wanted
        seqs = [engine.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True)) for p in prompts]
        engine.step()
        assert [s.num_cached for s in seqs] == ([7, 7, 0] if static else [7, 7, 2])
        run_to_finish(engine, seqs)
        assert [s.output_ids for s in seqs] == [greedy_reference(model, p, 6) for p in prompts]
