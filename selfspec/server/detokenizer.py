"""Incremental detokenization: text for tokens as they arrive, never a broken character.

A streamed response is sent a few tokens at a time, but a character may span several
byte-level tokens (a CJK character or an emoji is 3-4 bytes, often split), and some
tokenizers change how a token decodes depending on what precedes it (SentencePiece drops
the leading space of the first token it decodes). Decoding each new token alone is
therefore wrong, and decoding the whole output at every step costs O(n^2).

The method is vLLM's: decode a short window that starts a few tokens back (its text
is only used as context) and emit what the newer tokens added, holding the text back
while it ends in U+FFFD (an incomplete UTF-8 sequence). At the end, `flush` reconciles
with one full decode, so the concatenation of everything emitted equals
`tokenizer.decode(all_ids)` whenever the tokenizer's decode is prefix-stable (byte-level
BPE, SentencePiece), and never retracts text that was already sent.
"""

from __future__ import annotations

from typing import Any, Iterable

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of token ids into a growing string, one `add` at a time."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        # ids[prefix_offset:read_offset] decode to text already emitted (context only);
        # ids[read_offset:] are the tokens whose text is not emitted yet.
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def add(self, new_ids: Iterable[int]) -> str:
        """Append tokens; return the newly complete text (possibly empty)."""
        self.ids.extend(new_ids)
        if len(self.ids) == self._read_offset:
            return ""
        prefix_text = self._decode(self.ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self.ids[self._prefix_offset :])
        if len(window_text) <= len(prefix_text) or window_text.endswith(REPLACEMENT_CHAR):
            # Nothing new yet, or a character still waits for its remaining bytes.
            return ""
        if not window_text.startswith(prefix_text):
            # The newer tokens changed how the context decodes; wait for more context.
            return ""
        delta = window_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """The output is complete: emit whatever text is still held back.

        A trailing U+FFFD is emitted now (the bytes will never be completed). The full
        decode is the reference; if it does not extend what was sent (a tokenizer whose
        decode is not prefix-stable), only the window's remainder is added.
        """
        full = self._decode(self.ids)
        if full.startswith(self.text):
            delta = full[len(self.text) :]
        else:
            prefix_text = self._decode(self.ids[self._prefix_offset : self._read_offset])
            window_text = self._decode(self.ids[self._prefix_offset :])
            delta = window_text[len(prefix_text) :] if window_text.startswith(prefix_text) else ""
        self._prefix_offset = self._read_offset = len(self.ids)
        self.text += delta
        return delta
