"""Where a model's thinking starts and ends, in tokens.

SSR forks a request mid-thought and closes the child's thinking by appending the
model's end-of-thinking tokens; the engine must notice, token by token, when the parent
ends thinking; the server splits output into `reasoning_content` and `content`. All three
need the same facts about a model family, gathered once here from its tokenizer:

* ``native``: the family thinks by itself (Qwen3: `<think>`/`</think>` are single vocab
  tokens and the template takes `enable_thinking`; DeepSeek-R1 and Qwen3.5: the template
  ends the generation prompt with `<think>\\n`; Gemma-4: thinking is a channel,
  `<|channel>thought\\n ... <channel|>`, switched on by `<|think|>` in the system turn).
* ``prompted``: no native thinking (SmolLM2): the prompt builder opens the assistant
  turn with the start marker text, and closing appends the end marker's tokens.
* ``none``: no thinking phase at all (plain answering).

Markers are matched on token ids, never by decoding text, because the detector runs on
every generated token.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

ThinkingKind = Literal["native", "prompted", "none"]

DEFAULT_START_MARKER = "<think>"
DEFAULT_END_MARKER = "</think>"
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

# Contexts in which an end marker shows up in generated text. BPE tokenizers may merge
# the marker's first characters with what precedes it, so each context can yield a
# different token sequence for the same text.
_END_MARKER_CONTEXTS: tuple[str, ...] = ("", "\n", "\n\n", " ", ".", "a", "1", ")", ":", "`")


@dataclass(frozen=True)
class MarkerStyle:
    """A family's thinking markers when they are not `<think>`/`</think>`.

    `signature`: special tokens that identify the family (each a single token in its vocabulary,
    the first named by its chat template). `close`: the text appended to force-close thinking.
    """

    name: str
    start: str
    end: str
    close: str
    signature: tuple[str, ...]


MARKER_STYLES: tuple[MarkerStyle, ...] = (
    # Gemma-4: the model opens `<|channel>thought\n`, reasons, closes with `<channel|>` and answers
    # right after it (the chat template strips that channel from earlier model turns, so the
    # markers appear in its text; with thinking off the generation prompt holds an empty,
    # closed channel).
    MarkerStyle(
        name="gemma4",
        start="<|channel>thought\n",
        end="<channel|>",
        close="<channel|>",
        signature=("<|channel>", "<channel|>"),
    ),
)


def _marker_style(tokenizer: Any, template: str) -> MarkerStyle | None:
    """The family's own markers when its tokenizer and template carry their signature."""
    for style in MARKER_STYLES:
        if style.signature[0] in template and all(_is_single_token(tokenizer, t) for t in style.signature):
            return style
    return None


def _chat_template_text(tokenizer: Any) -> str:
    """The tokenizer's chat template as one string ('' when it has none)."""
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        return ""
    if isinstance(template, dict):
        return "\n".join(str(value) for value in template.values())
    return str(template)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _encode_after(tokenizer: Any, context: str, text: str) -> list[int]:
    """Tokens that `text` adds when it follows `context`.

    Encodes `context + text` and drops the longest prefix shared with the encoding of
    `context`; tokens that merge across the boundary stay in the result.
    """
    if not context:
        return _encode(tokenizer, text)
    with_context = _encode(tokenizer, context + text)
    context_only = _encode(tokenizer, context)
    shared = 0
    for a, b in zip(with_context, context_only):
        if a != b:
            break
        shared += 1
    return with_context[shared:]


def _marker_ids(tokenizer: Any, marker: str) -> tuple[int, ...]:
    """The marker's tokens as they appear after a newline, falling back to isolation.

    Sentencepiece tokenizers prepend a word-boundary piece to text in isolation, so the
    in-context encoding is preferred when it decodes back to exactly the marker.
    """
    after_newline = _encode_after(tokenizer, "\n", marker)
    if after_newline and tokenizer.decode(after_newline) == marker:
        return tuple(after_newline)
    return tuple(_encode(tokenizer, marker))


def _marker_variants(tokenizer: Any, marker: str) -> tuple[tuple[int, ...], ...]:
    """Distinct token sequences whose text ends with `marker`, shortest first."""
    variants: set[tuple[int, ...]] = set()
    for context in _END_MARKER_CONTEXTS:
        ids = tuple(_encode_after(tokenizer, context, marker))
        if ids and tokenizer.decode(list(ids)).endswith(marker):
            variants.add(ids)
    canonical = _marker_ids(tokenizer, marker)
    if canonical:
        variants.add(canonical)
    # A variant that ends with a shorter one is redundant: the shorter one fires first.
    minimal = [v for v in variants if not any(len(u) < len(v) and v[len(v) - len(u) :] == u for u in variants)]
    return tuple(sorted(minimal, key=lambda v: (len(v), v)))


