"""The arbitrator's prefix K/V, kept across a request's verification rounds.

Why: without it every decision is a forward over the whole state — the prefix window (up to
512 tokens) plus both blocks — through the draft's layers, while the target's verify forward
of the same round feeds only K + 1 tokens. On the H200 that made one arbitration (3.1 ms, in
a graph) dearer than a target decode step (2.1 ms), paid at nearly every round. Under the
hybrid mask the prefix queries are causal over the prefix alone, so the prefix's K/V depend
only on the prefix tokens and their positions: a round needs to feed only the tokens the
prefix gained since the last decision plus the blocks and the decision token (2K + 2 for a
K-token round), attending to the cached rest.

The window cannot slide by a few tokens each round (positions start at the window's first
token, and every layer's K/V depends on the tokens before it in the window), so a cached
policy anchors it (`window_start`): the window keeps its first token until it outgrows
`max_prefix_tokens`, then moves forward by `reanchor_tokens` at once and one full forward
rebuilds the cache. The arbitrator sees between `max_prefix_tokens - reanchor_tokens` and
`max_prefix_tokens` tokens of prefix; the states the policy records carry exactly the prefix
it used, so training and the uncached forward see what the cached one saw.

Layout: a `SlotKVCache` with one slot per request being arbitrated (least recently used is
evicted; its next decision rebuilds) and `capacity` positions per slot. A call writes its fed
tokens at cache positions P0..L-1 — the blocks and the decision are scratch past the prefix,
overwritten by the next call's new prefix tokens — and attends over positions
0..capacity-1 under rows P0..L-1 of the hybrid mask (`hybrid_rows`; keys past L are masked).
The fed tokens are right-padded to a query bucket whose padding writes go to the cache's
scratch slot, so one body serves every call of a bucket: on a GPU it is captured as a CUDA
graph per bucket, on a CPU it runs as is (which is how the tests check it).

A slot is valid only under the weights that filled it: RL's optimizer steps happen between
rollouts, and every request (policy) is a new owner whose first call rebuilds its slot.
"""

from __future__ import annotations

import inspect
import itertools
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from selfspec.engine.kv_cache import SlotKVCache, layer_kv_shapes, model_kv_shape
from selfspec.engine.static_forward import capture_graph
from selfspec.spec.cospec.arbitrator import ArbitrationState, _additive, hybrid_index_positions, hybrid_rows
from selfspec.spec.cospec.merged import MergedBackbone

if TYPE_CHECKING:
    from selfspec.spec.cospec.arbitrator import Arbitrator

QUERY_BUCKETS: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 384, 512, 576, 640, 768, 1024, 1536, 2048)
"""Padded fed-token counts: a round feeds a few new prefix tokens + 2K + 2 (K = 8: ~24 -> 32);
a rebuild feeds the whole state."""

_OWNERS = itertools.count(1)


def new_owner() -> int:
    """A fresh owner id for one request's slot (never reused, so a slot never outlives its request's weights)."""
    return next(_OWNERS)


def window_start(context_len: int, start: int, max_prefix_tokens: int, reanchor_tokens: int) -> int:
    """The anchored window's first token for a context of `context_len` tokens, given the
    current `start`: kept while the window fits `max_prefix_tokens`, else moved forward so
    `max_prefix_tokens - reanchor_tokens` tokens (at least one) remain."""
    if context_len - start <= max_prefix_tokens:
        return start
    return context_len - max(1, max_prefix_tokens - reanchor_tokens)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


ROW_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16)
"""Padded row counts of a batched call (one row per request deciding in the same step)."""


@dataclass
class _Bucket:
    packed: torch.Tensor  # [R, Q + 5] long: per row the fed token ids, then (P0, P, D, T, slot)
    logits: torch.Tensor  # [R] float32 static output
    graph: torch.cuda.CUDAGraph | None

    @property
    def rows(self) -> int:
        return self.packed.shape[0]

    @property
    def width(self) -> int:
        return self.packed.shape[1] - 5


