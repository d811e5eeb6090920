"""The SSR cost gate: step costs measured by shape, fork/skip/cancel decisions from them, and
unchanged outputs whatever it decides (the bigram model's drafts do match, so a skipped or
cancelled draft shows in the metrics and forward counts, never in the tokens)."""

from __future__ import annotations

import pytest
import torch

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.step_costs import StepCosts
from selfspec.llm import LLM
from selfspec.spec.draft_gate import (
    EXPLORE_EVERY,
    SAVING_PRIOR_TOKENS,
    VERIFY_COST_PRIOR,
    AcceptanceHistory,
    DraftGate,
    _draft_row_cost,
    copy_steps,
)
from selfspec.spec.draft_schedule import DraftSchedule
from selfspec.spec.proposal_length import cost_ratio
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.tiny import bigram_model, tiny_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits


def _costs(decode: dict[int, float], verify: dict[int, float] | None = None) -> StepCosts:
    costs = StepCosts()
    for rows, seconds in decode.items():
        for _ in range(8):
            costs.observe([1] * rows, seconds)
    for tokens, seconds in (verify or {}).items():
        costs.observe([tokens], seconds)
    return costs


def test_step_costs_by_shape():
    costs = _costs({1: 0.10, 2: 0.11}, verify={64: 0.64})
    assert costs.seconds(1) == pytest.approx(0.10)
    assert costs.row_cost(1) == pytest.approx(0.10)
    assert costs.row_cost(2) is None  # three rows never measured
    assert costs.verify_token_cost() == pytest.approx(0.1)
    costs.observe([1, 4], 9.0)  # a mixed step belongs to no shape
    assert costs.summary().keys() == {"1x1", "2x1", "1x64"}


def test_row_cost_is_read_where_the_steps_run():
    """Composed with speculation in the thinking, parent and draft verify 16 tokens a step:
    the few one-token steps (a draft's first) say nothing about what the extra row costs."""
    costs = StepCosts()
    for _ in range(40):
        costs.observe([16], 0.010)
        costs.observe([16, 16], 0.011)
    for _ in range(5):
        costs.observe([1], 0.008)
        costs.observe([1, 1], 0.016)  # stalls of a draft's first steps
    assert costs.row_cost(1) == pytest.approx(0.10)
    for _ in range(48):  # once one-token steps dominate, they are the measure
        costs.observe([1], 0.008)
        costs.observe([1, 1], 0.0088)
    assert costs.row_cost(1) == pytest.approx(0.10)
    assert StepCosts().row_cost(1) is None


def test_host_time_between_forwards_weighs_in_every_ratio():
    """A step is its forward plus the host's work before the next one: a verify that makes the
    forward 20% longer makes a step with 0.05 s of host work on a 0.10 s forward 13% longer."""
    costs = StepCosts()
    now = 0.0
    for _ in range(8):
        for tokens, seconds in ((1, 0.10), (16, 0.12)):
            costs.observe([tokens], seconds, now)
            now += seconds + 0.05
        costs.observe([1, 1], 0.11, now)
        now += 0.11 + 0.05
    now += 10.0  # the engine idled: not a step's host work
    costs.observe([1], 0.10, now)
    assert costs.host_seconds() == pytest.approx(0.05)
    assert cost_ratio(costs, 1, 16)[0] == pytest.approx(0.17 / 0.15)
    assert costs.row_cost(1) == pytest.approx(0.16 / 0.15 - 1.0)
    assert costs.summary()["host"] == pytest.approx(50.0)
    assert StepCosts().host_seconds() == 0.0  # nothing seen: forwards alone


def test_a_rows_host_time_is_part_of_its_price():
    """Every row is proposed for, verified and committed on the host: where a second row adds
    little to the forward but much to the host's part (a GPU running a small model), the row's
    price is the whole step's growth, each row count at its own host gap, and a draft whose saving
    covers the forward's growth alone is not forked."""
    costs = StepCosts()
    now = 0.0
    for _ in range(8):
        for rows, forward, host in ((1, 0.100, 0.010), (2, 0.101, 0.030)):
            now += host
            costs.observe([1] * rows, forward, now)
            now += forward
    assert costs.host_seconds(1) == pytest.approx(0.010)
    assert costs.host_seconds(2) == pytest.approx(0.030)
    assert costs.host_seconds(3) == costs.host_seconds()  # an unmeasured row count: every step's median
    assert costs.row_cost(1) == pytest.approx(0.131 / 0.110 - 1.0)
    assert cost_ratio(costs, 2, 1)[0] == 1.0  # a verify of the same rows: host time on both sides alike
    history = AcceptanceHistory()
    history.record(1000, 800, answer_tokens=400, copy_steps=300, answer_steps=200, draft_forwards=1000)
    gate = DraftGate(SSRConfig(gate="cost", gate_margin=1.0), history)
    verdict = gate.before_fork(costs, rows=1, cot_tokens=200)
    assert verdict.action == "skip", verdict  # a token saves 0.13 of a step; the row costs 0.19 (forwards alone: 0.01)


