"""Forward schedules: the forwards one run made and the cache operations between them.

Why: a step's time depends on the forward's shape (rows, tokens per row, key length) and the
model's size, never on the weights' values or the token ids. A schedule recorded on a small
model (which decided every token) can therefore be replayed through the engine's runner on a
random-weight model of another size, giving that size's forward times for exactly the same
decisions (`selfspec_bench.replay`). The time between forwards is the engine's Python (propose,
commit, policies), which does not depend on the hidden size, and is kept as one measured sum.

What is kept, per `ModelRunner.run`: each row's slot, start position, tokens fed (a count; the
ids only with `keep_tokens`, for tests that compare caches), how many logits it asked for and
whether they were copied out; between forwards the slot copies (forks, siblings), rollbacks of
a slot's cached length (rejected proposals, truncations: `runner.settle`) and slot frees. Forwards
of another runner (a draft model's, CoSpec's arbitrator) are not forwards of this schedule: their
time is host time here.

Recording appends a reference to each forward's chunks and a tuple per cache operation (no
device sync, no copies, nothing encoded until `finish`: well under a microsecond per forward);
with no recorder attached the runner pays one attribute test per call.

Encoding (version 1), a JSON object:
  {"v": 1, "slots": S, "max_len": L, "static": bool, "buckets": [..] | null, "want": 0 | 1,
   "forwards": N, "tokens": fed tokens, "gpu_s": forward time, "host_s": the rest,
   "ops": [entry, ...], "ids": [[[token ids per row] per forward]] (only with keep_tokens),
   "stalls": [[forward index, ms], ...] (only where some gap before a forward exceeded STALL_SECONDS)}
An entry is a forward group `[k, rows]` (k identical forwards in a row) or an operation:
`["c", src, dst, length]` (slot copy), `["t", slot, delta]` (cached length set to the slot's
length + delta, delta < 0), `["f", slot]` (slot freed). A row is `[slot, dstart, n]` or
`[slot, dstart, n, m]`: its start is the slot's length (the end of its last forward, a copy's
length, or a rollback's position; 0 for a slot never seen) + dstart, so a decode or verify row
whose tokens follow the slot's cache has dstart 0 and repeats identically. The 3-element form
asks logits for all n tokens with the schedule's default copy flag `want`; otherwise |m| logits,
copied when m > 0 (m < 0: the other copy flag, m = 0: no logits).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from selfspec.engine.model_runner import Chunk, ModelRunner

SCHEDULE_VERSION = 1

STALL_SECONDS = 0.005
"""A gap between two forwards longer than this is kept one by one (`Schedule.stalls`): a step's host
work is ~0.05-0.2 ms on a GPU, so a gap of milliseconds is an event (a collection, a capture, a slow
proposer) that one host sum per request hides."""
MAX_STALLS = 32
"""Stalls kept per schedule: the longest ones."""


class ScheduleError(ValueError):
    """A schedule that cannot be decoded (unknown version, malformed entry)."""


@dataclass(frozen=True)
class Row:
    """One chunk of a forward: what a sequence fed."""

    slot: int
    start: int
    tokens: int
    logits: int
    want: bool = False  # logits copied out (sampling, logprobs) or only the greedy tokens used


@dataclass(frozen=True)
class Forward:
    rows: tuple[Row, ...]
    token_ids: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class SlotCopy:
    src: int
    dst: int
    length: int


@dataclass(frozen=True)
class Rollback:
    """The slot's cached length went back to `position` (`runner.settle`)."""

    slot: int
    position: int


@dataclass(frozen=True)
class Free:
    slot: int


Event = Union[Forward, SlotCopy, Rollback, Free]


@dataclass
class Schedule:
    events: list[Event]
    num_slots: int
    max_len: int
    static: bool = False
    buckets: list[int] | None = None  # static forwards' token buckets
    gpu_s: float = 0.0  # time inside the runner's forwards (ends with the greedy tokens' host copy)
    host_s: float = 0.0  # everything else between attach and finish
    stalls: list[tuple[int, float]] = field(default_factory=list)  # (forward index, seconds of the gap before it)

    @property
    def forwards(self) -> list[Forward]:
        return [e for e in self.events if isinstance(e, Forward)]

    def fed_tokens(self) -> int:
        return sum(r.tokens for f in self.forwards for r in f.rows)


