"""CoSpec evaluation: task score vs speed of target-only, SpS and CoSpec over thresholds.

CoSpec trades exactness for speed, so the only honest report puts its task score next to
the target's on the *same items*, and its speed next to lossless SpS with the *same draft
and block size*. Per task and item, every mode runs alone (batch 1: speculative decoding
is a latency technique) and the modes are interleaved item by item, so slow drift of the
machine hits every mode alike:

* target-only: plain greedy decoding; score and latency are the baselines;
* SpS: draft-model speculation, K draft tokens per round, exact greedy verification
  (lossless: its tokens must equal the target's, `same_as_target` checks it);
* CoSpec at each threshold λ: the arbitrator may keep the draft token at a round's first
  mismatch (LOSSY: every record says `lossy: true`).

Measures: score (the task's checker / GSM8K exact answer: pass rate and mean partial
credit), latency and `speedup` = target-only total latency / the mode's total latency on
the same items, τ = output tokens per target decode forward (accepted draft tokens + the
target's own token per verification; 1.0 for target-only; `accepted_per_forward` in the
JSONL is the same without the target's own token), acceptance = accepted / proposed draft
tokens (a kept draft token counts as accepted), kept draft tokens and arbitrations (CoSpec).

Counterfactual agreement (with an arbitrator, `cospec.counterfactual`): at sampled
mismatch states both branches are continued by the target and scored, and the
arbitrator's choice at each λ is compared with the better branch.

The pieces: options and modes in `eval_config`, one timed run in `eval_runs`, the
summaries in `eval_summary`, the resumable progress file in `eval_journal`, the files
(results.jsonl, report.md, the plot) in `eval_report`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from selfspec import SamplingParams
from selfspec.run_info import device_name, library_versions
from selfspec_research.cospec.counterfactual import counterfactual
from selfspec_research.cospec.eval_config import CoSpecEvalConfig, modes_for
from selfspec_research.cospec.eval_journal import Journal
from selfspec_research.cospec.eval_runs import RunContext, run_item, score_runs, token_hash, warmup
from selfspec_research.cospec.eval_summary import complementarity, summarize
from selfspec_research.cospec.eval_tasks import EvalItem, answer_text, build_task, check_heldout_seed


def _fingerprint(arbitrator: Any) -> str | None:
    """A hash of the arbitrator's trained weights: a journal from another checkpoint at the
    same path (e.g. after more RL) must not be resumed."""
    if arbitrator is None:
        return None
    digest = hashlib.sha256()
    for name, param in sorted(arbitrator.named_parameters()):
        if param.requires_grad or name.startswith("head"):
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


@dataclass
class CoSpecEvalResults:
    """Everything the report is built from; `lines()` is the content of results.jsonl."""

    config: dict[str, Any]
    meta: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)
    counterfactual_states: list[dict[str, Any]] = field(default_factory=list)
    counterfactual_summaries: list[dict[str, Any]] = field(default_factory=list)
    complementarity: list[dict[str, Any]] = field(default_factory=list)

    def lines(self) -> list[dict[str, Any]]:
        head = {"kind": "config", **self.meta, "config": self.config}
        return [
            head,
            *self.items,
            *self.summaries,
            *self.complementarity,
            *self.counterfactual_states,
            *self.counterfactual_summaries,
        ]


def run_cospec_eval(
    llm: Any,
    config: CoSpecEvalConfig,
    arbitrator: Any = None,
    *,
    progress: bool = True,
    meta: dict[str, Any] | None = None,
    log: Callable[[str], None] = lambda message: None,
    journal_path: str | Path | None = None,
) -> CoSpecEvalResults:
    """Run every task through every mode (module doc); `llm` must have a draft attached.

    `journal_path`: an append-only progress file; an interrupted eval re-run with the same
    config and file skips the runs and tasks it finished (`eval_journal.Journal`).
    """
    journal_path = Path(journal_path) if journal_path is not None else None
    if getattr(llm, "draft_runner", None) is None:
        raise ValueError("the eval needs a draft model: LLM(..., draft='layers:N')")
    if llm.tokenizer is None:
        raise ValueError("the eval needs a tokenizer (answers are scored as text)")
    training = (getattr(arbitrator, "identity", {}) or {}).get("training", {}) or {}
    forbidden = list(training.get("data_seeds", []))
    check_heldout_seed(config.seed, config.tasks, forbidden)
    trained_gsm8k = [str(i) for i in training.get("gsm8k_ids", [])]  # the arbitrator's GSM8K training items
    tasks = [
        build_task(
            name,
            config.n,
            config.seed,
            gsm8k_path=config.gsm8k_path,
            exclude_gsm8k_ids=trained_gsm8k,
            humaneval_path=config.humaneval_path,
            data_version=config.data_version,
        )
        for name in config.tasks
    ]
    modes = modes_for(config, arbitrator is not None)
    # Units: one per timed run, plus (with an arbitrator) one per probe run and per sampled state.
    states = config.counterfactual_states if arbitrator is not None else 0
    total = sum(len(t.items) * len(modes) + (len(t.items) + states if states else 0) for t in tasks)
    bar = tqdm(total=total, desc="cospec eval", unit="run", disable=not progress)
    ctx = RunContext(llm, arbitrator, config, SamplingParams(max_tokens=config.max_tokens), tick=bar.update)
    defaults = {
        "model": getattr(llm, "model_name", "custom"),
        "draft": getattr(llm, "draft_spec", None),
        "device": str(llm.engine.device),
        "device_name": device_name(llm.engine.device),
        "versions": library_versions(),
        "dtype": str(next(llm.model.parameters()).dtype).removeprefix("torch."),
    }
    results = CoSpecEvalResults(
        config=config.describe(),
        meta={**defaults, **(meta or {}), "modes": [m.label for m in modes], "with_arbitrator": arbitrator is not None},
    )
    identity = {
        "config": results.config,
        "model": results.meta.get("model"),
        "draft": results.meta.get("draft"),
        "dtype": results.meta.get("dtype"),
        "arbitrator": _fingerprint(arbitrator),
    }
    journal = Journal(journal_path, identity)
    try:
        if config.warmup and any(task.name not in journal.tasks for task in tasks):
            warmup(ctx, tasks[0], modes)
        for task in tasks:
            done = journal.tasks.get(task.name)
            if done is not None:  # finished by an earlier, interrupted invocation
                log(f"{task.name}: finished earlier ({journal_path})")
                results.items += done["items"]
                results.summaries += done["summaries"]
                results.complementarity += done.get("complementarity", [])
                results.counterfactual_states += done["counterfactual_states"]
                results.counterfactual_summaries += done["counterfactual_summaries"]
                bar.update(len(task.items) * len(modes) + (len(task.items) + states if states else 0))
                continue
            log(f"{task.name}: {len(task.items)} items x {len(modes)} modes")
            runs: list[tuple[EvalItem, dict[str, Any], str]] = []
            for item in task.items:
                for mode in modes:
                    bar.set_postfix_str(f"{task.name} {mode.label}", refresh=False)
                    earlier = journal.runs.get((task.name, item.uid, mode.label))
                    if earlier is not None:
                        answer = earlier.pop("answer")
                        record = {**earlier, "kind": "item"}
                    else:
                        record, out = run_item(ctx, task, item, mode)
                        record["token_ids_hash"] = token_hash(out.token_ids)
                        answer = answer_text(ctx.llm, out.token_ids, record["thinking"])
                        journal.run_done(record, answer)
                        log(
                            f"  {task.name} {item.uid} {mode.label}: {record['latency_s']:.2f} s, "
                            f"{record['output_tokens']} tokens, {record['forwards']} forwards of the decoding model, "
                            f"{record['arbitrations']} arbitrations ({record['arbitration_s']:.2f} s)"
                        )
                    runs.append((item, record, answer))
                    bar.update(1)
            score_runs(task, runs)
            records = [record for _, record, _ in runs]
            target_hash = {r["uid"]: r["token_ids_hash"] for r in records if r["mode"] == "target"}
            for r in records:
                r["same_as_target"] = r["token_ids_hash"] == target_hash.get(r["uid"])
            summaries = summarize(records, modes, task.name)
            complement = complementarity(records, task.name)
            thinking_by_uid = {r["uid"]: r["thinking"] for r in records if r["mode"] == "target"}
            cf_states, cf_rows = counterfactual(ctx, task, thinking_by_uid)
            journal.task_done(
                task.name,
                items=records,
                summaries=summaries,
                counterfactual_states=cf_states,
                counterfactual_summaries=cf_rows,
                complementarity=complement,
            )
            results.items += records
            results.summaries += summaries
            results.complementarity += complement
            results.counterfactual_states += cf_states
            results.counterfactual_summaries += cf_rows
    finally:
        bar.close()
    return results


__all__ = ["CoSpecEvalResults", "run_cospec_eval"]
