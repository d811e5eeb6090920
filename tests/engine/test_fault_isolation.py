"""One request can never fail another: faults injected per stage, and speculation under a grammar.

Each fault is injected into one request's own policy or constraint instance (propose,
propose_many, the grammar's mask and advance, verify, prepare_verify_many, on_step, on_finish)
while plain and speculating requests decode beside it. The faulty request ends with finish
reason "error" and a detail naming the stage and the exception; every other request commits
exactly the tokens it commits alone; no slot, draft slot or child sequence is left behind.

The regression: prompt lookup (and every method) under a grammar once proposed tokens past the
grammar's stop token, and xgrammar aborted the step (`Check failed: (!IsStopTokenAccepted())`)
for the whole batch. The prompt below holds the constrained answer, the end-of-turn token and
more text after it, so prompt lookup proposes exactly that.
"""

from __future__ import annotations

import json

import pytest
import torch

from selfspec.config import DraftModelConfig, PromptLookupConfig, SuffixDecodingConfig
from selfspec.engine.config import EngineConfig
from selfspec.engine.constraint import ConstraintViolation
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.verify import verify_proposal
from selfspec.llm import LLM
from selfspec.spec.ngram import NgramProposer
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": ["ab", "cd"]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
NUM_SLOTS = 8
MAX_TOKENS = 24
OTHERS = [("hello", None), ("The quick brown fox", PromptLookupConfig()), ("def add(a, b):", SuffixDecodingConfig())]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _bigram_model(tok):
    """A Llama whose attention output is zeroed: the next token depends on the current one only,
    so copied text is what the model says again, and proposals are accepted."""
    model = tiny_model("llama", len(tok), seed=5, num_layers=2, eos_token_id=tok.eos_token_id)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    return model


@pytest.fixture(scope="module")
def llm(tok):
    config = EngineConfig(num_slots=NUM_SLOTS, max_len=384)
    return LLM.from_model(_bigram_model(tok), tok, engine_config=config, draft="layers:1")


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _params(**kwargs):
    return SamplingParams(max_tokens=kwargs.pop("max_tokens", MAX_TOKENS), **kwargs)


def _run(llm, requests):
    """(prompt, spec, params, grammar, thinking) requests in one continuous batch."""
    seqs = [
        llm.submit(
            prompt,
            params or _params(),
            spec=spec,
            grammar=grammar,
            thinking=thinking,
            limits=ThinkingLimits(cot_cap=8) if thinking else None,
        )
        for prompt, spec, params, grammar, thinking in requests
    ]
    llm.run_until_done(seqs)
    return seqs


def _assert_clean(llm):
    engine = llm.engine
    assert engine.scheduler.slots.num_free == NUM_SLOTS
    assert not engine.has_unfinished() and not engine.failing_requests
    assert llm.draft_runner.slots.num_free == llm.draft_runner.slots.num_slots


# ---------------------------------------------------------------------- speculation under a grammar
@pytest.fixture(scope="module")
def echo_prompt(llm, tok):
    """A prompt whose tail starts what the model answers under SCHEMA, after a copy of that
    answer, the end-of-turn token and more text: prompt lookup proposes the answer, the stop
    token and what followed it."""
    grammar = llm.grammars.json_schema(SCHEMA)
    start = _ids(tok, "hello")
    (base,) = _run(llm, [(start, None, _params(max_tokens=60), grammar, False)])
    answer = base.output_ids
    assert answer[-1] == tok.eos_token_id and json.loads(tok.decode(answer[:-1]))  # the grammar ended it
    return start + answer + _ids(tok, " more text after the turn") + start


def test_prompt_lookup_proposes_past_the_grammars_end(llm, tok, echo_prompt):
    """The scenario is real: what prompt lookup proposes holds the stop token and more after it."""
    grammar = llm.grammars.json_schema(SCHEMA)
    (base,) = _run(llm, [(echo_prompt, None, _params(max_tokens=60), grammar, False)])
    first = base.output_ids[0]
    proposal = NgramProposer(num_tokens=40).propose(list(echo_prompt) + [first], 40).tokens
    eos = proposal.index(tok.eos_token_id)
    assert proposal[:eos] == base.output_ids[1:-1] and len(proposal) > eos + 1


def test_masks_stop_before_the_grammars_stop_token(llm, tok):
    grammars = llm.grammars
    answer = _ids(tok, '{"ok": true, "n": "ab"}')
    constraint = grammars.constraint(grammars.json_schema(SCHEMA), start=0)
    constraint.sync(answer[:2])
    masks, valid = constraint.masks(answer[2:] + [tok.eos_token_id] + _ids(tok, "more"))
    assert valid == len(answer) - 2 and masks.shape[0] == valid + 1
    assert masks[-1, tok.eos_token_id] and masks[-1].sum() == 1  # the bonus position draws the stop token
    constraint.sync(answer + [tok.eos_token_id])  # the stop token committed (ignore_eos): the grammar has ended
    masks, valid = constraint.masks(_ids(tok, "more"))
    assert valid == 0 and masks.shape[0] == 1 and not masks[0].any()
    with pytest.raises(ConstraintViolation, match="end of the output grammar"):
        constraint.sync(answer + [tok.eos_token_id] + _ids(tok, "x"))


