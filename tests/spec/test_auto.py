"""`method: auto` is exact everywhere and decides what its docstring says.

Exactness: greedy outputs token-identical to plain decoding on tiny dense, bigram (drafts and
copies get accepted), hybrid linear-attention and sliding-window models, thinking or not, four
requests in one batch, under a grammar, with penalties, with n > 1; sampled outputs follow
plain sampling's distribution (chi-square). Decisions: the proposal length from measured step
costs (`StepCosts` fed known timings) and acceptance, the path per request, the draft gate and
convergence on auto's SSR settings.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.step_costs import MEMO_STEPS, MIN_SAMPLES, StepCosts
from selfspec.llm import LLM
from selfspec.spec.auto import AutoConfig
from selfspec.spec.base import MethodContext
from selfspec.spec.draft_schedule import DraftSchedule
from selfspec.spec.proposal_length import (
    LONGER_TOLERANCE,
    MAX_ALPHA,
    AcceptanceRate,
    LengthController,
    best_in_table,
    candidate_lengths,
    choose_length,
    cost_ratio,
    cost_table,
    expected_tokens,
)
from selfspec.spec.ssr_core import Draft
from selfspec.testing.tiny import bigram_model, tiny_model, tiny_tokenizer
from selfspec.thinking.format import ThinkingFormat
from selfspec.thinking.policy import ThinkingLimits

PROMPTS = ["What is 12 + 30?", "Write a counter class", "Route from A to B", "def add(a, b):"]
SPEC = AutoConfig(draft_interval=12, min_answer_tokens=8)  # small enough for tiny CoTs to draft


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


class _FrozenCosts(StepCosts):
    """Step costs fixed to a GPU-like profile (verifies of up to 64 tokens cost a decode step):
    what auto proposes, and so whether the tests see proposals at all, must not depend on how
    busy the machine running the tests is. The decisions on measured costs have their own
    tests below."""

    def __init__(self) -> None:
        super().__init__()
        for rows in range(1, 18):
            for tokens in (1, 2, 3, 5, 9, 17, 33, 65):
                for _ in range(4):
                    super().observe([tokens] * rows, _gpu(rows, tokens))

    def observe(self, row_tokens: list[int], seconds: float, started: float | None = None) -> None:
        """Measurements are ignored: the profile stays as set."""


def _llm(model, tok, slots: int = 16) -> LLM:
    llm = LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=slots, max_len=384))
    llm.engine.step_costs = _FrozenCosts()
    return llm


def _bigram_hybrid(tok):
    model = tiny_model("qwen3_5", len(tok), seed=5, num_layers=2, eos_token_id=tok.eos_token_id)
    with torch.no_grad():
        for layer in model.model.layers:
            for name in ("self_attn", "linear_attn"):
                mixer = getattr(layer, name, None)
                if mixer is not None:
                    (mixer.o_proj if hasattr(mixer, "o_proj") else mixer.out_proj).weight.zero_()
    return model


MODELS = {
    "dense": lambda tok: tiny_model("qwen3", len(tok), seed=3, eos_token_id=tok.eos_token_id),
    "bigram": lambda tok: bigram_model(len(tok), eos_token_id=tok.eos_token_id),
    "hybrid": lambda tok: tiny_model("qwen3_5", len(tok), seed=3, num_layers=4, eos_token_id=tok.eos_token_id),
    "hybrid-bigram": _bigram_hybrid,
    "gemma3-sliding": lambda tok: tiny_model("gemma3", len(tok), seed=3, eos_token_id=tok.eos_token_id),
}


@pytest.fixture(scope="module", params=list(MODELS))
def family(request, tok):
    return request.param, _llm(MODELS[request.param](tok), tok)


@pytest.fixture(scope="module")
def bigram_llm(tok):
    return _llm(MODELS["bigram"](tok), tok)


# ---------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_auto_is_token_identical_to_plain_greedy(family, thinking):
    name, llm = family
    limits = ThinkingLimits(cot_cap=60, answer_cap=40)
    params = SamplingParams(max_tokens=200)
    base = llm.generate(PROMPTS, params, limits=limits, thinking=thinking, spec=None)
    out = llm.generate(PROMPTS, params, limits=limits, thinking=thinking, spec=SPEC)  # four in one batch
    for i, (o, b) in enumerate(zip(out, base)):
        assert o.token_ids == b.token_ids, f"{name}, prompt {i}: auto differs from plain decoding"
        assert o.finish_reason == b.finish_reason
        assert o.metrics["auto"]["path"] == ("ssr" if thinking else "lookup")
    if name.endswith("bigram"):
        # The bigram models repeat themselves: copies (and with thinking, drafts) are accepted.
        assert sum(o.metrics["accepted_tokens"] for o in out) > 0
        assert sum(o.metrics["forwards"] for o in out) < sum(b.metrics["forwards"] for b in base)
        if thinking:
            assert sum(o.metrics["drafts"] for o in out) > 0
    assert llm.engine.scheduler.slots.num_used == 0, "slots leaked"


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_auto_under_a_grammar(bigram_llm, thinking):
    grammar = bigram_llm.grammars.regex(r"[0-9]{3}-(yes|no)")
    limits = ThinkingLimits(cot_cap=30) if thinking else None

    def run(spec):
        seqs = [
            bigram_llm.submit(
                p, SamplingParams(max_tokens=80), spec=spec, thinking=thinking, limits=limits, grammar=grammar
            )
            for p in PROMPTS
        ]
        bigram_llm.run_until_done(seqs)
        return [bigram_llm.result(s) for s in seqs]

    base, out = run(None), run(SPEC)
    assert [o.token_ids for o in out] == [b.token_ids for b in base]
    assert all(o.finish_reason != "error" for o in out)


def test_auto_with_penalties(bigram_llm):
    params = SamplingParams(max_tokens=60, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2)
    limits = ThinkingLimits(cot_cap=40, answer_cap=30)
    for thinking in (True, False):
        base = bigram_llm.generate(PROMPTS, params, limits=limits, thinking=thinking, spec=None)
        out = bigram_llm.generate(PROMPTS, params, limits=limits, thinking=thinking, spec=SPEC)
        assert [o.token_ids for o in out] == [b.token_ids for b in base], f"thinking={thinking}"


def test_auto_with_n_samples(bigram_llm):
    limits = ThinkingLimits(cot_cap=40, answer_cap=30)

    def run(spec):
        seq = bigram_llm.submit(
            PROMPTS[1], SamplingParams(max_tokens=100, n=3), spec=spec, limits=limits, thinking=True
        )
        bigram_llm.run_until_done([seq])
        return [bigram_llm.result(s) for s in (seq, *seq.siblings)]

    base, out = run(None), run(SPEC)
    assert len(out) == 3
    assert [o.token_ids for o in out] == [b.token_ids for b in base]
    assert all(o.metrics["auto"]["path"] == "ssr" for o in out)


# ---------------------------------------------------------------------------------- sampling
VOCAB = 6
CLOSE = 5
PROMPT = [1, 2, 3, 1]
COT = 4
ANSWER = 2
N = 6000


def _toy_format() -> ThinkingFormat:
    return ThinkingFormat(
        kind="native",
        start_marker="<t>",
        end_marker="</t>",
        start_ids=(4,),
        end_ids=(CLOSE,),
        close_ids=(CLOSE,),
        end_variants=((CLOSE,),),
        template_opens_thinking=False,
        template_takes_enable_thinking=False,
    )


def _sample_outputs(model, spec, seed0: int) -> tuple[np.ndarray, int]:
    llm = LLM.from_model(
        model, None, engine_config=EngineConfig(num_slots=256, max_len=32), thinking_format=_toy_format()
    )
    outputs, verified = [], 0
    for start in range(0, N, 200):
        seqs = [
            llm.submit(
                PROMPT,
                SamplingParams(max_tokens=16, temperature=1.0, seed=seed0 + start + i),
                spec=spec,
                limits=ThinkingLimits(cot_cap=COT, answer_cap=ANSWER, fixed_length=True),
                thinking=True,
            )
            for i in range(200)
        ]
        llm.run_until_done(seqs)
        for s in seqs:
            outputs.append(s.output_ids[: COT + 1 + ANSWER])
            verified += s.stats.verify_steps
    return np.array(outputs), verified


def test_auto_sampling_matches_plain_sampling():
    """Every output position of auto's samples follows plain sampling's distribution."""
    model = tiny_model("llama", VOCAB, seed=11, num_layers=1, hidden=32, initializer_range=0.15)
    spec = AutoConfig(draft_interval=1, min_answer_tokens=0, acceptance_prior=0.9, margin=1.0, max_step_ratio=64)
    plain, _ = _sample_outputs(model, None, seed0=10**6)
    auto, verified = _sample_outputs(model, spec, seed0=0)
    assert verified > N // 10, "auto hardly ever proposed: sampling verification was not exercised"
    for pos in range(plain.shape[1]):
        table = np.array([np.bincount(plain[:, pos], minlength=VOCAB), np.bincount(auto[:, pos], minlength=VOCAB)])
        table = table[:, table.sum(axis=0) >= 20]
        if table.shape[1] < 2:
            continue
        p = chi2_contingency(table)[1]
        assert p > 0.01, f"position {pos}: p={p:.4g}"


# ---------------------------------------------------------------------------------- decisions
def _costs(step_seconds) -> StepCosts:
    """StepCosts that measured `step_seconds(rows, tokens)` for the shapes the tests ask about."""
    costs = StepCosts()
    for rows in (1, 2, 16, 17, 128, 129):
        for tokens in (1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65):
            for _ in range(4):
                costs.observe([tokens] * rows, step_seconds(rows, tokens))
    return costs


def _gpu(rows: int, tokens: int) -> float:
    """Memory-bound up to 64 fed tokens per forward (2 ms), compute-bound beyond."""
    return max(0.002, 0.002 * rows * tokens / 64)


def _cpu(rows: int, tokens: int) -> float:
    """Every fed token costs a third of a forward's fixed part."""
    return 0.01 + 0.003 * rows * tokens