def test_drafts_under_load_share_the_batch_bucket_they_cross():
    """On padded batches the 17th row moves the step into the 32-row bucket and the rows after it
    ride free: priced by its marginal row, the draft beside 7 others looked free and forked, and the
    batch stayed in the dear bucket. Shared out among every draft, each pays its part of the jump."""
    costs = StepCosts()
    for _ in range(8):
        costs.observe([8] * 16, 0.00196)
        for rows in range(17, 33):
            costs.observe([8] * rows, 0.0033)
    assert costs.row_cost(16) == pytest.approx(0.0033 / 0.00196 - 1.0)
    assert costs.row_cost(23) == 0.0  # the marginal row inside the bucket
    assert costs.row_cost(16, 8) == pytest.approx((0.0033 / 0.00196 - 1.0) / 8)
    gate = DraftGate(SSRConfig(gate="cost"), AcceptanceHistory())
    assert gate.before_fork(costs, rows=16, cot_tokens=10, other_drafts=7).action == "skip"
    # The same request alone in its 16-row bucket, or with the no-draft shape unmeasured: its own row.
    assert gate._judge(costs, 23, 10, 0, when_unknown="probe", when_pays="fork").row_cost == 0.0
    assert _draft_row_cost(costs, 20, 3) == 0.0  # 20 rows never ran: the marginal row at 23


def test_step_costs_median_ignores_stalls():
    costs = _costs({1: 0.10})
    costs.observe([1], 5.0)  # one stall among eight
    assert costs.seconds(1) == pytest.approx(0.10)


def test_gate_forks_where_a_row_is_cheap_and_skips_where_it_is_not():
    gate = DraftGate(SSRConfig(gate="cost"))
    cheap = gate.before_fork(_costs({1: 0.100, 2: 0.106}, verify={64: 0.64}), rows=1, cot_tokens=10)
    assert cheap.action == "fork" and cheap.row_cost == pytest.approx(0.06)
    dear = gate.before_fork(_costs({1: 0.100, 2: 0.190}), rows=1, cot_tokens=20)
    assert dear.action == "skip" and "cannot pay" in dear.reason
    assert dear.verify_cost == VERIFY_COST_PRIOR
    # Under load the extra row slows every request in the step: cheap alone, too dear for eight.
    loaded = gate.before_fork(_costs({8: 0.100, 9: 0.106}), rows=8, cot_tokens=30)
    assert loaded.action == "skip"
    assert [v["action"] for v in gate.report()] == ["fork", "skip", "skip"]


def test_gate_probes_when_unmeasured_then_judges_the_running_draft():
    gate = DraftGate(SSRConfig(gate="cost", gate_probe_steps=4))
    costs = _costs({1: 0.1})
    assert gate.before_fork(costs, rows=1, cot_tokens=5).action == "probe"
    assert gate.while_drafting(costs, rows=1, cot_tokens=6, draft_tokens=3) is None  # before the probe ends
    for _ in range(8):
        costs.observe([1, 1], 0.2)
    assert gate.while_drafting(costs, rows=1, cot_tokens=9, draft_tokens=4) is None  # one failing check
    verdict = gate.while_drafting(costs, rows=1, cot_tokens=13, draft_tokens=8)
    assert verdict is not None and verdict.action == "cancel"


class _FixedCosts(StepCosts):
    """Costs a test chooses: an extra row at `row` of a step, verify at 0.05 a token."""

    def __init__(self, row: float | None) -> None:
        super().__init__()
        self.row = row

    def row_cost(self, rows: int, extra: int = 1) -> float | None:
        return self.row

    def verify_token_cost(self) -> float | None:
        return 0.05


@pytest.fixture(scope="module")
def bigram_llm():
    tok = tiny_tokenizer()
    model = bigram_model(len(tok), eos_token_id=tok.eos_token_id)
    return LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=8, max_len=512))


