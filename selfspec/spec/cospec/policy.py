"""CoSpec decoding: draft-model speculation whose verifier lets an arbitrator keep draft tokens.

A round: the draft proposes K tokens (`DraftModelProposer`), the target verifies them in one
forward (greedy target tokens t_0..t_K). Matching tokens are accepted as in SpS. At the first
mismatch j the arbitrator is asked π(keep d_j | prefix + d_<j, d_j.., t_j..); the draft token
is kept iff π >= threshold (λ = 0.6 in the paper; λ >= 1 never keeps), otherwise t_j is emitted
and the round ends.

How far a round continues past a kept token (our reading of the paper): the target's rows
after position j were computed on the draft's path d_<=j, so once d_j is kept they *are* the
target's verification of the rest of the block, and the block is checked on as usual:
matches are accepted, and the round ends at the next mismatch with the target's token (or the
bonus token after the last draft token). Only the first mismatch of a round is arbitrated by
default, as the paper's state holds one mismatch per verification pass;
`max_arbitrations_per_round` > 1 arbitrates later mismatches of the same block too.

The output is lossy by design (it is no longer the target's greedy output whenever a draft
token is kept): the policy reports `lossy: True` and counts kept tokens in `report()`.
Only greedy decoding is supported (the paper's target tokens are greedy verification tokens).

RL rollouts (`sample_seed` set): the keep decision is *sampled*, keep ~ Bernoulli(π), from a
`random.Random(sample_seed)` of the request, and the threshold is not used; the recorder then
also receives the arbitrator's logit (the behaviour policy's log-probability for PPO) and the
target's log-probability of the draft token at the mismatch (for reward shaping).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

import torch
from pydantic import ConfigDict, Field

from selfspec.engine.policy import Proposal
from selfspec.engine.verify import VerifyResult
from selfspec.spec.base import MethodConfig, MethodContext
from selfspec.spec.cospec.arbitrator import ArbitrationState, Arbitrator
from selfspec.spec.cospec.prefix_cache import ArbitratorPrefixCache, new_owner, prefix_cache_for, window_start
from selfspec.spec.draft_model import DraftModelProposer
from selfspec.thinking.policy import ThinkingPolicy

if TYPE_CHECKING:
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.sequence import Sequence


@dataclass
class Decision:
    """One arbitrated mismatch (what the recorder receives; training reuses the states)."""

    state: ArbitrationState
    keep_probability: float | None  # None when no arbitrator ran (collection mode)
    kept: bool
    # The whole context at the mismatch (prompt + output + accepted draft tokens), before
    # the arbitrator's window cut it: counterfactual continuations restart from here.
    context: tuple[int, ...] = ()
    prompt_len: int = 0
    # Sampled decisions (RL rollouts) only: the arbitrator's keep logit (log π(keep) is
    # logsigmoid(keep_logit)) and the target's log-probability of the draft token d_j.
    keep_logit: float | None = None
    target_logprob: float | None = None
    sampled: bool = False


class CoSpecConfig(MethodConfig):
    """CoSpec speculation: K draft tokens per round, arbitration at mismatches.

    `arbitrator=None` is allowed only with threshold > 1 (nothing can be kept): that is
    exact SpS that records the mismatch states, which is how SFT data is collected.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    lossy: ClassVar[bool] = True

    method: Literal["cospec"] = "cospec"
    num_speculative_tokens: int = Field(5, ge=1, le=64)
    threshold: float = Field(0.6, ge=0.0)
    max_arbitrations_per_round: int = Field(1, ge=1)
    max_prefix_tokens: int = Field(512, ge=1)  # arbitrator window over prompt + verified prefix
    # "anchored": the window keeps its first token until it outgrows max_prefix_tokens, then
    # moves by reanchor_tokens at once, so the arbitrator's prefix K/V are reused across rounds
    # (`cospec.prefix_cache`); "sliding": the last max_prefix_tokens tokens, one full forward
    # per decision (how the first arbitrators were trained).
    prefix_window: Literal["anchored", "sliding"] = "anchored"
    reanchor_tokens: int = Field(128, ge=1)
    # Requests at a mismatch in the same step share one arbitrator call (anchored window only;
    # the same decisions). Off by default: on a CPU, 4 requests together measured 0.92x deciding
    # alone (rows pad to the widest row's bucket, and a CPU is compute-bound); a GPU, where a
    # call is launch-bound, is where it should pay, and is not yet measured.
    batch_arbitration: bool = False
    arbitrator: Any = None  # an `Arbitrator`
    recorder: Any = None  # optional callable(Decision), e.g. a list's append
    # RL rollouts: sample keep ~ Bernoulli(π) with this seed (the threshold is then unused).
    sample_seed: int | None = None

    def build(self, ctx: MethodContext) -> "CoSpecPolicy":
        if ctx.draft_runner is None:
            raise ValueError("CoSpec needs a draft model: LLM(..., draft='layers:N' or a model)")
        params = ctx.params
        if not params.greedy:
            raise ValueError("CoSpec arbitrates greedy verification tokens; use temperature 0")
        if self.arbitrator is None and self.threshold <= 1.0:
            raise ValueError("CoSpec needs an arbitrator unless threshold > 1 (collection mode)")
        if self.sample_seed is not None and self.arbitrator is None:
            raise ValueError("sampled CoSpec decisions (sample_seed) need an arbitrator")
        if self.arbitrator is not None and not isinstance(self.arbitrator, Arbitrator):
            raise TypeError(
                f"arbitrator must be a selfspec.spec.cospec.Arbitrator, got {type(self.arbitrator).__name__}"
            )
        proposer = DraftModelProposer(ctx.draft_runner, num_tokens=self.num_speculative_tokens, params=params)
        # Widest state: prefix window + draft block (≤ K) + target block (≤ K + 1) + decision.
        widest = self.max_prefix_tokens + 2 * self.num_speculative_tokens + 2
        prefix_cache = None
        if self.arbitrator is not None and self.prefix_window == "anchored":
            prefix_cache = prefix_cache_for(self.arbitrator, widest)
            prefix_cache.prepare()
        elif (graphs := self.arbitrator.cuda_graphs() if self.arbitrator is not None else None) is not None:
            graphs.prepare(widest)
        return CoSpecPolicy(
            ctx.thinking_format,
            ctx.limits,
            thinking=ctx.thinking,
            proposer=proposer,
            arbitrator=self.arbitrator,
            threshold=self.threshold,
            max_arbitrations=self.max_arbitrations_per_round,
            max_prefix_tokens=self.max_prefix_tokens,
            recorder=self.recorder,
            sample_seed=self.sample_seed,
            prefix_window=self.prefix_window,
            reanchor_tokens=self.reanchor_tokens,
            prefix_cache=prefix_cache,
            batch_arbitration=self.batch_arbitration,
        )


