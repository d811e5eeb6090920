"""Benchmark modes: each name maps to a speculation config (or an external baseline).

All engine modes run on the same `LLM` under the same thinking limits, so their latencies
are side-by-side ratios against `baseline` from the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from selfspec.config import DraftModelConfig, PromptLookupConfig, SuffixDecodingConfig
from selfspec.spec.ssr import SSRConfig
from selfspec.spec.suffix import SuffixOptions

ENGINE_MODES = (
    "baseline",
    "prefix",
    "suffix",
    "prefix+suffix",
    "ssr+think",
    "ssr+spec",
    "ssr+lookup",
    "ssr-gated",
    "ssr+think-gated",
    "ssr+spec-gated",
    "ssr+lookup-gated",
    "iterative",
    "iterative-converge",
    "suffix-decoding",
    "prompt-lookup",
    "suffix+lookup",
    "sps",
    "ssr-off",
    "auto",
)
SSR_MODES = tuple(
    m
    for m in ENGINE_MODES
    if m not in ("baseline", "ssr-off", "suffix-decoding", "prompt-lookup", "suffix+lookup", "sps")
)
"""Our methods (SSR with fixed budgets, gated, composed, iterative; `auto`, the default policy): every
engine mode but the baseline, the peers and ssr-off (drafts thrown away: drafting's cost alone)."""
EXTERNAL_MODES = ("hf-generate", "hf-prompt-lookup")
CONVERGE_TOKENS = 32
"""iterative-converge's agreement length unless --converge-tokens says otherwise."""
COMPOSED_MODES = {"ssr+think": "suffix", "ssr+spec": "longest", "ssr+lookup": "ngram"}
"""SSR composed with a peer inside the thinking -> what speculates the CoT (`SSRConfig.thinking_speculator`):
SuffixDecoding, the longer of prompt lookup's and SuffixDecoding's candidates, prompt lookup."""
GATED_MODES = {
    "ssr-gated": "prefix+suffix",
    "ssr+think-gated": "ssr+think",
    "ssr+spec-gated": "ssr+spec",
    "ssr+lookup-gated": "ssr+lookup",
}
"""Modes with SSR's cost gate (`spec.draft_gate`) -> the fixed-budget mode they gate."""
SKIPPED = "skipped"
"""The `mode` of a record saying a sample was not run and why (`context_fit.py`); never a decoding mode."""
ALL_MODES = ENGINE_MODES + EXTERNAL_MODES  # every one must reproduce the baseline's greedy tokens


@dataclass
class BenchSettings:
    """The paper-row knobs, each changeable from the CLI."""

    cot_cap: int = 2000
    answer_cap: int = 1500
    draft_budget: int = 500
    draft_interval: int | None = None  # iterative mode; default = draft_budget
    converge_tokens: int | None = None  # iterative-converge: drafting stops once two drafts agree this far
    max_draft_len: int = 500
    fixed_length: bool = True
    suffix: SuffixOptions = field(default_factory=SuffixOptions)
    suffix_sources: list[str] = field(default_factory=lambda: ["draft"])
    suffix_backoff_max: int = 16  # SSR modes: back off suffix proposals after failures (0: never)
    temperature: float = 0.0
    seed: int = 0
    # Samples whose requests of one mode run together in the engine's batch (per-request
    # latency = arrival to finish). 1 = one request at a time, as the paper measures.
    concurrency: int = 1
    # Tokens one forward may feed across the batch (`EngineConfig.max_step_tokens`): under load,
    # proposals shrink to fit. None: no limit.
    max_step_tokens: int | None = None
    # A run that must stay apart from others of the same knobs: e.g. an ablation that runs the
    # baseline again beside modes a committed run lacks. Its records pair with their own baseline
    # (the report keys tables, and resume keys records, by the settings), not with another run's.
    run_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["suffix"] = self.suffix.model_dump()
        for key in ("run_name", "converge_tokens", "max_step_tokens"):
            if d[key] is None:  # records keep the settings older files carry (resume)
                del d[key]
        return d


# Continuation caps of the paper's rows (HumanEval 1500, ClassEval 4000, LongProc 2000).
PAPER_ANSWER_CAPS = {"humaneval": 1500, "classeval": 4000, "longproc": 2000}


def spec_for(mode: str, s: BenchSettings):
    """The `spec` object `LLM.generate` takes for an engine mode (None for the baseline: plain
    decoding, passed explicitly, since a call that names no spec runs auto)."""
    ssr = dict(
        max_draft_len=s.max_draft_len,
        suffix=s.suffix,
        suffix_sources=s.suffix_sources,
        suffix_backoff_max=s.suffix_backoff_max,
    )
    if mode == "baseline":
        return None
    if mode == "auto":  # the default a user gets: no knob of the bench applies
        from selfspec.spec.auto import AutoConfig

        return AutoConfig()
    if mode in ("prefix", "suffix", "prefix+suffix"):
        return SSRConfig(draft_budgets=[s.draft_budget], reuse=mode, **ssr)
    if mode in COMPOSED_MODES:  # prefix+suffix, and the CoT (then the answer past the draft) speculated too
        sources = list(dict.fromkeys([*s.suffix_sources, "prompt", "output"]))
        return SSRConfig(
            draft_budgets=[s.draft_budget],
            speculate_thinking=True,
            thinking_speculator=COMPOSED_MODES[mode],
            **{**ssr, "suffix_sources": sources},
        )
    if mode in GATED_MODES:  # the same SSR, drafting only where the measured step costs say it pays
        return spec_for(GATED_MODES[mode], s).model_copy(update={"gate": "cost"})
    if mode == "ssr-off":  # drafts made and thrown away: the overhead of drafting alone
        return SSRConfig(draft_budgets=[s.draft_budget], reuse="off", **ssr)
    if mode == "iterative":
        return SSRConfig(draft_interval=s.draft_interval or s.draft_budget, **ssr)
    if mode == "iterative-converge":  # iterative drafting until two drafts agree (draft_schedule.DraftSchedule)
        return SSRConfig(
            draft_interval=s.draft_interval or s.draft_budget,
            converge_tokens=s.converge_tokens or CONVERGE_TOKENS,
            **ssr,
        )
    if mode == "suffix-decoding":
        return SuffixDecodingConfig(suffix=s.suffix, sources=["prompt", "output"])
    if mode == "prompt-lookup":
        return PromptLookupConfig()
    if mode == "suffix+lookup":  # the two copy-based peers combined: the longer candidate each step
        return SuffixDecodingConfig(suffix=s.suffix, sources=["prompt", "output"], with_prompt_lookup=True)
    if mode == "sps":  # draft-model speculation; the LLM needs a draft (bench --draft layers:N)
        return DraftModelConfig()
    raise ValueError(f"unknown engine mode {mode!r}; choose from {', '.join(ALL_MODES)}")
