"""`selfspec_bench.context_fit`: which samples fit the model's context, and the engine's size."""

from __future__ import annotations

from selfspec.testing.tiny import tiny_tokenizer
from selfspec.thinking.format import ThinkingFormat, build_prompt_ids
from selfspec_bench.context_fit import CLOSE_MARGIN, fit_to_context
from selfspec_bench.datasets.sample import BenchSample, user_message


def test_context_fit_sizes_the_engine_to_the_longest_runnable_sample():
    tok = tiny_tokenizer()
    fmt = ThinkingFormat.detect(tok)
    samples = [BenchSample(f"s/{n}", "s", user_message("word " * n)) for n in (5, 40, 400)]
    lengths = [len(build_prompt_ids(tok, s.messages, fmt)) for s in samples]
    context = lengths[1] + 100 + 50 + CLOSE_MARGIN  # the middle sample fits exactly
    fit = fit_to_context(samples, tok, fmt, context, cot_cap=100, answer_cap=50)
    assert [s.id for s in fit.runnable] == ["s/5", "s/40"] and fit.max_len == context
    assert [s["sample_id"] for s in fit.skipped] == ["s/400"] and fit.skipped[0]["prompt_tokens"] == lengths[2]
    short = fit_to_context(samples[:1], tok, fmt, 10_000, cot_cap=100, answer_cap=50)
    assert short.max_len == lengths[0] + 100 + 50 + CLOSE_MARGIN and not short.skipped
    none = fit_to_context(samples[2:], tok, fmt, context, cot_cap=100, answer_cap=50)
    assert not none.runnable and none.max_len == 100 + 50 + CLOSE_MARGIN + 1  # nothing runs: the budgets' room