def test_batch_fill_shrinks_the_proposal_to_nothing():
    costs = _costs(_gpu)
    alone = choose_length(costs, rows=1, alpha=0.9, room=64)
    busy = choose_length(costs, rows=16, alpha=0.9, room=64)
    full = choose_length(costs, rows=128, alpha=0.9, room=64)
    assert alone.k >= 32, alone
    assert 0 < busy.k < alone.k, busy
    assert full.k == 0 and full.budget_k == 0, full
    assert alone.cost_from == "measured"


def test_a_longer_proposal_wins_a_near_tie():
    """Padded steps as an H100 runs a 135M model: a 16-token bucket 1.4% dearer than an 8-token
    one. At a per-token acceptance of 0.5, positions 8-15 add less than that, so the 7-token cut
    has the higher estimated value, by 1%: within the tolerance the 15-token proposal is kept.
    Where the longer bucket costs twice as much (a CPU) the cut stands."""
    seconds = {1: 1.28e-3, 2: 1.30e-3, 4: 1.38e-3, 8: 1.43e-3, 16: 1.45e-3, 32: 1.54e-3, 64: 2.05e-3}

    def padded(step) -> StepCosts:
        costs = StepCosts(token_buckets=tuple(seconds))
        for bucket in seconds:
            for _ in range(MIN_SAMPLES):
                costs.observe([bucket], step(bucket))
        return costs

    gpu, cpu = padded(seconds.get), padded(lambda b: seconds[b] * (2.0 if b >= 16 else 1.0))
    expected = lambda k: expected_tokens(0.5, k)  # noqa: E731
    assert expected(15) / 1.45 < expected(7) / 1.43 < expected(15) / 1.45 * (1 + LONGER_TOLERANCE)
    assert best_in_table(gpu, 1, 15, float("inf"), expected, 1.1, tolerance=0.0)[0] == 7
    assert best_in_table(gpu, 1, 15, float("inf"), expected, 1.1)[0] == 15
    assert choose_length(gpu, rows=1, alpha=0.5, room=15, margin=1.1).k == 15
    assert choose_length(cpu, rows=1, alpha=0.5, room=15, margin=1.1).k == 7


