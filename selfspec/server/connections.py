"""Connection-level timeouts uvicorn does not have: a request head must arrive in time.

uvicorn closes idle keep-alive connections after a response (`timeout_keep_alive`), but a fresh
connection that never sends a complete request head — or a kept-alive one that sends half of its
next one — is held forever: a few hundred idle sockets pin file descriptors and memory. This
protocol closes such a connection once `HEADER_TIMEOUT_S` pass without a complete head. A body
that stalls after its head is the app's to time out (`ServerConfig.body_timeout_s`).
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
TIMEOUT_KEEP_ALIVE_S = 5

log = logging.getLogger("selfspec.server")


class HeadTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head (class attribute, seconds)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    closed_for_timeout = 0  # connections closed this way (process-wide, for tests and logs)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a head has begun and is not complete yet
            if self._head_timer is None:
                self._arm_head_timer()
        else:
            self._cancel_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            type(self).closed_for_timeout += 1
            log.info("closed a connection whose request head did not arrive within %g s", self.header_timeout_s)
            self.transport.close()


def uvicorn_options() -> dict:
    """The uvicorn settings every selfspec server runs with."""
    return {"http": HeadTimeoutH11Protocol, "timeout_keep_alive": TIMEOUT_KEEP_ALIVE_S}
