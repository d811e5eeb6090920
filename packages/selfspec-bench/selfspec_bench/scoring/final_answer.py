"""Finding the final answer in a math reply.

Order of preference: the text after the last ``####`` (GSM8K's convention), the last
``\\boxed{}``, a phrase like "the answer is X", and finally the last number in the
reply. Reasoning before ``</think>`` is ignored.
"""

from __future__ import annotations

import re

from ..datasets.boxed import last_boxed
from .extract import strip_reasoning

_NUMBER_IN_TEXT = re.compile(r"[-+]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|[-+]?\.\d+")
_ANSWER_MARKER = re.compile(r"answer\s*(?:is|:)\s*:?\s*", re.IGNORECASE)


def _phrase_answer(phrase: str) -> str:
    """The answer inside "the answer is ...": a ``$...$`` span, else up to the sentence end."""
    phrase = phrase.strip()
    math = re.match(r"\$([^$]+)\$", phrase)
    if math:
        return math.group(1).strip()
    return re.split(r"\.(?:\s|$)", phrase, maxsplit=1)[0].strip()


def last_number(text: str) -> str | None:
    matches = _NUMBER_IN_TEXT.findall(text)
    return matches[-1] if matches else None


def final_answer(text: str, *, prefer_boxed: bool = False) -> tuple[str | None, str]:
    """(answer text, how it was found). ``prefer_boxed`` puts ``\\boxed{}`` before ``####``."""
    text = strip_reasoning(text)
    boxed = last_boxed(text)
    if "####" in text and not (prefer_boxed and boxed is not None):
        after = text.rsplit("####", 1)[1].strip()
        line = after.splitlines()[0] if after else ""
        if line:
            return line.strip(), "####"
    if boxed is not None:
        return boxed.strip(), "boxed"
    markers = list(_ANSWER_MARKER.finditer(text))
    if markers:
        phrase = text[markers[-1].end() :].split("\n", 1)[0]
        if phrase.strip():
            return _phrase_answer(phrase), "answer phrase"
    number = last_number(text)
    return (number, "last number") if number is not None else (None, "none")