def test_low_acceptance_shrinks_the_proposal():
    costs = _costs(_cpu)
    high = choose_length(costs, rows=1, alpha=0.95, room=64)
    mid = choose_length(costs, rows=1, alpha=0.6, room=64)
    low = choose_length(costs, rows=1, alpha=0.1, room=64)
    assert high.k > mid.k > 0, (high, mid)
    assert low.k == 0, low
    rate = AcceptanceRate(prior=0.6)
    for _ in range(6):
        rate.observe(proposed=8, accepted=0)
    assert rate.value < 0.2
    controller = LengthController({"answer": 0.6})
    for _ in range(6):
        controller.record("answer", "answer", "lookup", 8, 0)
    assert controller.choose("answer", costs, 1, 64) == 0
    assert controller.report()["k_chosen"] == {"0": 1}
    # Idle steps pull the rate back toward the prior: the source is tried again later.
    for _ in range(200):
        controller.choose("answer", costs, 1, 64)
    assert controller.choose("answer", costs, 1, 64) > 0


def test_unmeasured_costs_fall_back_to_a_fitted_line_then_the_prior():
    prior = choose_length(None, rows=1, alpha=0.8, room=64)
    assert prior.k > 0 and prior.cost_from == "prior"
    costs = StepCosts()
    for rows in (1, 2, 3):
        for _ in range(4):
            costs.observe([1] * rows, _cpu(rows, 1))
    fitted = choose_length(costs, rows=1, alpha=0.8, room=64)
    assert fitted.cost_from == "fitted"
    assert fitted.k == choose_length(_costs(_cpu), rows=1, alpha=0.8, room=64).k
    assert expected_tokens(0.5, 0) == 1.0 and expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_prefill_pieces_do_not_make_a_long_verify_look_cheap():
    """A CPU where a verify costs 0.7 of a decode step per token, and prefill pieces of 256-512
    tokens cost 0.05 of a decode step per token (one efficient GEMM): the fitted cost of an
    unmeasured 33-token verify must come from the verify-sized steps, so it is not proposed at a
    middling acceptance, whereas a line through the prefill pieces would call it cheap."""
    costs = StepCosts()
    decode = 0.046
    for _ in range(4):
        costs.observe([1], decode)
        costs.observe([2], decode * 1.45)
        costs.observe([256], decode * 0.05 * 256)
        costs.observe([512], decode * 0.05 * 512)
    ratio, source = cost_ratio(costs, 1, 33)
    assert source == "fitted" and ratio > 10, ratio
    choice = choose_length(costs, rows=1, alpha=0.6, room=64)
    assert choice.k <= 2, choice


