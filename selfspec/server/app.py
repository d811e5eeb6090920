"""The OpenAI-compatible FastAPI app: `create_app(llm, config)`, `llm` an `LLM` or any
`backend.ServingBackend` (the vLLM one: `selfspec.integrations.vllm.serving`).

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
GET /metrics; `responses_api` adds the Responses API (/v1/responses). A request goes: auth ->
body (size-capped, strictly validated) -> model name -> `RequestPlanner` (worker thread: chat
template, tokenization, limits) -> `RequestSession` (engine loop) -> a JSON response or an SSE
stream. Every rejection is an `APIError` rendered in OpenAI's error shape; an unexpected
exception is the only 500.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from selfspec.server.backend import ServingBackend, as_backend
from selfspec.server.choices import ChoiceOutput, chat_logprobs, completion_logprobs
from selfspec.server.config import ServerConfig
from selfspec.server.engine_loop import Accepted, EngineLoop, Failed, LoopHooks
from selfspec.server.errors import APIError, from_validation_error
from selfspec.server.grammar_compile import ClientLeft, GrammarCompiles
from selfspec.server.metrics import CONTENT_TYPE, ServerMetrics
from selfspec.server.output_text import ResponseText
from selfspec.server.request_plan import RequestPlan, RequestPlanner
from selfspec.server.responses import ChunkWriter, build_usage, chat_completion, finish_reason, text_completion
from selfspec.server.schemas import ChatCompletionRequest, CompletionRequest
from selfspec.server.session import ClientDisconnected, RequestSession, RequestTimedOut, progress_tokens

log = logging.getLogger("selfspec.server")

_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/health", "/metrics")
_OPEN_PATHS = frozenset({"/health"})  # the only route served without the API key (load balancers probe it)
_JSON_TYPES = ("application/json",)


class _BodyAbandoned(Exception):
    """The client hung up before its request body arrived: nothing to answer, nothing to log at length."""


class ServerState:
    """What the routes share: the engine loop, the planner, metrics and settings."""

    def __init__(self, llm: ServingBackend | Any, config: ServerConfig) -> None:
        backend = as_backend(llm)
        if backend.tokenizer is None:
            raise ValueError("the server needs a model with a tokenizer")
        self.backend = backend
        self.config = config
        self.metrics = ServerMetrics(config.served_model_names[0])
        self.engine_loop = EngineLoop(
            backend,
            max_queue=config.max_queue,
            hooks=LoopHooks(on_stats=self.metrics.on_stats, on_aborted=self.metrics.on_aborted),
        )
        self.planner = RequestPlanner(backend, config.defaults, config.request_timeout_s)
        self.grammar_compiles = GrammarCompiles(backend, config.grammar_compile_timeout_s)
        self.created = int(time.time())
        self._latency_ema: float | None = None
        fmt = backend.thinking_format
        self.start_marker = fmt.start_marker if fmt is not None else ""
        self.end_marker = fmt.end_marker if fmt is not None else ""

    # ------------------------------------------------------------------ checks
    def authorize(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(
                401,
                "missing or invalid API key (send Authorization: Bearer <key>)",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def check_content_type(self, request: Request) -> None:
        """POST bodies must say they are JSON. A browser page may send "simple" cross-site POSTs
        (form or text/plain bodies) to a local server without a preflight; refusing every other
        content type keeps such pages from driving an unauthenticated server."""
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type not in _JSON_TYPES:
            raise APIError(
                415,
                f"the body must be JSON: send Content-Type: application/json (got {media_type or 'none'!r})",
                code="unsupported_media_type",
            )

    def check_model(self, name: str) -> str:
        if name not in self.config.served_model_names:
            raise APIError(
                404,
                f"the model {name!r} does not exist; this server serves {self.config.served_model_names}",
                param="model",
                code="model_not_found",
            )
        return name

    async def read_body(self, request: Request, model_cls: type):
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"the body exceeds {limit} bytes", code="body_too_large")
        self.check_content_type(request)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.config.body_timeout_s):  # a stalled body must not hold the socket
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise APIError(413, f"the body exceeds {limit} bytes", code="body_too_large")
                    chunks.append(chunk)
        except ClientDisconnect:
            raise _BodyAbandoned() from None
        except TimeoutError:
            raise APIError(  # the unread rest of the body makes the connection unusable: close it now
                408,
                f"the request body did not arrive within {self.config.body_timeout_s:g} s",
                code="timeout",
                headers={"Connection": "close"},
            ) from None
        raw = b"".join(chunks)
        if not raw.strip():
            raise APIError(400, "the body is empty; send a JSON object", code="invalid_json")
        try:
            return model_cls.model_validate_json(raw, strict=True)
        except ValidationError as exc:
            raise from_validation_error(exc) from None

    def retry_after_s(self) -> int:
        """A hint for 429s: about one recent request's latency, at least a second."""
        return max(1, math.ceil(self._latency_ema or 1.0))

    def record_latency(self, seconds: float) -> None:
        self._latency_ema = seconds if self._latency_ema is None else 0.9 * self._latency_ema + 0.1 * seconds

    # ------------------------------------------------------------------ generation
    async def generate(
        self, request: Request, body: ChatCompletionRequest | CompletionRequest, *, chat: bool
    ) -> Response:
        started = time.perf_counter()
        model = self.check_model(body.model)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        planner = self.planner.plan_chat if chat else self.planner.plan_completion
        try:
            plan, session, accepted = await self.start_request(request, request_id, planner, body, started)
        except ClientDisconnected:
            return Response(status_code=499)
        choices = [self._choice_output(plan, accepted.thinking, chat) for _ in range(plan.params.n)]
        created = int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            writer = ChunkWriter(request_id, created, model, chat=chat, include_usage=include_usage)
            stream = self._stream(session, choices, writer, accepted.prompt_tokens, plan, started)
            return _SessionStream(
                stream,
                session,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Request-Id": request_id},
            )
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
        usage = build_usage(finished, accepted.prompt_tokens, plan.mode)
        bodies = []
        for choice, result in zip(choices, finished.choices):
            choice.update(result.output_ids, result.answer_start, result.logprobs or (), finished=True)
            reason = choice.finish_reason(finish_reason(result))
            logprobs = self._logprobs(chat, choice.logprobs) if plan.params.logprobs is not None else None
            if chat:
                bodies.append(
                    {"index": result.index, "message": choice.message(), "logprobs": logprobs, "finish_reason": reason}
                )
            else:
                bodies.append(
                    {"index": result.index, "text": choice.content, "logprobs": logprobs, "finish_reason": reason}
                )
        self._record(plan, bodies[0]["finish_reason"], usage, started)
        build = chat_completion if chat else text_completion
        payload = build(request_id, created, model, choices=bodies, usage=usage)
        return JSONResponse(payload, headers={"X-Request-Id": request_id})

    async def start_request(
        self, request: Request, request_id: str, planner: Any, body: Any, started: float
    ) -> tuple[RequestPlan, RequestSession, Accepted]:
        """Plan `body` (in a worker thread), submit it and wait until the engine takes it; shared
        by every generating route. Raises `ClientDisconnected` (the request already cancelled)."""
        plan: RequestPlan = await run_in_threadpool(planner, body)
        try:  # off the engine loop and this thread, bounded in time (grammar_compile)
            await self.grammar_compiles.resolve(plan.rules, request, started + plan.timeout_s)
        except ClientLeft:
            raise ClientDisconnected() from None
        session = RequestSession(request, request_id, plan, self.engine_loop, started)
        try:
            session.submit(self.retry_after_s())
        except APIError as exc:
            if exc.status == 429:
                self.metrics.rejected.inc()
            raise
        try:
            accepted = await session.accepted()
        except RequestTimedOut:
            session.close("timeout")
            raise APIError(408, f"the request did not start within {plan.timeout_s:g} s", code="timeout") from None
        except ClientDisconnected:
            session.close("client disconnected")
            raise
        except BaseException:
            session.close("error")
            raise
        return plan, session, accepted

    def _choice_output(self, plan: RequestPlan, thinking: bool, chat: bool) -> ChoiceOutput:
        text = ResponseText(
            self.backend.tokenizer,
            thinking=thinking,
            split_reasoning=chat,
            start_marker=self.start_marker,
            end_marker=self.end_marker,
            stops=plan.params.stop,
        )
        return ChoiceOutput(text, plan.rules.tool_family if chat else None)

    def _logprobs(self, chat: bool, entries: list) -> dict[str, Any]:
        if chat:
            return chat_logprobs(self.backend.tokenizer, entries)
        return completion_logprobs(self.backend.tokenizer, entries)

    async def _stream(
        self,
        session: RequestSession,
        choices: list[ChoiceOutput],
        writer: ChunkWriter,
        prompt_tokens: int,
        plan: RequestPlan,
        started: float,
    ) -> AsyncIterator[str]:
        reason_to_abort = "client disconnected"
        want_logprobs = plan.params.logprobs is not None
        try:
            opening = writer.start(len(choices))
            if opening:
                yield opening
            async for batch in session.updates():
                progress, terminal = progress_tokens(batch)
                if isinstance(terminal, Failed):
                    yield writer.error(APIError(500, terminal.message, code="internal_error").body())
                    yield writer.done()
                    return
                finals = {result.index: result for result in terminal.choices} if terminal is not None else {}
                for index, choice in enumerate(choices):
                    got = progress.get(index)
                    final = finals.get(index)
                    if got is None and final is None:
                        continue
                    start = final.answer_start if final is not None else got.answer_start
                    delta = choice.update(
                        got.new_ids if got is not None else (),
                        start,
                        got.logprobs if got is not None else (),
                        final_ids=final.output_ids if final is not None else None,
                        finished=final is not None,
                    )
                    if final is not None and final.output_ids != choice.output_ids:
                        log.warning("request %s: final output differs from the streamed tokens", session.request_id)
                    if delta:
                        logprobs = (
                            self._logprobs(writer.chat, delta.logprobs) if want_logprobs and delta.logprobs else None
                        )
                        yield writer.delta(
                            index,
                            reasoning=delta.reasoning,
                            content=delta.content,
                            tool_calls=delta.tool_calls or None,
                            logprobs=logprobs,
                        )
                if terminal is not None:
                    usage = build_usage(terminal, prompt_tokens, plan.mode)
                    reasons = [c.finish_reason(finish_reason(r)) for c, r in zip(choices, terminal.choices)]
                    self._record(plan, reasons[0], usage, started)
                    yield writer.finish(reasons, usage)
                    yield writer.done()
                    return
        except RequestTimedOut:
            reason_to_abort = "timeout"
            body = APIError(408, f"the request did not finish within {plan.timeout_s:g} s", code="timeout").body()
            yield writer.error(body)
            yield writer.done()
        except ClientDisconnected:
            reason_to_abort = "client disconnected"
        finally:
            session.close(reason_to_abort)

    def _record(self, plan: RequestPlan, reason: str, usage: dict[str, Any], started: float) -> None:
        latency = time.perf_counter() - started
        self.record_latency(latency)
        self.metrics.on_finished(mode=plan.mode, finish_reason=reason, usage=usage, latency_s=latency)


