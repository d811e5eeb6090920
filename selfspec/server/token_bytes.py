"""The UTF-8 bytes of one token, for logprobs' `bytes` field.

OpenAI's `bytes` lets a client rebuild text that single tokens cannot show: an emoji split over
several tokens decodes token by token to replacement characters, but the tokens' bytes
concatenate to the emoji. `tokenizer.decode([id])` therefore cannot give them; the token's
vocabulary entry does, read the way its tokenizer encodes bytes:

* byte-level BPE (GPT-2, Qwen, SmolLM2, Llama 3): every byte is one printable character of
  GPT-2's `bytes_to_unicode` table; mapped back;
* byte fallback (SentencePiece: Llama 2, Mistral, Gemma): `<0xF0>` is the byte 0xF0, and `▁`
  marks a space;
* anything else, and special tokens: the decoded text's bytes.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (as `transformers` defines it)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


_BYTE_DECODER = {char: byte for byte, char in _bytes_to_unicode().items()}


def _decoder_kinds(tokenizer: Any) -> set[str]:
    """The decoder step types of a fast tokenizer ("ByteLevel", "ByteFallback", "Metaspace", ...)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return {"ByteLevel"} if hasattr(tokenizer, "byte_decoder") else set()
    try:
        decoder = json.loads(backend.to_str()).get("decoder") or {}
    except (ValueError, AttributeError):
        return set()
    kinds: set[str] = set()
    stack = [decoder]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                kinds.add(node["type"])
            stack.extend(node.get("decoders") or [])
    return kinds


class TokenBytes:
    """`token_bytes(id)` for one tokenizer (its vocabulary's byte encoding read once)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        kinds = _decoder_kinds(tokenizer)
        self.byte_level = "ByteLevel" in kinds
        self.byte_fallback = "ByteFallback" in kinds or hasattr(tokenizer, "sp_model")
        self.special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self.special.update(int(i) for i in added)
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._bytes(int(token_id))
        return cached

    def _bytes(self, token_id: int) -> bytes:
        if token_id not in self.special:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece:
                if self.byte_level and all(char in _BYTE_DECODER for char in piece):
                    return bytes(_BYTE_DECODER[char] for char in piece)
                if self.byte_fallback:
                    match = _BYTE_TOKEN.fullmatch(piece)
                    if match:
                        return bytes([int(match.group(1), 16)])
                    return piece.replace("▁", " ").encode("utf-8")
        return self.tokenizer.decode([token_id]).encode("utf-8")


@functools.lru_cache(maxsize=8)
def token_bytes_for(tokenizer: Any) -> TokenBytes:
    """The `TokenBytes` of a served tokenizer (one per tokenizer: reading its decoder is not free)."""
    return TokenBytes(tokenizer)
