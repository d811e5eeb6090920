"""CoSpec's premise, measured alone: which held-out items the target and the draft each solve.

CoSpec can only beat the target's score on items where the draft's tokens lead somewhere the
target's do not, so "solved by the draft but not by the target" bounds what any arbitrator can
gain, and the oracle union is the ceiling. `cospec eval` measures this too, but one item at a
time in every mode (it times them); solve rates need no timing, so here each model decodes a
task's items batched (continuous batching over many slots) and only the checkers decide.

Batched bf16 decoding can round a row differently from decoding it alone, so an item's
greedy output here may differ from the one-at-a-time run's; the solve rates are the same
measurement of the same model, not token-identical transcripts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from selfspec import SamplingParams
from selfspec_research.cospec.eval_runs import draft_as_llm, token_hash
from selfspec_research.cospec.eval_summary import complementarity
from selfspec_research.cospec.eval_tasks import EvalTask, answer_text, build_task, check_heldout_seed

TARGET = "target"
DRAFT = "draft-alone"


@dataclass(frozen=True)
class ComplementarityConfig:
    """What `run_complementarity` measures (written into results.json)."""

    tasks: tuple[str, ...]
    n: int = 24
    seed: int = 1000
    data_version: str | None = None
    max_tokens: int = 3072
    draft_slots: int = 32

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("no tasks given")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.draft_slots < 1:
            raise ValueError(f"draft_slots must be >= 1, got {self.draft_slots}")
        check_heldout_seed(self.seed, self.tasks)


def decode_and_score(llm: Any, task: EvalTask, label: str, max_tokens: int) -> list[dict[str, Any]]:
    """Every item of `task` decoded greedily in one batch by `llm`, then scored by the task's checker."""
    started = time.perf_counter()
    outputs = llm.generate(
        [item.messages for item in task.items], SamplingParams(max_tokens=max_tokens), thinking=task.thinking, spec=None
    )
    elapsed = time.perf_counter() - started
    thinking = bool(task.thinking)
    answers = [answer_text(llm, out.token_ids, thinking) for out in outputs]
    verdicts = task.score([item.reference for item in task.items], answers)
    return [
        {
            "kind": "item",
            "task": task.name,
            "uid": item.uid,
            "label": label,
            "passed": bool(passed),
            "score": round(float(score), 4),
            "output_tokens": len(out.token_ids),
            "output_hash": token_hash(out.token_ids),
            "finish_reason": out.finish_reason,
            "answer_excerpt": answer[:200],
            "batch_seconds": round(elapsed, 3),
        }
        for item, out, answer, (passed, score) in zip(task.items, outputs, answers, verdicts)
    ]


def run_complementarity(
    llm: Any, config: ComplementarityConfig, *, log: Callable[[str], None] = lambda message: None
) -> dict[str, Any]:
    """The target (`llm`) and its attached draft, each alone, on `config.n` held-out items per task.

    Returns `{"config", "records", "rows"}`: one record per item and model, one
    complementarity row per task (target solved, draft solved, draft-but-not-target, union).
    """
    if getattr(llm, "draft_runner", None) is None:
        raise ValueError("the target has no draft attached (load it with a draft)")
    draft = draft_as_llm(llm, num_slots=config.draft_slots)
    records: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for name in config.tasks:
        task = build_task(name, config.n, config.seed, data_version=config.data_version)
        for label, model in ((TARGET, llm), (DRAFT, draft)):
            mine = decode_and_score(model, task, label, config.max_tokens)
            records += mine
            solved = sum(r["passed"] for r in mine)
            log(f"{name:>18} {label:<12} solved {solved}/{len(mine)} in {mine[0]['batch_seconds'] if mine else 0} s")
        rows += complementarity(records, name)
    return {"config": asdict(config), "records": records, "rows": rows}


def totals(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """The per-task rows summed (items, target solved, draft solved, draft-not-target, union)."""
    keys = ("items", "target_solved", "draft_solved", "draft_not_target", "target_not_draft", "union")
    return {key: sum(int(row[key]) for row in rows) for key in keys}


def report_markdown(result: dict[str, Any], meta: dict[str, Any]) -> str:
    """The table a reader wants: per task, who solves what, and the room CoSpec has."""
    lines = [
        "# Complementarity: the target and its draft, each alone",
        "",
        f"- command: `{meta.get('command', '')}`",
        f"- target {meta.get('model')}, draft {meta.get('draft')}, device {meta.get('device')}, dtype {meta.get('dtype')}",
        f"- data version {result['config']['data_version']}, held-out seed {result['config']['seed']}, "
        f"{result['config']['n']} items per task, greedy, at most {result['config']['max_tokens']} tokens, batched",
        f"- date {meta.get('date', '')}; versions {meta.get('versions', '')}",
        "",
        "| task | items | target solved | draft solved | draft, not target | target, not draft | union | room (union - target) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = list(result["rows"])
    for row in [*rows, {"task": "all", **totals(rows)}] if rows else []:
        lines.append(
            f"| {row['task']} | {row['items']} | {row['target_solved']} | {row['draft_solved']} | "
            f"{row['draft_not_target']} | {row['target_not_draft']} | {row['union']} | "
            f"{row['union'] - row['target_solved']} |"
        )
    return "\n".join(lines) + "\n"


__all__ = [
    "DRAFT",
    "TARGET",
    "ComplementarityConfig",
    "decode_and_score",
    "report_markdown",
    "run_complementarity",
    "totals",
]
