"""Mismatch states and their counterfactual labels: the arbitrator's SFT data.

1. **Collection.** Greedy SpS rollouts (CoSpec in collection mode: threshold > 1, nothing
   kept, `CoSpecConfig.recorder` gets every first mismatch of a round with its full
   context) over the training items. Per item at most `states_per_item` mismatch states
   are sampled (seeded), `max_states` in all.
2. **Counterfactual labels (the paper's labelling, with the task checkers).** At each
   sampled state the target continues greedily twice, through the engine in one batch:
   from context + draft token and from context + target token, to the end of the output
   (EOS) or `cf_max_new_tokens` (and never past the rollout's `max_tokens` nor the
   context). Both outputs are scored by the item's checker (thinker `check_many`: partial
   credit; GSM8K: exact numeric answer). Label 1 if the draft branch scores higher, 0 if
   lower. When the checker ties (most states: both branches pass or both fail alike) the
   label falls back to the likelihood-gain rule of `training.labels_from_gains`: the
   target's summed log-probability of (decided token + the first `gain_horizon`
   continuation tokens) on the draft branch minus the same on the target branch, label =
   gain >= -`gain_margin` (`tie_label="keep"` instead labels ties 1: "the draft branch is
   at least as good").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from selfspec import CoSpecConfig, SamplingParams
from selfspec.spec.cospec.arbitrator import ArbitrationState
from selfspec.spec.cospec.policy import Decision
from selfspec_research.cospec.arbitrator_config import TrainConfig
from selfspec_research.cospec.eval_config import NEVER_KEEP
from selfspec_research.cospec.eval_tasks import EvalItem, EvalTask, answer_text
from selfspec_research.cospec.rollouts import Request, fits, is_cancelled, run_requests
from selfspec_research.cospec.training import labels_from_gains
from selfspec_research.thinker.tasks import stable_rng


@dataclass
class CollectedState:
    """A sampled mismatch state with what labelling needs."""

    task: str
    uid: str
    decision: Decision
    thinking: bool  # whether the rollout's prompt started in thinking (for answer extraction)


def collect_states(
    llm,
    tasks: Sequence[EvalTask],
    config: TrainConfig,
    *,
    deadline: float | None = None,
    progress: bool = False,
) -> tuple[list[CollectedState], dict[str, Any]]:
    """SpS rollouts over every training item; sampled mismatch states and rollout stats."""
    jobs: list[tuple[EvalTask, EvalItem, list[Decision]]] = []
    requests: list[Request] = []
    skipped = 0
    for task in tasks:
        for item in task.items:
            if not fits(llm, item, task.thinking):
                skipped += 1
                continue
            decisions: list[Decision] = []
            spec = CoSpecConfig(
                num_speculative_tokens=config.k,
                threshold=NEVER_KEEP,  # nothing is kept: exact SpS that records the states
                max_prefix_tokens=config.max_prefix_tokens,
                prefix_window=config.prefix_window,
                recorder=decisions.append,
            )
            jobs.append((task, item, decisions))
            requests.append(Request(item.messages, SamplingParams(max_tokens=config.max_tokens), spec, task.thinking))
    bar = tqdm(total=len(requests), desc="collect (SpS)", unit="rollout", disable=not progress)
    try:
        seqs = run_requests(llm, requests, deadline, bar)
    finally:
        bar.close()
    results = [llm.result(s) for s in seqs]
    found: list[CollectedState] = []
    passed: dict[str, list[float]] = {}
    by_task: dict[str, list[int]] = {}
    for index, ((task, item, _), out) in enumerate(zip(jobs, results)):
        if not is_cancelled(seqs[index]):
            by_task.setdefault(task.name, []).append(index)
    # The SpS outputs are the target's own: score them once (the target's accuracy on training items).
    for name, indices in by_task.items():
        task = jobs[indices[0]][0]
        texts = [answer_text(llm, results[i].token_ids, results[i].reasoning_text is not None) for i in indices]
        verdicts = task.score([jobs[i][1].reference for i in indices], texts)
        passed[name] = [float(s) for _, s in verdicts]
    for (task, item, decisions), out in zip(jobs, results):
        usable = [d for d in decisions if d.context]
        rng = stable_rng("cospec-train-states", config.seed, item.uid)
        chosen = sorted(rng.sample(range(len(usable)), min(config.states_per_item, len(usable))))
        thinking = out.reasoning_text is not None
        found += [CollectedState(task.name, item.uid, usable[i], thinking) for i in chosen]
    if len(found) > config.max_states:
        rng = stable_rng("cospec-train-cap", config.seed)
        found = [found[i] for i in sorted(rng.sample(range(len(found)), config.max_states))]
    stats = {
        "rollouts": len(requests),
        "skipped_items_too_long": skipped,
        "cancelled_rollouts": sum(is_cancelled(s) for s in seqs),
        "mismatches": sum(len(d) for _, _, d in jobs),
        "states": len(found),
        "output_tokens": sum(len(r.token_ids) for r in results),
        "target_score_by_task": {name: round(sum(v) / len(v), 4) for name, v in passed.items() if v},
    }
    return found, stats


@dataclass
class LabelledState:
    """One SFT example: the state, its label and how the label was decided."""

    task: str
    uid: str
    state: ArbitrationState
    label: float
    source: str  # "checker" | "likelihood" | "tie-keep"
    draft_score: float
    target_score: float
    gain: float | None = None
    finish: tuple[str, str] = ("", "")  # the draft / target branch's finish reasons
    branch_tokens: tuple[int, int] = (0, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "uid": self.uid,
            "label": self.label,
            "source": self.source,
            "draft_score": self.draft_score,
            "target_score": self.target_score,
            "gain": self.gain,
            "finish": list(self.finish),
            "branch_tokens": list(self.branch_tokens),
            "prefix": list(self.state.prefix),
            "draft_block": list(self.state.draft_block),
            "target_block": list(self.state.target_block),
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> "LabelledState":
        state = ArbitrationState(tuple(row["prefix"]), tuple(row["draft_block"]), tuple(row["target_block"]))
        return cls(
            row["task"],
            row["uid"],
            state,
            float(row["label"]),
            row["source"],
            float(row["draft_score"]),
            float(row["target_score"]),
            row.get("gain"),
            tuple(row.get("finish", ("", ""))),
            tuple(row.get("branch_tokens", (0, 0))),
        )


@torch.inference_mode()
def branch_logprob_sums(
    model: torch.nn.Module,
    rows: Sequence[tuple[Sequence[int], int]],
    *,
    window: int = 1024,
    tokens_per_batch: int = 8192,
) -> list[float]:
    """Summed target log-probability of the last `n` tokens of each row (`rows`: (ids, n)).

    Each row is cut to its last `window + n` tokens; rows run right-padded in batches.
    """
    device = next(model.parameters()).device
    cut = [(list(ids)[-(window + n) :], n) for ids, n in rows]
    order = sorted(range(len(cut)), key=lambda i: len(cut[i][0]))
    out = [0.0] * len(cut)
    start = 0
    while start < len(order):  # ascending lengths: grow the group while rows x longest fits
        end = start + 1
        while end < len(order) and len(cut[order[end]][0]) * (end - start + 1) <= tokens_per_batch:
            end += 1
        group = order[start:end]
        width = max(len(cut[i][0]) for i in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for b, i in enumerate(group):
            tokens = cut[i][0]
            ids[b, : len(tokens)] = torch.tensor(tokens)
            mask[b, : len(tokens)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        for b, i in enumerate(group):
            tokens, n = cut[i]
            if n == 0:
                continue
            length = len(tokens)
            positions = torch.arange(length - n - 1, length - 1, device=device)
            targets = ids[b, length - n : length].to(device)
            out[i] = float(logprobs[b, positions, targets].sum())
        start = end
    return out


def label_states(
    llm,
    states: Sequence[CollectedState],
    tasks: Sequence[EvalTask],
    config: TrainConfig,
    *,
    deadline: float | None = None,
    progress: bool = False,
) -> tuple[list[LabelledState], dict[str, Any]]:
    """Counterfactual continuations of every state, both branches batched; checker labels (module doc)."""
    task_by_name = {t.name: t for t in tasks}
    reference = {(t.name, item.uid): item.reference for t in tasks for item in t.items}
    requests: list[Request] = []
    budgets: list[int] = []
    for index, collected in enumerate(states):
        d = collected.decision
        used = len(d.context) - d.prompt_len
        room = llm.engine.max_len - len(d.context) - 1
        budget = max(0, min(config.cf_max_new_tokens, config.max_tokens - used - 1, room))
        budgets.append(budget)
        for token in (d.state.draft_block[0], d.state.target_block[0]):
            if budget > 0:
                requests.append(Request(list(d.context) + [token], SamplingParams(max_tokens=budget), None, False))
    bar = tqdm(total=len(requests), desc="label (2 branches/state)", unit="branch", disable=not progress)
    try:
        seqs = run_requests(llm, requests, deadline, bar)
    finally:
        bar.close()
    continuations: list[tuple[list[int], list[int]]] = []
    finishes: list[tuple[str, str]] = []
    keep: list[int] = []
    cursor = 0
    for index, budget in enumerate(budgets):
        if budget == 0:
            continuations.append(([], []))
            finishes.append(("length", "length"))
            keep.append(index)
            continue
        pair = seqs[cursor : cursor + 2]
        cursor += 2
        if any(is_cancelled(s) for s in pair):
            continuations.append(([], []))
            finishes.append(("cancelled", "cancelled"))
            continue
        continuations.append((list(pair[0].output_ids), list(pair[1].output_ids)))
        finishes.append(tuple(getattr(s.finish_reason, "value", str(s.finish_reason)) for s in pair))
        keep.append(index)
    # Score both branches' full outputs with the item's checker (batched per task).
    verdicts: dict[tuple[int, int], float] = {}
    per_task: dict[str, list[tuple[int, int, str]]] = {}
    for index in keep:
        collected = states[index]
        d = collected.decision
        for branch, token in enumerate((d.state.draft_block[0], d.state.target_block[0])):
            ids = list(d.context[d.prompt_len :]) + [token] + continuations[index][branch]
            per_task.setdefault(collected.task, []).append((index, branch, answer_text(llm, ids, collected.thinking)))
    for name, entries in per_task.items():
        refs = [reference[(name, states[i].uid)] for i, _, _ in entries]
        scores = task_by_name[name].score(refs, [text for _, _, text in entries])
        for (i, branch, _), (_, score) in zip(entries, scores):
            verdicts[(i, branch)] = float(score)
    # Likelihood gains for the ties (the fallback label).
    ties = [i for i in keep if verdicts[(i, 0)] == verdicts[(i, 1)]]
    gains: dict[int, float] = {}
    if ties and config.tie_label == "likelihood":
        rows = []
        for i in ties:
            d = states[i].decision
            h = min(config.gain_horizon, len(continuations[i][0]), len(continuations[i][1]))
            for branch, token in enumerate((d.state.draft_block[0], d.state.target_block[0])):
                rows.append((list(d.context) + [token] + continuations[i][branch][:h], h + 1))
        sums = branch_logprob_sums(llm.model, rows, window=max(config.max_prefix_tokens, 256))
        gains = {i: sums[2 * j] - sums[2 * j + 1] for j, i in enumerate(ties)}
    labelled: list[LabelledState] = []
    for i in keep:
        collected = states[i]
        d = collected.decision
        draft_score, target_score = verdicts[(i, 0)], verdicts[(i, 1)]
        gain = gains.get(i)
        if draft_score != target_score:
            label, source = float(draft_score > target_score), "checker"
        elif config.tie_label == "keep":
            label, source = 1.0, "tie-keep"
        else:
            label, source = float(labels_from_gains(torch.tensor([gain]), config.gain_margin)[0]), "likelihood"
        labelled.append(
            LabelledState(
                collected.task,
                collected.uid,
                d.state,
                label,
                source,
                draft_score,
                target_score,
                gain,
                finishes[i],
                (int(d.state.draft_block[0]), int(d.state.target_block[0])),
            )
        )
    stats = {
        "states": len(states),
        "labelled": len(labelled),
        "dropped_by_deadline": len(states) - len(keep),
        "decisive": sum(x.source == "checker" for x in labelled),
        "draft_better": sum(x.draft_score > x.target_score for x in labelled),
        "target_better": sum(x.target_score > x.draft_score for x in labelled),
        "positive_share": round(sum(x.label for x in labelled) / len(labelled), 4) if labelled else None,
        "branch_tokens": sum(len(c[0]) + len(c[1]) for c in continuations),
    }
    return labelled, stats


__all__ = ["CollectedState", "LabelledState", "branch_logprob_sums", "collect_states", "label_states"]