class _Running:
    """The engine attributes the length rule reads."""

    def __init__(self, costs: StepCosts, running: int) -> None:
        self.step_costs, self.num_running = costs, running


def test_a_draft_childs_own_proposals_are_sized_by_the_parents_rule():
    """Auto's drafts speculate from their context; every token they verify is paid in the
    parent's steps, so the same rule sizes them: none where a long verify is dear, long ones
    where it is nearly free, and the draft's own acceptance moves it."""
    from selfspec.engine.policy import Proposal, StepOutcome
    from selfspec.spec.auto import AutoSSRPolicy

    auto = AutoConfig()
    dear = AutoSSRPolicy(auto, _ctx(thinking=True))
    assert dear.draft_proposal_room(_Running(_costs(lambda r, t: 0.01 * r * t), 2), 64) == 0
    cheap = AutoSSRPolicy(auto, _ctx(thinking=True))
    cheap._fed = 17  # the parent verified 16 tokens in its latest step
    assert 8 <= cheap.draft_proposal_room(_Running(_costs(_gpu), 2), 64) <= 16
    middling = AutoSSRPolicy(auto, _ctx(thinking=True))
    middling._fed = 17
    assert middling.draft_proposal_room(_Running(_costs(_cpu), 2), 64) > 0
    for _ in range(8):
        middling.on_draft_step(StepOutcome(Proposal([5] * 16), 0, (5,)))
    assert middling.draft_proposal_room(_Running(_costs(_cpu), 2), 64) == 0  # its drafts' copies fail
    assert middling.report()["auto"]["proposed_tokens"]["thinking/draft_own"] == 128


def _ctx(
    thinking: bool, max_tokens: int = 1000, answer_cap: int | None = None, history=None, costs=None, rows: int = 1
) -> MethodContext:
    return MethodContext(
        thinking_format=_toy_format(),
        limits=ThinkingLimits(answer_cap=answer_cap),
        thinking=thinking,
        params=SamplingParams(max_tokens=max_tokens),
        device=torch.device("cpu"),
        draft_acceptance=history,
        step_costs=costs,
        rows=rows,
    )


def test_the_path_per_request():
    auto = AutoConfig()
    assert auto.choose_path(_ctx(thinking=True)) == ("ssr", None)
    assert auto.choose_path(_ctx(thinking=False)) == ("lookup", None)
    path, why = auto.choose_path(_ctx(thinking=True, answer_cap=20))
    assert path == "lookup" and "20 tokens" in why
    assert auto.choose_path(_ctx(thinking=True, max_tokens=16))[0] == "lookup"
    ssr = auto.ssr_config()
    assert ssr.gate == "cost" and ssr.speculate_thinking and ssr.thinking_speculator == "ngram"
    assert ssr.converge_tokens == auto.converge_tokens and ssr.draft_interval == auto.draft_interval


