"""The static-shape path (what CUDA graphs replay) gives the eager path's tokens, on CPU.

On a GPU, decode and verify steps are padded to bucket shapes, their inputs copied into
static buffers and the mask / cache routing computed on the device, then captured as CUDA
graphs. Here the same body runs uncaptured, so the bucketing, padding rows, device-side
routing and key buckets are checked for exactness against transformers' `generate`
(fp32) without a GPU. `tools/gpu/gpu_check.py` runs the captured version on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.model_runner import Chunk, bucket_parts
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.static_forward import GraphBuckets, pack_rows
from selfspec.llm import LLM
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.reference import greedy_reference, random_prompts, run_to_finish
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits

VOCAB = 128
# Small buckets so that short tests cross several key buckets and pad rows and tokens.
BUCKETS = GraphBuckets(batch=(1, 2, 4), tokens=(1, 2, 4, 8), min_keys=8)


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3"])
def model(request):
    kwargs = {"sliding_window": 8} if request.param == "gemma3" else {}
    return tiny_model(request.param, VOCAB, seed=1, num_layers=3, **kwargs)


def reference(model, prompt: list[int], n: int) -> list[int]:
    return greedy_reference(model, prompt, n)


def prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    return random_prompts(lengths, VOCAB, seed)


def static_engine(model, **kw) -> Engine:
    cfg = EngineConfig(num_slots=6, max_len=128, static_shapes=True, graph_buckets=BUCKETS, prefill_chunk=16, **kw)
    return Engine(model, None, cfg, eos_token_ids=[])


def decode_until(engine: Engine, seq, n: int) -> None:
    while seq.num_output_tokens < n:
        engine.step()


run = run_to_finish


def test_batch_crossing_key_buckets_matches_generate(model):
    engine = static_engine(model)
    batch = prompts([3, 11, 6], seed=2)  # 3 rows -> batch bucket 4 (one padding row)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=40, ignore_eos=True)) for p in batch]
    run(engine, seqs)
    for p, s in zip(batch, seqs):
        assert s.output_ids == reference(model, p, 40)
    static = engine.runner.static
    assert static is not None and not static.capture
    used = set(static.forwards)
    # Key buckets 16, 32, 64 (and 8 for the shortest) were crossed on the way.
    assert {k for _, _, k in used} >= {16, 32, 64}, used
    assert any(b == 4 for b, _, _ in used)
    assert engine.runner.eager_forwards >= 1  # 11-token prefill > largest token bucket (8)


def test_verification_chunks_in_token_buckets_match_generate(model):
    """Proposals of 1..7 tokens are verified in token buckets 2..8, padded on the left."""
    from selfspec.engine.policy import Proposal, SequencePolicy

    (prompt,) = prompts([9], seed=4)
    want = reference(model, prompt, 30)

    class Oracle(SequencePolicy):
        """Proposes the true continuation with a wrong token at a varying place."""

        def __init__(self):
            self.calls = 0

        def propose(self, engine, seq, room):
            self.calls += 1
            k = min(room, 1 + self.calls % 7)
            done = seq.num_output_tokens
            tokens = list(want[done : done + k])
            if not tokens:
                return None
            if self.calls % 3 == 0:
                tokens[-1] = (tokens[-1] + 1) % VOCAB
            return Proposal(tokens)

    engine = static_engine(model)
    seq = engine.add_request(prompt, SamplingParams(max_tokens=30, ignore_eos=True), policy=Oracle())
    run(engine, [seq])
    assert seq.output_ids == want
    assert seq.stats.accepted_tokens > 0
    assert {t for _, t, _ in engine.runner.static.forwards} >= {4, 8}
    # Every output token names the forward shape that chose it (bf16 diagnostics in bench records).
    assert len(seq.output_shapes) == len(seq.output_ids)
    assert {shape.split("/")[0] for shape in seq.output_shapes} >= {"1x1", "1x4", "1x8"}, set(seq.output_shapes)
    assert all(shape.split("/k")[1].isdigit() for shape in seq.output_shapes)


def test_output_shapes_follow_forced_tokens_and_truncation(model):
    engine = static_engine(model)
    (prompt,) = prompts([5], seed=6)
    seq = engine.add_request(prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    decode_until(engine, seq, 4)
    engine.append_forced(seq, [7, 8])
    assert seq.output_shapes[-2:] == ["forced", "forced"] and len(seq.output_shapes) == seq.num_output_tokens
    engine.step()  # the two forced tokens and the last one are fed together: a 4-token bucket
    assert seq.output_shapes[-1].startswith("1x4/")
    engine.truncate(seq, seq.prompt_len + 3)
    assert len(seq.output_shapes) == seq.num_output_tokens == 3
    run(engine, [seq])
    assert len(seq.output_shapes) == len(seq.output_ids) == 30


def test_fork_in_static_path_continues_exactly(model):
    engine = static_engine(model)
    (prompt,) = prompts([7], seed=5)
    parent = engine.add_request(prompt, SamplingParams(max_tokens=24, ignore_eos=True))
    decode_until(engine, parent, 5)
    child = engine.fork(parent, [3, 4], params=SamplingParams(max_tokens=10, ignore_eos=True))
    assert child is not None
    context = list(child.token_ids)
    run(engine, [parent, child])
    assert parent.output_ids == reference(model, prompt, 24)
    assert child.token_ids[len(context) :] == reference(model, context, 10)


def test_static_ssr_equals_baseline():
    tok = tiny_tokenizer()
    model = tiny_model("llama", len(tok), seed=5, num_layers=2, eos_token_id=tok.eos_token_id)
    with torch.no_grad():
        for layer in model.model.layers:  # bigram model: drafts match, acceptance paths run
            layer.self_attn.o_proj.weight.zero_()
    cfg = EngineConfig(
        num_slots=16,
        max_len=256,
        static_shapes=True,
        graph_buckets=GraphBuckets(tokens=(1, 2, 4, 8, 16, 32, 64), min_keys=16),
    )
    llm = LLM.from_model(model, tok, engine_config=cfg)
    limits = ThinkingLimits(cot_cap=40, answer_cap=30, fixed_length=True)
    params = SamplingParams(max_tokens=1000)
    texts = ["What is 12 + 30?", "Write a counter class", "hello"]
    base = llm.generate(texts, params, limits=limits, thinking=True, spec="off")
    out = llm.generate(texts, params, limits=limits, spec=SSRConfig(draft_budgets=[10], max_draft_len=40))
    for o, b in zip(out, base):
        assert o.token_ids == b.token_ids
    assert sum(o.metrics["accepted_prefix"] for o in out) > 0
    assert llm.engine.runner.eager_forwards < llm.engine.runner.forwards / 2


def test_padding_rows_route_to_the_scratch_slot():
    model = tiny_model("llama", VOCAB, seed=1, num_layers=1)
    engine = static_engine(model)
    pool = engine.runner.static
    host = pool._pack([Chunk(slot=2, start=5, token_ids=[7, 8], num_logits=1)], (2, 4, 16)).numpy()
    scratch = engine.runner.cache.scratch_slot
    assert host[0, 0].tolist() == [0, 0, 7, 8]  # right-aligned
    assert host[1, 0].tolist() == [0, 0, 5, 6]
    assert host[2, 0].tolist() == [scratch, scratch, 2, 2]
    assert host[4, 0, 0] == 2
    assert (host[2, 1] == scratch).all() and (host[4, 1] == scratch).all()
    assert len(set(host[3, 1].tolist())) == 4  # padding writes land on distinct scratch positions


def _pack_row_by_row(arr, chunks: list[Chunk], t: int, scratch: int) -> None:
    """The step's input layout written the obvious way, one row at a time (the reference)."""
    arr[0:2] = 0
    arr[2] = scratch
    arr[3] = np.arange(t)
    arr[4] = scratch
    for row, chunk in enumerate(chunks):
        n = len(chunk.token_ids)
        arr[0, row, t - n :] = chunk.token_ids
        arr[1, row, t - n :] = np.arange(chunk.start, chunk.start + n)
        arr[2, row, t - n :] = chunk.slot
        arr[3, row, t - n :] = np.arange(chunk.start, chunk.start + n)
        arr[4, row, :] = chunk.slot


