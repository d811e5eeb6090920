"""Per-token grammar mask cost of xgrammar, llguidance and outlines-core on one JSON schema.

For each engine and tokenizer: compile the schema once (timed), then walk a valid JSON text token
by token, computing the next-token mask and advancing the matcher at each token (timed per token).
The mask is what the sampler needs at every position (and at every verified position of a
speculative proposal), so its cost per token is what an engine adds to a decode step.

Usage: python benchmarks/structured_output/mask_cost.py [--tokenizer DIR]  (default: the tiny test
tokenizer and SmolLM2's 49k one from the packaged model's cache)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}
TEXT = json.dumps(
    {"name": "Alice Smith", "age": 30, "tags": ["admin", "dev", "ops"], "address": {"city": "Paris", "zip": "75001"}}
)


def walk_xgrammar(tok, ids, vocab):
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    compile_s = time.perf_counter() - t0
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, vocab)
    times = []
    for t in ids:
        s = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        assert matcher.accept_token(t), t
        times.append(time.perf_counter() - s)
    return setup_s, compile_s, times


def walk_llguidance(tok, ids, vocab):
    import llguidance
    import llguidance.hf
    import llguidance.torch

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    matcher = llguidance.LLMatcher(lltok, grammar)
    compile_s = time.perf_counter() - t0
    assert not matcher.is_error(), matcher.get_error()
    mask = llguidance.torch.allocate_token_bitmask(1, vocab)
    times = []
    for t in ids:
        s = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, mask, 0)
        assert matcher.consume_token(t), (t, matcher.get_error())
        times.append(time.perf_counter() - s)
    return setup_s, compile_s, times


def walk_outlines(tok, ids, vocab):
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    eos = tok.eos_token_id
    table: dict[str, list[int]] = {}
    for token, i in tok.get_vocab().items():
        if i == eos:
            continue
        table.setdefault(token, []).append(i)
    # outlines-core matches token *strings*; byte-level BPE symbols are mapped back to bytes by its
    # own from_pretrained, which needs the hub, so the raw symbols are passed here (same sizes).
    vocabulary = Vocabulary(eos, table)
    setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), vocabulary)
    compile_s = time.perf_counter() - t0
    guide = Guide(index)
    times = []
    for t in ids:
        s = time.perf_counter()
        allowed = guide.get_tokens()
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[torch.as_tensor(allowed)] = True
        if t not in allowed:
            return setup_s, compile_s, times  # symbol/byte mismatch of the raw vocabulary: stop the walk
        guide.advance(t)
        times.append(time.perf_counter() - s)
    return setup_s, compile_s, times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", action="append", help="tokenizer directories (default: tiny + SmolLM2)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizers = []
    if args.tokenizer:
        tokenizers = [(d, AutoTokenizer.from_pretrained(d)) for d in args.tokenizer]
    else:
        from selfspec.models import load_model
        from selfspec.testing.tiny import tiny_tokenizer

        tokenizers = [("tiny", tiny_tokenizer()), ("smollm2", load_model("smollm2").tokenizer)]
    torch.set_num_threads(1)
    for name, tok in tokenizers:
        vocab = len(tok)
        ids = tok.encode(TEXT, add_special_tokens=False)
        for engine, walk in (
            ("xgrammar", walk_xgrammar),
            ("llguidance", walk_llguidance),
            ("outlines-core", walk_outlines),
        ):
            try:
                setup_s, compile_s, times = walk(tok, ids, vocab)
            except Exception as exc:  # noqa: BLE001 - a measurement table, not a library
                print(f"{name:8s} vocab={vocab:6d} {engine:13s} failed: {exc!r}")
                continue
            us = [t * 1e6 for t in times]
            print(
                f"{name:8s} vocab={vocab:6d} {engine:13s} tokenizer setup {setup_s * 1e3:7.1f} ms, "
                f"schema compile {compile_s * 1e3:7.1f} ms; "
                f"mask+advance per token: median {statistics.median(us):7.1f} us, "
                f"p90 {sorted(us)[int(0.9 * len(us))]:7.1f} us, max {max(us):8.1f} us over {len(us)}/{len(ids)} tokens"
            )


if __name__ == "__main__":
    main()
