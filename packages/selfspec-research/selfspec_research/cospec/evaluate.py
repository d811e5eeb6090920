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

Counterfactual agreement (with an arbitrator): mismatch states are recorded on the SpS
path (CoSpec that never keeps, so the states do not depend on λ) together with π(keep).
A seeded sample of at most `counterfactual_states` states per task is continued twice by
the target, greedily, to the same token budget: once after the draft token, once after
the target's token; both full outputs are scored. At threshold λ the arbitrator's choice
is "draft" iff π ≥ λ (and λ < 1); it *agrees* when its branch scores at least as well as
the other. Most states are not decisive (both branches score the same), so agreement is
also reported on the decisive ones only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from selfspec_research.cospec.eval_tasks import EvalItem, EvalTask, build_task, check_heldout_seed
from selfspec.engine.sampling import SamplingParams
from selfspec_research.thinker.evaluate import HELDOUT_SEED
from selfspec_research.thinker.tasks import stable_rng

DEFAULT_DRAFT = "layers:8"
"""SmolLM2-135M has 30 layers: the first 8 (+ norm + head) draft at ~1/4 of a target forward."""
DEFAULT_THRESHOLDS: tuple[float, ...] = (0.3, 0.5, 0.6, 0.7, 0.9)
DEFAULT_K = 25  # the paper's draft block
NEVER_KEEP = 2.0  # a threshold above 1: CoSpec that only records states (exact SpS)


