"""Decode one step ahead: launch step N+1's forward before the host has read step N's tokens.

Why: in plain greedy decoding on a GPU every step is launch, wait, read the tokens back, commit,
check stops, schedule, pack, launch. While the host does everything after "wait", the GPU sits
idle: on an H100 a Qwen3.5-4B step was 4.91 ms of which the graph replay was 4.51, and at 32
rows a Qwen3-4B step was ~1 ms longer than its replay on the H200 (`benchmarks/engine_speed`).
vLLM hides the same work by scheduling asynchronously. Here: when every row of a step is a plain
greedy decode row that will go on decoding, the runner launches the successor forward at once,
its inputs built on the device from this step's inputs (positions + 1) and this step's argmax
(the token the host is about to commit), and only then waits for this step's tokens. The next
`run` whose rows are exactly that successor's (same slots, positions and tokens) takes its
result instead of launching again, and launches the one after. The GPU never waits for the host
while decoding goes on.

Exactness: the successor is the same captured forward with the same input values that packing
the next step on the host would give, so its tokens are bit-identical. When the next step is
something else (a row finished, a request arrived, a proposal or a forced token), the successor
is dropped and the step runs as usual; the dropped forward only wrote K/V for each row's
committed token at the position after its cached length, which the next forward over that
position overwrites and which no query reads before then (keys after a query's position are
masked). That argument needs a cache indexed by position: models with linear-attention layers
(a recurrent state advanced in place) never decode ahead. A dropped successor costs one forward.

Not used while a schedule recorder is attached (`engine.schedule`): a recorded schedule replays
forwards one after another with the host time between them, which overlap would misstate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.model_runner import Chunk
    from selfspec.engine.static_forward import StaticForward, StaticForwardPool


@dataclass
class InFlight:
    """A decode forward launched and not yet read: its rows (in forward order) and where its
    tokens arrive on the host."""

    forward: "StaticForward"
    shape: tuple[int, int, int]
    slots: list[int]
    starts: list[int]
    buffer: int  # which host buffer its argmax rows are copied to
    event: torch.cuda.Event | None  # recorded after that copy (None on a CPU: already there)
    fed: list[int] | None = None  # the tokens it feeds, once the host has read them


class DecodeAhead:
    """The successor forwards of one runner's static pool (see the module doc)."""

    def __init__(self, pool: "StaticForwardPool") -> None:
        self.pool = pool
        cuda = pool.device.type == "cuda"
        rows, cols = pool.argmax_out.shape
        # Two host buffers: a successor's tokens arrive while the host reads its predecessor's.
        self.host_tokens = [torch.zeros((rows, cols), dtype=torch.long, pin_memory=cuda) for _ in range(2)]
        self.cuda = cuda
        self.pending: InFlight | None = None
        self.launched = 0  # successors launched
        self.used = 0  # successors whose tokens a step took
        self.dropped = 0  # successors the next step did not match (a forward each)

    # ------------------------------------------------------------------ matching
    def shape_for(self, chunks: list["Chunk"]) -> tuple[int, int, int] | None:
        """The static decode shape of `chunks` if they can start a run ahead: one token and
        one logit a row, in one forward (no more rows than the largest batch bucket)."""
        if any(len(c.token_ids) != 1 or c.num_logits != 1 for c in chunks):
            return None
        if len(chunks) > max(self.pool.buckets.batch):
            return None
        shape = self.pool.shape_for(chunks)
        return shape if shape is not None and shape[1] == 1 else None

    def take(self, chunks: list["Chunk"]) -> InFlight | None:
        """The pending successor if it runs exactly `chunks`; else drop it (None)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        rows = sorted(chunks, key=lambda c: c.slot)
        if (
            len(rows) == len(pending.slots)
            and [c.slot for c in rows] == pending.slots
            and [c.start for c in rows] == pending.starts
            and all(len(c.token_ids) == 1 and c.num_logits == 1 for c in rows)
            and [c.token_ids[0] for c in rows] == pending.fed
        ):
            self.used += 1
            return pending
        self.dropped += 1
        return None

    # ------------------------------------------------------------------ launching
    def launch(self, chunks: list["Chunk"], shape: tuple[int, int, int]) -> InFlight:
        """Run `chunks` (a decode step) in `shape` without waiting for its tokens."""
        rows = sorted(chunks, key=lambda c: c.slot)
        self.pool.run(rows, shape)
        forward = self.pool.forwards[shape]
        flight = InFlight(forward, shape, [c.slot for c in rows], [c.start for c in rows], 0, None)
        self._send_tokens(flight)
        return flight

    def launch_successor(self, flight: InFlight) -> None:
        """Launch the forward that feeds each row of `flight` its greedy token at the next
        position, built on the device from `flight`'s inputs and outputs; it becomes `pending`."""
        pool = self.pool
        starts = [s + 1 for s in flight.starts]
        needed = max(starts) + 1
        if needed > pool.runner.max_len:
            return
        b = flight.shape[0]
        shape = (b, 1, pool.buckets.key_bucket(needed, pool.runner.max_len))
        forward = pool.forwards.get(shape)
        if forward is None:  # building it now would capture, and capturing writes the shared outputs
            return
        n = len(flight.slots)
        packed = forward.packed
        if forward is not flight.forward:
            packed.copy_(flight.forward.packed)
        # Rows are [ids, positions, write slot, write position, read slot]; padding rows stay.
        packed[0, :n, 0].copy_(pool.argmax_out[:n, 0])
        packed[1, :n, 0].add_(1)
        packed[3, :n, 0].add_(1)
        if forward.graph is not None:
            forward.graph.replay()
        else:
            pool._body(forward)
        forward.replays += 1
        successor = InFlight(forward, shape, flight.slots, starts, 1 - flight.buffer, None)
        self._send_tokens(successor)
        self.pending = successor
        self.launched += 1

    def _send_tokens(self, flight: InFlight) -> None:
        """Queue the copy of the forward's greedy tokens to the host (rows [:B] of the shared
        output are one contiguous block) before a later forward overwrites them."""
        b = flight.shape[0]
        self.host_tokens[flight.buffer][:b].copy_(self.pool.argmax_out[:b], non_blocking=self.cuda)
        if self.cuda:
            flight.event = torch.cuda.Event()
            flight.event.record()

    def tokens(self, flight: InFlight) -> list[int]:
        """Wait for `flight`'s greedy tokens (one a row, in forward order) and note them as
        what its successor feeds."""
        if flight.event is not None:
            flight.event.synchronize()
        n = len(flight.slots)
        tokens = self.host_tokens[flight.buffer][:n, 0].tolist()
        if self.pending is not None:
            self.pending.fed = tokens
        return tokens

    def stats(self) -> dict:
        return {"launched": self.launched, "used": self.used, "dropped": self.dropped}


