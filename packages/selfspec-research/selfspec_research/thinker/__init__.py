"""thinker — the reasoning testbed.

No reasoning model is reachable offline, so the testbed makes one: a small model is
fine-tuned on synthetic think→answer traces from seeded task generators whose answers
take shape while the model thinks (`selfspec_research.thinker.tasks`). The eval then forks
drafts at points of the CoT and measures how much of the final answer each already
holds. The same tasks and checkers work for any model that thinks.
"""

from __future__ import annotations

from .tasks import (
    CheckResult,
    TaskItem,
    check,
    check_many,
    families,
    format_training_text,
    generate,
    generate_split,
    get_family,
)

__all__ = [
    "CheckResult",
    "TaskItem",
    "check",
    "check_many",
    "families",
    "format_training_text",
    "generate",
    "generate_split",
    "get_family",
]
