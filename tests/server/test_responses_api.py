"""The Responses API (`/v1/responses`) over real HTTP: the same answers as chat completions, the
documented stream events (validated against the openai package's own event models), function
calls across turns, structured output, speculation, stored responses and 400s naming the field.

The tiny random model never calls a tool or writes JSON by itself: forced tool calls and schemas
are enforced by the grammar, so every test asserts the parsed output and, where a reference
exists, compares it with the chat completions endpoint (greedy, token for token).
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from selfspec.server import BackgroundServer, ServerConfig, create_app
from selfspec.server.choices import ChoiceDelta
from selfspec.server.cli import load_llm
from selfspec.server.responses_api import to_messages
from selfspec.server.responses_output import OutputBuilder
from selfspec.server.responses_schema import ResponsesRequest
from selfspec.server.responses_store import ResponseStore, StoredResponse

pytest.importorskip("xgrammar")

MODEL = "tiny"
THINK = {"selfspec": {"cot_cap": 5}}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather by city",
        "parameters": WEATHER,
        "strict": True,
    },
    {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}},
]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}} for tool in TOOLS]
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def server():
    llm = load_llm(MODEL, num_slots=8, max_len=1024)
    running = BackgroundServer(create_app(llm, ServerConfig(served_model_names=[MODEL]))).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def create(server, **body) -> dict:
    """POST /v1/responses; the reply validated against the openai package's `Response` model."""
    reply = httpx.post(server.url + "/v1/responses", json={"model": MODEL, **body}, timeout=120)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    Response.model_validate(data)
    return data


def stream(server, **body) -> list[dict]:
    """The SSE events of a streamed response, each checked against OpenAI's event models."""
    events = []
    with httpx.stream(
        "POST", server.url + "/v1/responses", json={"model": MODEL, "stream": True, **body}, timeout=120
    ) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in reply.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert data["type"] == name
                parsed = EVENTS.validate_python(data)
                assert parsed.type == name and type(parsed).__name__.startswith("Response")
                events.append(data)
    return events


def items(response: dict, kind: str) -> list[dict]:
    return [item for item in response["output"] if item["type"] == kind]


def message_text(response: dict) -> str:
    return "".join(part["text"] for item in items(response, "message") for part in item["content"])


def reasoning_text(response: dict) -> str:
    return "".join(part["text"] for item in items(response, "reasoning") for part in item["content"])