def _is_single_token(tokenizer: Any, marker: str) -> bool:
    return len(_encode(tokenizer, marker)) == 1


def _render_generation_prompt(tokenizer: Any, **template_kwargs: Any) -> str | None:
    """Render a one-message conversation's generation prompt, or None if that fails."""
    if not _chat_template_text(tokenizer):
        return None
    try:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}],
            add_generation_prompt=True,
            tokenize=False,
            **template_kwargs,
        )
    except Exception:  # noqa: BLE001 - a template that cannot render opens nothing
        return None


@dataclass(frozen=True)
class ThinkingFormat:
    """A model family's thinking markers, as text and as token ids.

    `close_ids` are appended to force-close thinking (SSR's draft fork, the CoT cap):
    the tokens of "\\n<end>\\n\\n", what Qwen3/DeepSeek-R1 templates put between
    reasoning and answer. `end_variants` are every tokenization of the end marker that
    generated text may take; `EndOfThinkingMatcher` matches them.
    `template_opens_thinking` says the chat template's generation prompt already ends
    inside a thinking block (DeepSeek-R1), and `template_takes_enable_thinking` that it
    reads the `enable_thinking` variable (Qwen3).
    """

    kind: ThinkingKind
    start_marker: str
    end_marker: str
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    close_ids: tuple[int, ...]
    end_variants: tuple[tuple[int, ...], ...]
    template_opens_thinking: bool = False
    template_takes_enable_thinking: bool = False

    @classmethod
    def detect(
        cls,
        tokenizer: Any,
        override_start: str | None = None,
        override_end: str | None = None,
        *,
        kind: ThinkingKind | None = None,
    ) -> ThinkingFormat:
        """Work out the family's thinking format from its tokenizer and chat template.

        Native when the markers are single tokens, or the template mentions
        `enable_thinking` or the markers, or its generation prompt ends with the start
        marker; otherwise prompted. `override_start`/`override_end` replace the default
        `<think>`/`</think>` markers; `kind` forces the kind.
        """
        if kind == "none":
            return cls.none()
        template = _chat_template_text(tokenizer)
        style = None if (override_start or override_end) else _marker_style(tokenizer, template)
        start = override_start or (style.start if style else DEFAULT_START_MARKER)
        end = override_end or (style.end if style else DEFAULT_END_MARKER)
        takes_enable = "enable_thinking" in template
        rendered = _render_generation_prompt(tokenizer, **({"enable_thinking": True} if takes_enable else {}))
        opens = rendered is not None and rendered.rstrip().endswith(start)
        if kind is None:
            single_tokens = _is_single_token(tokenizer, start) and _is_single_token(tokenizer, end)
            mentions_markers = start in template and end in template
            native = single_tokens or takes_enable or opens or mentions_markers or style is not None
            kind = "native" if native else "prompted"
        if style is not None:
            close_ids = _encode(tokenizer, style.close)
        else:
            close_ids = _encode_after(tokenizer, "a", "\n" + end + "\n\n")
        return cls(
            kind=kind,
            start_marker=start,
            end_marker=end,
            start_ids=_marker_ids(tokenizer, start),
            end_ids=_marker_ids(tokenizer, end),
            close_ids=tuple(close_ids),
            end_variants=_marker_variants(tokenizer, end),
            template_opens_thinking=opens,
            template_takes_enable_thinking=takes_enable,
        )

    @classmethod
    def none(cls) -> ThinkingFormat:
        """A format with no thinking phase: nothing to open, close or detect."""
        return cls(
            kind="none",
            start_marker="",
            end_marker="",
            start_ids=(),
            end_ids=(),
            close_ids=(),
            end_variants=(),
        )

    @property
    def thinks(self) -> bool:
        return self.kind != "none"


