"""The static-shape path (what CUDA graphs replay) on hybrid linear-attention models, on CPU.

Qwen3.5 / Qwen3-Next Gated DeltaNet layers keep a per-slot state. In a static forward its
routing comes from the forward's input buffer (padding rows read and write the scratch slot),
and a verify forward's per-position states go to the state cache's per-slot snapshot buffers,
so they survive later forwards (later replays of the same graph included) until `settle`
picks the accepted position. Checked here against the eager engine and transformers'
`generate` (fp32): greedy batches, speculation with rollback (scripted, suffix decoding,
prompt lookup, SSR), and replays between a verify and its settle.
"""

from __future__ import annotations

import pytest
import torch

from selfspec.config import PromptLookupConfig, SuffixDecodingConfig
from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.model_runner import Chunk, ModelRunner
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.state_cache import SlotStateCache
from selfspec.engine.static_forward import GraphBuckets
from selfspec.llm import LLM
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.reference import ScriptedProposals, greedy_reference, random_prompts, run_to_finish
from selfspec.testing.tiny import HYBRID_FAMILIES, tiny_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits

VOCAB = 128
# Small buckets: prefill pieces, decode and verify chunks all fit, with padded rows and tokens.
BUCKETS = GraphBuckets(batch=(1, 2, 4), tokens=(1, 2, 4, 8), min_keys=8)


def _model(family: str, **kw):
    return tiny_model(family, kw.pop("vocab", VOCAB), seed=kw.pop("seed", 1), num_layers=4, **kw)


@pytest.fixture(scope="module", params=HYBRID_FAMILIES)
def model(request):
    return _model(request.param)


def reference(model, prompt: list[int], n: int) -> list[int]:
    return greedy_reference(model, prompt, n)


def prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    return random_prompts(lengths, VOCAB, seed)


def make_engine(model, static: bool, buckets: GraphBuckets = BUCKETS, **kw) -> Engine:
    # prefill_chunk 6: prefill pieces fit the 8-token bucket, so every forward is a static one.
    cfg = EngineConfig(
        **{"num_slots": 6, "max_len": 128, "prefill_chunk": 6, "static_shapes": static, "graph_buckets": buckets, **kw}
    )
    return Engine(model, None, cfg, eos_token_ids=[])


run = run_to_finish


@pytest.mark.parametrize("lengths", [[11], [3, 17, 9, 30]], ids=["one-prompt", "four-prompts"])
def test_static_greedy_equals_eager_and_generate(model, lengths):
    ps = prompts(lengths, seed=len(lengths))
    outputs = {}
    for static in (False, True):
        engine = make_engine(model, static)
        seqs = [engine.add_request(p, SamplingParams(max_tokens=24)) for p in ps]
        run(engine, seqs)
        outputs[static] = [s.output_ids for s in seqs]
        if static:
            stats = engine.runner.static.stats()
            assert engine.runner.eager_forwards == 0 and stats["replays"] == engine.runner.forwards
            assert stats["verify_shapes"] == 0, "no speculation: no verify forwards"
    assert outputs[True] == outputs[False] == [reference(model, p, 24) for p in ps]


@pytest.mark.parametrize("good,bad", [(0, 3), (2, 3), (6, 0)], ids=["reject-all", "accept-2-of-5", "accept-all"])
def test_static_speculation_with_rollback_matches_generate(model, good, bad):
    """Four speculating rows with batch buckets of at most 2: each step verifies in two replays
    of one shape before any row settles."""
    ps = prompts([7, 12, 4, 9], seed=4)
    refs = [reference(model, p, 22) for p in ps]
    engine = make_engine(model, True, GraphBuckets(batch=(1, 2), tokens=(1, 2, 4, 8), min_keys=8))
    policies = [ScriptedProposals(r, good, bad, VOCAB) for r in refs]
    seqs = [engine.add_request(p, SamplingParams(max_tokens=22), policy=pol) for p, pol in zip(ps, policies)]
    run(engine, seqs)
    for s, r, pol in zip(seqs, refs, policies):
        assert s.output_ids == r
        assert pol.accepted and all(a == good for a in pol.accepted[:-1]), pol.accepted
    static = engine.runner.static
    assert engine.runner.eager_forwards == 0
    assert any(f.replays >= 2 for f in static.snapshot_forwards.values()), "verify graphs were not replayed"


def _states(runner: ModelRunner, slot: int):
    state = runner.state
    return [(state.conv[i][slot], state.recurrent[i][slot]) for i in state.specs]


