"""The eval's summaries: one row per mode (score and speed next to target-only), and which
items the target, the draft alone and each CoSpec threshold solve."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from selfspec_research.cospec.eval_config import Mode


def summarize(records: Sequence[dict[str, Any]], modes: Sequence[Mode], task: str) -> list[dict[str, Any]]:
    """One row per mode: score, latency, speedup vs target-only, τ, acceptance, kept tokens."""
    rows = [r for r in records if r["task"] == task]
    target = [r for r in rows if r["mode"] == "target"]
    target_latency = sum(r["latency_s"] for r in target)
    target_tokens = {r["uid"]: r.get("token_ids_hash") for r in target}
    out = []
    for mode in modes:
        mine = [r for r in rows if r["label"] == mode.label]
        if not mine:
            continue
        latency = sum(r["latency_s"] for r in mine)
        tokens = sum(r["output_tokens"] for r in mine)
        forwards = sum(r["forwards"] for r in mine)
        proposed = sum(r["proposed_tokens"] for r in mine)
        same = [r.get("token_ids_hash") == target_tokens.get(r["uid"]) for r in mine]
        out.append(
            {
                "kind": "summary",
                "task": task,
                "mode": mode.name,
                "label": mode.label,
                "threshold": mode.threshold,
                "k": mode.k or None,
                "lossy": mode.lossy or any(r["lossy"] for r in mine),
                "items": len(mine),
                "accuracy": mean_or_none([float(r["passed"]) for r in mine]),
                "mean_score": mean_or_none([r["score"] for r in mine]),
                "mean_latency_s": round(latency / len(mine), 4),
                "speedup": round(target_latency / latency, 4) if latency > 0 and target_latency > 0 else None,
                "tokens_per_s": round(tokens / latency, 2) if latency > 0 else None,
                "tau": round(tokens / forwards, 4) if forwards else None,
                "accepted_per_forward": round(sum(r["accepted_tokens"] for r in mine) / forwards, 4)
                if forwards
                else None,
                "acceptance": round(sum(r["accepted_tokens"] for r in mine) / proposed, 4) if proposed else None,
                "kept_draft_tokens": sum(r["kept_draft_tokens"] for r in mine),
                "arbitrations": sum(r["arbitrations"] for r in mine),
                "same_as_target": round(sum(same) / len(same), 4),
                "mean_output_tokens": round(tokens / len(mine), 2),
            }
        )
    return out


def complementarity(records: Sequence[dict[str, Any]], task: str) -> list[dict[str, Any]]:
    """Which items the target and the draft alone solve, their oracle union, and what each
    CoSpec threshold solves beyond (or loses against) the target.

    Why: CoSpec can only beat the target's score on items where keeping draft tokens helps,
    so "items solved by the draft but not the target" bounds what arbitration can gain.
    Empty when the draft-alone mode did not run.
    """
    rows = [r for r in records if r["task"] == task and r.get("passed") is not None]
    by_label: dict[str, dict[str, bool]] = {}
    for r in rows:
        by_label.setdefault(r["label"], {})[r["uid"]] = bool(r["passed"])
    target, draft = by_label.get("target"), by_label.get("draft-alone")
    if not target or not draft:
        return []
    uids = sorted(set(target) & set(draft))
    row: dict[str, Any] = {
        "kind": "complementarity",
        "task": task,
        "items": len(uids),
        "target_solved": sum(target[u] for u in uids),
        "draft_solved": sum(draft[u] for u in uids),
        "draft_not_target": sum(draft[u] and not target[u] for u in uids),
        "target_not_draft": sum(target[u] and not draft[u] for u in uids),
        "union": sum(target[u] or draft[u] for u in uids),
        "cospec": {},
    }
    for label, passed in by_label.items():
        if label.startswith("cospec@"):
            common = [u for u in uids if u in passed]
            row["cospec"][label] = {
                "items": len(common),
                "solved": sum(passed[u] for u in common),
                "beyond_target": sum(passed[u] and not target[u] for u in common),
                "lost_vs_target": sum(target[u] and not passed[u] for u in common),
            }
    return [row]


def mean_or_none(values: Sequence[float]) -> float | None:
    """The mean to 4 decimals, None for no values (a table cell that says "–")."""
    return round(sum(values) / len(values), 4) if values else None


__all__ = ["complementarity", "mean_or_none", "summarize"]
