"""Static-shape forwards: bucketed (batch, tokens, keys) shapes whose inputs live in fixed buffers.

Why: on a GPU a small model's step is launch-bound (an eager SmolLM2 forward costs ~20 ms
whatever it carries). A CUDA graph replays the whole forward's kernels with one launch, but
only for fixed shapes and fixed input addresses. So a step is padded up to a bucket
(batch size, chunk length, and the number of key positions attention reads), its inputs are
copied into that bucket's static buffers with one host-to-device copy, and everything else
— the attention mask, the KV-cache write indices, the slot read — is computed on the device
from those buffers inside the captured region. Attention reads the key bucket, a power of two
at or above the longest row's cached length: its cost grows with what is cached, not with
the preallocated cache length.

Linear-attention layers (`state_cache`) route their slot states from the same buffers. A verify
step keeps every position's state until `settle` picks the accepted one; inside a graph those
states would live in the graph's pool and die at the next replay, so verify forwards of such
models are separate graphs (`snapshots=True`: the token-by-token recurrence, whose per-column
states go to the state cache's snapshot buffers) beside the plain ones (chunked delta rule,
nothing kept). Whether a forward keeps snapshots is fixed per graph, never read at replay.

The same body runs uncaptured on a CPU (`capture=False`), which is how the bucketing,
padding rows and device-side routing are tested for exactness without a GPU. The body keeps
nothing on the host between forwards (what `settle` needs is noted outside it), so what runs
uncaptured is what a replay does.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from selfspec.engine import moe
from selfspec.engine.fusion import fused
from selfspec.engine.heap import freeze_long_lived

if TYPE_CHECKING:  # pragma: no cover
    from selfspec.engine.model_runner import Chunk, ModelRunner


def capture_graph(body: Callable[[], None], device: torch.device, pool=None) -> torch.cuda.CUDAGraph:
    """Capture `body` (a forward over static buffers, no host syncs) as a CUDA graph.

    It runs twice on a side stream first, so compilation, autotuning and lazy inits happen
    outside the capture. `thread_local`: a server's other threads may touch CUDA meanwhile.
    """
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            body()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
        body()
    torch.cuda.synchronize(device)
    return graph


@dataclass(frozen=True)
class GraphBuckets:
    """Which shapes get a static forward. Steps outside them run eagerly."""

    batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    min_keys: int = 128  # smallest key bucket; buckets double up to the cache length
    # Prompt pieces (several tokens, logits for at most the last) that the padding budget would
    # split into several replays are grouped among themselves: a piece joins the current replay
    # while its padded size (batch bucket x token bucket) stays within this many tokens (0: they
    # share the padding budget with the other rows). Each replay reads every weight: by the fitted
    # H100 step-cost model (`engine/cost_priors`) 32 prompts of 42 tokens at Qwen3-4B cost ~94 ms
    # in 16 replays of two rows and ~58 ms in replays of 256 padded tokens; one eager forward at
    # their exact size saved only ~19 ms of the 94 in an H100 run, and at 8 prompts lost ~20 ms to
    # the replays (its launches: `benchmarks/engine_speed/README.md`). 256 is the compute knee of
    # every fitted H100 model (135M, 4B, 8B): up to it a replay's extra tokens cost little beside
    # the weight read, past it they cost compute that a new replay would not.
    prompt_replay_tokens: int = 256
    # Such pieces may also be cut at the token buckets into parts run one round after another in
    # the same step (42 tokens: 32 + 10) where that pads less (`ModelRunner._prompt_groups`); False: whole.
    split_prompt_pieces: bool = True

    def __post_init__(self) -> None:
        for name in ("batch", "tokens"):
            values = getattr(self, name)
            if not values or any(v < 1 for v in values) or list(values) != sorted(set(values)):
                raise ValueError(f"{name} buckets must be increasing positive integers, got {values}")
        if self.min_keys < 1:
            raise ValueError(f"min_keys must be >= 1, got {self.min_keys}")
        if self.prompt_replay_tokens < 0:
            raise ValueError(f"prompt_replay_tokens must be >= 0, got {self.prompt_replay_tokens}")

    def batch_bucket(self, n: int) -> int | None:
        return _bucket_up(n, self.batch)

    def token_bucket(self, n: int) -> int | None:
        return _bucket_up(n, self.tokens)

    def key_buckets(self, max_len: int) -> list[int]:
        """Every key bucket a cache of `max_len` positions can use, smallest first."""
        sizes, size = [], self.min_keys
        while size < max_len:
            sizes.append(size)
            size *= 2
        return sizes + [max_len]

    def key_bucket(self, needed: int, max_len: int) -> int:
        size = self.min_keys
        while size < needed:
            size *= 2
        return min(size, max_len)


def _bucket_up(n: int, buckets: tuple[int, ...]) -> int | None:
    for b in buckets:
        if b >= n:
            return b
    return None


@dataclass
class StaticForward:
    """One bucket shape: its input buffer, the forward body over it and, on CUDA, its graph."""

    batch: int
    tokens: int
    keys: int
    packed: torch.Tensor  # [5, B, T] int64: ids, positions, write slot, write position, read slot (col 0)
    snapshots: bool = False  # linear-attention verify forward: per-column states kept (see module doc)
    graph: torch.cuda.CUDAGraph | None = None
    capture_seconds: float = 0.0
    replays: int = 0
    experts: str | None = None  # the experts blocks' form in this shape's body (`engine.moe`)
    extra: dict = field(default_factory=dict)


class StaticForwardPool:
    """Owns the static forwards of one model runner and the shared output buffers.

    Outputs (logits and their argmax) go to buffers shared by all buckets, so capturing many
    graphs costs no memory per graph beyond the pooled activations. A forward's outputs are
    therefore only valid until the next forward: the runner copies what it returns.
    """

    def __init__(self, runner: "ModelRunner", buckets: GraphBuckets, *, capture: bool) -> None:
        self.runner = runner
        self.buckets = buckets
        self.capture = capture
        self.device = runner.device
        self.forwards: dict[tuple[int, int, int], StaticForward] = {}
        # Verify forwards of linear-attention models, by shape (see the module doc).
        self.snapshot_forwards: dict[tuple[int, int, int], StaticForward] = {}
        self.stateful = runner.state is not None
        max_t = max(buckets.tokens)
        # Widest verify forward whose states the snapshot buffers hold (a token bucket); a wider
        # one runs eagerly ("verify wider than the state snapshot buffers").
        wanted = runner.state_snapshot_tokens or max_t
        self.snapshot_tokens = buckets.token_bucket(min(wanted, max_t)) or max_t
        self.eager_reasons: Counter[str] = Counter()
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        vocab = int(runner.model.get_output_embeddings().weight.shape[0])
        max_b, max_t = max(buckets.batch), max(buckets.tokens)
        self.logits_out = torch.empty((max_b, max_t, vocab), dtype=runner.dtype, device=self.device)
        self.argmax_out = torch.zeros((max_b, max_t), dtype=torch.long, device=self.device)
        self.key_positions = torch.arange(runner.max_len, device=self.device)
        self.mask_min = torch.tensor(torch.finfo(runner.dtype).min, dtype=runner.dtype, device=self.device)
        self.mask_zero = torch.zeros((), dtype=runner.dtype, device=self.device)
        self.host_packed: dict[tuple[int, int], torch.Tensor] = {}
        self.capture_seconds = 0.0
        self.capture_error: str | None = None
        self.slot_attention_error: str | None = None
        self.experts_blocks = moe.experts_modules(runner.model)  # MoE blocks to run in a capturable form

    # ------------------------------------------------------------------ shape selection
    def needs_snapshots(self, chunks: list["Chunk"]) -> bool:
        """Whether a forward over `chunks` must keep linear-attention states per position."""
        return self.stateful and any(c.num_logits > 1 for c in chunks)

    def shape_for(self, chunks: list["Chunk"]) -> tuple[int, int, int] | None:
        b = self.buckets.batch_bucket(len(chunks))
        t = self.buckets.token_bucket(max(len(c.token_ids) for c in chunks))
        if b is None or t is None:
            return None
        if t > self.snapshot_tokens and self.needs_snapshots(chunks):
            self.eager_reasons["verify wider than the state snapshot buffers"] += 1
            return None
        needed = max(c.start + len(c.token_ids) for c in chunks)
        return b, t, self.buckets.key_bucket(needed, self.runner.max_len)

    # ------------------------------------------------------------------ running
    def run(self, chunks: list["Chunk"], shape: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run `chunks` in the bucket `shape`; return views (logits [B, T, V], argmax [B, T])."""
        snapshots = self.needs_snapshots(chunks)
        forward = (self.snapshot_forwards if snapshots else self.forwards).get(shape)
        if forward is None:
            forward = self._build(shape, snapshots)
        forward.packed.copy_(self._pack(chunks, shape), non_blocking=True)
        if forward.graph is not None:
            forward.graph.replay()
        else:
            self._body(forward)
        forward.replays += 1
        b, t, _ = shape
        if self.stateful:
            self.runner.state.note_static_rows(
                [c.slot for c in chunks], [c.start for c in chunks], [len(c.token_ids) for c in chunks], t, snapshots
            )
        return self.logits_out[:b, :t], self.argmax_out[:b, :t]

    def _pack(self, chunks: list["Chunk"], shape: tuple[int, int, int]) -> torch.Tensor:
        """The step's inputs as one host tensor (pinned on CUDA), so one copy moves them all."""
        b, t, _ = shape
        host = self.host_packed.get((b, t))
        if host is None:
            host = torch.zeros((5, b, t), dtype=torch.long, pin_memory=self.device.type == "cuda")
            self.host_packed[(b, t)] = host
        pack_rows(host.numpy(), chunks, t, self.runner.cache.scratch_slot)
        return host

    def _build(self, shape: tuple[int, int, int], snapshots: bool = False) -> StaticForward:
        b, t, k = shape
        if snapshots:
            # Before any capture writes them: a graph keeps the buffers' addresses.
            self.runner.state.reserve_snapshots(self.snapshot_tokens)
        packed = torch.zeros((5, b, t), dtype=torch.long, device=self.device)
        scratch = self.runner.cache.scratch_slot
        # Warm-up and capture inputs route every write to the scratch slot: no real row changes.
        packed[2].fill_(scratch)
        packed[3].copy_(torch.arange(t, device=self.device).expand(b, t))
        packed[4].fill_(scratch)
        forward = StaticForward(batch=b, tokens=t, keys=k, packed=packed, snapshots=snapshots)
        forward.experts = moe.static_experts(self.experts_blocks, b, t)
        if self.capture:
            start = time.perf_counter()
            try:
                forward.graph = self._capture_with_fallbacks(forward)
            except Exception as exc:  # noqa: BLE001 - a model that cannot be captured still runs
                # Fall back to running this and every later shape uncaptured, and say why.
                self.capture = False
                self.capture_error = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"CUDA graph capture failed, running static shapes eagerly: {self.capture_error}")
                torch.cuda.synchronize(self.device)
            forward.capture_seconds = time.perf_counter() - start
            self.capture_seconds += forward.capture_seconds
        (self.snapshot_forwards if snapshots else self.forwards)[shape] = forward
        return forward

    def _capture_with_fallbacks(self, forward: StaticForward) -> torch.cuda.CUDAGraph:
        """Capture; if the slot-attention kernel is what fails (e.g. a Triton version that
        cannot compile it), turn it off for this runner, say so, and capture without it."""
        try:
            return self._capture(forward)
        except Exception as exc:  # noqa: BLE001
            if not self.runner.slot_attention:
                raise
            self.runner.slot_attention = False
            self.slot_attention_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            warnings.warn(f"slot attention disabled, transformers attention used instead: {self.slot_attention_error}")
            torch.cuda.synchronize(self.device)
            return self._capture(forward)

    def _capture(self, forward: StaticForward) -> torch.cuda.CUDAGraph:
        return capture_graph(lambda: self._body(forward), self.device, self.pool)

    def _body(self, forward: StaticForward) -> None:
        """The forward over the static buffers: no host values, no host syncs."""
        runner = self.runner
        b, t, k = forward.batch, forward.tokens, forward.keys
        ids, positions = forward.packed[0], forward.packed[1]
        keys = self.key_positions[:k].view(1, 1, k)
        query = positions.unsqueeze(-1)
        allowed = keys <= query
        mask = torch.where(allowed, self.mask_zero, self.mask_min).unsqueeze(1)
        sliding = None
        if runner.has_sliding:
            sliding_allowed = allowed & (keys > query - runner.sliding_window)
            sliding = torch.where(sliding_allowed, self.mask_zero, self.mask_min).unsqueeze(1)
        attention_mask = runner.mask_mapping(mask, sliding)
        if runner.state is not None:
            runner.state.set_routing(
                read_slots=forward.packed[4, :, 0],
                write_slots=forward.packed[2],
                positions=positions,
                snapshots=forward.snapshots,
            )
        runner.cache.set_routing(
            write_slots=forward.packed[2],
            write_positions=forward.packed[3],
            read_slots=forward.packed[4, :, 0],
            key_length=k,
            positions=positions,
            direct=runner.slot_attention,
        )
        with (
            fused() if runner.fused_pointwise else contextlib.nullcontext(),
            moe.experts_implementation(self.experts_blocks, forward.experts),
        ):
            logits = runner.call_model(ids, attention_mask, positions, t)
        self.logits_out[:b, :t].copy_(logits)
        self.argmax_out[:b, :t].copy_(logits.argmax(dim=-1))

    # ------------------------------------------------------------------ warm-up
    def warm_up(
        self,
        shapes: list[tuple[int, int, int]],
        progress: Callable[[int], None] | None = None,
        verify: bool = True,
    ) -> float:
        """Build (capture) the given shapes now, so no capture lands inside a measurement.
        Linear-attention models also get the verify variant of every multi-token shape the
        snapshot buffers hold (unless `verify` is False: no speculation will run)."""
        before = self.capture_seconds
        for shape in shapes:
            if shape not in self.forwards:
                self._build(shape)
            t = shape[1]
            if verify and self.stateful and 1 < t <= self.snapshot_tokens and shape not in self.snapshot_forwards:
                self._build(shape, snapshots=True)
            if progress is not None:
                progress(1)
        freeze_long_lived(self.runner.device)  # the captured graphs' objects: never collected mid-step
        return self.capture_seconds - before

    def stats(self) -> dict:
        return {
            "captured": self.capture,
            "capture_error": self.capture_error,
            "slot_attention": self.runner.slot_attention,
            "slot_attention_error": self.slot_attention_error,
            "kv_write_kernel": self.runner.cache.kv_write_kernel,
            "kv_write_error": self.runner.cache.kv_write_error,
            "shapes": len(self.forwards),
            "verify_shapes": len(self.snapshot_forwards),
            "snapshot_tokens": self.snapshot_tokens if self.stateful else None,
            "eager_reasons": dict(self.eager_reasons),
            "experts": dict(Counter(f.experts for f in self._all() if f.experts is not None)),
            "capture_seconds": round(self.capture_seconds, 3),
            "replays": sum(f.replays for f in self._all()),
        }

    def _all(self) -> list[StaticForward]:
        return [*self.forwards.values(), *self.snapshot_forwards.values()]


