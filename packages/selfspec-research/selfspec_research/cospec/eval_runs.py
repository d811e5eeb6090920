"""One eval run: an item decoded alone in one mode, timed, and its record.

Every mode runs through `run_item` (batch 1: speculative decoding is a latency
technique), so target-only, SpS, the draft alone and CoSpec are measured alike; the
draft-alone mode runs on the draft module as an `LLM` of its own (`draft_as_llm`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from selfspec import LLM, CoSpecConfig, DraftModelConfig, EngineConfig, SamplingParams
from selfspec_research.cospec.eval_config import NEVER_KEEP, CoSpecEvalConfig, Mode
from selfspec_research.cospec.eval_tasks import EvalItem, EvalTask


def spec_for(mode: Mode, config: CoSpecEvalConfig, arbitrator: Any, recorder: Callable | None = None) -> Any:
    """The speculation config a mode runs with (None: plain decoding, of the target or the draft)."""
    if mode.name in ("target", "draft"):
        return None
    if mode.name == "sps":
        return DraftModelConfig(num_speculative_tokens=mode.k or config.k)
    return CoSpecConfig(
        num_speculative_tokens=config.k,
        threshold=mode.threshold if mode.threshold is not None else NEVER_KEEP,
        max_prefix_tokens=config.max_prefix_tokens,
        prefix_window=config.prefix_window,
        arbitrator=arbitrator,
        recorder=recorder,
    )


@dataclass
class RunContext:
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


def draft_as_llm(llm: Any, num_slots: int = 2) -> Any:
    """An `LLM` over `llm`'s draft module: same tokenizer and thinking format, its own engine
    (a shallow draft shares weights with the target, not its KV cache). `num_slots` > 2 for
    batched runs of the draft alone (solve rates, not timings)."""
    engine = llm.engine
    config = EngineConfig(num_slots=num_slots, max_len=engine.max_len)  # the device is the module's
    return LLM.from_model(
        llm.draft_runner.model,
        llm.tokenizer,
        engine_config=config,
        thinking_format=llm.thinking_format,
        name=f"{getattr(llm, 'model_name', 'custom')}:draft",
    )


def run_item(
    ctx: RunContext, task: EvalTask, item: EvalItem, mode: Mode, recorder: Callable | None = None
) -> tuple[dict[str, Any], Any]:
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


def score_runs(task: EvalTask, runs: list[tuple[EvalItem, dict[str, Any], str]]) -> None:
    """Score every run's answer text in one batch (one checker subprocess per family)."""
    verdicts = task.score([item.reference for item, _, _ in runs], [text for _, _, text in runs])
    for (_, record, text), (passed, score) in zip(runs, verdicts):
        record.update(passed=bool(passed), score=round(float(score), 4), answer_excerpt=text[:200])


def warmup(ctx: RunContext, task: EvalTask, modes: Sequence[Mode]) -> None:
    """One short untimed run per kind of mode: lazy inits and kernel selection happen here."""
    saved = ctx.params
    ctx.params = SamplingParams(max_tokens=min(16, saved.max_tokens))
    try:
        seen: set[str] = set()
        for mode in modes:
            if mode.name not in seen:
                seen.add(mode.name)
                run_item(ctx, task, task.items[0], mode)
    finally:
        ctx.params = saved


def token_hash(ids: Sequence[int]) -> str:
    """A short hash of a token sequence: `same_as_target` compares outputs by it."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


__all__ = ["RunContext", "draft_as_llm", "run_item", "score_runs", "spec_for", "token_hash", "warmup"]
