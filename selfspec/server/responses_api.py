"""The Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`.

A Responses request is translated into a chat completions request (`to_chat_request`: the
instructions, earlier turns and input items become chat messages, flat function tools become
chat tools, `text.format` becomes `response_format`), so it goes through the very same
`RequestPlanner.plan_chat` (chat template, sampling, structured output, tool-call grammar and
parser, speculation options), `RequestSession` and `ChoiceOutput` as `/v1/chat/completions`;
only the shape of the answer differs (`responses_output`). Errors name the Responses field
(`input`, `max_output_tokens`, `text.format`), not the chat field it was translated to.

Responses are kept in memory (`responses_store`, unless `store: false`) so that
`previous_response_id` can continue them: the stored conversation and its output are put before
the new input, as OpenAI does (the new request's `instructions` replace the old ones).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import FastAPI
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from selfspec.server.app import ServerState, _SessionStream
from selfspec.server.choices import ChoiceOutput
from selfspec.server.engine_loop import Failed, Finished
from selfspec.server.errors import APIError, from_validation_error
from selfspec.server.request_plan import RequestPlan
from selfspec.server.responses import build_usage, finish_reason
from selfspec.server.responses_output import OutputBuilder, item_id, responses_usage, sse
from selfspec.server.responses_schema import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    NamedFunctionChoice,
    ReasoningItem,
    ResponsesRequest,
)
from selfspec.server.responses_store import ResponseStore, StoredResponse
from selfspec.server.schemas import ChatCompletionRequest
from selfspec.server.session import ClientDisconnected, RequestSession, RequestTimedOut, progress_tokens

_ITEMS = TypeAdapter(InputItem)

# Chat fields named in errors, and the Responses fields they were translated from.
_FIELD_NAMES = (
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    ("messages", "input"),
)


# ---------------------------------------------------------------------- request translation
def to_messages(instructions: str | None, items: list[Any]) -> list[dict[str, Any]]:
    """Chat messages from input items: function calls join the assistant turn they follow (one
    assistant message with `tool_calls`), a reasoning item becomes the next assistant turn's
    `reasoning_content`, a function call's output a `tool` message."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    reasoning: list[str] = []

    def assistant_turn(content: str | None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = "\n\n".join(reasoning)
            reasoning.clear()
        messages.append(message)
        return message

    for item in items:
        if isinstance(item, ReasoningItem):
            if item.text:
                reasoning.append(item.text)
        elif isinstance(item, MessageItem):
            if item.role == "assistant":
                assistant_turn(item.text)
            else:
                messages.append({"role": item.role, "content": item.text})
        elif isinstance(item, FunctionCallItem):
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or reasoning:
                last = assistant_turn(None)
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last.setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
    return messages


def to_chat_request(body: ResponsesRequest, items: list[Any]) -> ChatCompletionRequest:
    """The chat completions request this Responses request asks for (400 naming the Responses field)."""
    data: dict[str, Any] = {"model": body.model, "messages": to_messages(body.instructions, items)}
    if not data["messages"]:
        raise APIError(400, "input is empty", param="input")
    optional = {
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "user": body.user,
        "parallel_tool_calls": body.parallel_tool_calls,
        "selfspec": body.selfspec,
    }
    data.update({key: value for key, value in optional.items() if value is not None})
    if body.tools:
        data["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude_none=True, exclude={"type"})}
            for tool in body.tools
        ]
    choice = body.tool_choice
    if isinstance(choice, NamedFunctionChoice):
        data["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        data["tool_choice"] = choice
    text_format = body.text.format if body.text is not None else None
    forced = bool(body.tools) and (body.tool_choice == "required" or isinstance(choice, NamedFunctionChoice))
    # A forced call writes no text, so the text format has nothing to constrain in this turn (the
    # Agents SDK sends its output type's schema with every turn, the forced first one included).
    if text_format is not None and not forced:
        response_format: dict[str, Any] = {"type": text_format.type}
        if text_format.type == "json_schema":
            response_format["json_schema"] = {
                "name": text_format.name,
                "schema": text_format.schema_,
                **({"strict": text_format.strict} if text_format.strict is not None else {}),
                **({"description": text_format.description} if text_format.description is not None else {}),
            }
        data["response_format"] = response_format
    if body.reasoning is not None and body.reasoning.effort == "none":
        data["chat_template_kwargs"] = {"enable_thinking": False}
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise responses_error(from_validation_error(exc)) from None


def responses_error(error: APIError) -> APIError:
    """The same error, naming the Responses field a chat field was translated from."""
    if error.param is not None:
        for chat_name, name in _FIELD_NAMES:
            if error.param == chat_name or error.param.startswith(chat_name + "."):
                error.param = name  # message indexes do not map to input items: name the whole input
                break
        if error.param.startswith("tools.") and ".function." in error.param:
            error.param = error.param.replace(".function.", ".", 1)
    for chat_name, name in _FIELD_NAMES:
        error.message = error.message.replace(chat_name, name)
    return error


def output_as_input(output: list[dict[str, Any]]) -> list[Any]:
    """A stored response's output items as input items of the next turn."""
    return [_ITEMS.validate_python(item) for item in output]


# ---------------------------------------------------------------------- the response object
class ResponseFrame:
    """The fields every snapshot of one response repeats (the request's settings, echoed)."""

    def __init__(self, body: ResponsesRequest, response_id: str, model: str, default_temperature: float) -> None:
        text_format = body.text.format if body.text is not None else None
        choice = body.tool_choice
        self.id = response_id
        self.fields: dict[str, Any] = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None,
            "model": model,
            "output": [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": body.reasoning.model_dump()
            if body.reasoning is not None
            else {"effort": None, "summary": None},
            "store": body.stores,
            "temperature": body.temperature if body.temperature is not None else default_temperature,
            "text": {
                "format": text_format.model_dump(by_alias=True, exclude_none=True)
                if text_format is not None
                else {"type": "text"}
            },
            "tool_choice": choice.model_dump() if isinstance(choice, NamedFunctionChoice) else (choice or "auto"),
            "tools": [tool.model_dump() for tool in body.tools or []],
            "top_p": body.top_p if body.top_p is not None else 1.0,
            "truncation": "disabled",
            "usage": None,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    def render(self, **changes: Any) -> dict[str, Any]:
        return {**self.fields, **changes}

    def final(self, builder: OutputBuilder, reason: str, usage: dict[str, Any]) -> dict[str, Any]:
        status, details = _status(reason)
        return self.render(status=status, incomplete_details=details, output=builder.items, usage=usage)


def _status(reason: str) -> tuple[str, dict[str, Any] | None]:
    """OpenAI's status for a finish reason: out of tokens is `incomplete`, a cancelled request `cancelled`."""
    if reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if reason in ("stop", "tool_calls"):
        return "completed", None
    return "cancelled", None


# ---------------------------------------------------------------------- the routes
class ResponsesAPI:
    def __init__(self, state: ServerState, store: ResponseStore) -> None:
        self.state = state
        self.store = store

    async def create(self, request: Request) -> Response:
        started = time.perf_counter()
        state = self.state
        body: ResponsesRequest = await state.read_body(request, ResponsesRequest)
        model = state.check_model(body.model)
        context = self._history(body.previous_response_id) + body.items
        chat = to_chat_request(body, context)
        response_id = item_id("resp")
        try:
            plan, session, accepted = await state.start_request(
                request, response_id, state.planner.plan_chat, chat, started
            )
        except ClientDisconnected:
            return Response(status_code=499)
        except APIError as exc:
            raise responses_error(exc) from None
        frame = ResponseFrame(body, response_id, model, state.config.defaults.temperature)
        choice = state._choice_output(plan, accepted.thinking, chat=True)
        job = _Job(body, context, frame, plan, choice, accepted.prompt_tokens, started)
        headers = {"X-Request-Id": response_id}
        if body.stream:
            headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return _SessionStream(self._stream(session, job), session, media_type="text/event-stream", headers=headers)
        try:
            finished = await session.finished()
        except RequestTimedOut:
            session.close("timeout")
            raise APIError(408, f"the request did not finish within {plan.timeout_s:g} s", code="timeout") from None
        except ClientDisconnected:
            session.close("client disconnected")
            return Response(status_code=499)
        finally:
            session.close("error")  # no-op once finished
        builder = OutputBuilder()
        builder.feed(choice.update(finished.output_ids, finished.answer_start, finished=True))
        response = self._finish(job, builder, finished)[1]
        return JSONResponse(response, headers=headers)

    def _history(self, previous_response_id: str | None) -> list[Any]:
        if previous_response_id is None:
            return []
        entry = self.store.get(previous_response_id)
        if entry is None:
            raise APIError(
                400,
                f"Previous response with id '{previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return entry.context + output_as_input(entry.response["output"])

    def _finish(
        self, job: "_Job", builder: OutputBuilder, finished: Finished
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Close the output; record metrics; store the response. Returns the closing events and the response."""
        chat_usage = build_usage(finished, job.prompt_tokens, job.plan.mode)
        reason = job.choice.finish_reason(finish_reason(finished))
        events = builder.finish(_status(reason)[0])
        response = job.frame.final(builder, reason, responses_usage(chat_usage))
        self.state._record(job.plan, reason, chat_usage, job.started)
        if job.body.stores:
            self.store.put(StoredResponse(response, job.context))
        return events, response

    async def _stream(self, session: RequestSession, job: "_Job") -> AsyncIterator[str]:
        builder = OutputBuilder()
        frame, choice = job.frame, job.choice
        reason_to_abort = "client disconnected"
        try:
            yield sse(builder.event("response.created", response=frame.render()))
            yield sse(builder.event("response.in_progress", response=frame.render()))
            async for batch in session.updates():
                progress, terminal = progress_tokens(batch)
                if isinstance(terminal, Failed):
                    yield self._failure(builder, frame, terminal.message, "server_error")
                    return
                got = progress.get(0)
                final = terminal.choices[0] if terminal is not None else None
                if got is not None or final is not None:
                    delta = choice.update(
                        got.new_ids if got is not None else (),
                        final.answer_start if final is not None else got.answer_start,
                        final_ids=final.output_ids if final is not None else None,
                        finished=final is not None,
                    )
                    for event in builder.feed(delta):
                        yield sse(event)
                if terminal is not None:
                    events, response = self._finish(job, builder, terminal)
                    for event in events:
                        yield sse(event)
                    kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
                    yield sse(builder.event(kind, response=response))
                    return
        except RequestTimedOut:
            reason_to_abort = "timeout"
            message = f"the request did not finish within {job.plan.timeout_s:g} s"
            yield self._failure(builder, frame, message, "timeout")
        except ClientDisconnected:
            reason_to_abort = "client disconnected"
        finally:
            session.close(reason_to_abort)

    @staticmethod
    def _failure(builder: OutputBuilder, frame: ResponseFrame, message: str, code: str) -> str:
        """An `error` event, then `response.failed` (whose `error.code` is one of OpenAI's)."""
        error = builder.event("error", code=code, message=message, param=None)
        failed = frame.render(status="failed", output=builder.items, error={"code": "server_error", "message": message})
        return sse(error) + sse(builder.event("response.failed", response=failed))

    def get(self, response_id: str) -> dict[str, Any]:
        entry = self.store.get(response_id)
        if entry is None:
            raise _not_found(response_id)
        return entry.response

    def delete(self, response_id: str) -> dict[str, Any]:
        if not self.store.delete(response_id):
            raise _not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}


@dataclass
class _Job:
    """What a response's completion needs, streamed or not."""

    body: ResponsesRequest
    context: list[Any]  # the conversation's input items, stored with the response
    frame: ResponseFrame
    plan: RequestPlan
    choice: ChoiceOutput
    prompt_tokens: int
    started: float


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param="response_id", code="not_found")


def add_responses_routes(app: FastAPI, state: ServerState, store: ResponseStore | None = None) -> ResponsesAPI:
    """Serve the Responses API on `app`, sharing `state` (engine loop, planner, metrics) with chat."""
    api = ResponsesAPI(state, store or ResponseStore())

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        return await api.create(request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str) -> JSONResponse:
        return JSONResponse(api.get(response_id))

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> JSONResponse:
        return JSONResponse(api.delete(response_id))

    return api