def test_a_thinking_request_copies_where_the_gate_would_decline_its_drafts():
    """On a workload whose drafts saved nothing against the copy path (the LLM's record) and a
    device where a second row costs 10% of a step, a thinking request takes the lookup path (SSR's
    per-step work would buy nothing), counted as a declined fork; the 16th in a row drafts again,
    and its own gate forks its first draft to measure. Where drafts pay, or nothing was measured,
    the request drafts."""
    from selfspec.spec.draft_gate import EXPLORE_EVERY, AcceptanceHistory, DraftGate

    dear = StepCosts()
    for _ in range(MIN_SAMPLES):
        dear.observe([1], 0.010)
        dear.observe([1, 1], 0.011)
    history = AcceptanceHistory()
    history.record(400, 100, answer_tokens=100, copy_steps=40, answer_steps=40, draft_forwards=400)
    auto = AutoConfig()
    paths = [auto.choose_path(_ctx(True, history=history, costs=dear)) for _ in range(EXPLORE_EVERY)]
    assert all(p == "lookup" and "gate declines" in why for p, why in paths[:-1]), paths
    assert paths[-1] == ("ssr", None)  # the record is measured again
    assert DraftGate(auto.ssr_config(), history).before_fork(dear, 1, 256).action == "explore"
    assert auto.choose_path(_ctx(True, history=history, costs=dear))[0] == "lookup"
    paying = AcceptanceHistory()
    paying.record(400, 380, answer_tokens=400, copy_steps=300, answer_steps=30, draft_forwards=200)
    assert auto.choose_path(_ctx(True, history=paying, costs=dear)) == ("ssr", None)
    assert auto.choose_path(_ctx(True, history=history, costs=StepCosts())) == ("ssr", None)  # row unmeasured


class _Backend:
    """A `DraftBackend` whose drafts write `answer` at once and whose step costs are given."""

    def __init__(self, answer: list[int], measured=None) -> None:
        self.answer, self.measured, self.forked = answer, measured, 0

    def fork_draft(self, draft: Draft, earlier):
        draft.tokens = list(self.answer)
        self.forked += 1
        return object()

    def cancel_draft(self, draft, reason):
        pass

    def draft_running(self, draft):
        return False

    def step_costs(self):
        return self.measured


def test_converged_drafts_stop_forking():
    config = AutoConfig(draft_interval=10, converge_tokens=4).ssr_config()
    schedule = DraftSchedule(config, cot_cap=200, thinking=True)
    backend = _Backend([7, 8, 9, 10, 11])
    for cot in range(1, 200):
        schedule.on_cot(cot, [CLOSE], backend)
    assert backend.forked == 2, "a third draft was forked after two agreed"
    assert schedule.converged_at == 30


def test_a_full_batch_stops_forking():
    """Where a row costs ~5-10% of a step, a draft pays alone, not beside 16 rows."""
    costs = _costs(lambda rows, tokens: 0.01 * (1 + 0.1 * (rows - 1)) + 0.0005 * rows * tokens)
    config = AutoConfig(draft_interval=10).ssr_config()
    alone = DraftSchedule(config, cot_cap=100, thinking=True)
    busy = DraftSchedule(config, cot_cap=100, thinking=True)
    alone.on_cot(10, [CLOSE], _Backend([1, 2], (costs, 1, 0)))
    busy_backend = _Backend([1, 2], (costs, 16, 0))
    busy.on_cot(10, [CLOSE], busy_backend)
    assert [v["action"] for v in alone.gate.report()] == ["fork"]
    assert [v["action"] for v in busy.gate.report()] == ["skip"]
    assert busy_backend.forked == 0


# ---------------------------------------------------------------------------------- the default
def test_auto_is_the_default_and_off_turns_it_off(bigram_llm):
    limits = ThinkingLimits(cot_cap=30, answer_cap=20)
    params = SamplingParams(max_tokens=80)
    (default,) = bigram_llm.generate(PROMPTS[0], params, limits=limits, thinking=False)
    (off,) = bigram_llm.generate(PROMPTS[0], params, limits=limits, thinking=False, spec="off")
    (none,) = bigram_llm.generate(PROMPTS[0], params, limits=limits, thinking=False, spec=None)
    (named,) = bigram_llm.generate(PROMPTS[0], params, limits=limits, thinking=False, spec={"method": "off"})
    assert default.metrics["auto"]["path"] == "lookup"
    assert default.metrics["accepted_tokens"] > 0
    for plain in (off, none, named):
        assert "auto" not in plain.metrics and plain.metrics["proposed_tokens"] == 0
        assert plain.token_ids == default.token_ids
    streamed = [t for ids in bigram_llm.stream(PROMPTS[0], params, limits=limits, thinking=False) for t in ids]
    assert streamed == default.token_ids