class ScheduleRecorder:
    """Collects one runner's schedule: `attach(runner)`, run, `finish()`.

    The runner calls `forward`, `copy`, `settle` and `free` at its seams (`ModelRunner.run`,
    `copy_slot`, `settle`, `release_slot`), which every engine cache operation goes through.
    """

    def __init__(self, *, keep_tokens: bool = False, clock=time.perf_counter) -> None:
        self.keep_tokens = keep_tokens
        self.clock = clock
        self._raw: list[tuple] = []
        self.gpu_s = 0.0
        self.runner: ModelRunner | None = None
        self._began = 0.0
        self._last_end = 0.0
        self._forwards = 0
        self._stalls: list[tuple[int, float]] = []

    def attach(self, runner: ModelRunner) -> ScheduleRecorder:
        if runner.recorder is not None:
            raise RuntimeError("the runner already has a schedule recorder attached")
        self.runner = runner
        runner.recorder = self
        self._began = self._last_end = self.clock()
        return self

    # ------------------------------------------------------------------ runner seams
    def forward(self, chunks: list[Chunk], want_logits: list[bool] | None, started: float, ended: float) -> None:
        # References only (the engine builds new chunks every step); read in `finish`.
        self.gpu_s += ended - started
        self._raw.append(("F", chunks, want_logits))
        if started - self._last_end > STALL_SECONDS:
            self._stalls.append((self._forwards, started - self._last_end))
        self._last_end = ended
        self._forwards += 1

    def copy(self, src: int, dst: int, length: int) -> None:
        self._raw.append(("c", src, dst, length))

    def settle(self, slot: int, position: int) -> None:
        self._raw.append(("t", slot, position))

    def free(self, slot: int) -> None:
        self._raw.append(("f", slot))

    # ------------------------------------------------------------------ result
    def finish(self) -> Schedule:
        """Detach from the runner and return the schedule (settles that moved nothing dropped)."""
        total = self.clock() - self._began
        runner = self.runner
        if runner is None:
            raise RuntimeError("finish() before attach()")
        runner.recorder = None
        self.runner = None
        events: list[Event] = []
        lengths: dict[int, int] = {}
        for item in self._raw:
            kind = item[0]
            if kind == "F":
                _, chunks, want = item
                rows = tuple(
                    Row(c.slot, c.start, len(c.token_ids), c.num_logits, c.num_logits > 0 and (want is None or want[i]))
                    for i, c in enumerate(chunks)
                )
                for r in rows:
                    lengths[r.slot] = r.start + r.tokens
                ids = tuple(tuple(c.token_ids) for c in chunks) if self.keep_tokens else None
                events.append(Forward(rows, ids))
            elif kind == "c":
                _, src, dst, length = item
                lengths[dst] = length
                events.append(SlotCopy(src, dst, length))
            elif kind == "t":
                _, slot, position = item
                if position < lengths.get(slot, 0):  # a settle at the slot's length changes nothing
                    lengths[slot] = position
                    events.append(Rollback(slot, position))
            else:
                lengths.pop(item[1], None)
                events.append(Free(item[1]))
        static = runner.static
        return Schedule(
            events=events,
            num_slots=runner.num_slots,
            max_len=runner.max_len,
            static=static is not None,
            buckets=list(static.buckets.tokens) if static is not None else None,
            gpu_s=self.gpu_s,
            host_s=max(0.0, total - self.gpu_s),
            stalls=sorted(sorted(self._stalls, key=lambda s: -s[1])[:MAX_STALLS]),
        )


