"""LongProc's five procedural-generation tasks from ``<shared>/datasets/longproc``.

Layout (same as upstream ``princeton-pli/LongProc`` ``data/``)::

    <data_dir>/<task>/<task>_<length>.json   # items
    <data_dir>/<task>/prompts.yaml           # USER_PROMPT, a str.format template
    <data_dir>/html_to_tsv/webpage/*.html    # pages referenced by html_path

Prompts are built exactly as upstream does: ``USER_PROMPT.format(**fields)`` where the
fields are derived from each item as in LongProc's loaders (``longproc_data.py``).
Countdown's ``{demonstration}`` is LongProc's two fixed worked examples, regenerated
by :mod:`.countdown_search` (the item's own ``demonstration`` field is its answer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import yaml

from .countdown_search import icl_demonstration, solve_with_trace
from .paths import require_dir, require_file, shared_datasets_dir
from .sample import BenchSample, apply_window, user_message

TASKS = ("countdown", "html_to_tsv", "path_traversal", "pseudo_to_code", "tom_tracking")
DEFAULT_LENGTH = "0.5k"

# Each builder maps (item, task_dir) -> (template fields, scorer reference).
Builder = Callable[[dict[str, Any], Path], tuple[dict[str, Any], dict[str, Any]]]


def default_data_dir() -> Path:
    return shared_datasets_dir() / "longproc"


def _countdown(item: dict, task_dir: Path) -> tuple[dict, dict]:
    solution, trace = solve_with_trace(list(item["nums"]), int(item["target"]))
    fields = {"nums": item["nums"], "target": item["target"]}
    reference = {
        "nums": list(item["nums"]),
        "target": int(item["target"]),
        "solution": solution,
        "reference_output": trace,
    }
    return fields, reference


def _html_to_tsv(item: dict, task_dir: Path) -> tuple[dict, dict]:
    page = require_file(task_dir / item["html_path"], what="LongProc html_to_tsv webpage", option="data_dir=")
    fields = {
        "html_str": page.read_text(encoding="utf-8"),
        "task_topic": item["task_topic"],
        "task_description": item["task_description"],
        "tsv_header": item["tsv_header"],
        "filtering_instruction": item.get("filtering_instruction", ""),
    }
    reference = {"reference_output": item["gt"], "tsv_header": item["tsv_header"], "task_id": item.get("task_id")}
    return fields, reference


def _path_traversal(item: dict, task_dir: Path) -> tuple[dict, dict]:
    src, dst = item["question_repr"][0], item["question_repr"][1]
    fields = {"city_context": item["context_nl"], "src_city": src, "dst_city": dst}
    reference = {
        "reference_output": item["answer_nl"],
        "src_city": src,
        "dst_city": dst,
        "edges": item.get("context_repr"),
        "city_context": item["context_nl"],
    }
    return fields, reference


def _pseudo_to_code(item: dict, task_dir: Path) -> tuple[dict, dict]:
    fields = {"pseudocode": "\n".join(item["pseudocode_lines"])}
    reference = {
        "reference_output": "\n".join(item["code_lines"]),
        "testcases": item["testcases"],
        "problem_id": item.get("problem_id"),
    }
    return fields, reference


def _tom_tracking(item: dict, task_dir: Path) -> tuple[dict, dict]:
    fields = {"story_components": item["story_components"], "story": item["story"], "question": item["question"]}
    reference = {"reference_output": item["solution"], "question": item["question"]}
    return fields, reference


_BUILDERS: dict[str, Builder] = {
    "countdown": _countdown,
    "html_to_tsv": _html_to_tsv,
    "path_traversal": _path_traversal,
    "pseudo_to_code": _pseudo_to_code,
    "tom_tracking": _tom_tracking,
}


def load_prompt_template(task: str, prompts_path: Path) -> str:
    """``USER_PROMPT`` from ``prompts.yaml``, with Countdown's examples already filled in."""
    with open(
        require_file(prompts_path, what=f"LongProc {task} prompts.yaml", option="data_dir= or path="), encoding="utf-8"
    ) as handle:
        template = yaml.safe_load(handle)["USER_PROMPT"]
    if task == "countdown":
        # Fill the example slot now, keep the per-item slots, as upstream does.
        template = template.format(demonstration=icl_demonstration(), nums="{nums}", target="{target}")
    return template


def load_longproc_task(
    task: str,
    *,
    path: str | Path | None = None,
    data_dir: str | Path | None = None,
    length: str = DEFAULT_LENGTH,
    limit: int | None = None,
    offset: int = 0,
) -> list[BenchSample]:
    """Load one LongProc task.

    Args:
        task: one of :data:`TASKS`.
        path: an items file (``<task>_<len>.json`` format); ``prompts.yaml`` and, for
            html_to_tsv, the ``webpage/`` pages are looked up next to it.
        data_dir: the LongProc data root (``<data_dir>/<task>/<task>_<length>.json``);
            ignored when ``path`` is given.
        length: output-length group in the file name (``"0.5k"``, ``"2k"``, ``"8k"``).
    """
    if task not in _BUILDERS:
        raise ValueError(f"unknown LongProc task {task!r}; choose from {', '.join(TASKS)}")
    if path is not None:
        items_file = require_file(Path(path), what=f"LongProc {task} items", option="path=")
    else:
        root = require_dir(
            Path(data_dir) if data_dir else default_data_dir(), what="LongProc data directory", option="data_dir="
        )
        items_file = require_file(
            root / task / f"{task}_{length}.json",
            what=f"LongProc {task} ({length}) items",
            option="data_dir= / length=",
        )
    task_dir = items_file.parent
    template = load_prompt_template(task, task_dir / "prompts.yaml")
    with open(items_file, encoding="utf-8") as handle:
        items = json.load(handle)

    benchmark = f"longproc/{task}"
    samples = []
    for index, item in apply_window(list(enumerate(items)), limit, offset):
        fields, reference = _BUILDERS[task](item, task_dir)
        reference["length"] = length
        samples.append(
            BenchSample(
                id=f"{benchmark}_{length}/{index}",
                benchmark=benchmark,
                messages=user_message(template.format(**fields)),
                reference=reference,
            )
        )
    return samples


def load_longproc_all(
    *,
    path: str | Path | None = None,
    data_dir: str | Path | None = None,
    length: str = DEFAULT_LENGTH,
    limit: int | None = None,
    offset: int = 0,
) -> list[BenchSample]:
    """All five tasks in :data:`TASKS` order; ``limit``/``offset`` apply to each task.

    ``path`` is taken as the data root here (there is no single items file).
    """
    root = data_dir if data_dir is not None else path
    samples: list[BenchSample] = []
    for task in TASKS:
        samples.extend(load_longproc_task(task, data_dir=root, length=length, limit=limit, offset=offset))
    return samples
