"""Suffix index and proposer: counts, path probabilities, budgets, longest matches, eviction."""

from __future__ import annotations

import random

import pytest

from selfspec.spec import (
    CONTEXT_SOURCE,
    CountsTree,
    GlobalSuffixHistory,
    Proposer,
    SpeculationLimits,
    SuffixConfig,
    SuffixIndex,
    SuffixProposer,
)

UNLIMITED = SpeculationLimits(max_spec_tokens=1000, spec_factor=1000.0)


# ----------------------------------------------------------------- brute-force references


def occurrences(sources: list[list[int]], path: list[int]) -> int:
    n = len(path)
    return sum(1 for s in sources for i in range(len(s) - n + 1) if s[i : i + n] == path)


def all_paths(sources: list[list[int]], max_depth: int) -> set[tuple[int, ...]]:
    return {tuple(s[i : i + d]) for s in sources for d in range(1, max_depth + 1) for i in range(len(s) - d + 1)}


def tree_paths(tree: CountsTree) -> dict[tuple[int, ...], int]:
    """Every node of the tree as path -> count (zero-count nodes included, to catch leaks)."""
    found: dict[tuple[int, ...], int] = {}
    stack = [((), tree._root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            found[path + (token,)] = child.count
            stack.append((path + (token,), child))
    return found


def longest_continuable_match(context: list[int], source: list[int]) -> tuple[int, int] | None:
    """(end, length) of the longest context suffix occurring in `source` before its last
    position, at its most recent such occurrence."""
    best: tuple[int, int] | None = None
    for end in range(len(source) - 1):
        length = 0
        while length <= end and length < len(context) and context[-1 - length] == source[end - length]:
            length += 1
        if length and (best is None or length >= best[1]):
            best = (end, length)
    return best


# ------------------------------------------------------------------------ counts tree


def test_counts_equal_occurrences_and_appends_equal_bulk_add() -> None:
    rng = random.Random(0)
    sources = [[rng.randrange(4) for _ in range(rng.randrange(5, 60))] for _ in range(3)]
    bulk, incremental = CountsTree(4), CountsTree(4)
    for i, s in enumerate(sources):
        bulk.add(f"s{i}", s)
        incremental.add(f"s{i}")
        for token in s:
            incremental.extend(f"s{i}", [token])
    expected = {path: occurrences(sources, list(path)) for path in all_paths(sources, 4)}
    assert tree_paths(bulk) == expected
    assert tree_paths(incremental) == expected
    assert bulk.total_tokens == sum(map(len, sources))
    assert bulk.count([9]) == 0


def test_removing_a_source_restores_counts_exactly() -> None:
    rng = random.Random(1)
    sources = [[rng.randrange(5) for _ in range(40)] for _ in range(3)]
    tree = CountsTree(5)
    for i, s in enumerate(sources):
        tree.add(f"s{i}", s)
    tree.remove("s1")
    reference = CountsTree(5)
    reference.add("s0", sources[0])
    reference.add("s2", sources[2])
    assert tree_paths(tree) == tree_paths(reference)  # no zero-count leftovers either
    assert tree.names == ["s0", "s2"]
    tree.remove("s0")
    tree.remove("s2")
    assert tree_paths(tree) == {} and tree.total_tokens == 0


def test_path_probabilities_follow_child_over_parent_counts() -> None:
    tree = CountsTree(4)
    tree.add("d", [1, 2, 3, 1, 2, 4, 1, 2, 3])
    candidate = tree.speculate([7, 1, 2], UNLIMITED, max_tokens=10, select="longest")
    # "1 2" occurs 3 times, followed by 3 twice and 4 once; "1 2 3" twice, "1 2 3 1" once.
    assert candidate.match_len == 2
    assert candidate.tokens == [3, 1]
    assert candidate.probs == pytest.approx([2 / 3, 1 / 3])
    assert candidate.score == pytest.approx(1.0)


def test_score_selection_prefers_the_better_expected_run() -> None:
    tree = CountsTree(4)
    tree.add("d", [1, 2, 3, 1, 2, 4, 1, 2, 3])
    candidate = tree.speculate([7, 1, 2], UNLIMITED, max_tokens=10, select="score")
    # match "2": 3 (2/3) -> 1 (1/3) -> 2 (1/3): score 4/3 beats the "1 2" match's 1.0.
    assert (candidate.match_len, candidate.tokens) == (1, [3, 1, 2])
    assert candidate.score == pytest.approx(4 / 3)


def test_greedy_path_takes_a_most_frequent_child_every_step() -> None:
    rng = random.Random(2)
    sources = [[rng.randrange(3) for _ in range(80)] for _ in range(2)]
    tree = CountsTree(6)
    for i, s in enumerate(sources):
        tree.add(f"s{i}", s)
    tree.remove("s1")  # forces lazy recomputation of cached best children
    live = [sources[0]]
    for _ in range(30):
        context = [rng.randrange(3) for _ in range(6)]
        candidate = tree.speculate(context, UNLIMITED, max_tokens=10, select="longest")
        path = context[-candidate.match_len :]
        prob = 1.0
        for token, p in zip(candidate.tokens, candidate.probs):
            siblings = [occurrences(live, path + [t]) for t in range(3)]
            assert occurrences(live, path + [token]) == max(siblings)
            prob *= occurrences(live, path + [token]) / occurrences(live, path)
            assert p == pytest.approx(prob)
            path = path + [token]
        assert candidate.match_len + len(candidate.tokens) <= 6


def test_depth_four_proposes_at_most_three_tokens() -> None:
    index = SuffixIndex("tree", max_depth=4)
    index.add_source("d", list(range(100)))
    candidate = index.speculate([10], UNLIMITED, max_tokens=50)
    assert candidate.tokens == [11, 12, 13]


def test_ties_go_to_the_most_recent_continuation() -> None:
    tree = CountsTree(4)
    tree.add("d", [5, 1, 5, 2])
    assert tree.speculate([5], UNLIMITED, 1).tokens == [2]
    tree.extend("d", [5, 1])
    assert tree.speculate([5], UNLIMITED, 1).tokens == [1]


def test_min_token_prob_stops_the_path() -> None:
    tree = CountsTree(6)
    tree.add("d", [1, 2, 3, 1, 2, 4, 1, 2, 4, 7, 1, 5])
    limits = SpeculationLimits(max_spec_tokens=10, spec_factor=10.0, min_token_prob=0.5)
    # After "1": 2 (3/4), then 4 (3/4 * 2/3 = 1/2), then 1 or 7 (1/2 * 1/2 = 1/4 < 0.5): stop.
    candidate = tree.speculate([1], limits, 10)
    assert candidate.tokens == [2, 4]
    assert candidate.probs == pytest.approx([0.75, 0.5])


@pytest.mark.parametrize(
    ("match_len", "limits", "max_tokens", "expected"),
    [
        (1, SpeculationLimits(16, 4.0, 0.0), 100, 4),
        (3, SpeculationLimits(16, 4.0, 0.0), 100, 12),
        (5, SpeculationLimits(16, 4.0, 0.0), 100, 16),
        (5, SpeculationLimits(16, 4.0, 0.0), 7, 7),
        (2, SpeculationLimits(16, 0.5, 1.0), 100, 2),
        (1, SpeculationLimits(16, 0.3, 0.0), 100, 0),
        (3, SpeculationLimits(16, 1.0, -5.0), 100, 0),
    ],
)
def test_budget_formula(match_len: int, limits: SpeculationLimits, max_tokens: int, expected: int) -> None:
    assert limits.budget(match_len, max_tokens) == expected


def test_budget_limits_tree_and_longest_match_proposals() -> None:
    source = list(range(200))
    limits = SpeculationLimits(max_spec_tokens=16, spec_factor=2.0, spec_offset=1.0)
    tree = SuffixIndex("tree", max_depth=64)
    tree.add_source("d", source)
    assert tree.speculate([50], limits, 100).tokens == [51, 52, 53]  # 1 * 2 + 1
    longest = SuffixIndex("longest_match")
    longest.add_source("d", source)
    assert longest.speculate([0, 5, 6, 7], limits, 100).tokens == list(range(8, 15))  # 3 * 2 + 1
    assert longest.speculate([0, 5, 6, 7, 8, 9, 10, 11, 12, 13], limits, 100).tokens == list(range(14, 30))
    assert longest.speculate([0, 5, 6, 7, 8, 9, 10, 11, 12, 13], limits, 5).tokens == list(range(14, 19))


@pytest.mark.parametrize("mode", ["tree", "longest_match"])
def test_no_proposal_when_nothing_matches(mode: str) -> None:
    proposer = SuffixProposer(SuffixConfig(mode=mode))
    assert isinstance(proposer, Proposer) and proposer.mode == mode
    assert proposer.propose([1, 2, 3], 8).tokens == []
    proposer.add_source("draft:0", [10, 11, 12, 13])
    assert proposer.propose([1, 2, 3], 8).tokens == []
    assert proposer.last_candidate is None
    assert proposer.propose([1, 2, 3, 13], 8).tokens == []  # matches only at the end: nothing follows
    assert proposer.propose([1, 2, 3, 13, 11], 8).tokens == [12, 13]


# ------------------------------------------------------------------- longest match mode


def test_long_match_in_the_middle_of_a_500_token_draft() -> None:
    rng = random.Random(3)
    draft = [rng.randrange(1000) for _ in range(500)]  # repeats single tokens, not 3-grams
    proposer = SuffixProposer(SuffixConfig(mode="longest_match", max_spec_tokens=64))
    proposer.add_source("draft:0", draft)
    context = [rng.randrange(1000, 2000) for _ in range(300)]
    assert proposer.propose(context, 64).tokens == []
    for followed in range(1, 241):  # the answer follows the draft from its middle
        context.append(draft[199 + followed])
        proposal = proposer.propose(context, 64)
        if followed <= 10:
            end, length = longest_continuable_match(context, draft)
            assert proposer.last_candidate.match_len == length
            assert proposal.tokens == draft[end + 1 : end + 1 + min(64, 4 * length)]
        if followed >= 3:
            assert proposal.tokens == draft[200 + followed : 200 + followed + min(64, 4 * followed)]
    assert proposer.last_candidate.match_len == 240
    # A mismatch re-anchors on the next matching tokens.
    context += [5000, draft[450], draft[451], draft[452]]
    assert proposer.propose(context, 64).tokens == draft[453 : 453 + 12]


def test_longest_match_equals_brute_force_while_both_sides_grow() -> None:
    rng = random.Random(4)
    for trial in range(6):
        alphabet = 2 + trial % 3
        index = SuffixIndex("longest_match")
        source = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 20))]
        index.add_source("d", source)
        context: list[int] = []
        for _ in range(150):
            if rng.random() < 0.4:
                grow = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
                index.extend_source("d", grow)
                source += grow
            else:
                context += [rng.randrange(alphabet) for _ in range(rng.randrange(1, 3))]
            candidate = index.speculate(context, UNLIMITED, max_tokens=5)
            expected = longest_continuable_match(context, source)
            if expected is None:
                assert candidate is None
            else:
                end, length = expected
                assert (candidate.match_len, candidate.tokens) == (length, source[end + 1 : end + 6])