@dataclass(frozen=True)
class CoSpecEvalConfig:
    """What `run_cospec_eval` measures (recorded in results.jsonl)."""

    tasks: tuple[str, ...] = ("arithmetic_search", "gsm8k")
    n: int = 10
    seed: int = HELDOUT_SEED
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    k: int = DEFAULT_K
    max_tokens: int = 2048
    counterfactual_states: int = 8
    max_prefix_tokens: int = 512
    warmup: bool = True
    gsm8k_path: str | None = None
    humaneval_path: str | None = None
    # Also run the draft model alone: which items it solves that the target does not
    # (complementarity, the oracle union) is what CoSpec's score gain can come from.
    draft_alone: bool = True
    # SpS at other draft lengths beside `k` (e.g. 2, 3, 4): on a small target the draft's
    # steps are not cheap (8 of 30 layers cost ~1/3 of a target step on the H200, launch-
    # bound), so the best SpS K is small and differs from the K the arbitrator runs with.
    sps_k: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("no tasks given")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        bad = [t for t in self.thresholds if not 0.0 <= t <= 1.0]
        if bad:
            raise ValueError(f"thresholds must lie in [0, 1], got {bad}")
        if not 1 <= self.k <= 64:
            raise ValueError(f"k must be in [1, 64], got {self.k}")
        if any(not 1 <= k <= 64 for k in self.sps_k):
            raise ValueError(f"sps_k values must be in [1, 64], got {list(self.sps_k)}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.counterfactual_states < 0:
            raise ValueError(f"counterfactual_states must be >= 0, got {self.counterfactual_states}")

    def describe(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Mode:
    """One decoding mode of the comparison."""

    name: str  # "target" | "sps" | "cospec" | "draft" (the draft model alone)
    threshold: float | None = None
    k: int | None = None  # SpS only: a draft length other than the eval's K

    @property
    def lossy(self) -> bool:
        return self.name in ("cospec", "draft")  # not the target's tokens

    @property
    def label(self) -> str:
        if self.name == "draft":
            return "draft-alone"
        if self.name == "sps" and self.k is not None:
            return f"sps@k{self.k}"
        if self.name != "cospec":
            return self.name
        return "cospec-probe" if self.threshold is None else f"cospec@{self.threshold:g}"


def modes_for(config: CoSpecEvalConfig, with_arbitrator: bool) -> list[Mode]:
    """target, SpS, the draft alone (if configured), then CoSpec per threshold (only with an arbitrator)."""
    modes = [Mode("target"), Mode("sps")] + [Mode("sps", k=k) for k in config.sps_k if k != config.k]
    modes += [Mode("draft")] if config.draft_alone else []
    if with_arbitrator:
        modes += [Mode("cospec", t) for t in config.thresholds]
    return modes


def spec_for(mode: Mode, config: CoSpecEvalConfig, arbitrator: Any, recorder: Callable | None = None) -> Any:
    from selfspec.spec.cospec.policy import CoSpecConfig
    from selfspec.spec.baselines import SpeculationConfig

    if mode.name in ("target", "draft"):
        return None
    if mode.name == "sps":
        return SpeculationConfig(method="draft", num_speculative_tokens=mode.k or config.k)
    return CoSpecConfig(
        num_speculative_tokens=config.k,
        threshold=mode.threshold if mode.threshold is not None else NEVER_KEEP,
        max_prefix_tokens=config.max_prefix_tokens,
        arbitrator=arbitrator,
        recorder=recorder,
    )


def answer_text(llm: Any, output_ids: Sequence[int], thinking: bool) -> str:
    """The answer part of an output (after the end-of-thinking marker), decoded.

    One function for every run and every counterfactual branch, so all are scored alike.
    """
    from selfspec.thinking.format import split_reasoning

    fmt = llm.thinking_format
    ids = list(output_ids)
    if fmt is not None:
        _, ids = split_reasoning(ids, fmt, starts_in_thinking=thinking)
    return llm.tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class _Ctx:
    """What the runs of one eval share."""

    llm: Any
    arbitrator: Any
    config: CoSpecEvalConfig
    params: SamplingParams
    tick: Callable[[int], None] = lambda n: None
    _draft: Any = None

    def draft_llm(self) -> Any:
        """The draft model as an LLM of its own (its own engine and cache), built once."""
        if self._draft is None:
            self._draft = draft_as_llm(self.llm)
        return self._draft


def draft_as_llm(llm: Any) -> Any:
    """An `LLM` over `llm`'s draft module: same tokenizer and thinking format, its own engine
    (a shallow draft shares weights with the target, not its KV cache)."""
    from selfspec.engine.llm_engine import EngineConfig
    from selfspec.llm import LLM

    engine = llm.engine
    config = EngineConfig(num_slots=2, max_len=engine.max_len)  # the device is the module's
    return LLM.from_model(
        llm.draft_runner.model, llm.tokenizer, engine_config=config, thinking_format=llm.thinking_format,
        name=f"{getattr(llm, 'model_name', 'custom')}:draft",
    )


def _run(ctx: _Ctx, task: EvalTask, item: EvalItem, mode: Mode, recorder: Callable | None = None) -> tuple[dict[str, Any], Any]:
    """Run one item alone in one mode; the record and the raw result."""
    spec = spec_for(mode, ctx.config, ctx.arbitrator, recorder)
    llm = ctx.draft_llm() if mode.name == "draft" else ctx.llm
    started = time.perf_counter()
    (out,) = llm.generate([item.messages], ctx.params, spec=spec, thinking=task.thinking)
    latency = time.perf_counter() - started
    m = out.metrics
    record = {
        "kind": "item",
        "task": task.name,
        "uid": item.uid,
        "mode": mode.name,
        "label": mode.label,
        "threshold": mode.threshold,
        "lossy": bool(m.get("lossy", False)) or mode.lossy,
        "latency_s": latency,
        "output_tokens": len(out.token_ids),
        "forwards": int(m.get("forwards", 0)),
        "proposed_tokens": int(m.get("proposed_tokens", 0)),
        "accepted_tokens": int(m.get("accepted_tokens", 0)),
        "verify_steps": int(m.get("verify_steps", 0)),
        "kept_draft_tokens": int(m.get("kept_draft_tokens", 0)),
        "arbitrations": int(m.get("arbitrations", 0)),
        "arbitration_s": round(float(m.get("arbitration_s", 0.0)), 4),
        "finish": f"{out.finish_reason}:{out.finish_detail}",
        "thinking": out.reasoning_text is not None,
    }
    return record, out


def _score_runs(task: EvalTask, runs: list[tuple[EvalItem, dict[str, Any], str]]) -> None:
    """Score every run's answer text in one batch (one checker subprocess per family)."""
    verdicts = task.score([item.reference for item, _, _ in runs], [text for _, _, text in runs])
    for (_, record, text), (passed, score) in zip(runs, verdicts):
        record.update(passed=bool(passed), score=round(float(score), 4), answer_excerpt=text[:200])


class _Journal:
    """The eval's append-only progress file (`partial.jsonl` beside the results).

    Why: a device session can end in the middle of an eval; every finished run (with its
    full answer text, so it can be scored later) and every finished task is on disk, and a
    re-run with the same config resumes there instead of starting over.
    """

    def __init__(self, path: Path | None, identity: dict[str, Any]) -> None:
        self.path = path
        identity = json.loads(json.dumps(identity))  # as it reads back (tuples become lists)
        self.runs: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.tasks: dict[str, dict[str, Any]] = {}
        if path is None:
            return
        if path.exists():
            text = path.read_text()
            if text and not text.endswith("\n"):
                with path.open("a") as handle:  # close the cut line: the next record starts on its own
                    handle.write("\n")
            lines = []
            for line in text.splitlines():
                try:
                    lines.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by the kill this journal exists for: that run is redone
            if lines and lines[0].get("identity") != identity:
                raise ValueError(
                    f"{path} was written by an eval with another config, model or arbitrator; remove it or use another --out"
                )
            for line in lines[1:]:
                if line["kind"] == "run":
                    self.runs[(line["task"], line["uid"], line["label"])] = line
                elif line["kind"] == "task_done":
                    self.tasks[line["task"]] = line
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"kind": "journal", "identity": identity})

    def _append(self, line: dict[str, Any]) -> None:
        if self.path is not None:
            with self.path.open("a") as handle:
                handle.write(json.dumps(line) + "\n")

    def run_done(self, record: dict[str, Any], answer: str) -> None:
        self._append({**record, "kind": "run", "answer": answer})

    def task_done(self, task: str, **parts: Any) -> None:
        self._append({"kind": "task_done", "task": task, **parts})


