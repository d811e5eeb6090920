"""Decode one step ahead: launch step N+1's forward before the host has read step N's tokens.

Why: in plain greedy decoding on a GPU every step is launch, wait, read the tokens back, commit,
check stops, schedule, pack, launch. While the host does everything after "wait", the GPU sits
idle: on an H100 a Qwen3.5-4B step was 4.91 ms of which the graph replay was 4.51, and at 32
rows a Qwen3-4B step was ~1 ms longer than its replay on the H200 (`benchmarks/engine_speed`).
vLLM hides the same work by scheduling asynchronously. Here: when every row of a step is a plain
greedy decode row that will go on decoding, the runner launches the successor forward at once,
its inputs built on the device from this step's inputs (positions + 1) and this step's argmax
(the token the host is about to commit), and only then waits for this step's tokens. The next
`run` takes the successor's result for each of its rows that the successor ran exactly (same
slot, position and token) and launches the one after for those rows. The GPU never waits for
the host while decoding goes on.

Exactness: the successor is the same captured forward with the same input values that packing
the next step on the host would give, so its tokens are bit-identical. A row that finished (end
of text, a stop, an abort) is simply not taken: the successor wrote K/V (and, on a model with
linear-attention layers, a recurrent and conv state) into a slot that is free now, and a request
admitted there later starts at position 0, where the state is read as zero and every K/V row is
written before a query reads it. Rows the successor did not run (a request admitted this step)
run in a forward of their own in the same step. A row the successor ran with another token or
position than the step feeds: on a cache indexed by position the step's forward overwrites the
K/V it wrote, which no query read; a linear-attention state, advanced in place, cannot be put
back, so there it is an error (`may_decode_ahead` only launches successors whose rows cannot
change that way: plain greedy rows, policies that say their next step is a plain decode).

Not used while a schedule recorder is attached (`engine.schedule`): a recorded schedule replays
forwards one after another with the host time between them, which overlap would misstate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from selfspec.engine.static_forward import padding_rows

if TYPE_CHECKING:  # pragma: no cover
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.model_runner import Chunk
    from selfspec.engine.static_forward import StaticForward, StaticForwardPool  # noqa: F401


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
    # A successor's row i continues its predecessor's row source_rows[i] (None: row i, every row).
    source_rows: list[int] | None = None


class DecodeAhead:
    """The successor forwards of one runner's static pool (see the module doc)."""

    def __init__(self, pool: "StaticForwardPool", stateful: bool = False) -> None:
        self.pool = pool
        self.stateful = stateful  # linear-attention layers: a successor's rows advanced their state
        cuda = pool.device.type == "cuda"
        rows, cols = pool.argmax_out.shape
        # Two host buffers: a successor's tokens arrive while the host reads its predecessor's.
        self.host_tokens = [torch.zeros((rows, cols), dtype=torch.long, pin_memory=cuda) for _ in range(2)]
        self.cuda = cuda
        self.pending: InFlight | None = None
        self.launched = 0  # successors launched
        self.used = 0  # successors whose tokens a step took
        self.dropped = 0  # successors the next step took no row of (a forward each)
        self.trimmed = 0  # successors taken for fewer rows than they ran (rows that had finished)
        self._padding: dict[int, torch.Tensor] = {}  # per batch bucket: a decode step of padding rows
        self._index_host: torch.Tensor | None = None  # the last narrowing's rows, alive while copied

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

    def take(self, chunks: list["Chunk"], want_logits: list[bool] | None = None) -> tuple[InFlight | None, list[int]]:
        """The pending successor and the indices of `chunks` it ran exactly (one token at the
        same slot and position, the token it fed, no logits asked), or (None, []) when it ran
        none of them. Chunks at slots it did not run are left to run as usual. A chunk it ran
        with another token or position is left to run as usual too, except on a stateful model
        (module doc), where it raises."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None, []
        where = {slot: row for row, slot in enumerate(pending.slots)}
        taken = []
        for i, c in enumerate(chunks):
            row = where.get(c.slot)
            if row is None:
                continue
            if (
                len(c.token_ids) == 1
                and c.num_logits == 1
                and c.start == pending.starts[row]
                and pending.fed is not None
                and c.token_ids[0] == pending.fed[row]
                and not (want_logits and want_logits[i])
            ):
                taken.append(i)
            elif self.stateful and c.start != 0:
                raise RuntimeError(
                    f"decode ahead: slot {c.slot} feeds {len(c.token_ids)} token(s) at position {c.start}, but its "
                    f"linear-attention state was already advanced past position {pending.starts[row]} by a forward "
                    "launched a step earlier"
                )
        if not taken:
            self.dropped += 1
            return None, []
        self.used += 1
        if len(taken) < len(pending.slots):
            self.trimmed += 1
        return pending, taken

    # ------------------------------------------------------------------ launching
    def launch(self, chunks: list["Chunk"], shape: tuple[int, int, int]) -> InFlight:
        """Run `chunks` (a decode step) in `shape` without waiting for its tokens."""
        rows = sorted(chunks, key=lambda c: c.slot)
        self.pool.run(rows, shape)
        forward = self.pool.forwards[shape]
        flight = InFlight(forward, shape, [c.slot for c in rows], [c.start for c in rows], 0, None)
        self._send_tokens(flight)
        return flight

    def launch_successor(self, flight: InFlight, slots: list[int] | None = None) -> None:
        """Launch the forward that feeds each row of `flight` (or those at `slots`, in `flight`'s
        order) its greedy token at the next position, built on the device from `flight`'s inputs
        and outputs; it becomes `pending`."""
        pool = self.pool
        if slots is None:
            rows = range(len(flight.slots))
        else:
            keep = set(slots)
            rows = [row for row, slot in enumerate(flight.slots) if slot in keep]
        if not rows:
            return
        n = len(rows)
        starts = [flight.starts[row] + 1 for row in rows]
        needed = max(starts) + 1
        if needed > pool.runner.max_len:
            return
        b = flight.shape[0] if n == len(flight.slots) else pool.buckets.batch_bucket(n)
        shape = (b, 1, pool.buckets.key_bucket(needed, pool.runner.max_len))
        forward = pool.forwards.get(shape)
        if forward is None:  # building it now would capture, and capturing writes the shared outputs
            return
        packed = forward.packed
        # Rows are [ids, positions, write slot, write position, read slot]; padding rows stay.
        if n == len(flight.slots):
            if forward is not flight.forward:
                packed.copy_(flight.forward.packed)
            packed[0, :n, 0].copy_(pool.argmax_out[:n, 0])
        else:  # the rows still decoding, gathered to the front; the rest is padding
            index = self._device_index(list(rows))
            source = flight.forward.packed.index_select(1, index)  # a copy: `packed` may be that forward's
            tokens = pool.argmax_out.index_select(0, index)[:, 0]
            packed.copy_(self._padding_rows(b))
            packed[:, :n].copy_(source)
            packed[0, :n, 0].copy_(tokens)
        packed[1, :n, 0].add_(1)
        packed[3, :n, 0].add_(1)
        if forward.graph is not None:
            forward.graph.replay()
        else:
            pool._body(forward)
        forward.replays += 1
        whole = n == len(flight.slots)
        successor = InFlight(
            forward,
            shape,
            flight.slots if whole else [flight.slots[row] for row in rows],
            starts,
            1 - flight.buffer,
            None,
        )
        successor.source_rows = None if whole else list(rows)
        self._send_tokens(successor)
        self.pending = successor
        self.launched += 1

    def _device_index(self, rows: list[int]) -> torch.Tensor:
        """`rows` on the device without waiting for it: from pinned memory, copied in stream order
        (a copy from pageable memory would wait for the forward still running). The host tensor is
        kept until the next call: by then a later forward's tokens have been read, so the copy,
        queued before that forward, has run."""
        host = torch.tensor(rows, dtype=torch.long)
        if self.cuda:
            host = host.pin_memory()
        self._index_host = host
        return host.to(self.pool.device, non_blocking=self.cuda)

    def _padding_rows(self, b: int) -> torch.Tensor:
        """A one-token step's inputs [5, b, 1] of padding rows only, on the device (kept)."""
        rows = self._padding.get(b)
        if rows is None:
            scratch = self.pool.runner.cache.scratch_slot
            rows = self._padding[b] = torch.from_numpy(padding_rows(b, 1, scratch).copy()).to(self.pool.device)
        return rows

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
        pending = self.pending
        if pending is not None:
            rows = pending.source_rows
            pending.fed = tokens if rows is None else [tokens[row] for row in rows]
        return tokens

    def stats(self) -> dict:
        return {"launched": self.launched, "used": self.used, "dropped": self.dropped, "trimmed": self.trimmed}


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
