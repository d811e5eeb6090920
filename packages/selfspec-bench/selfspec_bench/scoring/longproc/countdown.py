"""LongProc Countdown: is the proposed solution a valid way to reach the target?

The answer is the ``<Solution>`` block (three equations such as ``40 + 19 = 59``); if
the tags are missing, the last lines that consist of one equation each are used.
Valid means, as in LongProc's checker: one equation per step (``len(nums) - 1``),
each step's arithmetic exactly right (so divisions must be exact), both operands
taken from the numbers still available (given numbers and earlier results, each
used once), and the last result equal to the target.
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

from ...datasets.sample import BenchSample
from ..extract import last_tagged, strip_reasoning
from ..result import ScoreResult, binary

_OPERATORS = {
    "+": "+",
    "-": "-",
    "−": "-",
    "–": "-",
    "*": "*",
    "×": "*",
    "x": "*",
    "\\times": "*",
    "/": "/",
    "÷": "/",
    "\\div": "/",
}
_NUM = r"-?\d+(?:\.\d+)?"
_EQUATION = re.compile(
    rf"^\s*(?:[-*•]\s+|\d+[.)]\s+|step\s*\d+\s*:\s*)?[`$]*\s*({_NUM})\s*(\\times|\\div|[-+*/×x÷−–])\s*({_NUM})\s*=\s*({_NUM})\s*[`$.]*\s*$",
    re.IGNORECASE,
)

Equation = tuple[Fraction, str, Fraction, Fraction]


def parse_equations(block: str) -> list[Equation]:
    equations = []
    for line in block.splitlines():
        match = _EQUATION.match(line)
        if match:
            a, op, b, c = match.groups()
            equations.append((Fraction(a), _OPERATORS[op.lower()], Fraction(b), Fraction(c)))
    return equations


def _apply(a: Fraction, op: str, b: Fraction) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b != 0 else None


def check_solution(nums: list[int], target: int, equations: list[Equation]) -> tuple[bool, str]:
    """(valid, reason) for a sequence of equations over ``nums``."""
    if len(equations) != len(nums) - 1:
        return False, f"expected {len(nums) - 1} equations, found {len(equations)}"
    pool = Counter(Fraction(n) for n in nums)
    for step, (a, op, b, c) in enumerate(equations, start=1):
        if _apply(a, op, b) != c:
            return False, f"step {step}: {a} {op} {b} != {c}"
        for operand in (a, b):
            if pool[operand] <= 0:
                return False, f"step {step}: {operand} is not available"
            pool[operand] -= 1
        pool[c] += 1
    result = equations[-1][3]
    if result != target:
        return False, f"final result {result} != target {target}"
    return True, "valid solution"


def score_countdown(sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    ref = sample.reference
    nums, target = list(ref["nums"]), int(ref["target"])
    answer = strip_reasoning(completion_text)
    block = last_tagged(answer, "Solution")
    if block is not None:
        equations = parse_equations(block)
    else:
        equations = parse_equations(answer)[-(len(nums) - 1) :]
    valid, reason = check_solution(nums, target, equations)
    source = "<Solution> block" if block is not None else "untagged equations"
    return binary(valid, f"{reason} ({source})")
