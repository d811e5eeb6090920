"""Grammar constraints in the engine: masks per verified position, rollback, and exactness.

Every speculative method under a grammar must commit exactly the tokens of constrained greedy
decoding without speculation; the grammar state of each verified position is the one after the
proposal tokens before it. The "bigram" Llama (attention output zeroed) makes drafts match, so
proposals are accepted and the masks of later verified positions decide real tokens.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from selfspec.config import PromptLookupConfig, SuffixDecodingConfig
from selfspec.engine.config import EngineConfig
from selfspec.engine.constraint import ConstraintViolation
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z ]{1,10}$"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "maxItems": 3},
    },
    "required": ["name", "ok", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["What is 12 + 30?", "hello", "Records: name=Alice, age=30", "def add(a, b):", "The quick brown fox"]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def bigram_llm(tok):
    model = tiny_model("llama", len(tok), seed=5, num_layers=2, eos_token_id=tok.eos_token_id)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    return LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=16, max_len=384))


@pytest.fixture(scope="module")
def random_llm(tok):
    model = tiny_model("qwen3", len(tok), seed=3, num_layers=2, eos_token_id=tok.eos_token_id)
    return LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=16, max_len=384))


def _run_all(llm, prompts, spec, *, thinking, params=None, grammar=None):
    """Every prompt in one continuous batch (as the server runs them)."""
    grammar = grammar or llm.grammars.json_schema(SCHEMA)
    seqs = [
        llm.submit(
            prompt,
            params or SamplingParams(max_tokens=90),
            spec=spec,
            thinking=thinking,
            limits=ThinkingLimits(cot_cap=8) if thinking else None,
            grammar=grammar,
        )
        for prompt in prompts
    ]
    llm.run_until_done(seqs)
    return [llm.result(seq) for seq in seqs]


def _run(llm, prompt, spec, **kwargs):
    return _run_all(llm, [prompt], spec, **kwargs)[0]


def test_masks_follow_the_proposal_and_leave_the_state_unchanged(bigram_llm, tok):
    grammars = bigram_llm.grammars
    grammar = grammars.json_schema(SCHEMA)

    def enc(text):
        return tok.encode(text, add_special_tokens=False)

    prefix = enc('{"name"')
    constraint = grammars.constraint(grammar, start=0)
    constraint.sync(prefix)
    before, _ = constraint.masks([])
    valid_part = enc(': "ab", "ok": ')  # a value must follow, not a "}"
    proposal = valid_part + enc("}") + enc("true")
    masks, valid = constraint.masks(proposal)
    assert valid == len(valid_part) and masks.shape[0] == valid + 1  # cut at the first refused token
    for i in range(valid + 1):  # row i: the state after the proposal's first i tokens
        fresh = grammars.constraint(grammar, start=0)
        fresh.sync(prefix + proposal[:i])
        assert torch.equal(masks[i], fresh.masks([])[0][0])
    assert torch.equal(constraint.masks([])[0], before)  # rolled back


def test_sync_rolls_back_truncations_and_refuses_forced_tokens(bigram_llm, tok):
    grammars = bigram_llm.grammars
    text = tok.encode('{"name": "ab", "ok": true, "tags": []}', add_special_tokens=False)
    constraint = grammars.constraint(grammars.json_schema(SCHEMA), start=2)
    constraint.sync([7, 7] + text)
    constraint.sync([7, 7] + text[:4])  # a policy truncated the output
    fresh = grammars.constraint(grammars.json_schema(SCHEMA), start=2)
    fresh.sync([7, 7] + text[:4])
    assert torch.equal(constraint.masks([])[0], fresh.masks([])[0])
    with pytest.raises(ConstraintViolation):
        constraint.sync([7, 7] + text[:4] + tok.encode("}", add_special_tokens=False))


def test_the_gate_opens_after_the_end_of_thinking_marker(bigram_llm, tok):
    grammars = bigram_llm.grammars
    end = bigram_llm.thinking_format.end_variants
    constraint = grammars.constraint(grammars.json_schema(SCHEMA), start=0, open_after=end)
    constraint.sync(tok.encode("free } text", add_special_tokens=False))
    closed, _ = constraint.masks([])
    assert not closed[0, tok.eos_token_id] and closed[0].sum() == closed.shape[1] - 1  # only stop tokens masked
    close = list(end[0])
    masks, valid = constraint.masks(close + tok.encode("}", add_special_tokens=False))
    assert valid == len(close) and masks[1 : len(close)].equal(closed.expand(len(close) - 1, -1))
    assert masks[len(close)].sum() < closed.sum() - 1  # the grammar's first position


@pytest.mark.parametrize("thinking", [False, True], ids=["answer", "thinking"])
def test_speculation_under_a_schema_is_constrained_greedy(bigram_llm, random_llm, thinking):
    """SSR, suffix decoding and prompt lookup commit the tokens of constrained greedy decoding,
    the outputs validate, and proposals were accepted under the grammar."""
    modes = {
        "suffix": SuffixDecodingConfig(),
        "ngram": PromptLookupConfig(),
        "ssr": SSRConfig(draft_budgets=[4], max_draft_len=48),
    }
    accepted = {name: 0 for name in modes}
    for llm in (bigram_llm, random_llm):
        bases = _run_all(llm, PROMPTS, None, thinking=thinking)
        for base in bases:
            assert base.finish_detail in ("eos", "grammar complete"), base.finish_detail
            jsonschema.validate(json.loads(base.answer_text if thinking else base.text), SCHEMA)
        for name, spec in modes.items():
            if name == "ssr" and not thinking:
                continue
            for prompt, base, out in zip(PROMPTS, bases, _run_all(llm, PROMPTS, spec, thinking=thinking)):
                assert out.token_ids == base.token_ids, (name, prompt)
                accepted[name] += out.metrics["accepted_tokens"]
    assert accepted["suffix"] > 0 and accepted["ngram"] > 0
    if thinking:
        assert accepted["ssr"] > 0


def test_sampling_under_a_schema_is_valid_and_seeded(bigram_llm):
    params = SamplingParams(max_tokens=90, temperature=1.0, seed=11)
    outs = [_run(bigram_llm, "hello", spec, thinking=False, params=params) for spec in (None, SuffixDecodingConfig())]
    for out in outs:
        jsonschema.validate(json.loads(out.text), SCHEMA)
    again = _run(
        bigram_llm, "hello", None, thinking=False, params=SamplingParams(max_tokens=90, temperature=1.0, seed=11)
    )
    assert again.token_ids == outs[0].token_ids


def test_regex_and_ebnf_grammars(bigram_llm):
    grammars = bigram_llm.grammars
    out = _run(bigram_llm, "hello", None, thinking=False, grammar=grammars.regex(r"[0-9]{3}-(yes|no)"))
    assert out.finish_detail in ("eos", "grammar complete")
    assert out.text[:4].strip("0123456789") == "-" and out.text[4:] in ("yes", "no")
    out = _run(bigram_llm, "hello", SuffixDecodingConfig(), thinking=False, grammar=grammars.ebnf('root ::= "a" | "b"'))
    assert out.text in ("a", "b")


def test_the_compile_cache_is_bounded_and_reused(random_llm):
    """A server compiles many distinct schemas over its life: xgrammar's cache must not keep
    them all (unbounded by default), yet a repeated schema must come from it."""
    from selfspec.engine.grammar import COMPILE_CACHE_BYTES

    grammars = random_llm.grammars
    assert grammars._compiler.cache_limit_bytes == COMPILE_CACHE_BYTES
    schema = {"type": "object", "properties": {"cache_probe": {"type": "integer"}}, "required": ["cache_probe"]}
    grammars.compile(grammars.json_schema(schema))
    size = grammars._compiler.get_cache_size_bytes()
    assert 0 < size <= COMPILE_CACHE_BYTES
    grammars.compile(grammars.json_schema(schema))
    assert grammars._compiler.get_cache_size_bytes() == size  # the same schema again: a cache hit