FEW_ROWS = 8
"""Up to this many rows, a multi-token step is written row by row (cheaper than whole-array work)."""


@functools.lru_cache(maxsize=64)
def padding_rows(b: int, t: int, scratch: int) -> np.ndarray:
    """A step's input array [5, b, t] holding only padding: token 0 at position 0, written to
    the scratch slot (read-only; `pack_rows` copies it in with one write)."""
    arr = np.zeros((5, b, t), dtype=np.int64)
    arr[2] = scratch
    arr[3] = np.arange(t)
    arr[4] = scratch
    arr.flags.writeable = False
    return arr


def pack_rows(arr: np.ndarray, chunks: list["Chunk"], t: int, scratch: int) -> None:
    """Write `chunks` into one step's input array `arr` [5, B, t]: per row the tokens, their
    positions, the cache slot each token's K/V goes to, the positions the mask reads, and the
    row's slot (right-aligned: a row of n tokens fills the last n columns). Padding (the rest)
    is token 0 at position 0, written to the scratch slot.

    Why three paths: this runs on every step before the forward can start, and a numpy write
    costs about a microsecond, so five writes a row took 140 us a step at 32 rows on a 2-core
    CPU, time the device sits idle for. A decode step (one token a row) takes a few whole-array
    writes whatever its rows; a multi-token step of many rows, a few more; a multi-token step of
    a few rows (a request verifying its proposal) is still written row by row, which is cheaper
    there than building index arrays.
    """
    rows = len(chunks)
    arr[...] = padding_rows(arr.shape[1], t, scratch)
    if rows == 0:
        return
    if all(len(c.token_ids) == 1 for c in chunks):  # a decode step: one token a row, in the last column
        starts = [c.start for c in chunks]
        slots = [c.slot for c in chunks]
        arr[:4, :rows, t - 1] = (
            [c.token_ids[0] for c in chunks],
            starts,
            slots,
            starts,
        )
        arr[4, :rows, :] = np.asarray(slots)[:, None]
        return
    if rows <= FEW_ROWS:  # a verify of one or a few requests: a write per row beats whole-array work
        for row, chunk in enumerate(chunks):
            n, pad = len(chunk.token_ids), t - len(chunk.token_ids)
            positions = np.arange(chunk.start, chunk.start + n)
            arr[0, row, pad:] = chunk.token_ids
            arr[1, row, pad:] = positions
            arr[2, row, pad:] = chunk.slot
            arr[3, row, pad:] = positions
            arr[4, row, :] = chunk.slot
        return
    lengths = np.fromiter((len(c.token_ids) for c in chunks), dtype=np.int64, count=rows)
    starts = np.fromiter((c.start for c in chunks), dtype=np.int64, count=rows)[:, None]
    slots = np.fromiter((c.slot for c in chunks), dtype=np.int64, count=rows)[:, None]
    columns = np.arange(t)
    pad = (t - lengths)[:, None]
    real = columns >= pad  # [rows, t]: right-aligned, so row-major order of the real cells is the chunks' order
    positions = starts + (columns - pad)
    tokens = np.fromiter(
        itertools.chain.from_iterable(c.token_ids for c in chunks), dtype=np.int64, count=int(lengths.sum())
    )
    arr[0, :rows][real] = tokens
    arr[1, :rows] = np.where(real, positions, 0)
    arr[2, :rows] = np.where(real, slots, scratch)
    arr[3, :rows] = np.where(real, positions, columns)
    arr[4, :rows] = slots
