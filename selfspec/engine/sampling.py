"""Sampling parameters and the per-row logits -> distribution transform.

Speculative verification needs the *processed* target distribution (after temperature,
top-k, top-p, min-p) at several positions of one row, so the transform lives here, in one
place, and both plain sampling and the rejection verifiers use it: a proposal is accepted
against exactly the distribution plain sampling would have drawn from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


class InvalidSamplingParams(ValueError):
    """A sampling parameter is out of range; the message names the field."""


@dataclass
class SamplingParams:
    """How one request is decoded.

    `ignore_eos` and `min_tokens` exist for fixed-length benchmarking (the paper's rows force a
    CoT length and an answer length); `seed` makes sampled requests reproducible per request,
    independent of what else shares the batch.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    # Penalties on tokens seen so far (`selfspec.engine.logits_processing` has the definitions).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Log-probabilities of the chosen tokens (None: off) with this many alternatives each.
    logprobs: int | None = None
    # Samples of one prompt: forks of its prefill (`Engine.add_request`).
    n: int = 1

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def bad(name: str, why: str) -> InvalidSamplingParams:
            return InvalidSamplingParams(f"invalid sampling parameter {name}={getattr(self, name)!r}: {why}")

        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens <= 0:
            raise bad("max_tokens", "must be a positive integer")
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise bad("temperature", "must be a number >= 0 (0 means greedy)")
        if math.isinf(self.temperature):
            raise bad("temperature", "must be finite")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", "must be an integer >= 0 (0 disables it)")
        if not isinstance(self.top_p, (int, float)) or math.isnan(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise bad("top_p", "must be in (0, 1]")
        if not isinstance(self.min_p, (int, float)) or math.isnan(self.min_p) or not (0.0 <= self.min_p <= 1.0):
            raise bad("min_p", "must be in [0, 1]")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "must be an integer >= 0")
        if self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must not exceed max_tokens={self.max_tokens}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value) or not -2.0 <= value <= 2.0:
                raise bad(name, "must be a number in [-2, 2]")
        rep = self.repetition_penalty
        if not isinstance(rep, (int, float)) or math.isnan(rep) or math.isinf(rep) or rep <= 0:
            raise bad("repetition_penalty", "must be a finite number > 0 (1 disables it)")
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or isinstance(self.logprobs, bool) or not 0 <= self.logprobs <= 20
        ):
            raise bad("logprobs", "must be None or an integer in [0, 20] (alternatives per token)")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or not 1 <= self.n <= 64:
            raise bad("n", "must be an integer in [1, 64]")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "must be an integer or None")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise bad("stop", "must be a list of non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn raw logits [..., V] into the distribution that sampling draws from.

    Order matches common servers: temperature, then top-k, top-p and min-p filtering.
    Computed in float32 so bf16 models do not lose small probabilities.
    """
    if params.greedy:
        raise ValueError("processed_probs is for sampled requests; greedy uses argmax")
    logits = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, sorted_idx = torch.sort(probs, dim=-1, descending=True)
        cumulative = sorted_probs.cumsum(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it is kept).
        drop_sorted = (cumulative - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    if params.min_p > 0.0:
        threshold = probs.amax(dim=-1, keepdim=True) * params.min_p
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a 1-D distribution with the request's own generator."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    """A per-request generator; an unseeded request still gets its own stream."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
