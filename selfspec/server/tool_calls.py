"""Tool calls in a model's own output format: one parser per family, chosen from the chat template.

A model calls tools in the syntax its chat template teaches it:
* `hermes` (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
* `qwen3_xml` (Qwen3.5, Qwen3-Coder): `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>
  ...</function>\\n</tool_call>`;
* `llama3_json` (Llama 3.1-3.3): the whole answer is `{"name": ..., "parameters": {...}}` (after an
  optional `<|python_tag|>`), several calls separated by `;`.

Every parser turns the answer text into the content outside the calls and a list of calls
(`parse`), and streams: `feed(text)` returns the content that can be shown now and the calls
completed so far, holding back text that may still become a call; `close()` flushes. Calls are
emitted whole (name and full arguments in one delta), which OpenAI clients accumulate like
fragments. Reasoning never reaches a parser: it is split off before (`output_text`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

FAMILIES = ("hermes", "qwen3_xml", "llama3_json")


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            call["index"] = index
        return call


def family_of(chat_template: str | None) -> str | None:
    """The tool-call format a chat template renders (None: the template knows no tools)."""
    if not chat_template:
        return None
    if "<function=" in chat_template and "<tool_call>" in chat_template:
        return "qwen3_xml"
    if "<tool_call>" in chat_template:
        return "hermes"
    if "<|python_tag|>" in chat_template or ('"parameters"' in chat_template and "tools" in chat_template):
        return "llama3_json"
    return None


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest proper prefix of `marker` that `text` ends with."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _arguments_json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class ToolCallParser:
    """Base: tagged calls (`<tool_call>...</tool_call>`); subclasses parse one call's body."""

    start = "<tool_call>"
    end = "</tool_call>"

    def __init__(self) -> None:
        self._buffer = ""
        self._inside = False

    def parse_body(self, body: str) -> ParsedToolCall | None:
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str, list[ParsedToolCall]]:
        """All of an answer at once: (content outside the calls, calls)."""
        content, calls = self.feed(text)
        more_content, more_calls = self.close()
        return content + more_content, calls + more_calls

    def feed(self, text: str) -> tuple[str, list[ParsedToolCall]]:
        self._buffer += text
        content, calls = [], []
        while True:
            if not self._inside:
                at = self._buffer.find(self.start)
                if at < 0:
                    keep = _partial_suffix(self._buffer, self.start)
                    content.append(self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    break
                content.append(self._buffer[:at])
                self._buffer = self._buffer[at + len(self.start) :]
                self._inside = True
            at = self._buffer.find(self.end)
            if at < 0:
                break
            body, self._buffer = self._buffer[:at], self._buffer[at + len(self.end) :]
            self._inside = False
            call = self.parse_body(body)
            if call is None:  # not a well-formed call: the client sees the text as the model wrote it
                content.append(self.start + body + self.end)
            else:
                calls.append(call)
        return "".join(content), calls

    def close(self) -> tuple[str, list[ParsedToolCall]]:
        """End of output: an unterminated call is parsed if it can be, else shown as text."""
        rest, self._buffer = self._buffer, ""
        if not self._inside:
            return rest, []
        self._inside = False
        call = self.parse_body(rest[: len(rest) - _partial_suffix(rest, self.end)])
        return ("", [call]) if call is not None else (self.start + rest, [])


class HermesParser(ToolCallParser):
    def parse_body(self, body: str) -> ParsedToolCall | None:
        try:
            data = json.loads(body.strip())
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return None
        return ParsedToolCall(data["name"], _arguments_json(data.get("arguments", {})))


class QwenXMLParser(ToolCallParser):
    _function = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
    _parameter = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)

    def parse_body(self, body: str) -> ParsedToolCall | None:
        match = self._function.search(body)
        if match is None:
            return None
        arguments = {}
        for key, raw in self._parameter.findall(match.group(2)):
            try:
                arguments[key.strip()] = json.loads(raw)
            except json.JSONDecodeError:
                arguments[key.strip()] = raw
        return ParsedToolCall(match.group(1).strip(), json.dumps(arguments, ensure_ascii=False))


class Llama3JSONParser(ToolCallParser):
    """The answer is the call(s): decided by its first visible character, so plain answers stream."""

    python_tag = "<|python_tag|>"

    def __init__(self) -> None:
        super().__init__()
        self._mode: str | None = None  # None: undecided, "text", "calls"

    def feed(self, text: str) -> tuple[str, list[ParsedToolCall]]:
        if self._mode == "text":
            return text, []
        self._buffer += text
        if self._mode is None:
            head = self._buffer.lstrip()
            if not head or (self.python_tag.startswith(head) and head != self.python_tag):
                return "", []  # nothing visible yet, or what may still become the tag
            if not head.startswith(("{", self.python_tag)):
                self._mode = "text"
                out, self._buffer = self._buffer, ""
                return out, []
            self._mode = "calls"
        return "", []

    def close(self) -> tuple[str, list[ParsedToolCall]]:
        rest, self._buffer = self._buffer, ""
        if self._mode == "text":
            return rest, []
        body = rest.strip().removeprefix(self.python_tag).strip()
        calls = []
        decoder = json.JSONDecoder()
        index = 0
        while index < len(body):
            try:
                data, end = decoder.raw_decode(body, index)
            except json.JSONDecodeError:
                return rest, []
            if not isinstance(data, dict) or not isinstance(data.get("name"), str):
                return rest, []
            calls.append(
                ParsedToolCall(data["name"], _arguments_json(data.get("parameters", data.get("arguments", {}))))
            )
            index = end
            while index < len(body) and body[index] in " \n\t;":
                index += 1
        return ("", calls) if calls else (rest, [])


def make_parser(family: str) -> ToolCallParser:
    parsers = {"hermes": HermesParser, "qwen3_xml": QwenXMLParser, "llama3_json": Llama3JSONParser}
    if family not in parsers:
        raise ValueError(f"unknown tool-call format {family!r}; expected one of {FAMILIES}")
    return parsers[family]()