def test_serve_defaults_to_auto_and_speculation_off_is_plain():
    from selfspec.config import AutoConfig as Auto
    from selfspec.server.cli import build_defaults
    from selfspec.server.config import RequestDefaults
    from selfspec.server.request_plan import resolve_spec
    from selfspec.server.schemas import SelfspecOptions

    defaults = build_defaults()
    assert isinstance(defaults.speculation, Auto)
    assert build_defaults(backend="vllm").speculation is None  # vLLM has no auto: plain
    assert build_defaults(speculation="off").speculation is None
    assert build_defaults(ssr=True).speculation is None
    assert resolve_spec(SelfspecOptions(), defaults)[1] == "auto"
    assert resolve_spec(SelfspecOptions(speculation={"method": "off"}), defaults) == (None, "plain")
    assert resolve_spec(SelfspecOptions(speculation=False), defaults) == (None, "plain")
    assert resolve_spec(SelfspecOptions(speculation={"method": "ngram"}), defaults)[1] == "ngram"
    assert resolve_spec(SelfspecOptions(speculation={"method": "auto"}), RequestDefaults())[1] == "auto"
    assert resolve_spec(SelfspecOptions(), RequestDefaults()) == (None, "plain")


# ------------------------------------------------------------------ padded (static) step costs
BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def _bucketed(rows: int, tokens: int) -> float:
    """An H100 running a 135M model in CUDA graphs: a forward costs its token bucket, ~flat to 16."""
    bucket = next(b for b in BUCKETS if b >= tokens)
    return 0.0014 * (1 + 0.004 * bucket) * (1 + 0.05 * (rows - 1))


def test_padded_steps_are_priced_by_their_bucket_whatever_their_rows_feed():
    costs = StepCosts(BUCKETS)
    for _ in range(4):
        costs.observe([11], _bucketed(1, 11))  # prompt lookup's 10 + 1: the 16 bucket
        costs.observe([1], _bucketed(1, 1))
        costs.observe([11, 3], _bucketed(2, 11))  # a mixed step: padded to 16 as well
        costs.observe([1, 1], _bucketed(2, 1))
        costs.observe([300], 0.02)  # a prefill piece beyond the buckets: eager, no verify's price
    assert costs.padded and costs.bucket(9) == 16 and costs.bucket(65) is None
    assert costs.seconds(1, 16) == costs.seconds(1, 9) == pytest.approx(_bucketed(1, 16))
    assert costs.seconds(2, 16) == pytest.approx(_bucketed(2, 16))
    assert costs.row_cost(1) == pytest.approx(0.05)  # the same shape either way: no per-token skew
    assert costs.verify_token_cost() == pytest.approx(_bucketed(1, 16) / 16 / _bucketed(1, 1))
    assert costs.step_seconds() == pytest.approx(
        {(1, 16): _bucketed(1, 16), (1, 1): _bucketed(1, 1), (2, 16): _bucketed(2, 16), (2, 1): _bucketed(2, 1)}
    )
    # Eager steps (a CPU) keep the per-token rule: a 9-token step prices a 16-token one at 16/9.
    eager = StepCosts()
    for _ in range(4):
        eager.observe([9], 0.009)
    assert eager.seconds(1, 16) == pytest.approx(0.016)


def test_on_padded_steps_a_proposal_fills_its_bucket():
    """A verify costs its bucket: one token past a bucket pays for the next one whole, and within
    a bucket a longer proposal costs nothing more, so lengths are bucket fillers (k = bucket - 1)."""
    costs = StepCosts(BUCKETS)
    for rows in (1, 2):
        for tokens in BUCKETS:
            for _ in range(4):
                costs.observe([tokens] * rows, _bucketed(rows, tokens))
    assert {3, 7, 15, 31, 63} <= set(candidate_lengths(costs))
    assert 15 not in candidate_lengths(StepCosts())
    for alpha in (0.4, 0.7, 0.95):
        choice = choose_length(costs, rows=1, alpha=alpha, room=64)
        assert choice.k + 1 in BUCKETS, choice
    assert choose_length(costs, rows=1, alpha=0.95, room=10).k == 10  # the room itself, where it pays
    # Priced once per MEMO_STEPS observed steps (every row of every step reads the table), and at
    # once when a shape becomes measured.
    before = cost_table(costs, 1)
    costs.observe([1], _bucketed(1, 1))
    assert cost_table(costs, 1) is before
    for _ in range(MEMO_STEPS):
        costs.observe([1], _bucketed(1, 1))
    assert cost_table(costs, 1) is not before
    before = cost_table(costs, 3)
    for _ in range(MIN_SAMPLES):
        costs.observe([1] * 3, _bucketed(3, 1))
    assert cost_table(costs, 3) is not before