def may_decode_ahead(engine: "Engine", work: list[tuple], want_logits: list[bool]) -> bool:
    """Whether the step about to run (`work`: the engine's (sequence, tokens fed, proposal, mask)
    rows) will most likely be followed by the same rows decoding one position further: then the
    runner launches that step before this one's tokens are read. False where the next step will
    be something else: a row that feeds more than its pending token or reaches `max_tokens` or
    the cache end, a policy that may propose or force tokens, a grammar, logits the commit
    reads, a waiting request that a free slot would admit. A row with a policy goes ahead only
    where the policy says its next step is a plain decode (plain thinking under caps)."""
    runner = engine.runner
    if runner.ahead is None or runner.recorder is not None or not work or any(want_logits):
        return False
    scheduler = engine.scheduler
    if scheduler.num_waiting and scheduler.slots.num_free:
        return False
    for seq, fed, proposal, mask in work:
        if fed != 1 or proposal is not None or mask is not None:
            return False
        if seq.policy is not None and not seq.policy.plain_next_step(seq):
            return False
        if seq.constraint is not None or seq.num_cached + 1 != len(seq.token_ids):
            return False
        if seq.num_output_tokens + 1 >= seq.params.max_tokens or len(seq.token_ids) + 1 >= engine.max_len:
            return False
    return True