@pytest.mark.parametrize("seed", range(4))
def test_packing_every_path_matches_the_row_by_row_layout(seed):
    """Decode steps, verifies of a few rows and of many rows take different packing paths; each
    writes what the row-by-row reference writes, padding and stale contents included."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        b = int(rng.choice([1, 2, 8, 16, 32]))
        t = int(rng.choice([1, 2, 8, 16]))
        rows = int(rng.integers(0, b + 1))
        width = 1 if rng.random() < 0.3 else t  # a third are decode steps
        chunks = [
            Chunk(
                int(rng.integers(0, 64)),
                int(rng.integers(0, 500)),
                rng.integers(0, 999, int(rng.integers(1, width + 1))).tolist(),
                1,
            )
            for _ in range(rows)
        ]
        packed = rng.integers(-9, 9, (5, b, t))  # stale contents of the reused host buffer
        expected = packed.copy()
        pack_rows(packed, chunks, t, scratch=77)
        _pack_row_by_row(expected, chunks, t, scratch=77)
        np.testing.assert_array_equal(packed, expected)


def test_bucket_validation_and_key_buckets():
    b = GraphBuckets(batch=(1, 2, 4), tokens=(1, 8), min_keys=128)
    assert b.batch_bucket(3) == 4 and b.batch_bucket(5) is None
    assert b.token_bucket(2) == 8 and b.token_bucket(9) is None
    assert b.key_bucket(1, 4096) == 128 and b.key_bucket(129, 4096) == 256 and b.key_bucket(3000, 2048) == 2048
    with pytest.raises(ValueError, match="increasing"):
        GraphBuckets(batch=(2, 1))
    with pytest.raises(ValueError, match="min_keys"):
        GraphBuckets(min_keys=0)


def test_cuda_graphs_on_cpu_is_a_clear_error():
    model = tiny_model("llama", VOCAB, seed=1, num_layers=1)
    with pytest.raises(ValueError, match="CUDA"):
        Engine(model, None, EngineConfig(num_slots=2, max_len=64, cuda_graphs=True), eos_token_ids=[])


def test_compiled_pointwise_modules_are_exact_and_scoped():
    """The fused twins (compiled norms/MLP/rotary, one GEMM for q/k/v and for gate/up) give the
    same tokens; outside the engine's forwards the model runs its own eager code."""
    from selfspec.engine.fusion import compile_pointwise_modules, fused_active

    model = tiny_model("qwen3", VOCAB, seed=2, num_layers=2)
    (prompt,) = prompts([6], seed=7)
    want = reference(model, prompt, 20)
    wrapped = compile_pointwise_modules(model, backend="aot_eager")
    assert compile_pointwise_modules(model, backend="aot_eager") == []  # idempotent
    assert any(name.endswith("RMSNorm") for name in wrapped)
    assert any(name.endswith("MLP.gate_up") for name in wrapped) and any(
        name.endswith("Attention.qkv") for name in wrapped
    )
    assert not fused_active()
    engine = static_engine(model, compile_pointwise=True, compile_backend="aot_eager")
    assert engine.runner.fused_pointwise
    seq = engine.add_request(prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    run(engine, [seq])
    assert seq.output_ids == want
    assert reference(model, prompt, 20) == want  # generate after wrapping: eager pieces, same tokens


def test_long_verify_chunks_do_not_pad_every_decode_row():
    """One 32-token verify chunk among decode rows: the decode rows get their own replay."""
    model = tiny_model("llama", VOCAB, seed=1, num_layers=1)
    cfg = EngineConfig(num_slots=6, max_len=128, static_shapes=True, graph_buckets=GraphBuckets(min_keys=8))
    runner = Engine(model, None, cfg, eos_token_ids=[]).runner
    buckets = runner.static.buckets
    chunks = [Chunk(slot=0, start=10, token_ids=list(range(1, 33)), num_logits=32)]
    chunks += [Chunk(slot=1 + k % 5, start=10, token_ids=[5], num_logits=1) for k in range(12)]
    groups = runner._group(chunks)[2]
    assert sorted(i for g in groups for i in g) == list(range(len(chunks)))
    for g in groups:
        width = buckets.token_bucket(max(len(chunks[i].token_ids) for i in g))
        padded = buckets.batch_bucket(len(g)) * width
        real = sum(len(chunks[i].token_ids) for i in g)
        assert padded - real <= runner.static_padding_budget or len(g) == 1
    assert len(groups) == 2 and any(len(g) >= 8 and 0 not in g for g in groups)
    decode_only = [Chunk(slot=k % 6, start=10, token_ids=[5], num_logits=1) for k in range(12)]
    assert len(runner._group(decode_only)[2]) == 1, "decode rows still share one replay"


def test_fusion_puts_inductor_in_deterministic_mode(monkeypatch):
    """Compiled reductions must not pick their summation order by timing (a decode step and a
    verify step would round a row differently); `SELFSPEC_INDUCTOR_DETERMINISTIC=0` opts out."""
    import torch._inductor.config as inductor_config

    from selfspec.engine.fusion import (
        DETERMINISM_ENV,
        INDUCTOR_DETERMINISM_FLAGS,
        deterministic_inductor,
        inductor_modes,
    )

    for name in INDUCTOR_DETERMINISM_FLAGS:
        if hasattr(inductor_config, name):
            monkeypatch.setattr(inductor_config, name, False)
    monkeypatch.setenv(DETERMINISM_ENV, "0")
    assert deterministic_inductor() == {} and not inductor_config.deterministic
    monkeypatch.delenv(DETERMINISM_ENV)
    applied = deterministic_inductor()
    assert applied.get("deterministic") is True and inductor_config.deterministic is True
    assert applied.get("batch_invariant", True) is True
    assert {k: v for k, v in inductor_modes().items() if v is not None} == applied  # what records carry


def test_proposals_fit_the_largest_token_bucket(model):
    """A verify chunk is the pending token plus the proposals: with static forwards the engine gives
    a policy room for at most (largest bucket - 1) proposals, so no verify runs eagerly (on a GPU an
    eager forward costs Python overhead and computes attention another way, other bf16 bits)."""
    from selfspec.engine.policy import Proposal, SequencePolicy

    (prompt,) = prompts([5], seed=6)
    want = reference(model, prompt, 40)
    rooms: list[int] = []

    class Greedy(SequencePolicy):
        """Proposes the true continuation, as long as the engine allows."""

        def propose(self, engine, seq, room):
            rooms.append(room)
            done = seq.num_output_tokens
            return Proposal(list(want[done : done + room])) if want[done : done + room] else None

    engine = static_engine(model, max_proposal_tokens=64)
    largest = max(BUCKETS.tokens)
    seq = engine.add_request(prompt, SamplingParams(max_tokens=40, ignore_eos=True), policy=Greedy())
    run(engine, [seq])
    assert seq.output_ids == want
    assert max(rooms) == largest - 1
    assert not any(shape.startswith("eager") for shape in seq.output_shapes[1:]), seq.output_shapes
    assert seq.stats.accepted_tokens >= 30  # the proposals were the true tokens: long verify chunks ran
    unbounded = Engine(model, None, EngineConfig(num_slots=2, max_len=128, max_proposal_tokens=64), eos_token_ids=[])
    assert unbounded._max_proposal == 64  # no static forwards: the configured cap


def prompt_engine(model, buckets: GraphBuckets, decode_ahead: bool) -> Engine:
    """Static forwards whose padding budget alone puts two 8-wide rows in a replay."""
    shapes = {"static_shapes": True, "graph_buckets": buckets, "static_padding_budget": 4}
    cfg = EngineConfig(num_slots=6, max_len=128, decode_ahead=decode_ahead, **shapes)
    return Engine(model, None, cfg, eos_token_ids=[])


def test_prompt_pieces_fill_replays_up_to_the_prompt_replay_tokens(model):
    """Several short prompts in one step that the padding budget would split into replays of a
    few rows each: replays of their own, each up to `prompt_replay_tokens` padded tokens, the same
    tokens as `generate` (also decoding ahead afterwards); with it off they share the budget."""
    batch = prompts([7, 6, 7, 5], seed=9)  # each piece within the 8-token bucket

    def first_step(prompt_replay_tokens: int, decode_ahead: bool = False) -> tuple[Engine, list]:
        buckets = GraphBuckets(
            batch=(1, 2, 4), tokens=(1, 2, 4, 8), min_keys=8, prompt_replay_tokens=prompt_replay_tokens
        )
        engine = prompt_engine(model, buckets, decode_ahead)
        seqs = [engine.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in batch]
        engine.step()
        return engine, seqs

    for decode_ahead in (False, True):
        engine, seqs = first_step(32, decode_ahead)  # (4 rows x 8 tokens) = 32: one replay
        assert (engine.runner.forwards, engine.runner.eager_forwards) == (1, 0)
        run(engine, seqs)
        for p, s in zip(batch, seqs):
            assert s.output_ids == reference(model, p, 12)
        assert engine.runner.eager_forwards == 0
        if decode_ahead:
            assert engine.runner.ahead.launched > 0
    for limit, forwards in ((16, 2), (0, 3), (8, 4)):  # 16: two rows a replay; 8: a lone piece always fits
        engine, _ = first_step(limit)
        assert (engine.runner.forwards, engine.runner.eager_forwards) == (forwards, 0), limit


def test_prompt_pieces_that_fill_one_replay_stay_with_the_other_rows():
    """Prompt pieces that one replay holds under the padding budget stay in the shared grouping."""
    model = tiny_model("llama", VOCAB, seed=1, num_layers=1)
    buckets = GraphBuckets(batch=(1, 2, 4), tokens=(1, 2, 4, 8), min_keys=8, prompt_replay_tokens=16)
    cfg = EngineConfig(num_slots=6, max_len=128, static_shapes=True, graph_buckets=buckets, static_padding_budget=8)
    runner = Engine(model, None, cfg, eos_token_ids=[]).runner
    prompt = [Chunk(slot=k, start=0, token_ids=list(range(1, 9)), num_logits=1) for k in range(4)]  # (4, 8), no padding
    assert [sorted(g) for g in runner._group(prompt)[2]] == [[0, 1, 2, 3]]


def test_only_prompt_pieces_leave_the_shared_grouping():
    """Verify chunks (logits for several tokens) keep the padding budget; prompt pieces the budget
    would split go to replays of their own, away from the decode rows."""
    model = tiny_model("llama", VOCAB, seed=1, num_layers=1)
    buckets = GraphBuckets(min_keys=8, prompt_replay_tokens=256)
    cfg = EngineConfig(num_slots=8, max_len=128, static_shapes=True, graph_buckets=buckets)
    runner = Engine(model, None, cfg, eos_token_ids=[]).runner
    verify = [Chunk(slot=k, start=10, token_ids=list(range(1, 41)), num_logits=40) for k in range(4)]
    assert [sorted(g) for g in runner._group(verify)[2]] == [[0, 1], [2, 3]]  # the budget: two 64-wide rows a replay
    prompt = [Chunk(slot=k, start=0, token_ids=list(range(1, 41)), num_logits=1) for k in range(6)]
    decode = [Chunk(slot=6, start=10, token_ids=[5], num_logits=1)]
    groups = [sorted(g) for g in runner._group(prompt + decode)[2]]
    # Decode rows alone; prompts in replays of at most 256 padded tokens: (4 x 64), then (2 x 64).
    assert groups == [[6], [0, 1, 2, 3], [4, 5]]


def test_bucket_parts_are_bucket_sized_largest_first():
    tokens = (1, 2, 4, 8, 16, 32, 64)
    assert bucket_parts(42, tokens) == [32, 8, 2]
    assert bucket_parts(64, tokens) == [64]
    assert bucket_parts(1, tokens) == [1]
    assert bucket_parts(7, (2, 4)) == [4, 2, 1]  # below the smallest bucket: a part of its own
    assert sum(bucket_parts(63, tokens)) == 63
    assert bucket_parts(42, tokens, 2) == [32, 10] and bucket_parts(32, tokens, 2) == [32]
    assert bucket_parts(42, tokens, 1) == [42]


def test_prompt_pieces_split_at_the_token_buckets_only_where_that_pads_less():
    """32 prompts of 42 tokens pad to 2,048 tokens as whole pieces (8 replays of 4 x 64) and to
    1,536 cut once at the buckets (32 + 10: rounds of 4 x (8 x 32), then 2 x (16 x 16)): split,
    with only each piece's last part asking for its logits, and the rounds in order. 8 such
    prompts stay whole (two replays; cut once costs as much in more rounds), as does a lone one."""
    model = tiny_model("llama", VOCAB, seed=1, num_layers=1)
    cfg = EngineConfig(num_slots=32, max_len=128, static_shapes=True, graph_buckets=GraphBuckets(min_keys=8))
    runner = Engine(model, None, cfg, eos_token_ids=[]).runner
    ids = list(range(1, 43))
    prompt = [Chunk(slot=k, start=3, token_ids=ids, num_logits=1) for k in range(32)]
    chunks, origin, groups = runner._group(prompt)
    assert len(chunks) == 32 + 2 * 32 and origin[:32] == list(range(32))
    widths = [{len(chunks[i].token_ids) for i in g} for g in groups]
    assert [len(g) for g in groups] == [8, 8, 8, 8, 16, 16] and widths == [{32}] * 4 + [{10}] * 2
    assert all(i >= 32 for g in groups for i in g)  # only parts run
    for k in range(32):
        parts = [chunks[i] for g in groups for i in g if origin[i] == k]
        assert [(p.start, len(p.token_ids), p.num_logits) for p in parts] == [(3, 32, 0), (35, 10, 1)]
        assert sum((p.token_ids for p in parts), []) == ids
    for rows, replays in ((8, 2), (1, 1)):
        chunks, _, groups = runner._group(prompt[:rows])
        assert len(chunks) == rows and len(groups) == replays
    cfg.graph_buckets = GraphBuckets(min_keys=8, split_prompt_pieces=False)
    chunks, _, groups = Engine(model, None, cfg, eos_token_ids=[]).runner._group(prompt)
    assert len(chunks) == 32 and [len(g) for g in groups] == [4] * 8  # whole: 8 replays of 4 x 64


def test_the_prompt_plan_is_never_the_dearer_by_the_fitted_step_costs():
    """The plan's price (padded tokens, at least the limit a replay) against the fitted H100
    step-cost models of Qwen3-4B and Qwen3-8B: splitting is never predicted slower than keeping
    the pieces whole, over batches of equal and of mixed prompt lengths up to the largest bucket,
    and it is chosen where it saves most (32 prompts of 42 tokens)."""
    import random

    from selfspec.engine.cost_model import PRIORS_DIR, StepCostModel

    model = tiny_model("llama", VOCAB, seed=1, num_layers=1)
    runners = {}
    for split in (True, False):
        buckets = GraphBuckets(split_prompt_pieces=split)
        cfg = EngineConfig(num_slots=32, max_len=1024, static_shapes=True, graph_buckets=buckets)
        runners[split] = Engine(model, None, cfg, eos_token_ids=[]).runner
    rng = random.Random(0)
    batches = [[length] * rows for rows in (2, 5, 8, 13, 24, 32) for length in range(2, 65)]
    batches += [[rng.randint(2, 64) for _ in range(rng.randint(2, 32))] for _ in range(200)]
    for name in ("qwen3-4b", "qwen3-8b"):
        costs = StepCostModel.load(PRIORS_DIR / f"{name}_h100.json")

        def seconds(split: bool, lengths: list[int]) -> float:
            pieces = [
                Chunk(slot=k, start=0, token_ids=list(range(1, n + 1)), num_logits=1) for k, n in enumerate(lengths)
            ]
            chunks, _, groups = runners[split]._group(pieces)
            return sum(costs.seconds(len(g), max(len(chunks[i].token_ids) for i in g), 128) for g in groups)

        saved = [seconds(False, lengths) - seconds(True, lengths) for lengths in batches]
        assert min(saved) > -1e-9, name
        assert saved[batches.index([42] * 32)] > 0.005, name  # > 5 ms


SPLIT_CASES = {
    # 6 = 4 + 2, 5 = 4 + 1, 3 = 2 + 1: two rounds, 24 padded tokens against 32 whole
    "cut-at-buckets": ([6, 5, 6, 3], (1, 2, 4, 8), 8),
    # 11 = 8 + 3 (padded to 4), 12 = 8 + 4, 10 = 8 + 2: cut once, 48 against 64 whole or fully cut
    "cut-once-padded": ([11, 12, 11, 10], (1, 2, 4, 8, 16), 16),
}


@pytest.mark.parametrize("case", SPLIT_CASES, ids=list(SPLIT_CASES))
def test_split_prompt_pieces_give_generates_tokens(model, case):
    """Prompt pieces cut into parts (round 1 in two replays, round 2 in one): the same tokens as
    `generate`, also decoding ahead."""
    lengths, tokens, limit = SPLIT_CASES[case]
    batch = prompts(lengths, seed=11)
    want = [reference(model, p, 10) for p in batch]
    for decode_ahead in (False, True):
        buckets = GraphBuckets(batch=(1, 2, 4), tokens=tokens, min_keys=8, prompt_replay_tokens=limit)
        engine = prompt_engine(model, buckets, decode_ahead)
        seqs = [engine.add_request(p, SamplingParams(max_tokens=10, ignore_eos=True)) for p in batch]
        engine.step()
        assert (engine.runner.forwards, engine.runner.eager_forwards) == (3, 0)  # round 1 in two replays
        run(engine, seqs)
        assert [s.output_ids for s in seqs] == want