def test_indexed_context_proposes_from_its_own_earlier_occurrence() -> None:
    rng = random.Random(5)
    index = SuffixIndex("longest_match", index_context=True)
    context: list[int] = []
    for _ in range(200):
        context.append(rng.randrange(3))
        candidate = index.speculate(context, UNLIMITED, max_tokens=4)
        expected = longest_continuable_match(context, context)
        if expected is None:
            assert candidate is None
        else:
            end, length = expected
            assert (candidate.match_len, candidate.tokens, candidate.source) == (
                length,
                context[end + 1 : end + 5],
                CONTEXT_SOURCE,
            )


def test_several_drafts_longest_match_wins_ties_to_newest() -> None:
    index = SuffixIndex("longest_match")
    index.add_source("draft:0", [1, 2, 3, 4, 5, 6])
    index.add_source("draft:1", [9, 3, 4, 7, 8])
    # "2 3 4" occurs only in draft:0; "3 4" in both.
    assert index.speculate([0, 2, 3, 4], UNLIMITED, 10).tokens == [5, 6]
    assert index.speculate([0, 2, 3, 4, 0, 3, 4], UNLIMITED, 10).source == "draft:1"
    index.remove_source("draft:1")
    assert index.speculate([0, 2, 3, 4, 0, 3, 4, 5], UNLIMITED, 10).tokens == [6]


