"""One HTTP request's life on the engine: submit, wait for updates, cancel when abandoned.

The handler side of the engine loop. A `RequestSession` owns the request's
`asyncio.Queue`; a watcher task puts a `ClientGone` marker into the same queue when the
client disconnects, so a single `await queue.get()` (bounded by the request's deadline)
wakes the handler for tokens, completion, disconnect or timeout alike. Leaving the
session without a finished result (disconnect, timeout, a cancelled stream) aborts the
request in the engine, which frees its slots at the loop's next iteration.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from starlette.requests import Request

from selfspec.server.engine_loop import (
    Accepted,
    EngineJob,
    EngineLoop,
    EngineLoopStopped,
    Failed,
    Finished,
    Progress,
    QueueFullError,
    Update,
    UpdateSink,
)
from selfspec.server.errors import APIError
from selfspec.server.request_plan import RequestPlan


class ClientGone:
    """Marker put into the update queue when the client disconnects."""


class RequestTimedOut(Exception):
    pass


class ClientDisconnected(Exception):
    pass


class RequestSession:
    def __init__(
        self, request: Request, request_id: str, plan: RequestPlan, engine_loop: EngineLoop, started: float
    ) -> None:
        self.request = request
        self.request_id = request_id
        self.plan = plan
        self.engine_loop = engine_loop
        self.deadline = started + plan.timeout_s
        self.queue: asyncio.Queue[Update | ClientGone] = asyncio.Queue()
        self._watcher: asyncio.Task | None = None
        self._settled = False  # finished, failed or already aborted: nothing to cancel

    # ------------------------------------------------------------------ lifecycle
    def submit(self, retry_after_s: int) -> None:
        loop = asyncio.get_running_loop()
        plan = self.plan
        job = EngineJob(
            request_id=self.request_id,
            prompt_ids=plan.prompt_ids,
            params=plan.params,
            sink=UpdateSink(loop, self.queue),
            spec=plan.spec,
            limits=plan.limits,
            thinking=plan.thinking,
            grammar=plan.grammar,
        )
        try:
            self.engine_loop.submit(job)
        except QueueFullError as exc:
            self._settled = True
            raise APIError(429, str(exc), code="queue_full", headers={"Retry-After": str(retry_after_s)}) from None
        except EngineLoopStopped as exc:
            self._settled = True
            raise APIError(503, str(exc), code="engine_unavailable") from None
        self._watcher = asyncio.create_task(self._watch_disconnect())

    async def _watch_disconnect(self) -> None:
        while True:
            message = await self.request.receive()
            if message["type"] == "http.disconnect":
                self.queue.put_nowait(ClientGone())
                return

    def close(self, reason: str) -> None:
        """Stop watching; abort the request in the engine unless it already ended."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        if not self._settled:
            self._settled = True
            self.engine_loop.abort(self.request_id, reason)

    # ------------------------------------------------------------------ updates
    async def next(self) -> Update:
        """The next engine update; raises on disconnect or when the deadline passes."""
        remaining = self.deadline - time.perf_counter()
        if remaining <= 0:
            raise RequestTimedOut()
        try:
            update = await asyncio.wait_for(self.queue.get(), remaining)
        except asyncio.TimeoutError:
            raise RequestTimedOut() from None
        return self._check(update)

    def drain(self) -> list[Update]:
        """Updates already queued (so a stream sends one chunk per batch of steps)."""
        out: list[Update] = []
        while not self.queue.empty():
            out.append(self._check(self.queue.get_nowait()))
            if isinstance(out[-1], (Finished, Failed)):
                break
        return out

    def _check(self, update: Update | ClientGone) -> Update:
        if isinstance(update, ClientGone):
            raise ClientDisconnected()
        if isinstance(update, (Finished, Failed)):
            self._settled = True
        return update

    async def accepted(self) -> Accepted:
        """Wait for the engine to take the request; its refusal becomes an HTTP error."""
        update = await self.next()
        if isinstance(update, Failed):
            raise _failure(update)
        if not isinstance(update, Accepted):  # pragma: no cover - protocol violation
            raise APIError(500, f"unexpected engine message {type(update).__name__}")
        return update

    async def finished(self) -> Finished:
        """Wait for the final result, skipping progress (non-streaming responses)."""
        while True:
            update = await self.next()
            if isinstance(update, Finished):
                return update
            if isinstance(update, Failed):
                raise _failure(update)

    async def updates(self) -> AsyncIterator[list[Update]]:
        """Batches of updates until (and including) Finished or Failed."""
        while True:
            batch = [await self.next()]
            if not isinstance(batch[0], (Finished, Failed)):
                batch.extend(self.drain())
            yield batch
            if isinstance(batch[-1], (Finished, Failed)):
                return


def _failure(update: Failed) -> APIError:
    if update.client_error:
        return APIError(400, update.message, param=_param_of(update.message))
    return APIError(500, update.message, code="internal_error")


def _param_of(message: str) -> str | None:
    """The field a library error names ("invalid sampling parameter top_p=..."), if any."""
    if "sampling parameter " in message:
        return message.split("sampling parameter ", 1)[1].split("=", 1)[0]
    return None


@dataclass
class ChoiceProgress:
    """What one batch of updates brought one choice: new token ids (and their logprobs), the
    latest answer start."""

    new_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    answer_start: int | None = None


def progress_tokens(batch: list[Update]) -> tuple[dict[int, ChoiceProgress], Finished | Failed | None]:
    """Per choice index, what the batch added; and the batch's terminal update."""
    choices: dict[int, ChoiceProgress] = {}
    terminal: Any = None
    for update in batch:
        if isinstance(update, Progress):
            choice = choices.setdefault(update.index, ChoiceProgress())
            choice.new_ids.extend(update.new_token_ids)
            if update.logprobs is not None:
                choice.logprobs.extend(update.logprobs)
            if update.answer_start is not None:
                choice.answer_start = update.answer_start
        elif isinstance(update, (Finished, Failed)):
            terminal = update
    return choices, terminal
