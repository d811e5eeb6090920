"""Decoding one step ahead (`engine.decode_ahead`) gives the same tokens as stepping one at a time.

The successor forward is launched from the device's inputs and argmax before the host reads the
step's tokens; the next step takes its result for the rows it ran exactly (a row that finished or
was aborted is left out, a request that arrived runs beside it) and drops it where it ran none. On
a CPU the static path runs uncaptured, so the bookkeeping — matching, narrowing, dropping, K/V and
linear-attention state written past a row's end — is checked here in fp32 against the same engine
without lookahead and against transformers' greedy decoding.
"""

from __future__ import annotations

import pytest

from selfspec.engine.decode_ahead import DecodeAhead
from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.model_runner import Chunk
from selfspec.engine.policy import SequencePolicy
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.schedule import ScheduleRecorder
from selfspec.engine.sequence import FinishReason
from selfspec.engine.static_forward import GraphBuckets
from selfspec.testing.reference import greedy_reference, random_prompts
from selfspec.testing.tiny import tiny_model

VOCAB = 128
BUCKETS = GraphBuckets(batch=(1, 2, 4, 8), tokens=(1, 2, 4, 8), min_keys=8)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request):
    kwargs = {"sliding_window": 8} if request.param == "gemma3" else {}
    return tiny_model(request.param, VOCAB, seed=3, num_layers=2, **kwargs)


def engine_for(model, ahead: bool, eos: list[int] | None = None, slots: int = 4) -> Engine:
    cfg = EngineConfig(
        num_slots=slots, max_len=96, static_shapes=True, graph_buckets=BUCKETS, prefill_chunk=16, decode_ahead=ahead
    )
    return Engine(model, None, cfg, eos_token_ids=eos or [])


def drive(engine: Engine, arrivals: dict[int, list[tuple[list[int], int]]], aborts: dict[int, int]) -> list:
    """Step until done; at step i add the requests `arrivals[i]` (prompt, max_tokens) and abort
    the `aborts[i]`-th request added so far."""
    seqs, step = [], 0
    while step <= max(arrivals) or engine.has_unfinished():
        for prompt, max_tokens in arrivals.get(step, []):
            seqs.append(engine.add_request(prompt, SamplingParams(max_tokens=max_tokens)))
        if step in aborts:
            engine.abort_request(seqs[aborts[step]].request_id)
        engine.step()
        step += 1
    return seqs


def test_lookahead_matches_plain_stepping_through_arrivals_finishes_and_aborts(model):
    prompts = random_prompts([5, 9, 3, 12, 7, 4], VOCAB, seed=11)
    arrivals = {
        0: [(prompts[0], 40), (prompts[1], 25)],
        6: [(prompts[2], 30)],
        19: [(prompts[3], 33), (prompts[4], 12)],  # 4 slots: one waits for a free slot
        30: [(prompts[5], 20)],
    }
    aborts = {24: 2}
    # Token 7 ends some rows early (EOS is unknown when the successor is launched).
    outputs = {}
    for ahead in (False, True):
        engine = engine_for(model, ahead, eos=[7])
        seqs = drive(engine, arrivals, aborts)
        outputs[ahead] = [(s.output_ids, s.finish_reason) for s in seqs]
        if ahead:
            stats = engine.runner.ahead.stats()
            assert stats["used"] > 20, stats
        else:
            assert engine.runner.ahead is None
    assert outputs[True] == outputs[False]


def test_lookahead_equals_transformers_greedy(model):
    prompts = random_prompts([6, 10, 3], VOCAB, seed=5)
    engine = engine_for(model, True)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in zip(prompts, (50, 31, 44))]
    while engine.has_unfinished():
        engine.step()
    for p, s in zip(prompts, seqs):
        assert s.output_ids == greedy_reference(model, p, len(s.output_ids))
    stats = engine.runner.ahead.stats()
    # Most decode steps ran ahead; the steps that crossed into an unbuilt key bucket did not.
    assert stats["used"] >= 30, stats
    # A step that took a forward launched a step earlier waited for part of it only: not a cost sample.
    assert 0 < engine.step_costs.version <= engine.steps - stats["used"]