def _assert_same_state(a: ModelRunner, b: ModelRunner, slot: int) -> None:
    """Equal up to GEMM rounding (the runners' forwards have different shapes); a state routed to
    the wrong slot or snapshot is off by O(1)."""
    for (conv_a, rec_a), (conv_b, rec_b) in zip(_states(a, slot), _states(b, slot)):
        torch.testing.assert_close(conv_a, conv_b, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(rec_a, rec_b, rtol=1e-4, atol=1e-5)


def _verify_then_settle(family: str, static_buckets: GraphBuckets, verify_groups: list[list[int]], **runner_kw):
    """Prefill four slots, verify a 5-token chunk on each (in forwards grouped as
    `verify_groups`, all before any settle), settle each at a different position, then decode
    one token; the static runner against an eager one doing the same."""
    model = _model(family)
    static = ModelRunner(model, num_slots=4, max_len=64, static_shapes=static_buckets, **runner_kw)
    eager = ModelRunner(model, num_slots=4, max_len=64)
    ps = prompts([5, 7, 6, 8], seed=9)
    kept = [0, 2, 4, 5]
    verify = [Chunk(s, len(p), [10 + s, 20 + s, 30 + s, 40 + s, 50 + s], 5) for s, p in enumerate(ps)]
    shapes = []
    for runner in (static, eager):
        runner.run([Chunk(s, 0, p, 1) for s, p in enumerate(ps)])
        for group in verify_groups:
            result = runner.run([verify[s] for s in group])
            if runner is static:
                shapes += result.shapes
        for s, p in enumerate(ps):
            assert runner.settle(s, len(p) + kept[s])
    for s in range(4):
        _assert_same_state(static, eager, s)
    step = [Chunk(s, len(p) + kept[s], [3], 1) for s, p in enumerate(ps)]
    a, b = static.run(step), eager.run(step)
    for s in range(4):
        torch.testing.assert_close(a.logits[s], b.logits[s], rtol=1e-4, atol=1e-4)
        assert a.argmax[s] == b.argmax[s]
    return static, shapes


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_a_second_replay_of_the_shape_before_settle_keeps_the_state_exact(family):
    """Four verify rows, batch bucket 2: two forwards of shape 2x8 in one run, then settles."""
    static, shapes = _verify_then_settle(
        family, GraphBuckets(batch=(1, 2), tokens=(1, 2, 4, 8), min_keys=8), [[0, 1, 2, 3]]
    )
    assert shapes == ["2x8/k16"] * 4
    assert static.static.snapshot_forwards[(2, 8, 16)].replays == 2


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_padding_rows_leave_other_slots_snapshots_alone(family):
    """Slot 3 verifies alone; slots 0-2 then verify in a 4-row bucket (one padding row) before
    slot 3 settles: neither the padding row nor the real rows touch slot 3's snapshots."""
    static, shapes = _verify_then_settle(family, BUCKETS, [[3], [0, 1, 2]])
    assert shapes == ["1x8/k16", "4x8/k16", "4x8/k16", "4x8/k16"]
    scratch = static.state.scratch_slot
    for conv, rec in _states(static, scratch):
        assert not conv.any() and not rec.any(), "padding changed the scratch slot's state"


def test_a_verify_wider_than_the_snapshot_buffers_runs_eagerly_and_exactly():
    static, shapes = _verify_then_settle("qwen3_5", BUCKETS, [[0, 1, 2, 3]], state_snapshot_tokens=4)
    assert shapes == ["eager 4x5/k32"] * 4
    assert static.static.stats()["eager_reasons"] == {"verify wider than the state snapshot buffers": 1}
    assert static.state.snapshot_tokens == 0, "no static verify ran: no buffers allocated"


def test_warm_up_builds_verify_graphs_only_when_asked():
    model = _model("qwen3_5")
    runner = ModelRunner(model, num_slots=2, max_len=64, static_shapes=BUCKETS)
    runner.warm_up_graphs([1, 2], [1, 4], 16, verify=False)
    assert set(runner.static.forwards) == {(b, t, k) for b in (1, 2) for t in (1, 4) for k in (8, 16)}
    assert not runner.static.snapshot_forwards and runner.state.snapshot_tokens == 0
    runner.warm_up_graphs([1, 2], [1, 4], 16)
    assert set(runner.static.snapshot_forwards) == {(b, 4, k) for b in (1, 2) for k in (8, 16)}
    assert runner.state.snapshot_tokens == max(BUCKETS.tokens)
    assert runner.state.recurrent_snapshots[0].shape[:2] == (3, 9)  # slots + scratch, 8 tokens + 1
    state = runner.state
    held = sum(
        t.numel() * t.element_size() for t in [*state.conv_snapshots.values(), *state.recurrent_snapshots.values()]
    )
    assert held == 3 * SlotStateCache.snapshot_bytes_per_slot(state.specs, state.dtype, 8), "sizing counts them"


def test_the_engine_sizes_the_snapshot_buffers_for_its_proposals():
    """Verify chunks are at most the pending token plus `max_proposal_tokens`: the buffers hold
    that chunk's token bucket, not the largest bucket."""
    engine = make_engine(_model("qwen3_5"), True, max_proposal_tokens=3)
    assert engine.runner.static.snapshot_tokens == 4
    engine = make_engine(_model("qwen3_5"), True)
    assert engine.runner.static.snapshot_tokens == max(BUCKETS.tokens)


# ------------------------------------------------------------------ lossless methods on the static path
PROMPTS = ["What is 12 + 30?", "Write a counter class", "hello", "def add(a, b):"]
METHODS = {
    "ssr": SSRConfig(draft_budgets=[6], max_draft_len=24),
    "suffix-decoding": SuffixDecodingConfig(),
    "prompt-lookup": PromptLookupConfig(),
}


def _bigram(model) -> None:
    """Zero the mixers' outputs: the next token depends on the current one only, so drafts
    match and long proposals are accepted (and still pass through every layer's state)."""
    with torch.no_grad():
        for layer in model.model.layers:
            for name in ("self_attn", "linear_attn"):
                mixer = getattr(layer, name, None)
                if mixer is not None:
                    (mixer.o_proj if hasattr(mixer, "o_proj") else mixer.out_proj).weight.zero_()


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
@pytest.mark.parametrize("bigram", [False, True], ids=["random", "bigram"])
def test_lossless_methods_on_the_static_path_equal_greedy(family, bigram):
    tok = tiny_tokenizer()
    model = _model(family, vocab=len(tok), seed=3, eos_token_id=tok.eos_token_id)
    if bigram:
        _bigram(model)
    buckets = GraphBuckets(batch=(1, 2, 4, 8), tokens=(1, 2, 4, 8, 16, 32), min_keys=16)
    cfg = EngineConfig(num_slots=8, max_len=256, static_shapes=True, graph_buckets=buckets)
    llm = LLM.from_model(model, tok, engine_config=cfg)
    limits = ThinkingLimits(cot_cap=24, answer_cap=16, fixed_length=True)
    params = SamplingParams(max_tokens=200)
    base = llm.generate(PROMPTS, params, limits=limits, thinking=True, spec="off")
    accepted = 0
    for name, spec in METHODS.items():
        out = llm.generate(PROMPTS, params, limits=limits, spec=spec)
        for i, (o, b) in enumerate(zip(out, base)):
            assert o.token_ids == b.token_ids, f"{name}, prompt {i}: output differs from greedy"
        accepted += sum(o.metrics.get("accepted_tokens", 0) for o in out)
    static = llm.engine.runner.static
    assert sum(f.replays for f in static.snapshot_forwards.values()) > 0, "no static verify forward ran"
    if bigram:
        assert accepted > 0, "nothing accepted: rollback inside a chunk was not exercised"


@pytest.mark.parametrize(
    "lengths,tokens,limit",
    [([6, 5, 6, 3], (1, 2, 4, 8), 8), ([11, 12, 11, 10], (1, 2, 4, 8, 16), 16)],
    ids=["cut-at-buckets", "cut-once-padded"],
)
def test_prompt_pieces_split_at_the_token_buckets_match_generate(model, lengths, tokens, limit):
    """Prompt pieces cut into parts run in several forwards of one step, each part carrying the
    linear-attention state to the next (a padded last part included): the same tokens as
    `generate`."""
    ps = prompts(lengths, seed=12)
    buckets = GraphBuckets(batch=(1, 2, 4), tokens=tokens, min_keys=8, prompt_replay_tokens=limit)
    engine = make_engine(model, True, buckets, static_padding_budget=4, prefill_chunk=16)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in ps]
    engine.step()
    assert (engine.runner.forwards, engine.runner.eager_forwards) == (3, 0)
    run(engine, seqs)
    assert [s.output_ids for s in seqs] == [reference(model, p, 12) for p in ps]
