"""Stop strings: whether a sequence's visible output text now holds one.

One text, one rule: stop strings match the text a client is shown — decoded with special tokens
hidden, as `LLM.result` and the server decode it — so a stop string that spans a hidden token
still stops generation, and a special token's own text never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def hits_stop_string(
    tokenizer: "PreTrainedTokenizerBase | None", token_ids: Sequence[int], prompt_len: int, stops: Sequence[str]
) -> bool:
    """Whether the output (`token_ids` past `prompt_len`), decoded as a client sees it, holds one
    of `stops`. Only the output's tail is decoded: this runs after every committed token of a
    request with stop strings."""
    if tokenizer is None:
        raise ValueError("stop strings need a tokenizer")
    longest = max(len(s) for s in stops)
    # A visible token decodes to >= 1 char in practice; hidden ones to none, so the window is
    # twice the longest stop string plus slack for a few hidden tokens inside it.
    window = token_ids[max(prompt_len, len(token_ids) - 2 * longest - 16) :]
    text = tokenizer.decode(window, skip_special_tokens=True)
    return any(s in text for s in stops)