class _SessionStream(StreamingResponse):
    """An SSE response that cancels its request however the response ends.

    The stream's own `finally` aborts the request when the client goes away mid-stream;
    this also covers a client gone before the first chunk, when Starlette cancels the
    response without ever starting the body iterator.
    """

    def __init__(self, content: AsyncIterator[str], session: RequestSession, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._session = session

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._session.close("client disconnected")


class _StatusRecorder:
    """Pure ASGI middleware counting responses by endpoint and status code.

    (Starlette's BaseHTTPMiddleware would wrap streaming responses and interfere with
    disconnect detection, which is how aborted streams free their slots.)
    """

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in _ENDPOINTS else "other"

        async def send_and_count(message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint=endpoint, code=str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, send_and_count)


class _ApiKeyGuard:
    """With an API key set, every route but `/health` needs it — the OpenAPI schema and `/docs`
    too, which describe the server to whoever can reach it."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.state.config.api_key is not None and scope["path"] not in _OPEN_PATHS:
            try:
                self.state.authorize(Request(scope))
            except APIError as error:
                await _error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def create_app(llm: ServingBackend | Any, config: ServerConfig | None = None) -> FastAPI:
    """An app serving `llm` (an `LLM` or a backend). The engine loop starts and stops with the
    app's lifespan."""
    config = config or ServerConfig(served_model_names=[as_backend(llm).model_name])
    state = ServerState(llm, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine_loop.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.engine_loop.stop)

    app = FastAPI(title="selfspec", version="0.1.0", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.selfspec = state
    app.add_middleware(_ApiKeyGuard, state=state)
    app.add_middleware(_StatusRecorder, metrics=state.metrics)

    @app.exception_handler(_BodyAbandoned)
    async def _body_abandoned(request: Request, exc: _BodyAbandoned) -> Response:
        state.metrics.body_disconnects.inc()
        log.info("client hung up before its body arrived on %s", request.url.path)
        return Response(status_code=400)  # nobody reads it; keeps the status recorder's count honest

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(APIError(400, "; ".join(str(e.get("msg")) for e in exc.errors()[:3])))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(APIError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return _error_response(APIError(500, "internal server error", code="internal_error"))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await state.read_body(request, ChatCompletionRequest)
        return await state.generate(request, body, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await state.read_body(request, CompletionRequest)
        return await state.generate(request, body, chat=False)

    def model_card(name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "selfspec",
            "max_model_len": state.backend.max_len,
        }

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        return {"object": "list", "data": [model_card(name) for name in config.served_model_names]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        return model_card(state.check_model(model_id))

    @app.get("/health")
    async def health() -> JSONResponse:
        loop = state.engine_loop
        stats = loop.stats
        body = {
            "status": "ok" if loop.alive else "unavailable",
            "model": config.served_model_names[0],
            "requests_in_flight": stats.in_flight,
            "queue_depth": stats.waiting,
            "slots_in_use": stats.slots_in_use,
            "slots_total": stats.slots_total,
        }
        return JSONResponse(body, status_code=200 if loop.alive else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    from selfspec.server.responses_api import add_responses_routes  # it builds on this module

    add_responses_routes(app, state)
    return app
