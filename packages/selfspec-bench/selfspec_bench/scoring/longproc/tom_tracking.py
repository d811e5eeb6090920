"""LongProc Theory-of-Mind Tracking: how many of the gold belief-tracking steps match.

The trace is the lines ``- Step N: (...) {...}`` after the reply's last ``Step 0``
(earlier ones are drafts in the reasoning). Each step's text is normalized as in
LongProc (lowercase, no punctuation, filler words such as "the", "is", "location",
"belief" removed) and compared with the gold step of the same number. score = fraction
of gold steps matched; passed = every step matched and the ``Final Answer`` matches.
"""

from __future__ import annotations

import re
import string

from ...datasets.sample import BenchSample
from ..extract import strip_reasoning
from ..result import ScoreResult

_FILLER = re.compile(r"\b(a|an|the|on|in|at|step|thinks|think|believes|believe|is|are|of|location|know|knows|belief)\b")
_STEP = re.compile(r"^\s*(?:[-*•]\s*)?\**\s*Step\s+(\d+)\s*\**\s*:(.*)$", re.IGNORECASE)
_FINAL = re.compile(r"Final Answer\s*\**\s*:\s*\**\s*(.+)", re.IGNORECASE)


def normalize_step(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation and ch != "’")
    return " ".join(_FILLER.sub(" ", text).split())


def parse_steps(text: str) -> dict[int, str]:
    """Step number -> normalized content, from the last ``Step 0`` on."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if (m := _STEP.match(line)) and int(m.group(1)) == 0]
    if starts:
        lines = lines[starts[-1] :]
    steps: dict[int, str] = {}
    for line in lines:
        match = _STEP.match(line)
        if match:
            steps.setdefault(int(match.group(1)), normalize_step(match.group(2)))
    return steps


def final_answer(text: str) -> str | None:
    found = _FINAL.findall(text)
    return normalize_step(found[-1]) if found else None


def score_tom_tracking(sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    gold_text = sample.reference["reference_output"]
    answer = strip_reasoning(completion_text)
    gold, predicted = parse_steps(gold_text), parse_steps(answer)
    matched = sum(1 for number, content in gold.items() if predicted.get(number) == content)
    gold_final, predicted_final = final_answer(gold_text), final_answer(answer)
    final_ok = gold_final is None or predicted_final == gold_final
    score = matched / len(gold) if gold else 0.0
    detail = f"{matched}/{len(gold)} steps matched; final answer {'matches' if final_ok else 'differs'}"
    return ScoreResult(passed=bool(gold) and matched == len(gold) and final_ok, score=score, detail=detail)
