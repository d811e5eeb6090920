"""Response payloads in OpenAI's shapes (chat and text completions, chunks, usage).

Built as plain dicts: they are serialized once per chunk on the hot streaming path, and
the shapes are fixed by the OpenAI API, not by our models. `usage` carries the standard
counts plus a `selfspec` object with the request's speculation metrics.
"""

from __future__ import annotations

import json
from typing import Any

from selfspec.server.engine_loop import Finished


def build_usage(finished: Finished, prompt_tokens: int, mode: str) -> dict[str, Any]:
    """Token counts over every choice; the `selfspec` metrics are the first choice's."""
    m = finished.metrics
    completion = sum(len(choice.output_ids) for choice in finished.choices)
    cot = sum(int(choice.metrics.get("cot_tokens", 0)) for choice in finished.choices)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "completion_tokens_details": {"reasoning_tokens": cot},
        "selfspec": {
            "mode": mode,
            # True only for CoSpec (its policy reports it); every other mode is exact.
            "lossy": bool(m.get("lossy", False)),
            "cot_tokens": cot,
            "answer_tokens": int(m.get("answer_tokens", 0)),
            "accepted_prefix": int(m.get("accepted_prefix", 0)),
            "suffix_accepted_tokens": int(m.get("suffix_accepted_tokens", 0)),
            "accepted_tokens": int(m.get("accepted_tokens", 0)),
            "proposed_tokens": int(m.get("proposed_tokens", 0)),
            "drafts": int(m.get("drafts", 0)),
            "draft_tokens": int(m.get("draft_tokens", 0)),
            "forwards": int(m.get("forwards", 0)),
            "thinking_closed_by": m.get("thinking_closed_by", ""),
            "finish_detail": finished.finish_detail,
            "ttft_s": finished.ttft_s,
            "first_answer_token_s": finished.first_answer_token_s,
            "total_s": finished.total_s,
        },
    }
    if mode == "auto":
        usage["selfspec"]["auto"] = m.get("auto")  # the path taken, proposal lengths, tokens by source
    if mode == "cospec":
        usage["selfspec"].update(
            cospec_threshold=m.get("cospec_threshold"),
            kept_draft_tokens=int(m.get("kept_draft_tokens", 0)),
            arbitrations=int(m.get("arbitrations", 0)),
        )
    return usage


def finish_reason(finished: Finished) -> str:
    """OpenAI's vocabulary: stop | length; anything else (cancelled) as vLLM's "abort"."""
    return finished.finish_reason if finished.finish_reason in ("stop", "length") else "abort"


def chat_completion(
    request_id: str, created: int, model: str, *, choices: list[dict[str, Any]], usage: dict[str, Any]
) -> dict[str, Any]:
    """`choices`: per choice `{"index", "message", "logprobs", "finish_reason"}`."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def text_completion(
    request_id: str, created: int, model: str, *, choices: list[dict[str, Any]], usage: dict[str, Any]
) -> dict[str, Any]:
    """`choices`: per choice `{"index", "text", "logprobs", "finish_reason"}`."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage,
    }


class ChunkWriter:
    """Serializes the SSE events of one streamed response."""

    def __init__(self, request_id: str, created: int, model: str, *, chat: bool, include_usage: bool) -> None:
        self.chat = chat
        self.include_usage = include_usage
        self._base = {
            "id": request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
        }

    def _event(self, choices: list[dict[str, Any]], usage: Any = None, with_usage_key: bool | None = None) -> str:
        payload = {**self._base, "choices": choices}
        if with_usage_key if with_usage_key is not None else self.include_usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _choice(
        self,
        index: int = 0,
        *,
        reasoning: str = "",
        content: str = "",
        tool_calls: list[dict[str, Any]] | None = None,
        logprobs: dict[str, Any] | None = None,
        role: bool = False,
        reason: str | None = None,
    ) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
                delta["content"] = ""
            if reasoning:
                delta["reasoning_content"] = reasoning
            if content:
                delta["content"] = content
            if tool_calls:
                delta["tool_calls"] = tool_calls
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        return {"index": index, "text": reasoning + content, "logprobs": logprobs, "finish_reason": reason}

    def start(self, n: int = 1) -> str | None:
        """The opening chunks that carry the assistant role, one per choice (chat only)."""
        return "".join(self._event([self._choice(i, role=True)]) for i in range(n)) if self.chat else None

    def delta(
        self,
        index: int = 0,
        *,
        reasoning: str = "",
        content: str = "",
        tool_calls: list[dict[str, Any]] | None = None,
        logprobs: dict[str, Any] | None = None,
    ) -> str:
        choice = self._choice(index, reasoning=reasoning, content=content, tool_calls=tool_calls, logprobs=logprobs)
        return self._event([choice])

    def finish(self, reasons: list[str], usage: dict[str, Any]) -> str:
        """One closing chunk per choice, then the usage chunk when asked for."""
        out = "".join(self._event([self._choice(i, reason=reason)]) for i, reason in enumerate(reasons))
        if self.include_usage:
            out += self._event([], usage=usage, with_usage_key=True)
        return out

    @staticmethod
    def error(body: dict[str, Any]) -> str:
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    @staticmethod
    def done() -> str:
        return "data: [DONE]\n\n"