class CoSpecPolicy(ThinkingPolicy):
    """Thinking rules + draft proposals + arbitrated greedy verification."""

    lossy = True
    custom_verify = True

    def __init__(
        self,
        fmt,
        limits=None,
        *,
        thinking: bool,
        proposer,
        arbitrator: Arbitrator | None,
        threshold: float,
        max_arbitrations: int = 1,
        max_prefix_tokens: int = 512,
        recorder: Callable[[Decision], None] | None = None,
        sample_seed: int | None = None,
        prefix_window: Literal["anchored", "sliding"] = "sliding",
        reanchor_tokens: int = 128,
        prefix_cache: ArbitratorPrefixCache | None = None,
        batch_arbitration: bool = False,
    ) -> None:
        super().__init__(fmt, limits, thinking=thinking, proposer=proposer)
        if prefix_cache is not None and prefix_window != "anchored":
            raise ValueError("a prefix cache needs the anchored window (a sliding one changes every cached K/V)")
        self.prefix_window = prefix_window
        self.reanchor_tokens = reanchor_tokens
        self.prefix_cache = prefix_cache
        self.batch_arbitration = batch_arbitration
        self.owner = new_owner()
        self.window_first = 0  # the anchored window's first context token
        self.arbitrator = arbitrator
        self.threshold = threshold
        self.max_arbitrations = max_arbitrations
        self.max_prefix_tokens = max_prefix_tokens
        self.recorder = recorder
        self.rng = random.Random(sample_seed) if sample_seed is not None else None
        self.arbitrations = 0
        self.kept_draft_tokens = 0
        self.arbitration_seconds = 0.0
        self._prepared: tuple[ArbitrationState, float, float] | None = None  # (state, π, seconds) from a batch

    def verify_group(self) -> object | None:
        """Requests whose decisions one batched arbitrator call can make: those sharing a prefix
        cache, deciding by threshold (sampled RL decisions and collection mode stay per request)."""
        if not self.batch_arbitration or self.prefix_cache is None or self.rng is not None or self.arbitrator.training:
            return None
        return self.prefix_cache

    @staticmethod
    def prepare_verify_many(engine: "Engine", items: list[tuple["Sequence", list[int], Proposal]]) -> None:
        """Make the first-mismatch decisions of a step's rows in one arbitrator call.

        Each row's state at its first mismatch is known before any row is verified (it depends
        on the row's own context, draft and target tokens only), so the requests deciding in
        this step share one forward instead of one each. `verify` then uses the stored
        probability when its state is the same one, and decides alone otherwise (a later
        mismatch of the same block, or logits a grammar or penalty changed).
        """
        pending: list[tuple[CoSpecPolicy, ArbitrationState]] = []
        for seq, targets, proposal in items:  # the runner's greedy tokens: no second host copy
            policy: CoSpecPolicy = seq.policy
            j = next((i for i, (d, t) in enumerate(zip(proposal.tokens, targets)) if d != t), None)
            if j is not None:
                pending.append((policy, policy._state(seq, proposal.tokens, targets, j)))
        if not pending:
            return
        started = time.perf_counter()
        cache = pending[0][0].prefix_cache
        probabilities = torch.sigmoid(cache.keep_logits([(p.owner, state) for p, state in pending])).tolist()
        share = (time.perf_counter() - started) / len(pending)
        for (policy, state), probability in zip(pending, probabilities):
            policy._prepared = (state, probability, share)

    def verify(self, engine: "Engine", seq: "Sequence", logits: torch.Tensor, proposal: Proposal) -> VerifyResult:
        targets = logits.argmax(dim=-1).tolist()  # the one host sync of exact greedy verification
        draft = proposal.tokens
        accepted = arbitrated = 0
        while accepted < len(draft):
            if draft[accepted] == targets[accepted]:
                accepted += 1
                continue
            if arbitrated >= self.max_arbitrations or not self._keep(seq, draft, targets, accepted, logits):
                break
            arbitrated += 1
            accepted += 1
        self._prepared = None  # a prepared decision is for this step only
        return VerifyResult(num_accepted=accepted, next_token=int(targets[accepted]))

    def _state(self, seq: "Sequence", draft: list[int], targets: list[int], j: int) -> ArbitrationState:
        """The arbitrator's input at mismatch j (advances the anchored window, idempotently)."""
        context = seq.token_ids + draft[:j]  # the engine appends the proposal only after verify
        if self.prefix_window == "anchored":
            self.window_first = window_start(
                len(context), self.window_first, self.max_prefix_tokens, self.reanchor_tokens
            )
            first = self.window_first
        else:
            first = max(0, len(context) - self.max_prefix_tokens)
        return ArbitrationState(
            prefix=tuple(context[first:]), draft_block=tuple(draft[j:]), target_block=tuple(targets[j:])
        )

    def _keep(
        self, seq: "Sequence", draft: list[int], targets: list[int], j: int, logits: torch.Tensor | None = None
    ) -> bool:
        state = self._state(seq, draft, targets, j)
        prepared, self._prepared = self._prepared, None
        self.arbitrations += 1
        probability = logit = target_logprob = None
        started = time.perf_counter()
        if self.rng is not None:  # RL rollout: keep ~ Bernoulli(π)
            logit = self._keep_logit(state)
            probability = 1.0 / (1.0 + math.exp(-logit)) if logit >= 0 else math.exp(logit) / (1.0 + math.exp(logit))
            kept = self.rng.random() < probability
        else:
            if prepared is not None and prepared[0] == state:  # decided in this step's batched call
                probability = prepared[1]
                started -= prepared[2]  # its share of the batched call's time
            elif self.arbitrator is not None:
                probability = self._keep_probability(state)
            # λ >= 1 is the "never keep" switch: a float32 sigmoid reaches 1.0 for large logits,
            # and λ = 1 must stay exactly lossless (the eval's and server's upper bound).
            kept = probability is not None and self.threshold < 1.0 and probability >= self.threshold
        self.arbitration_seconds += time.perf_counter() - started  # float() above synced the device
        self.kept_draft_tokens += kept
        if self.recorder is not None:
            if self.rng is not None and logits is not None:
                target_logprob = float(torch.log_softmax(logits[j].float(), dim=-1)[draft[j]])
            self.recorder(
                Decision(
                    state,
                    probability,
                    kept,
                    context=tuple(seq.token_ids + draft[:j]),
                    prompt_len=getattr(seq, "prompt_len", 0),
                    keep_logit=logit,
                    target_logprob=target_logprob,
                    sampled=self.rng is not None,
                )
            )
        return kept

    def _keep_logit(self, state: ArbitrationState) -> float:
        if self.prefix_cache is not None and not self.arbitrator.training:
            return float(self.prefix_cache.keep_logit(self.owner, state)[0])
        return float(self.arbitrator.keep_logits([state])[0])

    def _keep_probability(self, state: ArbitrationState) -> float:
        if self.prefix_cache is not None and not self.arbitrator.training:
            return float(torch.sigmoid(self.prefix_cache.keep_logit(self.owner, state))[0])
        return float(self.arbitrator.keep_probability([state])[0])

    def on_finish(self, engine: "Engine", seq: "Sequence") -> None:
        super().on_finish(engine, seq)
        if self.prefix_cache is not None:
            self.prefix_cache.release(self.owner)

    def report(self) -> dict[str, Any]:
        return {
            "lossy": True,
            "cospec_threshold": self.threshold,
            "arbitrations": self.arbitrations,
            "kept_draft_tokens": self.kept_draft_tokens,
            "arbitration_s": self.arbitration_seconds,
            "arbitration_prefix_window": self.prefix_window,
        }