def test_copies_that_are_right_or_wrong_in_runs_are_valued_by_position():
    """Half the proposals keep nothing, half keep all 15 tokens (a copy is right or wrong): the
    per-position estimate gives a 15-token proposal E = 1 + 0.5 x 15, where one geometric rate fitted
    to the same runs (300 kept per 320 trials: 0.94) promises 10.3; and it prices an 8-token
    proposal of a source kept a token at a time (geometric) as the geometric model does."""
    rate = AcceptanceRate(prior=0.6, decay=1.0, prior_weight=1e-6)
    for _ in range(20):
        rate.observe(15, 0)
        rate.observe(15, 15)
    assert rate.expected(1) == pytest.approx(1.5, abs=1e-3)
    assert rate.expected(15) == pytest.approx(1 + 0.5 * 15, abs=1e-3)
    # Beyond what was ever offered, a position goes on at the last known rate (here ~1, capped at MAX_ALPHA).
    assert rate.expected(40) == pytest.approx(
        rate.expected(15) + 0.5 * MAX_ALPHA * (1 - MAX_ALPHA**25) / (1 - MAX_ALPHA), rel=1e-3
    )
    # ... and past the tracked positions too.
    assert rate.expected(80) - rate.expected(64) == pytest.approx(
        0.5 * MAX_ALPHA**50 * (1 - MAX_ALPHA**16) / (1 - MAX_ALPHA), rel=1e-3
    )
    assert expected_tokens(rate.value, 15) == pytest.approx(10.3, abs=0.1)
    geometric = AcceptanceRate(prior=0.6, decay=1.0, prior_weight=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(4000):
        kept = 0
        while kept < 16 and rng.random() < 0.5:
            kept += 1
        geometric.observe(16, kept)
    assert geometric.expected(8) == pytest.approx(expected_tokens(0.5, 8), rel=0.03)
    # The controller sizes proposals from the per-position estimate.
    costs = StepCosts(BUCKETS)
    for tokens in BUCKETS:
        for _ in range(4):
            costs.observe([tokens], _bucketed(1, tokens))
    controller = LengthController({"thinking": 0.6})
    controller.rates["thinking"] = rate
    assert controller.choose("thinking", costs, 1, 64) >= 15


def test_a_draft_never_widens_its_parents_step():
    """The rows of a step are padded to the widest: a draft's own proposal fills at most the
    parent's row (its bucket, on padded steps), however cheap a longer verify looks, and a draft
    beside a parent decoding plainly decodes plainly too."""
    from selfspec.engine.policy import Proposal, StepOutcome
    from selfspec.spec.auto import AutoSSRPolicy

    costs = StepCosts(BUCKETS)
    for rows in (1, 2):
        for tokens in BUCKETS:
            for _ in range(4):
                costs.observe([tokens] * rows, _bucketed(rows, tokens))
    policy = AutoSSRPolicy(AutoConfig(), _ctx(thinking=True))
    running = _Running(costs, 2)
    assert policy.draft_proposal_room(running, 63) == 0  # the parent fed one token
    for _ in range(8):  # drafts whose copies are kept whole: the rule alone would verify 63
        policy.on_draft_step(StepOutcome(Proposal([5] * 31), 31, (5,)))
    policy._fed = 9  # 8 proposed: the 16 bucket
    assert policy.draft_proposal_room(running, 63) == 15
    policy._fed = 33  # the 64 bucket
    assert policy.draft_proposal_room(running, 63) == 63
    eager = _costs(_gpu)  # unpadded steps: the parent's row itself
    policy._fed = 9
    assert policy.draft_proposal_room(_Running(eager, 2), 63) <= 8


@pytest.mark.parametrize("padded", [True, False])
def test_the_controller_decides_as_choose_length_does(padded):
    """`LengthController.choose` inlines `choose_length` (it runs for every row of every step):
    over random acceptance histories, batch sizes and rooms it picks the same length."""
    if padded:
        costs = StepCosts(BUCKETS)
        for rows in (1, 2, 5, 6):
            for tokens in BUCKETS:
                for _ in range(4):
                    costs.observe([tokens] * rows, _bucketed(rows, tokens))
    else:
        costs = _costs(_cpu)
    rng = np.random.default_rng(1)
    controller = LengthController({"thinking": 0.6}, margin=1.1, max_step_ratio=1.5)
    rate = controller.rates["thinking"]
    for _ in range(400):
        proposed = int(rng.integers(1, 65))
        rate.observe(proposed, int(rng.integers(0, proposed + 1)) if rng.random() < 0.5 else 0)
        rows, room = int(rng.choice([1, 2, 5, 16])), int(rng.integers(0, 90))
        want = choose_length(costs, rows, rate.value, room, margin=1.1, max_step_ratio=1.5, expected=rate.expected)
        assert controller.choose("thinking", costs, rows, room) == want.k, (rows, room)
        assert controller.report()["last_choice"]["budget_k"] == want.budget_k


def _gains_of(rate: AcceptanceRate, k: int = 16) -> list[float]:
    return [round(rate.expected(j), 9) for j in range(k + 1)]


def test_a_cut_copy_is_observed_as_the_whole_offer_by_the_tokens_committed_after_it():
    """A copy cut to k tokens, all accepted: the rate hears what the whole offer would have got,
    read off the tokens the verifier commits in this step (its own next token) and the next ones;
    the tallies still count what was verified."""
    cases = [
        # (kept, tail, committed this step, committed later, the observation the rate must get)
        (3, [7, 8, 9], [1, 2, 3, 7], [[8, 5]], (6, 5)),  # two tail tokens matched, the third not
        (3, [7, 8], [1, 2, 3, 4], [], (4, 3)),  # the verifier's own next token differs: settled at once
        (2, [5], [1, 2, 5], [], (3, 3)),  # the whole tail matched in the same step
        (2, [5, 6, 7], [1, 2, 5], [[6], [7, 0]], (5, 5)),  # matched to the tail's end over two steps
    ]
    for kept, tail, now, later, (offered, accepted) in cases:
        controller = LengthController({"thinking": 0.6})
        controller.record("thinking", "thinking", "lookup", kept, kept, tail, now)
        for committed in later:
            controller.follow(committed)
        want = AcceptanceRate(0.6)
        want.observe(offered, accepted)
        assert _gains_of(controller.rates["thinking"]) == _gains_of(want), (kept, tail)
        assert controller.proposed["thinking/lookup"] == kept and controller.accepted["thinking/lookup"] == kept


def test_a_cut_copy_that_was_not_accepted_whole_is_observed_as_verified():
    controller = LengthController({"thinking": 0.6})
    controller.record("thinking", "thinking", "lookup", 4, 2, [9, 9], [1, 2, 3])
    want = AcceptanceRate(0.6)
    want.observe(4, 2)
    assert _gains_of(controller.rates["thinking"]) == _gains_of(want)
    controller.follow([9, 9])  # nothing is being watched
    assert _gains_of(controller.rates["thinking"]) == _gains_of(want)


def test_a_watched_tail_counts_what_it_saw_when_dropped_or_replaced():
    controller = LengthController({"thinking": 0.6})
    controller.record("thinking", "thinking", "lookup", 2, 2, [5, 6, 7], [1, 2, 5])
    controller.drop_tail()  # e.g. the chain of thought closed
    want = AcceptanceRate(0.6)
    want.observe(3, 3)
    assert _gains_of(controller.rates["thinking"]) == _gains_of(want)
    controller.record("thinking", "thinking", "lookup", 2, 2, [5, 6], [1, 2, 5])
    controller.record("thinking", "thinking", "lookup", 1, 1, [4, 4], [6, 4])  # a new cut offer settles the old
    want.observe(3, 3)
    controller.follow([3])
    want.observe(3, 2)
    assert _gains_of(controller.rates["thinking"]) == _gains_of(want)


def test_cut_copies_that_run_on_teach_the_rule_to_propose_longer():
    """Copies that used to fail at their 5th token (so the rule keeps 4 of 16) start running on: a
    rule told "4 of 4" never offers the 5th again and goes on pricing it as it failed; read off
    the committed tokens, the offers show the runs, and a 15-token proposal is priced at them."""
    told_kept, told_offer = AcceptanceRate(0.3), LengthController({"thinking": 0.3})
    for _ in range(6):
        told_kept.observe(16, 4)
        told_offer.rates["thinking"].observe(16, 4)
    stream = list(range(100, 116))
    for _ in range(12):
        told_kept.observe(4, 4)
        told_offer.record("thinking", "thinking", "lookup", 4, 4, stream[4:], stream[:5])
        told_offer.follow(stream[5:])
    assert told_kept.expected(15) < 5
    assert told_offer.rates["thinking"].expected(15) > 12
