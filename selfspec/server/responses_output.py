"""A response's output items and stream events in the Responses API's shapes.

`OutputBuilder` turns a choice's deltas (`choices.ChoiceDelta`: reasoning, content, whole tool
calls) into output items, in the order the model wrote them: a `reasoning` item with the chain
of thought (`reasoning_text` content, as vLLM returns the raw reasoning of open models; `summary`
stays empty, since nothing summarizes it), a `message` item with `output_text`, and one
`function_call` item per call. Each step also yields the semantic stream events OpenAI documents
(`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`, ...),
numbered by one counter per response. Streaming and non-streaming responses use the same builder
(the latter drops the events), so a stream's final `response.completed` equals the JSON response.

Whitespace that precedes a tool call opens no message item (chat returns `content: null` then);
a response without any function call always has a message item, empty if the model said nothing.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from selfspec.server.choices import ChoiceDelta


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def sse(event: dict[str, Any]) -> str:
    """One server-sent event, named by its `type` as OpenAI's stream names them."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


class OutputBuilder:
    """The output items of one response, built from its deltas, and the events that build them."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._sequence = 0
        self._reasoning: int | None = None  # index in `items` of the open reasoning item
        self._message: int | None = None  # index of the open message item
        self._pending = ""  # answer text that is only whitespace so far (no message opened for it yet)
        self.function_calls = 0

    # ------------------------------------------------------------------ events
    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _open(self, item: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        self.items.append(item)
        index = len(self.items) - 1
        return index, [self.event("response.output_item.added", output_index=index, item=_snapshot(item))]

    # ------------------------------------------------------------------ feeding
    def feed(self, delta: ChoiceDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            events += self._reasoning_text(delta.reasoning)
        if delta.content:
            events += self._answer_text(delta.content)
        for call in delta.tool_calls:
            events += self._function_call(call)
        return events

    def _reasoning_text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._reasoning is None:
            item = {
                "id": item_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [],
                "encrypted_content": None,
                "status": "in_progress",
            }
            self._reasoning, events = self._open(item)
            item["content"].append({"type": "reasoning_text", "text": ""})
            events.append(self._part_event("response.content_part.added", self._reasoning))
        item = self.items[self._reasoning]
        item["content"][0]["text"] += text
        events.append(
            self.event(
                "response.reasoning_text.delta",
                item_id=item["id"],
                output_index=self._reasoning,
                content_index=0,
                delta=text,
            )
        )
        return events

    def _answer_text(self, text: str) -> list[dict[str, Any]]:
        events = self._close_reasoning("completed")
        if self._message is None:
            self._pending += text
            if not self._pending.strip():
                return events
            text, self._pending = self._pending, ""
            events += self._open_message()
        item = self.items[self._message]
        item["content"][0]["text"] += text
        events.append(
            self.event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self._message,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _open_message(self) -> list[dict[str, Any]]:
        item = {"id": item_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        self._message, events = self._open(item)
        item["content"].append({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        events.append(self._part_event("response.content_part.added", self._message))
        return events

    def _function_call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close_reasoning("completed") + self._close_message("completed")
        self._pending = ""  # whitespace before a call is no message
        function = call["function"]
        item = {
            "id": item_id("fc"),
            "type": "function_call",
            "call_id": call["id"],
            "name": function["name"],
            "arguments": "",
            "status": "in_progress",
        }
        index, opened = self._open(item)
        events += opened
        arguments = function["arguments"]
        item["arguments"] = arguments
        events.append(
            self.event(
                "response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=arguments
            )
        )
        events.append(
            self.event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=arguments,
            )
        )
        item["status"] = "completed"
        events.append(self.event("response.output_item.done", output_index=index, item=_snapshot(item)))
        self.function_calls += 1
        return events

    # ------------------------------------------------------------------ closing
    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close what is open; `status` ("completed" or "incomplete") goes on the open items."""
        events = self._close_reasoning(status)
        if self._message is None and self.function_calls == 0:
            events += self._open_message()  # a whitespace-only answer is flushed into it below
        if self._message is not None and self._pending:
            item = self.items[self._message]
            item["content"][0]["text"] += self._pending
            events.append(
                self.event(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=self._message,
                    content_index=0,
                    delta=self._pending,
                    logprobs=[],
                )
            )
            self._pending = ""
        return events + self._close_message(status)

    def _close_reasoning(self, status: str) -> list[dict[str, Any]]:
        if self._reasoning is None:
            return []
        index, self._reasoning = self._reasoning, None
        item = self.items[index]
        text = item["content"][0]["text"]
        events = [
            self.event(
                "response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=text
            ),
            self._part_event("response.content_part.done", index),
        ]
        item["status"] = status
        events.append(self.event("response.output_item.done", output_index=index, item=_snapshot(item)))
        return events

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        if self._message is None:
            return []
        index, self._message = self._message, None
        item = self.items[index]
        text = item["content"][0]["text"]
        events = [
            self.event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self._part_event("response.content_part.done", index),
        ]
        item["status"] = status
        events.append(self.event("response.output_item.done", output_index=index, item=_snapshot(item)))
        return events

    def _part_event(self, kind: str, index: int) -> dict[str, Any]:
        item = self.items[index]
        part = dict(item["content"][0])
        if kind.endswith(".added"):
            part["text"] = ""
        return self.event(kind, item_id=item["id"], output_index=index, content_index=0, part=part)


def _snapshot(item: dict[str, Any]) -> dict[str, Any]:
    """A copy of an item as it stands (later deltas must not change an event already built)."""
    return json.loads(json.dumps(item))


def responses_usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """The Responses API's usage from a chat usage (`responses.build_usage`), metrics included."""
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},  # no prompt cache to report
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": chat_usage["completion_tokens_details"]["reasoning_tokens"]},
        "total_tokens": chat_usage["total_tokens"],
        "selfspec": chat_usage["selfspec"],
    }