SPECS = {
    "ngram": PromptLookupConfig(num_tokens=40),
    "suffix": SuffixDecodingConfig(),
    "suffix+ngram": SuffixDecodingConfig(with_prompt_lookup=True),
    "draft": DraftModelConfig(num_speculative_tokens=8),
    "ssr": SSRConfig(draft_budgets=[4], max_draft_len=48, speculate_thinking=True, thinking_speculator="ngram"),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_speculation_under_a_grammar_is_constrained_greedy(llm, tok, echo_prompt, name):
    """Every method under the grammar commits the tokens of constrained greedy decoding, while a
    plain request decodes beside it with its alone tokens."""
    grammar = llm.grammars.json_schema(SCHEMA)
    thinking = name == "ssr"
    params = _params(max_tokens=60)
    (plain_alone,) = _run(llm, [("hello", None, None, None, False)])
    (base,) = _run(llm, [(echo_prompt, None, params, grammar, thinking)])
    out, plain = _run(
        llm, [(echo_prompt, SPECS[name], _params(max_tokens=60), grammar, thinking), ("hello", None, None, None, False)]
    )
    assert out.finish_reason.value == "stop", out.finish_detail
    assert out.output_ids == base.output_ids and plain.output_ids == plain_alone.output_ids
    if name != "draft":  # a one-layer draft of random weights rarely agrees
        assert out.stats.accepted_tokens > 0
    _assert_clean(llm)


@pytest.mark.parametrize("name", ["ngram", "suffix", "draft"])
def test_sampling_under_a_grammar_ends_at_the_grammar(llm, tok, echo_prompt, name):
    grammar = llm.grammars.json_schema(SCHEMA)
    params = _params(max_tokens=60, temperature=1.0, seed=3)
    out, plain = _run(llm, [(echo_prompt, SPECS[name], params, grammar, False), ("hello", None, None, None, False)])
    (plain_alone,) = _run(llm, [("hello", None, None, None, False)])
    assert out.finish_reason.value == "stop", out.finish_detail
    assert out.output_ids[-1] == tok.eos_token_id and json.loads(tok.decode(out.output_ids[:-1]))
    assert plain.output_ids == plain_alone.output_ids
    _assert_clean(llm)


# ---------------------------------------------------------------------- fault injection
class Boom(RuntimeError):
    pass


def _failing_after(calls: int, original, message: str):
    """A stand-in for one instance method: the first `calls` calls go through, later ones raise."""
    count = {"n": 0}

    def method(*args, **kwargs):
        count["n"] += 1
        if count["n"] > calls:
            raise Boom(message)
        return original(*args, **kwargs)

    return method


def _isolated(llm, faulty_request, inject, stage_words, *, others=OTHERS, other_spec=None):
    """Run the faulty request (first, so it leads any group call) beside `others`; check it failed
    alone and cleanly."""
    alone = {
        prompt: _run(llm, [(prompt, other_spec or spec, None, None, False)])[0].output_ids for prompt, spec in others
    }
    prompt, spec, params, grammar, thinking = faulty_request
    faulty = llm.submit(
        prompt, params or _params(), spec=spec, grammar=grammar, thinking=thinking,
        limits=ThinkingLimits(cot_cap=8) if thinking else None,
    )  # fmt: skip
    inject(faulty)
    rest = [llm.submit(p, _params(), spec=other_spec or s, thinking=False) for p, s in others]
    llm.run_until_done([faulty, *rest])
    result = llm.result(faulty)
    assert result.finish_reason == "error"
    assert "Boom: injected" in result.finish_detail and stage_words in result.finish_detail, result.finish_detail
    for seq, (p, _) in zip(rest, others):
        assert seq.finish_reason.value in ("stop", "length") and seq.output_ids == alone[p], p
    assert all(child.is_finished for child in faulty.children)
    _assert_clean(llm)
    return faulty


def test_a_failing_propose(llm):
    def inject(seq):
        seq.policy.propose = _failing_after(2, seq.policy.propose, "injected propose")

    _isolated(llm, ("Records: name=Alice", PromptLookupConfig(), None, None, False), inject, "proposing")


def test_a_failing_propose_many(llm):
    """Draft-model requests propose in one group call; the faulty one leads it, so the group
    call fails, each request is retried alone, and only the faulty one fails again."""
    draft = DraftModelConfig(num_speculative_tokens=4)

    def inject(seq):
        seq.policy.propose_many = _failing_after(1, type(seq.policy).propose_many, "injected propose_many")

    faulty = _isolated(llm, ("Records: name=Alice", draft, None, None, False), inject, "proposing", other_spec=draft)
    assert faulty.stats.verify_steps > 0  # it proposed in a group before failing


def test_a_failing_grammar_mask(llm):
    def inject(seq):
        seq.constraint.masks = _failing_after(3, seq.constraint.masks, "injected mask")

    grammar = llm.grammars.json_schema(SCHEMA)
    _isolated(llm, ("hello", PromptLookupConfig(), None, grammar, False), inject, "output grammar")


def test_a_failing_grammar_advance(llm):
    def inject(seq):
        state = seq.constraint._grammar
        state.accept = _failing_after(4, state.accept, "injected accept")

    grammar = llm.grammars.json_schema(SCHEMA)
    _isolated(llm, ("hello", SuffixDecodingConfig(), None, grammar, False), inject, "output grammar")


def test_a_failing_verify(llm):
    def inject(seq):
        seq.policy.custom_verify = True
        seq.policy.verify = _failing_after(0, None, "injected verify")

    _isolated(llm, ("Records: name=Alice", PromptLookupConfig(), None, None, False), inject, "verifying")


def test_a_failing_prepare_verify_many(llm, monkeypatch):
    """Custom-verifying requests of one verify group prepare together; the faulty one leads."""

    def exact_verify(engine, seq, logits, proposal):
        return verify_proposal(proposal, argmax=logits.argmax(dim=-1).tolist(), probs=None, generator=None)

    policies = []

    def grouped(seq):
        seq.policy.custom_verify = True
        seq.policy.verify = lambda engine, s, logits, proposal: exact_verify(engine, s, logits, proposal)
        seq.policy.verify_group = lambda: "group"
        policies.append(seq.policy)

    def inject(seq):
        grouped(seq)
        seq.policy.prepare_verify_many = _failing_after(0, None, "injected prepare")

    original_submit = llm.submit

    def submit(*args, **kwargs):
        seq = original_submit(*args, **kwargs)
        if kwargs.get("spec") is not None and seq.policy not in policies:
            grouped(seq)
        return seq

    monkeypatch.setattr(llm, "submit", submit)
    others = [("The quick brown fox", PromptLookupConfig()), ("def add(a, b):", PromptLookupConfig())]
    _isolated(llm, ("The quick brown fox", PromptLookupConfig(), None, None, False), inject, "verifying", others=others)


def test_a_failing_on_step_cancels_the_requests_drafts(llm):
    """An SSR request fails while its draft runs: the draft is cancelled and its slot freed."""

    def inject(seq):
        original = seq.policy.on_step

        def on_step(engine, s, outcome):
            if any(not child.is_finished for child in s.children):
                raise Boom("injected on_step")
            return original(engine, s, outcome)

        seq.policy.on_step = on_step

    spec = SSRConfig(draft_budgets=[4], max_draft_len=48)
    faulty = _isolated(llm, ("Think about it", spec, _params(max_tokens=40), None, True), inject, "step hook")
    assert faulty.children and all(child.finish_reason.value == "cancelled" for child in faulty.children)


@pytest.mark.parametrize("where", ["after", "inside"])
def test_a_failing_on_finish(llm, where):
    """The hook raises after its work, or inside it (the policy's own bookkeeping): either way the
    request fails alone, and its draft model's slot is freed all the same."""
    if where == "after":

        def inject(seq):
            seq.policy.on_finish = _failing_after(0, None, "injected on_finish")
            original = seq.policy.on_finish

            def on_finish(engine, s):
                type(s.policy).on_finish(s.policy, engine, s)
                original(engine, s)

            seq.policy.on_finish = on_finish
    else:

        def inject(seq):
            original = seq.policy._consume

            def consume(engine, s):
                if engine is None:  # only the finish hook consumes without an engine
                    raise Boom("injected on_finish")
                return original(engine, s)

            seq.policy._consume = consume

    spec = DraftModelConfig(num_speculative_tokens=4)
    faulty = _isolated(llm, ("Records: name=Alice", spec, None, None, False), inject, "finish hook")
    assert len(faulty.output_ids) == MAX_TOKENS  # it had finished its output when the hook failed


def test_a_failing_sibling_fails_its_whole_request(llm):
    """n > 1: one sample's fault ends every sample of that request, and only that request."""

    def inject(seq):
        sibling = seq.siblings[0]
        sibling.policy.propose = _failing_after(2, sibling.policy.propose, "injected propose")

    faulty = _isolated(
        llm,
        ("Records: name=Alice", PromptLookupConfig(), _params(n=2, temperature=1.0, seed=1), None, False),
        inject,
        "proposing",
    )
    assert faulty.siblings[0].finish_reason.value == "error"
