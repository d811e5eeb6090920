"""CoSpec: speculative decoding where a learned arbitrator may keep draft tokens (lossy).

`CoSpecConfig(arbitrator=Arbitrator.from_draft(llm.draft_runner.model))` is passed as `spec=`
to `LLM.generate`; `training` holds the SFT and PPO steps that train the arbitrator, and
`train_arbitrator` (+ `train_cli`) the real run built on them;
`checkpoint` saves/loads a trained one (`save_arbitrator`, `load_arbitrator`); `evaluate`
(+ `eval_tasks`, `eval_report`, `cli`) is `selfspec cospec eval`; `draft_distill` trains the
distilled shallow self-draft (`selfspec cospec train-draft`, loaded as `draft="distilled:<dir>"`).
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
