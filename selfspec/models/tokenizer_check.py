"""Catch a tokenizer that was built wrongly before it silently changes every prompt.

Why: transformers 5.17 (the GPU machine's version) builds Gemma-3's tokenizer from the
GGUF file wrongly: "Complete the following Python function" becomes `Com|ple|te|▁t|he|…`
(2.3 characters a token instead of 6) and no `<bos>` is added although the GGUF asks for
one. transformers 5.24 builds it right. The model still answers, only worse, so nothing
fails loudly: a 784,823-character page counted as 784,840 prompt tokens with the broken
tokenizer (63,446 with a correct one).

Two checks, both cheap (one encode of a short English paragraph):
- compression: a subword vocabulary of 16K+ pieces puts well over 3.5 characters of the
  plain English probe into a token (SmolLM2 and Gemma-3 5.6); a tokenizer whose merges are
  missing or wrong falls to 1–2.5 (Gemma-3 under transformers 5.17: 2.5). Small vocabularies (byte- or character-level
  models, tiny test tokenizers) are not judged.
- `<bos>`: when the GGUF says whether a `<bos>` is added, the tokenizer must agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROBE_TEXT = (
    "The committee met on Tuesday morning to review the annual budget. After a long discussion about "
    "maintenance costs, they agreed to postpone the new library building until next year, when the "
    "city expects to receive additional funding from the state government."
)
"""Plain English prose: every general-purpose subword vocabulary compresses it well."""

MIN_CHARS_PER_TOKEN = 3.5
"""Below this on `PROBE_TEXT`, a vocabulary of `MIN_JUDGED_VOCAB`+ pieces is not merging."""

MIN_JUDGED_VOCAB = 16_000
"""Vocabularies smaller than this are not judged by compression (character/byte models)."""


class TokenizerDefectError(ValueError):
    """The tokenizer this transformers version built does not tokenize like the model's."""


def _version() -> str:
    try:
        import transformers

        return str(transformers.__version__)
    except ImportError:  # pragma: no cover - transformers is a dependency
        return "unknown"


def _probe(tokenizer: Any) -> dict[str, Any]:
    """`PROBE_TEXT` encoded once: the ids after any `<bos>`, whether one was added, and the
    characters a token (rounded; None for an empty encoding)."""
    ids = list(tokenizer(PROBE_TEXT)["input_ids"])
    bos = getattr(tokenizer, "bos_token_id", None)
    adds_bos = bool(ids) and bos is not None and ids[0] == bos
    content = ids[1:] if adds_bos else ids
    ratio = round(len(PROBE_TEXT) / len(content), 2) if content else None
    return {"content_ids": content, "adds_bos": adds_bos, "probe_chars_per_token": ratio}


def tokenizer_problems(tokenizer: Any, *, expects_bos: bool | None = None) -> list[str]:
    """What is wrong with `tokenizer` (empty when nothing is), each as one sentence.

    `expects_bos`: whether the model's own metadata says a `<bos>` is prepended (None when
    unknown: not checked).
    """
    problems: list[str] = []
    probe = _probe(tokenizer)
    vocab, ratio = len(tokenizer), probe["probe_chars_per_token"]
    if vocab >= MIN_JUDGED_VOCAB and ratio is not None and ratio < MIN_CHARS_PER_TOKEN:
        pieces = tokenizer.convert_ids_to_tokens(probe["content_ids"][:8])
        problems.append(
            f"it splits plain English into {len(probe['content_ids'])} tokens for {len(PROBE_TEXT)} characters "
            f"({ratio:.1f} characters a token; a working {vocab:,}-piece vocabulary gives more than "
            f"{MIN_CHARS_PER_TOKEN}), starting {'|'.join(map(str, pieces))}"
        )
    if expects_bos is True and not probe["adds_bos"]:
        problems.append("it adds no <bos> token, though the model's metadata says one is prepended")
    if expects_bos is False and probe["adds_bos"]:
        problems.append("it adds a <bos> token, though the model's metadata says none is prepended")
    return problems


def tokenizer_summary(tokenizer: Any) -> dict[str, Any]:
    """What a benchmark record keeps about its tokenizer: vocabulary size, characters a token
    on `PROBE_TEXT`, whether a `<bos>` is added. Two runs whose summaries differ did not feed
    the model the same prompts (a broken Gemma-3 tokenizer shows ~1.0 characters a token, a correct one 5.6)."""
    probe = _probe(tokenizer)
    return {
        "vocab": len(tokenizer),
        "probe_chars_per_token": probe["probe_chars_per_token"],
        "adds_bos": probe["adds_bos"],
    }


def check_tokenizer(tokenizer: Any, *, origin: str, expects_bos: bool | None = None) -> None:
    """Raise `TokenizerDefectError` naming `origin`, the problems and the ways out."""
    problems = tokenizer_problems(tokenizer, expects_bos=expects_bos)
    if problems:
        raise TokenizerDefectError(defect_message(origin, problems))


def defect_message(origin: str, problems: list[str]) -> str:
    """The error text: what is wrong, with which transformers, and what to do."""
    return (
        f"the tokenizer built from {origin} by transformers {_version()} is wrong: "
        + "; ".join(problems)
        + ". Prompts would reach the model cut into pieces it was not trained on. Upgrade transformers "
        "(5.24 builds Gemma-3's and SmolLM2's correctly; 5.17 does not build Gemma-3's), or pass a working tokenizer "
        "directory with --tokenizer "
        "(tokenizer.json + tokenizer_config.json, e.g. saved by `selfspec save-tokenizer NAME DIR` on a machine "
        "where it is built right)."
    )


def gguf_adds_bos(gguf_path: Path) -> bool | None:
    """The GGUF's `tokenizer.ggml.add_bos_token` (None when absent or unreadable)."""
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(gguf_path)).fields.get("tokenizer.ggml.add_bos_token")
    except Exception:  # noqa: BLE001 - metadata is advisory; a reader failure must not block a load
        return None
    if field is None:
        return None
    value = field.contents()
    return bool(value) if isinstance(value, (bool, int)) else None


__all__ = [
    "MIN_CHARS_PER_TOKEN",
    "MIN_JUDGED_VOCAB",
    "PROBE_TEXT",
    "TokenizerDefectError",
    "check_tokenizer",
    "defect_message",
    "gguf_adds_bos",
    "tokenizer_problems",
    "tokenizer_summary",
]