@pytest.mark.parametrize(
    "row_cost, expect",
    [(0.02, "fork"), (2.0, "skip"), (None, "probe-then-cancel")],
)
def test_gate_decisions_leave_the_output_unchanged(bigram_llm, row_cost, expect):
    llm = bigram_llm
    limits = ThinkingLimits(cot_cap=40, answer_cap=20, fixed_length=True)
    params = SamplingParams(max_tokens=200)
    prompts = ["What is 12 + 30?", "Write a counter class", "hello"]
    base = llm.generate(prompts, params, limits=limits, thinking=True, spec="off")
    saved = llm.engine.step_costs
    costs = _FixedCosts(row_cost)
    llm.engine.step_costs = costs
    try:
        spec = SSRConfig(draft_budgets=[5], max_draft_len=30, gate="cost", gate_probe_steps=4)
        if expect == "probe-then-cancel":
            # Unmeasured at the fork; measured as far too dear once the draft has run 4 tokens.
            original = DraftGate.while_drafting

            def measured_then(gate, costs_, rows, cot_tokens, draft_tokens, other_drafts=0):
                costs.row = 2.0
                return original(gate, costs_, rows, cot_tokens, draft_tokens, other_drafts)

            DraftGate.while_drafting = measured_then
        try:
            out = llm.generate(prompts, params, limits=limits, spec=spec)
        finally:
            if expect == "probe-then-cancel":
                DraftGate.while_drafting = original
    finally:
        llm.engine.step_costs = saved
    for o, b in zip(out, base):
        assert o.token_ids == b.token_ids
        actions = [v["action"] for v in o.metrics["draft_gate"]]
        if expect == "fork":
            assert actions[0] == "fork" and o.metrics["drafts"] == 1 and o.metrics["accepted_prefix"] > 0
        elif expect == "skip":
            assert actions == ["skip"] and o.metrics["drafts"] == 0
        else:
            assert actions[0] == "probe" and actions[-1] == "cancel"
            assert o.metrics["drafts"] == 1 and 8 <= o.metrics["draft_tokens"] < 30
    assert llm.engine.scheduler.slots.num_used == 0, "slots leaked"


def test_acceptance_history_blends_the_prior_with_what_drafts_were_worth():
    history = AcceptanceHistory()
    assert history.estimate(0.5) == pytest.approx(0.5)  # nothing measured: the prior
    history.record(drafted=100, accepted=400)  # suffix reuse counts each written token once
    history.record(drafted=0, accepted=0)  # no draft: no evidence
    assert (history.drafted, history.accepted, history.requests) == (100, 100, 1)
    assert history.estimate(0.5, weight=100) == pytest.approx(0.75)
    history.record(drafted=1900, accepted=0)
    assert history.estimate(0.5, weight=100) == pytest.approx((100 + 50) / 2100)


def test_gate_stops_forking_where_this_llms_drafts_were_rejected():
    costs = _FixedCosts(0.2)  # gain a x 0.95 against a cost of 1.25 x 0.2 = 0.25
    assert DraftGate(SSRConfig(gate="cost")).before_fork(costs, rows=1, cot_tokens=5).action == "fork"
    history = AcceptanceHistory()
    history.record(drafted=2000, accepted=20)
    verdict = DraftGate(SSRConfig(gate="cost"), history).before_fork(costs, rows=1, cot_tokens=5)
    assert verdict.action == "skip" and verdict.acceptance == pytest.approx(history.estimate(0.5))


@pytest.mark.parametrize("zero_attention, direction", [(True, "up"), (False, "down")])
def test_each_llm_learns_its_drafts_acceptance_from_finished_requests(zero_attention, direction):
    """The bigram model's drafts match (the estimate rises above the prior); a random model's
    do not (it falls): what the gate of the next request on the same LLM prices."""
    tok = tiny_tokenizer()
    model = tiny_model("llama", len(tok), seed=5, num_layers=2, eos_token_id=tok.eos_token_id)
    if zero_attention:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
    llm = LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=4, max_len=512))
    limits = ThinkingLimits(cot_cap=40, answer_cap=30, fixed_length=True)
    spec = SSRConfig(draft_budgets=[5], max_draft_len=30)
    llm.generate(["What is 12 + 30?", "hello"], SamplingParams(max_tokens=200), limits=limits, spec=spec)
    history = llm.draft_acceptance
    assert history.requests == 2 and history.drafted > 0
    estimate = history.estimate(SSRConfig().gate_acceptance)
    assert estimate > 0.5 if direction == "up" else estimate < 0.5