def _warmup(ctx: _Ctx, task: EvalTask, modes: Sequence[Mode]) -> None:
    """One short untimed run per kind of mode: lazy inits and kernel selection happen here."""
    saved = ctx.params
    ctx.params = SamplingParams(max_tokens=min(16, saved.max_tokens))
    try:
        seen: set[str] = set()
        for mode in modes:
            if mode.name not in seen:
                seen.add(mode.name)
                _run(ctx, task, task.items[0], mode)
    finally:
        ctx.params = saved


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
                "accuracy": _mean([float(r["passed"]) for r in mine]),
                "mean_score": _mean([r["score"] for r in mine]),
                "mean_latency_s": round(latency / len(mine), 4),
                "speedup": round(target_latency / latency, 4) if latency > 0 and target_latency > 0 else None,
                "tokens_per_s": round(tokens / latency, 2) if latency > 0 else None,
                "tau": round(tokens / forwards, 4) if forwards else None,
                "accepted_per_forward": round(sum(r["accepted_tokens"] for r in mine) / forwards, 4) if forwards else None,
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


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _fingerprint(arbitrator: Any) -> str | None:
    """A hash of the arbitrator's trained weights: a journal from another checkpoint at the
    same path (e.g. after more RL) must not be resumed."""
    if arbitrator is None:
        return None
    import hashlib

    digest = hashlib.sha256()
    for name, param in sorted(arbitrator.named_parameters()):
        if param.requires_grad or name.startswith("head"):
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _token_hash(ids: Sequence[int]) -> str:
    import hashlib

    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------- counterfactual


def counterfactual(
    ctx: _Ctx, task: EvalTask, thinking_by_uid: dict[str, bool]
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
        _run(ctx, task, item, Mode("cospec", None), recorder=decisions.append)  # never keeps: the SpS path
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
        results = llm.generate([prompts[i] for i in todo], params, thinking=False)
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
                "kept_share": _mean([float(r["choice"][key] == "draft") for r in records]),
                "agreement": _mean([float(r["agrees"][key]) for r in records]),
                "decisive_states": len(decisive),
                "decisive_agreement": _mean([float(r["agrees"][key]) for r in decisive]),
                "draft_branch_better": sum(r["draft_score"] > r["target_score"] for r in records),
                "target_branch_better": sum(r["target_score"] > r["draft_score"] for r in records),
            }
        )
    return rows


