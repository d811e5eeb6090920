"""Counterfactual agreement: does the arbitrator keep the draft token where that helps?

Mismatch states are recorded on the SpS path (CoSpec that never keeps, so the states do
not depend on λ) together with π(keep). A seeded sample of at most
`counterfactual_states` states per task is continued twice by the target, greedily, to
the same token budget: once after the draft token, once after the target's token; both
full outputs are scored. At threshold λ the arbitrator's choice is "draft" iff π ≥ λ
(and λ < 1); it *agrees* when its branch scores at least as well as the other. Most
states are not decisive (both branches score the same), so agreement is also reported on
the decisive ones only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from selfspec import SamplingParams
from selfspec_research.cospec.eval_config import Mode
from selfspec_research.cospec.eval_runs import RunContext, run_item
from selfspec_research.cospec.eval_summary import mean_or_none
from selfspec_research.cospec.eval_tasks import EvalItem, EvalTask, answer_text
from selfspec_research.thinker.tasks import stable_rng


def counterfactual(
    ctx: RunContext, task: EvalTask, thinking_by_uid: dict[str, bool]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Agreement of the arbitrator's choices with counterfactual outcomes (module doc).

    Returns the per-state records and one summary row per threshold.
    """
    limit = ctx.config.counterfactual_states
    if ctx.arbitrator is None or limit == 0:
        return [], []
    found: list[tuple[EvalItem, Any]] = []
    for item in task.items:
        decisions: list[Any] = []
        run_item(ctx, task, item, Mode("cospec", None), recorder=decisions.append)  # never keeps: the SpS path
        found += [(item, d) for d in decisions if d.keep_probability is not None and d.context]
        ctx.tick(1)
    rng = stable_rng("cospec-counterfactual", task.name, ctx.config.seed)
    chosen = sorted(rng.sample(range(len(found)), min(limit, len(found))))
    states = [found[i] for i in chosen]
    ctx.tick(limit - len(states))  # the progress bar counted `limit` states
    if not states:
        return [], _agreement_rows(task.name, [], ctx.config.thresholds)
    prompts: list[list[int]] = []
    budgets: list[int] = []
    for _, decision in states:
        used = len(decision.context) - decision.prompt_len
        room = ctx.llm.engine.max_len - len(decision.context) - 1
        budget = max(0, min(ctx.config.max_tokens - used - 1, room))
        for token in (decision.state.draft_block[0], decision.state.target_block[0]):
            prompts.append(list(decision.context) + [token])
            budgets.append(budget)
    continuations = _continue(ctx.llm, prompts, budgets)
    references, texts = [], []
    for index, (item, decision) in enumerate(states):
        for branch in range(2):
            ids = prompts[2 * index + branch][decision.prompt_len :] + continuations[2 * index + branch]
            references.append(item.reference)
            texts.append(answer_text(ctx.llm, ids, thinking_by_uid.get(item.uid, False)))
    verdicts = task.score(references, texts)
    records = []
    for index, (item, decision) in enumerate(states):
        (draft_passed, draft_score), (target_passed, target_score) = verdicts[2 * index], verdicts[2 * index + 1]
        p = float(decision.keep_probability)
        choices = {f"{t:g}": ("draft" if t < 1.0 and p >= t else "target") for t in ctx.config.thresholds}
        agrees = {
            key: (draft_score >= target_score) if choice == "draft" else (target_score >= draft_score)
            for key, choice in choices.items()
        }
        records.append(
            {
                "kind": "counterfactual",
                "task": task.name,
                "lossy": True,  # a CoSpec decision (keeping the draft token is the lossy branch)
                "uid": item.uid,
                "position": len(decision.context) - decision.prompt_len,
                "keep_probability": round(p, 4),
                "draft_token": int(decision.state.draft_block[0]),
                "target_token": int(decision.state.target_block[0]),
                "draft_passed": bool(draft_passed),
                "draft_score": round(float(draft_score), 4),
                "target_passed": bool(target_passed),
                "target_score": round(float(target_score), 4),
                "decisive": draft_score != target_score,
                "choice": choices,
                "agrees": agrees,
            }
        )
        ctx.tick(1)
    return records, _agreement_rows(task.name, records, ctx.config.thresholds)


def _continue(llm: Any, prompts: list[list[int]], budgets: list[int]) -> list[list[int]]:
    """Greedy target continuations of raw token contexts (empty where the budget is 0)."""
    out: list[list[int]] = [[] for _ in prompts]
    todo = [i for i, b in enumerate(budgets) if b > 0]
    if todo:
        params = [SamplingParams(max_tokens=budgets[i]) for i in todo]
        results = llm.generate([prompts[i] for i in todo], params, thinking=False, spec=None)
        for i, result in zip(todo, results):
            out[i] = list(result.token_ids)
    return out


def _agreement_rows(task: str, records: Sequence[dict[str, Any]], thresholds: Sequence[float]) -> list[dict[str, Any]]:
    rows = []
    decisive = [r for r in records if r["decisive"]]
    for t in thresholds:
        key = f"{t:g}"
        rows.append(
            {
                "kind": "counterfactual_summary",
                "task": task,
                "threshold": t,
                "lossy": True,
                "states": len(records),
                "kept_share": mean_or_none([float(r["choice"][key] == "draft") for r in records]),
                "agreement": mean_or_none([float(r["agrees"][key]) for r in records]),
                "decisive_states": len(decisive),
                "decisive_agreement": mean_or_none([float(r["agrees"][key]) for r in decisive]),
                "draft_branch_better": sum(r["draft_score"] > r["target_score"] for r in records),
                "target_branch_better": sum(r["target_score"] > r["draft_score"] for r in records),
            }
        )
    return rows


__all__ = ["counterfactual"]
