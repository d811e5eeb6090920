"""The engine's greedy output must equal transformers' `generate` token for token (fp32, CPU).

Covers the three families (Gemma-3 with a sliding window shorter than the sequences),
batches of different prompt lengths, forks, truncation, requests joining mid-batch,
queueing when slots run out, and chunked prefill.
"""

from __future__ import annotations

import pytest

from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.testing.reference import greedy_reference, random_prompts, run_to_finish
from selfspec.testing.tiny import tiny_model

VOCAB = 128
FAMILIES = ["llama", "qwen3", "gemma3"]


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    kwargs = {"sliding_window": 8} if request.param == "gemma3" else {}
    return tiny_model(request.param, VOCAB, seed=1, num_layers=3, **kwargs)


def reference(model, prompt: list[int], n: int) -> list[int]:
    return greedy_reference(model, prompt, n)


def prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    return random_prompts(lengths, VOCAB, seed)


run = run_to_finish


def make_engine(model, **kw) -> Engine:
    cfg = EngineConfig(**{"num_slots": 6, "max_len": 256, **kw})
    return Engine(model, None, cfg, eos_token_ids=[])


def test_single_prompt_matches_generate(model):
    (prompt,) = prompts([11])
    engine = make_engine(model)
    seq = engine.add_request(prompt, SamplingParams(max_tokens=40))
    run(engine, [seq])
    assert seq.output_ids == reference(model, prompt, 40)
    assert seq.finish_reason.value == "length"


def test_batch_of_different_lengths_matches_generate(model):
    ps = prompts([3, 17, 9, 30, 1])
    engine = make_engine(model)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=25 + i)) for i, p in enumerate(ps)]
    run(engine, seqs)
    for i, (p, s) in enumerate(zip(ps, seqs)):
        assert s.output_ids == reference(model, p, 25 + i), f"prompt {i}"


def test_fork_then_continue_equals_no_fork(model):
    (prompt,) = prompts([13], seed=3)
    ref = reference(model, prompt, 40)
    engine = make_engine(model)
    parent = engine.add_request(prompt, SamplingParams(max_tokens=40))
    while parent.num_output_tokens < 15:
        engine.step()
    child = engine.fork(parent, params=SamplingParams(max_tokens=40 - 15))
    assert child is not None and child.slot != parent.slot
    run(engine, [parent, child])
    assert parent.output_ids == ref
    assert child.token_ids[len(prompt) :] == ref


def test_fork_with_forced_tokens_equals_generate_on_that_context(model):
    (prompt,) = prompts([9], seed=4)
    engine = make_engine(model)
    parent = engine.add_request(prompt, SamplingParams(max_tokens=30))
    while parent.num_output_tokens < 7:
        engine.step()
    forced = [5, 6, 7]
    child = engine.fork(parent, forced, params=SamplingParams(max_tokens=20))
    context = list(child.token_ids)
    run(engine, [parent, child])
    assert child.output_ids == reference(model, context, 20)
    assert parent.output_ids == reference(model, prompt, 30)


def test_truncate_then_redecode_equals_never_decoded(model):
    (prompt,) = prompts([10], seed=5)
    engine = make_engine(model)
    seq = engine.add_request(prompt, SamplingParams(max_tokens=60))
    while seq.num_output_tokens < 20:
        engine.step()
    kept = seq.token_ids[: len(prompt) + 6]
    engine.truncate(seq, len(prompt) + 6)
    engine.append_forced(seq, [9, 8])
    context = kept + [9, 8]
    run(engine, [seq])
    assert seq.token_ids[len(context) :] == reference(model, context, 60 - 8)


def test_request_joining_mid_batch_leaves_others_unchanged(model):
    ps = prompts([6, 12, 70], seed=6)
    engine = make_engine(model, prefill_chunk=16, max_prefill_tokens_per_step=16)
    first = [engine.add_request(p, SamplingParams(max_tokens=30)) for p in ps[:2]]
    for _ in range(8):
        engine.step()
    late = engine.add_request(ps[2], SamplingParams(max_tokens=30))
    run(engine, first + [late])
    for p, s in zip(ps, first + [late]):
        assert s.output_ids == reference(model, p, 30)
    assert late.stats.prefill_forwards >= 4  # the 70-token prompt was chunked


def test_more_requests_than_slots_queue_and_stay_exact(model):
    ps = prompts([4, 5, 6, 7, 8, 9, 10], seed=7)
    engine = make_engine(model, num_slots=3)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=12)) for p in ps]
    engine.step()
    assert engine.num_waiting == 4 and engine.num_running == 3
    run(engine, seqs)
    for p, s in zip(ps, seqs):
        assert s.output_ids == reference(model, p, 12)
    assert engine.scheduler.slots.num_free == 3


def test_eos_and_stop_tokens_end_generation(model):
    (prompt,) = prompts([8], seed=8)
    ref = reference(model, prompt, 30)
    stop_at = ref[10]
    first = ref.index(stop_at)
    engine = Engine(model, None, EngineConfig(num_slots=2, max_len=128), eos_token_ids=[stop_at])
    seq = engine.add_request(prompt, SamplingParams(max_tokens=30))
    run(engine, [seq])
    assert seq.output_ids == ref[: first + 1] and seq.finish_reason.value == "stop"
    ignoring = engine.add_request(prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    run(engine, [ignoring])
    assert ignoring.output_ids == ref
    min_tok = engine.add_request(prompt, SamplingParams(max_tokens=30, min_tokens=first + 2))
    run(engine, [min_tok])
    assert len(min_tok.output_ids) > first + 1


def test_sampling_is_reproducible_per_seed_regardless_of_batch(model):
    ps = prompts([5, 9], seed=9)
    params = SamplingParams(max_tokens=20, temperature=0.9, top_k=50, top_p=0.95, seed=1234)
    alone = make_engine(model)
    a = alone.add_request(ps[0], params)
    run(alone, [a])
    shared = make_engine(model)
    other = shared.add_request(ps[1], SamplingParams(max_tokens=25, temperature=1.0, seed=7))
    b = shared.add_request(ps[0], params)
    run(shared, [other, b])
    assert a.output_ids == b.output_ids
    assert len(set(a.output_ids)) > 1
