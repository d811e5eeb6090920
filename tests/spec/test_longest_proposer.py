"""The longer of several proposers' candidates, and the answer phase that keeps the CoT's speculator."""

from __future__ import annotations

import pytest

from selfspec.engine.policy import Proposal
from selfspec.spec.longest import LongestProposer, thinking_proposer
from selfspec.spec.ngram import NgramProposer
from selfspec.spec.ssr_core import AnswerSpeculator, SSRConfig, SSRStage
from selfspec.spec.suffix import SuffixConfig, SuffixProposer


class Fixed:
    """A proposer that always proposes the same tokens and records what it saw."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.contexts: list[list[int]] = []
        self.released = False

    def propose(self, context, max_tokens: int) -> Proposal:
        self.contexts.append(list(context))
        return Proposal(tokens=self.tokens[:max_tokens])

    def reset(self) -> None:
        self.contexts.clear()

    def release(self) -> None:
        self.released = True


def test_longest_candidate_wins_and_ties_go_to_the_first():
    short, long_, other = Fixed([1, 2]), Fixed([3, 4, 5]), Fixed([6, 7, 8])
    proposer = LongestProposer([short, long_, other])
    assert proposer.propose([9, 9], 8).tokens == [3, 4, 5]
    assert proposer.chosen_counts == [0, 1, 0]
    # The budget applies to every child: cut to 2, the first fills it and wins, the others are not asked.
    assert proposer.propose([9, 9, 9], 2).tokens == [1, 2]
    assert proposer.chosen_counts == [1, 1, 0]
    assert [len(p.contexts) for p in (short, long_, other)] == [2, 1, 1]
    proposer.release()
    assert short.released and other.released


def test_nothing_proposed_when_no_child_proposes():
    proposer = LongestProposer([Fixed([]), Fixed([])])
    assert proposer.propose([1, 2, 3], 8).tokens == []
    assert proposer.chosen_counts == [0, 0]


def test_lookup_and_suffix_combined_propose_what_the_longer_one_does():
    context = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7]
    lookup = NgramProposer(num_tokens=10).propose(context, 16).tokens
    suffix = SuffixProposer(SuffixConfig(index_context=True)).propose(context, 16).tokens
    combined = thinking_proposer("longest", SuffixConfig(index_context=True)).propose(context, 16).tokens
    assert combined == (lookup if len(lookup) >= len(suffix) else suffix)
    assert combined[:3] == [8, 9, 10]


def test_sources_reach_the_children_that_index_them():
    suffix = SuffixProposer(SuffixConfig())
    proposer = LongestProposer([NgramProposer(), suffix])
    proposer.add_source("draft:0", [1, 2, 3, 4, 5])
    assert "draft:0" in suffix.source_names


def _answer(config: SSRConfig, context_proposer) -> AnswerSpeculator:
    return AnswerSpeculator(config, end_variants=[(99,)], context_proposer=context_proposer)


def test_answer_without_a_draft_keeps_the_thinking_speculator():
    """A gate that declined every draft must not leave the answer unspeculated."""
    config = SSRConfig(draft_budgets=[10], speculate_thinking=True, thinking_speculator="ngram", gate="cost")
    answer = _answer(config, NgramProposer())
    context = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    answer.start(context, drafts=[])
    assert answer.stage is SSRStage.SUFFIX
    proposal = answer.propose(context, 8)
    assert proposal is not None and proposal.tokens[:3] == [4, 5, 6]


def test_answer_without_a_draft_or_thinking_speculation_decodes_plainly():
    answer = _answer(SSRConfig(draft_budgets=[10]), None)
    answer.start([1, 2, 3], drafts=[])
    assert answer.stage is SSRStage.PLAIN
    assert answer.propose([1, 2, 3], 8) is None


def test_autos_answer_proposes_again_right_after_a_miss():
    """Auto sizes every answer proposal by the length rule, which already proposes nothing where
    copies keep failing: a back-off on top of it skipped the steps right after a miss, where an
    answer that copies its CoT picks the copy up again (prompt lookup proposes at every step)."""
    from selfspec.spec.auto import AutoConfig

    context = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    for config, proposes_after_a_miss in ((AutoConfig().ssr_config(), True), (SSRConfig(draft_budgets=[10]), False)):
        answer = _answer(config, NgramProposer())
        answer.start(context, drafts=[])
        assert answer.propose(context, 8) is not None
        answer.on_verdict(SSRStage.SUFFIX.value, 0, 3, [7])  # nothing accepted
        assert (answer.propose(context + [7, 1, 2, 3], 8) is not None) is proposes_after_a_miss


@pytest.mark.parametrize("index_context", [True, False], ids=["context-indexed", "draft-only"])
@pytest.mark.parametrize("mode", ["longest_match", "tree"])
def test_children_not_asked_after_a_full_proposal_propose_as_if_asked_every_step(mode, index_context):
    """Prompt lookup beside a suffix index with a draft source (auto's answer proposer): steps
    where prompt lookup fills the room skip the index, which then catches up on the context; every
    proposal equals that of a proposer whose children are all asked at every step."""
    import random

    rng = random.Random(3)
    vocab = list(range(20))
    draft = [rng.choice(vocab) for _ in range(60)]
    context = [rng.choice(vocab) for _ in range(40)] + draft[:10]

    def build():
        suffix = SuffixProposer(SuffixConfig(mode=mode, index_context=index_context, max_spec_tokens=64))
        suffix.add_source("draft:0", draft)
        return LongestProposer([NgramProposer(num_tokens=8), suffix])

    class AskAll(LongestProposer):
        def propose(self, context, max_tokens):
            proposals = [p.propose(context, max_tokens) for p in self.proposers]
            best = max(proposals, key=lambda p: len(p.tokens))  # max keeps the first of equals
            return best

    lazy, eager = build(), build()
    eager = AskAll(eager.proposers)
    skipped = 0
    for step in range(120):
        room = rng.choice([1, 2, 4, 8, 16])
        got, want = lazy.propose(context, room).tokens, eager.propose(context, room).tokens
        assert got == want, (step, room, got, want)
        skipped += len(got) >= room
        # Commit one to four tokens: some from the draft (copied runs), some not.
        for _ in range(rng.randint(1, 4)):
            pos = len(context) - 40
            context = context + [draft[pos] if pos < len(draft) and rng.random() < 0.7 else rng.choice(vocab)]
    assert skipped > 10, "the case under test never arose"