def _message_text(content: Any) -> str:
    """OpenAI-style content: a string, or a list of text parts joined together."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ValueError(f"only text content parts are supported, got {part!r}")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    if content is None:
        return ""
    raise ValueError(f"message content must be a string or a list of text parts, got {type(content).__name__}")


def _normalize_messages(messages: Sequence[dict]) -> list[dict]:
    if len(messages) == 0:
        raise ValueError("messages is empty")
    normalized = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"message {index} must be a dict with a 'role', got {message!r}")
        role = message["role"]
        if role not in KNOWN_ROLES:
            raise ValueError(f"message {index} has unknown role {role!r}; expected one of {sorted(KNOWN_ROLES)}")
        normalized.append({**message, "content": _message_text(message.get("content"))})
    if not any(m["content"].strip() for m in normalized):
        raise ValueError("all messages are empty")
    return normalized


def plain_transcript(messages: Sequence[dict]) -> str:
    """A conversation as plain text, for a model without a chat template (a base model).

    Why: base models (e.g. Gemma-3-270M) ship no template, yet benchmarks and the server
    speak in messages. A lone user message becomes its own text — how base models are
    prompted on HumanEval-style completion tasks — after any system text; a longer
    conversation becomes a "User: …" / "Assistant: …" transcript ending in "Assistant:".
    """
    normalized = _normalize_messages(messages)
    system = "\n\n".join(m["content"] for m in normalized if m["role"] in ("system", "developer"))
    turns = [m for m in normalized if m["role"] not in ("system", "developer")]
    if len(turns) == 1 and turns[0]["role"] == "user":
        body = turns[0]["content"]
    else:
        body = "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in turns) + "\n\nAssistant:"
    return f"{system}\n\n{body}" if system else body


def build_prompt_text(
    tokenizer: Any,
    prompt: str | Sequence[dict],
    fmt: ThinkingFormat,
    enable_thinking: bool = True,
    tools: list[dict] | None = None,
) -> tuple[str, bool]:
    """The prompt as text, and whether the tokenizer should add its own special tokens.

    Chat-templated prompts carry their special tokens (BOS included) in the text; raw
    prompts (no chat template: a string as given, messages via `plain_transcript`) get the
    tokenizer's usual ones. `tools` (OpenAI function definitions) go to the template, which
    renders them in the model's own format.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt is empty")
    has_template = bool(_chat_template_text(tokenizer))
    if has_template:
        messages = _normalize_messages([{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt)
        kwargs: dict[str, Any] = {"enable_thinking": enable_thinking} if fmt.template_takes_enable_thinking else {}
        if tools:
            kwargs["tools"] = tools
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        raw = False
    else:
        text, raw = (prompt if isinstance(prompt, str) else plain_transcript(prompt)), True

    if fmt.kind == "prompted" and enable_thinking:
        separator = "" if (not text or text[-1].isspace()) else "\n"
        text = f"{text}{separator}{fmt.start_marker}\n"
    elif fmt.kind == "native" and not enable_thinking and not fmt.template_takes_enable_thinking:
        if text.rstrip().endswith(fmt.start_marker):
            # DeepSeek-R1 style: the template always opens thinking; close it empty,
            # as Qwen3 does for enable_thinking=False.
            text = f"{text.rstrip()}\n\n{fmt.end_marker}\n\n"
    return text, raw


def build_prompt_ids(
    tokenizer: Any,
    prompt: str | Sequence[dict],
    fmt: ThinkingFormat,
    enable_thinking: bool = True,
    tools: list[dict] | None = None,
) -> list[int]:
    """Token ids of the prompt, ready for generation.

    Applies the chat template (generation prompt on; `enable_thinking` passed to
    templates that read it); a plain string becomes one user message, or is tokenized
    raw when the tokenizer has no template (messages then go through `plain_transcript`). Prompted formats get the start marker
    appended so the model thinks first; with thinking disabled a template that always
    opens thinking gets an empty, closed block. Raises ValueError on empty prompts or
    messages and unknown roles.
    """
    text, raw = build_prompt_text(tokenizer, prompt, fmt, enable_thinking, tools)
    return list(tokenizer.encode(text, add_special_tokens=raw))


def thinking_enabled(fmt: ThinkingFormat | None, thinking: bool | None, default: bool = False) -> bool:
    """Whether a request asking `thinking` thinks first. None: the model's default, which is
    to think for a native format (or `default`, e.g. an adapter trained to think); a model
    without a thinking format never does."""
    if fmt is None or fmt.kind == "none":
        return False
    if thinking is None:
        return fmt.kind == "native" or default
    return thinking


def encode_prompt(
    tokenizer: Any,
    prompt: str | Sequence[dict] | Sequence[int],
    fmt: ThinkingFormat | None,
    *,
    enable_thinking: bool,
    tools: list[dict] | None = None,
) -> list[int]:
    """A request's prompt ids: token ids pass through; text and messages go through
    `build_prompt_ids`. ValueError for an empty prompt, or text without a tokenizer."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if tokenizer is None:
        raise ValueError("text prompts need a tokenizer; pass token ids instead")
    if isinstance(prompt, str) and not prompt.strip():
        raise ValueError("empty prompt")
    if isinstance(prompt, list) and not prompt:
        raise ValueError("empty prompt: no messages")
    return build_prompt_ids(
        tokenizer, prompt, fmt or ThinkingFormat.none(), enable_thinking=enable_thinking, tools=tools
    )


def generation_starts_in_thinking(fmt: ThinkingFormat, enable_thinking: bool = True) -> bool:
    """Whether the first generated token is inside a thinking block.

    True for prompted formats and templates that open thinking (the prompt already holds
    the start marker). Qwen3-style models emit their own start marker first;
    `split_reasoning` strips it, so they count as starting in thinking too.
    """
    return fmt.thinks and enable_thinking


class EndOfThinkingMatcher:
    """Detects, one generated token at a time, that the text now ends with the end marker.

    Keeps the last few tokens in a ring buffer and only compares the variants whose last
    token equals the new one, so each `feed` costs a dict lookup in the common case.
    `copy()` gives a forked request (SSR child) its own state.
    """

    __slots__ = ("_by_last_token", "_tail", "matched")

    def __init__(self, fmt: ThinkingFormat) -> None:
        by_last: dict[int, list[tuple[int, ...]]] = {}
        for variant in fmt.end_variants:
            by_last.setdefault(variant[-1], []).append(variant)
        self._by_last_token = {token: tuple(vs) for token, vs in by_last.items()}
        window = max((len(v) for v in fmt.end_variants), default=1)
        self._tail: deque[int] = deque(maxlen=window)
        self.matched = False
        """Sticky: the end marker has been seen at least once."""

    def feed(self, token_id: int) -> bool:
        """Add one generated token (a Python int); True when the tokens so far end with
        the end marker."""
        token_id = operator.index(token_id)  # a 0-d tensor would silently never match
        self._tail.append(token_id)
        candidates = self._by_last_token.get(token_id)
        if candidates is None:
            return False
        tail = self._tail
        tail_len = len(tail)
        for variant in candidates:
            n = len(variant)
            if n <= tail_len and all(tail[tail_len - n + i] == variant[i] for i in range(n - 1)):
                self.matched = True
                return True
        return False

    def feed_many(self, token_ids: Iterable[int]) -> int | None:
        """Feed tokens in order; the index of the first one that completes the marker."""
        for index, token_id in enumerate(token_ids):
            if self.feed(token_id):
                return index
        return None

    def matched_length(self) -> int:
        """Length of the shortest variant the current tail ends with (0 if none)."""
        tail = list(self._tail)
        if not tail:
            return 0
        for variant in self._by_last_token.get(tail[-1], ()):
            if tuple(tail[-len(variant) :]) == variant:
                return len(variant)
        return 0

    def reset(self) -> None:
        self._tail.clear()
        self.matched = False

    def copy(self) -> EndOfThinkingMatcher:
        clone = object.__new__(EndOfThinkingMatcher)
        clone._by_last_token = self._by_last_token
        clone._tail = deque(self._tail, maxlen=self._tail.maxlen)
        clone.matched = self.matched
        return clone


def split_reasoning(
    generated_ids: Sequence[int],
    fmt: ThinkingFormat,
    *,
    starts_in_thinking: bool = True,
) -> tuple[list[int], list[int]]:
    """Split generated ids into (reasoning_ids, answer_ids), markers removed.

    A leading start marker (Qwen3 emits its own `<think>`) is dropped. Everything before
    the first end marker is reasoning, everything after it is answer (whitespace the
    template puts after the marker stays at the answer's start: strip it as text). With
    no end marker the whole output is reasoning, unless generation did not start in
    thinking (`starts_in_thinking=False`, or a `none` format): then it is all answer.
    """
    ids = list(generated_ids)
    if not fmt.thinks:
        return [], ids
    start = list(fmt.start_ids)
    if start and ids[: len(start)] == start:
        ids = ids[len(start) :]
        starts_in_thinking = True
    if not starts_in_thinking:
        return [], ids
    matcher = EndOfThinkingMatcher(fmt)
    end_index = matcher.feed_many(ids)
    if end_index is None:
        return ids, []
    marker_length = matcher.matched_length()
    return ids[: end_index + 1 - marker_length], ids[end_index + 1 :]
