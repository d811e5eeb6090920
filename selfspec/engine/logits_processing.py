"""Logits processors that depend on the tokens so far: penalties, grammar masks; and logprobs.

A speculative verify sees k+1 logits rows at once, and row i predicts the token after the
proposal's first i tokens. Every processor here therefore takes the proposal and treats row i as
if those i tokens were already committed — the penalty counts and the grammar state of row i
include them — so verification accepts against exactly the distribution plain decoding would
have used at that position, and speculation stays exact under penalties and grammars.

Penalties follow their usual definitions:
* repetition (CTRL, as transformers' `RepetitionPenaltyLogitsProcessor` and vLLM): every token
  seen in the prompt or the output so far has its logit divided by the penalty when positive,
  multiplied by it when negative;
* presence / frequency (OpenAI): `logit -= presence * [count > 0] + frequency * count`, with
  `count` the token's occurrences in the output so far (not the prompt), as OpenAI and vLLM do.
They apply to the raw logits before the grammar mask and before temperature / top-k / top-p.

Logprobs are of the raw model: log-softmax of the model's logits at the position that chose the
token, before penalties, masks and temperature (vLLM's default `raw_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from selfspec.engine.sampling import SamplingParams


def has_penalties(params: SamplingParams) -> bool:
    return params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0


def penalized(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    proposal: Sequence[int] = (),
) -> torch.Tensor:
    """Penalised copy of `logits` [k+1, V]; row i counts `proposal[:i]` as output."""
    rows, vocab = logits.shape
    device = logits.device
    out = logits.float().clone()
    proposal = list(proposal)[: rows - 1]
    counts = torch.zeros(rows, vocab, device=device)
    if output_ids:
        counts += torch.bincount(torch.as_tensor(list(output_ids), device=device), minlength=vocab)[:vocab].float()
    for i, token in enumerate(proposal):
        counts[i + 1 :, token] += 1.0
    if params.repetition_penalty != 1.0:
        seen = counts > 0
        if prompt_ids:
            seen[:, torch.as_tensor(list(prompt_ids), device=device)] = True
        penalty = params.repetition_penalty
        out = torch.where(seen, torch.where(out > 0, out / penalty, out * penalty), out)
    if params.frequency_penalty != 0.0:
        out -= params.frequency_penalty * counts
    if params.presence_penalty != 0.0:
        out -= params.presence_penalty * (counts > 0).float()
    return out


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's log-probability under the raw model, and the most likely alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top_n: int) -> list[TokenLogprob]:
    """Row i of `logits` chose `tokens[i]`: its logprob and the row's `top_n` best."""
    n = len(tokens)
    if n == 0:
        return []
    logp = torch.log_softmax(logits[:n].float(), dim=-1)
    chosen = logp[torch.arange(n, device=logp.device), torch.as_tensor(list(tokens), device=logp.device)].tolist()
    if top_n > 0:
        values, indices = torch.topk(logp, min(top_n, logp.shape[-1]), dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
    else:
        tops = [()] * n
    return [TokenLogprob(int(t), float(lp), top) for t, lp, top in zip(tokens, chosen, tops)]
