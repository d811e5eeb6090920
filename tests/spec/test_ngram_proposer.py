"""Prompt lookup: the trailing n-gram's latest earlier occurrence, largest n first."""

from __future__ import annotations

import random

import pytest

from selfspec.spec import NgramProposer, Proposer


def reference_lookup(context: list[int], max_ngram: int, min_ngram: int, num_tokens: int) -> list[int]:
    """Direct scan, as transformers does it, but taking the latest earlier occurrence."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(context):
            continue
        gram = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == gram:
                return context[start + n : start + n + num_tokens]
    return []


def test_is_a_proposer() -> None:
    assert isinstance(NgramProposer(), Proposer)


def test_largest_ngram_wins_over_a_later_shorter_match() -> None:
    proposer = NgramProposer(max_ngram=3, min_ngram=1, num_tokens=3)
    context = [1, 2, 3, 7, 8, 9, 3, 5, 5, 1, 2, 3]
    # "1 2 3" occurred at the start (followed by 7 8 9); "3" alone occurred later (5 5).
    assert proposer.propose(context, 10).tokens == [7, 8, 9]


def test_latest_occurrence_and_truncation_at_the_end() -> None:
    proposer = NgramProposer(max_ngram=2, min_ngram=2, num_tokens=10)
    context = [4, 5, 1, 4, 5, 2, 3, 4, 5]
    assert proposer.propose(context, 10).tokens == [2, 3, 4, 5]  # runs to the end, no further
    assert proposer.propose(context, 2).tokens == [2, 3]  # the caller's cap


def test_overlapping_occurrence_of_a_repeated_token() -> None:
    proposer = NgramProposer(max_ngram=2, min_ngram=1, num_tokens=4)
    assert proposer.propose([6, 6, 6], 4).tokens == [6]


def test_no_match_and_too_short_context() -> None:
    proposer = NgramProposer(max_ngram=3, min_ngram=2, num_tokens=5)
    assert proposer.propose([1], 5).tokens == []
    assert proposer.propose([1, 2, 3, 4], 5).tokens == []
    assert proposer.propose([1, 2, 3, 4, 1], 5).tokens == []  # only a 1-gram repeats; min is 2
    assert proposer.propose([1, 2, 3, 4, 1], 0).tokens == []


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 1), (4, 2), (1, 1)])
def test_incremental_index_equals_a_full_scan(max_ngram: int, min_ngram: int) -> None:
    rng = random.Random(max_ngram * 10 + min_ngram)
    proposer = NgramProposer(max_ngram=max_ngram, min_ngram=min_ngram, num_tokens=6)
    context: list[int] = []
    for _ in range(300):
        context += [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
        assert proposer.propose(context, 6).tokens == reference_lookup(context, max_ngram, min_ngram, 6)


def test_rollback_and_reset_rebuild_the_index() -> None:
    proposer = NgramProposer(max_ngram=2, min_ngram=1, num_tokens=3)
    long_context = [1, 2, 3, 9, 9, 1, 2]
    assert proposer.propose(long_context, 3).tokens == [3, 9, 9]
    rolled_back = [5, 6, 5]  # shorter and different: detected, index rebuilt
    assert proposer.propose(rolled_back, 3).tokens == [6, 5]
    proposer.reset()
    assert proposer.propose([7, 8, 7], 3).tokens == [8, 7]


def test_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        NgramProposer(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError):
        NgramProposer(min_ngram=0)


def test_a_fork_proposes_what_a_fresh_proposer_over_the_same_context_would():
    """An SSR draft's proposer is forked from its parent's (`NgramProposer.fork`): the draft's
    context starts with what the parent indexed, then goes its own way; the fork must propose
    exactly what a proposer that indexed the draft's whole context from scratch proposes, and the
    parent must not see the draft's tokens."""
    rng = random.Random(3)
    parent_context = [rng.randrange(12) for _ in range(300)]
    parent = NgramProposer()
    parent.propose(parent_context[:250], 10)  # the parent indexed a prefix of what it has now
    draft = parent.fork()
    draft_context = parent_context + [99, 98]  # the end-of-thinking marker, then the draft's answer
    fresh = NgramProposer()
    for _ in range(60):
        draft_context.append(rng.randrange(12))
        assert draft.propose(draft_context, 10).tokens == fresh.propose(draft_context, 10).tokens
    parent_context.extend(rng.randrange(12) for _ in range(40))
    assert parent.propose(parent_context, 10).tokens == NgramProposer().propose(parent_context, 10).tokens


def test_an_ssr_draft_forks_its_parents_cot_proposer():
    from selfspec.spec.ssr_core import SSRConfig, draft_proposer

    config = SSRConfig(speculate_thinking=True, thinking_speculator="ngram")
    parent = NgramProposer()
    parent.propose(list(range(40)) * 3, 10)
    forked = draft_proposer(config, [], context_proposer=parent)
    assert isinstance(forked, NgramProposer) and forked is not parent
    assert forked._latest == parent._latest and forked._latest[3] is not parent._latest[3]
    assert draft_proposer(config, []) is not None  # without a parent proposer: a fresh one