@pytest.mark.parametrize("reuse", ["prefix", "prefix+suffix"])
def test_history_records_what_the_answers_took_from_the_drafts(reuse):
    """An answer that ends inside its draft (the bigram model's drafts are its answers; the answer cap
    ends it within the draft) never leaves the prefix stage; what it took must still reach the history,
    as it reaches the request's metrics. Recording the stage's exit value instead wrote 0 for exactly the
    drafts that paid best, and the gate of the requests after them then priced drafts as rejected."""
    tok = tiny_tokenizer()
    model = bigram_model(len(tok), seed=5, eos_token_id=tok.eos_token_id)
    llm = LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=16, max_len=512))
    outs = llm.generate(
        ["What is 12 + 30?", "hello", "Route from A to B", "def add(a, b):"],
        SamplingParams(max_tokens=300),
        limits=ThinkingLimits(cot_cap=100, answer_cap=40),
        thinking=True,
        spec=SSRConfig(draft_budgets=[5], max_draft_len=80, reuse=reuse),
    )
    taken = [
        min(o.metrics["draft_tokens"], o.metrics["accepted_prefix"] + o.metrics["suffix_accepted_tokens"]) for o in outs
    ]
    history = llm.draft_acceptance
    assert history.requests == len(outs) and sum(taken) > 0
    assert history.accepted == sum(taken)
    assert history.drafted == sum(o.metrics["draft_tokens"] for o in outs)


def test_copy_steps_replays_prompt_lookup_over_the_answer():
    context = [1, 2, 3, 4, 5, 6, 7, 8]
    # "8" has no earlier occurrence: one plain step; then "1" copies 2..8 whole.
    assert copy_steps(context, [1, 2, 3, 4, 5, 6, 7, 8]) == 2
    assert copy_steps(context, [100, 101, 102]) == 3  # nothing to copy: a step a token
    assert copy_steps(context, [1, 2, 3, 9, 9]) == 3  # 1; the copy's 2, 3 + the model's 9; a 9 of its own
    assert copy_steps(context, list(range(1, 9)) * 4, max_tokens=4) == 8  # copies of at most 4 tokens + 1


def test_gate_prices_a_draft_token_at_the_answer_steps_drafts_saved_against_the_copy_path():
    """Drafts whose answers prompt lookup would have copied almost as fast save little: the gate
    that forks on acceptance alone skips once the history says so, and a draft that writes several
    tokens a step costs its row per step, not per token."""
    costs = _FixedCosts(0.05)  # 1.25 x 0.05 = 0.0625 of a step per draft step
    history = AcceptanceHistory()
    history.record(drafted=1000, accepted=800)  # no saving counted: acceptance only
    assert DraftGate(SSRConfig(gate="cost"), history).before_fork(costs, rows=1, cot_tokens=5).action == "fork"
    # 6000 draft tokens, 60 answer steps saved against the copy path, a forward per draft token.
    history.record(
        drafted=6000, accepted=4800, answer_tokens=6000, copy_steps=900, answer_steps=840, draft_forwards=6000
    )
    assert history.saving(0.5, weight=100) == pytest.approx((60 + 50) / 6100)
    assert history.saving(0.5) == pytest.approx((60 + 0.5 * SAVING_PRIOR_TOKENS) / (6000 + SAVING_PRIOR_TOKENS))
    verdict = DraftGate(SSRConfig(gate="cost"), history).before_fork(costs, rows=1, cot_tokens=5)
    assert verdict.action == "skip" and verdict.saving == pytest.approx(history.saving(verdict.acceptance * 0.95))
    assert "against the copy path" in verdict.reason
    # The same saving from drafts that write four tokens a forward: a quarter of the row cost per token.
    fast = AcceptanceHistory()
    fast.record(drafted=1000, accepted=800)
    fast.record(drafted=6000, accepted=4800, answer_tokens=6000, copy_steps=900, answer_steps=840, draft_forwards=1500)
    assert fast.draft_steps() == pytest.approx((1500 + SAVING_PRIOR_TOKENS) / (6000 + SAVING_PRIOR_TOKENS))
    verdict = DraftGate(SSRConfig(gate="cost"), fast).before_fork(costs, rows=1, cot_tokens=5)
    assert verdict.action == "fork" and verdict.draft_steps < 0.4