# ---------------------------------------------------------------------- driver


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
            head, *self.items, *self.summaries, *self.complementarity, *self.counterfactual_states,
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
    config and file skips the runs and tasks it finished (`_Journal`).
    """
    journal_path = Path(journal_path) if journal_path is not None else None
    from tqdm import tqdm

    if getattr(llm, "draft_runner", None) is None:
        raise ValueError("the eval needs a draft model: LLM(..., draft='layers:N')")
    if llm.tokenizer is None:
        raise ValueError("the eval needs a tokenizer (answers are scored as text)")
    training = (getattr(arbitrator, "identity", {}) or {}).get("training", {}) or {}
    forbidden = list(training.get("data_seeds", []))
    check_heldout_seed(config.seed, config.tasks, forbidden)
    trained_gsm8k = [str(i) for i in training.get("gsm8k_ids", [])]  # the arbitrator's GSM8K training items
    tasks = [
        build_task(name, config.n, config.seed, gsm8k_path=config.gsm8k_path, exclude_gsm8k_ids=trained_gsm8k,
                   humaneval_path=config.humaneval_path)
        for name in config.tasks
    ]
    modes = modes_for(config, arbitrator is not None)
    # Units: one per timed run, plus (with an arbitrator) one per probe run and per sampled state.
    states = config.counterfactual_states if arbitrator is not None else 0
    total = sum(len(t.items) * len(modes) + (len(t.items) + states if states else 0) for t in tasks)
    bar = tqdm(total=total, desc="cospec eval", unit="run", disable=not progress)
    ctx = _Ctx(llm, arbitrator, config, SamplingParams(max_tokens=config.max_tokens), tick=bar.update)
    from selfspec.run_info import device_name, library_versions

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
    journal = _Journal(journal_path, identity)
    try:
        if config.warmup and any(task.name not in journal.tasks for task in tasks):
            _warmup(ctx, tasks[0], modes)
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
                        record, out = _run(ctx, task, item, mode)
                        record["token_ids_hash"] = _token_hash(out.token_ids)
                        answer = answer_text(ctx.llm, out.token_ids, record["thinking"])
                        journal.run_done(record, answer)
                        log(
                            f"  {task.name} {item.uid} {mode.label}: {record['latency_s']:.2f} s, "
                            f"{record['output_tokens']} tokens, {record['forwards']} forwards of the decoding model, "
                            f"{record['arbitrations']} arbitrations ({record['arbitration_s']:.2f} s)"
                        )
                    runs.append((item, record, answer))
                    bar.update(1)
            _score_runs(task, runs)
            records = [record for _, record, _ in runs]
            target_hash = {r["uid"]: r["token_ids_hash"] for r in records if r["mode"] == "target"}
            for r in records:
                r["same_as_target"] = r["token_ids_hash"] == target_hash.get(r["uid"])
            summaries = summarize(records, modes, task.name)
            complement = complementarity(records, task.name)
            thinking_by_uid = {r["uid"]: r["thinking"] for r in records if r["mode"] == "target"}
            cf_states, cf_rows = counterfactual(ctx, task, thinking_by_uid)
            journal.task_done(
                task.name, items=records, summaries=summaries, counterfactual_states=cf_states,
                counterfactual_summaries=cf_rows, complementarity=complement,
            )
            results.items += records
            results.summaries += summaries
            results.complementarity += complement
            results.counterfactual_states += cf_states
            results.counterfactual_summaries += cf_rows
    finally:
        bar.close()
    return results


__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_K",
    "DEFAULT_THRESHOLDS",
    "CoSpecEvalConfig",
    "CoSpecEvalResults",
    "Mode",
    "answer_text",
    "complementarity",
    "draft_as_llm",
    "modes_for",
    "run_cospec_eval",
    "summarize",
]
