"""Compiling a request's grammar: off the engine loop, cached, bounded in time, left when the
client leaves.

Compiling a JSON schema is not always cheap: xgrammar builds a token mask cache over the whole
vocabulary for every rule, and a schema with thousands of optional properties takes seconds to
minutes. So a request's `GrammarSpec` is built and compiled here, on a small pool of this
module's own threads, while the request handler awaits the result; the engine loop only ever
receives compiled grammars and never waits for one.

* Cached: compiles are keyed by the spec's canonical JSON, the thinking gate and the compiler
  (one per tokenizer); the LRU holds the futures, so a repeated schema compiles once and requests
  with the same schema at the same time share one compile. A schema that does not compile is
  cached as its error (refused again at once).
* Bounded: a handler waits at most `timeout_s` (the server's `--grammar-compile-timeout`) and at
  most what is left of the request's own timeout. A compile still running then is a 400 naming
  the field; one still queued behind other compiles is a 503 (busy, retry later).
* Cancelled with its request: a client that disconnects stops the wait (499, nothing sent). A
  compile that has not started is dropped once no request waits for it; one that has started
  cannot be interrupted inside xgrammar, so it runs to its end on its pool thread (its result
  is cached) while the engine and requests without a grammar go on. At most `WORKERS` compiles
  run at once, so abandoned ones cost at most that many cores.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Callable

from starlette.requests import Request

from selfspec.server.errors import APIError, clean_library_message
from selfspec.server.structured import GrammarSpec

log = logging.getLogger("selfspec.server")

WORKERS = 2  # compiles that run at once (each uses one core: the compiler runs single-threaded)
CACHE_ENTRIES = 128


class ClientLeft(Exception):
    """The client disconnected while its grammar compiled."""


class _Entry:
    """One compile: its future and how many requests wait for it."""

    def __init__(self) -> None:
        self.future: Future = Future()
        self.waiters = 0


class _DaemonPool:
    """A fixed set of daemon threads running queued calls. Not `ThreadPoolExecutor`: the
    interpreter joins its threads at exit, and an abandoned compile may run for minutes."""

    def __init__(self, workers: int) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._workers = workers
        self._started = False
        self._lock = threading.Lock()

    def submit(self, future: Future, call: Callable[[], Any]) -> None:
        with self._lock:
            if not self._started:
                for i in range(self._workers):
                    threading.Thread(target=self._run, name=f"grammar-compile-{i}", daemon=True).start()
                self._started = True
        self._queue.put((future, call))

    def _run(self) -> None:
        while True:
            future, call = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue  # every waiter left before it started
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - delivered to the waiters
                future.set_exception(exc)


class GrammarCompiles:
    """The server's grammar compiles, for one backend (its `grammars`, a `GrammarCompiler`)."""

    def __init__(self, backend: Any, timeout_s: float, *, workers: int = WORKERS) -> None:
        self.backend = backend
        self.timeout_s = timeout_s
        self._pool = _DaemonPool(workers)
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the request side
    async def resolve(self, rules: Any, request: Request | None, deadline: float) -> None:
        """Compile `rules.spec` into `rules.grammar` (a no-op without a spec). Raises `APIError`
        (400: does not compile or took too long; 503: queued too long; 408: the request's own
        deadline passed) or `ClientLeft`."""
        spec: GrammarSpec | None = rules.spec
        if spec is None or rules.grammar is not None:
            return
        grammars = self.backend.grammars
        key = (id(grammars), spec.key, bool(rules.gated))
        entry = self._enter(key, grammars, spec, bool(rules.gated))
        try:
            rules.grammar = await self._wait(entry, spec, request, deadline)
        finally:
            self._leave(key, entry)

    async def _wait(self, entry: _Entry, spec: GrammarSpec, request: Request | None, deadline: float) -> Any:
        if entry.future.done():  # cached
            return self._result(entry.future, spec)
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def wake(_: Future) -> None:
            try:
                loop.call_soon_threadsafe(done.set)
            except RuntimeError:  # the event loop closed: nobody waits any more
                pass

        entry.future.add_done_callback(wake)
        limit = min(self.timeout_s, deadline - time.perf_counter())
        waiters = [asyncio.ensure_future(done.wait())]
        if request is not None:
            waiters.append(asyncio.ensure_future(_disconnected(request)))
        try:
            finished, _ = await asyncio.wait(waiters, timeout=max(limit, 0.0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiters:
                task.cancel()
        if not done.is_set():
            if len(waiters) > 1 and waiters[1] in finished:
                raise ClientLeft()
            raise self._timed_out(entry, spec, limit)
        return self._result(entry.future, spec)

    def _timed_out(self, entry: _Entry, spec: GrammarSpec, limit: float) -> APIError:
        if limit < self.timeout_s:  # the request's own timeout came first
            return APIError(408, "the request timed out while its grammar compiled", code="timeout")
        if not entry.future.running():
            return APIError(
                503,
                f"the grammar compiler is busy with other requests; {spec.field} was not compiled within "
                f"{self.timeout_s:g} s: retry later",
                param=spec.field,
                code="grammar_compiler_busy",
                headers={"Retry-After": str(max(1, round(self.timeout_s)))},
            )
        return APIError(
            400,
            f"{spec.field} did not compile within {self.timeout_s:g} s (the server's --grammar-compile-timeout): "
            "the schema or grammar is too large; fewer properties, alternatives or nested optional fields compile "
            "faster",
            param=spec.field,
            code="grammar_too_complex",
        )

    @staticmethod
    def _result(future: Future, spec: GrammarSpec) -> Any:
        from selfspec.engine.grammar import GrammarError

        try:
            return future.result()
        except GrammarError as exc:
            log.info("%s refused: %s", spec.field, exc)
            raise APIError(400, clean_library_message(str(exc)), param=spec.field, code="invalid_grammar") from None
        except Exception as exc:  # noqa: BLE001 - a library failure on this input, not the server's
            log.warning("compiling %s failed: %r", spec.field, exc)
            message = clean_library_message(str(exc), "the grammar compiler rejected it")
            raise APIError(400, f"{spec.field} could not be compiled: {message}", param=spec.field) from None

    # ------------------------------------------------------------------ the cache
    def _enter(self, key: tuple, grammars: Any, spec: GrammarSpec, gated: bool) -> _Entry:
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None and not entry.future.cancelled():
                self._cache.move_to_end(key)
                entry.waiters += 1
                return entry
            entry = _Entry()
            entry.waiters = 1
            self._cache[key] = entry
            self._evict()
        self._pool.submit(entry.future, lambda: grammars.compile(spec.build(grammars), gated=gated))
        return entry

    def _leave(self, key: tuple, entry: _Entry) -> None:
        with self._lock:
            entry.waiters -= 1
            if entry.waiters == 0 and entry.future.cancel():  # still queued and nobody waits: drop it
                if self._cache.get(key) is entry:
                    del self._cache[key]

    def _evict(self) -> None:
        """Drop the least recently used finished compiles beyond `CACHE_ENTRIES` (running or
        queued ones stay: requests wait for them)."""
        excess = len(self._cache) - CACHE_ENTRIES
        for key in [k for k, e in self._cache.items() if e.future.done()][: max(excess, 0)]:
            del self._cache[key]

    def __len__(self) -> int:
        return len(self._cache)


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (its body was read already: only `http.disconnect`
    can arrive)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
