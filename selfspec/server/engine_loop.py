"""The one thread that drives the engine, shared by every HTTP request.

The engine is not thread-safe and batches best when every request joins the same steps
(continuous batching), so exactly one thread owns the backend (`backend.ServingBackend`: our
`LLM`, or vLLM): it admits jobs, steps the engine, and publishes each request's progress. HTTP handlers never touch the
engine: they hand a job over through `submit` (thread-safe, bounded: a full queue raises
`QueueFullError`, which the app turns into 429) and read updates from their own
`asyncio.Queue`, filled from this thread with `loop.call_soon_threadsafe`. Cancellation
(client gone, timeout) goes the same way, through `abort`. When no request is live the
thread sleeps on a condition variable; it never spins.

Failures: the engine ends a request whose method fails (proposer, grammar, verifier, hooks) on
its own, with finish reason "error" (`selfspec.engine.isolation`); that request alone gets a
`Failed` (a 500 naming the cause, or an error event in its stream). Only an exception out of a
whole step (the batched forward) fails every live request (`_abandon_live`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from selfspec.engine.sampling import SamplingParams
from selfspec.server.backend import ServingBackend, as_backend
from selfspec.thinking.policy import ThinkingLimits

log = logging.getLogger("selfspec.server")


class QueueFullError(RuntimeError):
    """The server holds as many requests as it may; the client should retry later."""


class EngineLoopStopped(RuntimeError):
    """The engine loop is not running (shutting down, or it was never started)."""


# ---------------------------------------------------------------------- messages to handlers
@dataclass
class Accepted:
    """The engine took the request (first message of every successful request)."""

    prompt_tokens: int
    thinking: bool


@dataclass
class Progress:
    """Tokens committed to choice `index` since its last message; `answer_start` indexes its output;
    `logprobs` (when asked for) holds one entry per new token."""

    new_token_ids: list[int]
    answer_start: int | None
    index: int = 0
    logprobs: list[Any] | None = None


@dataclass
class Finished:
    """The request is done; carries the authoritative output and the library's metrics."""

    output_ids: list[int]
    answer_start: int | None
    finish_reason: str
    finish_detail: str
    metrics: dict[str, Any]
    ttft_s: float | None
    first_answer_token_s: float | None
    total_s: float
    index: int = 0
    logprobs: list[Any] | None = None
    # Choices 1..n-1 of an n > 1 request (this one is choice 0); the request ends with all of them.
    others: list["Finished"] = field(default_factory=list)

    @property
    def choices(self) -> list["Finished"]:
        return [self, *self.others]


@dataclass
class Failed:
    """The request could not run. `client_error`: the request was at fault (HTTP 400)."""

    message: str
    client_error: bool


Update = Accepted | Progress | Finished | Failed


class UpdateSink:
    """Delivers updates from the engine thread into an asyncio queue of the handler's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: "asyncio.Queue[Update]") -> None:
        self._loop = loop
        self._queue = queue

    def put(self, update: Update) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, update)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


@dataclass
class EngineJob:
    """One request, ready for the engine: token ids and the per-request options."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: UpdateSink
    spec: Any = None
    limits: ThinkingLimits | None = None
    thinking: bool | None = None
    grammar: Any = None


@dataclass
class LoopStats:
    """A snapshot the engine thread publishes after every iteration (for /metrics, 429s)."""

    waiting: int = 0  # requests waiting for a slot (engine queue + not yet admitted)
    running: int = 0  # sequences holding a slot (SSR drafts included)
    slots_in_use: int = 0
    slots_total: int = 0
    in_flight: int = 0  # requests accepted and not finished
    steps: int = 0


@dataclass
class _Live:
    samples: list[Any]  # the backend's handles of the request's samples (choice 0 first)
    sink: UpdateSink
    thinking: bool
    published: list[int] = field(default_factory=list)  # per sample, length of its token ids already sent


@dataclass
class LoopHooks:
    """Callbacks into the app's metrics; called from the engine thread."""

    on_stats: Callable[[LoopStats], None] = lambda stats: None
    on_aborted: Callable[[str], None] = lambda reason: None


