"""Incremental detokenization and the reasoning/content split of the server's responses.

The streamed deltas must concatenate to exactly the non-streamed text, must never carry
a broken UTF-8 character, and must never show a marker or stop string that the final
text drops.
"""

from __future__ import annotations

import random

import pytest

from selfspec.server.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from selfspec.server.output_text import ResponseText
from selfspec.testing.tiny import tiny_tokenizer

THINK_START, THINK_END = 3, 4  # single special tokens of the tiny tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def chunked(ids: list[int], rng: random.Random) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 4)
        out.append(ids[i : i + n])
        i += n
    return out


def test_multibyte_characters_are_never_split(tok):
    ids = enc(tok, "héllo 中文 😀 naïve ✓")
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add([t]) for t in ids]
    deltas.append(detok.flush())
    assert all(REPLACEMENT_CHAR not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids)
    # Several tokens really were needed for one character (the test exercises hold-back).
    assert any(d == "" for d in deltas[:-1])


@pytest.mark.parametrize("seed", range(6))
def test_random_ids_concatenate_to_the_full_decode(tok, seed):
    """Random ids include lone continuation bytes: permanent U+FFFD, still equal at the end."""
    rng = random.Random(seed)
    ids = [rng.randrange(len(tok)) for _ in range(120)]
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add(chunk) for chunk in chunked(ids, rng)]
    for d in deltas:
        assert not d.endswith(REPLACEMENT_CHAR)
    deltas.append(detok.flush())
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)


def stream(text: ResponseText, ids: list[int], answer_start: int | None, rng: random.Random):
    """Feed `ids` in random chunks, revealing `answer_start` once the output reaches it."""
    reasoning, content, fed = [], [], 0
    for chunk in chunked(ids, rng):
        fed += len(chunk)
        known = answer_start if answer_start is not None and fed > answer_start else None
        delta = text.update(ids[:fed], known)
        reasoning.append(delta.reasoning)
        content.append(delta.content)
    delta = text.update(ids, answer_start, finished=True)
    reasoning.append(delta.reasoning)
    content.append(delta.content)
    return reasoning, content


def test_native_markers_split_reasoning_from_content(tok):
    ids = [THINK_START] + enc(tok, "\nLet me think.\n") + [THINK_END] + enc(tok, "\n\nThe answer is 42.")
    answer_start = ids.index(THINK_END) + 1
    final = ResponseText(tok, thinking=True, start_marker="<think>", end_marker="</think>")
    final.update(ids, answer_start, finished=True)
    assert final.reasoning_text == "Let me think."
    assert final.content_text == "The answer is 42."
    for seed in range(5):
        streamed = ResponseText(tok, thinking=True, start_marker="<think>", end_marker="</think>")
        reasoning, content = stream(streamed, ids, answer_start, random.Random(seed))
        assert "".join(reasoning) == final.reasoning_text
        assert "".join(content) == final.content_text


def test_text_markers_are_held_back_until_resolved(tok):
    """A prompted model writes the end marker as ordinary text, over several tokens."""
    body, marker, answer = "Think about it <b> carefully.", "[END]", "Answer: yes."
    reasoning_ids = enc(tok, body + "\n" + marker)
    ids = reasoning_ids + enc(tok, "\n\n" + answer)
    text = ResponseText(tok, thinking=True, start_marker="[BEGIN]", end_marker=marker)
    emitted = ""
    for i in range(1, len(reasoning_ids) + 1):
        emitted += text.update(ids[:i], None).reasoning
        assert "[" not in emitted, "a partial end marker leaked into reasoning_content"
        assert body.startswith(emitted)
    delta = text.update(ids, len(reasoning_ids), finished=True)
    assert emitted + delta.reasoning == body
    assert delta.content == answer


def test_a_forced_close_is_not_reasoning(tok):
    """The CoT cap appends "\\n</think>\\n\\n"; none of it shows."""
    ids = enc(tok, "step one, step two") + enc(tok, "\n") + [THINK_END] + enc(tok, "\n\n") + enc(tok, "Done")
    answer_start = len(ids) - len(enc(tok, "Done"))
    text = ResponseText(tok, thinking=True, start_marker="<think>", end_marker="</think>")
    text.update(ids, answer_start, finished=True)
    assert text.reasoning_text == "step one, step two"
    assert text.content_text == "Done"


def test_unfinished_thinking_is_all_reasoning(tok):
    ids = enc(tok, "still thinking about the route")
    text = ResponseText(tok, thinking=True, start_marker="<think>", end_marker="</think>")
    text.update(ids, None, finished=True)
    assert text.reasoning_text == "still thinking about the route"
    assert text.content_text == ""


def test_non_thinking_text_is_untouched(tok):
    ids = enc(tok, "  leading spaces stay, trailing too  ")
    text = ResponseText(tok, thinking=False)
    text.update(ids, None, finished=True)
    assert text.reasoning_text is None
    assert text.content_text == tok.decode(ids)


@pytest.mark.parametrize("seed", range(4))
def test_stop_strings_cut_and_never_leak(tok, seed):
    ids = enc(tok, "The answer is 42. STOP here, then more text STOP")
    rng = random.Random(seed)
    streamed = ResponseText(tok, thinking=False, stops=["STOP", "never"])
    _, content = stream(streamed, ids, None, rng)
    assert "".join(content) == "The answer is 42. "
    running = ""
    for piece in content:
        running += piece
        assert "S" not in running, "the beginning of a stop string was streamed"


@pytest.mark.parametrize("seed", range(8))
def test_random_outputs_stream_equals_final(tok, seed):
    """Noise like a random model's, markers included: streaming == one-shot, always."""
    rng = random.Random(seed)
    ids = [rng.randrange(len(tok)) for _ in range(rng.randint(5, 90))]
    thinking = seed % 2 == 0
    answer_start = rng.randint(0, len(ids)) if thinking and seed % 4 == 0 else None
    stops = ["e t"] if seed % 3 == 0 else []
    final = ResponseText(tok, thinking=thinking, start_marker="<think>", end_marker="</think>", stops=stops)
    final.update(ids, answer_start, finished=True)
    streamed = ResponseText(tok, thinking=thinking, start_marker="<think>", end_marker="</think>", stops=stops)
    reasoning, content = stream(streamed, ids, answer_start, rng)
    assert "".join(content) == final.content_text
    if thinking:
        assert "".join(reasoning) == final.reasoning_text
    # Before the end, no content delta stops inside a character (the final flush may:
    # bytes that will never be completed; so may reasoning when the answer starts).
    for piece in content[:-1]:
        assert not piece.endswith(REPLACEMENT_CHAR)
