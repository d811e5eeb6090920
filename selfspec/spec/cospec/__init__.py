"""CoSpec inference: draft-model speculation where a learned arbitrator may keep draft tokens (lossy).

`CoSpecConfig(arbitrator=Arbitrator.from_draft(llm.draft_runner.model))` is passed as `spec=`
to `LLM.generate`. `policy` is the per-request method (draft proposals + arbitrated greedy
verification), `arbitrator` the LoRA + binary head model, `graphs` its CUDA-graph replays,
`checkpoint` saving and loading a trained one. Training (SFT on counterfactual labels, then
PPO) and evaluation live in the research part (`selfspec_research.cospec`).
"""

from selfspec.spec.cospec.arbitrator import (
    ArbitrationState,
    Arbitrator,
    ArbitratorBatch,
    LoraSettings,
    build_batch,
    hybrid_layout,
    hybrid_mask,
    hybrid_positions,
)
from selfspec.spec.cospec.checkpoint import load_arbitrator, load_arbitrator_for, save_arbitrator
from selfspec.spec.cospec.policy import CoSpecConfig, CoSpecPolicy, Decision

__all__ = [
    "ArbitrationState",
    "Arbitrator",
    "ArbitratorBatch",
    "CoSpecConfig",
    "CoSpecPolicy",
    "Decision",
    "LoraSettings",
    "build_batch",
    "hybrid_layout",
    "hybrid_mask",
    "hybrid_positions",
    "load_arbitrator",
    "load_arbitrator_for",
    "save_arbitrator",
]
