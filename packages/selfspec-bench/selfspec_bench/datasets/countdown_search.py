"""The verbalized depth-first search that LongProc's Countdown task teaches by example.

LongProc builds the Countdown prompt's ``{demonstration}`` from two fixed example
problems, each solved by this search and written out step by step, and it uses the
same trace (ending in a ``<Solution>`` block) as the task's reference output. The
items' own ``demonstration`` field is *not* the in-context example: it is the gold
trace of that very item (in an older ``<Search Procedure>`` tag format), so
formatting the prompt with it would leak the answer. This module regenerates the
traces in the format the current ``prompts.yaml`` asks for (``# Search Procedure``).

Search order and wording follow the LongProc generator: pairs ``(i, j)`` with
``i < j`` in list order, the larger number first, operations ``+ - * /``; a branch is
dropped when the result is a decimal, reaches 2000, or divides by zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_INTERMEDIATE = 2000
ICL_EXAMPLES: tuple[tuple[tuple[int, ...], int], ...] = (((40, 19, 23, 7), 29), ((9, 16, 6, 18), 12))

_SOLUTION_TEMPLATE = (
    "Now we have found the target, let's trace back the solution:\n"
    "Final step: {s[2]}\n"
    "The step before: {s[1]}\n"
    "The first step: {s[0]}\n"
    "\n"
    "Output the solution in the required format:\n"
    "<Solution>\n"
    "{s[0]}\n"
    "{s[1]}\n"
    "{s[2]}\n"
    "</Solution>\n"
)


def _indent(level: int) -> str:
    return "" if level == 0 else " " * level + "|- "


def _pairs(nums: list) -> list[tuple[int, int, list]]:
    """Every ``(nums[i], nums[j])`` with ``i < j``, and the numbers left over."""
    return [
        (a, b, [x for k, x in enumerate(nums) if k not in (i, j)])
        for i, a in enumerate(nums)
        for j, b in enumerate(nums)
        if j > i
    ]


@dataclass
class _Search:
    target: int
    log: list[str] = field(default_factory=list)

    def expand(self, nums: list, depth: int, equation: str | None, invalid: bool = False) -> list[str] | None:
        """Visit one state; returns the equations from here to the target, or None."""
        value = nums[0]
        if equation is not None:
            if invalid:
                self.log.append(f"\n{_indent(depth)}Try {equation}. drop this branch.")
                return None
            if value % 1 != 0:
                self.log.append(f"\n{_indent(depth)}Try {equation}. {value:.1f} is a decimal, drop this branch.")
                return None
            if value >= MAX_INTERMEDIATE:
                self.log.append(
                    f"\n{_indent(depth)}Try {equation}. {value} exceeds the maximum intermediate result, drop this branch."
                )
                return None
        if len(nums) == 1:
            found = value == self.target
            verdict = (
                f"Evaluate {value} == {self.target}, target found!"
                if found
                else (f"Evaluate {value} != {self.target}, drop this branch.")
            )
            self.log.append(f"\n{_indent(depth)}Try {equation}. {verdict}")
            return [] if found else None

        options = [(a, b) for a, b, _ in _pairs(nums)]
        if equation is not None:
            self.log.append(f"\n{_indent(depth)}Try {equation}. Add {value} to the number set.")
        if len(nums) == 2:
            self.log.append(f" Current number set: {nums}, target: {self.target}, just two numbers left.")
        else:
            if equation is None:
                self.log.append(
                    f"Initial number set: {nums}, target: {self.target}. Options for choosing two numbers: {options}."
                )
            else:
                self.log.append(
                    f" Current number set: {nums}, target: {self.target}. Options for choosing two numbers: {options}."
                )
            depth += 1

        for a, b, rest in _pairs(nums):
            if len(nums) > 2:
                self.log.append(
                    f"\n{_indent(depth)}Pick two numbers ({a}, {b}) (numbers left: {rest}). Try possible operations."
                )
            big, small = (a, b) if a >= b else (b, a)
            for child_eq, child_value, invalid_op in self._operations(big, small):
                path = self.expand([child_value] + rest, depth + 1, child_eq, invalid_op)
                if path is not None:
                    return [child_eq] + path
        return None

    @staticmethod
    def _operations(a: int, b: int):
        yield f"{a} + {b} = {a + b}", a + b, False
        yield f"{a} - {b} = {a - b}", a - b, False
        yield f"{a} * {b} = {a * b}", a * b, False
        if b == 0:
            yield f"{a} / {b} (invalid operation)", 0, True
        elif a % b == 0:
            yield f"{a} / {b} = {a // b}", a // b, False
        else:
            yield f"{a} / {b} = {a / b:.1f}", a / b, False


def solve_with_trace(nums: list[int], target: int) -> tuple[list[str], str]:
    """Run the search; returns (three solution equations, full demonstration text).

    Raises ValueError when the numbers cannot reach the target under the rules.
    """
    search = _Search(target=target)
    solution = search.expand(list(nums), 0, None)
    if solution is None:
        raise ValueError(f"no Countdown solution for numbers {nums} and target {target}")
    trace = "".join(search.log)
    return solution, "# Search Procedure\n" + trace + "\n\n" + _SOLUTION_TEMPLATE.format(s=solution)


def icl_demonstration() -> str:
    """The two worked examples that fill the prompt's ``{demonstration}`` slot."""
    blocks = []
    for nums, target in ICL_EXAMPLES:
        _, demo = solve_with_trace(list(nums), target)
        blocks.append(f"# Example\nNumbers: {list(nums)}\nTarget: {target}\n\n{demo}")
    return "\n\n".join(blocks)
