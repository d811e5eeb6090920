"""Pulling the answer out of a model's free-form reply.

Replies mix prose, reasoning and fenced code; benchmarks want one code block, one
tagged section (``<Route>``, ``<Solution>``) or one final answer. These helpers pick
the most plausible candidate and fall back to the raw text, so that a reply without
any formatting is still scored rather than rejected for formatting alone.
"""

from __future__ import annotations

import re

THINK_END = "</think>"

_FENCE = re.compile(r"```[ \t]*([\w+#.\-]*)[^\n]*\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[ \t]*([\w+#.\-]*)[^\n]*\n")


def strip_reasoning(text: str) -> str:
    """The part after the last ``</think>``: a reasoning model's answer, not its CoT."""
    if THINK_END in text:
        return text.rsplit(THINK_END, 1)[1]
    return text


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced block, in order; an unclosed last fence counts.

    A reply cut off by a token cap often ends inside its code block; that block is
    still the best guess at the answer.
    """
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    tail_start = 0
    for match in _FENCE.finditer(text):
        tail_start = match.end()
    tail = _OPEN_FENCE.search(text, tail_start)
    if tail is not None:
        blocks.append((tail.group(1).lower(), text[tail.end() :]))
    return blocks


def pick_code(text: str, *, languages: tuple[str, ...], must_match: str | None = None) -> str:
    """The code the reply most likely means as its answer.

    Among fenced blocks tagged with one of ``languages`` (``""`` = untagged), take the
    last one matching the regex ``must_match`` (e.g. the function's ``def``), else the
    last such block; with no fenced block at all, the whole reply.
    """
    text = strip_reasoning(text)
    blocks = [body for lang, body in fenced_blocks(text) if lang in languages]
    if not blocks:
        return text
    if must_match is not None:
        pattern = re.compile(must_match, re.MULTILINE)
        matching = [body for body in blocks if pattern.search(body)]
        if matching:
            return matching[-1]
    return blocks[-1]


def last_tagged(text: str, tag: str) -> str | None:
    """Content of the last complete ``<tag>...</tag>``; else what follows a last unclosed ``<tag>``."""
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    end = text.rfind(close_tag)
    if end >= 0:
        start = text.rfind(open_tag, 0, end)
        if start >= 0:
            return text[start + len(open_tag) : end]
    start = text.rfind(open_tag)
    if start >= 0 and text.find(close_tag, start) < 0:
        return text[start + len(open_tag) :]
    return None