def test_divergent_context_resynchronises() -> None:
    proposer = SuffixProposer(SuffixConfig(mode="longest_match", max_spec_tokens=8))
    proposer.add_source("d", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert proposer.propose([0, 1, 2, 3], 8).tokens == [4, 5, 6, 7, 8, 9]
    # A shorter, different sequence (rollback or reuse) is detected and re-read.
    assert proposer.propose([0, 6], 8).tokens == [7, 8, 9]
    proposer.reset()
    assert proposer.propose([5, 6, 7], 8).tokens == [8, 9]


@pytest.mark.parametrize("mode", ["tree", "longest_match"])
def test_indexed_context_is_rebuilt_after_a_rollback(mode: str) -> None:
    proposer = SuffixProposer(SuffixConfig(mode=mode, index_context=True))
    assert proposer.propose([1, 2, 3, 9, 1, 2], 8).tokens[:2] == [3, 9]
    # A different, shorter sequence: its own history only, nothing from the old one.
    assert proposer.propose([4, 1, 5, 1], 8).tokens[:1] == [5]
    assert proposer.index.source_length(CONTEXT_SOURCE) == 4
    assert proposer.propose([4, 1, 5, 1, 2], 8).tokens == []


def test_tree_mode_indexes_prompt_and_output_when_asked() -> None:
    proposer = SuffixProposer(SuffixConfig(index_context=True))
    context = [1, 2, 3, 4, 9, 9, 1, 2]
    # "2" -> 3 4 9 (depth 4 leaves three tokens) scores 1.5; "1 2" -> 3 4 scores 1.0.
    assert proposer.propose(context, 8).tokens == [3, 4, 9]
    assert proposer.source_names == [CONTEXT_SOURCE]
    assert proposer.index.source_length(CONTEXT_SOURCE) == len(context)
    with pytest.raises(KeyError):
        proposer.add_source(CONTEXT_SOURCE, [1])


# ------------------------------------------------------------------------ global history


def test_global_history_evicts_oldest_by_responses_and_tokens() -> None:
    history = GlobalSuffixHistory(max_depth=3, max_responses=2, max_tokens=10)
    history.add_response("a", [1, 2, 3])
    history.add_response("b", [4, 5, 6])
    history.add_response("c", [7, 8])
    assert history.keys == ["b", "c"] and history.total_tokens == 5
    reference = CountsTree(3)
    reference.add("b", [4, 5, 6])
    reference.add("c", [7, 8])
    assert tree_paths(history.tree) == tree_paths(reference)
    assert history.extend_response("c", [9, 9, 9, 9, 9])  # 3 + 7 = 10 tokens: fits
    assert history.extend_response("c", [9])  # 11 > 10: "b" goes, "c" stays
    assert history.keys == ["c"] and history.total_tokens == 8
    assert not history.extend_response("c", [9, 9, 9])  # alone over budget: evicted itself
    assert len(history) == 0 and history.total_tokens == 0 and tree_paths(history.tree) == {}
    assert not history.extend_response("c", [1])


def test_proposer_consults_the_global_history() -> None:
    history = GlobalSuffixHistory(max_depth=4)
    history.add_response("old", [20, 21, 22, 23])
    tree = SuffixProposer(SuffixConfig(), global_history=history)
    tree.add_source("draft:0", [1, 2, 3])
    assert tree.propose([0, 1], 8).tokens == [2, 3]
    assert tree.propose([0, 1, 21], 8).tokens == [22, 23]
    assert tree.last_candidate.source == "global"
    longest = SuffixProposer(SuffixConfig(mode="longest_match"), global_history=history)
    longest.add_source("draft:0", [1, 2, 3])
    assert longest.propose([0, 21], 8).tokens == [22, 23]
    history.remove_response("old")
    assert longest.propose([0, 21, 22], 8).tokens == []
