"""What a CoSpec eval measures: its options and the decoding modes it compares.

Kept apart from the runs so that the CLI can build its options' defaults from it without
loading the engine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from selfspec_research.thinker.data_versions import DATA_VERSIONS, HELDOUT_SEED

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
    # The arbitrator's prefix window (CoSpecConfig.prefix_window): "anchored" reuses its K/V.
    prefix_window: str = "anchored"
    warmup: bool = True
    gsm8k_path: str | None = None
    humaneval_path: str | None = None
    # Also run the draft model alone: which items it solves that the target does not
    # (complementarity, the oracle union) is what CoSpec's score gain can come from.
    draft_alone: bool = True
    # SpS at other draft lengths beside `k` (e.g. 2, 3, 4): on a small target the draft's
    # steps are not cheap (on a GPU, where such steps are launch-bound, 8 of 30 layers cost
    # ~1/3 of a target step), so the best SpS K is small and differs from the arbitrator's K.
    sps_k: tuple[int, ...] = ()
    # The thinker families' data version (None: thinker-data-v1's knobs); GSM8K and HumanEval ignore it.
    data_version: str | None = None

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
        if self.prefix_window not in ("anchored", "sliding"):
            raise ValueError(f"prefix_window must be anchored or sliding, got {self.prefix_window!r}")
        if self.data_version is not None and self.data_version not in DATA_VERSIONS:
            raise ValueError(f"unknown data version {self.data_version!r}; built in: {', '.join(DATA_VERSIONS)}")

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


__all__ = ["DEFAULT_DRAFT", "DEFAULT_K", "DEFAULT_THRESHOLDS", "NEVER_KEEP", "CoSpecEvalConfig", "Mode", "modes_for"]
