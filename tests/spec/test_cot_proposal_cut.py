"""CoT proposals stop before the token that completes the end-of-thinking marker, and only there.

A prompted thinker's marker is several ordinary tokens (SmolLM2: "</", "think", ">"; the close adds
newlines around it): cutting a proposal at any of them cut nearly every line of a chain of thought
short. On the real thinker (CPU, fp32) an SSR request then verified 2.35 tokens per step against
prompt lookup's 2.6 on the same item; these tests pin down what is cut and what is not."""

from __future__ import annotations

from selfspec.spec.ssr_core import cut_before_end

END = [(9, 17, 4), (22, 17, 4)]  # "</" "think" ">" and " </" "think" ">"
NEWLINE, ARROW = 1, 4  # ">" is also the end of "->"


def test_marker_tokens_inside_ordinary_text_do_not_cut():
    proposal = [5, NEWLINE, 6, ARROW, 7, 17, 8, 9, 3]
    assert cut_before_end(proposal, [2, 3], END) == proposal


def test_cut_before_the_completing_token():
    assert cut_before_end([5, 9, 17, 4, 6], [2], END) == [5, 9, 17]
    assert cut_before_end([5, 22, 17, 4], [2], END) == [5, 22, 17]
    # The first complete marker decides, whichever variant it is.
    assert cut_before_end([22, 17, 4, 9, 17, 4], [], END) == [22, 17]


def test_a_marker_begun_in_the_context_counts():
    assert cut_before_end([17, 4, 6], [2, 9], END) == [17]
    assert cut_before_end([4, 6], [9, 17], END) == []
    assert cut_before_end([4, 6], [17], END) == [4, 6]  # "think" alone does not open a marker


def test_single_token_markers_and_none():
    assert cut_before_end([5, 6, 99, 7], [1], [(99,)]) == [5, 6]
    assert cut_before_end([5, 6], [1], []) == [5, 6]
    assert cut_before_end([], [9, 17], END) == []


def _naive_cut(tokens, context, variants):
    """The definition: the first i such that context + tokens[: i + 1] ends with a variant."""
    joined = list(context)
    for i, token in enumerate(tokens):
        joined.append(token)
        if any(len(joined) >= len(v) and tuple(joined[-len(v) :]) == tuple(v) for v in variants):
            return list(tokens[:i])
    return list(tokens)


def test_matches_the_definition_on_random_text():
    import random

    rng = random.Random(0)
    for _ in range(3000):
        variants = [
            tuple(rng.choice((4, 9, 17, 22)) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 2))
        ]
        context = [rng.choice((1, 4, 9, 17, 22)) for _ in range(rng.randint(0, 4))]
        tokens = [rng.choice((1, 4, 9, 17, 22)) for _ in range(rng.randint(0, 10))]
        assert cut_before_end(tokens, context, variants) == _naive_cut(tokens, context, variants), (
            tokens,
            context,
            variants,
        )