class ArbitratorPrefixCache:
    """Prefix K/V slots and per-bucket forwards for one arbitrator (module doc)."""

    def __init__(
        self,
        arbitrator: "Arbitrator",
        *,
        capacity: int,
        num_slots: int = 8,
        capture: bool | None = None,
        buckets: tuple[int, ...] = QUERY_BUCKETS,
        merge_lora: bool = True,
    ) -> None:
        self._arbitrator = weakref.ref(arbitrator)
        # Decisions run on a copy with the adapters folded in (`cospec.merged`), refolded when they change.
        self.merged = MergedBackbone(arbitrator.backbone) if merge_lora and _has_lora(arbitrator) else None
        self.device = arbitrator.head.weight.device
        self.capacity = capacity
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.buckets = tuple(sorted(b for b in buckets if b < capacity)) + (capacity,)
        # A batch never holds more rows than slots: each row owns a slot for the whole call.
        self.row_buckets = tuple(b for b in ROW_BUCKETS if b < num_slots) + (num_slots,)
        config = arbitrator.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        num_layers, kv_heads, head_dim = model_kv_shape(config)
        layer_types = getattr(text, "layer_types", None)
        window = arbitrator.sliding_window
        self.cache = SlotKVCache(
            num_layers=num_layers,
            num_slots=num_slots,
            max_len=capacity,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=arbitrator.head.weight.dtype,
            device=self.device,
            layer_types=layer_types if window is not None else None,
            sliding_window=window,
            layer_shapes=layer_kv_shapes(config),
        )
        self.owners: list[int | None] = [None] * num_slots
        self.tokens: list[list[int]] = [[] for _ in range(num_slots)]
        self.last_used = [0] * num_slots
        self._clock = itertools.count(1)
        self.compiled: dict[tuple[int, int], _Bucket] = {}  # (rows, width) -> bucket
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.capture_seconds = 0.0
        self.capture_error: str | None = None
        # transformers 5.24 renamed the decoder's `past_key_values` to `cache`; 5.17 knows only the first.
        params = inspect.signature(self._backbone(arbitrator).forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.calls = 0
        self.decisions = 0  # a call makes one per row
        self.fed_tokens = 0
        self.rebuilds = 0

    # ------------------------------------------------------------------ slots
    def _slot_for(self, owner: int) -> int:
        if owner in self.owners:
            slot = self.owners.index(owner)
        else:
            slot = min(range(len(self.owners)), key=lambda s: self.last_used[s])  # free ones have 0
            self.owners[slot], self.tokens[slot] = owner, []
        self.last_used[slot] = next(self._clock)
        return slot

    def release(self, owner: int) -> None:
        """Free `owner`'s slot (a finished request); eviction would reclaim it anyway."""
        if owner in self.owners:
            slot = self.owners.index(owner)
            self.owners[slot], self.tokens[slot], self.last_used[slot] = None, [], 0

    # ------------------------------------------------------------------ decisions
    def keep_logit(self, owner: int, state: ArbitrationState) -> torch.Tensor:
        """The keep-draft logit [1] (float32) of `state`, reusing `owner`'s cached prefix."""
        return self.keep_logits([(owner, state)])

    @torch.inference_mode()
    def keep_logits(self, items: Sequence[tuple[int, ArbitrationState]]) -> torch.Tensor:
        """Keep-draft logits [B] (float32) of (owner, state) pairs, in one forward per chunk
        of at most `num_slots` distinct owners (the requests deciding in the same step).

        Each equals the arbitrator's full forward over its state (up to float reduction
        order): the cached K/V are those of the same prefix tokens at the same positions,
        and rows of a batch neither read nor write each other's slots.
        """
        for _, state in items:
            if state.length > self.capacity:
                raise ValueError(f"an arbitration state of {state.length} tokens exceeds the cache's {self.capacity}")
        if self.merged is not None and self.merged.refresh():
            for s in range(len(self.owners)):  # K/V of other weights: every slot rebuilds
                self.tokens[s] = []
        out = torch.empty(len(items), dtype=torch.float32, device=self.device)
        for chunk in _distinct_owner_chunks([owner for owner, _ in items], len(self.owners)):
            out[chunk] = self._decide([items[i] for i in chunk])
        return out

    def _decide(self, items: list[tuple[int, ArbitrationState]]) -> torch.Tensor:
        """One forward for items of distinct owners (no more than the slots)."""
        slots = [self._slot_for(owner) for owner, _ in items]  # an owner assigned here is never evicted here
        rows = []
        for slot, (_, state) in zip(slots, items):
            prefix = list(state.prefix)
            reused = common_prefix_len(self.tokens[slot], prefix)
            self.rebuilds += reused == 0
            fed = prefix[reused:] + list(state.draft_block) + list(state.target_block) + [state.draft_block[0]]
            rows.append((fed, [reused, len(prefix), len(state.draft_block), len(state.target_block), slot]))
        width = self.bucket(max(len(fed) for fed, _ in rows))
        height = next(b for b in self.row_buckets if b >= len(rows))
        entry = self.compiled.get((height, width)) or self._prepare_bucket(width, height)
        packed = [fed + [0] * (width - len(fed)) + head for fed, head in rows]
        packed += [self._placeholder(width)] * (height - len(rows))
        entry.packed.copy_(torch.tensor(packed, dtype=torch.long))
        if entry.graph is not None:
            entry.graph.replay()
        else:
            self._body(entry)
        for slot, (_, state) in zip(slots, items):
            self.tokens[slot] = list(state.prefix)
        self.calls += 1
        self.decisions += len(rows)
        self.fed_tokens += sum(len(fed) for fed, _ in rows)
        return entry.logits[: len(rows)].clone()

    def _placeholder(self, width: int) -> list[int]:
        """A valid row (P0 = 0, P = width - 3, D = T = 1) routed to the scratch slot: padding
        rows and warm-up/capture runs must not touch a live slot's K/V."""
        return [0] * width + [0, max(1, width - 3), 1, 1, self.cache.scratch_slot]

    def bucket(self, fed: int) -> int:
        return next(b for b in self.buckets if b >= fed)

    def prepare(self, max_fed: int | None = None, max_rows: int = 1) -> None:
        """Build (capture) every bucket up to `max_fed` fed tokens (all by default) and
        `max_rows` rows now, so no capture lands inside a timed run."""
        top = self.bucket(min(max_fed or self.capacity, self.capacity))
        tallest = next((b for b in self.row_buckets if b >= max_rows), self.row_buckets[-1])
        for height in (h for h in self.row_buckets if h <= tallest):
            for width in (b for b in self.buckets if b <= top):
                self._prepare_bucket(width, height)

    @torch.no_grad()  # not inference mode: the static buffers must stay writable outside it
    def _prepare_bucket(self, width: int, rows: int = 1) -> _Bucket:
        if (rows, width) in self.compiled:
            return self.compiled[(rows, width)]
        packed = torch.tensor([self._placeholder(width)] * rows, dtype=torch.long, device=self.device)
        entry = _Bucket(packed, torch.zeros(rows, device=self.device), None)
        if self.capture:
            start = time.perf_counter()
            try:
                entry.graph = capture_graph(lambda: self._body(entry), self.device, self.pool)
            except Exception as exc:  # noqa: BLE001 - an eager arbitrator is slow, not wrong
                self.capture = False
                self.capture_error = f"{type(exc).__name__}: {str(exc)[:300]}"
                warnings.warn(f"arbitrator prefix-cache graph capture failed, running it eagerly: {self.capture_error}")
                torch.cuda.synchronize(self.device)
            self.capture_seconds += time.perf_counter() - start
        self.compiled[(rows, width)] = entry
        return entry

    def _body(self, entry: _Bucket) -> None:
        """One call from the static buffers alone (nothing read on the host: graph-safe)."""
        arbitrator = self._arbitrator()
        if arbitrator is None:
            raise RuntimeError("the arbitrator this prefix cache belongs to is gone")
        rows, width, capacity, device = entry.rows, entry.width, self.capacity, self.device
        ids = entry.packed[:, :width]
        reused = entry.packed[:, width : width + 1]  # [R, 1]
        lengths = entry.packed[:, width + 1 : width + 4]  # [R, 3]
        slot = entry.packed[:, width + 4]  # [R]
        column = torch.arange(width, device=device).view(1, width)
        index = reused + column  # [R, Q] the fed tokens' places in each state
        real = index < lengths.sum(dim=1, keepdim=True) + 1
        positions = hybrid_index_positions(lengths, index)
        allowed = hybrid_rows(lengths, index, capacity)  # [R, Q, C]
        scratch = torch.full_like(index, self.cache.scratch_slot)
        self.cache.set_routing(
            write_slots=torch.where(real, slot.view(rows, 1), scratch),
            write_positions=torch.where(real, index, column.expand(rows, width)),
            read_slots=slot,
            key_length=capacity,
        )
        dtype = arbitrator.head.weight.dtype
        mask = _additive(allowed, dtype)
        if arbitrator.sliding_window is not None:
            key_positions = hybrid_index_positions(lengths, torch.arange(capacity, device=device).view(1, -1))
            distance = positions.unsqueeze(-1) - key_positions.unsqueeze(-2)
            windowed = _additive(allowed & (distance < arbitrator.sliding_window), dtype)
            mask = {"full_attention": mask, "sliding_attention": windowed}
        try:
            out = self._backbone(arbitrator)(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{self.cache_kwarg: self.cache},
            )
        finally:
            self.cache.end_step()
        decision = lengths.sum(dim=1, keepdim=True) - reused  # [R, 1] the decision token L - 1, fed coordinates
        hidden = out.last_hidden_state.gather(
            1, decision.unsqueeze(-1).expand(rows, 1, out.last_hidden_state.shape[-1])
        )
        entry.logits.copy_(arbitrator.head(hidden[:, 0]).squeeze(-1).float())

    def _backbone(self, arbitrator: "Arbitrator") -> torch.nn.Module:
        return self.merged.module if self.merged is not None else arbitrator.backbone

    def stats(self) -> dict:
        return {
            "lora_folds": None if self.merged is None else self.merged.folds,
            "graphs": sorted(f"{r}x{w}" for (r, w), e in self.compiled.items() if e.graph is not None),
            "capture_s": round(self.capture_seconds, 3),
            "calls": self.calls,
            "decisions": self.decisions,
            "fed_tokens": self.fed_tokens,
            "rebuilds": self.rebuilds,
            "capture_error": self.capture_error,
        }


def _distinct_owner_chunks(owners: list[int], limit: int) -> list[list[int]]:
    """Indices of `owners` in order, cut into runs of at most `limit` with no owner twice (an
    owner's second state in one step must see the slot its first one left)."""
    chunks: list[list[int]] = [[]]
    for i, owner in enumerate(owners):
        if len(chunks[-1]) == limit or any(owners[j] == owner for j in chunks[-1]):
            chunks.append([])
        chunks[-1].append(i)
    return chunks if chunks[0] else []


def _has_lora(arbitrator: "Arbitrator") -> bool:
    return any("lora_" in name for name, _ in arbitrator.backbone.named_parameters())


_CACHES: "weakref.WeakKeyDictionary[Arbitrator, ArbitratorPrefixCache]" = weakref.WeakKeyDictionary()


def prefix_cache_for(arbitrator: "Arbitrator", capacity: int) -> ArbitratorPrefixCache:
    """The arbitrator's prefix cache with room for states of `capacity` tokens, kept beside it
    (not on it: `copy.deepcopy` of an arbitrator must copy neither K/V nor graphs)."""
    cache = _CACHES.get(arbitrator)
    if cache is None or cache.device != arbitrator.head.weight.device or cache.capacity < capacity:
        cache = _CACHES[arbitrator] = ArbitratorPrefixCache(arbitrator, capacity=capacity)
    return cache


def prefix_cache_stats(arbitrator: "Arbitrator") -> dict | None:
    """The counters of the arbitrator's prefix cache (None if it has none yet): for reports."""
    cache = _CACHES.get(arbitrator)
    return None if cache is None else cache.stats()


__all__ = [
    "QUERY_BUCKETS",
    "ArbitratorPrefixCache",
    "common_prefix_len",
    "new_owner",
    "prefix_cache_for",
    "prefix_cache_stats",
    "window_start",
]
