"""Arithmetic search, version 3 (thinker-data-v4): version 2's items with a reworded search.

The puzzles, prompts, answers and checker are version 2's (the same random stream, so the
same seed and index give the same item); the CoT runs the same search — the first two
numbers combined by +, then -, then *, each result tried with the third number until the
target comes out — but words it differently: every step (the plan, the numbers, a branch
of the search, its verdict, the equations, the end) picks one of several phrasings, and
the second operations of a branch are tried in a random order (at most one of them can
hit, see `search_branches`, so the order changes only which misses are written first).
Every tried operation is still written with its result, and the two equations of the
answer follow the hit, so a draft forked after k puzzles holds k solutions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .arithmetic_search import V2_OPERATORS, ArithmeticSearchV2, Branch, Step, apply, search_branches
from .wording import pick, plural, shuffled

# The plan is put together from short parts (no part is a whole template sentence that
# every item repeats): which targets, how the first pair is combined, how the third
# number comes in, when to stop.
_PLAN_TARGETS = ("{count}, targets {targets}.", "{count} to solve ({targets}).", "Targets: {targets}.")
_PLAN_FIRST = (
    "The first pair goes +, -, * in that order",
    "First two numbers: + then - then *",
    "Pair the first two by +, - and * in turn",
    "Combine the first two (+, then -, then *)",
)
_PLAN_SECOND = (
    "each result meets the third number",
    "then the third number by +, - or *",
    "then the third on each result",
    "and bring in the third each time",
)
_PLAN_STOP = (", until the target appears.", ", stopping at the target.", " till one hits.", ".")
_NUMBERS = (
    "Numbers in order: {listed}.",
    "The numbers are {spoken}, used in that order.",
    "In order: {then}.",
    "Given {listed} (in this order).",
)
_BRANCHES = (
    "{first_step}: {tries}{verdict}",
    "{first_step}; then {tries}{verdict}",
    "First {first_step}. With {c}: {tries}{verdict}",
    "Try {first_step}, then {tries}{verdict}",
)
_SEPARATORS = (", ", "; ", ", then ")
_NOT_ALLOWED = ("{left} - {right} not allowed", "{left} - {right} would not be positive", "{left} - {right} is out")
_MISSES = (". No.", ", none is {target}.", ": no {target} there.", ". Not this one.")
_HITS = (". Yes.", ", the target.", ", which is {target}!", ". Found {target}.")
_BEFORE_EQUATIONS = ("", "", "So:", "Written out:", "The equations:")
_CLOSINGS = ("All {n} targets reached.", "Solved: {targets}.", "That solves all {n}.", "{n} of {n} done.")


def _try(rng: random.Random, left: int, op: str, right: int) -> str:
    """One tried operation with its result, or a subtraction that would not stay positive."""
    result = apply(left, op, right)
    if result is None:
        return pick(rng, _NOT_ALLOWED, left=left, right=right)
    return f"{left} {op} {right} = {result}"


class ArithmeticSearchV3(ArithmeticSearchV2):
    """Arithmetic search, version 3 (see the module doc): version 2's items, reworded search."""

    version = 3
    stream_version = 2

    def _search_cot(self, rng: random.Random, puzzles: Sequence[tuple[list[int], int, list[str], list[Step]]]) -> str:
        n = len(puzzles)
        targets = ", ".join(str(target) for _, target, _, _ in puzzles)
        method = f"{rng.choice(_PLAN_FIRST)}; {rng.choice(_PLAN_SECOND)}{rng.choice(_PLAN_STOP)}"
        blocks = [" ".join([pick(rng, _PLAN_TARGETS, count=plural(n, "puzzle"), targets=targets), method])]
        for k, (numbers, target, _, steps) in enumerate(puzzles, start=1):
            a, b, c = numbers
            listed = ", ".join(map(str, numbers))
            lines = [
                f"Puzzle {k}: target {target}",
                pick(rng, _NUMBERS, listed=listed, spoken=f"{a}, {b} and {c}", then=f"{a}, then {b}, then {c}"),
            ]
            branches, found = search_branches(numbers, target, lambda: shuffled(rng, V2_OPERATORS))
            assert found == steps, "the first operations keep version 2's order, so the same pair is found"
            lines += [self._branch(rng, branch, numbers, target) for branch in branches]
            lead = rng.choice(_BEFORE_EQUATIONS)
            lines += ([lead] if lead else []) + [str(step) for step in steps]
            blocks.append("\n".join(lines))
        blocks.append(pick(rng, _CLOSINGS, n=n, targets=targets))
        return "\n\n".join(blocks)

    @staticmethod
    def _branch(rng: random.Random, branch: Branch, numbers: Sequence[int], target: int) -> str:
        """One first operation, its tries on the third number, and whether one hit."""
        a, b, c = numbers
        if branch.first is None:
            return _try(rng, a, branch.op, b) + "."
        tries = rng.choice(_SEPARATORS).join(_try(rng, branch.first, op, c) for op in branch.tries)
        verdict = pick(rng, _HITS if branch.hit else _MISSES, target=target)
        return pick(
            rng, _BRANCHES, first_step=f"{a} {branch.op} {b} = {branch.first}", c=c, tries=tries, verdict=verdict
        )