def check_stream(events: list[dict]) -> dict:
    """The events' order and numbering; deltas that add up to the final response. Returns it."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    final = events[-1]["response"]
    Response.model_validate(final)
    for kind, get in (("output_text", message_text), ("reasoning_text", reasoning_text)):
        deltas = "".join(e["delta"] for e in events if e["type"] == f"response.{kind}.delta")
        assert deltas == get(final)
        done = [e["text"] for e in events if e["type"] == f"response.{kind}.done"]
        assert "".join(done) == get(final)
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    closed = [e for e in events if e["type"] == "response.output_item.done"]
    assert added == [e["output_index"] for e in closed] == list(range(len(final["output"])))
    assert [e["item"] for e in closed] == final["output"]
    return final


def same_answer(a: dict, b: dict) -> None:
    assert a["status"] == b["status"]
    assert [item["type"] for item in a["output"]] == [item["type"] for item in b["output"]]
    assert message_text(a) == message_text(b) and reasoning_text(a) == reasoning_text(b)
    calls = [(c["name"], c["arguments"]) for c in items(a, "function_call")]
    assert calls == [(c["name"], c["arguments"]) for c in items(b, "function_call")]
    assert a["usage"]["input_tokens"] == b["usage"]["input_tokens"]
    assert a["usage"]["output_tokens"] == b["usage"]["output_tokens"]


# ---------------------------------------------------------------------- plain answers
def test_a_response_is_the_chat_completion_in_the_responses_shape(server, client):
    body = dict(instructions="Be brief.", input="What is 2+3?", max_output_tokens=40, extra_body=THINK)
    response = client.responses.create(model=MODEL, **body)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}],
        max_completion_tokens=40,
        extra_body=THINK,
    )
    data = response.model_dump()
    assert response.id.startswith("resp_") and response.object == "response" and response.model == MODEL
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert reasoning_text(data) == chat.choices[0].message.reasoning_content
    assert response.output_text == chat.choices[0].message.content
    usage = response.usage
    assert usage.input_tokens == chat.usage.prompt_tokens and usage.output_tokens == chat.usage.completion_tokens
    assert usage.output_tokens_details.reasoning_tokens == chat.usage.completion_tokens_details.reasoning_tokens == 5
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert data["usage"]["selfspec"]["mode"] == "plain"
    expected = "completed" if chat.choices[0].finish_reason == "stop" else "incomplete"
    assert response.status == expected and response.error is None
    assert response.instructions == "Be brief." and response.max_output_tokens == 40 and response.store is True


def test_out_of_tokens_is_incomplete(server):
    response = create(server, input="Count to a hundred.", max_output_tokens=3, reasoning={"effort": "none"})
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["output_tokens"] == 3 and items(response, "reasoning") == []
    assert items(response, "message")[0]["status"] == "incomplete"


@pytest.mark.parametrize("prompt", ["Hello!", "Write is_prime(n).", "Is 7 prime?"])
def test_the_stream_adds_up_to_the_response(server, prompt):
    body = dict(input=[{"role": "user", "content": [{"type": "input_text", "text": prompt}]}], max_output_tokens=24)
    events = stream(server, **body, **THINK)
    final = check_stream(events)
    same_answer(final, create(server, **body, **THINK))
    kinds = [e["type"] for e in events]
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")


# ---------------------------------------------------------------------- tools
@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
def test_a_function_call_round_trip(server, client, streamed):
    """A forced call, its output sent back with previous_response_id, then the model's answer:
    the same tokens as chat completions given the same history explicitly."""
    first_body = dict(input="What is the weather in Paris?", tools=TOOLS, tool_choice="required", max_output_tokens=200)
    first_body["parallel_tool_calls"] = False
    if streamed:
        events = stream(server, **first_body, **THINK)
        first = check_stream(events)
        kinds = [e["type"] for e in events]
        assert kinds.count("response.function_call_arguments.delta") == 1
        done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
        assert done["arguments"] == items(first, "function_call")[0]["arguments"]
    else:
        first = create(server, **first_body, **THINK)
    assert first["status"] == "completed" and items(first, "message") == []
    (call,) = items(first, "function_call")
    assert call["name"] in ("get_weather", "get_time") and call["call_id"].startswith("call_")
    assert call["id"].startswith("fc_") and call["status"] == "completed"
    if call["name"] == "get_weather":
        jsonschema.validate(json.loads(call["arguments"]), WEATHER)

    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21 C"}
    follow = dict(tools=TOOLS, max_output_tokens=30, **THINK)
    second = create(server, previous_response_id=first["id"], input=[result], **follow)
    assert second["previous_response_id"] == first["id"]
    assert items(second, "message") and second["status"] in ("completed", "incomplete")

    # The same turn without the stored response: the client sends the history items itself.
    history = [{"role": "user", "content": first_body["input"]}, *first["output"], result]
    same_answer(second, create(server, input=history, **follow))

    chat = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": first_body["input"]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": reasoning_text(first),
                "tool_calls": [
                    {"id": call["call_id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
                ],
            },
            {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny, 21 C"},
        ],
        tools=CHAT_TOOLS,
        max_completion_tokens=30,
        extra_body=THINK,
    )  # fmt: skip
    assert message_text(second) == chat.choices[0].message.content
    assert second["usage"]["input_tokens"] == chat.usage.prompt_tokens


def test_a_named_function_is_called(server):
    response = create(
        server,
        input="Time?",
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=80,
        **THINK,
    )
    assert response["status"] == "completed"
    assert [c["name"] for c in items(response, "function_call")][:1] == ["get_time"]
    assert response["tool_choice"] == {"type": "function", "name": "get_time"}
    assert [tool["name"] for tool in response["tools"]] == ["get_weather", "get_time"]


def test_tool_choice_none_renders_no_tools(server):
    with_none = create(server, input="Hi", tools=TOOLS, tool_choice="none", max_output_tokens=8, **THINK)
    without = create(server, input="Hi", max_output_tokens=8, **THINK)
    same_answer(with_none, without)


# ---------------------------------------------------------------------- structured output, speculation
ANSWER = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["verdict", "sure"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("speculation", [None, {"method": "ngram"}, {"method": "suffix"}])
def test_json_schema_output_is_valid_and_speculation_changes_nothing(server, speculation):
    fmt = {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}
    options = {"cot_cap": 5, **({"speculation": speculation} if speculation else {})}
    body = dict(input="Is 7 prime?", text={"format": fmt}, max_output_tokens=80, selfspec=options)
    response = create(server, **body)
    assert response["status"] == "completed" and response["text"]["format"]["name"] == "answer"
    jsonschema.validate(json.loads(message_text(response)), ANSWER)
    assert response["usage"]["selfspec"]["mode"] == (speculation["method"] if speculation else "plain")
    if speculation:
        same_answer(response, create(server, **{**body, "selfspec": {"cot_cap": 5}}))
        same_answer(check_stream(stream(server, **body)), response)


@pytest.mark.parametrize("prompt", ["Say hello hello hello hello.", "def add(a, b):"])
def test_speculation_returns_the_plain_tokens(server, prompt):
    plain = create(server, input=prompt, max_output_tokens=40, **THINK)
    for method in ("ngram", "suffix"):
        spec = create(
            server, input=prompt, max_output_tokens=40, selfspec={"cot_cap": 5, "speculation": {"method": method}}
        )
        assert spec["usage"]["selfspec"]["mode"] == method
        same_answer(spec, plain)


# ---------------------------------------------------------------------- stored responses
def test_stored_responses_can_be_read_continued_and_deleted(server):
    first = create(server, input="Hello", max_output_tokens=6, **THINK)
    got = httpx.get(f"{server.url}/v1/responses/{first['id']}")
    assert got.status_code == 200 and got.json() == first
    second = create(server, previous_response_id=first["id"], input="And again?", max_output_tokens=6, **THINK)
    explicit = [{"role": "user", "content": "Hello"}, *first["output"], {"role": "user", "content": "And again?"}]
    same_answer(second, create(server, input=explicit, max_output_tokens=6, **THINK))

    deleted = httpx.delete(f"{server.url}/v1/responses/{first['id']}")
    assert deleted.json() == {"id": first["id"], "object": "response", "deleted": True}
    assert httpx.get(f"{server.url}/v1/responses/{first['id']}").status_code == 404
    assert httpx.delete(f"{server.url}/v1/responses/{first['id']}").status_code == 404
    gone = httpx.post(
        server.url + "/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": first["id"]}
    )
    assert gone.status_code == 400
    assert gone.json()["error"] == {
        "message": f"Previous response with id '{first['id']}' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    # The second response kept the whole conversation: it continues without the deleted first.
    third = create(server, previous_response_id=second["id"], input="Bye", max_output_tokens=4, **THINK)
    assert third["usage"]["input_tokens"] > second["usage"]["input_tokens"]

    unstored = create(server, input="Hello", max_output_tokens=4, store=False, **THINK)
    assert unstored["store"] is False
    assert httpx.get(f"{server.url}/v1/responses/{unstored['id']}").status_code == 404


def test_the_store_keeps_the_most_recently_used():
    store = ResponseStore(capacity=2)
    for name in ("a", "b"):
        store.put(StoredResponse({"id": name}))
    assert store.get("a") is not None  # "a" is now the most recent
    store.put(StoredResponse({"id": "c"}))
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2


# ---------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "x", "max_output_token": 5}, "max_output_token"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "max_output_tokens": 100000}, "max_output_tokens"),
        ({"input": "x", "temperature": "hot"}, "temperature"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        ({"input": [{"type": "input_image", "image_url": "http://x"}]}, "input.0.type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input.0.content"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": "x", "tools": [{"type": "function", "name": "a b"}]}, "tools.0.name"),
        ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}}, "text.format"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": "x", "include": ["file_search_call.results"]}, "include.0"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "reasoning": {"effort": "max"}}, "reasoning.effort"),
        ({"input": "x", "selfspec": {"ssr": {"reuse": "everything"}}}, "selfspec.ssr.reuse"),
        ({"input": "x", "speculation": {"method": "telepathy"}}, "selfspec.speculation"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(server, body, param):
    reply = httpx.post(server.url + "/v1/responses", json={"model": MODEL, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] is not None and error["param"].startswith(param), error


def test_an_unknown_model_is_a_404(server):
    reply = httpx.post(server.url + "/v1/responses", json={"model": "gpt-9", "input": "x"})
    assert reply.status_code == 404 and reply.json()["error"]["param"] == "model"


def test_what_clients_send_by_default_is_accepted(server):
    """The Agents SDK and the openai client send `include: []`, `tools: []`, `tool_choice: auto`,
    items with ids and statuses, `output_text` parts with annotations, `stream_options`."""
    response = create(
        server,
        input=[
            {"role": "developer", "content": "Be terse."},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Hi.", "annotations": [], "logprobs": []}],
            },
            {"type": "message", "role": "user", "content": "Again?"},
        ],
        include=[],
        tools=[],
        tool_choice="auto",
        parallel_tool_calls=True,
        metadata={"run": "1"},
        user="me",
        reasoning={"effort": "medium", "summary": "auto"},
        truncation="disabled",
        service_tier="auto",
        max_output_tokens=4,
        **THINK,
    )
    assert response["metadata"] == {"run": "1"} and response["user"] == "me"
    streamed = stream(server, input="Hi", stream_options={"include_obfuscation": False}, max_output_tokens=3)
    check_stream(streamed)


# ---------------------------------------------------------------------- the pieces
def test_function_calls_join_the_assistant_turn_and_reasoning_goes_with_it():
    body = ResponsesRequest.model_validate(
        {
            "model": MODEL,
            "input": [
                {"role": "user", "content": "q"},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"a": 1}'},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
            ],
        }
    )
    messages = to_messages("sys", body.items)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assistant = messages[2]
    assert assistant["reasoning_content"] == "think" and assistant["content"] is None
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["f", "g"]
    assert [m["content"] for m in messages[3:]] == ["one", "two"]


def test_whitespace_before_a_call_opens_no_message():
    builder = OutputBuilder()
    builder.feed(ChoiceDelta(content="\n"))
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    builder.feed(ChoiceDelta(tool_calls=[call]))
    builder.finish("completed")
    assert [item["type"] for item in builder.items] == ["function_call"]

    empty = OutputBuilder()
    empty.feed(ChoiceDelta(content=" "))
    events = empty.finish("completed")
    assert [item["type"] for item in empty.items] == ["message"]
    assert empty.items[0]["content"][0]["text"] == " "
    assert [e["type"] for e in events][-1] == "response.output_item.done"


def test_a_stream_that_times_out_ends_with_error_and_failed(server):
    """The deadline passes mid-stream: an `error` event, then `response.failed` with what was written."""
    body = {"model": MODEL, "input": "Go on.", "max_output_tokens": 900, "stream": True}
    body.update(reasoning={"effort": "none"}, selfspec={"timeout_s": 0.3})
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=120) as reply:
        if reply.status_code == 408:
            pytest.skip("the request timed out before it started (a loaded machine)")
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: ")]
    for event in events:
        EVENTS.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "timeout"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert message_text(failed) == "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