def test_no_lookahead_for_policies_recorders_or_sampled_rows(model):
    class NeverProposes(SequencePolicy):
        """A policy row: it may propose or force tokens at any step, so nothing runs ahead."""

        def propose(self, engine, seq, room):
            return None

    (prompt,) = random_prompts([8], VOCAB, seed=2)
    engine = engine_for(model, True)
    seq = engine.add_request(prompt, SamplingParams(max_tokens=30, ignore_eos=True), policy=NeverProposes())
    sampled = engine.add_request(prompt, SamplingParams(max_tokens=30, temperature=0.8, seed=1, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert engine.runner.ahead.launched == 0 and seq.num_output_tokens == 30 and sampled.num_output_tokens == 30

    engine = engine_for(model, True)
    engine.runner.recorder = ScheduleRecorder()
    engine.add_request(prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert engine.runner.ahead.launched == 0


@pytest.fixture(scope="module")
def hybrid():
    return tiny_model("qwen3_5", VOCAB, seed=0, num_layers=2)


def test_models_with_linear_attention_decode_ahead_through_finishes_arrivals_and_aborts(hybrid, monkeypatch):
    """A successor advances each row's recurrent and conv state in place, which cannot be put back:
    rows that finished are not taken (their slot's state is read as zero by the next request
    there), a request admitted while a successor is out runs in a forward of its own. The same
    tokens as the serial engine and as transformers."""
    prompts = random_prompts([5, 9, 3, 12, 7, 4], VOCAB, seed=12)
    arrivals = {
        0: [(prompts[0], 40), (prompts[1], 25)],
        6: [(prompts[2], 30)],  # admitted while a successor is out: its prefill runs beside it
        19: [(prompts[3], 33), (prompts[4], 12)],  # 4 slots: one waits for a free slot
        30: [(prompts[5], 20)],
    }
    narrowed = []  # successors launched for fewer rows than the forward they continue
    launch = DecodeAhead.launch_successor

    def spy(self, flight, slots=None):
        launch(self, flight, slots)
        if self.pending is not None and len(self.pending.slots) < len(flight.slots):
            narrowed.append((len(flight.slots), len(self.pending.slots)))

    monkeypatch.setattr(DecodeAhead, "launch_successor", spy)
    outputs, stats = {}, {}
    for ahead in (False, True):
        engine = engine_for(hybrid, ahead, eos=[7])
        # Every decode shape built up front (a GPU run captures them at start): a successor for
        # the rows left after one finished needs its smaller batch's forward.
        engine.runner.warm_up_graphs([1, 2, 4], [1], engine.max_len, verify=False)
        seqs = drive(engine, arrivals, {24: 2})
        outputs[ahead] = [(s.output_ids, s.finish_reason) for s in seqs]
        stats[ahead] = engine.runner.ahead.stats() if ahead else None
    assert outputs[True] == outputs[False]
    assert stats[True]["used"] > 20 and stats[True]["trimmed"] >= 1, stats[True]
    assert narrowed, "no successor ran for the rows left after one finished"
    for (prompt, _), (tokens, reason) in zip([a for step in sorted(arrivals) for a in arrivals[step]], outputs[True]):
        if reason is not FinishReason.CANCELLED:
            assert tokens == greedy_reference(hybrid, prompt, len(tokens))


def test_a_stateful_row_fed_otherwise_than_its_successor_is_an_error(hybrid):
    """On a position-indexed cache the step's own forward overwrites what the successor wrote; a
    linear-attention state cannot be put back, so feeding another token there is refused."""
    (prompt,) = random_prompts([3], VOCAB, seed=9)
    runner = engine_for(hybrid, True).runner
    runner.run([Chunk(0, 0, prompt, 1)], [False])
    first = runner.run([Chunk(0, len(prompt), [5], 1)], [False], look_ahead=True)
    other = (first.argmax[0][0] + 1) % VOCAB
    with pytest.raises(RuntimeError, match="linear-attention state"):
        runner.run([Chunk(0, len(prompt) + 1, [other], 1)], [False])


def test_a_step_that_feeds_another_token_does_not_take_the_successor(model):
    """The successor fed the argmax; a caller that feeds something else at that position gets
    that token's forward, as without lookahead."""
    (prompt,) = random_prompts([3], VOCAB, seed=9)  # every step within key bucket 8
    results = {}
    for ahead in (False, True):
        runner = engine_for(model, ahead).runner
        runner.run([Chunk(0, 0, prompt, 1)], [False])
        first = runner.run([Chunk(0, len(prompt), [5], 1)], [False], look_ahead=True)
        other = (first.argmax[0][0] + 1) % VOCAB
        second = runner.run([Chunk(0, len(prompt) + 1, [other], 1)], [False], look_ahead=True)
        third = runner.run([Chunk(0, len(prompt) + 2, second.argmax[0], 1)], [False])
        results[ahead] = (first.argmax, second.argmax, third.argmax)
        if ahead:
            assert runner.ahead.stats() == {"launched": 2, "used": 1, "dropped": 1, "trimmed": 0}
    assert results[True] == results[False]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_plain_thinking_under_caps_decodes_ahead_and_gives_the_same_tokens(arch):
    """Plain thinking requests (a cap on the thinking and on the answer, no speculation) decode
    ahead: the policy says its next step is a plain decode until a cap is one token away, where it
    forces the close of thinking or ends the answer. Same tokens, phases and cap closes as the
    serial engine, with a speculating request beside them (whose steps decode serially). On a
    model with linear-attention layers a successor that fed a row something other than its forced
    close would be an error: none is launched a step before a cap."""
    from selfspec.llm import LLM
    from selfspec.testing.tiny import tiny_tokenizer
    from selfspec.thinking.policy import ThinkingLimits

    tok = tiny_tokenizer()
    tiny = tiny_model(arch, len(tok), seed=3, eos_token_id=tok.eos_token_id)
    prompts = ["Write a counter class", "List three primes", "Sort these words"]
    runs = {}
    for ahead in (False, True):
        config = EngineConfig(
            num_slots=4, max_len=160, static_shapes=True, graph_buckets=BUCKETS, prefill_chunk=16, decode_ahead=ahead
        )
        llm = LLM.from_model(tiny, tok, engine_config=config)
        limits = ThinkingLimits(cot_cap=20, answer_cap=12, fixed_length=True)
        alone = llm.generate(prompts, SamplingParams(max_tokens=60), spec=None, limits=limits, thinking=True)
        beside = llm.generate(prompts[:2], SamplingParams(max_tokens=60), spec=None, limits=limits, thinking=True)
        looked_up = llm.generate(prompts[2:], SamplingParams(max_tokens=60), spec="ngram", limits=limits)
        runs[ahead] = [(r.token_ids, r.metrics["thinking_closed_by"], r.metrics["cot_tokens"]) for r in alone + beside]
        runs[ahead].append(looked_up[0].token_ids)
        if ahead:
            stats = llm.engine.runner.ahead.stats()
            assert stats["used"] >= 30, stats
    assert runs[True] == runs[False]
    assert all(closed_by == "cap" and cot == 20 for _, closed_by, cot in runs[True][:-1])


@pytest.mark.parametrize("which", ["dense", "hybrid"])
def test_an_abort_takes_the_other_rows_from_the_successor_and_narrows_the_next(model, hybrid, which):
    """The first of four decoding rows is aborted while its successor is out: the other three are
    taken from it (each by its own slot, not by its place in the forward), the next successor runs
    only their rows, and the tokens are the serial engine's."""
    net = model if which == "dense" else hybrid
    prompts = random_prompts([6, 4, 9, 5], VOCAB, seed=21)
    outputs = {}
    for ahead in (False, True):
        engine = engine_for(net, ahead)
        engine.runner.warm_up_graphs([1, 2, 4], [1], engine.max_len, verify=False)
        seqs = drive(engine, {0: [(p, 30) for p in prompts]}, {8: 0})
        outputs[ahead] = [(s.output_ids, s.finish_reason) for s in seqs]
        if ahead:
            stats = engine.runner.ahead.stats()
            assert stats["trimmed"] == 1 and stats["dropped"] == 0 and stats["used"] >= 20, stats
    assert outputs[True] == outputs[False]
    assert outputs[True][0][1] is FinishReason.CANCELLED and all(len(t) == 30 for t, _ in outputs[True][1:])


def test_a_narrowed_successor_pads_with_nothing_a_live_slot_would_read(hybrid):
    """A successor narrowed into a smaller batch bucket reuses that bucket's input buffer, whose
    spare rows still hold an earlier step's rows (live slots at old positions). They must become
    padding: run again, such a row would advance a live request's linear-attention state."""
    prompts = random_prompts([4, 4, 4, 4, 4], VOCAB, seed=31)
    runs = {}
    for ahead in (False, True):
        engine = engine_for(hybrid, ahead, slots=8)
        engine.runner.warm_up_graphs([1, 2, 4, 8], [1], engine.max_len, verify=False)
        seqs = [engine.add_request(p, SamplingParams(max_tokens=40)) for p in prompts[:4]]
        for step in range(40):
            if step == 14:  # four rows filled bucket 4's buffer; a fifth moves the batch to bucket 8
                seqs.append(engine.add_request(prompts[4], SamplingParams(max_tokens=40)))
            if step == 18:  # five rows to three: back to bucket 4, one spare row
                engine.abort_request(seqs[0].request_id)
                engine.abort_request(seqs[1].request_id)
            engine.step()
        while engine.has_unfinished():
            engine.step()
        runs[ahead] = [s.output_ids for s in seqs[2:]]
        if ahead:
            assert engine.runner.ahead.stats()["trimmed"] >= 1
    assert runs[True] == runs[False]
