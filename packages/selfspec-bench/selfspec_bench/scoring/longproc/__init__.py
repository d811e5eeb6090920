"""Scorers for LongProc's five tasks, keyed by task name."""

from __future__ import annotations

from .countdown import score_countdown
from .html_to_tsv import score_html_to_tsv
from .path_traversal import score_path_traversal
from .pseudo_to_code import score_pseudo_to_code
from .tom_tracking import score_tom_tracking

LONGPROC_SCORERS = {
    "countdown": score_countdown,
    "html_to_tsv": score_html_to_tsv,
    "path_traversal": score_path_traversal,
    "pseudo_to_code": score_pseudo_to_code,
    "tom_tracking": score_tom_tracking,
}

__all__ = [
    "LONGPROC_SCORERS",
    "score_countdown",
    "score_html_to_tsv",
    "score_path_traversal",
    "score_pseudo_to_code",
    "score_tom_tracking",
]
