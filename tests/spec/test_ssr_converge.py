"""Iterative drafting that stops once drafts converge (`SSRConfig.converge_tokens`): the decision on
a scripted backend, and unchanged outputs with fewer drafts on a model whose drafts settle."""

from __future__ import annotations

import pytest

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.draft_schedule import DraftSchedule
from selfspec.spec.ssr_core import Draft, SSRConfig
from selfspec.testing.tiny import bigram_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits


class ScriptedDrafts:
    """A backend whose i-th draft has written `answers[i]` by the next budget."""

    def __init__(self, answers: list[list[int]]) -> None:
        self.answers = answers
        self.forked: list[Draft] = []
        self.cancelled: list[int] = []

    def fork_draft(self, draft: Draft, earlier: list[Draft]) -> object:
        draft.tokens = list(self.answers[draft.index])
        self.forked.append(draft)
        return object()

    def cancel_draft(self, draft: Draft, reason: str) -> None:
        self.cancelled.append(draft.index)

    def draft_running(self, draft: Draft) -> bool:
        return draft.index not in self.cancelled

    def step_costs(self) -> None:
        return None


def _run(answers: list[list[int]], converge: int | None) -> tuple[DraftSchedule, ScriptedDrafts]:
    schedule = DraftSchedule(SSRConfig(draft_interval=10, converge_tokens=converge), cot_cap=60, thinking=True)
    backend = ScriptedDrafts(answers)
    for cot in range(1, 60):
        schedule.on_cot(cot, [9], backend)
    return schedule, backend


def test_drafting_stops_when_the_two_newest_drafts_agree():
    same = [1, 2, 3, 4, 5]
    schedule, backend = _run([[7, 7, 7, 7], same, same, same, same], converge=4)
    assert len(backend.forked) == 3  # budgets 10, 20, 30; at 40 drafts 1 and 2 agree
    assert schedule.converged_at == 40 and schedule.budgets == []
    assert backend.cancelled == [0, 1]  # superseded ones; the newest runs on
    assert schedule.report()["drafts_converged_at"] == 40


def test_drafts_that_differ_or_are_short_keep_the_schedule():
    schedule, backend = _run([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2], [1, 2], [6]], converge=4)
    assert len(backend.forked) == 5 and schedule.converged_at is None
    schedule, backend = _run([[1, 2, 3, 4]] * 5, converge=None)
    assert len(backend.forked) == 5  # without the option: every budget forks


@pytest.fixture(scope="module")
def bigram_llm():
    tok = tiny_tokenizer()
    model = bigram_model(len(tok), eos_token_id=tok.eos_token_id)
    return LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=8, max_len=512))


def test_converged_drafting_keeps_the_output_with_fewer_drafts(bigram_llm):
    llm = bigram_llm
    limits = ThinkingLimits(cot_cap=60, answer_cap=24, fixed_length=True)
    params = SamplingParams(max_tokens=200)
    prompts = ["What is 12 + 30?", "Write a counter class", "hello"]
    base = llm.generate(prompts, params, limits=limits, thinking=True, spec="off")
    every = llm.generate(prompts, params, limits=limits, spec=SSRConfig(draft_interval=8, max_draft_len=24))
    settled = llm.generate(
        prompts, params, limits=limits, spec=SSRConfig(draft_interval=8, max_draft_len=24, converge_tokens=4)
    )
    early = llm.generate(
        prompts,
        params,
        limits=limits,
        spec=SSRConfig(draft_interval=8, max_draft_len=24, converge_tokens=4, converge_early=True),
    )
    for b, e in zip(base, early):  # converge_early: the repeat dropped, the older draft verified
        assert e.token_ids == b.token_ids
        assert e.metrics["drafts_converged_at"] is not None and e.metrics["drafts_dropped"] == 1
        assert e.metrics["accepted_prefix"] > 0
    for b, e, s in zip(base, every, settled):
        assert e.token_ids == b.token_ids and s.token_ids == b.token_ids
        assert s.metrics["drafts_converged_at"] is not None
        assert s.metrics["drafts"] < e.metrics["drafts"]
        assert s.metrics["accepted_prefix"] > 0
    assert llm.engine.scheduler.slots.num_used == 0, "slots leaked"


@pytest.mark.parametrize("gate", ["always", "cost"])
def test_a_step_the_schedule_does_not_want_is_one_on_cot_ignores(gate):
    """`wants_step` lets the parent skip `on_cot` (and building its backend) on most CoT steps: it
    must be True on every step where `on_cot` would fork, cancel or judge a running draft."""
    config = SSRConfig(draft_interval=10, converge_tokens=None, gate=gate, gate_probe_steps=1)
    schedule = DraftSchedule(config, cot_cap=60, thinking=True)
    backend = ScriptedDrafts([[1, 2, 3]] * 6)
    judged: list[int] = []
    if schedule.gate is not None:
        original = schedule.gate.while_drafting
        schedule.gate.while_drafting = lambda *a, **k: judged.append(a[2]) or original(*a, **k)
    skipped = []
    for cot in range(1, 60):
        if cot == 35:
            schedule.cancel_running(backend, "test: nothing runs until the next budget")
        if schedule.wants_step(cot, backend.draft_running):
            schedule.on_cot(cot, [9], backend)
        else:
            before = (len(backend.forked), list(backend.cancelled), list(schedule.budgets), len(judged))
            schedule.on_cot(cot, [9], backend)  # what skipping it would have missed: nothing
            assert (len(backend.forked), list(backend.cancelled), list(schedule.budgets), len(judged)) == before
            skipped.append(cot)
    assert len(backend.forked) == 5  # budgets 10..50
    if gate == "always":
        assert len(skipped) == 59 - 5  # only the budgets need the schedule
    else:
        assert 35 in skipped and 36 in skipped and 40 not in skipped  # nothing ran between 35 and 40
        assert judged  # a running draft was judged on the steps it was asked


def _think(schedule: DraftSchedule, backend: ScriptedDrafts) -> None:
    """CoT steps 1-59, the schedule asked only where it wants the step (as the engine's parent does)."""
    for cot in range(1, 60):
        if schedule.wants_step(cot, backend.draft_running):
            schedule.on_cot(cot, [9], backend)


def test_converge_early_drops_a_draft_that_repeats_the_one_before_it():
    """`converge_early`: the newer draft is cancelled as soon as it agrees with the older on
    `converge_tokens` tokens, and the older (complete) draft is the one the answer verifies."""
    config = SSRConfig(draft_interval=10, converge_tokens=4, converge_early=True)
    schedule = DraftSchedule(config, cot_cap=60, thinking=True)
    backend = ScriptedDrafts([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9], [7]])
    _think(schedule, backend)
    assert len(backend.forked) == 2 and backend.cancelled == [1]  # the older one runs on
    assert schedule.converged_at == 21 and schedule.budgets == []  # the step after the second fork
    assert [d.index for d in schedule.close(backend)] == [0]
    assert schedule.report()["drafts_dropped"] == 1
    # Drafts that differ within `converge_tokens` keep the schedule, and nothing is dropped.
    schedule = DraftSchedule(config, cot_cap=60, thinking=True)
    backend = ScriptedDrafts([[1, 2, 3, 4], [1, 2, 3, 5], [6, 6, 6, 6], [1, 1, 1, 1], [2], [3]])
    _think(schedule, backend)
    assert len(backend.forked) == 5 and schedule.converged_at is None
    assert backend.cancelled == [0, 1, 2]  # each older one once the newer one differed (the 1-token last one never did)
    assert [d.index for d in schedule.close(backend)] == [0, 1, 2, 3, 4]