# ---------------------------------------------------------------------- codec
def encode(schedule: Schedule) -> dict[str, Any]:
    """The schedule as a compact JSON object (version 1, described in the module docstring)."""
    forwards = schedule.forwards
    with_logits = [r.want for f in forwards for r in f.rows if r.logits > 0]
    default_want = bool(with_logits) and 2 * sum(with_logits) > len(with_logits)
    lengths: dict[int, int] = {}
    ops: list[list] = []
    previous_rows: list | None = None
    for event in schedule.events:
        if isinstance(event, Forward):
            rows = []
            for r in event.rows:
                row = [r.slot, r.start - lengths.get(r.slot, 0), r.tokens]
                if r.logits != r.tokens or (r.logits > 0 and r.want != default_want):
                    row.append(0 if r.logits == 0 else (r.logits if r.want == default_want else -r.logits))
                rows.append(row)
            for r in event.rows:
                lengths[r.slot] = r.start + r.tokens
            if previous_rows is not None and ops and rows == previous_rows:
                ops[-1][0] += 1
            else:
                ops.append([1, rows])
                previous_rows = rows
            continue
        previous_rows = None
        if isinstance(event, SlotCopy):
            ops.append(["c", event.src, event.dst, event.length])
            lengths[event.dst] = event.length
        elif isinstance(event, Rollback):
            ops.append(["t", event.slot, event.position - lengths.get(event.slot, 0)])
            lengths[event.slot] = event.position
        else:
            ops.append(["f", event.slot])
            lengths.pop(event.slot, None)
    out: dict[str, Any] = {
        "v": SCHEDULE_VERSION,
        "slots": schedule.num_slots,
        "max_len": schedule.max_len,
        "static": schedule.static,
        "buckets": schedule.buckets,
        "want": int(default_want),
        "forwards": len(forwards),
        "tokens": schedule.fed_tokens(),
        "gpu_s": round(schedule.gpu_s, 6),
        "host_s": round(schedule.host_s, 6),
        "ops": ops,
    }
    if schedule.stalls:
        out["stalls"] = [[index, round(1000 * seconds, 3)] for index, seconds in schedule.stalls]
    if forwards and all(f.token_ids is not None for f in forwards):
        out["ids"] = [[list(ids) for ids in f.token_ids] for f in forwards]
    return out


def decode(data: dict[str, Any]) -> Schedule:
    """A schedule from `encode`'s object; ScheduleError for another version or a bad entry."""
    if not isinstance(data, dict) or data.get("v") != SCHEDULE_VERSION:
        version = data.get("v") if isinstance(data, dict) else type(data).__name__
        raise ScheduleError(f"schedule version {version!r} is not supported (this reader: {SCHEDULE_VERSION})")
    try:
        default_want = bool(data["want"])
        ids = data.get("ids")
        lengths: dict[int, int] = {}
        events: list[Event] = []
        count = 0  # forwards so far (the index into `ids`)
        for entry in data["ops"]:
            head = entry[0]
            if head == "c":
                _, src, dst, length = entry
                events.append(SlotCopy(int(src), int(dst), int(length)))
                lengths[dst] = length
            elif head == "t":
                _, slot, delta = entry
                position = lengths.get(slot, 0) + delta
                events.append(Rollback(int(slot), int(position)))
                lengths[slot] = position
            elif head == "f":
                events.append(Free(int(entry[1])))
                lengths.pop(entry[1], None)
            elif isinstance(head, int) and not isinstance(head, bool) and head >= 1:
                for _ in range(head):
                    rows = tuple(_decode_row(row, lengths, default_want) for row in entry[1])
                    for r in rows:
                        lengths[r.slot] = r.start + r.tokens
                    token_ids = None
                    if ids is not None:
                        token_ids = tuple(tuple(int(t) for t in row) for row in ids[count])
                    events.append(Forward(rows, token_ids))
                    count += 1
            else:
                raise ScheduleError(f"unknown schedule entry {entry!r}")
        return Schedule(
            events=events,
            num_slots=int(data["slots"]),
            max_len=int(data["max_len"]),
            static=bool(data.get("static", False)),
            buckets=data.get("buckets"),
            gpu_s=float(data.get("gpu_s", 0.0)),
            host_s=float(data.get("host_s", 0.0)),
            stalls=[(int(index), float(ms) / 1000) for index, ms in data.get("stalls", [])],
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        if isinstance(exc, ScheduleError):
            raise
        raise ScheduleError(f"malformed schedule: {type(exc).__name__}: {exc}") from None


def _decode_row(row: list, lengths: dict[int, int], default_want: bool) -> Row:
    slot, dstart, n = int(row[0]), int(row[1]), int(row[2])
    if n < 1:
        raise ScheduleError(f"a row feeds no token: {row!r}")
    if len(row) == 3:
        logits, want = n, default_want
    else:
        m = int(row[3])
        logits, want = abs(m), m != 0 and (default_want if m > 0 else not default_want)
    return Row(slot, lengths.get(slot, 0) + dstart, n, logits, want)
