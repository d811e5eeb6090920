"""The OpenAI Agents SDK against a real `selfspec serve` process, through its default model
(`OpenAIResponsesModel`, i.e. `POST /v1/responses`): a multi-turn, tool-using agent loop.

The tiny random model chooses nothing by itself, so the first turn forces the tool call
(`tool_choice="required"`, enforced by the grammar) and the agent's output type (a JSON schema,
enforced the same way) makes the last turn end in a final message. The server runs n-gram
speculation by default (`--speculation ngram`) and the agent's requests ask for suffix decoding
through `extra_body`, so both ways of turning speculation on are exercised.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel

agents = pytest.importorskip("agents")
pytest.importorskip("xgrammar")

from agents import (  # noqa: E402
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI  # noqa: E402

from selfspec.testing.serve_process import serve_process  # noqa: E402

MODEL = "tiny"


class Verdict(BaseModel):
    verdict: Literal["sunny", "rainy"]


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    args = [
        "--model", MODEL, "--host", "127.0.0.1", "--num-slots", "4", "--max-len", "2048",
        "--speculation", "ngram", "--cot-cap", "4", "--log-level", "warning",
    ]  # fmt: skip
    with serve_process(args, tmp_path_factory.mktemp("agents") / "server.log", stop_timeout=20) as server:
        yield server.url


def _agent(calls: list[dict], speculation: dict | None) -> Agent:
    @function_tool
    def get_weather(city: Literal["Paris", "Rome"], days: Literal[1, 2, 3]) -> str:
        """The weather forecast of a city for the next few days."""
        calls.append({"city": city, "days": days})
        return f"sunny in {city} for {days} days"

    extra_body = {"selfspec": {"speculation": speculation}} if speculation else None
    return Agent(
        name="forecaster",
        instructions="Answer with the forecast.",
        tools=[get_weather],
        output_type=Verdict,
        # The first turn must call the tool; the SDK then resets tool_choice (reset_tool_choice) and
        # the schema-constrained answer ends the run.
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=120, extra_body=extra_body
        ),
        reset_tool_choice=True,
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("speculation", [None, {"method": "suffix"}], ids=["server-ngram", "request-suffix"])
def test_an_agent_calls_its_tool_and_answers(server_url, streamed, speculation):
    set_tracing_disabled(True)
    set_default_openai_api("responses")
    calls: list[dict] = []
    agent = _agent(calls, speculation)
    agent.model = MODEL

    async def run():
        client = AsyncOpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        set_default_openai_client(client, use_for_tracing=False)
        try:
            if not streamed:
                return await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
            result = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=4)
            kinds = [event.type async for event in result.stream_events()]
            assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
            return result
        finally:
            await client.close()

    result = asyncio.run(run())
    assert len(calls) == 1 and calls[0]["city"] in ("Paris", "Rome") and calls[0]["days"] in (1, 2, 3)
    assert isinstance(result.final_output, Verdict)
    assert [type(item).__name__ for item in result.new_items if "Tool" in type(item).__name__] == [
        "ToolCallItem",
        "ToolCallOutputItem",
    ]
    assert result.new_items[-1].type == "message_output_item"
    assert len(result.raw_responses) == 2  # the tool call, then the answer
    for raw in result.raw_responses:
        stored = httpx.get(f"{server_url}/v1/responses/{raw.response_id}").json()
        assert stored["status"] == "completed"
        assert stored["usage"]["selfspec"]["mode"] == (speculation["method"] if speculation else "ngram")
        assert stored["usage"]["selfspec"]["lossy"] is False
    first, second = (httpx.get(f"{server_url}/v1/responses/{raw.response_id}").json() for raw in result.raw_responses)
    assert [item["type"] for item in first["output"]] == ["reasoning", "function_call"]
    assert first["tool_choice"] == "required" and second["tool_choice"] == "auto"
    assert second["text"]["format"]["type"] == "json_schema"
