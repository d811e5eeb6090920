"""Arithmetic search (countdown-style): reach each target from its numbers with + - * /.

One item is a series of puzzles, so the answer (a header and a few equations per
puzzle) is long enough to matter for speculation. The CoT solves the puzzles in order:
a failed attempt or two, a step back from the target, then the equations, so a draft
forked after k puzzles holds k solutions. The checker replays every equation: operands
must be available (each given number and each intermediate result used at most once),
the arithmetic must be exact, and the last result must be the target.

Version 2 (`ArithmeticSearchV2`, in thinker-data-v2): three numbers 1-9 used in order and
a complete search of at most 3 x 3 operations, each written with its result (see the
comment before `ordered_search`). All versions share the checker. Version 3
(`arithmetic_search_v3`, in thinker-data-v4) is version 2's items with the search worded
differently from item to item.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .base import CheckResult, TaskFamily, TaskItem, estimate_tokens, final_answer_text, require_range

EQUATION = re.compile(r"^\s*(\d+)\s*([-+*/x×÷])\s*(\d+)\s*=\s*(\d+)\s*\.?$")
HEADER = re.compile(r"^\s*Puzzle\s+(\d+)\b", flags=re.IGNORECASE)
_SYMBOLS = {"x": "*", "×": "*", "÷": "/"}
LARGE_NUMBERS = (25, 50, 75, 100)


@dataclass(frozen=True)
class Step:
    left: int
    op: str
    right: int
    result: int

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right} = {self.result}"


def apply(left: int, op: str, right: int) -> int | None:
    """The result of a legal step (positive whole numbers only), else None."""
    if op == "+":
        return left + right
    if op == "-":
        return left - right if left > right else None
    if op == "*":
        return left * right
    if op == "/":
        return left // right if right > 1 and left % right == 0 else None
    return None


def _random_step(rng: random.Random, pool: list[int], prefer: int | None) -> tuple[Step, int, int] | None:
    """A random legal step over `pool` (indices of its operands returned too)."""
    if prefer is not None and rng.random() < 0.75:
        i = prefer
        j = rng.choice([k for k in range(len(pool)) if k != i])
    else:
        i, j = rng.sample(range(len(pool)), 2)
    a, b = pool[i], pool[j]
    if a < b:
        a, b, i, j = b, a, j, i
    ops = ["+", "-", "*", "*", "/"] if b > 1 else ["+", "-"]
    op = rng.choice(ops)
    result = apply(a, op, b)
    if result is None or result > 2000:
        return None
    return Step(a, op, b, result), i, j


def plant_solution(rng: random.Random, numbers: Sequence[int], steps: int) -> list[Step] | None:
    """A random chain of `steps` legal steps in which every result but the last is used again.

    Pool entries carry the index of the step that produced them (None for given
    numbers), so "used again" is tracked by identity, not by a value that a given
    number might share.
    """
    pool: list[tuple[int, int | None]] = [(value, None) for value in numbers]
    chain: list[Step] = []
    used_results: set[int] = set()
    last_index: int | None = None
    for step_number in range(steps):
        drawn = None
        for _ in range(20):
            drawn = _random_step(rng, [value for value, _ in pool], last_index)
            if drawn:
                break
        if drawn is None:
            return None
        step, i, j = drawn
        used_results.update(origin for _, origin in (pool[i], pool[j]) if origin is not None)
        chain.append(step)
        pool = [entry for k, entry in enumerate(pool) if k not in (i, j)] + [(step.result, step_number)]
        last_index = len(pool) - 1
    if used_results != set(range(steps - 1)):
        return None  # a dangling intermediate result: the chain would carry a useless step
    return chain


def replay(numbers: Sequence[int], steps: Sequence[Step]) -> str | None:
    """Why `steps` is not a valid derivation from `numbers` (None when it is)."""
    pool = Counter(numbers)
    for number, step in enumerate(steps, start=1):
        needed = Counter((step.left, step.right))
        if any(pool[value] < count for value, count in needed.items()):
            return f"step {number} ({step}) uses a number that is not available"
        if apply(step.left, step.op, step.right) != step.result:
            return f"step {number} ({step}) is wrong or not allowed"
        pool -= needed
        pool[step.result] += 1
    return None


class ArithmeticSearch(TaskFamily):
    """Generator + checker for the arithmetic-search family.

    Knobs: `min_puzzles`/`max_puzzles` (grown, up to twice `max_puzzles`, until the
    answer reaches `min_answer_tokens`), `min_numbers`/`max_numbers` per puzzle,
    `min_steps`/`max_steps` of the planted solution (at most one fewer than the numbers).
    """

    name = "arithmetic_search"
    version = 1

    def __init__(
        self,
        min_puzzles: int = 12,
        max_puzzles: int = 28,
        min_numbers: int = 4,
        max_numbers: int = 6,
        min_steps: int = 2,
        max_steps: int = 4,
        min_answer_tokens: int = 200,
    ) -> None:
        require_range("puzzles", min_puzzles, max_puzzles)
        require_range("numbers", min_numbers, max_numbers, floor=2)
        require_range("steps", min_steps, max_steps)
        if min_steps > min_numbers - 1:
            raise ValueError("min_steps must be below min_numbers (each step uses up one number)")
        self.min_puzzles, self.max_puzzles = min_puzzles, max_puzzles
        self.min_numbers, self.max_numbers = min_numbers, max_numbers
        self.min_steps, self.max_steps = min_steps, max_steps
        self.min_answer_tokens = min_answer_tokens

    def knobs(self) -> dict[str, Any]:
        return {
            "min_puzzles": self.min_puzzles,
            "max_puzzles": self.max_puzzles,
            "min_numbers": self.min_numbers,
            "max_numbers": self.max_numbers,
            "min_steps": self.min_steps,
            "max_steps": self.max_steps,
            "min_answer_tokens": self.min_answer_tokens,
        }

    # ------------------------------------------------------------------ generation
    def _puzzle(self, rng: random.Random) -> tuple[list[int], int, list[Step]]:
        while True:
            count = rng.randint(self.min_numbers, self.max_numbers)
            numbers = [rng.choice(LARGE_NUMBERS) if rng.random() < 0.2 else rng.randint(1, 12) for _ in range(count)]
            steps = rng.randint(self.min_steps, min(self.max_steps, count - 1))
            chain = plant_solution(rng, numbers, steps)
            if chain is None:
                continue
            target = chain[-1].result
            reached_early = any(step.result == target for step in chain[:-1])
            if 10 <= target <= 999 and target not in numbers and not reached_early:
                return numbers, target, chain

    def build(self, rng: random.Random) -> tuple[str, str, str, dict[str, Any]]:
        target_count = rng.randint(self.min_puzzles, self.max_puzzles)
        puzzles: list[tuple[list[int], int, list[Step]]] = []
        blocks: list[str] = []
        while len(puzzles) < target_count or (
            estimate_tokens("\n\n".join(blocks)) < self.min_answer_tokens and len(puzzles) < 2 * self.max_puzzles
        ):
            numbers, target, chain = self._puzzle(rng)
            puzzles.append((numbers, target, chain))
            blocks.append("\n".join([f"Puzzle {len(puzzles)}: target {target}", *map(str, chain)]))
        answer = "\n\n".join(blocks)
        prompt = self._prompt(rng, puzzles)
        cot = self._cot(rng, puzzles)
        meta = {"puzzles": [{"numbers": numbers, "target": target} for numbers, target, _ in puzzles]}
        return prompt, cot, answer, meta

    @staticmethod
    def _prompt(rng: random.Random, puzzles: Sequence[tuple[list[int], int, list[Step]]]) -> str:
        listed = [
            f"Puzzle {k}: numbers {', '.join(map(str, numbers))}; target {target}"
            for k, (numbers, target, _) in enumerate(puzzles, start=1)
        ]
        intro = rng.choice(
            (
                "Solve each of these {n} number puzzles.",
                "Here are {n} countdown puzzles; solve them all.",
                "Reach every target below ({n} puzzles).",
            )
        ).format(n=len(puzzles))
        rules = (
            "Combine some of a puzzle's numbers with +, -, * and / to make its target. Each given "
            "number can be used at most once, and so can each intermediate result. Every result must "
            "be a positive whole number (subtract the smaller from the larger; divide only exactly)."
        )
        fmt = (
            'For each puzzle write "Puzzle <k>: target <T>", then one equation per line in the form '
            '"a op b = c", the last one giving the target. Leave a blank line between puzzles.'
        )
        return "\n".join([intro, rules, fmt, "", *listed])

    @staticmethod
    def _failed_attempt(rng: random.Random, numbers: Sequence[int], target: int) -> str | None:
        pool = list(numbers)
        steps: list[Step] = []
        last_index = None
        for _ in range(rng.randint(2, 3)):
            if len(pool) < 2:
                break
            drawn = _random_step(rng, pool, last_index)
            if drawn is None:
                break
            step, i, j = drawn
            steps.append(step)
            pool = [value for k, value in enumerate(pool) if k not in (i, j)] + [step.result]
            last_index = len(pool) - 1
        if not steps or steps[-1].result == target:
            return None
        value = steps[-1].result
        gap = abs(target - value)
        verdict = f"{gap} short" if value < target else f"{gap} over"
        return f"Try {', '.join(map(str, steps))}: {value}, {verdict}. No."

    def _cot(self, rng: random.Random, puzzles: Sequence[tuple[list[int], int, list[Step]]]) -> str:
        blocks = [
            f"{len(puzzles)} puzzles. For each one I try a quick combination or two, then work back "
            "from the target to find the last step, and write the equations that build it."
        ]
        for k, (numbers, target, chain) in enumerate(puzzles, start=1):
            lines = [f"Puzzle {k}: target {target}", f"Numbers: {', '.join(map(str, numbers))}."]
            for _ in range(rng.choice((0, 1, 1, 2))):
                attempt = self._failed_attempt(rng, numbers, target)
                if attempt:
                    lines.append(attempt)
            last = chain[-1]
            back = f"Work back: {target} = {last.left} {last.op} {last.right}"
            earlier = {step.result: step for step in chain[:-1]}
            sources = [
                f"{value} from {earlier[value].left} {earlier[value].op} {earlier[value].right}"
                for value in (last.left, last.right)
                if value in earlier
            ]
            back += f", with {' and '.join(sources)}." if sources else ", both given."
            lines.append(back)
            lines += [str(step) for step in chain]
            lines.append(f"That reaches {target}.")
            blocks.append("\n".join(lines))
        blocks.append(f"All {len(puzzles)} targets reached.")
        return "\n\n".join(blocks)

    # -------------------------------------------------------------------- checking
    @staticmethod
    def parse(answer_text: str) -> tuple[dict[int, list[Step]], list[str]]:
        """Equations grouped by puzzle number, plus lines that look like equations but are not."""
        solutions: dict[int, list[Step]] = {}
        problems: list[str] = []
        current: int | None = None
        for raw in final_answer_text(answer_text).splitlines():
            line = raw.strip()
            if not line:
                continue
            header = HEADER.match(line)
            if header:
                current = int(header.group(1))
                solutions.setdefault(current, [])
                continue
            match = EQUATION.match(line)
            if match and current is not None:
                left, op, right, result = match.groups()
                solutions[current].append(Step(int(left), _SYMBOLS.get(op, op), int(right), int(result)))
            elif "=" in line:
                problems.append(line)
        return solutions, problems

    def check(self, item: TaskItem, answer_text: str) -> CheckResult:
        puzzles = item.meta["puzzles"]
        solutions, problems = self.parse(answer_text)
        solved, failures = 0, []
        for k, puzzle in enumerate(puzzles, start=1):
            steps = solutions.get(k, [])
            if not steps:
                failures.append(f"puzzle {k}: no equations")
                continue
            reason = replay(puzzle["numbers"], steps)
            if reason is None and steps[-1].result != puzzle["target"]:
                reason = f"ends at {steps[-1].result}, not {puzzle['target']}"
            if reason:
                failures.append(f"puzzle {k}: {reason}")
            else:
                solved += 1
        if problems:
            failures.append(f"unparseable: {problems[0]!r}")
        detail = f"{solved}/{len(puzzles)} solved" + ("; " + "; ".join(failures[:3]) if failures else "")
        return CheckResult(solved == len(puzzles) and not problems, solved / len(puzzles), detail)


# ------------------------------------------------------------------------ version 2
# Version 2 replaces guessing with a short, complete search. A puzzle has three small
# numbers to be used in the order given: first combine the first two, then that result
# with the third. The CoT tries the first operation in a fixed order (+, -, *); for each
# it writes the result and then every second operation with its result, until one hits
# the target (a subtraction that would not stay positive is written as "not allowed").
# Every tried operation is written out with its result, so the CoT's arithmetic is on
# one or two digits at a time and the search is at most 3 x 3 steps.

V2_OPERATORS = ("+", "-", "*")


def _v2_try(left: int, op: str, right: int) -> str:
    result = apply(left, op, right)
    return f"{left} {op} {right} not allowed" if result is None else f"{left} {op} {right} = {result}"


@dataclass(frozen=True)
class Branch:
    """One first operation of the search and the second operations tried on its result."""

    op: str
    first: int | None  # None: the first operation is not allowed
    tries: tuple[str, ...]  # the second operators, in the order tried (up to a hit)
    hit: bool  # the last try gives the target


def search_branches(
    numbers: Sequence[int], target: int, second_order: Callable[[], Sequence[str]] = lambda: V2_OPERATORS
) -> tuple[list[Branch], list[Step] | None]:
    """The branches of the ordered search and the two steps it finds (None if none).

    The first operations go in the fixed order +, -, * (the first hit is the answer); the
    second ones in `second_order()`, any order: with a target of 10 or more at most one
    second operation hits a given first result, so the order never changes whether a
    branch hits, only which misses are written before the hit.
    """
    a, b, c = numbers
    branches = []
    for op1 in V2_OPERATORS:
        first = apply(a, op1, b)
        if first is None:
            branches.append(Branch(op1, None, (), False))
            continue
        tries: list[str] = []
        for op2 in second_order():
            tries.append(op2)
            if apply(first, op2, c) == target:
                branches.append(Branch(op1, first, tuple(tries), True))
                return branches, [Step(a, op1, b, first), Step(first, op2, c, target)]
        branches.append(Branch(op1, first, tuple(tries), False))
    return branches, None


def ordered_search(numbers: Sequence[int], target: int) -> tuple[list[str], list[Step] | None]:
    """The CoT lines of the ordered search and the two steps it finds (None if none)."""
    a, b, c = numbers
    branches, steps = search_branches(numbers, target)
    lines = []
    for branch in branches:
        if branch.first is None:
            lines.append(f"{_v2_try(a, branch.op, b)}.")
            continue
        tries = ", ".join(_v2_try(branch.first, op2, c) for op2 in branch.tries)
        lines.append(f"{a} {branch.op} {b} = {branch.first}: {tries}. {'Yes' if branch.hit else 'No'}.")
    return lines, steps


class ArithmeticSearchV2(ArithmeticSearch):
    """Arithmetic search, version 2 (see the comment above): three numbers in order.

    Knobs: `min_puzzles`/`max_puzzles`, `max_number` (numbers are 1..max_number),
    `min_target`/`max_target`. The checker is version 1's (any valid derivation passes).
    """

    version = 2

    def __init__(
        self,
        min_puzzles: int = 4,
        max_puzzles: int = 6,
        max_number: int = 9,
        min_target: int = 10,
        max_target: int = 99,
    ) -> None:
        require_range("puzzles", min_puzzles, max_puzzles)
        require_range("numbers", 2, max_number)
        require_range("target", min_target, max_target)
        self.min_puzzles, self.max_puzzles = min_puzzles, max_puzzles
        self.max_number, self.min_target, self.max_target = max_number, min_target, max_target

    def knobs(self) -> dict[str, Any]:
        return {
            "min_puzzles": self.min_puzzles,
            "max_puzzles": self.max_puzzles,
            "max_number": self.max_number,
            "min_target": self.min_target,
            "max_target": self.max_target,
        }

    def _v2_puzzle(self, rng: random.Random) -> tuple[list[int], int, list[str], list[Step]]:
        for _ in range(10_000):
            numbers = [rng.randint(1, self.max_number) for _ in range(3)]
            op1, op2 = rng.choice(V2_OPERATORS), rng.choice(V2_OPERATORS)
            first = apply(numbers[0], op1, numbers[1])
            target = None if first is None else apply(first, op2, numbers[2])
            if target is None or not self.min_target <= target <= self.max_target or target in numbers:
                continue
            if target in {apply(numbers[0], op, numbers[1]) for op in V2_OPERATORS}:
                continue  # the first step alone would reach the target
            lines, steps = ordered_search(numbers, target)
            assert steps is not None  # the planted pair is in the search
            return numbers, target, lines, steps
        raise RuntimeError("no puzzle within the target range; widen min_target/max_target")

    def build(self, rng: random.Random) -> tuple[str, str, str, dict[str, Any]]:
        puzzles = [self._v2_puzzle(rng) for _ in range(rng.randint(self.min_puzzles, self.max_puzzles))]
        answer = "\n\n".join(
            "\n".join([f"Puzzle {k}: target {target}", *map(str, steps)])
            for k, (_, target, _, steps) in enumerate(puzzles, start=1)
        )
        listed = [
            f"Puzzle {k}: numbers {', '.join(map(str, numbers))}; target {target}"
            for k, (numbers, target, _, _) in enumerate(puzzles, start=1)
        ]
        intro = rng.choice(
            (
                "Solve each of these {n} number puzzles.",
                "Here are {n} small number puzzles; solve them all.",
                "Reach every target below ({n} puzzles).",
            )
        ).format(n=len(puzzles))
        rules = (
            "Each puzzle has three numbers. Combine the first two with +, - or *, then combine that result "
            "with the third number with +, - or *, to make the target. Every result must be a positive "
            "whole number (subtract only a smaller number from a larger one)."
        )
        fmt = (
            'For each puzzle write "Puzzle <k>: target <T>", then its two equations, one per line, in the form '
            '"a op b = c", the second one giving the target. Leave a blank line between puzzles.'
        )
        prompt = "\n".join([intro, rules, fmt, "", *listed])
        meta = {"puzzles": [{"numbers": numbers, "target": target} for numbers, target, _, _ in puzzles]}
        return prompt, self._search_cot(rng, puzzles), answer, meta

    def _search_cot(self, rng: random.Random, puzzles: Sequence[tuple[list[int], int, list[str], list[Step]]]) -> str:
        """The CoT, written once the prompt is drawn: version 2's wording is fixed, so `rng`
        goes unused here; a version that rewords the CoT draws its phrasing from it."""
        blocks = [
            f"{len(puzzles)} puzzles. For each one I try the first operation as +, then -, then *; for each "
            "result I try the third number with +, -, * until one gives the target, then write the two equations."
        ]
        for k, (numbers, target, lines, steps) in enumerate(puzzles, start=1):
            blocks.append(
                "\n".join(
                    [
                        f"Puzzle {k}: target {target}",
                        f"Numbers in order: {', '.join(map(str, numbers))}.",
                        *lines,
                        *map(str, steps),
                    ]
                )
            )
        blocks.append(f"All {len(puzzles)} targets reached.")
        return "\n\n".join(blocks)
