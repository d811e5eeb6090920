"""vLLM's per-token logprobs as this package's `TokenLogprob`.

vLLM returns, per sampled token, a dict {token id: Logprob(logprob, rank, ...)} holding the
`k` most likely tokens and the sampled one (its true rank, which may exceed k). Its default
`raw_logprobs` mode reads them from the raw model output, before penalties and temperature:
the same quantity our engine reports, so a client sees one meaning on either backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from selfspec.engine.logits_processing import TokenLogprob


def token_logprobs(token_ids: Sequence[int], entries: Sequence[Mapping[int, Any]] | None, k: int) -> list[TokenLogprob]:
    """One `TokenLogprob` per token of `token_ids` from vLLM's `entries` (aligned with them):
    the sampled token's logprob and the `k` best by rank."""
    if entries is None or len(entries) < len(token_ids):
        raise RuntimeError("vLLM returned no logprobs for tokens of a request that asked for them")
    out = []
    for token, entry in zip(token_ids, entries):
        best = sorted((lp.rank, int(t), float(lp.logprob)) for t, lp in entry.items() if lp.rank <= k)
        out.append(TokenLogprob(int(token), float(entry[token].logprob), tuple((t, lp) for _, t, lp in best)))
    return out