class EngineLoop:
    """Owns the backend (an `LLM` is wrapped in a `LocalBackend`); steps it in one background thread."""

    def __init__(self, backend: ServingBackend | Any, *, max_queue: int, hooks: LoopHooks | None = None) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.backend = as_backend(backend)
        self.capacity = self.backend.num_slots + max_queue
        self.hooks = hooks or LoopHooks()
        self._cond = threading.Condition()
        self._inbox: deque[EngineJob] = deque()
        self._aborts: deque[tuple[str, str]] = deque()
        self._in_flight = 0  # guarded by _cond
        self._live: dict[str, _Live] = {}  # engine thread only
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.stats = LoopStats(slots_total=self.backend.num_slots)
        self.failures = 0  # loop iterations that raised (their requests got a 500)

    # ------------------------------------------------------------------ any thread
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="selfspec-engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def submit(self, job: EngineJob) -> None:
        """Queue a job; raises QueueFullError when `num_slots + max_queue` requests are held."""
        with self._cond:
            if not self.alive:
                raise EngineLoopStopped("the engine loop is not running")
            if self._in_flight >= self.capacity:
                raise QueueFullError(f"the server is at capacity ({self.capacity} requests); retry later")
            self._in_flight += 1
            self._inbox.append(job)
            self._cond.notify()

    def abort(self, request_id: str, reason: str = "client disconnected") -> None:
        """Cancel a request (its slots are freed at the engine thread's next iteration)."""
        with self._cond:
            self._aborts.append((request_id, reason))
            self._cond.notify()

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            while self._iterate():
                pass
        finally:
            self._fail_all("the server is shutting down")

    def _iterate(self) -> bool:
        """One iteration: take new jobs and aborts, step, publish. False once stopping."""
        with self._cond:
            while not (self._stopping or self._inbox or self._aborts or self.backend.has_unfinished()):
                self._cond.wait()
            if self._stopping:
                return False
            jobs = list(self._inbox)
            self._inbox.clear()
            aborts = dict(self._aborts)
            self._aborts.clear()
        try:
            for job in jobs:
                if job.request_id in aborts:  # cancelled before it reached the engine
                    self._release()
                    self.hooks.on_aborted(aborts.pop(job.request_id))
                else:
                    self._admit(job)
            self._apply_aborts(aborts)
            if self.backend.has_unfinished():
                self.backend.step()
            self._publish()
        except Exception:  # noqa: BLE001 - a failed step must not hang every client, nor stop the server
            log.exception("engine loop iteration failed; failing the live requests")
            self.failures += 1
            self._abandon_live("internal error while generating")
        return True

    def _admit(self, job: EngineJob) -> None:
        try:
            admitted = self.backend.admit(job)
        except ValueError as exc:  # PromptTooLongError, InvalidSamplingParams, bad limits
            self._release()
            job.sink.put(Failed(str(exc), client_error=True))
            return
        except Exception as exc:  # noqa: BLE001 - a server-side failure for this request only
            log.exception("could not submit request %s", job.request_id)
            self._release()
            job.sink.put(
                Failed(f"internal error while submitting the request: {type(exc).__name__}", client_error=False)
            )
            return
        samples, thinking = admitted.samples, admitted.thinking
        published = [self.backend.tokens(sample, 0).start for sample in samples]
        self._live[job.request_id] = _Live(samples, job.sink, thinking, published)
        job.sink.put(Accepted(prompt_tokens=admitted.prompt_tokens, thinking=thinking))

    def _apply_aborts(self, aborts: dict[str, str]) -> None:
        for request_id, reason in aborts.items():
            live = self._live.pop(request_id, None)
            if live is None:  # already finished (its result raced the abort)
                continue
            self.backend.abort(request_id)
            self._release()
            self.hooks.on_aborted(reason)

    def _publish(self) -> None:
        """Send each live request its new tokens; finish the finished ones.

        Stats are refreshed before results go out, so a client that reads /metrics right
        after its response sees its slot freed.
        """
        done: list[tuple[_Live, Update]] = []
        backend = self.backend
        for request_id, live in list(self._live.items()):
            finished = True
            for index, sample in enumerate(live.samples):
                sent = live.published[index]
                tokens = backend.tokens(sample, sent)
                length = len(tokens.ids)
                if length > sent:
                    answer_start = self._answer_start(live, sample)
                    live.sink.put(Progress(tokens.ids[sent:length], answer_start, index, tokens.logprobs))
                    live.published[index] = length
                finished = finished and tokens.finished
            if finished:
                try:
                    first, *others = [self._finished(live, sample, i) for i, sample in enumerate(live.samples)]
                    first.others = others
                    final: Update = _failure_of(first) or first
                except Exception:  # noqa: BLE001 - one request's failure must not stop the loop
                    log.exception("could not build the result of request %s", request_id)
                    final = Failed("internal error while finishing the request", client_error=False)
                del self._live[request_id]
                self._release()
                done.append((live, final))
        self._refresh_stats()
        for live, finished in done:
            live.sink.put(finished)

    def _answer_start(self, live: _Live, sample: Any) -> int | None:
        return self.backend.answer_start(sample) if live.thinking else None

    def _finished(self, live: _Live, sample: Any, index: int) -> Finished:
        result = self.backend.result(sample)
        timings = result.timings
        return Finished(
            index=index,
            logprobs=result.logprobs,
            output_ids=list(result.token_ids),
            answer_start=self._answer_start(live, sample),
            finish_reason=result.finish_reason,
            finish_detail=result.finish_detail,
            metrics=dict(result.metrics),
            ttft_s=timings.ttft,
            first_answer_token_s=timings.first_answer_token,
            total_s=timings.total,
        )

    def _release(self) -> None:
        with self._cond:
            self._in_flight -= 1

    def _abandon_live(self, message: str) -> None:
        """Cancel every live request in the engine (best effort) and fail it."""
        for request_id in list(self._live):
            try:
                self.backend.abort(request_id)
            except Exception:  # noqa: BLE001 - the engine may be what failed
                log.exception("could not abort request %s", request_id)
        self._fail_all(message)
        self._refresh_stats()

    def _fail_all(self, message: str) -> None:
        for request_id, live in list(self._live.items()):
            del self._live[request_id]
            self._release()
            live.sink.put(Failed(message, client_error=False))
        with self._cond:
            jobs = list(self._inbox)
            self._inbox.clear()
            self._in_flight -= len(jobs)
        for job in jobs:
            job.sink.put(Failed(message, client_error=False))

    def _refresh_stats(self) -> None:
        counts = self.backend.counts()
        with self._cond:
            queued = len(self._inbox)
            in_flight = self._in_flight
        self.stats = LoopStats(
            waiting=counts.waiting + queued,
            running=counts.running,
            slots_in_use=counts.slots_in_use,
            slots_total=counts.slots_total,
            in_flight=in_flight,
            steps=counts.steps,
        )
        self.hooks.on_stats(self.stats)


def _failure_of(finished: Finished) -> Failed | None:
    """A request whose method failed in the engine (finish reason "error": the engine ended it
    alone, `selfspec.engine.isolation`) is that request's server error, with the engine's detail
    (the stage and the exception) as its message; its neighbours in the batch are unaffected."""
    for choice in finished.choices:
        if choice.finish_reason == "error":
            return Failed(choice.finish_detail or "internal error while generating", client_error=False)
    return None
