"""ClassEval (100 classes) from ``<shared>/datasets/classeval/ClassEval_data.json``.

Prompt: ClassEval's own holistic instruction ("Please complete the class <Name> in
the following code.") over the class skeleton (imports, docstrings, method stubs),
plus a request to answer with the complete class in one code block, so the scorer
can pull it out of surrounding prose.
"""

from __future__ import annotations

import json
from pathlib import Path

from .paths import require_file, shared_datasets_dir
from .sample import BenchSample, apply_window, user_message

BENCHMARK = "classeval"


def default_path() -> Path:
    return shared_datasets_dir() / "classeval" / "ClassEval_data.json"


def build_prompt(class_name: str, skeleton: str) -> str:
    return (
        f"Please complete the class {class_name} in the following code.\n"
        f"{skeleton.rstrip()}\n\n"
        "Return the complete class, with its imports, in a single ```python``` code block."
    )


def load_classeval(*, path: str | Path | None = None, limit: int | None = None, offset: int = 0) -> list[BenchSample]:
    """Load ClassEval tasks; the reference carries the unittest code and its test classes."""
    source = require_file(Path(path) if path else default_path(), what="ClassEval data", option="path=")
    with open(source, encoding="utf-8") as handle:
        rows = json.load(handle)
    return [
        BenchSample(
            id=row["task_id"],
            benchmark=BENCHMARK,
            messages=user_message(build_prompt(row["class_name"], row["skeleton"])),
            reference={
                "class_name": row["class_name"],
                "import_statement": list(row.get("import_statement", [])),
                "test": row["test"],
                # Names are stripped: ClassEval_97 lists " Words2NumbersTestMain" with a leading space.
                "test_classes": [name.strip() for name in row["test_classes"]],
                "solution_code": row.get("solution_code", ""),
            },
        )
        for row in apply_window(rows, limit, offset)
    ]