def test_a_draft_longer_than_this_llms_answers_is_stopped():
    history = AcceptanceHistory()
    for n in (10, 20, 30):
        history.record(drafted=0, accepted=0, answer_tokens=n)
    assert history.draft_length_cap() is None  # too few answers yet
    history.record(drafted=50, accepted=40, answer_tokens=40, copy_steps=20, answer_steps=10, draft_forwards=25)
    assert history.draft_length_cap() == 50 + 32
    schedule = DraftSchedule(SSRConfig(draft_budgets=[5], gate="cost"), cot_cap=60, thinking=True, history=history)

    class Backend:
        cancelled: list[str] = []

        def fork_draft(self, draft, earlier):
            return object()

        def cancel_draft(self, draft, reason):
            self.cancelled.append(reason)

        def draft_running(self, draft):
            return not self.cancelled

        def step_costs(self):
            return None

    backend = Backend()
    schedule.on_cot(5, [9], backend)
    draft = schedule.drafts[0]
    draft.tokens = [1] * 81
    schedule.on_cot(6, [9], backend)
    assert backend.cancelled == []
    draft.tokens.append(1)
    schedule.on_cot(7, [9], backend)
    assert len(backend.cancelled) == 1 and "past this LLM's answers" in backend.cancelled[0]
    assert [d.index for d in schedule.close(backend)] == [0]  # what it wrote is still verified


def test_the_history_counts_the_copy_paths_steps_of_each_answer():
    """A fresh LLM whose extra row costs nothing (the gate forks whatever this machine's load): each
    finished gated request adds its answer, the copy path's steps for it, its drafts and their forwards."""
    tok = tiny_tokenizer()
    model = bigram_model(len(tok), eos_token_id=tok.eos_token_id)
    llm = LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=8, max_len=512))
    llm.engine.step_costs = _FixedCosts(0.0)
    history = llm.draft_acceptance
    before = (history.answer_tokens, history.copy_steps, history.priced_drafted, history.draft_forwards)
    outs = llm.generate(
        ["What is 12 + 30?", "hello"],
        SamplingParams(max_tokens=200),
        limits=ThinkingLimits(cot_cap=40, answer_cap=30, fixed_length=True),
        spec=SSRConfig(draft_budgets=[5], max_draft_len=30, gate="cost"),
    )
    answers = sum(o.metrics["answer_tokens"] for o in outs)
    assert history.answer_tokens - before[0] == answers > 0
    assert 0 < history.copy_steps - before[1] <= answers
    drafted = sum(o.metrics["draft_tokens"] for o in outs)
    assert history.priced_drafted - before[2] == drafted > 0
    assert history.draft_forwards - before[3] == sum(o.metrics["draft_forwards"] for o in outs)


def test_a_declined_workload_is_measured_again_now_and_then():
    """Declined forks record nothing: after EXPLORE_EVERY of them in a row on one LLM the next is
    forked anyway, and that draft is not re-judged (it runs to its end, to be measured)."""
    costs = _FixedCosts(0.05)
    history = AcceptanceHistory()
    history.record(
        drafted=6000, accepted=4800, answer_tokens=6000, copy_steps=900, answer_steps=900, draft_forwards=6000
    )
    actions = [DraftGate(SSRConfig(gate="cost"), history).before_fork(costs, 1, 5).action for _ in range(EXPLORE_EVERY)]
    assert actions == ["skip"] * (EXPLORE_EVERY - 1) + ["explore"]
    gate = DraftGate(SSRConfig(gate="cost", gate_probe_steps=1), history)
    assert gate.before_fork(costs, 1, 5).action == "skip"  # the count starts again
    history.declined_in_a_row = EXPLORE_EVERY - 1
    explored = gate.before_fork(costs, 1, 5)
    assert explored.drafts and explored.action == "explore" and "explore" in explored.reason
    assert all(gate.while_drafting(costs, 1, 5 + i, i) is None for i in range(1, 40))
    # A fork the gate lets through on its merits resets the count.
    history.declined_in_a_row = 7
    assert DraftGate(SSRConfig(gate="cost"), AcceptanceHistory()).before_fork(costs, 1, 5).action == "fork"
    assert DraftGate(SSRConfig(gate="cost"), history).before_fork(_FixedCosts(0.0001), 1, 5).action == "fork"
    assert history.declined_in_a_row == 0
