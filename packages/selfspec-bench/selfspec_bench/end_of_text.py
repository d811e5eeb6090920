"""Where the model itself ended its answer, in a fixed-length run that forced it on.

Why: the paper's rows force every answer to its cap with end-of-text ignored. Small models then
write their answer, emit end-of-text, and go on into repetition, which (a) makes any draft "match"
and (b) buries the answer under the forced tail, so its checker fails (every fixed-length pass rate
of the H200 runs read 0%). The engine samples end-of-text tokens as usual and only does not stop on
them, so the first one in the answer marks what a user would have received. Records keep that
position, how many forced tokens followed it, and the answer text cut there, which the scorer grades
beside the full forced text.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def end_of_text_fields(
    answer_ids: Sequence[int], eos_token_ids: Iterable[int], tokenizer: Any | None
) -> dict[str, Any]:
    """`answer_eos_at` (index of the first end-of-text token in the answer, None if there is none),
    `forced_past_eos` (answer tokens after it: 0 when the answer stopped there or never ended) and,
    only when tokens were forced past it, `answer_text_at_eos` (the answer decoded up to it)."""
    eos = set(eos_token_ids)
    at = next((i for i, token in enumerate(answer_ids) if token in eos), None)
    forced = 0 if at is None else len(answer_ids) - at - 1
    fields: dict[str, Any] = {"answer_eos_at": at, "forced_past_eos": forced}
    if forced and tokenizer is not None:
        fields["answer_text_at_eos"] = tokenizer.decode(list(answer_ids[:at]), skip_special_tokens=True)
    return fields
