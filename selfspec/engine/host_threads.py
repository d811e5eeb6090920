"""How many CPU threads torch's own host-side ops use while a GPU does the model's work.

Why: a GPU engine's host work is a stream of small tensor ops (token ids, positions, the
arbitrator's inputs) between kernel launches. torch runs CPU ops on its intra-op thread
pool (one thread per core by default), and a parallel region finishes only when every
worker has run: when other processes keep the cores busy (two queues on one machine, a
scorer subprocess), each region waits for descheduled workers. Measured here, a
CoSpec arbitration state built on the host (~20 ops on [576, 576] tensors) took 1.4 ms on
one thread and 112 ms on two threads beside one busy process; on the H200 machine each
arbitration cost ~130 ms and the GPU sat at 1%. One thread is the default
on a GPU; `SELFSPEC_HOST_THREADS=N` sets N, `SELFSPEC_HOST_THREADS=keep` leaves torch's
setting alone. CPU inference keeps every thread: there the model itself runs on them.
"""

from __future__ import annotations

import logging
import os

import torch

ENV = "SELFSPEC_HOST_THREADS"
log = logging.getLogger(__name__)


def host_threads_for(device: torch.device) -> int | None:
    """The intra-op thread count to use for an engine on `device`; None = leave it.

    Raises ValueError for a malformed `SELFSPEC_HOST_THREADS`.
    """
    raw = os.environ.get(ENV, "").strip().lower()
    if raw == "keep":
        return None
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{ENV} must be a positive integer or 'keep', got {raw!r}") from None
        if value < 1:
            raise ValueError(f"{ENV} must be a positive integer or 'keep', got {raw!r}")
        return value
    return 1 if device.type == "cuda" else None


def limit_host_threads(device: torch.device) -> int:
    """Apply `host_threads_for(device)` (never raising the count on a GPU unless told);
    returns torch's intra-op thread count afterwards."""
    wanted = host_threads_for(device)
    if wanted is not None and wanted != torch.get_num_threads():
        if os.environ.get(ENV) or wanted < torch.get_num_threads():
            log.info("selfspec: torch host threads %d -> %d (%s)", torch.get_num_threads(), wanted, ENV)
            torch.set_num_threads(wanted)
    return torch.get_num_threads()


__all__ = ["ENV", "host_threads_for", "limit_host_threads"]
