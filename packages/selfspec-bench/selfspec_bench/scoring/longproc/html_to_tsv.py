"""LongProc HTML-to-TSV: row-level F1 of the extracted table against the gold table.

The table is the last ```tsv``` block (else an untagged block with tabs, else the
raw reply). Cells are normalized as in LongProc (lowercase, no punctuation, no
articles, no whitespace); a row matches a gold row when all cells match. The first
row is dropped as the header when it matches the gold header. Rows are matched as
a multiset, so duplicated rows only count as often as the gold has them.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from ...datasets.sample import BenchSample
from ..extract import fenced_blocks, strip_reasoning
from ..result import ScoreResult

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_cell(cell: str) -> str:
    text = "".join(ch for ch in cell.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return "".join(text.split())


def parse_rows(table: str) -> list[tuple[str, ...]]:
    return [
        tuple(normalize_cell(cell) for cell in line.split("\t")) for line in table.strip().splitlines() if line.strip()
    ]


def extract_table(reply: str) -> str:
    reply = strip_reasoning(reply)
    blocks = fenced_blocks(reply)
    tsv = [body for lang, body in blocks if lang == "tsv"]
    if tsv:
        return tsv[-1]
    tabbed = [body for lang, body in blocks if "\t" in body]
    return tabbed[-1] if tabbed else reply


def row_f1(predicted: str, gold: str) -> tuple[float, float, float, int, int]:
    """(f1, precision, recall, predicted rows, gold rows), headers excluded."""
    gold_rows = parse_rows(gold)
    header, gold_rows = gold_rows[0], gold_rows[1:]
    pred_rows = parse_rows(predicted)
    if pred_rows and pred_rows[0] == header:
        pred_rows = pred_rows[1:]
    if not pred_rows or not gold_rows:
        return 0.0, 0.0, 0.0, len(pred_rows), len(gold_rows)
    matched = sum((Counter(pred_rows) & Counter(gold_rows)).values())
    precision, recall = matched / len(pred_rows), matched / len(gold_rows)
    f1 = 0.0 if matched == 0 else 2 * precision * recall / (precision + recall)
    return f1, precision, recall, len(pred_rows), len(gold_rows)


def score_html_to_tsv(sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    f1, precision, recall, n_pred, n_gold = row_f1(extract_table(completion_text), sample.reference["reference_output"])
    detail = f"row F1 {f1:.3f} (precision {precision:.3f}, recall {recall:.3f}; {n_pred} predicted, {n_gold} gold rows)"
    return ScoreResult(passed=f1 == 1.0, score=f1, detail=detail)
